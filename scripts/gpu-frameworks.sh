#!/usr/bin/env bash
# Issue 42's framework suite: every program of
# pvdriver/libcuda/testdata/frameworks natively, through the library,
# replicated (verified at its checkpoint) and across a SIGKILL of the
# primary at its checkpoint, by scripts/gpu-runtime.sh, in FW_GROUPS groups
# run side by side (each with its own nodes on the same GPUs).
# Usage: scripts/gpu-frameworks.sh BINDIR   (prebuilt vgpuha, libcuda.so.1)
# Knobs: PROGRAMS, FW_GROUPS (3), FW_STEPS (30), MODES, LOGDIR (where each
# group's table and log go; default a temporary directory), and
# gpu-runtime.sh's own. Programs that reserve more address space than a
# guest's default window (XLA's allocator, PyTorch's expandable segments:
# BIG, "fw_jax fw_expandable") run in a group of their own whose nodes give
# each guest a 512 GiB window.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
read -r -a all <<<"${PROGRAMS:-fw_gpt_flash fw_gpt_efficient fw_gpt_cudnn fw_gpt_math fw_resnet_amp fw_hf_lm fw_compile fw_compile_ro fw_graph fw_jax fw_cupy fw_triton fw_pinned fw_expandable fw_jax_plain fw_jax_tuned}"
read -r -a big <<<"${BIG:-fw_jax fw_expandable fw_jax_plain fw_jax_tuned}"
groups=${FW_GROUPS:-3}
logdir=${LOGDIR:-$(mktemp -d)}
mkdir -p "$logdir"
small=() large=()
for p in "${all[@]}"; do
	if [[ " ${big[*]} " == *" $p "* ]]; then large+=("$p"); else small+=("$p"); fi
done
pids=()
# group G PROGRAMS FLAGS: runs gpu-runtime.sh over PROGRAMS in the background.
group() {
	PROGRAMS="$2" NODE_FLAGS="$3" PORT=$((7300 + $1 * 97 + RANDOM % 50)) LOGS="$logdir/group$1.log" \
		"$here/gpu-runtime.sh" "$B" >"$logdir/group$1.table" 2>&1 &
	pids+=($!)
}
for ((g = 0; g < groups; g++)); do
	mine=()
	for ((i = g; i < ${#small[@]}; i += groups)); do mine+=("${small[$i]}"); done
	[ ${#mine[@]} -gt 0 ] && group "$g" "${mine[*]}" ""
done
[ ${#large[@]} -gt 0 ] && group "$groups" "${large[*]}" "--va.window-bytes 512GiB"
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
head -2 "$logdir/group0.table"
cat "$logdir"/group*.table | grep '^| fw_' | sort
grep -h -E '^FAIL|^no |never' "$logdir"/group*.table
echo "logs: $logdir"
exit $status
