#!/usr/bin/env bash
# GPU tests and benchmarks, for a machine with an NVIDIA GPU. Takes a
# directory holding prebuilt `vgpuha` and `cuda.test` (make gpu-test builds
# them into bin/), so it also runs where Go is not installed.
set -euo pipefail
B=$(cd "${1:-bin}" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
echo "== CUDA backend unit tests"
"$B/cuda.test" -test.v -test.count=1

echo "== primary and standby as two processes on the GPU, identical addresses"
head -c 32 /dev/urandom | base64 > "$work/key"
"$B/vgpuha" standby --backend cuda --listen tcp://127.0.0.1:7171 --replicate.key-file "$work/key" --admin-listen 127.0.0.1:9471 2>"$work/standby.log" &
sleep 1
"$B/vgpuha" primary --backend cuda --guest-listen "unix://$work/g.sock" --replicate-to tcp://127.0.0.1:7171 \
	--replicate.key-file "$work/key" --admin-listen 127.0.0.1:9470 --mode commit 2>"$work/primary.log" &
for i in $(seq 100); do [ -S "$work/g.sock" ] && break; sleep 0.1; done
for g in 1 2; do
	"$B/vgpuha" guest --endpoint "unix://$work/g.sock" --workload all --hold --name "g$g" 2>"$work/guest$g.log" &
done
for g in 1 2; do
	for i in $(seq 300); do grep -q holding "$work/guest$g.log" && break; sleep 0.1; done
	grep -q holding "$work/guest$g.log" || { cat "$work/guest$g.log" "$work/primary.log"; exit 1; }
done
"$B/vgpuha" verify --admin 127.0.0.1:9470
"$B/vgpuha" verify --admin 127.0.0.1:9470 --json; echo
echo "standby sessions (translated must be absent: identical addresses):"
curl -s 127.0.0.1:9471/status | grep -E '"(id|window_base|translated|unsafe)"' || true
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true

echo "== failover drill with both nodes on the GPU"
"$B/vgpuha" drill --backend cuda --iterations 8

echo "== benchmarks"
"$B/vgpuha" bench pv --backend cuda
"$B/vgpuha" bench replicate --backend cuda
"$B/vgpuha" bench apply --backend cuda
