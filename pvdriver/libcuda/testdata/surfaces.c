/* The surfaces frameworks reach beyond the driver samples' set: cooperative
 * launches (cuLaunchCooperativeKernel and cuLaunchKernelEx's COOPERATIVE
 * attribute, and a grid too large to be resident at once), host memory
 * registered with cuMemHostRegister (copies from and to it, its pointer
 * attributes, registering twice, unregistering), the pointer attributes
 * of cuMemHostAlloc's memory, and tensor maps (encoded by a GPU's driver,
 * refused by the software GPU; a tensor outside the program's memory is
 * refused by every node), and mapped host memory (cuMemHostGetDevicePointer:
 * a kernel reads and writes it, the host sees the kernel's writes after a
 * synchronisation and the kernel sees the host's before a launch). */
#include "cudaapi.h"

enum { CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720 };
enum { CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS = 16,
	CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMHOSTREGISTER_READ_ONLY = 8,
	CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
	CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14 };
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
	unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params);
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c);
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags);
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p);
CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *data);
CUresult cuTensorMapEncodeTiled(void *map, int dataType, unsigned int rank, void *global, const unsigned long long *dims,
	const unsigned long long *strides, const unsigned int *box, const unsigned int *elementStrides, int interleave,
	int swizzle, int l2Promotion, int oobFill);

static void count_call(void *data) { ++*(int *)data; }

#define N 8192

/* saxpy_check runs y = 2x + y with the launch `how` and checks every value. */
static void saxpy_check(CUfunction saxpy, CUdeviceptr x, CUdeviceptr y, float *host, int how) {
	float alpha = 2.0f;
	unsigned int n = N;
	void *params[] = {&x, &y, &alpha, &n};
	CUlaunchAttribute coop = {.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE, .value.i = 1};
	CUlaunchConfig cfg = {N / 256, 1, 1, 256, 1, 1, 0, NULL, &coop, 1};
	for (int i = 0; i < N; i++) host[i] = (float)i;
	CHECK(cuMemcpyHtoD(x, host, N * sizeof(float)));
	CHECK(cuMemsetD32(y, 0x3f800000, N)); /* 1.0f */
	if (how == 0) CHECK(cuLaunchCooperativeKernel(saxpy, N / 256, 1, 1, 256, 1, 1, 0, NULL, params));
	else CHECK(cuLaunchKernelEx(&cfg, saxpy, params, NULL));
	CHECK(cuMemcpyDtoH(host, y, N * sizeof(float)));
	for (int i = 0; i < N; i++)
		if (host[i] != 2.0f * (float)i + 1.0f) FAIL("cooperative saxpy (%d): y[%d] = %g, want %g", how, i, host[i], 2.0f * i + 1.0f);
}

static void cooperative(CUfunction saxpy, CUdeviceptr x, CUdeviceptr y, float *host) {
	int sms, per_sm;
	float alpha = 1.0f;
	unsigned int n = N;
	void *params[] = {&x, &y, &alpha, &n};
	int host_calls = 0;
	saxpy_check(saxpy, x, y, host, 0);
	saxpy_check(saxpy, x, y, host, 1);
	CHECK(cuLaunchKernel(saxpy, N / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
	CHECK(cuLaunchHostFunc(NULL, count_call, &host_calls));
	CHECK(cuCtxSynchronize());
	if (host_calls != 1) FAIL("a host function ran %d times, want once", host_calls);
	/* More blocks than the GPU holds at once: refused, the launch does not
	 * run, and the context carries on (not a sticky error). */
	CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
	CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, saxpy, 32, 0));
	CUresult r = cuLaunchCooperativeKernel(saxpy, (unsigned)(sms * per_sm + 1) * 64, 1, 1, 32, 1, 1, 0, NULL, params);
	if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
	if (r != CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) FAIL("a cooperative launch too large: %d, want %d", r, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
	CHECK(cuCtxSynchronize());
	/* Cluster attributes read back as set; cluster occupancy is the node's
	 * GPU's answer (the software GPU launches no clusters: 0). */
	int np = -1, clusters = -1;
	CHECK(cuFuncSetAttribute(saxpy, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
	CHECK(cuFuncGetAttribute(&np, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, saxpy));
	if (np != 1) FAIL("non-portable cluster size allowed: %d after setting 1", np);
	CUlaunchAttribute dim = {.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, .value.clusterDim = {2, 1, 1}};
	CUlaunchConfig shape = {N / 256, 1, 1, 256, 1, 1, 0, NULL, &dim, 1};
	CHECK(cuOccupancyMaxActiveClusters(&clusters, saxpy, &shape));
	if (clusters < 0 || (sms == 80 && clusters != 0)) FAIL("resident clusters of 2: %d", clusters);
	printf("cooperative launches: ok (clusters of 2 resident: %d)\n", clusters);
}

static void pointer_is(void *p, unsigned int want_type, CUcontext want_ctx, const char *what) {
	unsigned int type = 0;
	CUcontext ctx = NULL;
	CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p));
	CHECK(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)p));
	if (type != want_type || ctx != want_ctx) FAIL("%s: memory type %u in context %p, want %u in %p", what, type, (void *)ctx, want_type, (void *)want_ctx);
}

static void host_memory(CUcontext ctx, CUdeviceptr y) {
	float *pinned, *own = aligned_alloc(4096, N * sizeof(float)), *ro = aligned_alloc(4096, 4096);
	unsigned int access = 0, type = 0;
	if (own == NULL || ro == NULL) FAIL("out of memory");
	CHECK(cuMemHostAlloc((void **)&pinned, N * sizeof(float), 0));
	pointer_is(pinned, CU_MEMORYTYPE_HOST, ctx, "cuMemHostAlloc's memory");
	pointer_is((char *)pinned + 100, CU_MEMORYTYPE_HOST, ctx, "inside cuMemHostAlloc's memory");
	CHECK(cuMemHostRegister_v2(own, N * sizeof(float), 0));
	pointer_is(own + 17, CU_MEMORYTYPE_HOST, ctx, "registered memory");
	EXPECT(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister_v2(own + 1024, 4096, 0));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(own)); /* registered, not allocated by the driver */
	for (int i = 0; i < N; i++) own[i] = (float)(3 * i);
	CHECK(cuMemcpyHtoD(y, own, N * sizeof(float)));
	CHECK(cuMemcpyDtoH(pinned, y, N * sizeof(float)));
	for (int i = 0; i < N; i++)
		if (pinned[i] != (float)(3 * i)) FAIL("registered -> device -> pinned: [%d] = %g", i, pinned[i]);
	CHECK(cuMemHostRegister_v2(ro, 4096, CU_MEMHOSTREGISTER_READ_ONLY));
	CHECK(cuPointerGetAttribute(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, (CUdeviceptr)(uintptr_t)ro));
	if (!native() && access != 1) FAIL("read-only registered memory: access flags %u, want 1 (read)", access);
	CHECK(cuMemHostUnregister(ro));
	CHECK(cuMemHostUnregister(own));
	EXPECT(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(own));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)own));
	pointer_is((void *)(uintptr_t)y, CU_MEMORYTYPE_DEVICE, ctx, "device memory");
	CHECK(cuMemFreeHost(pinned));
	free(own);
	free(ro);
	printf("host memory: ok\n");
}

/* mapped_memory runs y = 2x + y with x, then y, in mapped host memory. */
static void mapped_memory(CUfunction saxpy, CUdeviceptr y) {
	float *m, alpha = 2.0f, *back = malloc(N * sizeof(float));
	unsigned int n = N;
	CUdeviceptr dm, dmid;
	if (back == NULL) FAIL("out of memory");
	CHECK(cuMemHostAlloc((void **)&m, N * sizeof(float), 0));
	for (int i = 0; i < N; i++) m[i] = (float)i;
	CHECK(cuMemHostGetDevicePointer_v2(&dm, m, 0));
	CHECK(cuMemHostGetDevicePointer_v2(&dmid, m + 100, 0));
	if (dmid != dm + 100 * sizeof(float)) FAIL("device pointer inside mapped memory: %llx, want %llx", dmid, dm + 400);
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer_v2(&dmid, m, 1));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer_v2(&dmid, back, 0)); /* not pinned */
	CHECK(cuMemsetD32(y, 0x3f800000, N)); /* 1.0f */
	void *read[] = {&dm, &y, &alpha, &n}; /* the kernel reads mapped memory */
	CHECK(cuLaunchKernel(saxpy, N / 256, 1, 1, 256, 1, 1, 0, NULL, read, NULL));
	CHECK(cuMemcpyDtoH(back, y, N * sizeof(float)));
	for (int i = 0; i < N; i++)
		if (back[i] != 2.0f * i + 1.0f) FAIL("a kernel reading mapped memory: y[%d] = %g, want %g", i, back[i], 2.0f * i + 1.0f);
	for (int i = 0; i < N; i += 2) m[i] = 10.0f; /* the host writes between launches: half of the buffer */
	void *write[] = {&y, &dm, &alpha, &n}; /* the kernel writes mapped memory: m = 2y + m */
	CHECK(cuLaunchKernel(saxpy, N / 256, 1, 1, 256, 1, 1, 0, NULL, write, NULL));
	CHECK(cuCtxSynchronize());
	for (int i = 0; i < N; i++) {
		float want = 2.0f * (2.0f * i + 1.0f) + (i % 2 == 0 ? 10.0f : (float)i);
		if (m[i] != want) FAIL("a kernel writing mapped memory: m[%d] = %g, want %g", i, m[i], want);
	}
	CHECK(cuMemsetD32(dm + 4 * sizeof(float), 0x40000000, 2)); /* 2.0f, by the device's address */
	CHECK(cuStreamSynchronize(NULL));
	if (m[3] == 2.0f || m[4] != 2.0f || m[5] != 2.0f || m[6] == 2.0f) FAIL("a memset of mapped memory: %g %g %g %g", m[3], m[4], m[5], m[6]);
	CHECK(cuMemsetD32((CUdeviceptr)(uintptr_t)(m + 8), 0x40400000, 1)); /* 3.0f, by the host's address (unified addressing) */
	CHECK(cuCtxSynchronize());
	if (m[8] != 3.0f || m[9] == 3.0f) FAIL("a memset of mapped memory by its host address: %g %g", m[8], m[9]);
	CUdeviceptr hm = (CUdeviceptr)(uintptr_t)m; /* the host's address as a kernel's argument (unified addressing) */
	void *by_host[] = {&y, &hm, &alpha, &n};
	for (int i = 0; i < N; i++) m[i] = 0.0f;
	CHECK(cuLaunchKernel(saxpy, N / 256, 1, 1, 256, 1, 1, 0, NULL, by_host, NULL));
	CHECK(cuCtxSynchronize());
	for (int i = 0; i < N; i++)
		if (m[i] != 2.0f * (2.0f * i + 1.0f)) FAIL("a kernel given mapped memory's host address: m[%d] = %g", i, m[i]);
	CHECK(cuMemFreeHost(m));
	free(back);
	printf("mapped host memory: ok\n");
}

/* tensor_maps encodes a 2-D float tensor map over x (N floats as 64 rows of
 * 128): a GPU's driver gives a map, the software GPU refuses it; either
 * way a tensor reaching past x, or of rank 0, is refused. */
static void tensor_maps(CUdeviceptr x) {
	_Alignas(64) unsigned char map[128] = {0};
	unsigned long long dims[2] = {128, N / 128}, strides[1] = {128 * sizeof(float)}, past[2] = {128, N / 128 + 1};
	unsigned int box[2] = {32, 8}, estrides[2] = {1, 1};
	void *base = (void *)(uintptr_t)x;
	int nonzero = 0;
	CUresult r = cuTensorMapEncodeTiled(map, 7 /* FLOAT32 */, 2, base, dims, strides, box, estrides, 0, 0, 0, 0);
	if (r == CUDA_SUCCESS) {
		for (int i = 0; i < 128; i++) nonzero |= map[i];
		if (!nonzero) FAIL("cuTensorMapEncodeTiled succeeded with an empty map");
	} else if (r != CUDA_ERROR_NOT_SUPPORTED) {
		FAIL("cuTensorMapEncodeTiled: %d, want a map or CUDA_ERROR_NOT_SUPPORTED", r);
	}
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuTensorMapEncodeTiled(map, 7, 2, base, past, strides, box, estrides, 0, 0, 0, 0));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuTensorMapEncodeTiled(map, 7, 0, base, dims, strides, box, estrides, 0, 0, 0, 0));
	printf("tensor maps: %s\n", r == CUDA_SUCCESS ? "encoded" : "not supported here");
}

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction saxpy;
	CUdeviceptr x, y;
	float *host = malloc(N * sizeof(float));
	if (argc < 2 || host == NULL) FAIL("usage: surfaces KERNELDIR");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "saxpy")));
	CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
	CHECK(cuMemAlloc(&x, N * sizeof(float)));
	CHECK(cuMemAlloc(&y, N * sizeof(float)));
	cooperative(saxpy, x, y, host);
	tensor_maps(x);
	checkpoint();
	host_memory(ctx, y);
	mapped_memory(saxpy, y);
	CHECK(cuCtxDestroy(ctx));
	printf("surfaces ok\n");
	return 0;
}
