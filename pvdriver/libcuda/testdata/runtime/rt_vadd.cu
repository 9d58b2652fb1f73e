// A CUDA runtime program as nvcc builds it by default: kernels launched
// with <<<>>>, the runtime's own module registration, streams, events,
// pinned memory and async copies. Prints what it computed; the output must
// be the same natively and through vgpuha's libcuda.so.1.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "check.h"

__global__ void vadd(const float *a, const float *b, float *c, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) c[i] = a[i] + b[i];
}

__global__ void scale(float *x, float k, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] *= k;
}

int main() {
	const int n = 1 << 20;
	int count = 0;
	CHECK(cudaGetDeviceCount(&count));
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("devices %d, compute %d.%d, %d SMs\n", count, prop.major, prop.minor, prop.multiProcessorCount);
	float *ha, *hb, *hc;
	CHECK(cudaMallocHost(&ha, n * sizeof(float)));
	CHECK(cudaMallocHost(&hb, n * sizeof(float)));
	hc = (float *)malloc(n * sizeof(float));
	for (int i = 0; i < n; i++) ha[i] = (float)(i % 1000) * 0.5f, hb[i] = (float)(i % 77) * 0.25f;
	float *a, *b, *c;
	CHECK(cudaMalloc(&a, n * sizeof(float)));
	CHECK(cudaMalloc(&b, n * sizeof(float)));
	CHECK(cudaMalloc(&c, n * sizeof(float)));
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	cudaEvent_t start, stop;
	CHECK(cudaEventCreate(&start));
	CHECK(cudaEventCreate(&stop));
	CHECK(cudaMemcpyAsync(a, ha, n * sizeof(float), cudaMemcpyHostToDevice, s));
	CHECK(cudaMemcpyAsync(b, hb, n * sizeof(float), cudaMemcpyHostToDevice, s));
	CHECK(cudaMemsetAsync(c, 0, n * sizeof(float), s));
	CHECK(cudaEventRecord(start, s));
	for (int r = 0; r < 10; r++) {
		vadd<<<(n + 255) / 256, 256, 0, s>>>(a, b, c, n);
		scale<<<(n + 255) / 256, 256, 0, s>>>(c, 0.5f, n);
	}
	CHECK(cudaGetLastError());
	CHECK(cudaEventRecord(stop, s));
	CHECK(cudaMemcpyAsync(hc, c, n * sizeof(float), cudaMemcpyDeviceToHost, s));
	CHECK(cudaStreamSynchronize(s));
	float ms = 0;
	CHECK(cudaEventElapsedTime(&ms, start, stop));
	double sum = 0;
	int bad = 0;
	for (int i = 0; i < n; i++) {
		sum += hc[i];
		if (hc[i] != (ha[i] + hb[i]) * 0.5f) bad++;
	}
	printf("vadd: n=%d sum=%.6f mismatches=%d\n", n, sum, bad);
	checkpoint();
	CHECK(cudaFree(a));
	CHECK(cudaFree(b));
	CHECK(cudaFree(c));
	CHECK(cudaFreeHost(ha));
	CHECK(cudaFreeHost(hb));
	printf("rt_vadd %s\n", bad == 0 ? "ok" : "FAILED");
	return bad == 0 ? 0 : 1;
}
