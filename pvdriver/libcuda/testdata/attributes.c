/* Every device attribute, the device's identity, function attributes and
 * occupancy (with the program's own callback); all of it must read the
 * same after the checkpoint (where the test may fail the primary over). */
#include "cudaapi.h"

/* Features vgpuha's library does not serve read 0 through it, whatever the
 * GPU has (pvdriver/cuapi/driver.go, unservedFeatures): managed memory,
 * concurrent managed access, exporting memory handles (POSIX, Win32,
 * Win32 KMT, fabric), compression, GPUDirect RDMA with VMM, memory pools.
 * (Cluster launch, 120, cooperative launch, 95, host registration, 99, and
 * virtual memory management, 102 (vmm.c), are served.) */
static int unserved(int a) {
	return a == 83 || a == 89 || a == 103 || a == 104 || a == 105 || a == 107 || a == 110 || a == 115 || a == 128;
}

static int calls;
static size_t smem_for(int block) { calls++; return (size_t)block * 4; }

struct snapshot {
	int attrs[CU_DEVICE_ATTRIBUTE_MAX];
	char name[256];
	size_t total;
	CUuuid uuid;
	int major, minor, count, version;
};

static void take(struct snapshot *s, CUdevice dev) {
	memset(s, 0, sizeof *s);
	for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; a++) CHECK(cuDeviceGetAttribute(&s->attrs[a], a, dev));
	CHECK(cuDeviceGetName(s->name, sizeof s->name, dev));
	CHECK(cuDeviceTotalMem(&s->total, dev));
	CHECK(cuDeviceGetUuid(&s->uuid, dev));
	CHECK(cuDeviceComputeCapability(&s->major, &s->minor, dev));
	CHECK(cuDeviceGetCount(&s->count));
	CHECK(cuDriverGetVersion(&s->version));
}

int main(int argc, char **argv) {
	CUdevice dev, other;
	CUcontext ctx;
	CUmodule mod;
	CUfunction f;
	struct snapshot before, after;
	int v, can, grid, block, blocks;
	if (argc < 2) FAIL("usage: attributes KERNELDIR (images: VGTEST_IMAGE=ptx, cubin or fatbin)");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	take(&before, dev);
	if (before.count != 1 || before.total == 0 || before.name[0] == 0) FAIL("device: count %d, %zu bytes, name %s", before.count, before.total, before.name);
	if (before.attrs[CU_DEVICE_ATTRIBUTE_WARP_SIZE] != 32 || before.attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK] < 256 ||
	    before.attrs[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] < 1 || before.major != before.attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR])
		FAIL("implausible attributes");
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, NO_SUCH_DEVICE_ATTRIBUTE, dev));
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, 0, dev));
	EXPECT(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&other, 1));
	EXPECT(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetAttribute(&v, 1, 1));
	CHECK(cuDeviceCanAccessPeer(&can, dev, dev));
	CHECK(cuCtxCreate_v4(&ctx, NULL, 0, dev));
	CHECK(cuCtxGetDevice(&other));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "vadd")));
	CHECK(cuModuleGetFunction(&f, mod, "vadd"));
	CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
	if (v != before.attrs[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]) FAIL("function max threads %d", v);
	CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_PTX_VERSION, f));
	if (v <= 0 || (getenv("VGTEST_SIM") && v != 70)) FAIL("PTX version %d (the library's PTX is 7.0 for sm_70)", v);
	printf("vadd PTX version %d\n", v);
	CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
	CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
	if (v != 1024) FAIL("dynamic shared %d", v);
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuFuncGetAttribute(&v, 99, f));
	CHECK(cuOccupancyMaxPotentialBlockSize(&grid, &block, f, smem_for, 0, 0));
	if (calls == 0 || block <= 0 || block % 32 != 0 || grid <= 0) FAIL("occupancy: grid %d block %d after %d callbacks", grid, block, calls);
	CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, block, smem_for(block)));
	if (blocks <= 0) FAIL("active blocks %d", blocks);
	checkpoint();
	take(&after, dev);
	if (memcmp(&before, &after, sizeof before) != 0) FAIL("the device changed under the program");
	for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; a++)
		if (!unserved(a)) printf("attr %d = %d\n", a, after.attrs[a]);
	if (!getenv("VGTEST_NATIVE"))
		for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; a++)
			if (unserved(a) && after.attrs[a] != 0) FAIL("attribute %d announces a feature the library does not serve: %d", a, after.attrs[a]);
	CHECK(cuCtxDestroy(ctx));
	printf("attributes ok: %s, compute %d.%d, %zu bytes\n", after.name, after.major, after.minor, after.total);
	return 0;
}
