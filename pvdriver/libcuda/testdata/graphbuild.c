/* CUDA graphs built node by node, as XLA's command buffers build them: a
 * memset node, a device-to-device copy node, a kernel node, an empty node,
 * a child graph filled by cuStreamBeginCaptureToGraph, a copy node to host
 * memory; instantiated and launched, then the instantiated graph changed in
 * place (a kernel node's arguments, a memset node's value, a node disabled
 * and enabled again) and launched again, each launch's results checked;
 * node types, handles and dependencies read back; an update from a graph of
 * another shape refused. */
#include "cudaapi.h"

typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	void **kernelParams, **extra;
	void *kern;
	CUcontext ctx;
} KernelParams;
typedef struct {
	CUdeviceptr dst;
	size_t pitch;
	unsigned int value, elementSize;
	size_t width, height;
} MemsetParams;
typedef struct {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray, *reserved0;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray, *reserved1;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
} Memcpy3D;
typedef struct {
	int type, reserved0[3];
	union { long long reserved1[29]; } u;
	long long reserved2;
} NodeParams;
typedef struct { int result; CUgraphNode errorNode, errorFromNode; } UpdateInfo;
enum { MEM_HOST = 1, MEM_DEVICE = 2, NODE_KERNEL = 0, NODE_CONDITIONAL = 13, UPDATE_TOPOLOGY_CHANGED = 2 };
enum { CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910 };

CUresult cuGraphAddMemsetNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const MemsetParams *p, CUcontext ctx);
CUresult cuGraphAddMemcpyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const Memcpy3D *p, CUcontext ctx);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const KernelParams *p);
CUresult cuGraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd);
CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child);
CUresult cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, NodeParams *p);
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const void *edges, size_t nd, int mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec x, CUstream s);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode n, const KernelParams *p);
CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec x, CUgraphNode n, const MemsetParams *p, CUcontext ctx);
CUresult cuGraphNodeSetEnabled(CUgraphExec x, CUgraphNode n, unsigned int on);
CUresult cuGraphNodeGetEnabled(CUgraphExec x, CUgraphNode n, unsigned int *on);
CUresult cuGraphNodeGetType(CUgraphNode n, int *type);
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult cuGraphNodeGetDependencies(CUgraphNode n, CUgraphNode *deps, size_t *nd);
CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g, UpdateInfo *info);
CUresult cuGraphExecDestroy(CUgraphExec x);
CUresult cuGraphDestroy(CUgraph g);


#define N 4096

static float *out;

/* launch runs the graph once and checks every y is want. */
static void launch(CUgraphExec x, CUstream s, float want, const char *what) {
	for (int i = 0; i < N; i++) out[i] = -1;
	CHECK(cuGraphLaunch(x, s));
	CHECK(cuStreamSynchronize(s));
	for (int i = 0; i < N; i++)
		if (out[i] != want) FAIL("%s: y[%d] = %g, want %g", what, i, out[i], want);
}

/* kernel is saxpy's node: y = alpha·x + y over N elements. */
static KernelParams kernel(CUfunction saxpy, void **params) {
	KernelParams k = {0};
	k.func = saxpy, k.gridDimX = N / 128, k.gridDimY = 1, k.gridDimZ = 1;
	k.blockDimX = 128, k.blockDimY = 1, k.blockDimZ = 1, k.kernelParams = params;
	return k;
}

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction saxpy;
	CUstream s;
	CUgraph g, child, captured, other;
	CUgraphNode m, c, k, e, ch, back, nodes[8], deps[4];
	CUgraphExec x;
	CUdeviceptr dx, dy, dz;
	float two = 2.0f, one = 1.0f, four = 4.0f;
	unsigned int n = N, on = 7;
	int type = -1;
	size_t count = 0;
	if (argc < 2) FAIL("usage: graphbuild KERNELDIR");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "saxpy")));
	CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
	CHECK(cuMemAlloc(&dx, N * sizeof(float)));
	CHECK(cuMemAlloc(&dy, N * sizeof(float)));
	CHECK(cuMemAlloc(&dz, N * sizeof(float)));
	CHECK(cuMemAllocHost((void **)&out, N * sizeof(float)));
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CHECK(cuMemsetD32(dz, 0x40400000, N)); /* z = 3 */

	CHECK(cuGraphCreate(&g, 0));
	MemsetParams ms = {dy, 0, 0, 4, N, 1}; /* y = 0 */
	CHECK(cuGraphAddMemsetNode(&m, g, NULL, 0, &ms, ctx));
	Memcpy3D cp = {0}; /* x = z */
	cp.srcMemoryType = MEM_DEVICE, cp.srcDevice = dz, cp.dstMemoryType = MEM_DEVICE, cp.dstDevice = dx;
	cp.WidthInBytes = N * sizeof(float), cp.Height = 1, cp.Depth = 1;
	CHECK(cuGraphAddMemcpyNode(&c, g, &m, 1, &cp, ctx));
	void *p2[] = {&dx, &dy, &two, &n};
	KernelParams kp = kernel(saxpy, p2); /* y += 2x: 6 */
	CHECK(cuGraphAddKernelNode_v2(&k, g, &c, 1, &kp));
	CHECK(cuGraphAddEmptyNode(&e, g, &k, 1));
	/* A child graph, traced by capture as XLA traces a library call. */
	CHECK(cuGraphCreate(&child, 0));
	void *p1[] = {&dx, &dy, &one, &n};
	CHECK(cuStreamBeginCaptureToGraph(s, child, NULL, NULL, 0, 1 /* thread-local */));
	CHECK(cuLaunchKernel(saxpy, N / 128, 1, 1, 128, 1, 1, 0, s, p1, NULL)); /* y += x: 9 */
	CHECK(cuStreamEndCapture(s, &captured));
	if (captured != child) FAIL("capture to a graph ended with graph %p, want %p", (void *)captured, (void *)child);
	CHECK(cuGraphAddChildGraphNode(&ch, g, &e, 1, child));
	Memcpy3D down = {0};
	down.srcMemoryType = MEM_DEVICE, down.srcDevice = dy, down.dstMemoryType = MEM_HOST, down.dstHost = out;
	down.WidthInBytes = N * sizeof(float), down.Height = 1, down.Depth = 1;
	CHECK(cuGraphAddMemcpyNode(&back, g, &ch, 1, &down, ctx));

	CHECK(cuGraphGetNodes(g, NULL, &count));
	if (count != 6) FAIL("graph has %zu nodes, want 6", count);
	count = 8;
	CHECK(cuGraphGetNodes(g, nodes, &count));
	int seen = 0;
	for (size_t i = 0; i < count; i++) seen += nodes[i] == k;
	if (count != 6 || seen != 1) FAIL("cuGraphGetNodes: %zu nodes, the kernel node %d times", count, seen);
	CHECK(cuGraphNodeGetType(k, &type));
	if (type != NODE_KERNEL) FAIL("kernel node's type %d", type);
	count = 4;
	CHECK(cuGraphNodeGetDependencies(c, deps, &count));
	if (count != 1 || deps[0] != m) FAIL("copy node's dependencies: %zu, first %p, want the memset node", count, (void *)deps[0]);

	count = 4;
	CHECK(cuGraphGetRootNodes(g, deps, &count));
	if (count != 1 || deps[0] != m) FAIL("root nodes: %zu, first %p, want the memset node alone", count, (void *)deps[0]);

	CHECK(cuGraphInstantiateWithFlags(&x, g, 0));
	launch(x, s, 9.0f, "first launch");
	checkpoint();
	KernelParams kp4 = kernel(saxpy, (void *[]){&dx, &dy, &four, &n});
	CHECK(cuGraphExecKernelNodeSetParams_v2(x, k, &kp4)); /* y = 4·3 + 3 */
	launch(x, s, 15.0f, "kernel node changed");
	CHECK(cuGraphNodeSetEnabled(x, k, 0)); /* y = 0 + 3 */
	CHECK(cuGraphNodeGetEnabled(x, k, &on));
	if (on != 0) FAIL("disabled node reads enabled %u", on);
	launch(x, s, 3.0f, "kernel node disabled");
	CHECK(cuGraphNodeSetEnabled(x, k, 1));
	MemsetParams ms1 = {dy, 0, 0x3f800000, 4, N, 1}; /* y = 1 + 12 + 3 */
	CHECK(cuGraphExecMemsetNodeSetParams(x, m, &ms1, ctx));
	launch(x, s, 16.0f, "memset node changed");

	/* An update from a graph of another shape is refused, naming why. */
	CHECK(cuGraphCreate(&other, 0));
	CHECK(cuGraphAddEmptyNode(&e, other, NULL, 0));
	UpdateInfo info = {-1, 0, 0};
	EXPECT(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate_v2(x, other, &info));
	if (info.result != UPDATE_TOPOLOGY_CHANGED) FAIL("update result %d, want %d (topology changed)", info.result, UPDATE_TOPOLOGY_CHANGED);
	launch(x, s, 16.0f, "after a refused update");
	if (!native()) { /* a conditional node needs a handle this library does not make */
		NodeParams cond = {0};
		cond.type = NODE_CONDITIONAL;
		EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuGraphAddNode(&e, other, NULL, 0, &cond));
	}
	CHECK(cuGraphExecDestroy(x));
	CHECK(cuGraphDestroy(other));
	CHECK(cuGraphDestroy(child));
	CHECK(cuGraphDestroy(g));
	CHECK(cuCtxDestroy(ctx));
	printf("graphbuild ok\n");
	return 0;
}
