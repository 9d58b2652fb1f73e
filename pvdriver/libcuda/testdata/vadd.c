/* Vector add: the primary context, PTX loaded from memory, kernelParams. */
#include "cudaapi.h"

#define N (1 << 16)

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction vadd;
	CUdeviceptr a, b, c;
	size_t free_mem, total;
	unsigned int n = N;
	static float ha[N], hb[N], hc[N];
	if (argc < 2) FAIL("usage: vadd KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "vadd")));
	CHECK(cuModuleGetFunction(&vadd, mod, "vadd"));
	for (int i = 0; i < N; i++) { ha[i] = (float)i * 0.5f; hb[i] = (float)(N - i) * 0.25f; }
	CHECK(cuMemAlloc(&a, sizeof ha));
	CHECK(cuMemAlloc(&b, sizeof hb));
	CHECK(cuMemAlloc(&c, sizeof hc));
	CHECK(cuMemGetInfo(&free_mem, &total));
	if (free_mem > total || total - free_mem < 3 * sizeof ha) FAIL("cuMemGetInfo: free %zu of %zu", free_mem, total);
	CHECK(cuMemcpyHtoD(a, ha, sizeof ha));
	CHECK(cuMemcpyHtoD(b, hb, sizeof hb));
	CHECK(cuMemsetD32(c, 0x7fc00000u, N)); /* NaN: every element must be written */
	checkpoint();
	void *params[] = {&a, &b, &c, &n};
	CHECK(cuLaunchKernel(vadd, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
	CHECK(cuCtxSynchronize());
	CHECK(cuMemcpyDtoH(hc, c, sizeof hc));
	for (int i = 0; i < N; i++)
		if (hc[i] != ha[i] + hb[i]) FAIL("c[%d] = %g, want %g", i, hc[i], ha[i] + hb[i]);
	CHECK(cuMemFree(a));
	CHECK(cuMemFree(b));
	CHECK(cuMemFree(c));
	CHECK(cuModuleUnload(mod));
	CHECK(cuDevicePrimaryCtxRelease(dev));
	printf("vadd ok: %d elements\n", N);
	return 0;
}
