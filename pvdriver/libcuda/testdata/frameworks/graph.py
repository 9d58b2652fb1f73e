# A training step captured by hand into a CUDA graph, then replayed.
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import STEPS, Steps, torch_setup

dev = torch_setup()
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256, device=dev), torch.randint(0, 10, (128,), device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm up on a side stream, as PyTorch's docs do
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
s = Steps()
for step in range(STEPS):
    g.replay()
    s.tick(step, loss.item)
s.done(torch.cuda.synchronize)
