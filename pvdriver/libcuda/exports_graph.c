/* Stream capture and CUDA graphs (CUDA Driver API reference, Graph
 * Management and Stream Management): NVIDIA's names and C signatures,
 * each handing its arguments to the Go entries in glue_graph_cgo.go. What
 * a graph is here, and what is not served, is said in
 * pvdriver/cuapi/graph.go. */
#include <stdio.h>
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
/* The count only: nodes are not handed out one by one. */
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
	if (nodes != NULL) {
		if (vg_debug_enabled()) fprintf(stderr, "vgpuha libcuda: cuGraphGetNodes: the nodes themselves are not supported, only their count (CUDA_ERROR_NOT_SUPPORTED)\n");
		return vg_traced(__func__, CUDA_ERROR_NOT_SUPPORTED);
	}
	return vg_traced(__func__, vgGraphNodeCount(H(g), n));
}
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
