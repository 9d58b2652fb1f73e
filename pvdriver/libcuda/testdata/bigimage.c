/* A module image larger than one request (cuRAND's and cuFFT's fatbins run to tens of MiB):
 * a fatbin of the vadd kernel's PTX and 24 MiB of code for some other GPU, loaded from memory
 * (the library uploads it in pieces), its kernel run before and after the checkpoint, and the
 * same image loaded again after it. */
#include "cudaapi.h"

#define N (1 << 12)
#define PAD (24u << 20)
#define ENTRY 64 /* a fatbin entry's header */

/* put_entry writes a fatbin entry header (kind 1: PTX, 2: ELF) for payload bytes at p. */
static unsigned char *put_entry(unsigned char *p, uint16_t kind, uint32_t payload, uint32_t sm) {
	memset(p, 0, ENTRY);
	memcpy(p, &kind, 2);
	uint16_t version = 0x0101;
	uint32_t hdr = ENTRY, bits = 1;
	memcpy(p + 2, &version, 2);
	memcpy(p + 4, &hdr, 4);
	memcpy(p + 8, &payload, 4);  /* padded payload size */
	memcpy(p + 16, &payload, 4); /* payload size */
	memcpy(p + 28, &sm, 4);
	memcpy(p + 32, &bits, 4);
	return p + ENTRY;
}

/* big_fatbin returns a fatbin holding ptx and PAD bytes of another GPU's code, its size in *size. */
static unsigned char *big_fatbin(const char *ptx, size_t *size) {
	uint32_t text = (uint32_t)((strlen(ptx) + 1 + 7) & ~(size_t)7);
	uint64_t body = 2 * ENTRY + (uint64_t)text + PAD;
	uint32_t magic = 0xBA55ED50u;
	uint16_t version = 1, hdr = 16;
	unsigned char *fat = calloc(1, 16 + body), *p;
	if (fat == NULL) FAIL("out of memory");
	memcpy(fat, &magic, 4);
	memcpy(fat + 4, &version, 2);
	memcpy(fat + 6, &hdr, 2);
	memcpy(fat + 8, &body, 8);
	p = put_entry(fat + 16, 1, text, 52);
	memcpy(p, ptx, strlen(ptx));
	p = put_entry(p + text, 2, PAD, 1000); /* no such GPU: skipped */
	for (uint32_t i = 0; i < PAD; i++) p[i] = (unsigned char)(i * 2654435761u >> 24);
	*size = 16 + body;
	return fat;
}

static void run_vadd(CUfunction f, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, const float *ha, const float *hb) {
	static float hc[N];
	unsigned int n = N;
	void *params[] = {&a, &b, &c, &n};
	CHECK(cuMemsetD32(c, 0x7fc00000u, N)); /* NaN: every element must be written */
	CHECK(cuLaunchKernel(f, N / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
	CHECK(cuMemcpyDtoH(hc, c, sizeof hc));
	for (int i = 0; i < N; i++)
		if (hc[i] != ha[i] + hb[i]) FAIL("c[%d] = %g, want %g", i, hc[i], ha[i] + hb[i]);
}

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod, again;
	CUfunction vadd, vadd2;
	CUdeviceptr a, b, c;
	static float ha[N], hb[N];
	size_t size;
	if (argc < 2) FAIL("usage: bigimage KERNELDIR");
	setenv("VGTEST_IMAGE", "ptx", 1);
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	unsigned char *fat = big_fatbin(load_image(argv[1], "vadd"), &size);
	CHECK(cuModuleLoadData(&mod, fat));
	CHECK(cuModuleGetFunction(&vadd, mod, "vadd"));
	for (int i = 0; i < N; i++) { ha[i] = (float)i * 0.5f; hb[i] = (float)(N - i) * 0.25f; }
	CHECK(cuMemAlloc(&a, sizeof ha));
	CHECK(cuMemAlloc(&b, sizeof hb));
	CHECK(cuMemAlloc(&c, sizeof ha));
	CHECK(cuMemcpyHtoD(a, ha, sizeof ha));
	CHECK(cuMemcpyHtoD(b, hb, sizeof hb));
	run_vadd(vadd, a, b, c, ha, hb);
	checkpoint();
	run_vadd(vadd, a, b, c, ha, hb); /* the module outlives a failover */
	CHECK(cuModuleLoadData(&again, fat));
	CHECK(cuModuleGetFunction(&vadd2, again, "vadd"));
	run_vadd(vadd2, a, b, c, ha, hb);
	CHECK(cuModuleUnload(again));
	CHECK(cuModuleUnload(mod));
	CHECK(cuCtxDestroy(ctx));
	printf("bigimage ok: a %zu-byte image, %d elements\n", size, N);
	return 0;
}
