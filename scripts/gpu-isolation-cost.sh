#!/usr/bin/env bash
# What one primary per guest costs (issue 13's isolation for guest-built
# kernels): N guests served by N primaries (--guest.kernels
# --guest.max-sessions 1) against the same N guests on one shared primary.
# Prints host RSS and GPU memory of the primaries and the time from start
# to serving. Takes a directory holding prebuilt vgpuha and vgpuha-lab
# (make build lab); needs a GPU.
set -euo pipefail
B=$(cd "${1:-bin}" && pwd)
n=${GUESTS:-8}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.01; done; echo "no socket $1" >&2; return 1; }
hold_guests() { # endpoint per guest
	local i=0 ep
	for ep in "$@"; do
		i=$((i + 1))
		"$B/vgpuha-lab" guest --endpoint "$ep" --workload vadd --hold --name "g$i" >/dev/null 2>"$work/guest$i.log" &
	done
	for i in $(seq $#); do
		for _ in $(seq 600); do grep -q holding "$work/guest$i.log" && break; sleep 0.05; done
		grep -q holding "$work/guest$i.log" || { cat "$work/guest$i.log"; exit 1; }
	done
}
measure() { # label, pids...
	local label=$1 rss=0 gpu=0 p
	shift
	for p in "$@"; do
		rss=$((rss + $(ps -o rss= -p "$p")))
		gpu=$((gpu + $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$p" '$1 == p {print $2}' | head -1)))
	done
	printf '| %s | %d | %d MiB | %d MiB |\n' "$label" "$#" $((rss / 1024)) "$gpu"
}

echo "| layout | primaries | host RSS (sum) | GPU memory (sum) |"
echo "|---|---|---|---|"
start=${EPOCHREALTIME/[.,]/}
pids=() eps=()
for i in $(seq "$n"); do
	"$B/vgpuha" primary --backend cuda --guest.kernels --guest.max-sessions 1 --guest-listen "unix://$work/p$i.sock" 2>"$work/p$i.log" &
	pids+=($!) eps+=("unix://$work/p$i.sock")
done
for i in $(seq "$n"); do wait_sock "$work/p$i.sock"; done
per=$(((${EPOCHREALTIME/[.,]/} - start) / 1000))
hold_guests "${eps[@]}"
measure "one primary per guest ($per ms until all $n serve)" "${pids[@]}"
kill "${pids[@]}" $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true

start=${EPOCHREALTIME/[.,]/}
"$B/vgpuha" primary --backend cuda --guest-listen "unix://$work/shared.sock" 2>"$work/shared.log" &
shared=$!
wait_sock "$work/shared.sock"
one=$(((${EPOCHREALTIME/[.,]/} - start) / 1000))
eps=()
for i in $(seq "$n"); do eps+=("unix://$work/shared.sock"); done
hold_guests "${eps[@]}"
measure "one shared primary ($one ms until it serves)" "$shared"
