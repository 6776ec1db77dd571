#!/usr/bin/env bash
# Builds ./caddy: Caddy v2.11.9 with this plugin from the working tree, with
# xcaddy, as a user would (`xcaddy build --with MOD=.`).
#
# GOPROXY: with `--with MOD=PATH` the go command still asks the module proxy
# for MOD. This module is not published, and the proxy this machine reaches
# answers such a request with an error rather than "not found", which stops
# the build before the local replacement is used. So the proxy list is taken
# from `go env GOPROXY`, joined with `|` (fall through on any error, not only
# on not-found), `direct` dropped (no network but the proxy here), and ended
# with `off`, whose not-found lets the replacement win.
set -euo pipefail
cd "$(dirname "$0")/.."

XCADDY_VERSION="${XCADDY_VERSION:-v0.4.5}"
CADDY_VERSION="${CADDY_VERSION:-v2.11.9}"
OUTPUT="${OUTPUT:-./caddy}"

proxies=()
IFS=',|' read -r -a parts <<<"$(go env GOPROXY)"
for p in "${parts[@]}"; do
	case "$p" in
	"" | direct | off) ;;
	*) proxies+=("$p") ;;
	esac
done
goproxy="$(IFS='|'; echo "${proxies[*]:-}")"
goproxy="${goproxy:+$goproxy|}off"

echo "GOPROXY=$goproxy go run github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION build $CADDY_VERSION --with github.com/reqlock/caddy-redis-lock=. --output $OUTPUT"
GOPROXY="$goproxy" go run "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION" \
	build "$CADDY_VERSION" \
	--with github.com/reqlock/caddy-redis-lock=. \
	--output "$OUTPUT"
