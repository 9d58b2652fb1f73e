package cuapi

import (
	"sync/atomic"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// CUDA graphs, made by stream capture or node by node, kept in this
// library.
//
// A graph is its nodes in the order they were added, each with the nodes
// it depends on. Between cuStreamBeginCapture and cuStreamEndCapture the
// stream work a program queues on a capturing stream (launches, device
// copies and memsets, copies to and from host memory) becomes nodes, not
// requests; a stream that waits on an event recorded in a capture joins it
// (CUDA's fork and join). cuStreamBeginCaptureToGraph captures into a
// graph the program made, after the nodes it names. cuGraphAdd*Node
// (graphbuild.go) adds kernel, copy, memset, empty and child-graph nodes
// directly, each depending only on nodes already in the graph, so the
// order nodes were added in is one CUDA may run them in. cuGraphLaunch
// replays an instantiated graph's enabled nodes in that order on the
// launching stream, a child graph's nodes in place of its node: running
// them one after another is one of the schedules CUDA may run, and the
// results are the same.
//
// Why here and not on the node: a replayed operation is an ordinary
// request, so a graph launch is as replicated, verified and exactly-once
// across a failover as the same operations queued one by one, and neither
// the node nor the standby learns a graph format. The cost is that a
// launch sends one pipelined request per operation (no round trip waits
// on it), where NVIDIA's driver submits the graph at once.
//
// A copy to or from host memory reads or writes the program's buffer when
// the graph runs, as a captured memcpy node does; the buffer must stay
// valid while the graph exists (CUDA's rule too). Captured event records
// and waits order work inside the graph and add no node. An instantiated
// graph's nodes are updated in place (cuGraphExec*NodeSetParams,
// cuGraphNodeSetEnabled, cuGraphExecUpdate), found by the handle of the
// node they were copied from. What is not served: host, event, memory
// (alloc/free) and conditional nodes, copies of more than one row, and
// nodes of module variables (their bytes move through the host, which a
// graph cannot replay); each answers CUDA_ERROR_NOT_SUPPORTED, or the
// capture is invalidated.

// CUstreamCaptureStatus and the errors CUDA gives for capture misuse.
const (
	CaptureNone        = 0
	CaptureActive      = 1
	CaptureInvalidated = 2

	ErrorCaptureUnsupported Result = 900 // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
	ErrorCaptureInvalidated Result = 901 // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	ErrorCaptureUnmatched   Result = 903 // CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
	ErrorCaptureWrongThread Result = 908 // CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
)

type nodeKind uint8

const (
	nodeLaunch nodeKind = iota + 1
	nodeCopyHtoD
	nodeCopyDtoH
	nodeCopyDtoD
	nodeMemset
	nodeEmpty
	nodeChild
)

// graphNode is one node: an operation (its stream is the launch's), an
// empty node, or a child graph.
type graphNode struct {
	id       uint64   // the CUgraphNode handle; an instantiated copy keeps it
	deps     []uint64 // the nodes this one runs after, all added before it
	disabled bool     // cuGraphNodeSetEnabled(…, 0) on an instantiated copy
	child    *graph   // nodeChild: a copy of the graph it was given
	kind     nodeKind
	fn       pvdriver.Function // nodeLaunch
	cfg      pvdriver.LaunchConfig
	args     []abi.Arg
	dst      uint64 // device destination (HtoD, DtoD, memset)
	src      uint64 // device source (DtoH, DtoD)
	n        uint64 // bytes (DtoD)
	host     []byte // the program's buffer (HtoD reads it, DtoH writes it, when the graph runs)
	width    uint8  // memset
	value    uint32
	count    uint64
	stream   uint64 // the captured stream, for error messages only
}

type graph struct {
	ctx   uint64
	nodes []graphNode
	index map[uint64]int // node handle → position in nodes
	// launched: a launch replays nodes as they are (without the lock), so
	// the next change works on a copy (mutable).
	launched bool
}

func newGraph(ctx uint64) *graph { return &graph{ctx: ctx, index: map[uint64]int{}} }

// add appends n, whose id is fresh.
func (g *graph) add(n graphNode) {
	g.index[n.id] = len(g.nodes)
	g.nodes = append(g.nodes, n)
}

// node is the node of g whose handle is id, or nil.
func (g *graph) node(id uint64) *graphNode {
	i, ok := g.index[id]
	if !ok {
		return nil
	}
	return &g.nodes[i]
}

// mutable is g's nodes, ready to be changed in place: a copy if a launch
// may still be replaying them.
func (g *graph) mutable() []graphNode {
	if g.launched {
		g.nodes, g.launched = append([]graphNode(nil), g.nodes...), false
	}
	return g.nodes
}

// copyOf is a copy of g whose nodes keep their handles (an instantiated
// graph, or a child graph's own copy); a child graph is shared, since
// nothing changes one in place.
func (g *graph) copyOf() *graph {
	c := &graph{ctx: g.ctx, nodes: append([]graphNode(nil), g.nodes...), index: make(map[uint64]int, len(g.nodes))}
	for id, i := range g.index {
		c.index[id] = i
	}
	return c
}

// capture is one stream capture in progress: the streams in it (the one
// that began it and those that joined), the graph it fills.
type capture struct {
	id      uint64
	origin  uint64
	mode    uint32
	graph   uint64 // the graph's handle, minted at the start (cuStreamGetCaptureInfo gives it)
	invalid bool   // an operation that capture does not allow happened: EndCapture fails
	// owned: the capture made its graph (cuStreamBeginCapture), so a
	// failed capture deletes it; a graph the program made
	// (cuStreamBeginCaptureToGraph) stays the program's.
	owned bool
	last  []uint64 // what the next captured node depends on
}

var captureIDs atomic.Uint64

// captureOf is the capture stream s belongs to, or nil.
// Precondition: d.mu must be locked.
func (d *Driver) captureOf(s uint64) *capture {
	if s == 0 || s == streamLegacy || s == streamPerThread {
		return nil
	}
	return d.captures[s]
}

// record appends n to the graph of the capture stream s is in; ok is false
// when s is not capturing (the caller then does the operation).
// Precondition: d.mu must be locked.
func (d *Driver) record(s uint64, n graphNode) (ok bool) {
	cp := d.captureOf(s)
	if cp == nil {
		return false
	}
	n.stream = s
	n.id, n.deps = d.mint(), cp.last
	d.graphs[cp.graph].add(n)
	cp.last = []uint64{n.id}
	return true
}

// recordLocked is record taking the lock.
func (d *Driver) recordLocked(s uint64, n graphNode) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.record(s, n)
}

// invalidateCaptures marks every capture in progress invalid and reports
// whether there was one: a synchronization of the whole context is not
// allowed while a stream captures, and ends the capture in error.
// Precondition: d.mu must be locked.
func (d *Driver) invalidateCaptures() bool {
	for _, cp := range d.captures {
		cp.invalid = true
	}
	return len(d.captures) > 0
}

// StreamBeginCapture is cuStreamBeginCapture_v2.
func (d *Driver) StreamBeginCapture(t Thread, s uint64, mode uint32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return r
	}
	if mode > 2 {
		return ErrorInvalidValue
	}
	if s == 0 || s == streamLegacy || s == streamPerThread {
		return ErrorCaptureUnsupported // the legacy stream cannot capture
	}
	if d.streams[s] == nil {
		return ErrorInvalidHandle
	}
	if d.captures[s] != nil {
		return ErrorIllegalState
	}
	g := d.mint()
	d.graphs[g] = newGraph(ctx)
	d.captures[s] = &capture{id: captureIDs.Add(1), origin: s, mode: mode, graph: g, owned: true}
	return Success
}

// StreamBeginCaptureToGraph is cuStreamBeginCaptureToGraph: as
// StreamBeginCapture, into the program's graph g, the first captured node
// after the nodes deps names (each must be in g).
func (d *Driver) StreamBeginCaptureToGraph(t Thread, s, g uint64, deps []uint64, mode uint32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return r
	}
	if mode > 2 {
		return ErrorInvalidValue
	}
	if s == 0 || s == streamLegacy || s == streamPerThread {
		return ErrorCaptureUnsupported
	}
	if d.streams[s] == nil {
		return ErrorInvalidHandle
	}
	if d.captures[s] != nil {
		return ErrorIllegalState
	}
	gr, r := d.liveGraph(g)
	if r != Success {
		return r
	}
	if r := gr.known(deps); r != Success {
		return r
	}
	d.captures[s] = &capture{id: captureIDs.Add(1), origin: s, mode: mode, graph: g, last: append([]uint64(nil), deps...)}
	return Success
}

// StreamEndCapture is cuStreamEndCapture: the graph, or an error that
// says why there is none (the capture was invalidated; s did not begin it).
func (d *Driver) StreamEndCapture(s uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	cp := d.captureOf(s)
	if cp == nil {
		return 0, ErrorIllegalState
	}
	if cp.origin != s {
		return 0, ErrorCaptureUnmatched
	}
	for h, other := range d.captures {
		if other == cp {
			delete(d.captures, h)
		}
	}
	for ev, other := range d.capturedEvents {
		if other == cp {
			delete(d.capturedEvents, ev)
		}
	}
	if cp.invalid {
		if cp.owned {
			delete(d.graphs, cp.graph)
		}
		return 0, ErrorCaptureInvalidated
	}
	return cp.graph, Success
}

// CaptureInfo is cuStreamGetCaptureInfo's answer for s: its status and,
// while it captures, the capture's id and graph.
func (d *Driver) CaptureInfo(s uint64) (status uint32, id, g uint64, r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, 0, 0, r
	}
	if _, r := d.stream(s); r != Success {
		return 0, 0, 0, r
	}
	cp := d.captureOf(s)
	switch {
	case cp == nil:
		return CaptureNone, 0, 0, Success
	case cp.invalid:
		return CaptureInvalidated, cp.id, cp.graph, Success
	}
	return CaptureActive, cp.id, cp.graph, Success
}

// captureEventRecord notes that ev was recorded in the capture s is in
// (ok), so a stream that waits on it joins that capture.
// Precondition: d.mu must be locked.
func (d *Driver) captureEventRecord(ev, s uint64) (ok bool) {
	cp := d.captureOf(s)
	if cp == nil {
		return false
	}
	d.capturedEvents[ev] = cp
	return true
}

// captureJoin makes s join the capture ev was recorded in, if it was.
// Precondition: d.mu must be locked.
func (d *Driver) captureJoin(s, ev uint64) {
	cp := d.capturedEvents[ev]
	if cp == nil || s == 0 || s == streamLegacy || s == streamPerThread {
		return
	}
	d.captures[s] = cp
}

// GraphCreate is cuGraphCreate: an empty graph (flags must be 0).
func (d *Driver) GraphCreate(t Thread, flags uint32) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	if flags != 0 {
		return 0, ErrorInvalidValue
	}
	g := d.mint()
	d.graphs[g] = newGraph(ctx)
	return g, Success
}

// liveGraph is g's graph, if g names one no capture still fills.
// Precondition: d.mu must be locked.
func (d *Driver) liveGraph(g uint64) (*graph, Result) {
	if r := d.ready(); r != Success {
		return nil, r
	}
	gr := d.graphs[g]
	if gr == nil {
		return nil, ErrorInvalidValue
	}
	for _, cp := range d.captures {
		if cp.graph == g {
			return nil, ErrorInvalidValue // still being captured
		}
	}
	return gr, Success
}

// GraphDestroy is cuGraphDestroy; instantiated graphs live on.
func (d *Driver) GraphDestroy(g uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.liveGraph(g); r != Success {
		return r
	}
	delete(d.graphs, g)
	return Success
}

// GraphInstantiate is cuGraphInstantiateWithFlags: an executable copy of
// g's operations. Of the flags, auto-free-on-launch, upload and device
// launch are accepted: this graph has no memory nodes, uploads nothing
// ahead, and device launch is refused at launch from a kernel anyway.
func (d *Driver) GraphInstantiate(g uint64, flags uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gr, r := d.liveGraph(g)
	if r != Success {
		return 0, r
	}
	if flags&^0xf != 0 {
		return 0, ErrorInvalidValue
	}
	h := d.mint()
	d.execs[h] = gr.copyOf()
	return h, Success
}

// liveExec checks that x names an instantiated graph.
// Precondition: d.mu must be locked.
func (d *Driver) liveExec(x uint64) Result {
	if r := d.ready(); r != Success {
		return r
	}
	if d.execs[x] == nil {
		return ErrorInvalidValue
	}
	return Success
}

// GraphExecDestroy is cuGraphExecDestroy.
func (d *Driver) GraphExecDestroy(x uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.liveExec(x); r != Success {
		return r
	}
	delete(d.execs, x)
	return Success
}

// GraphUpload is cuGraphUpload: nothing to do ahead of a launch here.
func (d *Driver) GraphUpload(x, s uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.liveExec(x); r != Success {
		return r
	}
	_, r := d.stream(s)
	return r
}

// GraphLaunch is cuGraphLaunch: x's operations, in order, on stream s;
// launched into a capturing stream, they are captured in turn.
func (d *Driver) GraphLaunch(t Thread, x, s uint64) Result {
	d.mu.Lock()
	if _, r := d.current(t); r != Success {
		d.mu.Unlock()
		return r
	}
	ex := d.execs[x]
	st, r := d.stream(s)
	c := d.client
	var nodes []graphNode
	if ex != nil {
		nodes, ex.launched = ex.nodes, true
	}
	if ex != nil && r == Success && d.captureOf(s) != nil {
		d.record(s, graphNode{kind: nodeChild, child: ex.copyOf()}) // the graph as it is now, as CUDA captures a graph launch
		d.mu.Unlock()
		return Success
	}
	d.mu.Unlock()
	if ex == nil {
		return ErrorInvalidValue
	}
	if r != Success {
		return r
	}
	if r := d.beforeWork(c); r != Success {
		return r
	}
	return replayGraph(c, nodes, st)
}

// replayGraph queues the enabled nodes on stream st, in order.
func replayGraph(c *pvdriver.Client, nodes []graphNode, st pvdriver.Stream) Result {
	for i := range nodes {
		if nodes[i].disabled {
			continue
		}
		if r := replay(c, &nodes[i], st); r != Success {
			return r
		}
	}
	return Success
}

// noWork reports whether n sends nothing: an empty node, or an operation
// of no bytes.
func (n *graphNode) noWork() bool {
	switch n.kind {
	case nodeEmpty:
		return true
	case nodeCopyHtoD, nodeCopyDtoH:
		return len(n.host) == 0
	case nodeCopyDtoD:
		return n.n == 0
	case nodeMemset:
		return n.count == 0
	}
	return false
}

// replay queues one node's operations on stream st.
func replay(c *pvdriver.Client, n *graphNode, st pvdriver.Stream) Result {
	if n.noWork() {
		return Success
	}
	switch n.kind {
	case nodeChild:
		return replayGraph(c, n.child.nodes, st)
	case nodeLaunch:
		cfg := n.cfg
		cfg.Stream = st
		return resultOf("cuGraphLaunch", c.Launch(n.fn, cfg, n.args...), false)
	case nodeCopyHtoD:
		return resultOf("cuGraphLaunch", c.CopyHtoDAsync(pvdriver.DevicePtr(n.dst), n.host, st), false)
	case nodeCopyDtoH:
		return resultOf("cuGraphLaunch", c.CopyDtoH(n.host, pvdriver.DevicePtr(n.src)), false)
	case nodeCopyDtoD:
		return resultOf("cuGraphLaunch", c.CopyDtoDAsync(pvdriver.DevicePtr(n.dst), pvdriver.DevicePtr(n.src), n.n, st), false)
	case nodeMemset:
		return resultOf("cuGraphLaunch", c.Memset(pvdriver.DevicePtr(n.dst), n.width, n.value, n.count, st, false), false)
	}
	return ErrorNotSupported
}

// captured records a copy or memset touching [addr, addr+n) into the
// capture stream s is in (ok); a module variable's bytes move through the
// host (globals.go), which a graph cannot replay, so capturing one fails.
func (d *Driver) captured(s uint64, n graphNode, addr, size uint64) (r Result, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cp := d.captureOf(s)
	if cp == nil {
		return Success, false
	}
	_, _, dstGlobal := d.globalAt(addr, max(size, 1))
	_, _, srcGlobal := d.globalAt(n.src, max(size, 1))
	if dstGlobal || (n.kind == nodeCopyDtoD && srcGlobal) {
		cp.invalid = true
		return ErrorCaptureUnsupported, true
	}
	d.record(s, n)
	return Success, true
}

// HostFuncPoint is where cuLaunchHostFunc's function may run: once stream
// s's earlier work is done (its error, if it failed, is returned and the
// function is not run). A capture cannot hold one: it ends in error.
func (d *Driver) HostFuncPoint(t Thread, s uint64) Result {
	d.mu.Lock()
	if cp := d.captureOf(s); cp != nil {
		cp.invalid = true
		d.mu.Unlock()
		return ErrorCaptureUnsupported
	}
	d.mu.Unlock()
	return d.StreamSynchronize(t, s)
}
