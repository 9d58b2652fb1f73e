#!/usr/bin/env bash
# Link bytes per step against the bytes the guest sends (issue 43): a
# training loop that prints its loss every step (resnet_amp.py) and an
# evaluation loop that reads its outputs back (eval_readback.py), each
# through a replicated primary in commit mode, with read checks
# (--replicate.read-check-bytes, 64 KiB) and without (0), side by side.
# Per step is by difference: a run of LONG steps less one of SHORT, over
# LONG-SHORT (start-up cancels out), after two runs that fill the node's
# image cache (a later process sends module images by hash) and carry the
# images to the standby (the log ships an image once a process loads it
# by hash). Link bytes are the primary's
# vgpuha_replication_sent_bytes_total, guest bytes its
# vgpuha_guest_request_bytes_total. Takes the directory holding prebuilt
# `vgpuha` and `libcuda.so.1`; needs python3 with torch and torchvision.
# Knobs: SHORT (20), LONG (80), LOGS.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/gpu-pair.sh" # start_pair
short=${SHORT:-20} long=${LONG:-80}
logs=${LOGS:-$(mktemp -d)}
fw=$root/pvdriver/libcuda/testdata/frameworks
mkdir -p "$logs/lib"
cp "$B/libcuda.so.1" "$logs/lib/"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VGTEST_EVERY=1
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT
# metric DIR NAME: the primary's NAME, summed over its labels.
metric() {
	curl -s --unix-socket "$1/pa.sock" http://node/metrics |
		awk -v m="$2" '$1 == m || index($1, m "{") == 1 { sum += $2 } END { printf "%.0f", sum }'
}
echo "| program | read checks | link bytes/step | guest bytes/step | link/guest | steps/s |"
echo "|---|---|---|---|---|---|"
for checks in 0 65536; do
	d=$logs/checks$checks
	pids=()
	PRIMARY_FLAGS="--replicate.read-check-bytes $checks" start_pair "$d" --backend cuda --guest.kernels --guest.max-sessions 1 || exit 1
	for prog in resnet_amp eval_readback; do
		declare -A link guest
		for n in warm warm "$short" "$long"; do # warm: the node and its standby then hold the program's modules, for both
			l0=$(metric "$d" vgpuha_replication_sent_bytes_total) g0=$(metric "$d" vgpuha_guest_request_bytes_total)
			LD_LIBRARY_PATH=$logs/lib VGPUHA_ENDPOINT=unix://$d/p.sock CUDA_VISIBLE_DEVICES=0 python3 "$fw/$prog.py" "${n/warm/$short}" \
				>"$d/$prog.$n.out" 2>"$d/$prog.$n.err" || { echo "$prog ($n steps) failed:"; tail -5 "$d/$prog.$n.err"; exit 1; }
			link[$n]=$(($(metric "$d" vgpuha_replication_sent_bytes_total) - l0))
			guest[$n]=$(($(metric "$d" vgpuha_guest_request_bytes_total) - g0))
		done
		steps=$((long - short))
		lb=$(((link[$long] - link[$short]) / steps)) gb=$(((guest[$long] - guest[$short]) / steps))
		rate=$(grep -Eo '^[0-9.]+ steps/s' "$d/$prog.$long.err" | cut -d' ' -f1)
		echo "| $prog | $checks | $lb | $gb | $(awk -v a="$lb" -v b="$gb" 'BEGIN { printf "%.3f", a / b }') | $rate |"
		unset link guest
	done
	cleanup
	wait 2>/dev/null
done
