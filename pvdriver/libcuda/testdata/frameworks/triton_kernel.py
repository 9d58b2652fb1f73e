# A Triton kernel (softmax over rows) launched directly.
import torch
import triton
import triton.language as tl
from common import STEPS, Steps, torch_setup


@triton.jit
def softmax_kernel(out, inp, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(inp + row * stride + cols, mask=cols < n, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out + row * stride + cols, e / tl.sum(e, axis=0), mask=cols < n)


dev = torch_setup()
x = torch.randn(1024, 1000, device=dev)
out = torch.empty_like(x)
s = Steps()
for step in range(STEPS):
    softmax_kernel[(1024,)](out, x, x.stride(0), 1000, BLOCK=1024)
    x = x + out
    s.tick(step, lambda: out.double().sum().item() + x.double().abs().sum().item() * 1e-6)
s.done(torch.cuda.synchronize)
