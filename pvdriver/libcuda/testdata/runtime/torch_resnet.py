# A small ResNet (residual blocks, batch norm, adaptive average pooling),
# trained in PyTorch's default, non-deterministic mode: its pooling and
# convolution backward passes use floating-point atomics, so two runs of
# the same step differ in their last bits. Through vgpuha's library,
# replicated, the standby's replay of such a kernel differs from the
# primary's in the same way; the test verifies, repairs and verifies the
# replica at the checkpoint. Usage: python3 torch_resnet.py [steps]
import os, sys, time
t0 = time.time()
import torch
import torch.nn as nn
import torch.nn.functional as F

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
dev = torch.device("cuda")

class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))

class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.layers = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 128, 1))
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(128, 10)
    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))

torch.manual_seed(11)
net = ResNet().to(dev)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
data = torch.randn(128, 3, 32, 32, device=dev)
labels = torch.randint(0, 10, (128,), device=dev)
checkpoint_at = steps // 2
t1 = time.time()
for step in range(steps):
    opt.zero_grad()
    loss = F.cross_entropy(net(data), labels)
    loss.backward()
    opt.step()
    if step % 10 == 0 or step == steps - 1:
        # Non-deterministic: only a coarse rounding is the same run to run.
        print(f"step {step} loss {loss.item():.2f}", flush=True)
    if step == checkpoint_at and os.environ.get("VGTEST_CHECKPOINT"):
        torch.cuda.synchronize()
        print("checkpoint", flush=True)  # the test verifies (and repairs) the replica here
        sys.stdin.readline()
torch.cuda.synchronize()
print(f"{steps / (time.time() - t1):.1f} steps/s", file=sys.stderr)
print("torch_resnet ok", flush=True)
