// Package bench compares an acquire+release cycle of this project's lock
// library with github.com/bsm/redislock, github.com/go-redsync/redsync/v4,
// github.com/redis/rueidis/rueidislock and a raw floor (SET NX PX, then an
// EVALSHA compare-and-delete), all against one local redis-server that the
// benchmarks start themselves.
//
// It is a module of its own so the peer libraries never enter the plugin's
// go.mod. Run it with `make bench` (or `cd bench && ./run.sh`).
package bench
