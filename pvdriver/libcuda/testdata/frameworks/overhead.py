# What one PyTorch operation costs the host, natively or through the
# library: each line is microseconds per call, averaged over a loop that
# queues N calls and then synchronizes once (issue 43: where a training
# step's time goes between the program and the GPU). A plain element-wise
# op is one launch; a small convolution is cuDNN's driver calls and launch.
import sys, time
import torch
import torch.nn.functional as F

dev = torch.device("cuda")
scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0


def bench(name, fn, n):
    n = max(1, int(n * scale))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    print(f"{name:<14} {(time.perf_counter() - t) / n * 1e6:8.2f} us/call", flush=True)


x = torch.zeros(1024, device=dev)
w = torch.randn(16, 16, 3, 3, device=dev)
inp = torch.randn(1, 16, 8, 8, device=dev)
a = torch.randn(64, 64, device=dev)
bench("empty", lambda: torch.empty(1024, device=dev), 20000)
bench("add_", lambda: x.add_(1), 20000)
bench("zero_", lambda: x.zero_(), 20000)
bench("matmul", lambda: a @ a, 10000)
bench("conv2d", lambda: F.conv2d(inp, w, padding=1), 5000)
with torch.autocast("cuda", torch.float16):
    bench("conv2d_fp16", lambda: F.conv2d(inp, w, padding=1), 5000)
    bench("matmul_fp16", lambda: a @ a, 10000)
bench("item", lambda: x[0].item(), 2000)
