// Addresses of module variables kept in device memory: a kernel stores
// &table[5] in a cudaMalloc'd slot and in a module variable of its own, the
// host stores the address cudaGetSymbolAddress gave it, and kernels follow
// all three before and after the checkpoint (where a failover test SIGKILLs
// the primary): a stored address must keep naming the variable on the
// promoted standby, whose driver loaded the module itself.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "check.h"

__device__ int table[64];
__device__ int *kept; // an address of table, held in a module variable

__global__ void fill(int **slot, int salt) {
	int i = threadIdx.x;
	table[i] = i * 7 + salt;
	if (i == 0) {
		*slot = &table[5];
		kept = &table[9];
	}
}

// follow reads through every stored address: out[0] through the slot the
// kernel wrote, out[1] through the module variable, out[2] through the
// address the host stored.
__global__ void follow(int **slot, int **host_slot, int *out) {
	out[0] = **slot;
	out[1] = *kept;
	out[2] = **host_slot;
}

static void report(const char *when, int **slot, int **host_slot, int *out, int salt) {
	int got[3];
	follow<<<1, 1>>>(slot, host_slot, out);
	CHECK(cudaGetLastError());
	CHECK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
	int ok = got[0] == 35 + salt && got[1] == 63 + salt && got[2] == 14 + salt;
	printf("%s: slot %d, kept %d, host-stored %d: %s\n", when, got[0], got[1], got[2], ok ? "ok" : "WRONG");
	if (!ok) exit(1);
}

int main() {
	int **slot, **host_slot, *out, *addr;
	CHECK(cudaMalloc(&slot, sizeof *slot));
	CHECK(cudaMalloc(&host_slot, sizeof *host_slot));
	CHECK(cudaMalloc(&out, 3 * sizeof *out));
	fill<<<1, 64>>>(slot, 0);
	CHECK(cudaGetLastError());
	CHECK(cudaGetSymbolAddress((void **)&addr, table));
	addr += 2;
	CHECK(cudaMemcpy(host_slot, &addr, sizeof addr, cudaMemcpyHostToDevice));
	report("before", slot, host_slot, out, 0);
	checkpoint();
	report("after", slot, host_slot, out, 0);
	fill<<<1, 64>>>(slot, 1000); // the variable written again on this node
	CHECK(cudaGetLastError());
	report("rewritten", slot, host_slot, out, 1000);
	printf("rt_stored ok\n");
	return 0;
}
