/* A pipeline over four streams: page-locked host buffers, async copies and
 * memsets, saxpy per chunk, events between streams, elapsed times; a fatbin
 * image is loaded by cuModuleLoadFatBinary. */
#include "cudaapi.h"

#define STREAMS 4
#define CHUNK 4096

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction saxpy;
	CUstream s[STREAMS];
	CUevent start, done[STREAMS];
	CUdeviceptr x, y, tmp;
	float *hx, *hy, *out;
	float alpha = 2.0f;
	unsigned int n = CHUNK;
	if (argc < 2) FAIL("usage: pipeline KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	if (strcmp(image_ext(), "fatbin") == 0) CHECK(cuModuleLoadFatBinary(&mod, load_image(argv[1], "saxpy")));
	else CHECK(cuModuleLoadData(&mod, load_image(argv[1], "saxpy")));
	CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
	CHECK(cuMemAllocHost((void **)&hx, STREAMS * CHUNK * sizeof(float)));
	CHECK(cuMemHostAlloc((void **)&hy, STREAMS * CHUNK * sizeof(float), 0));
	CHECK(cuMemAllocHost((void **)&out, STREAMS * CHUNK * sizeof(float)));
	for (int i = 0; i < STREAMS * CHUNK; i++) { hx[i] = (float)i; hy[i] = (float)(i % 7); }
	CHECK(cuMemAlloc(&x, STREAMS * CHUNK * sizeof(float)));
	CHECK(cuMemAlloc(&y, STREAMS * CHUNK * sizeof(float)));
	CHECK(cuMemAlloc(&tmp, 64));
	CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
	CHECK(cuEventRecord(start, NULL));
	for (int k = 0; k < STREAMS; k++) {
		CHECK(cuStreamCreate(&s[k], k % 2 ? CU_STREAM_NON_BLOCKING : 0));
		CHECK(cuEventCreate(&done[k], CU_EVENT_DEFAULT));
	}
	for (int k = 0; k < STREAMS; k++) {
		CUdeviceptr xk = x + k * CHUNK * sizeof(float), yk = y + k * CHUNK * sizeof(float);
		void *params[] = {&xk, &yk, &alpha, &n};
		CHECK(cuMemcpyHtoDAsync(xk, hx + k * CHUNK, CHUNK * sizeof(float), s[k]));
		CHECK(cuMemcpyHtoDAsync(yk, hy + k * CHUNK, CHUNK * sizeof(float), s[k]));
		CHECK(cuLaunchKernel(saxpy, CHUNK / 128, 1, 1, 128, 1, 1, 0, s[k], params, NULL));
		CHECK(cuEventRecord(done[k], s[k]));
		if (k == STREAMS / 2) checkpoint();
	}
	for (int k = 0; k < STREAMS; k++) {
		CUstream next = s[(k + 1) % STREAMS];
		CHECK(cuStreamWaitEvent(next, done[k], 0));
		CHECK(cuMemcpyDtoHAsync(out + k * CHUNK, y + k * CHUNK * sizeof(float), CHUNK * sizeof(float), next));
	}
	CHECK(cuMemsetD8Async(tmp, 0xab, 8, s[0]));
	CHECK(cuMemsetD16Async(tmp + 8, 0x1234, 4, s[1]));
	CHECK(cuMemsetD32Async(tmp + 16, 0xdeadbeef, 2, s[2]));
	for (int k = 0; k < STREAMS; k++) {
		CHECK(cuStreamSynchronize(s[k]));
		CHECK(cuStreamQuery(s[k]));
		float ms = -1;
		CHECK(cuEventElapsedTime(&ms, start, done[k]));
		if (ms < 0) FAIL("elapsed %g ms", ms);
		CHECK(cuEventQuery(done[k]));
		CHECK(cuEventSynchronize(done[k]));
	}
	for (int i = 0; i < STREAMS * CHUNK; i++) {
		float want = alpha * hx[i] + hy[i];
		if (out[i] != want) FAIL("y[%d] = %g, want %g", i, out[i], want);
	}
	unsigned char t[24];
	CHECK(cuMemcpyDtoH(t, tmp, sizeof t));
	for (int i = 0; i < 8; i++) if (t[i] != 0xab) FAIL("memset D8 byte %d = %#x", i, t[i]);
	for (int i = 0; i < 4; i++) if (t[8 + 2 * i] != 0x34 || t[9 + 2 * i] != 0x12) FAIL("memset D16 element %d", i);
	for (int i = 0; i < 2; i++) if (t[16 + 4 * i] != 0xef || t[19 + 4 * i] != 0xde) FAIL("memset D32 element %d", i);
	for (int k = 0; k < STREAMS; k++) { CHECK(cuStreamDestroy(s[k])); CHECK(cuEventDestroy(done[k])); }
	CHECK(cuEventDestroy(start));
	CHECK(cuMemFreeHost(hx));
	CHECK(cuMemFreeHost(hy));
	CHECK(cuMemFreeHost(out));
	CHECK(cuCtxDestroy(ctx));
	printf("pipeline ok: %d streams\n", STREAMS);
	return 0;
}
