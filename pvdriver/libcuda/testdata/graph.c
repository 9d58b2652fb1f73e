/* CUDA graphs by stream capture: a capture on one stream, forked to a
 * second stream and joined back through events (a memset, an async copy
 * from host memory, saxpy launches, a device-to-device copy, a copy back
 * to host memory), instantiated and launched three times, each launch's
 * results checked; capture status while capturing; a synchronization
 * inside a capture invalidates it; the legacy stream cannot capture. */
#include "cudaapi.h"

enum { CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901 };
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult cuStreamIsCapturing(CUstream s, int *status);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec x, CUstream s);
CUresult cuGraphExecDestroy(CUgraphExec x);
CUresult cuGraphDestroy(CUgraph g);
CUresult cuGraphGetNodes(CUgraph g, void *nodes, size_t *n);

#define N 4096

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction saxpy;
	CUstream s, side;
	CUevent fork, join;
	CUgraph g, bad;
	CUgraphExec x;
	CUdeviceptr dx, dy, dz;
	float *hx, *out, alpha = 2.0f;
	unsigned int n = N;
	int status = -1;
	size_t nodes = 0;
	if (argc < 2) FAIL("usage: graph KERNELDIR");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "saxpy")));
	CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
	CHECK(cuMemAlloc(&dx, N * sizeof(float)));
	CHECK(cuMemAlloc(&dy, N * sizeof(float)));
	CHECK(cuMemAlloc(&dz, N * sizeof(float)));
	CHECK(cuMemAllocHost((void **)&hx, N * sizeof(float)));
	CHECK(cuMemAllocHost((void **)&out, N * sizeof(float)));
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
	CHECK(cuEventCreate(&fork, CU_EVENT_DEFAULT));
	CHECK(cuEventCreate(&join, CU_EVENT_DEFAULT));
	EXPECT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamBeginCapture_v2(NULL, 0));
	CHECK(cuMemsetD32(dy, 0, N));

	void *params[] = {&dx, &dy, &alpha, &n};
	CHECK(cuStreamBeginCapture_v2(s, 0));
	CHECK(cuStreamIsCapturing(s, &status));
	if (status != 1) FAIL("capturing stream: status %d, want 1 (active)", status);
	CHECK(cuMemcpyHtoDAsync(dx, hx, N * sizeof(float), s)); /* reads hx when the graph runs */
	CHECK(cuEventRecord(fork, s));
	CHECK(cuStreamWaitEvent(side, fork, 0)); /* side joins the capture */
	CHECK(cuMemsetD32Async(dz, 0x40400000, N, side)); /* 3.0f */
	CHECK(cuEventRecord(join, side));
	CHECK(cuStreamWaitEvent(s, join, 0));
	CHECK(cuLaunchKernel(saxpy, N / 128, 1, 1, 128, 1, 1, 0, s, params, NULL)); /* y += 2x */
	CHECK(cuMemcpyDtoDAsync_v2(dx, dz, N * sizeof(float), s)); /* x = 3 */
	CHECK(cuLaunchKernel(saxpy, N / 128, 1, 1, 128, 1, 1, 0, s, params, NULL)); /* y += 6 */
	CHECK(cuMemcpyDtoHAsync(out, dy, N * sizeof(float), s));
	CHECK(cuStreamEndCapture(s, &g));
	CHECK(cuStreamIsCapturing(s, &status));
	if (status != 0) FAIL("after the capture: status %d, want 0", status);
	CHECK(cuGraphGetNodes(g, NULL, &nodes));
	if (!native() && nodes != 6) FAIL("captured %zu nodes, want 6", nodes);
	CHECK(cuGraphInstantiateWithFlags(&x, g, 0));
	for (int k = 1; k <= 3; k++) {
		for (int i = 0; i < N; i++) hx[i] = (float)(i % 100) * k;
		CHECK(cuGraphLaunch(x, s));
		CHECK(cuStreamSynchronize(s));
		if (k == 2) checkpoint();
		for (int i = 0; i < N; i++) {
			float want = 0;
			for (int j = 1; j <= k; j++) want += 2.0f * (float)(i % 100) * j + 6.0f;
			if (out[i] != want) FAIL("launch %d: y[%d] = %g, want %g", k, i, out[i], want);
		}
	}
	/* A synchronization inside a capture ends it in error. */
	CHECK(cuStreamBeginCapture_v2(s, 0));
	EXPECT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(s));
	EXPECT(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &bad));
	CHECK(cuGraphExecDestroy(x));
	CHECK(cuGraphDestroy(g));
	CHECK(cuCtxDestroy(ctx));
	printf("graph ok\n");
	return 0;
}
