#!/usr/bin/env bash
# Issue 45 on a host of two GPUs: the guest's NVML (nvidia-smi, pynvml,
# PyTorch) against a replicated pair, the primary serving GPU 0, its
# standby GPU 1 (GPU 0 too on a one-GPU host), guests started without
# CUDA_VISIBLE_DEVICES. Takes a directory holding prebuilt vgpuha,
# libcuda.so.1 and libnvidia-ml.so.1 (make build libcuda); needs the real
# nvidia-smi, python3 with torch and pynvml. Writes every output to LOGS
# (default a temporary directory) and prints a line per check.
#
# Checks: PyTorch counts the library's one device and trains; pynvml names
# it and its memory; nvidia-smi, -L, -q and a --query-gpu line exit 0
# through the guest's NVML while a guest holds 1 GiB, before and after a
# SIGKILL of the primary, with the same UUID and the guest's memory both
# times; the guest holding the memory carries on after the kill.
set -uo pipefail
B=$(cd "${1:-bin}" && pwd)
. "$(dirname "$0")/gpu-pair.sh" # start_pair
logs=${LOGS:-$(mktemp -d)}
mkdir -p "$logs/lib"
cp "$B/libcuda.so.1" "$B/libnvidia-ml.so.1" "$logs/lib/"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
failures=0
check() { # NAME CONDITION-EXIT-STATUS
	if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT

nvidia-smi -L >"$logs/host-L.txt"
start_pair "$logs" --backend cuda --guest.kernels --guest.max-sessions 1 || exit 1
export LD_LIBRARY_PATH=$logs/lib VGPUHA_ENDPOINT=unix://$logs/p.sock VGPUHA_FAILOVER=unix://$logs/s.sock
unset CUDA_VISIBLE_DEVICES

cat >"$logs/train.py" <<'PY'
import torch, pynvml
print("device_count", torch.cuda.device_count(), flush=True)
x = torch.randn(512, 512, device="cuda"); w = torch.randn(512, 512, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-3)
for i in range(50):
    loss = (x @ w).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
print("loss", loss.item(), flush=True)
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); m = pynvml.nvmlDeviceGetMemoryInfo(h)
print("pynvml", pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h), m.used, m.total, flush=True)
PY
timeout 120 python3 "$logs/train.py" >"$logs/train.txt" 2>"$logs/train.err"
check "PyTorch without CUDA_VISIBLE_DEVICES counts 1 device and trains" \
	"$(grep -q '^device_count 1$' "$logs/train.txt" && grep -q '^loss ' "$logs/train.txt"; echo $?)"
check "pynvml counts 1 device and names it and its memory" "$(grep -Eq '^pynvml 1 .+ [0-9]+ [1-9][0-9]*$' "$logs/train.txt"; echo $?)"

cat >"$logs/hold.py" <<'PY'
import torch, os, sys, time
x = torch.ones(256 << 20, device="cuda")  # 1 GiB
print("holding", x.sum().item(), flush=True); open(sys.argv[1], "w").close()
while not os.path.exists(sys.argv[2]): time.sleep(0.05)
x.add_(1); print("after the kill", x.sum().item(), flush=True); open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[4]): time.sleep(0.05)
PY
VGPUHA_STATS=1 timeout 300 python3 "$logs/hold.py" "$logs/held" "$logs/killed" "$logs/moved" "$logs/done" >"$logs/hold.txt" 2>"$logs/hold.err" &
holder=$!
for _ in $(seq 600); do [ -e "$logs/held" ] && break; sleep 0.1; done

smi() { # TAG: the four commands, through the guest's NVML
	local i=0 c
	for c in "nvidia-smi" "nvidia-smi -L" "nvidia-smi -q" \
		"nvidia-smi --query-gpu=name,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"; do
		i=$((i + 1))
		VGPUHA_DEBUG=1 timeout 30 $c >"$logs/$1-$i.txt" 2>"$logs/$1-$i.err"
		check "$1: $c exits 0" $?
	done
	check "$1: the query shows the guest's 1 GiB" "$(awk -F', ' '{exit !($3 >= 1024)}' "$logs/$1-4.txt"; echo $?)"
}
smi before
kill -9 "$primary"
touch "$logs/killed"
for _ in $(seq 300); do [ -e "$logs/moved" ] && break; sleep 0.1; done
check "the guest holding 1 GiB carries on after the SIGKILL" "$(grep -q '^after the kill 536870912' "$logs/hold.txt"; echo $?)"
smi after
check "nvidia-smi -L names the same device (UUID) before and after" "$(cmp -s "$logs/before-2.txt" "$logs/after-2.txt"; echo $?)"
touch "$logs/done"
for _ in $(seq 300); do kill -0 "$holder" 2>/dev/null || break; sleep 0.1; done
kill -9 "$holder" 2>/dev/null
check "the holder reports its failover at exit" "$(grep -q '^failover 1: ' "$logs/hold.err"; echo $?)"
grep -h '^failover 1: ' "$logs/hold.err"
echo "logs: $logs"
[ "$failures" = 0 ] && echo PASS || { echo "FAIL: $failures checks"; exit 1; }
