// vadd as kernels/ptx/vadd.ptx: c[i] = a[i] + b[i] for i < n.
// Compiled by nvcc on the GPU machine (scripts/gpu-libcuda.sh) into PTX,
// cubin and fatbin; the _rn intrinsics keep nvcc from fusing or reordering,
// so every image gives the library PTX's results bit for bit.
extern "C" __global__ void vadd(const float *a, const float *b, float *c, unsigned int n) {
	unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) c[i] = __fadd_rn(a[i], b[i]);
}
