# PyTorch, unchanged, through whatever libcuda.so.1 the loader finds: a
# tensor suite and a seeded training loop. Prints values rounded so that
# the same computation prints the same text. Usage:
#   python3 torch_suite.py [steps]   (VGTEST_DETERMINISTIC=1: deterministic mode;
#   VGTEST_EVERY=N: the loss every N steps, default 20)
import os, sys, time
t0 = time.time()
import torch
import torch.nn as nn
import torch.nn.functional as F

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
if os.environ.get("VGTEST_DETERMINISTIC") == "1":
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
dev = torch.device("cuda")
print("devices", torch.cuda.device_count(), torch.cuda.get_device_capability(0), flush=True)

def show(name, t):
    print(f"{name}: {t.double().sum().item():.6e} {t.flatten()[0].item():.6e}", flush=True)

torch.manual_seed(1234)
a = torch.randn(257, 129, device=dev)
b = torch.randn(129, 65, device=dev)
show("randn", a)
show("add", a + 1.5 * a)
show("exp", torch.exp(a.clamp(-3, 3)))
show("sum-rows", a.sum(dim=1))
show("max", a.max(dim=0).values)
show("matmul", a @ b)
show("softmax", F.softmax(a, dim=1))
idx = torch.arange(0, 257, 3, device=dev)
show("index", a[idx])
x = torch.randn(4, 3, 32, 32, device=dev)
w = torch.randn(8, 3, 3, 3, device=dev)
show("conv2d", F.conv2d(x, w, padding=1))
show("cumsum", torch.cumsum(a, dim=1))
show("sort", torch.sort(a[0]).values)
print(f"setup {time.time() - t0:.3f} s", file=sys.stderr, flush=True)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))

torch.manual_seed(7)
net = Net().to(dev)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
data = torch.randn(64, 3, 32, 32, device=dev)
labels = torch.randint(0, 10, (64,), device=dev)
every = int(os.environ.get("VGTEST_EVERY", "20"))  # print the loss every this many steps
torch.cuda.synchronize()
t1 = time.time()
first = None
durations = []
for step in range(steps):
    s0 = time.time()
    opt.zero_grad()
    loss = F.cross_entropy(net(data), labels)
    loss.backward()
    opt.step()
    if step == 0:
        torch.cuda.synchronize()
        first = time.time() - t0
    if step % every == 0 or step == steps - 1:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    durations.append(time.time() - s0)
torch.cuda.synchronize()
el = time.time() - t1
durations.sort()
print(f"first step after {first:.3f} s; {steps / el:.1f} steps/s; step median {durations[len(durations) // 2] * 1e3:.2f} ms, "
      f"longest {durations[-1] * 1e3:.1f} ms", file=sys.stderr)
if os.environ.get("VGTEST_CHECKPOINT"):
    print("checkpoint", flush=True)  # a test verifies the standby's replica here
    sys.stdin.readline()
print("torch_suite ok", flush=True)
