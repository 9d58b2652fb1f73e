/* The entries exports_runtime.c, exports_graph.c, exports_hostmem.c and darkapi.c define, for cuGetProcAddress's
 * table in exports.c (and so each definition is checked against its
 * declaration). */
#ifndef VG_RUNTIME_H
#define VG_RUNTIME_H
#include "vgcuda.h"

CUresult cuGetExportTable(const void **table, const CUuuid *id);
CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo);
CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo);
CUresult cuLibraryUnload(CUlibrary lib);
CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib);
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name);
CUresult cuLibraryGetGlobal(CUdeviceptr *p, size_t *n, CUlibrary lib, const char *name);
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k);
CUresult cuKernelGetName(const char **name, CUkernel k);
CUresult cuKernelGetAttribute(int *v, CUfunction_attribute attr, CUkernel k, CUdevice dev);
CUresult cuKernelSetAttribute(CUfunction_attribute attr, int v, CUkernel k, CUdevice dev);
CUresult cuKernelSetCacheConfig(CUkernel k, CUfunc_cache c, CUdevice dev);
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c);
CUresult cuOccupancyMaxPotentialClusterSize(int *n, CUfunction f, const CUlaunchConfig *c);
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p);
CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status);
CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, unsigned long long *id);
CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *status, unsigned long long *id, CUgraph *graph, const CUgraphNode **deps, size_t *ndeps);
CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status, unsigned long long *id, CUgraph *graph, const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps);
CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev);
/* The launch attributes cuLaunchKernelEx and a kernel node take. */
int vg_launch_attr_ok(int id);
/* exports_graph.c */
CUresult cuStreamBeginCapture(CUstream s);
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
CUresult cuGraphCreate(CUgraph *g, unsigned int flags);
CUresult cuGraphDestroy(CUgraph g);
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long flags);
CUresult cuGraphInstantiate_v2(CUgraphExec *x, CUgraph g, CUgraphNode *err, char *log, size_t logSize);
CUresult cuGraphInstantiateWithParams(CUgraphExec *x, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
CUresult cuGraphLaunch(CUgraphExec x, CUstream s);
CUresult cuGraphUpload(CUgraphExec x, CUstream s);
CUresult cuGraphExecDestroy(CUgraphExec x);
CUresult cuGraphKernelNodeSetAttribute(CUgraphNode node, int attr, const CUlaunchAttributeValue *v);
CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *edges, size_t *n);
CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to, size_t *n);
CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS_v1 *p);
CUresult cuGraphAddMemcpyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMCPY3D *p, CUcontext ctx);
CUresult cuGraphAddMemsetNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx);
CUresult cuGraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd);
CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child);
CUresult cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraphNodeParams *p);
CUresult cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges, size_t nd, CUgraphNodeParams *p);
CUresult cuGraphExecNodeSetParams(CUgraphExec x, CUgraphNode node, CUgraphNodeParams *p);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec x, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p);
CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p);
CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec x, CUgraphNode node, const CUDA_MEMCPY3D *p, CUcontext ctx);
CUresult cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D *p);
CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec x, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx);
CUresult cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS *p);
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec x, CUgraphNode node, CUgraph child);
CUresult cuGraphNodeSetEnabled(CUgraphExec x, CUgraphNode node, unsigned int on);
CUresult cuGraphNodeGetEnabled(CUgraphExec x, CUgraphNode node, unsigned int *on);
CUresult cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g, CUgraphExecUpdateResultInfo *info);
CUresult cuGraphExecUpdate(CUgraphExec x, CUgraph g, CUgraphNode *errNode, int *result);
CUresult cuGraphNodeGetType(CUgraphNode node, int *type);
CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, size_t *n);
CUresult cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode *deps, CUgraphEdgeData *edges, size_t *n);
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges, size_t nd, CUstreamCaptureMode mode);
CUresult cuDeviceGraphMemTrim(CUdevice dev);
/* exports_hostmem.c */
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags);
CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c);
/* exports_vmm.c */
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option);
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
/* exports_tensormap.c */
CUresult cuTensorMapEncodeTiled(void *map, int dataType, cuuint32_t rank, void *global, const cuuint64_t *dims,
	const cuuint64_t *strides, const cuuint32_t *box, const cuuint32_t *elementStrides, int interleave, int swizzle,
	int l2Promotion, int oobFill);
#endif
