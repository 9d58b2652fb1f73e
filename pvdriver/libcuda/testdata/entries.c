/* What a call into the library costs the calling thread (issue 43): each
 * line is nanoseconds per call, averaged over a loop of one entry. A kept
 * answer (answers.c) stays in C; cuCtxGetCurrent enters Go; a launch is
 * also a pipelined request; a 4-byte copy to the host is a round trip, a
 * 3 MiB one (an evaluation step's outputs) mostly the bytes' way back.
 * Usage: entries KERNELDIR SCALE (SCALE multiplies every loop's count). */
#include <time.h>
#include "cudaapi.h"

static double now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

#define TIME(name, n, call) do { \
	long n_ = (long)(n) * scale; double t0_ = now_ns(); \
	for (long i_ = 0; i_ < n_; i_++) CHECK(call); \
	printf("%s %.1f\n", name, (now_ns() - t0_) / n_); } while (0)

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx, cur;
	CUmodule mod;
	CUfunction f;
	CUdeviceptr a, b, c, big;
	int v, n = 256;
	unsigned char host[4], *bighost = malloc(3 << 20);
	if (argc < 3) FAIL("usage: entries KERNELDIR SCALE");
	long scale = atol(argv[2]);
	if (scale < 1) FAIL("SCALE %s: want a positive count", argv[2]);
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "vadd")));
	CHECK(cuModuleGetFunction(&f, mod, "vadd"));
	CHECK(cuMemAlloc(&a, 1024));
	CHECK(cuMemAlloc(&b, 1024));
	CHECK(cuMemAlloc(&c, 1024));
	CHECK(cuMemAlloc(&big, 3 << 20));
	if (bighost == NULL) FAIL("malloc");
	void *params[] = {&a, &b, &c, &n};
	TIME("ctx_get_device", 100000, cuCtxGetDevice(&dev));
	TIME("func_get_attribute", 100000, cuFuncGetAttribute(&v, 0, f));
	TIME("ctx_get_current", 100000, cuCtxGetCurrent(&cur));
	TIME("launch", 5000, cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
	CHECK(cuCtxSynchronize());
	TIME("copy_dtoh_4", 500, cuMemcpyDtoH(host, a, sizeof host));
	TIME("copy_dtoh_3mib", 20, cuMemcpyDtoH(bighost, big, 3 << 20));
	return 0;
}
