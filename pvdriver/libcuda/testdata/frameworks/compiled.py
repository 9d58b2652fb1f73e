# torch.compile of an MLP's training step; argv[2] is the mode (default,
# reduce-overhead: CUDA graphs).
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import STEPS, Steps, torch_setup

mode = sys.argv[2] if len(sys.argv) > 2 else "default"
dev = torch_setup()
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256, device=dev), torch.randint(0, 10, (128,), device=dev)


@torch.compile(mode=None if mode == "default" else mode)
def forward(x, y):
    return F.cross_entropy(model(x), y)


s = Steps()
for step in range(STEPS):
    loss = forward(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    s.tick(step, loss.item)
s.done(torch.cuda.synchronize)
