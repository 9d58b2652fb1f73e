#!/usr/bin/env bash
# CUDA runtime programs, cuBLAS and PyTorch through vgpuha's libcuda.so.1
# (issue 32). Takes a directory holding prebuilt `vgpuha` and `libcuda.so.1`;
# needs nvcc, and python3 with torch for the PyTorch part.
#
# Builds pvdriver/libcuda/testdata/runtime/*.cu with nvcc (static and shared
# cudart), then runs every program natively, through the library against an
# unreplicated CUDA primary, and replicated (commit mode, the standby on the
# second GPU when there is one) with `vgpuha verify` at its checkpoint, and
# across a failover (the replicated primary SIGKILLed when the program's
# output first matches KILL_AT; the program finishes on the promoted
# standby); a program's stdout must be the same every way. Prints a table;
# every program's stderr goes to $LOGS (default: a temporary file, printed
# on failure). The torch suite runs in PyTorch's deterministic mode
# (VGTEST_DETERMINISTIC=1, the default here; 0 turns it off): its printed
# losses are compared byte for byte, and the default mode does not repeat
# them even natively (three native runs on one H100 printed 0.016003,
# 0.016002 and 0.016043 at step 20). torch_resnet runs in the default mode.
#
# Knobs: MODES (native library replicated failover; library-again and
# replicated-again run once more on the same nodes, whose image caches then
# hold the program's modules), PROGRAMS (the list below), KILL_AT (a regex:
# '^step 100 |^checkpoint$'; at a checkpoint the kill follows the verify),
# FAULT (KILL or STOP), TORCH_STEPS (200), NATIVE_OUT (compare with this
# file instead of running natively), PORT (the pair's replication port),
# NODE_FLAGS (more flags for every node), VGPUHA_DEBUG (passed to the
# library: 1 names refused calls, 2 also every
# cuGetProcAddress lookup), LOGS, PRIMARY_GPU (0: the primaries' GPU, the
# one native runs see), STANDBY_GPU (1 where there are two GPUs, else 0),
# KILL_STEP (random: each failover run kills at a step drawn from 1 to
# FW_STEPS-2, shown in its cell as "k17"; every step then prints its loss),
# STATS (a file each run appends "program mode steps/s" to, from the
# program's stderr), DEADLINE (epoch seconds: runs not started by then are
# skipped and counted as failures), BACKEND (cuda; sim tries the harness on
# a machine without a GPU).
#
# At a checkpoint the replica is verified; where it differs (a kernel with
# floating-point atomics, replayed on the standby, adds in another order)
# it is repaired from the primary and verified again, which must match.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/pvdriver/libcuda/testdata/runtime
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
read -r -a modes <<<"${MODES:-native library replicated failover}"
kill_at=${KILL_AT:-'^step 100 |^checkpoint$'}
kill_step=${KILL_STEP:-}
[ "$kill_step" = random ] && export VGTEST_EVERY=1 # every step prints: any step can be the kill's
stats=${STATS:-/dev/null}
deadline=${DEADLINE:-0}
primary_gpu=${PRIMARY_GPU:-0}
fault=${FAULT:-KILL} # the signal the primary gets: KILL, or STOP (a freeze)
read -r -a programs <<<"${PROGRAMS:-rt_vadd rt_vadd_shared rt_global rt_cluster rt_sgemm torch torch_resnet}"
steps=${TORCH_STEPS:-200}
native_out=${NATIVE_OUT:-}
work=$(mktemp -d)
logs=${LOGS:-$work/logs.txt}
: >"$logs"
declare -A rc secs node_pid
failures=0 frozen=() verified="" pause_us=0
# cleanup ends the nodes still running: only those, as a node reaped
# earlier left its pid free for any process of the host (another group's).
cleanup() {
	local p
	for p in "${frozen[@]}"; do kill -9 "$p" 2>/dev/null; done
	for p in "${node_pid[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VGTEST_DETERMINISTIC=${VGTEST_DETERMINISTIC:-1}

build() {
	mkdir -p "$work/bin" "$work/lib"
	cp "$B/libcuda.so.1" "$work/lib/"
	local p
	for p in "${programs[@]}"; do
		case $p in
		rt_vadd | rt_global | rt_cluster | rt_stored) "$nvcc" -O2 -arch=sm_90 -o "$work/bin/$p" "$src/$p.cu" || exit 1 ;;
		rt_vadd_shared) "$nvcc" -O2 -arch=sm_90 -cudart shared -o "$work/bin/$p" "$src/rt_vadd.cu" || exit 1 ;;
		rt_sgemm) "$nvcc" -O2 -arch=sm_90 -o "$work/bin/$p" "$src/$p.cu" -lcublas -lcublasLt || exit 1 ;;
		torch) printf '#!/bin/sh\nexec python3 %s %s\n' "$src/torch_suite.py" "$steps" >"$work/bin/$p" ;;
		torch_resnet) printf '#!/bin/sh\nexec python3 %s\n' "$src/torch_resnet.py" >"$work/bin/$p" ;;
		fw_*) framework "$p" >"$work/bin/$p" || exit 1 ;;
		*) echo "unknown program $p"; exit 1 ;;
		esac
		chmod +x "$work/bin/$p"
	done
}

# framework NAME: the wrapper that runs framework program NAME (issue 42's
# suite, pvdriver/libcuda/testdata/frameworks) for FW_STEPS steps (30).
framework() {
	local fw=$root/pvdriver/libcuda/testdata/frameworks n=${FW_STEPS:-30} env=""
	local -A prog=([fw_gpt_flash]="gpt_bf16.py $n flash" [fw_gpt_efficient]="gpt_bf16.py $n efficient"
		[fw_gpt_cudnn]="gpt_bf16.py $n cudnn" [fw_gpt_math]="gpt_bf16.py $n math" [fw_resnet_amp]="resnet_amp.py $n"
		[fw_hf_lm]="hf_lm.py $n" [fw_compile]="compiled.py $n default" [fw_compile_ro]="compiled.py $n reduce-overhead"
		[fw_graph]="graph.py $n" [fw_jax]="jax_train.py $n" [fw_cupy]="cupy_raw.py $n" [fw_triton]="triton_kernel.py $n"
		[fw_pinned]="pinned.py $n" [fw_eval]="eval_readback.py $n" [fw_expandable]="gpt_bf16.py $n flash" [fw_jax_plain]="jax_train.py $n" [fw_jax_tuned]="jax_train.py $n")
	[ -n "${prog[$1]:-}" ] || { echo "unknown program $1" >&2; return 1; }
	[ "$1" = fw_expandable ] && env="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
	[ "$1" = fw_jax ] && env="XLA_PYTHON_CLIENT_PREALLOCATE=false "
	# fw_jax runs XLA's defaults (command buffers: graphs built node by
	# node; the autotuner); fw_jax_tuned turns command buffers off;
	# fw_jax_plain also the autotuner, whose choices (by timing) change the
	# results in the sixth digit from run to run.
	[ "$1" = fw_jax_tuned ] && env="XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=\"--xla_gpu_enable_command_buffer=\" "
	[ "$1" = fw_jax_plain ] && env="XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=\"--xla_gpu_autotune_level=0 --xla_gpu_enable_command_buffer=\" "
	printf '#!/bin/sh\nexec env %spython3 %s/%s\n' "$env" "$fw" "${prog[$1]}"
}

start_node() { # NAME ARGS...
	local name=$1
	shift
	"$B/vgpuha" "$@" 2>>"$work/$name.log" &
	node_pid[$name]=$!
}

stop_node() {
	local pid=${node_pid[$1]:-}
	[ -n "$pid" ] || return 0
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	unset "node_pid[$1]"
}

wait_socket() {
	local _
	for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
	echo "no socket $1"; return 1
}

protected() { "$B/vgpuha" status --admin "unix://$work/admin.sock" --json 2>/dev/null | grep -Eq '"protected": *true'; }

read -r -a node_flags <<<"${NODE_FLAGS:-}" # more flags for every node (e.g. --va.window-bytes 512GiB)
gflags=(--backend "${BACKEND:-cuda}" --guest.kernels --guest.max-sessions 1 "${node_flags[@]}")

start_nodes() {
	CUDA_VISIBLE_DEVICES=$primary_gpu start_node plain primary "${gflags[@]}" --guest-listen "unix://$work/plain.sock" --admin-listen "unix://$work/padmin.sock"
	wait_socket "$work/plain.sock" || exit 1
	start_pair
}

# start_pair (re)starts the replicated pair: the primary on GPU 0, its
# standby on GPU 1 where there is one, serving guests once promoted.
start_pair() {
	local port=${PORT:-$((7300 + RANDOM % 500))} standby_gpu=${STANDBY_GPU:-0} _
	[ -z "${STANDBY_GPU:-}" ] && [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && standby_gpu=1
	stop_node replicated
	stop_node standby
	rm -rf "$work/repl.sock" "$work/standby.sock" "$work/admin.sock" "$work/sadmin.sock" "$work/state"
	mkdir -p "$work/state"
	(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/key") # the nodes refuse a key others can read
	CUDA_VISIBLE_DEVICES=$standby_gpu start_node standby standby "${gflags[@]}" --listen "tcp://127.0.0.1:$port" \
		--replicate.key-file "$work/key" --guest-listen "unix://$work/standby.sock" --admin-listen "unix://$work/sadmin.sock"
	CUDA_VISIBLE_DEVICES=$primary_gpu start_node replicated primary "${gflags[@]}" --guest-listen "unix://$work/repl.sock" --mode commit \
		--replicate-to "tcp://127.0.0.1:$port" --replicate.key-file "$work/key" --admin-listen "unix://$work/admin.sock" \
		--state-dir "$work/state"
	wait_socket "$work/repl.sock" || exit 1
	for _ in $(seq 400); do protected && return 0; sleep 0.05; done
	echo "the replicated pair never became protected"; tail -20 "$work"/*.log; exit 1
}

run() { # MODE PROGRAM
	local mode=$1 p=$2 env=() t0 status=0
	case $mode in
	library | library-again) env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/plain.sock") ;;
	replicated | replicated-again) env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/repl.sock") ;;
	failover)
		start_pair
		env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/repl.sock" "VGPUHA_FAILOVER=unix://$work/standby.sock")
		;;
	esac
	[[ $p == torch* || $p == fw_* ]] && env+=(CUBLAS_WORKSPACE_CONFIG=:4096:8)
	# Natively the program sees the primary's GPU alone, as through the
	# library, where it is the node's one GPU: device 0.
	if [ "$mode" = native ]; then env+=(CUDA_VISIBLE_DEVICES=$primary_gpu); else env+=(CUDA_VISIBLE_DEVICES=0); fi
	verified="" pause_us=0 killed_at=""
	[ "$mode" = failover ] && [ "$kill_step" = random ] && kill_at="^step $((1 + RANDOM % (${FW_STEPS:-30} - 2))) "
	if [ "$deadline" != 0 ] && [ "$(date +%s)" -ge "$deadline" ]; then
		rc[$p.$mode]="skipped (deadline)" secs[$p.$mode]=0
		return
	fi
	t0=${EPOCHREALTIME/[.,]/}
	if [[ $mode == replicated* ]] || [ "$mode" = failover ]; then
		checkpointed "$mode" "$work/$p.$mode.out" "$work/$p.$mode.err" env "${env[@]}" VGTEST_CHECKPOINT=1 timeout 300 "$work/bin/$p" || status=$?
	else
		env "${env[@]}" timeout 300 "$work/bin/$p" >"$work/$p.$mode.out" 2>"$work/$p.$mode.err" || status=$?
	fi
	local us=$((${EPOCHREALTIME/[.,]/} - t0 - pause_us))
	secs[$p.$mode]=$((us / 1000000)).$(printf '%03d' $((us / 1000 % 1000)))
	rc[$p.$mode]=$status
	echo "$p $mode $(grep -Eo '^[0-9.]+ steps/s' "$work/$p.$mode.err" | tail -1 | cut -d' ' -f1)" >>"$stats"
	{
		echo "==== $p ($mode): exit $status"; cat "$work/$p.$mode.out"; echo "---- stderr"; cat "$work/$p.$mode.err"
		[[ $mode == replicated* || $mode == failover ]] && echo "---- standby: $(standby_metric vgpuha_replica_read_back_repairs_total); $(standby_metric vgpuha_replica_module_variables_elsewhere_total)"
		[[ $mode == library* ]] && echo "---- the unreplicated primary's requests so far:" && node_requests padmin
	} >>"$logs"
	if [ "$mode" = failover ] && [ "$status" = 0 ] && [ -n "${node_pid[replicated]:-}" ]; then
		rc[$p.$mode]="the primary was never killed"
	fi
	[ "$mode" = failover ] && start_pair # the next run gets a fresh pair
	if [[ $mode == replicated* ]] && [ "$status" = 0 ]; then
		echo "verify at the checkpoint: $verified" >>"$logs"
		[[ $verified =~ verified\ [1-9][0-9]*\ objects[^|]*match=true\ *$ ]] || rc[$p.$mode]="verify: ${verified:-no checkpoint}"
	fi
}

# metrics ADMIN: a node's /metrics, from its admin socket (ADMIN.sock).
metrics() {
	curl -s --max-time 2 --unix-socket "$work/$1.sock" http://node/metrics 2>/dev/null
}

# standby_metric NAME: the standby's value of a metric.
standby_metric() {
	metrics sadmin | grep "^$1 " || echo "$1 (no standby metrics)"
}

# node_requests ADMIN: a node's guest requests by op and status, most first.
node_requests() {
	metrics "$1" | grep '^vgpuha_guest_requests_total' | sort -k2 -g -r | head -12
}

# verify_checkpoint: verifies the replica into $verified; where it differs,
# repairs it from the primary and verifies again (both answers kept).
verify_checkpoint() {
	local admin=(--admin "unix://$work/admin.sock") first
	first=$("$B/vgpuha" verify "${admin[@]}" 2>&1 | tr '\n' ' ')
	verified=$first
	if [[ ! $first =~ match=true ]]; then
		verified="$first | $("$B/vgpuha" verify --repair "${admin[@]}" 2>&1 | tr '\n' ' ') | $("$B/vgpuha" verify "${admin[@]}" 2>&1 | tr '\n' ' ')"
	fi
}

# checkpointed MODE OUT ERR CMD...: runs CMD, whose stdout says "checkpoint"
# when the standby's replica should be verified (it then waits for a line on
# its stdin); `vgpuha verify`'s answer goes to $verified, the time it took to
# pause_us (left out of the program's time), every other line to OUT. In
# failover mode the first line matching KILL_AT SIGKILLs the primary instead.
checkpointed() {
	local mode=$1 out=$2 err=$3 line t1 status=0
	shift 3
	pause_us=0
	: >"$out"
	coproc PROG { "$@" 2>"$err"; }
	local rd wr pid=$PROG_PID
	# Copies of the coprocess's pipes: bash closes PROG's own when the
	# program exits, and its last lines, still unread, went with them.
	exec {rd}<&"${PROG[0]}" {wr}>&"${PROG[1]}"
	while IFS= read -r -u "$rd" line; do
		if [ "$line" != checkpoint ]; then
			printf '%s\n' "$line" >>"$out"
			[ "$mode" = failover ] && [[ $line =~ $kill_at ]] && strike
			continue
		fi
		if [ -n "${node_pid[replicated]:-}" ]; then
			t1=${EPOCHREALTIME/[.,]/}
			verify_checkpoint
			echo "verify at the checkpoint ($mode): $verified" >>"$logs"
			pause_us=$((pause_us + ${EPOCHREALTIME/[.,]/} - t1))
			[ "$mode" = failover ] && [[ $line =~ $kill_at ]] && strike
		fi
		printf '\n' >&"$wr"
	done
	wait "$pid" || status=$?
	exec {rd}<&- {wr}>&-
	return "$status"
}

# strike sends the replicated primary FAULT (once).
strike() {
	[ -n "${node_pid[replicated]:-}" ] || return 0
	killed_at=${line#step } # the step the kill followed, for the table
	killed_at=k${killed_at%% *}
	# A killed node is reaped here, quietly: bash would otherwise print its
	# "Killed" notice into the middle of the table's row.
	{ kill -"$fault" "${node_pid[replicated]}" && [ "$fault" = KILL ] && wait "${node_pid[replicated]}"; } 2>/dev/null
	[ "$fault" = KILL ] || frozen+=("${node_pid[replicated]}") # a frozen node is killed at the end
	unset "node_pid[replicated]"
}

build
[[ " ${modes[*]} " == *" library"* || " ${modes[*]} " == *" replicated"* ]] && start_nodes
printf '| program |'; printf ' %s |' "${modes[@]}"; printf '\n|---|'; printf -- '---|%.0s' "${modes[@]}"; printf '\n'
for p in "${programs[@]}"; do
	printf '| %s |' "$p"
	for m in "${modes[@]}"; do
		run "$m" "$p"
		cell=${rc[$p.$m]}
		[[ $cell =~ ^[0-9]+$ ]] && cell="exit $cell"
		if [ "${rc[$p.$m]}" = 0 ]; then
			cell="ok ${secs[$p.$m]} s"
			ref=$work/$p.native.out
			[ -n "$native_out" ] && ref=$native_out
			if [ "$m" != native ] && [ -f "$ref" ] && ! cmp -s "$ref" "$work/$p.$m.out"; then
				cell="output differs"
			fi
		fi
		[ "$m" = failover ] && [ -n "$killed_at" ] && cell="$cell $killed_at"
		[[ $cell == ok* ]] || failures=$((failures + 1))
		printf ' %s |' "$cell"
	done
	printf '\n'
done
[ "$failures" = 0 ] || { [ -n "${LOGS:-}" ] || cat "$logs"; echo "FAIL: $failures runs"; exit 1; }
echo "PASS"
