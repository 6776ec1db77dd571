# Port helpers for the load-test scripts (sourced).

# listening reports whether something accepts connections on the port.
listening() { (: </dev/tcp/127.0.0.1/"$1") 2>/dev/null; }

# free_port picks a loopback port nothing listens on (bash /dev/tcp probe),
# below the ephemeral range, where outgoing connections (wrk's, Caddy's to the
# upstream and Redis) could hold the port and make the bind fail.
eph_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
	local p
	for _ in $(seq 100); do
		p=$((10000 + RANDOM % (eph_low - 10000)))
		if ! listening "$p"; then
			echo "$p"
			return
		fi
	done
	echo "no free port found" >&2
	return 1
}

# wait_port waits up to 15s for a port to accept connections.
wait_port() {
	for _ in $(seq 150); do
		listening "$1" && return 0
		sleep 0.1
	done
	echo "nothing listens on 127.0.0.1:$1 after 15s ($2)" >&2
	return 1
}
