// A module-scope device variable written by a kernel and read back with
// cudaMemcpyFromSymbol: the runtime asks the driver for the variable's
// address (cuModuleGetGlobal) when it loads the module.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "check.h"

__device__ int counter;
__constant__ int step;

__global__ void bump(int n) {
	if (blockIdx.x * blockDim.x + threadIdx.x < n) atomicAdd(&counter, step);
}

int main() {
	int k = 3, got = 0;
	CHECK(cudaMemcpyToSymbol(step, &k, sizeof k));
	bump<<<4, 64>>>(200);
	CHECK(cudaGetLastError());
	CHECK(cudaMemcpyFromSymbol(&got, counter, sizeof got));
	checkpoint();
	printf("counter=%d\n", got);
	printf("rt_global %s\n", got == 600 ? "ok" : "FAILED");
	return got == 600 ? 0 : 1;
}
