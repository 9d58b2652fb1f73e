# CuPy arrays, cuBLAS through CuPy, and an NVRTC-compiled RawKernel.
import cupy as cp
from common import STEPS, Steps

axpy = cp.RawKernel(r'''
extern "C" __global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}''', "axpy")
cp.random.seed(1)
n = 1 << 20
x, y = cp.random.rand(n, dtype=cp.float32), cp.zeros(n, dtype=cp.float32)
m = cp.random.rand(256, 256, dtype=cp.float32)
s = Steps()
for step in range(STEPS):
    axpy(((n + 255) // 256,), (256,), (cp.float32(0.5), x, y, cp.int32(n)))
    m = (m @ m) / 256.0
    s.tick(step, lambda: float(y.sum() + m.sum()))
s.done(cp.cuda.Device().synchronize)
