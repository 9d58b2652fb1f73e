// Thread-block clusters (sm_90): each block of a cluster of two writes its
// rank into its shared memory, the cluster synchronises, and each block
// reads its partner's shared memory (distributed shared memory). Launched
// with cudaLaunchKernelEx and a cluster-dimension attribute, and with a
// 100 KiB dynamic shared memory opt-in, so a driver that drops either
// fails: without the cluster, the partner's memory cannot be mapped;
// without the opt-in, the launch is refused.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
#include "check.h"

namespace cg = cooperative_groups;

__global__ void swap_ranks(int *out) {
	extern __shared__ int mine[];
	cg::cluster_group cluster = cg::this_cluster();
	unsigned rank = cluster.block_rank();
	if (threadIdx.x == 0) mine[0] = (int)(blockIdx.x * 1000 + rank);
	cluster.sync();
	int *theirs = cluster.map_shared_rank(mine, rank ^ 1);
	if (threadIdx.x == 0) out[blockIdx.x] = theirs[0];
	cluster.sync(); // the partner's memory must stay until it was read
}

int main() {
	const int blocks = 8, shared = 100 << 10;
	int *d_out, got[blocks];
	CHECK(cudaMalloc(&d_out, sizeof got));
	CHECK(cudaFuncSetAttribute(swap_ranks, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = dim3(blocks);
	cfg.blockDim = dim3(32);
	cfg.dynamicSmemBytes = shared;
	cudaLaunchAttribute attr;
	attr.id = cudaLaunchAttributeClusterDimension;
	attr.val.clusterDim.x = 2;
	attr.val.clusterDim.y = 1;
	attr.val.clusterDim.z = 1;
	cfg.attrs = &attr;
	cfg.numAttrs = 1;
	CHECK(cudaLaunchKernelEx(&cfg, swap_ranks, d_out));
	CHECK(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost));
	checkpoint();
	int ok = 1;
	for (int b = 0; b < blocks; b++) {
		int partner = b ^ 1, want = partner * 1000 + (partner % 2);
		printf("block %d read %d\n", b, got[b]);
		if (got[b] != want) ok = 0;
	}
	printf("rt_cluster %s\n", ok ? "ok" : "FAILED");
	return ok ? 0 : 1;
}
