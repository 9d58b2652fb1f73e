/* Virtual memory management, as JAX's XLA and PyTorch's expandable
 * segments use it: the granularity, a reserved range, physical handles
 * mapped at exact addresses in it, access set, copies in and out and a
 * kernel over the mappings, copies across two mappings, pointer attributes of mapped memory; the
 * refusals (a mapping outside the reservation or over another, an unknown
 * handle, an offset, a handle mapped twice, handle export, read-only
 * access; this library's, skipped natively); then, past the checkpoint (a verify, or a failover), the same
 * data, a kernel, unmap, release and free. */
#include "cudaapi.h"

enum { CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102, CU_MEM_ALLOCATION_TYPE_PINNED = 1,
	CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1, CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_MEMORYTYPE_DEVICE = 2 };
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option);
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr p, size_t size);
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr p);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h);
CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p);

/* fill writes n floats of value i*scale+shift to a mapping at p. */
static void fill(CUdeviceptr p, size_t n, float scale, float shift) {
	float *h = malloc(n * sizeof *h);
	if (!h) FAIL("malloc");
	for (size_t i = 0; i < n; i++) h[i] = (float)i * scale + shift;
	CHECK(cuMemcpyHtoD(p, h, n * sizeof *h));
	free(h);
}

/* check reads n floats at p and compares each with want(i) = i*scale+shift. */
static void check(const char *what, CUdeviceptr p, size_t n, float scale, float shift) {
	float *h = malloc(n * sizeof *h);
	if (!h) FAIL("malloc");
	CHECK(cuMemcpyDtoH(h, p, n * sizeof *h));
	for (size_t i = 0; i < n; i++)
		if (h[i] != (float)i * scale + shift) FAIL("%s[%zu] = %g, want %g", what, i, h[i], (float)i * scale + shift);
	free(h);
}

/* across copies 400 bytes to from (100 in h1's mapping, the rest in h2's,
 * which follows it), copies them on the device to to, and reads both. */
static void across(CUdeviceptr from, CUdeviceptr to) {
	unsigned char out[400], in[400];
	for (int i = 0; i < 400; i++) out[i] = (unsigned char)(i * 7 + 1);
	CHECK(cuMemcpyHtoD(from, out, sizeof out));
	CHECK(cuMemcpyDtoD(to, from, sizeof out));
	CHECK(cuMemcpyDtoH(in, from, sizeof in));
	if (memcmp(in, out, sizeof in) != 0) FAIL("a copy across two mappings read back different bytes");
	CHECK(cuMemcpyDtoH(in, to, sizeof in));
	if (memcmp(in, out, sizeof in) != 0) FAIL("a device copy from across two mappings differs");
}

/* refusals tries what the library must refuse, with a reservation of 4
 * granules at base whose first 3 are mapped. */
static void refusals(CUdeviceptr base, size_t g, const CUmemAllocationProp *prop, CUmemGenericAllocationHandle mapped) {
	CUmemGenericAllocationHandle h3, fdh;
	CUmemAllocationProp exported = *prop;
	CUmemAccessDesc ro = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READ};
	int fd;
	CHECK(cuMemCreate(&h3, g, prop, 0));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 4 * g, g, 0, h3, 0));                /* past the reservation */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(base, g, 0, h3, 0));                        /* over a mapping */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 3 * g, g, 0, 0xdead0000ull, 0));     /* unknown handle */
	EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemMap(base + 3 * g, g, g, h3, 0));                /* an offset */
	EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemMap(base + 3 * g, g, 0, mapped, 0));            /* mapped twice */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 3 * g + 4096, g, 0, h3, 0));         /* not aligned */
	EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemSetAccess(base, g, &ro, 1));                    /* read-only */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(base + 3 * g, g, &((CUmemAccessDesc){{1, 0}, 3}), 1)); /* unmapped */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(base, 4 * g));                      /* still mapped */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemFree(base));                                    /* a mapping is no allocation */
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(base + g, g));                            /* part of a mapping */
	EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemExportToShareableHandle(&fd, mapped, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	exported.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; /* accepted (PyTorch asks it), never exported */
	CHECK(cuMemCreate(&fdh, g, &exported, 0));
	EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemExportToShareableHandle(&fd, fdh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CHECK(cuMemRelease(fdh));
	exported.requestedHandleTypes = 8; /* CU_MEM_HANDLE_TYPE_FABRIC */
	EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemCreate(&h3, g, &exported, 0));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h3, g + 1, prop, 0));
	CHECK(cuMemRelease(h3));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h3));
}

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction vadd;
	CUdeviceptr base, rbase;
	CUmemGenericAllocationHandle h1, h2, got;
	CUmemAllocationProp prop = {0}, back;
	CUmemAccessDesc rw = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	unsigned long long access;
	size_t g, rec, rsize;
	int vmm, type;
	if (argc < 2) FAIL("usage: vmm KERNELDIR");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
	if (vmm != 1) FAIL("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = %d", vmm);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	CHECK(cuMemGetAllocationGranularity(&g, &prop, 0));
	CHECK(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	if (g == 0 || rec % g != 0) FAIL("granularity %zu, recommended %zu", g, rec);
	CHECK(cuMemAddressReserve(&base, 4 * g, 0, 0, 0));
	if (base % g != 0) FAIL("reservation at %#llx is not aligned to %zu", base, g);
	CHECK(cuMemCreate(&h1, 2 * g, &prop, 0));
	CHECK(cuMemCreate(&h2, g, &prop, 0));
	CHECK(cuMemGetAllocationPropertiesFromHandle(&back, h1));
	if (back.type != prop.type || back.location.type != prop.location.type) FAIL("properties of a handle changed");
	CHECK(cuMemMap(base, 2 * g, 0, h1, 0));
	CHECK(cuMemMap(base + 2 * g, g, 0, h2, 0));
	CHECK(cuMemRelease(h2)); /* released while mapped: it lives until unmapped */
	CHECK(cuMemSetAccess(base, 3 * g, &rw, 1)); /* over both mappings at once, as PyTorch does */
	CHECK(cuMemGetAccess(&access, &loc, base + 2 * g + 8));
	if (access != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) FAIL("access %llu", access);
	CHECK(cuMemRetainAllocationHandle(&got, (void *)(uintptr_t)(base + 2 * g + 64)));
	if (got != h2) FAIL("retained handle %#llx, mapped %#llx", got, h2);
	CHECK(cuMemRelease(got));
	CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + 5));
	if (type != CU_MEMORYTYPE_DEVICE) FAIL("memory type %d", type);
	if (!native()) { /* what this library promises; NVIDIA's driver serves some of it */
		CHECK(cuMemGetAddressRange_v2(&rbase, &rsize, base + 2 * g + 100));
		if (rbase != base + 2 * g || rsize != g) FAIL("address range %#llx+%zu, want %#llx+%zu", rbase, rsize, base + 2 * g, g);
		refusals(base, g, &prop, h1);
	}

	size_t n = g / sizeof(float); /* a, b: the two granules of h1's mapping; c: h2's */
	CUdeviceptr a = base, b = base + g, c = base + 2 * g;
	across(c - 100, a);
	fill(a, n, 0.5f, 1.0f);
	fill(b, n, 0.25f, 2.0f);
	CHECK(cuMemsetD32(c, 0x7fc00000u, n));
	checkpoint();
	check("a", a, n, 0.5f, 1.0f); /* the data survives a failover */
	check("b", b, n, 0.25f, 2.0f);
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "vadd")));
	CHECK(cuModuleGetFunction(&vadd, mod, "vadd"));
	unsigned int un = (unsigned int)n;
	void *params[] = {&a, &b, &c, &un};
	CHECK(cuLaunchKernel(vadd, (un + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
	CHECK(cuCtxSynchronize());
	check("c", c, n, 0.75f, 3.0f);
	CHECK(cuMemUnmap(base, 3 * g)); /* both mappings in one call */
	CHECK(cuMemRelease(h1));
	if (!native()) {
		EXPECT(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange_v2(&rbase, &rsize, base)); /* no memory there now */
		EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h2)); /* gone with its unmapping */
	}
	CHECK(cuMemAddressFree(base, 4 * g));
	CHECK(cuModuleUnload(mod));
	CHECK(cuDevicePrimaryCtxRelease(dev));
	printf("vmm ok: %zu-byte granularity, 3 granules mapped\n", g);
	return 0;
}
