#!/usr/bin/env bash
# The fail-back procedure of docs/OPERATIONS.md, run on one machine: two
# "hosts" A and B are two sets of loopback ports, the GPU is the software
# one. Every vgpuha command below is the one the document gives, with these
# addresses. Needs vgpuha on $PATH (and vgpuha-lab, whose example guest
# plays the guest); prints each step; exits non-zero on the
# first step that does not hold.
set -euo pipefail

# Each address may be set from the environment.
A=${A:-127.0.0.1} B=${B:-127.0.0.1}
A_GUEST=${A_GUEST:-tcp://$A:17070} A_REPL=${A_REPL:-tcp://$A:17071} A_ADMIN=${A_ADMIN:-$A:17072}
B_GUEST=${B_GUEST:-tcp://$B:17080} B_REPL=${B_REPL:-tcp://$B:17081} B_ADMIN=${B_ADMIN:-$B:17082}
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
step() { echo "== $*"; }
# until_status ADDR PATTERN: poll the node's status table until a line matches.
until_status() {
	for _ in $(seq 200); do
		if vgpuha status --admin "$1" --admin.token-file "$dir/admin-token" 2>/dev/null | grep -Eq "$2"; then
			vgpuha status --admin "$1" --admin.token-file "$dir/admin-token"
			return 0
		fi
		sleep 0.1
	done
	echo "$1 never matched $2:" >&2
	vgpuha status --admin "$1" --admin.token-file "$dir/admin-token" >&2 || true
	return 1
}

step "keys: one replication key and one admin token, the same files on both hosts"
head -c 32 /dev/urandom | base64 > "$dir/key"
head -c 32 /dev/urandom | base64 > "$dir/admin-token"
chmod 600 "$dir/key" "$dir/admin-token"

# Both hosts run the same standby command line (each pointing at the
# other); host A is started once as primary.
standby_on() { # standby_on LISTEN GUEST ADMIN PEER_REPL LOG
	vgpuha standby --listen "$1" --replicate.key-file "$dir/key" --guest-listen "$2" \
		--admin-listen "$3" --admin.token-file "$dir/admin-token" --replicate-to "$4" 2> "$5" &
	pids+=($!)
}

step "B: standby (takes over on its guest endpoint; once primary, replicates to A)"
standby_on "$B_REPL" "$B_GUEST" "$B_ADMIN" "$A_REPL" "$dir/b.log"
b=$!
step "A: primary"
vgpuha primary --guest-listen "$A_GUEST" --replicate-to "$B_REPL" --replicate.key-file "$dir/key" \
	--admin-listen "$A_ADMIN" --admin.token-file "$dir/admin-token" 2> "$dir/a.log" &
a=$!
pids+=($a)
until_status "$A_ADMIN" ' primary +1 +true .* protected '

step "a guest on a third host: A first, B on failover"
touch "$dir/guest.log"
vgpuha-lab guest --endpoint "$A_GUEST" --failover "$B_GUEST" --workload all --hold 2> "$dir/guest.log" > "$dir/guest.out" &
g=$!
pids+=($g)
for _ in $(seq 300); do grep -q "holding the session" "$dir/guest.log" && break; sleep 0.1; done
grep -q "holding the session" "$dir/guest.log"

step "host A dies"
kill -9 "$a"
until_status "$B_ADMIN" ' primary +2 +true +1 +to_standby +unprotected '

step "host A is back: it rejoins as B's standby (never as primary)"
standby_on "$A_REPL" "$A_GUEST" "$A_ADMIN" "$B_REPL" "$dir/a2.log"
until_status "$B_ADMIN" ' primary +2 +true .* to_standby +protected '

step "fail back: switch the primary role over to A"
vgpuha switchover --admin "$B_ADMIN" --admin.token-file "$dir/admin-token"
until_status "$A_ADMIN" ' primary +3 +true '

step "B rejoins as A's standby: its fenced process is restarted as a standby"
kill "$b"
wait "$b" || true
standby_on "$B_REPL" "$B_GUEST" "$B_ADMIN" "$A_REPL" "$dir/b2.log"
until_status "$A_ADMIN" ' primary +3 +true .* to_standby +protected '
vgpuha status --admin "$B_ADMIN" --admin.token-file "$dir/admin-token"

step "the held guest session moved with the role (SESSIONS 1 on A); a new guest is served by A"
until_status "$A_ADMIN" ' primary +3 +true +1 '
vgpuha-lab guest --endpoint "$A_GUEST" --failover "$B_GUEST" --workload vadd
kill -TERM "$g"
wait "$g"
echo "fail-back done: A primary (term 3), B its standby"
