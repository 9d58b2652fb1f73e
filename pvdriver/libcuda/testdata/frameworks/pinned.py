# Pinned host memory: pin_memory(), is_pinned(), non_blocking copies both ways.
import torch
from common import STEPS, Steps, torch_setup

dev = torch_setup()
h = torch.randn(1 << 20).pin_memory()
print("is_pinned", h.is_pinned(), flush=True)
back = torch.empty(1 << 20).pin_memory()
s = Steps()
for step in range(STEPS):
    d = h.to(dev, non_blocking=True) * 2 + step
    back.copy_(d, non_blocking=True)
    torch.cuda.synchronize()
    s.tick(step, lambda: back.double().sum().item())
s.done(torch.cuda.synchronize)
