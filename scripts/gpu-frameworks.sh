#!/usr/bin/env bash
# Issue 42's framework suite: every program of
# pvdriver/libcuda/testdata/frameworks natively, through the library,
# replicated (verified at its checkpoint) and across a SIGKILL of the
# primary, by scripts/gpu-runtime.sh, in FW_GROUPS groups run side by side
# (each with its own nodes). Group g's primaries use GPU g mod NGPUS and its
# standby the next GPU, so the groups spread over the host's GPUs.
# Usage: scripts/gpu-frameworks.sh BINDIR   (prebuilt vgpuha, libcuda.so.1)
# Knobs: PROGRAMS, FW_GROUPS (3), FW_STEPS (30), MODES, NGPUS (nvidia-smi's
# count), NODE_FLAGS (more flags for every group's nodes), BIG (below),
# LOGDIR (where each group's table, log and steps/s go; default a
# temporary directory), and gpu-runtime.sh's own (KILL_STEP=random,
# DEADLINE, ...). Programs that reserve more address space than a guest's
# default window (XLA's allocator, PyTorch's expandable segments: BIG, "fw_jax
# fw_expandable") run in groups of their own, one program each, whose nodes
# give each guest a 512 GiB window. The end prints every group's rows and,
# per program and mode, the median steps/s of its runs with its ratio to
# native (scripts/fw-speed.awk).
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
read -r -a all <<<"${PROGRAMS:-fw_gpt_flash fw_gpt_efficient fw_gpt_cudnn fw_gpt_math fw_resnet_amp fw_hf_lm fw_compile fw_compile_ro fw_graph fw_jax fw_cupy fw_triton fw_pinned fw_expandable fw_jax_plain fw_jax_tuned}"
read -r -a big <<<"${BIG:-fw_jax fw_expandable fw_jax_plain fw_jax_tuned}"
groups=${FW_GROUPS:-3}
ngpus=${NGPUS:-$(nvidia-smi -L | wc -l)}
[ "$ngpus" -ge 1 ] || ngpus=1
logdir=${LOGDIR:-$(mktemp -d)}
mkdir -p "$logdir"
small=() large=()
for p in "${all[@]}"; do
	if [[ " ${big[*]} " == *" $p "* ]]; then large+=("$p"); else small+=("$p"); fi
done
pids=()
# group G PROGRAMS FLAGS: runs gpu-runtime.sh over PROGRAMS in the background.
group() {
	PROGRAMS="$2" NODE_FLAGS="${NODE_FLAGS:-} $3" PORT=$((7300 + $1 * 97 + RANDOM % 50)) LOGS="$logdir/group$1.log" \
		PRIMARY_GPU=$(($1 % ngpus)) STANDBY_GPU=$((($1 + 1) % ngpus)) STATS="$logdir/group$1.stats" \
		"$here/gpu-runtime.sh" "$B" >"$logdir/group$1.table" 2>&1 &
	pids+=($!)
}
for ((g = 0; g < groups; g++)); do
	mine=()
	for ((i = g; i < ${#small[@]}; i += groups)); do mine+=("${small[$i]}"); done
	[ ${#mine[@]} -gt 0 ] && group "$g" "${mine[*]}" ""
done
g=$groups
for p in "${large[@]}"; do
	group "$g" "$p" "--va.window-bytes 512GiB"
	g=$((g + 1))
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
head -2 "$logdir/group0.table"
cat "$logdir"/group*.table | grep '^| fw_' | sort
grep -h -E '^FAIL|^no |never' "$logdir"/group*.table
cat "$logdir"/group*.stats 2>/dev/null | awk -f "$here/fw-speed.awk"
echo "logs: $logdir"
exit $status
