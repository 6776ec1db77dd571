#!/usr/bin/env bash
# Installs what the tests drive, when missing: redis-server (the tests start
# their own on free ports), Debian's chromium (the browser tests in browser/)
# and python3-stripe (the stripe-python SDK tests). As root with apt-get it
# installs them; otherwise it says what to install and fails.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
/usr/bin/python3 -c 'import stripe' >/dev/null 2>&1 || missing+=(python3-stripe)

if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "installing ${missing[*]} with apt-get"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	else
		echo "missing: ${missing[*]}: install them (Debian/Ubuntu: sudo apt-get install -y ${missing[*]})"
		exit 1
	fi
fi
redis-server --version
chromium --version 2>/dev/null
/usr/bin/python3 -c 'import stripe; from stripe.version import VERSION; print("stripe-python", VERSION)'
