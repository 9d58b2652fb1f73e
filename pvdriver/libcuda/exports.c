/* The exported CUDA driver API: NVIDIA's symbol names and C signatures
 * (CUDA Driver API reference, cuda.h of CUDA 13), one line per entry, each
 * handing its arguments to a Go entry in glue_cgo.go / glue_mem_cgo.go.
 * Handles cross to Go as uintptr_t; CUR is the calling thread's current
 * context. Also here: the per-thread context stack, the unsupported
 * entries (stubs.h) and cuGetProcAddress's table. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vgcuda.h"
#include "_cgo_export.h"

#define H(x) ((uintptr_t)(x))
#define OUT(p) ((uintptr_t *)(p))

/* ---- The current-context stack of the calling thread. ---- */
#define VG_CTX_DEPTH 64
static __thread uintptr_t vg_ctx_stack[VG_CTX_DEPTH];
static __thread int vg_ctx_n;
uintptr_t vg_ctx_top(void) { return vg_ctx_n ? vg_ctx_stack[vg_ctx_n - 1] : 0; }
void vg_ctx_set_top(uintptr_t c) { if (vg_ctx_n) vg_ctx_stack[vg_ctx_n - 1] = c; else if (c) vg_ctx_stack[vg_ctx_n++] = c; }
int vg_ctx_push(uintptr_t c) { if (vg_ctx_n == VG_CTX_DEPTH) return -1; vg_ctx_stack[vg_ctx_n++] = c; return 0; }
uintptr_t vg_ctx_pop(void) { return vg_ctx_n ? vg_ctx_stack[--vg_ctx_n] : 0; }

/* The session ends with the process (the primary frees it at once). */
static pthread_once_t vg_exit_once = PTHREAD_ONCE_INIT;
static void vg_at_exit(void) { vgShutdown(); }
static void vg_register_exit(void) { atexit(vg_at_exit); }

/* ---- Initialisation, version, devices. ---- */
CUresult cuInit(unsigned int flags) { CUresult r = vgInit(flags); if (r == CUDA_SUCCESS) pthread_once(&vg_exit_once, vg_register_exit); return r; }
CUresult cuDriverGetVersion(int *v) { return vgDriverGetVersion(v); }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) { return vgDeviceGet(dev, ordinal); }
CUresult cuDeviceGetCount(int *n) { return vgDeviceGetCount(n); }
CUresult cuDeviceGetName(char *name, int len, CUdevice dev) { return vgDeviceGetName(name, len, dev); }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice dev) { return vgDeviceGetAttribute(v, attr, dev); }
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { return vgDeviceTotalMem(bytes, dev); }
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return vgDeviceGetUuid(uuid, dev); }
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return vgDeviceGetUuid(uuid, dev); }
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) { return vgDeviceCanAccessPeer(can, dev, peer); }
CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) { return vgDeviceComputeCapability(major, minor, dev); }

/* ---- Contexts. ---- */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { return vgCtxCreate(OUT(pctx), flags, dev, 0); }
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) { return vgCtxCreate(OUT(pctx), flags, dev, p != NULL && n > 0); }
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev) { return vgCtxCreate(OUT(pctx), flags, dev, p != NULL && (p->numExecAffinityParams > 0 || p->cigParams != NULL)); }
CUresult cuCtxDestroy_v2(CUcontext ctx) { if (ctx != NULL) vg_cls_drop(H(ctx)); return vgCtxDestroy(H(ctx)); }
CUresult cuCtxSetCurrent(CUcontext ctx) { return vgCtxSetCurrent(H(ctx)); }
CUresult cuCtxGetCurrent(CUcontext *pctx) { return vgCtxGetCurrent(OUT(pctx)); }
CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return vgCtxPushCurrent(H(ctx)); }
CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { return vgCtxPopCurrent(OUT(pctx)); }
/* The first versions (CUDA 2.0) by their own names: cuDNN's runtime-compiled
 * engines bind these with dlsym and give up without them; their arguments
 * are _v2's. */
CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }
CUresult cuCtxSynchronize(void) { return vgCtxSynchronize(); }
CUresult cuCtxGetDevice(CUdevice *dev) { return vg_ans_ctx_device(dev); }
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { return vgPrimaryCtxRetain(OUT(pctx), dev); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { uintptr_t p = vgPrimaryCtxHandle(); CUresult r = vgPrimaryCtxRelease(dev); if (r == CUDA_SUCCESS && p && !vgPrimaryCtxHandle()) vg_cls_drop(p); return r; }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { uintptr_t p = vgPrimaryCtxHandle(); if (p) vg_cls_drop(p); return vgPrimaryCtxReset(dev); }
/* The first versions of release and reset (CUDA 7.0) behave as _v2 here. */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return vgPrimaryCtxSetFlags(dev, flags); }
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) { return vg_ans_primary_state(dev, flags, active); }
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) { return vgPrimaryCtxSetFlags(dev, flags); }
CUresult cuCtxGetLimit(size_t *v, CUlimit limit) { return vgCtxGetLimit(v, limit); }
CUresult cuCtxSetLimit(CUlimit limit, size_t v) { return vgCtxSetLimit(limit, v); }
CUresult cuCtxGetFlags(unsigned int *flags) { return vgCtxGetFlags(flags); }
CUresult cuCtxSetFlags(unsigned int flags) { return vgCtxSetFlags(flags); }
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) { uintptr_t c; CUresult r = id ? vg_ans_ctx_live(H(ctx), &c) : CUDA_ERROR_INVALID_VALUE; if (r == CUDA_SUCCESS) *id = c; return r; }
CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *v) { uintptr_t c; CUresult r = v ? vg_ans_ctx_live(H(ctx), &c) : CUDA_ERROR_INVALID_VALUE; if (r == CUDA_SUCCESS) *v = 3020; return r; }
/* Cache and shared-memory preferences are hints CUDA may ignore; this
 * driver has one configuration (CU_FUNC_CACHE_PREFER_NONE, default bank size). */
CUresult cuCtxGetCacheConfig(CUfunc_cache *c) { if (!c) return CUDA_ERROR_INVALID_VALUE; *c = 0; return CUDA_SUCCESS; }
CUresult cuCtxSetCacheConfig(CUfunc_cache c) { return c >= 0 && c <= 3 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuCtxGetSharedMemConfig(CUsharedconfig *c) { if (!c) return CUDA_ERROR_INVALID_VALUE; *c = 0; return CUDA_SUCCESS; }
CUresult cuCtxSetSharedMemConfig(CUsharedconfig c) { return c >= 0 && c <= 2 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
/* Streams have one priority here: the range is [0, 0]. */
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { if (least) *least = 0; if (greatest) *greatest = 0; return CUDA_SUCCESS; }

/* ---- Memory. ---- */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return vgMemAlloc(p, n); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem) { return vgMemAllocPitch(p, pitch, w, h, elem); }
CUresult cuMemFree_v2(CUdeviceptr p) { return vgMemFree(p); }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) { return vgMemGetInfo(free, total); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return vgMemcpyHtoD(dst, (void *)src, n, 0, 0); }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return vgMemcpyDtoH(dst, src, n, 0); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { return vgMemcpyDtoD(dst, src, n, 0, 0); }
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return vgMemcpy(dst, src, (void *)(uintptr_t)dst, (void *)(uintptr_t)src, n, 0, 0); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) { return vgMemcpyHtoD(dst, (void *)src, n, H(s), 1); }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) { return vgMemcpyDtoH(dst, src, n, H(s)); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return vgMemcpyDtoD(dst, src, n, H(s), 1); }
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return vgMemcpy(dst, src, (void *)(uintptr_t)dst, (void *)(uintptr_t)src, n, H(s), 1); }
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) { return vgMemset(dst, 1, v, n, 0, 0); }
CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n) { return vgMemset(dst, 2, v, n, 0, 0); }
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) { return vgMemset(dst, 4, v, n, 0, 0); }
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { return vgMemset(dst, 1, v, n, H(s), 1); }
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s) { return vgMemset(dst, 2, v, n, H(s), 1); }
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) { return vgMemset(dst, 4, v, n, H(s), 1); }
CUresult cuMemAllocHost_v2(void **pp, size_t n) { return vgMemAllocHost(pp, n); }
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags) { return flags & ~7u ? CUDA_ERROR_INVALID_VALUE : vgMemAllocHost(pp, n); }
CUresult cuMemFreeHost(void *p) { return vgMemFreeHost(p); }
/* vgpuha's extension (vgpuha.h): device memory mapped into the program. */
CUresult vgpuhaMemMapAperture(CUdeviceptr *dptr, void **host, size_t bytes, unsigned int kind) { return vgMemMapAperture(dptr, host, bytes, kind); }
CUresult vgpuhaMemUnmapAperture(CUdeviceptr dptr) { return vgMemUnmapAperture(dptr); }

/* ---- Modules and launches. ---- */
CUresult cuModuleLoad(CUmodule *m, const char *fname) { return vgModuleLoad(OUT(m), (char *)fname); }
CUresult cuModuleLoadData(CUmodule *m, const void *image) { return vgModuleLoadData(OUT(m), (void *)image); }
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *opts, void **vals) { return vgModuleLoadData(OUT(m), (void *)image); }
CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatCubin) { return vgModuleLoadData(OUT(m), (void *)fatCubin); }
CUresult cuModuleUnload(CUmodule m) { return vgModuleUnload(H(m)); }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { return vgModuleGetFunction(OUT(f), H(m), (char *)name); }
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *n, CUmodule m, const char *name) { return vgModuleGetGlobal(p, n, H(m), (char *)name); }
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params, void **extra) { return vgLaunchKernel(H(f), gx, gy, gz, bx, by, bz, shared, H(s), params, extra, 0, 0, 0, 0); }
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params) { return vgLaunchKernel(H(f), gx, gy, gz, bx, by, bz, shared, H(s), params, NULL, 0, 0, 0, 1); }
CUresult cuFuncGetAttribute(int *v, CUfunction_attribute attr, CUfunction f) { return vg_ans_func_attr(v, attr, H(f)); }
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int v) { return vg_ans_func_set_attr(H(f), attr, v); }
CUresult cuFuncGetName(const char **name, CUfunction f) { return vg_ans_func_name((char **)name, H(f)); }
CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size) { return vgFuncGetParamInfo(H(f), index, offset, size); }
CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) { const char *n; CUresult r = vg_ans_func_name((char **)&n, H(f)); return r != CUDA_SUCCESS ? r : c >= 0 && c <= 3 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
/* Modules load whole and at once here (CU_MODULE_EAGER_LOADING). */
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) { if (!mode) return CUDA_ERROR_INVALID_VALUE; *mode = 1; return CUDA_SUCCESS; }
CUresult cuFuncIsLoaded(int *state, CUfunction f) { const char *n; CUresult r = state ? vg_ans_func_name((char **)&n, H(f)) : CUDA_ERROR_INVALID_VALUE; if (r == CUDA_SUCCESS) *state = 1; return r; }
CUresult cuFuncLoad(CUfunction f) { const char *n; return vg_ans_func_name((char **)&n, H(f)); }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int bs, size_t smem) { return vgOccupancyMaxActiveBlocks(n, H(f), bs, smem, 0); }
CUresult cuOccupancyMaxPotentialBlockSize(int *minGrid, int *bs, CUfunction f, CUoccupancyB2DSize cb, size_t smem, int limit) { return vgOccupancyMaxPotentialBlockSize(minGrid, bs, H(f), cb, smem, limit); }
/* Clusters (cuOccupancyMaxActiveClusters, cuOccupancyMaxPotentialClusterSize)
 * are asked with a launch config: exports_runtime.c. */
CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *n, CUfunction f, int numBlocks, int blockSize) { return vgOccupancyAvailableDynamicSMem(n, H(f), numBlocks, blockSize); }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, CUfunction f, int bs, size_t smem, unsigned int flags) { return flags & ~1u ? CUDA_ERROR_INVALID_VALUE : vgOccupancyMaxActiveBlocks(n, H(f), bs, smem, flags); }
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGrid, int *bs, CUfunction f, CUoccupancyB2DSize cb, size_t smem, int limit, unsigned int flags) { return flags & ~1u ? CUDA_ERROR_INVALID_VALUE : vgOccupancyMaxPotentialBlockSize(minGrid, bs, H(f), cb, smem, limit); }

/* ---- Streams and events. ---- */
CUresult cuStreamCreate(CUstream *s, unsigned int flags) { return vgStreamCreate(OUT(s), flags); }
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) { (void)priority; return vgStreamCreate(OUT(s), flags); }
CUresult cuStreamGetPriority(CUstream s, int *p) { CUresult r = p ? vgStreamInfo(H(s), NULL, NULL) : CUDA_ERROR_INVALID_VALUE; if (r == CUDA_SUCCESS) *p = 0; return r; }
CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) { return flags ? vgStreamInfo(H(s), flags, NULL) : CUDA_ERROR_INVALID_VALUE; }
CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx) { return ctx ? vgStreamInfo(H(s), NULL, OUT(ctx)) : CUDA_ERROR_INVALID_VALUE; }
CUresult cuStreamGetId(CUstream s, unsigned long long *id) { CUresult r = id ? vgStreamInfo(H(s), NULL, NULL) : CUDA_ERROR_INVALID_VALUE; if (r == CUDA_SUCCESS) *id = H(s); return r; }
CUresult cuStreamDestroy_v2(CUstream s) { return vgStreamDestroy(H(s)); }
CUresult cuStreamSynchronize(CUstream s) { return vgStreamSynchronize(H(s)); }
CUresult cuStreamQuery(CUstream s) { return vgStreamSynchronize(H(s)); }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) { return vgStreamWaitEvent(H(s), H(e), flags); }
CUresult cuEventCreate(CUevent *e, unsigned int flags) { return vgEventCreate(OUT(e), flags); }
CUresult cuEventRecord(CUevent e, CUstream s) { return vgEventRecord(H(e), H(s)); }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) { return flags & ~1u ? CUDA_ERROR_INVALID_VALUE : vgEventRecord(H(e), H(s)); }
CUresult cuEventQuery(CUevent e) { return vgEventQuery(H(e)); }
CUresult cuEventSynchronize(CUevent e) { return vgEventQuery(H(e)); }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return vgEventElapsedTime(ms, H(a), H(b)); }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return vgEventElapsedTime(ms, H(a), H(b)); }
CUresult cuEventDestroy_v2(CUevent e) { return vgEventDestroy(H(e)); }

/* ---- Errors. ---- */
CUresult cuGetErrorName(CUresult r, const char **s) { return vgGetErrorName(r, (char **)s); }
CUresult cuGetErrorString(CUresult r, const char **s) { return vgGetErrorString(r, (char **)s); }

/* ---- Entries this library does not serve. ---- */
static void vg_unsupported(const char *name, int *said) {
	if (!__atomic_exchange_n(said, 1, __ATOMIC_RELAXED))
		fprintf(stderr, "vgpuha libcuda: %s is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", name);
}
#define STUB(base, sym) CUresult sym(void) { static int said; vg_unsupported(#sym, &said); return CUDA_ERROR_NOT_SUPPORTED; }
#define DLSYM_STUB(sym) STUB(sym, sym)
#include "stubs.h"
#undef DLSYM_STUB
#undef STUB

/* ---- cuGetProcAddress: a name and the CUDA version the caller was built
 * for give the entry that version's cuda.h maps the name to: the row with
 * the highest version at or below the request. ---- */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *status);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
struct vg_proc { const char *name; int version; void *fn; };
#include "runtime.h"
#define E(name, version, sym) { #name, version, (void *)sym },
#define STUB(base, sym) { #base, 0, (void *)sym },
#define DLSYM_STUB(sym)
static const struct vg_proc vg_procs[] = {
	E(cuInit, 2000, cuInit) E(cuDriverGetVersion, 2020, cuDriverGetVersion) E(cuDeviceGet, 2000, cuDeviceGet)
	E(cuDeviceGetCount, 2000, cuDeviceGetCount) E(cuDeviceGetName, 2000, cuDeviceGetName)
	E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute) E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)
	E(cuDeviceGetUuid, 9020, cuDeviceGetUuid) E(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2)
	E(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer) E(cuDeviceComputeCapability, 2000, cuDeviceComputeCapability)
	E(cuCtxCreate, 3020, cuCtxCreate_v2) E(cuCtxCreate, 11040, cuCtxCreate_v3) E(cuCtxCreate, 12050, cuCtxCreate_v4)
	E(cuCtxDestroy, 4000, cuCtxDestroy_v2) E(cuCtxSetCurrent, 4000, cuCtxSetCurrent) E(cuCtxGetCurrent, 4000, cuCtxGetCurrent)
	E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2) E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)
	E(cuCtxSynchronize, 2000, cuCtxSynchronize) E(cuCtxGetDevice, 2000, cuCtxGetDevice)
	E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain) E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)
	E(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2)
	E(cuMemAlloc, 3020, cuMemAlloc_v2) E(cuMemAllocPitch, 3020, cuMemAllocPitch_v2) E(cuMemFree, 3020, cuMemFree_v2)
	E(cuMemGetInfo, 3020, cuMemGetInfo_v2) E(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2) E(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2)
	E(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2) E(cuMemcpy, 4000, cuMemcpy) E(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2)
	E(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2) E(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2)
	E(cuMemcpyAsync, 4000, cuMemcpyAsync) E(cuMemsetD8, 3020, cuMemsetD8_v2) E(cuMemsetD16, 3020, cuMemsetD16_v2)
	E(cuMemsetD32, 3020, cuMemsetD32_v2) E(cuMemsetD8Async, 3020, cuMemsetD8Async) E(cuMemsetD16Async, 3020, cuMemsetD16Async)
	E(cuMemsetD32Async, 3020, cuMemsetD32Async) E(cuMemAllocHost, 3020, cuMemAllocHost_v2) E(cuMemHostAlloc, 2020, cuMemHostAlloc)
	E(cuMemFreeHost, 2000, cuMemFreeHost) E(cuMemHostRegister, 4000, cuMemHostRegister) E(cuMemHostRegister, 6050, cuMemHostRegister_v2)
	E(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2)
	E(cuMemHostUnregister, 4000, cuMemHostUnregister)
	E(cuModuleLoad, 2000, cuModuleLoad) E(cuModuleLoadData, 2000, cuModuleLoadData) E(cuModuleLoadDataEx, 2010, cuModuleLoadDataEx)
	E(cuModuleLoadFatBinary, 2000, cuModuleLoadFatBinary) E(cuModuleUnload, 2000, cuModuleUnload)
	E(cuModuleGetFunction, 2000, cuModuleGetFunction) E(cuModuleGetGlobal, 3020, cuModuleGetGlobal_v2)
	E(cuLaunchKernel, 4000, cuLaunchKernel) E(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel) E(cuFuncGetAttribute, 2020, cuFuncGetAttribute) E(cuFuncSetAttribute, 9000, cuFuncSetAttribute)
	E(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, cuOccupancyMaxActiveBlocksPerMultiprocessor)
	E(cuOccupancyMaxPotentialBlockSize, 6050, cuOccupancyMaxPotentialBlockSize)
	E(cuStreamCreate, 2000, cuStreamCreate) E(cuStreamDestroy, 4000, cuStreamDestroy_v2) E(cuStreamSynchronize, 2000, cuStreamSynchronize)
	E(cuStreamQuery, 2000, cuStreamQuery) E(cuStreamWaitEvent, 3020, cuStreamWaitEvent) E(cuEventCreate, 2000, cuEventCreate)
	E(cuEventRecord, 2000, cuEventRecord) E(cuEventQuery, 2000, cuEventQuery) E(cuEventSynchronize, 2000, cuEventSynchronize)
	E(cuEventElapsedTime, 2000, cuEventElapsedTime) E(cuEventElapsedTime, 12080, cuEventElapsedTime_v2)
	E(cuEventDestroy, 4000, cuEventDestroy_v2) E(cuGetErrorName, 6000, cuGetErrorName) E(cuGetErrorString, 6000, cuGetErrorString)
	E(cuGetProcAddress, 11030, cuGetProcAddress) E(cuGetProcAddress, 12000, cuGetProcAddress_v2)
	E(cuGetExportTable, 3000, cuGetExportTable)
	/* What the CUDA runtime and the libraries over it call (exports_runtime.c). */
	E(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState) E(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2)
	E(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags) E(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease)
	E(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset) E(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags)
	/* Stream capture and graphs (exports_graph.c). */
	E(cuStreamBeginCapture, 10000, cuStreamBeginCapture) E(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2)
	E(cuStreamEndCapture, 10000, cuStreamEndCapture) E(cuLaunchHostFunc, 10000, cuLaunchHostFunc) E(cuGraphCreate, 10000, cuGraphCreate) E(cuGraphDestroy, 10000, cuGraphDestroy)
	E(cuGraphGetNodes, 10000, cuGraphGetNodes) E(cuGraphInstantiate, 10000, cuGraphInstantiate_v2)
	E(cuGraphInstantiate, 12000, cuGraphInstantiateWithFlags) E(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams)
	E(cuGraphLaunch, 10000, cuGraphLaunch) E(cuGraphUpload, 11010, cuGraphUpload) E(cuGraphExecDestroy, 10000, cuGraphExecDestroy)
	/* Graphs built node by node, updated in place (exports_graph.c). */
	E(cuGraphAddKernelNode, 10000, cuGraphAddKernelNode) E(cuGraphAddKernelNode, 12000, cuGraphAddKernelNode_v2)
	E(cuGraphAddMemcpyNode, 10000, cuGraphAddMemcpyNode) E(cuGraphAddMemsetNode, 10000, cuGraphAddMemsetNode)
	E(cuGraphAddEmptyNode, 10000, cuGraphAddEmptyNode) E(cuGraphAddChildGraphNode, 10000, cuGraphAddChildGraphNode)
	E(cuGraphAddNode, 12020, cuGraphAddNode) E(cuGraphAddNode, 12030, cuGraphAddNode_v2)
	E(cuGraphExecKernelNodeSetParams, 10010, cuGraphExecKernelNodeSetParams) E(cuGraphExecKernelNodeSetParams, 12000, cuGraphExecKernelNodeSetParams_v2)
	E(cuGraphKernelNodeSetParams, 10000, cuGraphKernelNodeSetParams) E(cuGraphKernelNodeSetParams, 12000, cuGraphKernelNodeSetParams_v2)
	E(cuGraphExecMemcpyNodeSetParams, 10020, cuGraphExecMemcpyNodeSetParams) E(cuGraphMemcpyNodeSetParams, 10000, cuGraphMemcpyNodeSetParams)
	E(cuGraphExecMemsetNodeSetParams, 10020, cuGraphExecMemsetNodeSetParams) E(cuGraphMemsetNodeSetParams, 10000, cuGraphMemsetNodeSetParams)
	E(cuGraphExecChildGraphNodeSetParams, 11010, cuGraphExecChildGraphNodeSetParams) E(cuGraphExecNodeSetParams, 12020, cuGraphExecNodeSetParams)
	E(cuGraphNodeSetEnabled, 11060, cuGraphNodeSetEnabled) E(cuGraphNodeGetEnabled, 11060, cuGraphNodeGetEnabled)
	E(cuGraphExecUpdate, 10020, cuGraphExecUpdate) E(cuGraphExecUpdate, 12000, cuGraphExecUpdate_v2)
	E(cuGraphNodeGetType, 10000, cuGraphNodeGetType) E(cuGraphNodeGetDependencies, 10000, cuGraphNodeGetDependencies)
	E(cuGraphNodeGetDependencies, 12030, cuGraphNodeGetDependencies_v2) E(cuStreamBeginCaptureToGraph, 12030, cuStreamBeginCaptureToGraph)
	E(cuDeviceGraphMemTrim, 11040, cuDeviceGraphMemTrim) E(cuGraphGetRootNodes, 10000, cuGraphGetRootNodes)
	E(cuGraphGetEdges, 10000, cuGraphGetEdges) E(cuGraphGetEdges, 12030, cuGraphGetEdges_v2)
	E(cuGraphKernelNodeSetAttribute, 11000, cuGraphKernelNodeSetAttribute)
	E(cuCtxGetLimit, 3010, cuCtxGetLimit) E(cuCtxSetLimit, 3010, cuCtxSetLimit) E(cuCtxGetFlags, 7000, cuCtxGetFlags)
	E(cuCtxSetFlags, 12010, cuCtxSetFlags) E(cuCtxGetId, 12000, cuCtxGetId) E(cuCtxGetApiVersion, 3020, cuCtxGetApiVersion)
	E(cuCtxGetCacheConfig, 3020, cuCtxGetCacheConfig) E(cuCtxSetCacheConfig, 3020, cuCtxSetCacheConfig)
	E(cuCtxGetSharedMemConfig, 4020, cuCtxGetSharedMemConfig) E(cuCtxSetSharedMemConfig, 4020, cuCtxSetSharedMemConfig)
	E(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange)
	E(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority) E(cuStreamGetPriority, 5050, cuStreamGetPriority)
	E(cuStreamGetFlags, 5050, cuStreamGetFlags) E(cuStreamGetCtx, 9020, cuStreamGetCtx) E(cuStreamGetId, 12000, cuStreamGetId)
	E(cuStreamIsCapturing, 10000, cuStreamIsCapturing) E(cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo)
	E(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2) E(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3)
	E(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode)
	E(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags) E(cuLaunchKernelEx, 11060, cuLaunchKernelEx)
	E(cuFuncGetName, 12030, cuFuncGetName) E(cuFuncGetParamInfo, 12040, cuFuncGetParamInfo)
	E(cuFuncSetCacheConfig, 3000, cuFuncSetCacheConfig) E(cuFuncIsLoaded, 12040, cuFuncIsLoaded) E(cuFuncLoad, 12040, cuFuncLoad)
	E(cuModuleGetLoadingMode, 11070, cuModuleGetLoadingMode)
	E(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 7000, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)
	E(cuOccupancyMaxPotentialBlockSizeWithFlags, 7000, cuOccupancyMaxPotentialBlockSizeWithFlags)
	E(cuOccupancyAvailableDynamicSMemPerBlock, 10020, cuOccupancyAvailableDynamicSMemPerBlock) E(cuOccupancyMaxActiveClusters, 11070, cuOccupancyMaxActiveClusters)
	E(cuOccupancyMaxPotentialClusterSize, 11070, cuOccupancyMaxPotentialClusterSize)
	E(cuLibraryLoadData, 12000, cuLibraryLoadData) E(cuLibraryLoadFromFile, 12000, cuLibraryLoadFromFile)
	E(cuLibraryUnload, 12000, cuLibraryUnload) E(cuLibraryGetModule, 12000, cuLibraryGetModule)
	E(cuLibraryGetKernel, 12000, cuLibraryGetKernel) E(cuLibraryGetGlobal, 12000, cuLibraryGetGlobal)
	E(cuKernelGetFunction, 12000, cuKernelGetFunction) E(cuKernelGetName, 12030, cuKernelGetName)
	E(cuKernelGetAttribute, 12000, cuKernelGetAttribute) E(cuKernelSetAttribute, 12000, cuKernelSetAttribute)
	E(cuKernelSetCacheConfig, 12000, cuKernelSetCacheConfig)
	E(cuPointerGetAttribute, 4000, cuPointerGetAttribute) E(cuPointerGetAttributes, 7000, cuPointerGetAttributes)
	E(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2) E(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId)
	/* Virtual memory management (exports_vmm.c). */
	E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity) E(cuMemAddressReserve, 10020, cuMemAddressReserve)
	E(cuMemAddressFree, 10020, cuMemAddressFree) E(cuMemCreate, 10020, cuMemCreate) E(cuMemRelease, 10020, cuMemRelease)
	E(cuMemMap, 10020, cuMemMap) E(cuMemUnmap, 10020, cuMemUnmap) E(cuMemSetAccess, 10020, cuMemSetAccess)
	E(cuMemGetAccess, 10020, cuMemGetAccess) E(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle)
	E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle)
	E(cuTensorMapEncodeTiled, 12000, cuTensorMapEncodeTiled) /* exports_tensormap.c */
#include "stubs.h"
};
#undef DLSYM_STUB
#undef STUB
#undef E

/* CUdriverProcAddressQueryResult values. */
enum { VG_SYMBOL_SUCCESS = 0, VG_SYMBOL_NOT_FOUND = 1, VG_VERSION_NOT_SUFFICIENT = 2 };

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
	const struct vg_proc *best = NULL;
	int known = 0;
	size_t i;
	if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	for (i = 0; i < sizeof vg_procs / sizeof vg_procs[0]; i++) {
		if (strcmp(vg_procs[i].name, symbol) != 0) continue;
		known = 1;
		if (vg_procs[i].version <= version && (best == NULL || vg_procs[i].version > best->version)) best = &vg_procs[i];
	}
	/* NVIDIA's driver (580) answers a name it lacks with CUDA_SUCCESS and
	 * the reason in *status; without a status, CUDA_ERROR_NOT_FOUND. */
	if (vg_debug_enabled() > 1 || (!best && vg_debug_enabled()))
		fprintf(stderr, "vgpuha libcuda: cuGetProcAddress %s %d flags %llu: %s\n", symbol, version, (unsigned long long)flags,
			best ? "found" : known ? "newer than asked (CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)" : "no such entry (CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)");
	if (status) *status = best ? VG_SYMBOL_SUCCESS : known ? VG_VERSION_NOT_SUFFICIENT : VG_SYMBOL_NOT_FOUND;
	if (!best) return status ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
	*pfn = best->fn;
	return CUDA_SUCCESS;
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) { return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL); }
