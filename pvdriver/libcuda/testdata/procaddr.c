/* Every call through cuGetProcAddress_v2, as programs built on the CUDA
 * runtime bind the driver: the name and the caller's CUDA version give
 * the versioned entry. */
#include "cudaapi.h"

#define N 1000

typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*devget_t)(CUdevice *, int);
typedef CUresult (*ctxcreate_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*htod_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*loaddata_t)(CUmodule *, const void *);
typedef CUresult (*getfn_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*graph_t)(void *, unsigned int);

static void *get(const char *name, int version) {
	void *fn = NULL;
	int status = -1;
	CHECK(cuGetProcAddress_v2(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status));
	if (fn == NULL || status != CU_GET_PROC_ADDRESS_SUCCESS) FAIL("%s: no entry (status %d)", name, status);
	return fn;
}

int main(int argc, char **argv) {
	void *fn;
	int status;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction f;
	CUdeviceptr a, b, c;
	unsigned int n = N;
	float ha[N], hb[N], hc[N];
	if (argc < 2) FAIL("usage: procaddr KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	fn = &status; /* the driver must clear it */
	CHECK(cuGetProcAddress_v2("cuNoSuchEntry", &fn, 13000, 0, &status)); /* as NVIDIA's: success, the reason in status */
	if (fn != NULL || status != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) FAIL("unknown name: status %d", status);
	if (!native()) { /* NVIDIA may hand out internal entries, keeps pre-3.2 ones and serves graph memory nodes */
		if (get("cuCtxCreate", 13000) != (void *)cuCtxCreate_v4 || get("cuCtxCreate", 12000) != (void *)cuCtxCreate_v3 ||
		    get("cuCtxCreate", 11000) != (void *)cuCtxCreate_v2 || get("cuMemAlloc", 12000) != (void *)cuMemAlloc_v2)
			FAIL("wrong versioned entries");
		CHECK(cuGetProcAddress_v2("cuCtxCreate", &fn, 2000, 0, &status));
		if (status != CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) FAIL("old version: status %d", status);
		EXPECT(CUDA_ERROR_INVALID_VALUE, ((graph_t)get("cuGraphCreate", 13000))(NULL, 0));
		EXPECT(CUDA_ERROR_NOT_SUPPORTED, ((graph_t)get("cuGraphAddMemAllocNode", 13000))(NULL, 0)); /* graph memory nodes are not served */
	}
	CHECK(((init_t)get("cuInit", 13000))(0));
	CHECK(((devget_t)get("cuDeviceGet", 13000))(&dev, 0));
	CHECK(((ctxcreate_t)get("cuCtxCreate", 11000))(&ctx, 0, dev));
	CHECK(((loaddata_t)get("cuModuleLoadData", 13000))(&mod, load_image(argv[1], "vadd")));
	CHECK(((getfn_t)get("cuModuleGetFunction", 13000))(&f, mod, "vadd"));
	alloc_t alloc = (alloc_t)get("cuMemAlloc", 13000);
	CHECK(alloc(&a, sizeof ha));
	CHECK(alloc(&b, sizeof hb));
	CHECK(alloc(&c, sizeof hc));
	for (int i = 0; i < N; i++) { ha[i] = (float)i; hb[i] = 1.5f; }
	htod_t htod = (htod_t)get("cuMemcpyHtoD", 13000);
	CHECK(htod(a, ha, sizeof ha));
	CHECK(htod(b, hb, sizeof hb));
	checkpoint();
	void *params[] = {&a, &b, &c, &n};
	CHECK(((launch_t)get("cuLaunchKernel", 13000))(f, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
	CHECK(((dtoh_t)get("cuMemcpyDtoH", 13000))(hc, c, sizeof hc));
	for (int i = 0; i < N; i++)
		if (hc[i] != ha[i] + hb[i]) FAIL("c[%d] = %g", i, hc[i]);
	printf("procaddr ok\n");
	return 0;
}
