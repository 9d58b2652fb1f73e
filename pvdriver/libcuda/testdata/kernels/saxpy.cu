// saxpy as kernels/ptx/saxpy.ptx: y[i] = a * x[i] + y[i] for i < n,
// rounded after the multiply and after the add (mul.rn, add.rn: no FMA).
extern "C" __global__ void saxpy(const float *x, float *y, float a, unsigned int n) {
	unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}
