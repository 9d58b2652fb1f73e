#!/usr/bin/env bash
# The guest libcuda.so.1 on an NVIDIA GPU (issue 13). Takes a directory
# holding prebuilt `vgpuha` and `libcuda.so.1` (make gpu-test builds them into
# bin/), so it runs where Go is not installed; needs nvcc and gcc.
#
# Compiles the test programs' kernels (pvdriver/libcuda/testdata/kernels/*.cu)
# with nvcc into cubin, fatbin and PTX and the C programs with gcc against the
# library (-lcuda, no stub), then runs every program with every image (those
# three and the kernel library's own PTX) three ways:
#   native      against NVIDIA's libcuda.so.1 (VGTEST_NATIVE=1)
#   library     through our libcuda.so.1, an unreplicated CUDA primary
#   replicated  through it, a CUDA primary replicated in commit mode to a CUDA
#               standby, `vgpuha verify` at the program's checkpoint
# A program's stdout must be the same all three ways; a markdown table gives
# the wall times (the verify pause left out). Then the isolation test: a
# guest's own kernel reads another guest's memory (two primaries, one GPU).
# Exits non-zero on any failure, after printing everything that ran.
#
# Knobs: NVCC (nvcc's path), CUDA_ARCH (90: the H100), NVIDIA_LIBCUDA (NVIDIA's
# libcuda.so.1; default: ldconfig's), VGTEST_BACKEND (cuda; sim runs the
# plumbing on the software GPU, with a stand-in nvcc and native library),
# PROGRAMS (which C programs), WORKERS (on: every node runs each guest in a
# worker process of its own, --guest.workers on, many guests per primary;
# the isolation test then puts both guests on one primary, which must serve
# the next guest without a restart).
set -euo pipefail
B=$(cd "${1:-bin}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/pvdriver/libcuda/testdata
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
arch=${CUDA_ARCH:-90}
backend=${VGTEST_BACKEND:-cuda}
read -r -a programs <<<"${PROGRAMS:-vadd matmul pipeline attributes modfile procaddr errors vmm graph graphbuild}"
workers=${WORKERS:-off}
kernels=(vadd saxpy matmul histogram peek)
images=(cubin fatbin ptx library-ptx)
modes=(native library replicated)
gflags=(--backend "$backend" --guest.kernels --guest.max-sessions 1)
[ "$workers" = on ] && gflags=(--backend "$backend" --guest.kernels --guest.workers on)
work=$(mktemp -d)
declare -A node_pid ms rc verified result
failures=0 printed=""
cleanup() {
	local pid
	[ -n "$printed" ] || { echo "== what ran before the script stopped"; table; }
	for pid in "${node_pid[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

now_us() { now=${EPOCHREALTIME/[.,]/}; }
fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# build compiles the kernels (three images each) and the programs.
build() {
	echo "== building: kernels with $nvcc for sm_$arch, programs with gcc against libcuda.so.1"
	mkdir -p "$work/lib" "$work/img" "$work/bin" "$work/out"
	cp "$B/libcuda.so.1" "$work/lib/"
	ln -s libcuda.so.1 "$work/lib/libcuda.so"
	local k p
	for k in "${kernels[@]}"; do # -fmad=false: no FMA anywhere, as the library's PTX
		"$nvcc" -fmad=false -cubin -arch="sm_$arch" -o "$work/img/$k.cubin" "$src/kernels/$k.cu"
		"$nvcc" -fmad=false -fatbin -gencode "arch=compute_$arch,code=[sm_$arch,compute_$arch]" -o "$work/img/$k.fatbin" "$src/kernels/$k.cu"
		"$nvcc" -fmad=false -ptx -arch="sm_$arch" -o "$work/img/$k.ptx" "$src/kernels/$k.cu"
	done
	for p in "${programs[@]}" isolation; do
		gcc -O2 -Wall -Werror -ffp-contract=off -o "$work/bin/$p" "$src/$p.c" -L"$work/lib" -lcuda
	done
}

# check_linking finds NVIDIA's libcuda.so.1 (nvdir) and checks which library
# the loader gives a program natively and through LD_LIBRARY_PATH.
check_linking() {
	local nvlib got
	nvlib=${NVIDIA_LIBCUDA:-$(ldconfig -p | awk '$1 == "libcuda.so.1" && /x86-64/ {print $NF; exit}')}
	[ -n "$nvlib" ] || { echo "NVIDIA's libcuda.so.1 is not in ldconfig's cache: set NVIDIA_LIBCUDA"; exit 1; }
	nvdir=$(dirname "$nvlib")
	for got in "$nvdir:$nvlib" "$work/lib:$work/lib/libcuda.so.1"; do
		local path=${got%%:*} want=${got#*:} have
		have=$(LD_LIBRARY_PATH=$path ldd "$work/bin/vadd" | awk '$1 == "libcuda.so.1" {print $3}')
		[ "$(readlink -f "$have")" = "$(readlink -f "$want")" ] || { echo "LD_LIBRARY_PATH=$path loads $have, not $want"; exit 1; }
		echo "LD_LIBRARY_PATH=$path: libcuda.so.1 is $want"
	done
}

# start_node NAME ARGS...: vgpuha ARGS in the background, logging to NAME.log.
start_node() {
	local name=$1
	shift
	"$B/vgpuha" "$@" 2>"$work/$name.log" &
	node_pid[$name]=$!
}

stop_node() {
	local pid=${node_pid[$1]:-}
	[ -n "$pid" ] || return 0
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	unset "node_pid[$1]"
}

# wait_for NAME TEST...: waits up to 10 s for TEST to hold, else shows NAME's log.
wait_for() {
	local name=$1 _
	shift
	for _ in $(seq 200); do
		"$@" && return 0
		sleep 0.05
	done
	echo "node $name not ready ($*):"
	tail -20 "$work/$name.log"
	return 1
}

protected() { "$B/vgpuha" status --admin "unix://$work/admin.sock" --json 2>/dev/null | grep -Eq '"protected": *true'; }

# start_nodes (re)starts the unreplicated primary and the replicated pair.
start_nodes() {
	local n port=$((7300 + RANDOM % 500))
	for n in plain replicated standby; do stop_node "$n"; done
	rm -f "$work/plain.sock" "$work/repl.sock" "$work/admin.sock"
	start_node plain primary "${gflags[@]}" --guest-listen "unix://$work/plain.sock"
	start_node standby standby "${gflags[@]}" --listen "tcp://127.0.0.1:$port" --replicate.key-file "$work/key"
	start_node replicated primary "${gflags[@]}" --guest-listen "unix://$work/repl.sock" --mode commit \
		--replicate-to "tcp://127.0.0.1:$port" --replicate.key-file "$work/key" --admin-listen "unix://$work/admin.sock"
	wait_for plain test -S "$work/plain.sock"
	wait_for replicated test -S "$work/repl.sock"
	wait_for replicated protected
}

# verify_standby prints "match" when the standby's copy of every object the
# primary holds is identical (and there is at least one), else the report.
verify_standby() {
	local v
	v=$("$B/vgpuha" verify --admin "unix://$work/admin.sock" 2>&1) || true
	if [[ $v =~ ^verified\ [1-9][0-9]*\ objects.*match=true ]]; then echo match; else echo "MISMATCH: ${v//$'\n'/ }"; fi
}

# checkpointed OUT ERR CMD...: runs CMD (a program with VGTEST_CHECKPOINT=1)
# reading its stdout line by line: at "checkpoint" it verifies the standby
# (into ckpt_verify, the time spent into pause_us) and lets the program go
# on; the other lines go to OUT. Returns the program's exit status.
checkpointed() {
	local out=$1 err=$2 fin=$work/ckpt.in fout=$work/ckpt.out line t1 win rout pid status=0
	shift 2
	rm -f "$fin" "$fout"
	mkfifo "$fin" "$fout"
	"$@" <"$fin" >"$fout" 2>"$err" &
	pid=$!
	exec {win}>"$fin" {rout}<"$fout"
	pause_us=0 ckpt_verify="no checkpoint"
	: >"$out"
	while IFS= read -r -u "$rout" line; do
		if [ "$line" != checkpoint ]; then
			printf '%s\n' "$line" >>"$out"
			continue
		fi
		now_us && t1=$now
		ckpt_verify=$(verify_standby)
		now_us && pause_us=$((pause_us + now - t1))
		(printf '\n' >&"$win") 2>/dev/null || true
	done
	wait "$pid" || status=$?
	exec {win}>&- {rout}<&-
	return "$status"
}

# run MODE IMAGE PROGRAM: one run; stdout in out/PROGRAM.IMAGE.MODE, its wall
# time in ms[], exit status in rc[] (and the verify outcome in verified[]).
run() {
	local mode=$1 image=$2 p=$3 key=$3.$2.$1 dir=$work/img fmt=$2 env t0 status=0
	[ "$image" = library-ptx ] && dir=$root/kernels/ptx fmt=ptx
	case $mode in
	native) env=(VGTEST_NATIVE=1 "LD_LIBRARY_PATH=$nvdir" "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}") ;; # the one GPU the nodes use, as the library shows one
	library) env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/plain.sock") ;;
	replicated) env=("LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/repl.sock" VGTEST_CHECKPOINT=1) ;;
	esac
	local cmd=(env "VGTEST_IMAGE=$fmt" "${env[@]}" timeout 120 "$work/bin/$p" "$dir")
	pause_us=0
	now_us && t0=$now
	if [ "$mode" = replicated ]; then
		checkpointed "$work/out/$key" "$work/out/$key.err" "${cmd[@]}" || status=$?
		verified[$p.$image]=$ckpt_verify
	else
		"${cmd[@]}" >"$work/out/$key" 2>"$work/out/$key.err" || status=$?
	fi
	now_us
	ms[$key]=$(((now - t0 - pause_us) / 1000))
	rc[$key]=$status
	if [ "$status" != 0 ]; then
		echo "$p ($image, $mode) exited $status:"
		tail -5 "$work/out/$key.err"
		[ "$mode" = native ] || start_nodes # a session left detached would hold the primary's one slot
	fi
}

# judge PROGRAM IMAGE: the outcome of its three runs into result[].
judge() {
	local p=$1 image=$2 base=$work/out/$1.$2 m why=()
	for m in "${modes[@]}"; do
		[ "${rc[$p.$image.$m]}" = 0 ] || why+=("exit ${rc[$p.$image.$m]} ($m)")
	done
	for m in library replicated; do
		if ! cmp -s "$base.native" "$base.$m"; then
			echo "$p ($image): stdout differs, native against $m:"
			diff -u "$base.native" "$base.$m" | head -40 || true
			why+=("stdout differs ($m)")
		fi
	done
	[ "${verified[$p.$image]}" = match ] || why+=("verify: ${verified[$p.$image]}")
	result[$p.$image]=same
	if [ ${#why[@]} != 0 ]; then
		result[$p.$image]=$(IFS=';' && echo "${why[*]}")
		fail "$p ($image): ${result[$p.$image]}"
	fi
}

# isolation IMAGE: guest B (its own primary) holds a secret; guest A (another
# primary, same GPU) runs its own kernel on B's address. A must fail or read
# something else, B's secret must be intact, and A's primary must still
# serve the next guest.
isolation() {
	local image=$1 fin=$work/hold.in fout=$work/hold.out held line addr peek pstatus=0 hold="" win rout pid next
	local genv=(env "VGTEST_IMAGE=$image" "LD_LIBRARY_PATH=$work/lib") bsock=$work/iso-b.sock
	rm -f "$work/iso-a.sock" "$work/iso-b.sock"
	start_node iso-a primary "${gflags[@]}" --guest-listen "unix://$work/iso-a.sock"
	wait_for iso-a test -S "$work/iso-a.sock"
	if [ "$workers" = on ]; then
		bsock=$work/iso-a.sock # both guests on one primary, each in its own worker
	else
		start_node iso-b primary "${gflags[@]}" --guest-listen "unix://$work/iso-b.sock"
		wait_for iso-b test -S "$work/iso-b.sock"
	fi
	rm -f "$fin" "$fout"
	mkfifo "$fin" "$fout"
	"${genv[@]}" "VGPUHA_ENDPOINT=unix://$bsock" timeout 120 "$work/bin/isolation" "$work/img" hold <"$fin" >"$fout" 2>"$work/hold.err" &
	pid=$!
	exec {win}>"$fin" {rout}<"$fout"
	IFS= read -r -u "$rout" held || held=""
	addr=${held#holding }
	[[ $addr =~ ^0x[0-9a-f]+$ ]] || addr=0 # B did not start: the checks below say so
	peek=$("${genv[@]}" "VGPUHA_ENDPOINT=unix://$work/iso-a.sock" timeout 120 "$work/bin/isolation" "$work/img" peek "$addr" 2>"$work/peek.err") || pstatus=$?
	(printf '\n' >&"$win") 2>/dev/null || true
	while IFS= read -r -u "$rout" line; do hold+=$line; done
	wait "$pid" || hold+=" (exit $?)"
	exec {win}>&- {rout}<&-
	# A kernel fault ends a CUDA process's state for good (a "sticky"
	# error): A's primary must then refuse new guests saying it needs a
	# restart, and a restarted one must serve.
	next=no
	if env "LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/iso-a.sock" timeout 120 "$work/bin/vadd" "$work/img" >/dev/null 2>"$work/next.err"; then
		next=yes
	elif grep -q "restart the node" "$work/next.err"; then
		stop_node iso-a
		rm -f "$work/iso-a.sock"
		start_node iso-a primary "${gflags[@]}" --guest-listen "unix://$work/iso-a.sock"
		wait_for iso-a test -S "$work/iso-a.sock"
		env "LD_LIBRARY_PATH=$work/lib" "VGPUHA_ENDPOINT=unix://$work/iso-a.sock" timeout 120 "$work/bin/vadd" "$work/img" >/dev/null 2>&1 &&
			next="yes, after the restart it asked for"
	fi
	echo "isolation ($image): B ${held:-did not start}; A: ${peek:-no output} (exit $pstatus); B after: ${hold:-no output}; A's primary serves the next guest: $next"
	if [ "$pstatus" != 0 ] || ! [[ $peek =~ ^peek\ (failed|read) ]]; then
		fail "isolation ($image): the peek did not run or leaked: $peek"
		tail -3 "$work/peek.err"
	fi
	[ "$hold" = "hold ok: secret intact" ] || { fail "isolation ($image): B's secret: $hold"; tail -3 "$work/hold.err"; }
	[ "$next" != no ] || { fail "isolation ($image): A's primary no longer serves guests"; cat "$work/next.err"; tail -5 "$work/iso-a.log"; }
	[ "$workers" != on ] || [ "$next" = yes ] || fail "isolation ($image): with workers, A's fault needed a restart of the node"
	stop_node iso-a
	stop_node iso-b
}

table() {
	local p image
	printed=1
	echo "| program | image | native ms | library ms | replicated ms | result |"
	echo "|---|---|---:|---:|---:|---|"
	for image in "${images[@]}"; do
		for p in "${programs[@]}"; do
			[ -n "${result[$p.$image]:-}" ] || continue
			echo "| $p | $image | ${ms[$p.$image.native]} | ${ms[$p.$image.library]} | ${ms[$p.$image.replicated]} | ${result[$p.$image]} |"
		done
	done
}

build
check_linking
(umask 077 && head -c 32 /dev/urandom | base64 >"$work/key") # the nodes refuse a key others can read
start_nodes
echo "== every program × image: native, through the library, replicated (verify at the checkpoint)"
for image in "${images[@]}"; do
	for p in "${programs[@]}"; do
		for m in "${modes[@]}"; do run "$m" "$image" "$p"; done
		judge "$p" "$image"
	done
done
echo "== isolation: a guest's own kernel reads another guest's memory"
for n in plain replicated standby; do stop_node "$n"; done
for image in cubin fatbin ptx; do isolation "$image"; done
echo "== wall time of one run each (ms; sm_$arch; replicated: commit mode, verify pause left out)"
table
if [ "$failures" != 0 ]; then
	echo "gpu-libcuda: $failures failures"
	exit 1
fi
echo "gpu-libcuda: every program printed the same natively, through the library and replicated; isolation held"
