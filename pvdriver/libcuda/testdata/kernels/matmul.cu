// matmul with the parameters and results of kernels/ptx/matmul.ptx
// (C = A * B, n x n, row-major; thread (x, y) of the grid computes C[y][x]),
// tiled through shared memory: each 16x16 block stages tiles of A and B.
// Each element sums its products in the PTX's order (k = 0 .. n-1, rounded
// after each multiply and each add), so the results are the same bit for
// bit. The tiling needs 16x16 blocks, as matmul.c launches: another block
// shape traps (a failed launch, never a wrong result).
#define TILE 16

extern "C" __global__ void matmul(const float *a, const float *b, float *c, unsigned int n) {
	__shared__ float ta[TILE][TILE], tb[TILE][TILE];
	if (blockDim.x != TILE || blockDim.y != TILE || blockDim.z != 1) __trap();
	unsigned int tx = threadIdx.x, ty = threadIdx.y;
	unsigned int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
	float sum = 0.0f;
	for (unsigned int t = 0; t < n; t += TILE) {
		ta[ty][tx] = row < n && t + tx < n ? a[row * n + t + tx] : 0.0f;
		tb[ty][tx] = col < n && t + ty < n ? b[(t + ty) * n + col] : 0.0f;
		__syncthreads();
		for (unsigned int k = 0; k < TILE && t + k < n; k++) sum = __fadd_rn(sum, __fmul_rn(ta[ty][k], tb[k][tx]));
		__syncthreads();
	}
	if (row < n && col < n) c[row * n + col] = sum;
}
