/* Driver API entries the CUDA runtime and the libraries over it (cuBLAS,
 * PyTorch) call beyond the driver-API samples' set: libraries and kernels,
 * launches with a config, pointer attributes, stream capture state, the
 * PCI bus id. NVIDIA's names and C signatures (CUDA Driver API reference,
 * cuda.h of CUDA 13); each hands its arguments to the Go entries in
 * glue_runtime_cgo.go or to the ones exports.c uses. */
#include <stdio.h>
#include <string.h>
#include "vgcuda.h"
#include "_cgo_export.h"
#include "runtime.h"

#define H(x) ((uintptr_t)(x))
#define OUT(p) ((uintptr_t *)(p))


/* ---- Libraries and kernels (CUDA 12): a library is a module, its
 * kernels are its functions (pvdriver/cuapi/runtime.go). JIT and library
 * options do not apply to the images this driver loads. ---- */
CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo) {
	(void)jo, (void)jv, (void)njo, (void)lo, (void)lv, (void)nlo;
	return vg_traced(__func__, vgLibraryLoadData(OUT(lib), (void *)code));
}
CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo) {
	(void)jo, (void)jv, (void)njo, (void)lo, (void)lv, (void)nlo;
	return vg_traced(__func__, vgModuleLoad(OUT(lib), (char *)path));
}
CUresult cuLibraryUnload(CUlibrary lib) { return vg_traced(__func__, vgModuleUnload(H(lib))); }
CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib) { if (!m || !lib) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE); *m = (CUmodule)lib; return vg_traced(__func__, CUDA_SUCCESS); }
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name) { return vg_traced(__func__, vgModuleGetFunction(OUT(k), H(lib), (char *)name)); }
CUresult cuLibraryGetGlobal(CUdeviceptr *p, size_t *n, CUlibrary lib, const char *name) { return vg_traced(__func__, vgModuleGetGlobal(p, n, H(lib), (char *)name)); }
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
	const char *name;
	CUresult r = f ? vg_ans_func_name((char **)&name, H(k)) : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) *f = (CUfunction)k;
	return vg_traced(__func__, r);
}
CUresult cuKernelGetName(const char **name, CUkernel k) { return vg_traced(__func__, vg_ans_func_name((char **)name, H(k))); }
CUresult cuKernelGetAttribute(int *v, CUfunction_attribute attr, CUkernel k, CUdevice dev) { return vg_traced(__func__, dev ? CUDA_ERROR_INVALID_DEVICE : vg_ans_func_attr(v, attr, H(k))); }
CUresult cuKernelSetAttribute(CUfunction_attribute attr, int v, CUkernel k, CUdevice dev) { return vg_traced(__func__, dev ? CUDA_ERROR_INVALID_DEVICE : vg_ans_func_set_attr(H(k), attr, v)); }
CUresult cuKernelSetCacheConfig(CUkernel k, CUfunc_cache c, CUdevice dev) { return vg_traced(__func__, dev ? CUDA_ERROR_INVALID_DEVICE : cuFuncSetCacheConfig((CUfunction)k, c)); }

/* ---- cuLaunchKernelEx: the config's shape, stream, cluster shape and
 * COOPERATIVE (every block resident at once); of its other attributes, those that ask nothing this driver must do are
 * taken (IGNORE; CLUSTER_SCHEDULING_POLICY_PREFERENCE, a hint; PRIORITY:
 * streams have one priority here; PROGRAMMATIC_STREAM_SERIALIZATION, which
 * lets a kernel start before the one before it ends: running them in order
 * is always allowed, and a kernel's grid-dependency wait then returns at
 * once), any other is refused and named with VGPUHA_DEBUG=1. ---- */
int vg_launch_attr_ok(int id) {
	switch (id) {
	case VG_LAUNCH_ATTR_IGNORE:
	case VG_LAUNCH_ATTR_COOPERATIVE:
	case VG_LAUNCH_ATTR_CLUSTER_DIMENSION:
	case VG_LAUNCH_ATTR_CLUSTER_SCHEDULING_POLICY:
	case VG_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION:
	case VG_LAUNCH_ATTR_PRIORITY: return 1;
	}
	return 0;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
	unsigned int i, cx = 0, cy = 0, cz = 0, coop = 0;
	if (c == NULL || (c->numAttrs > 0 && c->attrs == NULL)) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	for (i = 0; i < c->numAttrs; i++) {
		if (!vg_launch_attr_ok(c->attrs[i].id)) {
			if (vg_debug_enabled()) fprintf(stderr, "vgpuha libcuda: cuLaunchKernelEx: launch attribute %d is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", c->attrs[i].id);
			return vg_traced(__func__, CUDA_ERROR_NOT_SUPPORTED);
		}
		if (c->attrs[i].id == VG_LAUNCH_ATTR_CLUSTER_DIMENSION) {
			cx = c->attrs[i].value.clusterDim.x;
			cy = c->attrs[i].value.clusterDim.y;
			cz = c->attrs[i].value.clusterDim.z;
		}
		if (c->attrs[i].id == VG_LAUNCH_ATTR_COOPERATIVE) coop = c->attrs[i].value.i != 0;
	}
	return vg_traced(__func__, vgLaunchKernel(H(f), c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
		c->sharedMemBytes, H(c->hStream), params, extra, cx, cy, cz, coop));
}

/* ---- Cluster occupancy: the config's shape and cluster dimension go to
 * the node's GPU driver (pvdriver/cuapi/occupancy.go); any other attribute
 * changes nothing asked. kind: 2 resident clusters, 3 largest cluster. ---- */
static CUresult vg_cluster_occupancy(int *n, CUfunction f, const CUlaunchConfig *c, int kind) {
	unsigned int i, cx = 0, cy = 0, cz = 0;
	if (n == NULL || c == NULL || (c->numAttrs > 0 && c->attrs == NULL)) return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < c->numAttrs; i++)
		if (c->attrs[i].id == VG_LAUNCH_ATTR_CLUSTER_DIMENSION) {
			cx = c->attrs[i].value.clusterDim.x;
			cy = c->attrs[i].value.clusterDim.y;
			cz = c->attrs[i].value.clusterDim.z;
		}
	return vgOccupancyClusters(n, H(f), kind, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
		c->sharedMemBytes, cx, cy, cz);
}
CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c) { return vg_traced(__func__, vg_cluster_occupancy(n, f, c, 2)); }
CUresult cuOccupancyMaxPotentialClusterSize(int *n, CUfunction f, const CUlaunchConfig *c) { return vg_traced(__func__, vg_cluster_occupancy(n, f, c, 3)); }

/* ---- Pointer attributes (CUpointer_attribute): what the driver knows of
 * an address — device memory the process allocated, host memory it got
 * from cuMemAllocHost/cuMemHostAlloc or registered (with the context that
 * pinned it, as CUDA reports it), or neither. Booleans are written as
 * unsigned ints, as NVIDIA's driver writes them: callers (XLA, cudart)
 * read them into uninitialised unsigned ints, where one byte would leave
 * the rest as whatever was on the stack (cudart could then take pinned
 * host memory for managed memory: the likely reason PyTorch's
 * is_pinned() read False). ---- */
enum {
	VG_PA_CONTEXT = 1, VG_PA_MEMORY_TYPE = 2, VG_PA_DEVICE_POINTER = 3, VG_PA_HOST_POINTER = 4, VG_PA_SYNC_MEMOPS = 6,
	VG_PA_BUFFER_ID = 7, VG_PA_IS_MANAGED = 8, VG_PA_DEVICE_ORDINAL = 9, VG_PA_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	VG_PA_RANGE_START_ADDR = 11, VG_PA_RANGE_SIZE = 12, VG_PA_MAPPED = 13, VG_PA_ALLOWED_HANDLE_TYPES = 14,
	VG_PA_IS_GPU_DIRECT_RDMA_CAPABLE = 15, VG_PA_ACCESS_FLAGS = 16, VG_PA_MEMPOOL_HANDLE = 17, VG_PA_MAPPING_SIZE = 18,
	VG_PA_MAPPING_BASE_ADDR = 19, VG_PA_MEMORY_BLOCK_ID = 20,
};
/* CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ and _READWRITE. */
enum { VG_ACCESS_READ = 1, VG_ACCESS_READWRITE = 3 };
struct vg_pointer { unsigned int kind; uintptr_t ctx; CUdeviceptr base; size_t size; unsigned int read_only; };

/* vg_pointer_attr writes one attribute of p (known: described by d) to
 * data; an unknown address has only a memory type (0) and no context. */
static CUresult vg_pointer_attr(void *data, CUpointer_attribute attr, CUdeviceptr p, const struct vg_pointer *d) {
	int known = d->kind != 0, device = d->kind == 2;
	switch (attr) {
	case VG_PA_MEMORY_TYPE: *(unsigned int *)data = d->kind; return CUDA_SUCCESS;
	case VG_PA_CONTEXT: *(uintptr_t *)data = d->ctx; return CUDA_SUCCESS;
	case VG_PA_IS_MANAGED: *(unsigned int *)data = 0; return CUDA_SUCCESS;
	case VG_PA_IS_LEGACY_CUDA_IPC_CAPABLE: *(unsigned int *)data = 0; return CUDA_SUCCESS;
	}
	if (!known) return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case VG_PA_DEVICE_POINTER: *(CUdeviceptr *)data = p; return device ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	case VG_PA_HOST_POINTER: *(void **)data = (void *)(uintptr_t)p; return device ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	case VG_PA_SYNC_MEMOPS: *(unsigned int *)data = 1; return CUDA_SUCCESS;
	case VG_PA_BUFFER_ID: *(unsigned long long *)data = d->base; return CUDA_SUCCESS;
	case VG_PA_DEVICE_ORDINAL: *(int *)data = 0; return CUDA_SUCCESS;
	case VG_PA_RANGE_START_ADDR: *(CUdeviceptr *)data = d->base; return CUDA_SUCCESS;
	case VG_PA_RANGE_SIZE: *(size_t *)data = d->size; return CUDA_SUCCESS;
	case VG_PA_MAPPED: *(unsigned int *)data = 1; return CUDA_SUCCESS;
	case VG_PA_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; return CUDA_SUCCESS; /* no handle exports */
	case VG_PA_IS_GPU_DIRECT_RDMA_CAPABLE: *(unsigned int *)data = 0; return CUDA_SUCCESS;
	case VG_PA_ACCESS_FLAGS: *(unsigned int *)data = d->read_only ? VG_ACCESS_READ : VG_ACCESS_READWRITE; return CUDA_SUCCESS;
	case VG_PA_MEMPOOL_HANDLE: *(void **)data = NULL; return CUDA_SUCCESS;
	case VG_PA_MAPPING_SIZE: *(size_t *)data = d->size; return CUDA_SUCCESS;
	case VG_PA_MAPPING_BASE_ADDR: *(void **)data = (void *)(uintptr_t)d->base; return CUDA_SUCCESS;
	case VG_PA_MEMORY_BLOCK_ID: *(unsigned long long *)data = d->base; return CUDA_SUCCESS;
	}
	if (vg_debug_enabled()) fprintf(stderr, "vgpuha libcuda: pointer attribute %d is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", attr);
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
	struct vg_pointer d;
	CUresult r;
	if (data == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	if ((r = vgPointerInfo(p, &d.kind, &d.ctx, &d.base, &d.size, &d.read_only)) != CUDA_SUCCESS) return vg_traced(__func__, r);
	if (vg_debug_enabled() > 1) fprintf(stderr, "vgpuha libcuda: cuPointerGetAttribute %#llx attribute %d (kind %u)\n", (unsigned long long)p, attr, d.kind);
	if (d.kind == 0) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE); /* memory the driver does not know */
	return vg_traced(__func__, vg_pointer_attr(data, attr, p, &d));
}

/* cuPointerGetAttributes answers every attribute; for an address the
 * driver does not know, those that need one are left alone, as CUDA does. */
CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p) {
	struct vg_pointer d;
	unsigned int i;
	CUresult r;
	if (n == 0 || attrs == NULL || data == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	if ((r = vgPointerInfo(p, &d.kind, &d.ctx, &d.base, &d.size, &d.read_only)) != CUDA_SUCCESS) return vg_traced(__func__, r);
	for (i = 0; i < n; i++) {
		if (data[i] == NULL) continue;
		r = vg_pointer_attr(data[i], attrs[i], p, &d);
		if (vg_debug_enabled() > 1)
			fprintf(stderr, "vgpuha libcuda: cuPointerGetAttributes %#llx attribute %d: %d (kind %u)\n", (unsigned long long)p, attrs[i], r, d.kind);
		if (r == CUDA_ERROR_NOT_SUPPORTED) return vg_traced(__func__, r);
	}
	return vg_traced(__func__, CUDA_SUCCESS);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	struct vg_pointer d;
	CUresult r = vgPointerInfo(p, &d.kind, &d.ctx, &d.base, &d.size, &d.read_only);
	if (r != CUDA_SUCCESS) return vg_traced(__func__, r);
	if (d.kind != 2) return vg_traced(__func__, CUDA_ERROR_NOT_FOUND);
	if (base) *base = d.base;
	if (size) *size = d.size;
	return vg_traced(__func__, CUDA_SUCCESS);
}

/* ---- The calling thread's stream capture mode, kept and exchanged as
 * CUDA does (capture itself: exports_graph.c). ---- */
static __thread CUstreamCaptureMode vg_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
	CUstreamCaptureMode old;
	if (mode == NULL || *mode < 0 || *mode > 2) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	old = vg_capture_mode, vg_capture_mode = *mode, *mode = old;
	return vg_traced(__func__, CUDA_SUCCESS);
}
/* ---- The device's PCI location, as cuDeviceGetPCIBusId formats it. ---- */
CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
	int domain, bus, slot;
	CUresult r;
	if (id == NULL || len <= 0) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	if ((r = vgDeviceGetAttribute(&domain, 50, dev)) != CUDA_SUCCESS || (r = vgDeviceGetAttribute(&bus, 33, dev)) != CUDA_SUCCESS ||
	    (r = vgDeviceGetAttribute(&slot, 34, dev)) != CUDA_SUCCESS)
		return vg_traced(__func__, r);
	snprintf(id, (size_t)len, "%04x:%02x:%02x.0", domain, bus, slot);
	return vg_traced(__func__, CUDA_SUCCESS);
}
