// histogram as kernels/ptx/histogram.ptx: bins[data[i] % nbins] += 1
// for i < n, with global integer atomics; nothing when nbins is 0.
extern "C" __global__ void histogram(const unsigned int *data, unsigned int n, unsigned int *bins, unsigned int nbins) {
	if (nbins == 0) return;
	unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) atomicAdd(&bins[data[i] % nbins], 1u);
}
