/* The driver as the CUDA runtime sees it, on the software GPU: every name
 * and version PyTorch 2.11's cudart looks up (a list on stdin), the
 * private export tables, the integrity answer's inputs (printed for the
 * Go test to recompute), context-local storage, the runtime interface's
 * primary context and module from a fatbin wrapper, lazy libraries and
 * kernels, cuLaunchKernelEx, pointer attributes, and module variables
 * (refused by the software GPU, which holds none). Usage:
 *   runtime_view KERNELDIR < cudart13-procs.txt */
#include <pthread.h>
#include <unistd.h>
#include "cudaapi.h"

typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
CUresult cuGetExportTable(const void **table, const CUuuid *id);
CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jo, void **jv, unsigned int njo, void *lo, void **lv, unsigned int nlo);
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name);
CUresult cuLibraryUnload(CUlibrary lib);
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k);
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);

#define N 1024

static const unsigned char runtime_id[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
static const unsigned char cls_id[16] = {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93};
static const unsigned char integrity_id[16] = {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2};
static const unsigned char unknown_id[16] = {0x69, 0xa2, 0x8e, 0x9f, 0x24, 0x49, 0x8b, 0x47, 0xb0, 0x30, 0xc5, 0xda, 0x33, 0x0e, 0xa4, 0xe9};

static void *const *table(const unsigned char id[16]) {
	const void *t = NULL;
	CUuuid u;
	memcpy(u.bytes, id, 16);
	CHECK(cuGetExportTable(&t, &u));
	return (void *const *)t;
}

/* every_lookup resolves each "name version flags" line of stdin. */
static void every_lookup(void) {
	char name[256];
	int version, n = 0;
	unsigned long long flags;
	while (scanf("%255s %d %llu", name, &version, &flags) == 3) {
		void *fn = NULL;
		int status = -1;
		CHECK(cuGetProcAddress_v2(name, &fn, version, flags, &status));
		if (fn == NULL || status != CU_GET_PROC_ADDRESS_SUCCESS) FAIL("cuGetProcAddress(%s, %d, %llu): status %d", name, version, flags, status);
		n++;
	}
	if (n < 400) FAIL("only %d lookups read", n);
	printf("lookups %d ok\n", n);
}

static int destroyed;
static void cls_dtor(CUcontext ctx, void *key, void *value) { (void)ctx, (void)key, destroyed += (int)(uintptr_t)value; }

static void local_storage(CUdevice dev) {
	typedef CUresult (*put_t)(CUcontext, void *, void *, void (*)(CUcontext, void *, void *));
	typedef CUresult (*del_t)(CUcontext, void *);
	typedef CUresult (*get_t)(void **, CUcontext, void *);
	void *const *cls = table(cls_id), *v = NULL;
	CUcontext ctx;
	int key1, key2;
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(((put_t)cls[0])(NULL, &key1, (void *)3, cls_dtor)); /* NULL: the current context */
	CHECK(((put_t)cls[0])(ctx, &key2, (void *)4, cls_dtor));
	CHECK(((get_t)cls[2])(&v, ctx, &key1));
	if (v != (void *)3) FAIL("local storage: %p", v);
	CHECK(((del_t)cls[1])(ctx, &key1));
	EXPECT(CUDA_ERROR_INVALID_HANDLE, ((get_t)cls[2])(&v, ctx, &key1));
	CHECK(cuCtxDestroy(ctx));
	if (destroyed != 4) FAIL("destructors ran for %d, want 4", destroyed);
	EXPECT(CUDA_ERROR_INVALID_CONTEXT, ((put_t)cls[0])(ctx, &key1, NULL, NULL));
	printf("local storage ok\n");
}

/* integrity prints the answers and every input the driver hashes. */
static void integrity(CUdevice dev) {
	typedef CUresult (*check_t)(unsigned int, unsigned long long, unsigned long long *);
	void *const *it = table(integrity_id), *const *rt = table(runtime_id);
	unsigned long long a[2];
	CUuuid u;
	int domain, bus, slot, v;
	CHECK(cuDeviceGetUuid(&u, dev));
	CHECK(cuDeviceGetAttribute(&domain, 50, dev));
	CHECK(cuDeviceGetAttribute(&bus, 33, dev));
	CHECK(cuDeviceGetAttribute(&slot, 34, dev));
	CHECK(cuDriverGetVersion(&v));
	printf("integrity-input %d %d %u %lu %lu %lu 1700000000", v, (int)getpid(), (unsigned)(uintptr_t)pthread_self(),
		(unsigned long)(uintptr_t)rt, (unsigned long)(uintptr_t)it, (unsigned long)(uintptr_t)it[1]);
	for (int i = 0; i < 16; i++) printf(" %u", (unsigned char)u.bytes[i]);
	printf(" %d %d %d\n", domain, bus, slot);
	for (unsigned int ver = 13000; ver <= 13002; ver++) {
		CHECK(((check_t)it[1])(ver, 1700000000ULL, a));
		printf("integrity %u %016llx %016llx\n", ver, a[0], a[1]);
	}
}

static void vadd_check(CUfunction f, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, int ex) {
	float ha[N], hb[N], hc[N];
	unsigned int n = N;
	void *args[] = {&a, &b, &c, &n};
	for (int i = 0; i < N; i++) ha[i] = (float)i, hb[i] = 0.5f;
	CHECK(cuMemcpyHtoD(a, ha, sizeof ha));
	CHECK(cuMemcpyHtoD(b, hb, sizeof hb));
	if (ex) {
		CUlaunchAttribute attr = {.id = 8}; /* CU_LAUNCH_ATTRIBUTE_PRIORITY */
		CUlaunchConfig cfg = {.gridDimX = N / 128, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1, .attrs = &attr, .numAttrs = 1};
		CHECK(cuLaunchKernelEx(&cfg, f, args, NULL));
		attr.id = 4; /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: clusters of two blocks */
		attr.value.clusterDim.x = 2, attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
		CHECK(cuLaunchKernelEx(&cfg, f, args, NULL));
		attr.id = 2; /* CU_LAUNCH_ATTRIBUTE_COOPERATIVE */
		attr.value.clusterDim.x = 1;
		CHECK(cuLaunchKernelEx(&cfg, f, args, NULL));
		attr.id = 7; /* CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY: not served */
		EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuLaunchKernelEx(&cfg, f, args, NULL));
	} else {
		CHECK(cuLaunchKernel(f, N / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
	}
	CHECK(cuMemcpyDtoH(hc, c, sizeof hc));
	for (int i = 0; i < N; i++)
		if (hc[i] != (float)i + 0.5f) FAIL("vadd: c[%d] = %f", i, hc[i]);
}

/* modules loads vadd three ways the runtime does: through the runtime
 * interface's fatbin wrapper, and as a lazy library whose kernel is a
 * function. */
static void modules(CUdevice dev, const char *dir) {
	typedef CUresult (*primary_t)(CUcontext *, CUdevice);
	typedef CUresult (*wrapper_t)(CUmodule *, const void *, void *, void *, unsigned int);
	struct { int magic, version; const void *data; const void *rest; } wrapper = {0x466243b1, 1, load_image(dir, "vadd"), NULL};
	void *const *rt = table(runtime_id);
	CUcontext ctx;
	CUmodule mod;
	CUfunction f;
	CUlibrary lib;
	CUkernel k;
	CUdeviceptr a, b, c, base;
	size_t size;
	unsigned int type = 0;
	CHECK(((primary_t)rt[2])(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(((wrapper_t)rt[6])(&mod, &wrapper, NULL, NULL, 0));
	CHECK(cuModuleGetFunction(&f, mod, "vadd"));
	CHECK(cuMemAlloc(&a, N * 4));
	CHECK(cuMemAlloc(&b, N * 4));
	CHECK(cuMemAlloc(&c, N * 4));
	vadd_check(f, a, b, c, 0);
	CHECK(cuLibraryLoadData(&lib, &wrapper, NULL, NULL, 0, NULL, NULL, 0));
	EXPECT(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel(&k, lib, "no_such_kernel"));
	CHECK(cuLibraryGetKernel(&k, lib, "vadd"));
	CHECK(cuKernelGetFunction(&f, k));
	vadd_check(f, a, b, c, 1);
	EXPECT(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&base, &size, mod, "vadd")); /* a PTX module has the variables its text declares */
	CHECK(cuPointerGetAttribute(&type, 2, b + 16)); /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
	CHECK(cuMemGetAddressRange_v2(&base, &size, b + 16));
	if (type != 2 || base != b || size != N * 4) FAIL("pointer: type %u, range %llx+%zu", type, base, size);
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttribute(&type, 2, (CUdeviceptr)(uintptr_t)&type));
	CHECK(cuLibraryUnload(lib));
	CHECK(cuModuleUnload(mod));
	printf("modules ok\n");
}

int main(int argc, char **argv) {
	CUdevice dev;
	const void *t = (const void *)&dev;
	CUuuid u;
	if (argc < 2) FAIL("usage: runtime_view KERNELDIR < procs");
	every_lookup();
	memcpy(u.bytes, unknown_id, 16);
	EXPECT(CUDA_ERROR_NOT_FOUND, cuGetExportTable(&t, &u));
	if (t != NULL) FAIL("an unknown table left its pointer set");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	integrity(dev);
	local_storage(dev);
	modules(dev, argv[1]);
	printf("runtime_view ok\n");
	return 0;
}
