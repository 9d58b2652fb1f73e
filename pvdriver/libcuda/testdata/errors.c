/* Error paths: calls before cuInit, bad handles, out-of-range copies, an
 * unknown function, a kernel the software GPU does not run; the session
 * keeps working after each. Against NVIDIA's driver (VGTEST_NATIVE) only
 * the paths it defines run: made-up handles are undefined behaviour there,
 * and its copies are bounded by its mappings, not by the allocation. */
#include "cudaapi.h"

static const char foreign_ptx[] =
	".version 7.0\n.target sm_70\n.address_size 64\n"
	".visible .entry scale(.param .u64 p, .param .f32 s)\n{\n\tret;\n}\n";
/* An ELF magic and no ELF: a whole header's worth of bytes, zero padded. */
static const char not_elf[64] = "\x7f" "ELF-not-really";

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod, foreign;
	CUfunction f, missing;
	CUstream bogus_stream = (CUstream)(uintptr_t)0x7777770;
	CUdeviceptr p;
	unsigned char buf[256];
	const char *s;
	int v;
	if (argc < 2) FAIL("usage: errors KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	EXPECT(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&v));
	EXPECT(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc(&p, 16));
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&p, 16));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&p, 0));
	CHECK(cuMemAlloc(&p, sizeof buf));
	memset(buf, 7, sizeof buf);
	if (!native()) { /* out-of-range copies and memsets */
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(p + 128, buf, sizeof buf));
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(buf, p + sizeof buf, 1));
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoD(p, p + 200, 100));
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemsetD32(p + 2, 0, 1));
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(p, 0, sizeof buf + 1));
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemFree(p + 8));
	}
	checkpoint();
	if (!native()) { /* bad handles */
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(bogus_stream));
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuMemcpyHtoDAsync(p, buf, 16, bogus_stream));
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload((CUmodule)(uintptr_t)0x123450));
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuEventRecord((CUevent)(uintptr_t)0x99990, NULL));
		EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuCtxDestroy((CUcontext)(uintptr_t)0x55550));
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel((CUfunction)(uintptr_t)0x4440, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	}
	/* An unknown function, and a kernel the software GPU does not have. */
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "vadd")));
	EXPECT(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction(&missing, mod, "no_such_kernel"));
	CHECK(cuModuleGetFunction(&f, mod, "vadd"));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, NULL, NULL, NULL));
	if (getenv("VGTEST_SIM")) EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuModuleLoadData(&foreign, foreign_ptx));
	EXPECT(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&foreign, not_elf));
	/* Error names. */
	CHECK(cuGetErrorName(CUDA_ERROR_INVALID_HANDLE, &s));
	if (strcmp(s, "CUDA_ERROR_INVALID_HANDLE") != 0) FAIL("name %s", s);
	CHECK(cuGetErrorString(CUDA_ERROR_NOT_FOUND, &s));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(12345, &s));
	/* Still working. */
	CHECK(cuMemcpyHtoD(p, buf, sizeof buf));
	memset(buf, 0, sizeof buf);
	CHECK(cuMemcpyDtoH(buf, p, sizeof buf));
	for (int i = 0; i < (int)sizeof buf; i++) if (buf[i] != 7) FAIL("byte %d = %d", i, buf[i]);
	CHECK(cuCtxSynchronize());
	CHECK(cuCtxDestroy(ctx));
	printf("errors ok\n");
	return 0;
}
