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
/* Graph node parameters (graph building, exports_graph.c), as cuda.h
 * lays them out. A kernel node's v2 form (also v3) adds the CUkernel and
 * the context after the v1 fields. */
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	void **kernelParams;
	void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	void **kernelParams;
	void **extra;
	CUkernel kern;
	CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef struct {
	CUdeviceptr dst;
	size_t pitch;
	unsigned int value, elementSize;
	size_t width, height;
} CUDA_MEMSET_NODE_PARAMS;
typedef struct {
	CUdeviceptr dst;
	size_t pitch;
	unsigned int value, elementSize;
	size_t width, height;
	CUcontext ctx;
} CUDA_MEMSET_NODE_PARAMS_v2;
/* CUmemorytype. */
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_ARRAY = 3, CU_MEMORYTYPE_UNIFIED = 4 };
typedef struct {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	void *reserved0;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	void *reserved1;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct {
	int flags, reserved;
	CUcontext copyCtx;
	CUDA_MEMCPY3D copyParams;
} CUDA_MEMCPY_NODE_PARAMS;
/* CUgraphNodeType, and CUgraphNodeParams: a type, then the union of every
 * type's parameters at byte 16. */
enum { CU_GRAPH_NODE_TYPE_KERNEL = 0, CU_GRAPH_NODE_TYPE_MEMCPY = 1, CU_GRAPH_NODE_TYPE_MEMSET = 2, CU_GRAPH_NODE_TYPE_GRAPH = 4, CU_GRAPH_NODE_TYPE_EMPTY = 5 };
typedef struct {
	int type;
	int reserved0[3];
	union {
		long long reserved1[29];
		CUDA_KERNEL_NODE_PARAMS_v2 kernel;
		CUDA_MEMCPY_NODE_PARAMS memcpy;
		CUDA_MEMSET_NODE_PARAMS_v2 memset;
		struct { CUgraph graph; } graph;
	} u;
	long long reserved2;
} CUgraphNodeParams;
typedef struct {
	int result;
	CUgraphNode errorNode;
	CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;
/* CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union;
 * the CUlaunchAttributeID values this library reads. */
typedef union CUlaunchAttributeValue_union { char bytes[64]; int i; unsigned u; struct { unsigned x, y, z; } clusterDim; } CUlaunchAttributeValue;
typedef struct CUlaunchAttribute_st {
	int id;
	char pad[4];
	CUlaunchAttributeValue value;
} CUlaunchAttribute;
enum {
	VG_LAUNCH_ATTR_IGNORE = 0, VG_LAUNCH_ATTR_COOPERATIVE = 2, VG_LAUNCH_ATTR_CLUSTER_DIMENSION = 4, VG_LAUNCH_ATTR_CLUSTER_SCHEDULING_POLICY = 5,
	VG_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6, VG_LAUNCH_ATTR_PRIORITY = 8,
};
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

/* Answers kept in C (answers.c): each is its vg* Go entry's answer. */
void vg_answers_forget(void);
CUresult vg_ans_func_attr(int *v, CUfunction_attribute attr, uintptr_t f);
CUresult vg_ans_func_set_attr(uintptr_t f, CUfunction_attribute attr, int v);
CUresult vg_ans_func_name(char **name, uintptr_t f);
CUresult vg_ans_ctx_live(uintptr_t ctx, uintptr_t *out);
CUresult vg_ans_ctx_device(CUdevice *dev);
CUresult vg_ans_primary_state(CUdevice dev, unsigned int *flags, int *active);

/* Context-local storage (darkapi.c): runs the destructors of ctx's values. */
void vg_cls_drop(uintptr_t ctx);

/* VGPUHA_DEBUG=1: name every refused call on stderr (darkapi.c). */
int vg_debug_enabled(void);

/* vg_traced returns r, naming fn on stderr when r is an error and
 * VGPUHA_DEBUG=2 (darkapi.c). */
CUresult vg_traced(const char *fn, CUresult r);

#endif
