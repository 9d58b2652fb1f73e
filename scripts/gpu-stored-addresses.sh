#!/usr/bin/env bash
# Addresses of module variables stored in device memory, across a failover
# (issue 44): GUESTS (16) guest programs at once, each rt_stored
# (pvdriver/libcuda/testdata/runtime) in its own session on one replicated
# pair whose nodes run every session in a GPU worker. Each program stores
# addresses of its module variable in device memory (from a kernel and from
# the host) and follows them; once every one waits at its checkpoint the
# primary is SIGKILLed, and each follows the addresses again on the
# promoted standby. Prints how many followed them right, and the standby's
# count of module variables it found elsewhere than the primary had them.
# Takes the directory holding prebuilt `vgpuha` and `libcuda.so.1`; needs
# nvcc. Knobs: GUESTS, ROUNDS (1: pairs started one after another), LOGS.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/gpu-pair.sh" # start_pair
n=${GUESTS:-16} rounds=${ROUNDS:-1}
logs=${LOGS:-$(mktemp -d)}
mkdir -p "$logs/lib"
cp "$B/libcuda.so.1" "$logs/lib/"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$nvcc" -O2 -arch=sm_90 -o "$logs/rt_stored" "$root/pvdriver/libcuda/testdata/runtime/rt_stored.cu" || exit 1
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT
total_ok=0 total=0
for r in $(seq "$rounds"); do
	d=$logs/round$r
	pids=()
	start_pair "$d" --backend cuda --guest.kernels --guest.workers on --guest.max-sessions "$n" || exit 1
	guests=()
	for i in $(seq "$n"); do
		mkfifo "$d/in$i"
		LD_LIBRARY_PATH=$logs/lib VGPUHA_ENDPOINT=unix://$d/p.sock VGPUHA_FAILOVER=unix://$d/s.sock VGTEST_CHECKPOINT=1 \
			CUDA_VISIBLE_DEVICES=0 "$logs/rt_stored" <"$d/in$i" >"$d/out$i" 2>"$d/err$i" &
		guests+=($!)
		exec {fd}>"$d/in$i"
		eval "fd$i=$fd"
	done
	for _ in $(seq 600); do
		[ "$(cat "$d"/out* 2>/dev/null | grep -c '^checkpoint$')" -ge "$n" ] && break
		sleep 0.1
	done
	kill -9 "$primary"
	for i in $(seq "$n"); do
		eval "fd=\$fd$i"
		echo >&"$fd"
		exec {fd}>&-
	done
	ok=0
	for i in $(seq "$n"); do
		wait "${guests[i - 1]}" && grep -q '^rt_stored ok$' "$d/out$i" && ok=$((ok + 1))
	done
	elsewhere=$(curl -s --unix-socket "$d/sa.sock" http://x/metrics | grep '^vgpuha_replica_module_variables_elsewhere_total ' | cut -d' ' -f2)
	echo "round $r: $ok of $n programs followed their stored addresses after the SIGKILL; standby: ${elsewhere:-?} module variables elsewhere"
	grep -h WRONG "$d"/out* | head -3
	total_ok=$((total_ok + ok)) total=$((total + n))
	cleanup
	wait 2>/dev/null
done
echo "in all: $total_ok of $total"
[ "$total_ok" = "$total" ]
