/* Matrix multiply in 16x16 tiles of threads: a context of its own, PTX
 * through cuModuleLoadDataEx with JIT options, parameters packed in one
 * buffer (cuLaunchKernel's extra), a pitched allocation and D2D copies. */
#include <stddef.h>
#include "cudaapi.h"

#define N 96
#define TILE 16

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction mm;
	CUdeviceptr a, b, c, pitched;
	size_t pitch;
	static float ha[N * N], hb[N * N], hc[N * N], want[N * N];
	if (argc < 2) FAIL("usage: matmul KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	int opts[] = {CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
	void *vals[] = {(void *)(uintptr_t)0};
	CHECK(cuModuleLoadDataEx(&mod, load_image(argv[1], "matmul"), 1, opts, vals));
	CHECK(cuModuleGetFunction(&mm, mod, "matmul"));
	for (int i = 0; i < N * N; i++) { ha[i] = (float)(i % 17) - 8.0f; hb[i] = (float)(i % 13) * 0.5f; }
	for (int r = 0; r < N; r++)
		for (int col = 0; col < N; col++) {
			float sum = 0;
			for (int k = 0; k < N; k++) { float p = ha[r * N + k] * hb[k * N + col]; sum = sum + p; }
			want[r * N + col] = sum;
		}
	CHECK(cuMemAlloc(&a, sizeof ha));
	CHECK(cuMemAlloc(&b, sizeof hb));
	CHECK(cuMemAlloc(&c, sizeof hc));
	CHECK(cuMemAllocPitch(&pitched, &pitch, N * sizeof(float), N, 4));
	if (pitch < N * sizeof(float) || pitch % 512 != 0) FAIL("pitch %zu", pitch);
	CHECK(cuMemcpyHtoD(pitched, ha, sizeof ha)); /* staged through device memory */
	CHECK(cuMemcpyDtoD(a, pitched, sizeof ha));
	CHECK(cuMemcpyHtoD(b, hb, sizeof hb));
	checkpoint();
	struct { CUdeviceptr a, b, c; unsigned int n; } args = {a, b, c, N};
	size_t size = offsetof(__typeof__(args), n) + sizeof args.n; /* the parameters' bytes: NVIDIA refuses the padded size */
	void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &args, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
	CHECK(cuLaunchKernel(mm, N / TILE, N / TILE, 1, TILE, TILE, 1, 0, NULL, NULL, extra));
	CHECK(cuMemcpyDtoH(hc, c, sizeof hc));
	for (int i = 0; i < N * N; i++)
		if (hc[i] != want[i]) FAIL("C[%d] = %g, want %g", i, hc[i], want[i]);
	CHECK(cuMemFree(pitched));
	CHECK(cuCtxDestroy(ctx));
	printf("matmul ok: %dx%d\n", N, N);
	return 0;
}
