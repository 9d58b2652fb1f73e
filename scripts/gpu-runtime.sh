#!/usr/bin/env bash
# CUDA runtime programs, cuBLAS and PyTorch through vgpuha's libcuda.so.1
# (issue 32). Takes a directory holding prebuilt `vgpuha` and `libcuda.so.1`;
# needs nvcc, and python3 with torch for the PyTorch part.
#
# Builds pvdriver/libcuda/testdata/runtime/*.cu with nvcc (static and shared
# cudart), then runs every program natively, through the library against an
# unreplicated CUDA primary, and replicated (commit mode, the standby on the
# second GPU when there is one) with `vgpuha verify` at the end; a program's
# stdout must be the same all three ways. Prints a table; every program's
# stderr goes to $LOGS (default: a temporary file, printed on failure).
#
# Knobs: MODES (native library replicated), PROGRAMS (the list below),
# TORCH_STEPS (200), VGPUHA_DEBUG (passed to the library: 1 names refused
# calls, 2 also every cuGetProcAddress lookup), LOGS.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/pvdriver/libcuda/testdata/runtime
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
read -r -a modes <<<"${MODES:-native library replicated}"
read -r -a programs <<<"${PROGRAMS:-rt_vadd rt_vadd_shared rt_global rt_sgemm torch}"
steps=${TORCH_STEPS:-200}
work=$(mktemp -d)
logs=${LOGS:-$work/logs.txt}
: >"$logs"
declare -A out_ok rc secs
failures=0 pids=() verified="" pause_us=0
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

build() {
	mkdir -p "$work/bin" "$work/lib"
	cp "$B/libcuda.so.1" "$work/lib/"
	"$nvcc" -O2 -arch=sm_90 -o "$work/bin/rt_vadd" "$src/rt_vadd.cu" || exit 1
	"$nvcc" -O2 -arch=sm_90 -cudart shared -o "$work/bin/rt_vadd_shared" "$src/rt_vadd.cu" || exit 1
	"$nvcc" -O2 -arch=sm_90 -o "$work/bin/rt_global" "$src/rt_global.cu" || exit 1
	"$nvcc" -O2 -arch=sm_90 -o "$work/bin/rt_sgemm" "$src/rt_sgemm.cu" -lcublas -lcublasLt || exit 1
	printf '#!/bin/sh\nexec python3 %s %s\n' "$src/torch_suite.py" "$steps" >"$work/bin/torch"
	chmod +x "$work/bin/torch"
}

start_node() { # NAME ARGS...
	local name=$1
	shift
	"$B/vgpuha" "$@" 2>"$work/$name.log" &
	pids+=($!)
}

wait_socket() {
	local _
	for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
	echo "no socket $1"; return 1
}

protected() { "$B/vgpuha" status --admin "unix://$work/admin.sock" --json 2>/dev/null | grep -Eq '"protected": *true'; }

start_nodes() {
	local gflags=(--backend cuda --guest.kernels --guest.max-sessions 1) port=$((7300 + RANDOM % 500)) standby_gpu=0 _
	[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && standby_gpu=1
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/key"
	CUDA_VISIBLE_DEVICES=0 start_node plain primary "${gflags[@]}" --guest-listen "unix://$work/plain.sock"
	CUDA_VISIBLE_DEVICES=$standby_gpu start_node standby standby "${gflags[@]}" --listen "tcp://127.0.0.1:$port" --replicate.key-file "$work/key"
	CUDA_VISIBLE_DEVICES=0 start_node replicated primary "${gflags[@]}" --guest-listen "unix://$work/repl.sock" --mode commit \
		--replicate-to "tcp://127.0.0.1:$port" --replicate.key-file "$work/key" --admin-listen "unix://$work/admin.sock"
	wait_socket "$work/plain.sock" && wait_socket "$work/repl.sock" || exit 1
	for _ in $(seq 200); do protected && return 0; sleep 0.05; done
	echo "the replicated pair never became protected"; tail -20 "$work"/*.log; exit 1
}

run() { # MODE PROGRAM
	local mode=$1 p=$2 env=() t0 status=0
	case $mode in
	library) env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/plain.sock") ;;
	replicated) env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/repl.sock") ;;
	esac
	verified="" pause_us=0
	t0=${EPOCHREALTIME/[.,]/}
	if [ "$mode" = replicated ]; then
		checkpointed "$work/$p.$mode.out" "$work/$p.$mode.err" env "${env[@]}" VGTEST_CHECKPOINT=1 timeout 300 "$work/bin/$p" || status=$?
	else
		env "${env[@]}" timeout 300 "$work/bin/$p" >"$work/$p.$mode.out" 2>"$work/$p.$mode.err" || status=$?
	fi
	local us=$((${EPOCHREALTIME/[.,]/} - t0 - pause_us))
	secs[$p.$mode]=$((us / 1000000)).$(printf '%03d' $((us / 1000 % 1000)))
	rc[$p.$mode]=$status
	{ echo "==== $p ($mode): exit $status"; cat "$work/$p.$mode.out"; echo "---- stderr"; cat "$work/$p.$mode.err"; } >>"$logs"
	if [ "$mode" = replicated ] && [ "$status" = 0 ]; then
		echo "verify at the checkpoint: $verified" >>"$logs"
		[[ $verified =~ ^verified\ [1-9][0-9]*\ objects.*match=true ]] || rc[$p.$mode]="verify: ${verified:-no checkpoint}"
	fi
}

# checkpointed OUT ERR CMD...: runs CMD, whose stdout says "checkpoint" when
# the standby's replica should be verified (it then waits for a line on its
# stdin); `vgpuha verify`'s answer goes to $verified, the time it took to
# pause_us (left out of the program's time), every other line to OUT.
checkpointed() {
	local out=$1 err=$2 line t1 status=0
	shift 2
	pause_us=0
	: >"$out"
	coproc PROG { "$@" 2>"$err"; }
	local rd=${PROG[0]} wr=${PROG[1]} pid=$PROG_PID
	while IFS= read -r -u "$rd" line; do
		if [ "$line" != checkpoint ]; then
			printf '%s\n' "$line" >>"$out"
			continue
		fi
		t1=${EPOCHREALTIME/[.,]/}
		verified=$("$B/vgpuha" verify --admin "unix://$work/admin.sock" 2>&1 | tr '\n' ' ')
		pause_us=$((pause_us + ${EPOCHREALTIME/[.,]/} - t1))
		printf '\n' >&"$wr"
	done
	wait "$pid" || status=$?
	return "$status"
}

build
[[ " ${modes[*]} " == *" library "* || " ${modes[*]} " == *" replicated "* ]] && start_nodes
printf '| program |'; printf ' %s |' "${modes[@]}"; printf '\n|---|'; printf -- '---|%.0s' "${modes[@]}"; printf '\n'
for p in "${programs[@]}"; do
	printf '| %s |' "$p"
	for m in "${modes[@]}"; do
		run "$m" "$p"
		cell="exit ${rc[$p.$m]}"
		if [ "${rc[$p.$m]}" = 0 ]; then
			cell="ok ${secs[$p.$m]} s"
			if [ "$m" != native ] && [ -f "$work/$p.native.out" ] && ! cmp -s "$work/$p.native.out" "$work/$p.$m.out"; then
				cell="output differs"
			fi
		fi
		[[ $cell == ok* ]] || failures=$((failures + 1))
		printf ' %s |' "$cell"
	done
	printf '\n'
done
[ "$failures" = 0 ] || { [ -n "${LOGS:-}" ] || cat "$logs"; echo "FAIL: $failures runs"; exit 1; }
echo "PASS"
