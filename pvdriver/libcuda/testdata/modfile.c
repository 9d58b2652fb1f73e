/* Kernels from a file (cuModuleLoad, any image format): a histogram with integer atomics,
 * context push/pop, 16- and 8-bit memsets, unified cuMemcpy. */
#include "cudaapi.h"

#define N 10000
#define BINS 16

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx, popped, cur;
	CUmodule mod, bad;
	CUfunction hist;
	CUdeviceptr data, bins, g;
	size_t gsize;
	unsigned int n = N, nbins = BINS, hd[N], hb[BINS], want[BINS] = {0};
	char path[4096];
	if (argc < 2) FAIL("usage: modfile KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(cuCtxPopCurrent(&popped));
	if (popped != ctx) FAIL("popped another context");
	CHECK(cuCtxGetCurrent(&cur));
	if (cur != NULL) FAIL("a context is still current");
	CHECK(cuCtxPushCurrent(ctx));
	image_path(path, sizeof path, argv[1], "histogram");
	CHECK(cuModuleLoad(&mod, path));
	image_path(path, sizeof path, argv[1], "no-such");
	EXPECT(CUDA_ERROR_FILE_NOT_FOUND, cuModuleLoad(&bad, path));
	EXPECT(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&g, &gsize, mod, "no_such_global"));
	CHECK(cuModuleGetFunction(&hist, mod, "histogram"));
	for (int i = 0; i < N; i++) { hd[i] = (unsigned)(i * 2654435761u) >> 7; want[hd[i] % BINS]++; }
	CHECK(cuMemAlloc(&data, sizeof hd));
	CHECK(cuMemAlloc(&bins, sizeof hb));
	CHECK(cuMemcpy(data, (CUdeviceptr)(uintptr_t)hd, sizeof hd)); /* host to device, by address */
	CHECK(cuMemsetD16(bins, 0xffff, 2 * BINS));
	CHECK(cuMemsetD8(bins, 0, sizeof hb));
	checkpoint();
	void *params[] = {&data, &n, &bins, &nbins};
	CHECK(cuLaunchKernel(hist, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
	CHECK(cuMemcpy((CUdeviceptr)(uintptr_t)hb, bins, sizeof hb)); /* device to host, by address */
	for (int b = 0; b < BINS; b++)
		if (hb[b] != want[b]) FAIL("bin %d = %u, want %u", b, hb[b], want[b]);
	CHECK(cuModuleUnload(mod));
	if (!native()) EXPECT(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(hist, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
	CHECK(cuCtxDestroy(ctx));
	printf("modfile ok: %d values in %d bins\n", N, BINS);
	return 0;
}
