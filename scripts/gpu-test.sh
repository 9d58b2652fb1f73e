#!/usr/bin/env bash
# GPU tests and benchmarks, for a machine with an NVIDIA GPU. Takes a
# directory holding prebuilt `vgpuha` (the agent), `vgpuha-lab` (guests,
# drills, benchmarks) and `cuda.test` (make gpu-test builds
# them into bin/, and libcuda.so.1 for the last step), so it also runs where
# Go is not installed.
set -euo pipefail
B=$(cd "${1:-bin}" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
echo "== CUDA backend unit tests"
"$B/cuda.test" -test.v -test.count=1

echo "== primary and standby as two processes on the GPU, identical addresses"
(umask 077 && head -c 32 /dev/urandom | base64 > "$work/key") # the nodes refuse a key others can read
head -c 32 /dev/urandom | base64 > "$work/admin-token" # POSTs and /status details over tcp need it
tok=(--admin.token-file "$work/admin-token")
"$B/vgpuha" standby --backend cuda --listen tcp://127.0.0.1:7171 --replicate.key-file "$work/key" --admin-listen 127.0.0.1:9471 "${tok[@]}" 2>"$work/standby.log" &
sleep 1
"$B/vgpuha" primary --backend cuda --guest-listen "unix://$work/g.sock" --replicate-to tcp://127.0.0.1:7171 \
	--replicate.key-file "$work/key" --admin-listen 127.0.0.1:9470 "${tok[@]}" --mode commit 2>"$work/primary.log" &
for i in $(seq 100); do [ -S "$work/g.sock" ] && break; sleep 0.1; done
for g in 1 2; do
	"$B/vgpuha-lab" guest --endpoint "unix://$work/g.sock" --workload vadd,saxpy,matmul,reduce_sum,histogram --hold --name "g$g" 2>"$work/guest$g.log" &
done
for g in 1 2; do
	for i in $(seq 300); do grep -q holding "$work/guest$g.log" && break; sleep 0.1; done
	grep -q holding "$work/guest$g.log" || { cat "$work/guest$g.log" "$work/primary.log"; exit 1; }
done
"$B/vgpuha" verify --admin 127.0.0.1:9470 "${tok[@]}"
"$B/vgpuha" verify --admin 127.0.0.1:9470 "${tok[@]}" --json; echo
echo "standby sessions (translated must be absent: identical addresses):"
curl -s -H "Authorization: Bearer $(cat "$work/admin-token")" 127.0.0.1:9471/status | grep -E '"(id|window_base|translated|unsafe)"' || true
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true

echo "== failover drill with both nodes on the GPU"
"$B/vgpuha-lab" drill --backend cuda --iterations 8

echo "== benchmarks"
"$B/vgpuha-lab" bench pv --backend cuda
"$B/vgpuha-lab" bench replicate --backend cuda
"$B/vgpuha-lab" bench apply --backend cuda

echo "== apertures on the GPU: guest writes traced in each mode, device copy checked, standby verified"
for mode in insn page uffd; do
	port=$((7180 + RANDOM % 100))
	"$B/vgpuha" standby --backend cuda --listen "tcp://127.0.0.1:$port" --replicate.key-file "$work/key" 2>"$work/standby-$mode.log" &
	sb=$!
	sleep 1
	"$B/vgpuha" primary --backend cuda --mmio "$mode" --guest-listen "unix://$work/m-$mode.sock" --replicate-to "tcp://127.0.0.1:$port" \
		--replicate.key-file "$work/key" --admin-listen 127.0.0.1:9472 "${tok[@]}" --mode commit 2>"$work/primary-$mode.log" &
	pr=$!
	for i in $(seq 100); do [ -S "$work/m-$mode.sock" ] && break; sleep 0.1; done
	# setsid: the tracer needs the guest in a process group of its own.
	setsid "$B/vgpuha-lab" mmio-guest --addr "unix://$work/m-$mode.sock" --workload doorbell --writes 20000 --hold >"$work/guest-$mode.json" 2>"$work/guest-$mode.log" &
	for i in $(seq 300); do grep -q holding "$work/guest-$mode.log" && break; sleep 0.1; done
	cat "$work/guest-$mode.json" "$work/guest-$mode.log"
	"$B/vgpuha" verify --admin 127.0.0.1:9472 "${tok[@]}" || { tail -20 "$work/primary-$mode.log"; }
	pkill -f "mmio-guest --addr unix://$work/m-$mode.sock" || true
	kill $pr $sb 2>/dev/null || true
	wait $pr $sb 2>/dev/null || true
done

echo "== MMIO tracing benchmark (tracer cost is CPU-side; software GPU)"
"$B/vgpuha-lab" bench mmio --plot "${PLOT_DIR:-$work}/mmio.png"

echo "== the guest libcuda.so.1: C programs with nvcc-built kernels natively, through the library, replicated; isolation"
if [ -f "$B/libcuda.so.1" ]; then
	"$(dirname "$0")/gpu-libcuda.sh" "$B"
	echo "== CUDA runtime programs, cuBLAS and PyTorch through the library (gpu-runtime.sh)"
	"$(dirname "$0")/gpu-runtime.sh" "$B"
else
	echo "skipped: no $B/libcuda.so.1 (make libcuda builds it)"
fi
