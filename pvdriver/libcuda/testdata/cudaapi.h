/* The subset of NVIDIA's CUDA driver API (cuda.h, CUDA 13) the test
 * programs use, declared here so they build without NVIDIA's headers; the
 * plain names map to the versioned entries as cuda.h maps them. Also the
 * programs' common helpers. */
#ifndef CUDAAPI_H
#define CUDAAPI_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef size_t (*CUoccupancyB2DSize)(int blockSize);
/* CUlaunchAttribute and CUlaunchConfig (cuLaunchKernelEx, CUDA 12). */
typedef struct {
	int id;
	char pad[4];
	union { char bytes[64]; int i; struct { unsigned x, y, z; } clusterDim; } value;
} CUlaunchAttribute;
typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

enum {
	CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_IMAGE = 200, CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_FILE_NOT_FOUND = 301, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define CU_DEVICE_ATTRIBUTE_WARP_SIZE 10
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_MAX 144 /* one past the attributes the programs query; CUDA 13 has up to 147 */
#define NO_SUCH_DEVICE_ATTRIBUTE 100000
#define CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define CU_FUNC_ATTRIBUTE_NUM_REGS 4
#define CU_FUNC_ATTRIBUTE_PTX_VERSION 5
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES 12
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuCtxCreate cuCtxCreate_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuCtxPushCurrent cuCtxPushCurrent_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemAllocPitch cuMemAllocPitch_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuMemcpyDtoD cuMemcpyDtoD_v2
#define cuMemcpyHtoDAsync cuMemcpyHtoDAsync_v2
#define cuMemcpyDtoHAsync cuMemcpyDtoHAsync_v2
#define cuMemsetD8 cuMemsetD8_v2
#define cuMemsetD16 cuMemsetD16_v2
#define cuMemsetD32 cuMemsetD32_v2
#define cuMemAllocHost cuMemAllocHost_v2
#define cuModuleGetGlobal cuModuleGetGlobal_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuEventDestroy cuEventDestroy_v2

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice dev);
CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer);
CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev);
CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *ctx, void *params, int n, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext *ctx);
CUresult cuCtxSynchronize(void);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id);
CUresult cuFuncGetName(const char **name, CUfunction f);
CUresult cuMemAlloc(CUdeviceptr *p, size_t n);
CUresult cuMemAllocPitch(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem);
CUresult cuMemFree(CUdeviceptr p);
CUresult cuMemGetInfo(size_t *free, size_t *total);
CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n);
CUresult cuMemsetD16(CUdeviceptr dst, unsigned short v, size_t n);
CUresult cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s);
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
CUresult cuMemAllocHost(void **p, size_t n);
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuModuleLoad(CUmodule *m, const char *fname);
CUresult cuModuleLoadData(CUmodule *m, const void *image);
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, int *opts, void **vals);
CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatCubin);
CUresult cuModuleUnload(CUmodule m);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuModuleGetGlobal(CUdeviceptr *p, size_t *n, CUmodule m, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
	unsigned int bz, unsigned int shared, CUstream s, void **params, void **extra);
CUresult cuFuncGetAttribute(int *v, int attr, CUfunction f);
CUresult cuFuncSetAttribute(CUfunction f, int attr, int v);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int bs, size_t smem);
CUresult cuOccupancyMaxPotentialBlockSize(int *minGrid, int *bs, CUfunction f, CUoccupancyB2DSize cb, size_t smem, int limit);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuStreamDestroy(CUstream s);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamQuery(CUstream s);
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventQuery(CUevent e);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b);
CUresult cuEventDestroy(CUevent e);
CUresult cuGetErrorName(CUresult r, const char **s);
CUresult cuGetErrorString(CUresult r, const char **s);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);
CUresult cuGraphCreate(void *graph, unsigned int flags);

/* CHECK fails the program, naming the call and its result. */
#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
	const char *n_ = "?"; cuGetErrorName(r_, &n_); \
	fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #call, r_, n_); exit(1); } } while (0)
/* EXPECT checks a call returns the result an error path must give. */
#define EXPECT(want, call) do { CUresult r_ = (call); if (r_ != (want)) { \
	fprintf(stderr, "%s:%d: %s = %d, want %d\n", __FILE__, __LINE__, #call, r_, (want)); exit(1); } } while (0)
#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

/* checkpoint lets the test act mid-program (verify the replica, kill the
 * primary): with VGTEST_CHECKPOINT set it says so on stdout and waits for a
 * line on stdin. The program does not learn what happened meanwhile. */
static __attribute__((unused)) void checkpoint(void) {
	int c;
	if (!getenv("VGTEST_CHECKPOINT")) return;
	printf("checkpoint\n");
	fflush(stdout);
	while ((c = getchar()) != EOF && c != '\n') {}
}

/* native says the program runs against NVIDIA's own libcuda.so.1 (the GPU
 * test sets VGTEST_NATIVE there). Checks of what this project's library
 * promises beyond NVIDIA's driver (made-up handles answered rather than
 * undefined, copies bounded by the allocation rather than the mapping,
 * unsupported entries, its table of versioned entries) are skipped there,
 * and print nothing either way, so both runs print the same. */
static __attribute__((unused)) int native(void) { return getenv("VGTEST_NATIVE") != NULL; }

/* image_ext is the kernel image format the test asks for, also the file
 * name extension: VGTEST_IMAGE = ptx (the default), cubin or fatbin. */
static __attribute__((unused)) const char *image_ext(void) {
	const char *e = getenv("VGTEST_IMAGE");
	if (e == NULL || *e == 0) return "ptx";
	if (strcmp(e, "ptx") != 0 && strcmp(e, "cubin") != 0 && strcmp(e, "fatbin") != 0)
		FAIL("VGTEST_IMAGE=%s: want ptx, cubin or fatbin", e);
	return e;
}

/* image_path writes DIR/NAME.EXT (the kernel image's file) into path. */
static __attribute__((unused)) void image_path(char *path, size_t size, const char *dir, const char *name) {
	if (snprintf(path, size, "%s/%s.%s", dir, name, image_ext()) >= (int)size) FAIL("path too long: %s/%s", dir, name);
}

/* load_image returns the bytes of the kernel image DIR/NAME.EXT, read with
 * their length: a cubin (ELF) or fatbin is binary and may hold NULs; a NUL
 * follows the bytes for PTX, which is text. */
static __attribute__((unused)) void *load_image(const char *dir, const char *name) {
	char path[4096];
	FILE *f;
	long n;
	char *buf;
	image_path(path, sizeof path, dir, name);
	if (!(f = fopen(path, "rb")) || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0) FAIL("reading %s", path);
	rewind(f);
	if (!(buf = malloc((size_t)n + 1)) || fread(buf, 1, (size_t)n, f) != (size_t)n) FAIL("reading %s", path);
	buf[n] = 0;
	fclose(f);
	return buf;
}
#endif
