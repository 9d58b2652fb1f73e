/* The CUDA driver API types this library's C half uses, declared as cuda.h
 * declares them (CUDA Driver API reference, "Data types used by CUDA
 * driver"): the exported functions must have NVIDIA's exact C signatures.
 * No NVIDIA header is needed to build it. */
#ifndef VGCUDA_H
#define VGCUDA_H

#include <stddef.h>
#include <stdint.h>

typedef enum cudaError_enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_NOT_SUPPORTED = 801 } CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef int CUdevice_attribute;
typedef int CUfunction_attribute;
typedef int CUjit_option;
typedef size_t (*CUoccupancyB2DSize)(int blockSize);
typedef int CUdriverProcAddressQueryResult;
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCigParam_st CUctxCigParam;
typedef struct CUctxCreateParams_st {
	CUexecAffinityParam *execAffinityParams;
	int numExecAffinityParams;
	CUctxCigParam *cigParams;
} CUctxCreateParams;

typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef int CUlimit;
typedef int CUfunc_cache;
typedef int CUsharedconfig;
typedef int CUpointer_attribute;
typedef int CUstreamCaptureStatus;
typedef int CUstreamCaptureMode;
typedef int CUmoduleLoadingMode;
typedef int CUlibraryOption;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef struct CUgraphExec_st *CUgraphExec;
typedef void (*CUhostFn)(void *userData);
/* CUDA_GRAPH_INSTANTIATE_PARAMS (CUDA 12). */
typedef struct {
	unsigned long long flags;
	struct CUstream_st *hUploadStream;
	CUgraphNode hErrNode_out;
	int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
/* CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union. */
typedef struct CUlaunchAttribute_st {
	int id;
	char pad[4];
	union { char bytes[64]; int i; unsigned u; struct { unsigned x, y, z; } clusterDim; } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

/* Virtual memory management (exports_vmm.c). */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUmemLocation_st { int type; int id; } CUmemLocation;
typedef struct CUmemAllocationProp_st {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef int CUmemAllocationGranularity_flags;
typedef int CUmemAllocationHandleType;

/* The calling thread's stack of current contexts (exports.c). */
uintptr_t vg_ctx_top(void);
void vg_ctx_set_top(uintptr_t ctx);
int vg_ctx_push(uintptr_t ctx);
uintptr_t vg_ctx_pop(void);

/* Context-local storage (darkapi.c): runs the destructors of ctx's values. */
void vg_cls_drop(uintptr_t ctx);

/* VGPUHA_DEBUG=1: name every refused call on stderr (darkapi.c). */
int vg_debug_enabled(void);

/* vg_traced returns r, naming fn on stderr when r is an error and
 * VGPUHA_DEBUG=2 (darkapi.c). */
CUresult vg_traced(const char *fn, CUresult r);

#endif
