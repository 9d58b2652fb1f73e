#!/usr/bin/env bash
# PyTorch across faults of its primary (issue 32): RUNS runs with the
# replicated primary SIGKILLed and RUNS with it SIGSTOPped (frozen), each at
# a random training step, PARALLEL at a time (each run its own pair: primary
# on GPU 0, standby on GPU 1 where there is one). The training loop runs in
# PyTorch's deterministic mode and prints its loss at every step, so a run
# passes only when its whole output equals the native run's: no step lost,
# none applied twice. The guest's pause is the longest step less the median
# one, from the program's own timing. Takes the directory holding `vgpuha`
# and `libcuda.so.1`; prints a table and the pause's p50/p99 per fault.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${RUNS:-10} parallel=${PARALLEL:-4} steps=${TORCH_STEPS:-200}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export VGTEST_DETERMINISTIC=1 VGTEST_EVERY=1 TORCH_STEPS=$steps
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CUBLAS_WORKSPACE_CONFIG=:4096:8 CUDA_VISIBLE_DEVICES=0 python3 "$root/pvdriver/libcuda/testdata/runtime/torch_suite.py" "$steps" \
	>"$out/native.out" 2>"$out/native.err" || { cat "$out/native.err"; exit 1; }

one() { # INDEX FAULT STEP
	FAULT=$2 KILL_AT="^step $3 " MODES=failover PROGRAMS=torch NATIVE_OUT=$out/native.out PORT=$((7000 + 3 * $1)) \
		LOGS=$out/run$1.log "$root/scripts/gpu-runtime.sh" "$B" >"$out/run$1.table" 2>"$out/run$1.err"
}

faults=() at=()
for i in $(seq 0 $((2 * runs - 1))); do
	faults[i]=KILL
	[ "$i" -ge "$runs" ] && faults[i]=STOP
	at[i]=$((5 + RANDOM % (steps - 10)))
done
for i in "${!faults[@]}"; do
	one "$i" "${faults[i]}" "${at[i]}" &
	while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 0.2; done
done
wait

echo "| run | fault | at step | result | median step (ms) | longest step (ms) | pause (ms) |"
echo "|---|---|---|---|---|---|---|"
failures=0
declare -A pauses
for i in "${!faults[@]}"; do
	cell=$(grep '^| torch |' "$out/run$i.table" | awk -F'|' '{gsub(/^ +| +$/, "", $3); print $3}')
	timing=$(grep -o 'step median [0-9.]* ms, longest [0-9.]* ms' "$out/run$i.log" | tail -1)
	med=$(awk '{print $3}' <<<"$timing") long=$(awk '{print $6}' <<<"$timing")
	pause=$(awk -v l="${long:-0}" -v m="${med:-0}" 'BEGIN {printf "%.0f", l - m}')
	[[ $cell == ok* ]] || { failures=$((failures + 1)); cat "$out/run$i.table" "$out/run$i.err" "$out/run$i.log" >&2; }
	pauses[${faults[i]}]+="$pause "
	echo "| $i | SIG${faults[i]} | ${at[i]} | ${cell:-no result} | ${med:-?} | ${long:-?} | $pause |"
done
for f in KILL STOP; do
	# shellcheck disable=SC2086
	printf '%s\n' ${pauses[$f]} | sort -n | awk -v f="$f" '{a[NR] = $1} END {
		p50 = a[int((NR + 1) / 2)]; i99 = int(NR * 0.99 + 0.999); if (i99 < 1) i99 = 1
		printf "SIG%s: %d runs, guest pause p50 %d ms, p99 %d ms, max %d ms\n", f, NR, p50, a[i99], a[NR] }'
done
[ "$failures" = 0 ] || { echo "FAIL: $failures runs"; exit 1; }
echo PASS
