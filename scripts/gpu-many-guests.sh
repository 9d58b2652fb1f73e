#!/usr/bin/env bash
# Issue 44 on a host of two GPUs: one PyTorch training program alone, then
# GUESTS (16) at once, each its own guest process with its own kernels (the
# suite's bf16 GPT, deterministic), natively on GPU 0, then through one
# replicated primary serving GPU 0 (a GPU worker per session: --guest.workers
# on) whose standby serves GPU 1, the GUESTS with a SIGKILL of the primary
# once every program has printed step KILL_STEP. Takes a directory holding prebuilt vgpuha and
# libcuda.so.1; needs python3 with torch. Prints, per way, the programs'
# summed steps/s and its ratio to native's, whether each program printed
# native's losses, the steady rates of each phase (natively; replicated
# before the SIGKILL; after it, on the promoted standby: from each step's
# time, scripts/phase-rate.awk), each guest's pause at the failover (from the
# library's exit report, VGPUHA_STATS=1), the largest of them as the p99
# of 16, and how long the primary took to open each session. The guests
# run as one uid, one tenant, so the nodes let it hold 96 GiB. Knobs:
# GUESTS, STEPS (300), KILL_STEP (100), SPARES (GPU workers each node
# starts ahead, --cuda.spare-contexts: GUESTS, so that programs started at
# once need not wait for workers), WARMUP (seconds between the pair's
# start and the guests'; 0: a spare worker may still be opening its GPU),
# LOGS, MAX_SESSIONS (the nodes' --guest.max-sessions: GUESTS; more lets
# other guests in beside them), BACKEND (cuda; sim tries the script
# without a GPU, with a stand-in python3).
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
. "$(dirname "$0")/gpu-pair.sh" # start_pair
root=$(cd "$(dirname "$0")/.." && pwd)
n=${GUESTS:-16} steps=${STEPS:-300} kill_step=${KILL_STEP:-100}
[[ $n =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ && $kill_step =~ ^[0-9]+$ ]] ||
	{ echo "GUESTS, STEPS and KILL_STEP are numbers (KILL_STEP=$kill_step: gpu-runtime.sh's random is not one)" >&2; exit 2; }
logs=${LOGS:-$(mktemp -d)}
mkdir -p "$logs/lib"
cp "$B/libcuda.so.1" "$logs/lib/"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VGTEST_DETERMINISTIC=1 VGTEST_EVERY=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
prog=("$root/pvdriver/libcuda/testdata/frameworks/gpt_bf16.py" "$steps" flash)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT

# stamp copies its input's lines to its output, each after the time it
# was read (seconds since the epoch).
stamp() {
	local line
	while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done
}

# guests WAY COUNT ENV...: starts COUNT programs with ENV, waits for them
# (5 minutes at most), and prints their summed steps/s. Each program's
# lines go to WAY-I.out, and with the time each was printed to WAY-I.ts.
guests() {
	local way=$1 count=$2 i p gp=()
	shift 2
	for ((i = 0; i < count; i++)); do
		env "$@" VGPUHA_STATS=1 timeout 300 python3 "${prog[@]}" 2>"$logs/$way-$i.err" |
			tee "$logs/$way-$i.out" | stamp >"$logs/$way-$i.ts" &
		gp+=($!)
	done
	[ "$way" = replicated ] && strike "${gp[@]}"
	for p in "${gp[@]}"; do wait "$p"; done
	cat "$logs/$way"-*.err | grep -Eo '^[0-9.]+ steps/s' | awk '{s += $1} END {printf "%.1f", s}'
}

# strike PIDS... SIGKILLs the primary once each program (PIDS, in order)
# has printed step KILL_STEP or ended.
strike() {
	local _ i ready progs=("$@")
	for _ in $(seq 3000); do
		ready=0
		for ((i = 0; i < n; i++)); do
			grep -q "^step $kill_step " "$logs/replicated-$i.out" 2>/dev/null || ! kill -0 "${progs[i]}" 2>/dev/null && ready=$((ready + 1))
		done
		[ "$ready" = "$n" ] && break
		sleep 0.1
	done
	kill -9 "$primary"
	echo "SIGKILL of the primary with $ready of $n programs past step $kill_step" >&2
}

native1=$(guests native1 1 CUDA_VISIBLE_DEVICES=0)
native=$(guests native "$n" CUDA_VISIBLE_DEVICES=0)

start_pair "$logs" --backend "${BACKEND:-cuda}" --guest.kernels --guest.workers on --guest.max-sessions "${MAX_SESSIONS:-$n}" \
	--cuda.spare-contexts "${SPARES:-$n}" --tenant.memory-quota-bytes 96GiB || exit 1
sleep "${WARMUP:-0}"
through=(LD_LIBRARY_PATH="$logs/lib" VGPUHA_ENDPOINT="unix://$logs/p.sock" VGPUHA_FAILOVER="unix://$logs/s.sock" CUDA_VISIBLE_DEVICES=0)
replicated1=$(guests replicated1 1 "${through[@]}")
replicated=$(guests replicated "$n" "${through[@]}")

same=0
for ((i = 0; i < n; i++)); do cmp -s "$logs/native-0.out" "$logs/replicated-$i.out" && same=$((same + 1)); done
# Each guest's pause in ms (the report rounds to ms: "275ms", "1.204s").
pauses=$(grep -ho 'after [0-9.]*m\?s;' "$logs"/replicated-*.err |
	awk '{v = $2; sub(/;/, "", v); if (v ~ /ms$/) {sub(/ms/, "", v); print v} else {sub(/s/, "", v); print v * 1000}}' | sort -g | tr '\n' ' ')
echo "guests: $n, $steps steps each, SIGKILL of the primary after step $kill_step"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b ? a / b : 0}'; }
echo "one guest alone, steps/s: native $native1, replicated $replicated1 ($(ratio "$replicated1" "$native1")x)"
echo "native summed steps/s: $native"
echo "replicated summed steps/s: $replicated ($(ratio "$replicated" "$native")x native)"
# Steady rates from the stamped steps (scripts/phase-rate.awk): natively
# from step 10 to the last; replicated from step 10 to KILL_STEP (before
# the SIGKILL) and from KILL_STEP+10 to the last (on the promoted standby,
# unreplicated).
rate() { cat "$logs/$1"-*.ts 2>/dev/null | awk -v from="$2" -v to="$3" -f "$root/scripts/phase-rate.awk"; }
native_steady=$(rate native 10 $((steps - 1)))
before=$(rate replicated 10 "$kill_step")
after=$(rate replicated $((kill_step + 10)) $((steps - 1)))
echo "steady summed steps/s: native $native_steady; replicated before the SIGKILL $before ($(ratio "$before" "$native_steady")x), after it on the promoted standby $after ($(ratio "$after" "$native_steady")x)"
echo "programs that printed native's losses: $same of $n"
echo "the primary opened sessions in: $(grep "guest session opened" "$logs/primary.log" | grep -o "took=[^ ]*" | tr '\n' ' ')"
echo "pauses at the failover, ms, smallest first (the last is the p99 of $n): $pauses"
echo "logs: $logs"
[ "$same" = "$n" ] && echo PASS || { echo "FAIL"; exit 1; }
