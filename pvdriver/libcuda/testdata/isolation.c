/* Isolation between guests: "hold" keeps a secret in device memory, prints
 * its address and waits for a line on stdin; "peek ADDR" runs a kernel of
 * its own (peek) that reads 8 bytes at ADDR. Run as guests of two primaries
 * on one GPU (scripts/gpu-libcuda.sh): the peek must fail or read something
 * else, and the holder must then read its secret back intact. */
#include "cudaapi.h"

#define SECRET 0x5ec2e7c0ffee1234ull
#define PAD (2u << 20) /* the secret lies past the start of the window, where the peeker has memory of its own */
#define WORDS 4096

static int hold(void) {
	static unsigned long long h[WORDS];
	CUdeviceptr pad, secret;
	int c;
	for (int i = 0; i < WORDS; i++) h[i] = SECRET;
	CHECK(cuMemAlloc(&pad, PAD));
	CHECK(cuMemAlloc(&secret, sizeof h));
	CHECK(cuMemcpyHtoD(secret, h, sizeof h));
	CHECK(cuCtxSynchronize());
	printf("holding %#llx\n", secret);
	fflush(stdout);
	while ((c = getchar()) != EOF && c != '\n') {}
	memset(h, 0, sizeof h);
	CHECK(cuMemcpyDtoH(h, secret, sizeof h));
	for (int i = 0; i < WORDS; i++)
		if (h[i] != SECRET) FAIL("secret word %d = %#llx after the peek", i, h[i]);
	printf("hold ok: secret intact\n");
	return 0;
}

static int peek(const char *dir, CUdeviceptr target) {
	CUmodule mod;
	CUfunction f;
	CUdeviceptr out;
	unsigned long long v = 0;
	const char *name = "?";
	CHECK(cuModuleLoadData(&mod, load_image(dir, "peek")));
	CHECK(cuModuleGetFunction(&f, mod, "peek"));
	CHECK(cuMemAlloc(&out, sizeof v));
	CHECK(cuMemsetD8(out, 0, sizeof v));
	void *params[] = {&target, &out};
	CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
	if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
	if (r != CUDA_SUCCESS) {
		cuGetErrorName(r, &name);
		printf("peek failed: %s\n", name);
		return 0;
	}
	CHECK(cuMemcpyDtoH(&v, out, sizeof v));
	if (v == SECRET) {
		printf("peek LEAKED the other guest's secret\n");
		return 3;
	}
	printf("peek read %#llx, not the secret\n", v);
	return 0;
}

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	if (argc < 3 || (strcmp(argv[2], "hold") != 0 && (strcmp(argv[2], "peek") != 0 || argc < 4)))
		FAIL("usage: isolation KERNELDIR hold | isolation KERNELDIR peek ADDR");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	if (strcmp(argv[2], "hold") == 0) return hold();
	return peek(argv[1], (CUdeviceptr)strtoull(argv[3], NULL, 0));
}
