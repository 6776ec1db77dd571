# caddy-redis-lock: the two commands a newcomer runs are `make demo` and `make test`.
GO      ?= go
ARGS    ?=
GOFILES  = $(shell git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')

.PHONY: test test-deps redis fmt-check tidy-check vet bench loadtest loadtest-compare demo caddy fuzz chaos

# redis makes sure redis-server is installed: tests start their own on free ports.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing: install it (sudo apt-get install -y redis-server, or brew install redis)"; exit 1; \
	  fi; }
	@redis-server --version

fmt-check:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# tidy-check: go mod tidy leaves every module's go.mod and go.sum as they are
# (the plugin's go.mod holds only what its packages build on: a Caddy built
# with xcaddy inherits its requirements).
tidy-check:
	@for d in . tools bench browser; do (cd $$d && $(GO) mod tidy -diff) || { echo "go mod tidy changes $$d"; exit 1; }; done

STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet:
	$(GO) vet ./...
	cd tools && $(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd browser && $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd tools && $(GO) run $(STATICCHECK) ./...
	cd bench && $(GO) run $(STATICCHECK) ./...
	cd browser && $(GO) run $(STATICCHECK) ./...

# test-deps installs what the tests drive: redis-server, chromium, python3-stripe.
test-deps:
	@./scripts/test-deps.sh

# test: gofmt, go mod tidy, go vet, staticcheck, then every test, with the
# race detector, against real redis-server processes: the plugin's, the
# tools' (demo, chaos's short run) and the browser tests in Chromium.
test: test-deps fmt-check tidy-check vet
	REDISLOCK_REQUIRE_REDIS=1 $(GO) test -race -count=1 -timeout 20m ./...
	cd tools && REDISLOCK_REQUIRE_REDIS=1 $(GO) test -race -count=1 -timeout 10m ./...
	cd browser && REDISLOCK_REQUIRE_REDIS=1 $(GO) test -race -count=1 -timeout 10m ./...

# fuzz: each fuzz target for FUZZTIME (the committed corpora in testdata/fuzz
# run with every `make test`); a crash is written to testdata/fuzz and fails.
FUZZTIME ?= 30s
FUZZ_TARGETS = .:FuzzCaddyfile .:FuzzJSONKey ./record:FuzzDecode
fuzz:
	@for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t#*:}; \
	  echo "fuzzing $$name in $$pkg for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# bench: this library beside bsm/redislock, redsync, rueidislock and a raw floor;
# the idempotency records (package record): cost, Redis memory, round trips.
bench: redis
	cd bench && ./run.sh

# loadtest: requests per second through redis_lock + reverse_proxy vs plain
# reverse_proxy, and in idempotency mode (stored answers, replays) vs both.
loadtest: redis
	./scripts/loadtest.sh

# loadtest-compare: this tree's throughput beside another revision's,
# measured side by side (REV=v0.1.0, REV=HEAD~3, ...).
loadtest-compare: redis
	./scripts/loadtest-compare.sh $(REV)

# demo: a storm of duplicate charges, then late retries, at three routes: plain,
# redis_lock, and redis_lock with idempotency (ARGS=-serve keeps it running).
demo:
	cd tools && $(GO) run ./demo $(ARGS)

# chaos: three Caddy nodes (processes), one Redis (AOF), SDK-like clients and
# a recording backend under scheduled faults, then the same on a Sentinel pair
# with replicas 1 under failovers, then network faults through toxiproxy
# (installed from the Go module proxy as a tool), then a Redis Cluster of six
# nodes with replicas 1 under failovers and slot migrations; checks the records, exits 1
# on a violation (SEED=n another schedule; LOCK_ONLY=1 without idempotency,
# fails; ACCOUNTS=8 the payments on 8 accounts, one request of an account at
# a time (idempotency { key }), checked; ARGS='-phase network' one phase).
chaos: redis
	cd tools && SEED='$(SEED)' LOCK_ONLY='$(LOCK_ONLY)' ACCOUNTS='$(ACCOUNTS)' $(GO) run ./chaos $(ARGS)

# caddy: a Caddy binary with this plugin, built with xcaddy.
caddy:
	./scripts/xcaddy-build.sh
