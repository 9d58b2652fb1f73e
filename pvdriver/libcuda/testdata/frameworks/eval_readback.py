# An evaluation loop that reads its outputs back (issue 43's link bytes): an
# image-to-image convolutional net in eval mode; each step copies a batch
# from the host, runs the net, and copies its output, as large as the
# batch, back to the host. Prints the bytes a step writes and reads.
import sys
import torch
from torch import nn
from common import STEPS, Steps, torch_setup

dev = torch_setup()
net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                    nn.Conv2d(32, 3, 3, padding=1)).to(dev).eval()
gen = torch.Generator().manual_seed(1)
batches = [torch.randn(16, 3, 128, 128, generator=gen) for _ in range(4)]  # on the host
s = Steps()
with torch.no_grad():
    for step in range(STEPS):
        x = batches[step % len(batches)].to(dev)
        out = net(x).cpu()
        s.tick(step, lambda: float(out.mean()))  # from the host copy: no other read
n = batches[0].numel() * batches[0].element_size()
print(f"a step writes {n} bytes of input and reads {out.numel() * out.element_size()} bytes of output", file=sys.stderr)
s.done(torch.cuda.synchronize)
