/* Stream capture and CUDA graphs (CUDA Driver API reference, Graph
 * Management and Stream Management): NVIDIA's names and C signatures,
 * each handing its arguments to the Go entries in glue_graph_cgo.go. What
 * a graph is here, and what is not served, is said in
 * pvdriver/cuapi/graph.go. */
#include <stdio.h>
#include <string.h>
#include "vgcuda.h"
#include "_cgo_export.h"
#include "runtime.h"

#define H(x) ((uintptr_t)(x))
#define OUT(p) ((uintptr_t *)(p))

/* CU_STREAM_CAPTURE_MODE_GLOBAL: the first version's only mode. */
CUresult cuStreamBeginCapture(CUstream s) { return vg_traced(__func__, vgStreamBeginCapture(H(s), 0)); }
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) { return vg_traced(__func__, vgStreamBeginCapture(H(s), mode)); }
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return vg_traced(__func__, vgStreamEndCapture(H(s), OUT(g))); }

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
	if (status == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgStreamCaptureInfo(H(s), status, NULL, NULL));
}
CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, unsigned long long *id) {
	if (status == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgStreamCaptureInfo(H(s), status, id, NULL));
}
/* The dependencies a capture's next node would get are not kept (the
 * graph is replayed in capture order): none are reported. */
CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *status, unsigned long long *id, CUgraph *graph, const CUgraphNode **deps, size_t *ndeps) {
	CUresult r;
	if (status == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	r = vgStreamCaptureInfo(H(s), status, id, OUT(graph));
	if (r == CUDA_SUCCESS && deps) *deps = NULL;
	if (r == CUDA_SUCCESS && ndeps) *ndeps = 0;
	return vg_traced(__func__, r);
}
CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status, unsigned long long *id, CUgraph *graph, const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
	CUresult r = cuStreamGetCaptureInfo_v2(s, status, id, graph, deps, ndeps);
	if (r == CUDA_SUCCESS && edges) *edges = NULL;
	return r;
}

/* A host function runs once the stream's earlier work is done: here the
 * caller waits for it and calls fn itself, so the stream's later work,
 * queued after this returns, follows fn as CUDA orders it. In a capture it
 * is refused (a graph here holds device work only). */
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
	CUresult r;
	if (fn == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	r = vgHostFuncPoint(H(s));
	if (r == CUDA_SUCCESS) fn(data);
	return vg_traced(__func__, r);
}

CUresult cuGraphCreate(CUgraph *g, unsigned int flags) { return vg_traced(__func__, vgGraphCreate(OUT(g), flags)); }
CUresult cuGraphDestroy(CUgraph g) { return vg_traced(__func__, vgGraphDestroy(H(g))); }
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) { return vg_traced(__func__, vgGraphNodes(H(g), OUT(nodes), n)); }
CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long flags) { return vg_traced(__func__, vgGraphInstantiate(OUT(x), H(g), flags)); }
/* CUDA 11.0's form: an error node and a log, which stay empty here. */
CUresult cuGraphInstantiate_v2(CUgraphExec *x, CUgraph g, CUgraphNode *err, char *log, size_t logSize) {
	if (err) *err = NULL;
	if (log && logSize) log[0] = 0;
	return vg_traced(__func__, vgGraphInstantiate(OUT(x), H(g), 0));
}
/* The same by its first name: a host library binds cuGraphInstantiate
 * with dlsym, and without it every cublasCreate failed on the GPU with
 * CUBLAS_STATUS_INTERNAL_ERROR (testdata/dlsym_names.txt). */
CUresult cuGraphInstantiate(CUgraphExec *x, CUgraph g, CUgraphNode *err, char *log, size_t logSize) { return cuGraphInstantiate_v2(x, g, err, log, logSize); }
CUresult cuGraphInstantiateWithParams(CUgraphExec *x, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
	CUresult r;
	if (p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	r = vgGraphInstantiate(OUT(x), H(g), p->flags);
	p->hErrNode_out = NULL;
	p->result_out = r == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS, _ERROR */
	return vg_traced(__func__, r);
}
CUresult cuGraphLaunch(CUgraphExec x, CUstream s) { return vg_traced(__func__, vgGraphLaunch(H(x), H(s))); }
CUresult cuGraphUpload(CUgraphExec x, CUstream s) { return vg_traced(__func__, vgGraphUpload(H(x), H(s))); }
CUresult cuGraphExecDestroy(CUgraphExec x) { return vg_traced(__func__, vgGraphExecDestroy(H(x))); }

/* ---- Graphs built node by node, and instantiated graphs updated in
 * place (pvdriver/cuapi/graphbuild.go). Each node kind has one Go entry,
 * which adds a node (out set), changes an instantiated graph's node (x
 * set) or a graph's node (neither). */
_Static_assert(sizeof(CUDA_MEMCPY3D) == 200, "CUDA_MEMCPY3D is cuda.h's");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams is cuda.h's");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 is cuda.h's");

#define DEPS(d) ((uintptr_t *)(d))

/* vg_kernel_v2 widens a v1 kernel node's parameters. */
static CUDA_KERNEL_NODE_PARAMS_v2 vg_kernel_v2(const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
	CUDA_KERNEL_NODE_PARAMS_v2 q = {0};
	q.func = p->func;
	q.gridDimX = p->gridDimX, q.gridDimY = p->gridDimY, q.gridDimZ = p->gridDimZ;
	q.blockDimX = p->blockDimX, q.blockDimY = p->blockDimY, q.blockDimZ = p->blockDimZ;
	q.sharedMemBytes = p->sharedMemBytes, q.kernelParams = p->kernelParams, q.extra = p->extra;
	return q;
}
/* vg_memset_v1 narrows a v2 memset node's parameters (the context is the current one). */
static CUDA_MEMSET_NODE_PARAMS vg_memset_v1(const CUDA_MEMSET_NODE_PARAMS_v2 *p) {
	CUDA_MEMSET_NODE_PARAMS q = {p->dst, p->pitch, p->value, p->elementSize, p->width, p->height};
	return q;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
	if (n == NULL || p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphKernelNode(OUT(n), H(g), 0, 0, DEPS(deps), nd, (CUDA_KERNEL_NODE_PARAMS_v2 *)p));
}
CUresult cuGraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
	CUDA_KERNEL_NODE_PARAMS_v2 q;
	if (n == NULL || p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	q = vg_kernel_v2(p);
	return vg_traced(__func__, vgGraphKernelNode(OUT(n), H(g), 0, 0, DEPS(deps), nd, &q));
}
CUresult cuGraphAddMemcpyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMCPY3D *p, CUcontext ctx) {
	if (n == NULL || p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphCopyNode(OUT(n), H(g), 0, 0, DEPS(deps), nd, (CUDA_MEMCPY3D *)p));
}
CUresult cuGraphAddMemsetNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
	if (n == NULL || p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphMemsetNode(OUT(n), H(g), 0, 0, DEPS(deps), nd, (CUDA_MEMSET_NODE_PARAMS *)p));
}
CUresult cuGraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd) {
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphEmptyNode(OUT(n), H(g), DEPS(deps), nd));
}
CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child) {
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphChildNode(OUT(n), H(g), 0, 0, DEPS(deps), nd, H(child)));
}

/* vg_node_params adds (out set) or changes (x set) a node from
 * CUgraphNodeParams, by its type; host, event, memory and conditional
 * nodes are not served (pvdriver/cuapi/graph.go). */
static CUresult vg_node_params(const char *fn, uintptr_t *out, uintptr_t g, uintptr_t x, uintptr_t node, const CUgraphNode *deps, size_t nd, CUgraphNodeParams *p) {
	CUDA_MEMSET_NODE_PARAMS m;
	if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
	switch (p->type) {
	case CU_GRAPH_NODE_TYPE_KERNEL: return vgGraphKernelNode(out, g, x, node, DEPS(deps), nd, &p->u.kernel);
	case CU_GRAPH_NODE_TYPE_MEMCPY: return vgGraphCopyNode(out, g, x, node, DEPS(deps), nd, &p->u.memcpy.copyParams);
	case CU_GRAPH_NODE_TYPE_MEMSET: m = vg_memset_v1(&p->u.memset); return vgGraphMemsetNode(out, g, x, node, DEPS(deps), nd, &m);
	case CU_GRAPH_NODE_TYPE_GRAPH: return vgGraphChildNode(out, g, x, node, DEPS(deps), nd, H(p->u.graph.graph));
	case CU_GRAPH_NODE_TYPE_EMPTY: return out ? vgGraphEmptyNode(out, g, DEPS(deps), nd) : CUDA_SUCCESS;
	}
	if (vg_debug_enabled()) fprintf(stderr, "vgpuha libcuda: %s: graph node type %d is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", fn, p->type);
	return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraphNodeParams *p) {
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vg_node_params(__func__, OUT(n), H(g), 0, 0, deps, nd, p));
}
/* Edge data (ports and types: programmatic edges let a kernel start
 * before the one it follows ends) is accepted and kept as a plain edge: a
 * graph here runs its nodes one after another, which every edge type
 * allows. */
CUresult cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges, size_t nd, CUgraphNodeParams *p) {
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vg_node_params(__func__, OUT(n), H(g), 0, 0, deps, nd, p));
}
CUresult cuGraphExecNodeSetParams(CUgraphExec x, CUgraphNode node, CUgraphNodeParams *p) {
	return vg_traced(__func__, vg_node_params(__func__, NULL, 0, H(x), H(node), NULL, 0, p));
}

CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
	if (p == NULL || x == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphKernelNode(NULL, 0, H(x), H(node), NULL, 0, (CUDA_KERNEL_NODE_PARAMS_v2 *)p));
}
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec x, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
	CUDA_KERNEL_NODE_PARAMS_v2 q;
	if (p == NULL || x == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	q = vg_kernel_v2(p);
	return vg_traced(__func__, vgGraphKernelNode(NULL, 0, H(x), H(node), NULL, 0, &q));
}
CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
	if (p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphKernelNode(NULL, 0, 0, H(node), NULL, 0, (CUDA_KERNEL_NODE_PARAMS_v2 *)p));
}
CUresult cuGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
	CUDA_KERNEL_NODE_PARAMS_v2 q;
	if (p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	q = vg_kernel_v2(p);
	return vg_traced(__func__, vgGraphKernelNode(NULL, 0, 0, H(node), NULL, 0, &q));
}
CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec x, CUgraphNode node, const CUDA_MEMCPY3D *p, CUcontext ctx) {
	if (p == NULL || x == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphCopyNode(NULL, 0, H(x), H(node), NULL, 0, (CUDA_MEMCPY3D *)p));
}
CUresult cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D *p) {
	if (p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphCopyNode(NULL, 0, 0, H(node), NULL, 0, (CUDA_MEMCPY3D *)p));
}
CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec x, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
	if (p == NULL || x == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphMemsetNode(NULL, 0, H(x), H(node), NULL, 0, (CUDA_MEMSET_NODE_PARAMS *)p));
}
CUresult cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS *p) {
	if (p == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphMemsetNode(NULL, 0, 0, H(node), NULL, 0, (CUDA_MEMSET_NODE_PARAMS *)p));
}
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec x, CUgraphNode node, CUgraph child) {
	if (x == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphChildNode(NULL, 0, H(x), H(node), NULL, 0, H(child)));
}
CUresult cuGraphNodeSetEnabled(CUgraphExec x, CUgraphNode node, unsigned int on) {
	return vg_traced(__func__, vgGraphNodeSetEnabled(H(x), H(node), on));
}
CUresult cuGraphNodeGetEnabled(CUgraphExec x, CUgraphNode node, unsigned int *on) {
	if (on == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphNodeGetEnabled(H(x), H(node), on));
}
CUresult cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g, CUgraphExecUpdateResultInfo *info) {
	int result = 0;
	uintptr_t bad = 0;
	CUresult r = vgGraphExecUpdate(H(x), H(g), &result, &bad);
	if (info) {
		info->result = result;
		info->errorNode = (CUgraphNode)bad;
		info->errorFromNode = NULL;
	}
	return vg_traced(__func__, r);
}
CUresult cuGraphExecUpdate(CUgraphExec x, CUgraph g, CUgraphNode *errNode, int *result) {
	int res = 0;
	uintptr_t bad = 0;
	CUresult r = vgGraphExecUpdate(H(x), H(g), &res, &bad);
	if (errNode) *errNode = (CUgraphNode)bad;
	if (result) *result = res;
	return vg_traced(__func__, r);
}
CUresult cuGraphNodeGetType(CUgraphNode node, int *type) {
	if (type == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphNodeType(H(node), type));
}
CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, size_t *n) {
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphNodeDependencies(H(node), OUT(deps), n));
}
CUresult cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode *deps, CUgraphEdgeData *edges, size_t *n) {
	CUresult r;
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	r = vgGraphNodeDependencies(H(node), OUT(deps), n);
	if (r == CUDA_SUCCESS && edges != NULL && deps != NULL) memset(edges, 0, *n * 8); /* default edges */
	return vg_traced(__func__, r);
}
CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
	if (n == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphRootNodes(H(g), OUT(nodes), n));
}
CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to, size_t *n) {
	if (n == NULL || (from == NULL) != (to == NULL)) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	return vg_traced(__func__, vgGraphEdges(H(g), OUT(from), OUT(to), n));
}
CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *edges, size_t *n) {
	CUresult r;
	if (n == NULL || (from == NULL) != (to == NULL)) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	r = vgGraphEdges(H(g), OUT(from), OUT(to), n);
	if (r == CUDA_SUCCESS && edges != NULL && from != NULL) memset(edges, 0, *n * 8);
	return vg_traced(__func__, r);
}
/* A kernel node's launch attributes, those cuLaunchKernelEx takes: its
 * cluster shape and cooperative launch are kept; the others change
 * nothing here (a graph's nodes run one after another on one stream). */
CUresult cuGraphKernelNodeSetAttribute(CUgraphNode node, int attr, const CUlaunchAttributeValue *v) {
	if (v == NULL) return vg_traced(__func__, CUDA_ERROR_INVALID_VALUE);
	if (vg_launch_attr_ok(attr)) {
		if (attr == VG_LAUNCH_ATTR_COOPERATIVE) return vg_traced(__func__, vgGraphKernelNodeShape(H(node), 0, 0, 0, v->i != 0, 1));
		if (attr == VG_LAUNCH_ATTR_CLUSTER_DIMENSION) return vg_traced(__func__, vgGraphKernelNodeShape(H(node), v->clusterDim.x, v->clusterDim.y, v->clusterDim.z, 0, 2));
		return vg_traced(__func__, vgGraphKernelNodeShape(H(node), 0, 0, 0, 0, 0));
	}
	if (vg_debug_enabled()) fprintf(stderr, "vgpuha libcuda: cuGraphKernelNodeSetAttribute: launch attribute %d is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", attr);
	return vg_traced(__func__, CUDA_ERROR_NOT_SUPPORTED);
}
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges, size_t nd, CUstreamCaptureMode mode) {
	return vg_traced(__func__, vgStreamBeginCaptureToGraph(H(s), H(g), DEPS(deps), nd, mode));
}
/* No graph holds device memory here (memory nodes are not served): there
 * is nothing to trim. */
CUresult cuDeviceGraphMemTrim(CUdevice dev) { return vg_traced(__func__, vgDeviceGraphMemTrim(dev)); }
