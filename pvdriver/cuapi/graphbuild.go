package cuapi

import (
	"math/bits"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Graphs built node by node (cuGraphAdd*Node, cuGraphAddNode) and
// instantiated graphs updated in place: what XLA's command buffers do.
// The model, and what is not served, is in graph.go's doc.
//
// Each kind of node has one builder, shared by the call that adds such a
// node and the call that changes an instantiated copy of one, so both check
// the same things in the same way as the stream call they stand for
// (a kernel node as cuLaunchKernel, a copy node as cuMemcpy*).

// CUgraphNodeType values.
const (
	NodeTypeKernel      = 0
	NodeTypeMemcpy      = 1
	NodeTypeMemset      = 2
	NodeTypeHost        = 3
	NodeTypeGraph       = 4
	NodeTypeEmpty       = 5
	NodeTypeConditional = 13
)

// nodeTypes is the CUgraphNodeType of each kind of node.
var nodeTypes = map[nodeKind]int32{
	nodeLaunch: NodeTypeKernel, nodeCopyHtoD: NodeTypeMemcpy, nodeCopyDtoH: NodeTypeMemcpy,
	nodeCopyDtoD: NodeTypeMemcpy, nodeMemset: NodeTypeMemset, nodeEmpty: NodeTypeEmpty, nodeChild: NodeTypeGraph,
}

// CUgraphExecUpdateResult values, and the error cuGraphExecUpdate gives
// with any but the first.
const (
	UpdateSuccess         = 0
	UpdateTopologyChanged = 2
	UpdateNodeTypeChanged = 3

	ErrorGraphExecUpdateFailure Result = 910 // CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
)

// Copy is one copy node: Dst and Src are device addresses unless DstHost
// or SrcHost (the program's buffer, read or written when the graph runs)
// is set; N is its size in bytes.
type Copy struct {
	Dst, Src         uint64
	DstHost, SrcHost []byte
	N                uint64
}

// known checks that every handle of deps is a node of g, once each.
func (g *graph) known(deps []uint64) Result {
	for i, id := range deps {
		if g.node(id) == nil {
			return ErrorInvalidValue
		}
		for _, other := range deps[:i] {
			if other == id {
				return ErrorInvalidValue
			}
		}
	}
	return Success
}

// addNode adds n to graph g after deps and returns its handle.
func (d *Driver) addNode(g uint64, deps []uint64, n graphNode) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gr, r := d.liveGraph(g)
	if r != Success {
		return 0, r
	}
	if r := gr.known(deps); r != Success {
		return 0, r
	}
	n.id, n.deps = d.mint(), append([]uint64(nil), deps...)
	gr.add(n)
	return n.id, Success
}

// GraphAddKernelNode is cuGraphAddKernelNode: a launch of f shaped l
// (its stream aside), checked as cuLaunchKernel checks one.
func (d *Driver) GraphAddKernelNode(t Thread, g uint64, deps []uint64, f uint64, l Launch, params [][]byte, packed []byte) (uint64, Result) {
	n, r := d.kernelNode(t, f, l, params, packed)
	if r != Success {
		return 0, r
	}
	return d.addNode(g, deps, n)
}

// GraphAddCopyNode is cuGraphAddMemcpyNode for a copy of one row.
func (d *Driver) GraphAddCopyNode(t Thread, g uint64, deps []uint64, c Copy) (uint64, Result) {
	n, r := d.copyNode(t, c)
	if r != Success {
		return 0, r
	}
	return d.addNode(g, deps, n)
}

// GraphAddMemsetNode is cuGraphAddMemsetNode for one row of count
// elements of width bytes.
func (d *Driver) GraphAddMemsetNode(t Thread, g uint64, deps []uint64, dst uint64, width uint8, v uint32, count uint64) (uint64, Result) {
	n, r := d.memsetNode(t, dst, width, v, count)
	if r != Success {
		return 0, r
	}
	return d.addNode(g, deps, n)
}

// GraphAddEmptyNode is cuGraphAddEmptyNode: a node that only orders.
func (d *Driver) GraphAddEmptyNode(g uint64, deps []uint64) (uint64, Result) {
	return d.addNode(g, deps, graphNode{kind: nodeEmpty})
}

// GraphAddChildNode is cuGraphAddChildGraphNode: a copy of child, as it
// is now, run in the node's place.
func (d *Driver) GraphAddChildNode(g uint64, deps []uint64, child uint64) (uint64, Result) {
	n, r := d.childNode(child)
	if r != Success {
		return 0, r
	}
	return d.addNode(g, deps, n)
}

// copyNode checks a one-row copy and builds its node.
func (d *Driver) copyNode(t Thread, c Copy) (graphNode, Result) {
	if c.DstHost != nil && c.SrcHost != nil {
		return graphNode{}, ErrorNotSupported // host to host: nothing for the device to run
	}
	if c.DstHost != nil && uint64(len(c.DstHost)) != c.N || c.SrcHost != nil && uint64(len(c.SrcHost)) != c.N {
		return graphNode{}, ErrorInvalidValue
	}
	if r := d.requireCurrent(t); r != Success {
		return graphNode{}, r
	}
	var n graphNode
	switch {
	case c.SrcHost != nil:
		n = graphNode{kind: nodeCopyHtoD, dst: d.deviceAddress(t, c.Dst), host: c.SrcHost}
	case c.DstHost != nil:
		n = graphNode{kind: nodeCopyDtoH, src: d.deviceAddress(t, c.Src), host: c.DstHost}
	default:
		n = graphNode{kind: nodeCopyDtoD, dst: d.deviceAddress(t, c.Dst), src: d.deviceAddress(t, c.Src), n: c.N}
	}
	if d.touchesGlobal(n, c.N) {
		return graphNode{}, ErrorNotSupported
	}
	return n, Success
}

// memsetNode checks a one-row memset and builds its node.
func (d *Driver) memsetNode(t Thread, dst uint64, width uint8, v uint32, count uint64) (graphNode, Result) {
	if width != 1 && width != 2 && width != 4 {
		return graphNode{}, ErrorInvalidValue
	}
	if r := d.requireCurrent(t); r != Success {
		return graphNode{}, r
	}
	dst = d.deviceAddress(t, dst)
	hi, size := bits.Mul64(count, uint64(width))
	if hi != 0 || dst%uint64(width) != 0 {
		return graphNode{}, ErrorInvalidValue
	}
	n := graphNode{kind: nodeMemset, dst: dst, width: width, value: v, count: count}
	if d.touchesGlobal(n, size) {
		return graphNode{}, ErrorNotSupported
	}
	return n, Success
}

// childNode builds a node running a copy of graph child.
func (d *Driver) childNode(child uint64) (graphNode, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gr, r := d.liveGraph(child)
	if r != Success {
		return graphNode{}, r
	}
	return graphNode{kind: nodeChild, child: gr.copyOf()}, Success
}

// touchesGlobal reports whether node n's device bytes (size of them) are
// a module variable's, which a graph cannot hold (graph.go).
func (d *Driver) touchesGlobal(n graphNode, size uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	size = max(size, 1)
	_, _, dst := d.globalAt(n.dst, size)
	_, _, src := d.globalAt(n.src, size)
	return n.kind != nodeCopyDtoH && dst || n.kind != nodeCopyHtoD && n.kind != nodeMemset && src
}

// GraphNodes is cuGraphGetNodes: g's node handles, in the order added.
func (d *Driver) GraphNodes(g uint64) ([]uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gr, r := d.liveGraph(g)
	if r != Success {
		return nil, r
	}
	ids := make([]uint64, len(gr.nodes))
	for i := range gr.nodes {
		ids[i] = gr.nodes[i].id
	}
	return ids, Success
}

// graphOfNode is the live graph holding node id, and its place there.
// Precondition: d.mu must be locked.
func (d *Driver) graphOfNode(id uint64) (*graph, int, Result) {
	if r := d.ready(); r != Success {
		return nil, 0, r
	}
	for _, gr := range d.graphs {
		if i, ok := gr.index[id]; ok {
			return gr, i, Success
		}
	}
	return nil, 0, ErrorInvalidValue
}

// graphNodeLocked is the node of a live graph whose handle is id.
// Precondition: d.mu must be locked.
func (d *Driver) graphNodeLocked(id uint64) (*graphNode, Result) {
	gr, i, r := d.graphOfNode(id)
	if r != Success {
		return nil, r
	}
	return &gr.nodes[i], Success
}

// GraphNodeType is cuGraphNodeGetType.
func (d *Driver) GraphNodeType(id uint64) (int32, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, r := d.graphNodeLocked(id)
	if r != Success {
		return 0, r
	}
	return nodeTypes[n.kind], Success
}

// GraphNodeDependencies is cuGraphNodeGetDependencies.
func (d *Driver) GraphNodeDependencies(id uint64) ([]uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, r := d.graphNodeLocked(id)
	if r != Success {
		return nil, r
	}
	return append([]uint64(nil), n.deps...), Success
}

// setNode puts n's operation in the place of node id, which must be of
// n's type (a copy node may change direction): the node of instantiated
// graph x, or (x 0) the node of the graph that holds it.
func (d *Driver) setNode(x, id uint64, n graphNode) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	var nodes []graphNode
	var i int
	if x == 0 {
		gr, at, r := d.graphOfNode(id)
		if r != Success {
			return r
		}
		nodes, i = gr.nodes, at
	} else {
		if r := d.liveExec(x); r != Success {
			return r
		}
		ex := d.execs[x]
		at, ok := ex.index[id]
		if !ok {
			return ErrorInvalidValue
		}
		nodes, i = ex.mutable(), at
	}
	if nodeTypes[nodes[i].kind] != nodeTypes[n.kind] {
		return ErrorInvalidValue
	}
	n.id, n.deps, n.disabled, n.stream = id, nodes[i].deps, nodes[i].disabled, nodes[i].stream
	nodes[i] = n
	return Success
}

// GraphSetKernel is cuGraphExecKernelNodeSetParams (x, an instantiated
// graph) and cuGraphKernelNodeSetParams (x 0).
func (d *Driver) GraphSetKernel(t Thread, x, id, f uint64, l Launch, params [][]byte, packed []byte) Result {
	n, r := d.kernelNode(t, f, l, params, packed)
	if r != Success {
		return r
	}
	return d.setNode(x, id, n)
}

// GraphSetCopy is cuGraphExecMemcpyNodeSetParams (x, an instantiated
// graph) and cuGraphMemcpyNodeSetParams (x 0).
func (d *Driver) GraphSetCopy(t Thread, x, id uint64, c Copy) Result {
	n, r := d.copyNode(t, c)
	if r != Success {
		return r
	}
	return d.setNode(x, id, n)
}

// GraphSetMemset is cuGraphExecMemsetNodeSetParams (x, an instantiated
// graph) and cuGraphMemsetNodeSetParams (x 0).
func (d *Driver) GraphSetMemset(t Thread, x, id, dst uint64, width uint8, v uint32, count uint64) Result {
	n, r := d.memsetNode(t, dst, width, v, count)
	if r != Success {
		return r
	}
	return d.setNode(x, id, n)
}

// GraphSetChild is cuGraphExecChildGraphNodeSetParams: the node of
// instantiated graph x runs a copy of child from now on.
func (d *Driver) GraphSetChild(x, id, child uint64) Result {
	n, r := d.childNode(child)
	if r != Success {
		return r
	}
	return d.setNode(x, id, n)
}

// GraphNodeSetEnabled is cuGraphNodeSetEnabled: a disabled node of an
// instantiated graph is skipped when the graph runs.
func (d *Driver) GraphNodeSetEnabled(x, id uint64, on bool) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.liveExec(x); r != Success {
		return r
	}
	ex := d.execs[x]
	i, ok := ex.index[id]
	if !ok {
		return ErrorInvalidValue
	}
	ex.mutable()[i].disabled = !on
	return Success
}

// GraphNodeEnabled is cuGraphNodeGetEnabled.
func (d *Driver) GraphNodeEnabled(x, id uint64) (bool, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.liveExec(x); r != Success {
		return false, r
	}
	ex := d.execs[x]
	i, ok := ex.index[id]
	if !ok {
		return false, ErrorInvalidValue
	}
	return !ex.nodes[i].disabled, Success
}

// GraphExecUpdate is cuGraphExecUpdate: x takes g's operations where g has
// x's shape (as many nodes, each of the same type, after the same nodes by
// position); otherwise x is unchanged and the answer says why, naming the
// first node of g that differs.
func (d *Driver) GraphExecUpdate(x, g uint64) (result int32, errNode uint64, r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.liveExec(x); r != Success {
		return 0, 0, r
	}
	gr, r := d.liveGraph(g)
	if r != Success {
		return 0, 0, r
	}
	ex := d.execs[x]
	if len(gr.nodes) != len(ex.nodes) {
		return UpdateTopologyChanged, 0, ErrorGraphExecUpdateFailure
	}
	for i := range gr.nodes {
		if res := sameShape(gr, ex, i); res != UpdateSuccess {
			return res, gr.nodes[i].id, ErrorGraphExecUpdateFailure
		}
	}
	nodes := ex.mutable()
	for i := range nodes {
		n := gr.nodes[i]
		n.id, n.deps, n.disabled = nodes[i].id, nodes[i].deps, nodes[i].disabled
		nodes[i] = n
	}
	return UpdateSuccess, 0, Success
}

// sameShape compares node i of graph g with node i of instantiated graph
// ex: its type, and its dependencies by position.
func sameShape(g, ex *graph, i int) int32 {
	a, b := &g.nodes[i], &ex.nodes[i]
	if nodeTypes[a.kind] != nodeTypes[b.kind] {
		return UpdateNodeTypeChanged
	}
	if len(a.deps) != len(b.deps) {
		return UpdateTopologyChanged
	}
	for j := range a.deps {
		if g.index[a.deps[j]] != ex.index[b.deps[j]] {
			return UpdateTopologyChanged
		}
	}
	return UpdateSuccess
}

// DeviceGraphMemTrim is cuDeviceGraphMemTrim: no graph holds device memory
// here (memory nodes are not served), so there is nothing to trim.
func (d *Driver) DeviceGraphMemTrim(dev int32) Result { return d.device(dev) }

// GraphRootNodes is cuGraphGetRootNodes: g's nodes that follow none.
func (d *Driver) GraphRootNodes(g uint64) ([]uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gr, r := d.liveGraph(g)
	if r != Success {
		return nil, r
	}
	var ids []uint64
	for i := range gr.nodes {
		if len(gr.nodes[i].deps) == 0 {
			ids = append(ids, gr.nodes[i].id)
		}
	}
	return ids, Success
}

// GraphEdges is cuGraphGetEdges: g's edges as two lists, from and to.
func (d *Driver) GraphEdges(g uint64) (from, to []uint64, r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gr, r := d.liveGraph(g)
	if r != Success {
		return nil, nil, r
	}
	for i := range gr.nodes {
		for _, dep := range gr.nodes[i].deps {
			from, to = append(from, dep), append(to, gr.nodes[i].id)
		}
	}
	return from, to, Success
}

// GraphSetKernelShape is cuGraphKernelNodeSetAttribute for the attributes
// a kernel node keeps: its cluster shape and cooperative launch (nil: not
// changed); the node must be a kernel node of a graph.
func (d *Driver) GraphSetKernelShape(id uint64, cluster *[3]uint32, cooperative *bool) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, r := d.graphNodeLocked(id)
	if r != Success {
		return r
	}
	if n.kind != nodeLaunch {
		return ErrorInvalidValue
	}
	if cluster != nil {
		n.cfg.Cluster = abi.Dim3{X: cluster[0], Y: cluster[1], Z: cluster[2]}
	}
	if cooperative != nil {
		n.cfg.Cooperative = *cooperative
	}
	return Success
}
