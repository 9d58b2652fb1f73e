package worker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// link is the parent's end of a worker's protocol: requests out, replies
// in, the shared memory.
type link struct {
	// inline is the largest copy sent in the frame (inlineMax, or zero
	// for inlineMax; a benchmark moves it).
	inline int
	w      io.Writer
	r      *bufio.Reader
	shm    []byte
	req    []byte // the request being built, reused
	rep    []byte // the last reply's payload, reused
	// held is asynchronous frames not yet written, while hold
	// (BatchLaunches): the next frame that is not one, holdBytes of
	// them, or a flush writes them.
	held []byte
	hold bool
}

// holdBytes is the most bytes of asynchronous frames held back: a
// hundred or more launches in one write and one wake-up of the worker.
const holdBytes = 32 << 10

// inlined reports whether n bytes travel in the frame.
func (l *link) inlined(n int) bool {
	if l.inline == 0 {
		return n <= inlineMax
	}
	return n <= min(l.inline, maxInline)
}

// start begins a request of op o.
func (l *link) start(o op, flags uint8) []byte {
	l.req = append(appendFrame(l.req), byte(o), flags)
	return l.req
}

// roundTrip sends request b and, unless it is asynchronous, reads its
// reply: a decoder over its body, or the child's error (a childError),
// or the link's.
func (l *link) roundTrip(b []byte) (*abi.Decoder, error) {
	l.req = b
	sealFrame(b)
	async := b[5]&flagAsync != 0
	if async && l.hold {
		if l.held = append(l.held, b...); len(l.held) < holdBytes {
			return nil, nil
		}
		return nil, l.flush()
	}
	out := b
	if len(l.held) > 0 { // what was held goes first, in the same write
		l.held = append(l.held, b...)
		out = l.held
	}
	_, err := l.w.Write(out)
	l.held = l.held[:0]
	if err != nil || async {
		return nil, err
	}
	if l.rep, err = readFrame(l.r, l.rep, maxReply); err != nil {
		return nil, err
	}
	return splitReply(l.rep)
}

// flush writes the frames held.
func (l *link) flush() error {
	if len(l.held) == 0 {
		return nil
	}
	_, err := l.w.Write(l.held)
	l.held = l.held[:0]
	return err
}

// ask sends a request of op o whose body is words.
func (l *link) ask(o op, words ...uint64) (*abi.Decoder, error) {
	return l.roundTrip(appendU64s(l.start(o, 0), words...))
}

// proxy is a gpu.Context whose calls its worker runs.
type proxy struct {
	mu   sync.Mutex
	be   *Backend // nil in tests of the protocol alone
	proc *process // nil in tests of the protocol alone
	link
	base, size uint64
	async      bool  // launches go unanswered (PipelineLaunches)
	dead       error // set once the worker is gone: every call fails with it
}

// pipelined is a proxy whose worker's context pipelines launches.
type pipelined struct{ *proxy }

// PipelineLaunches implements gpu.LaunchPipeliner: the worker's context
// pipelines, and launches go unanswered from now on.
func (p pipelined) PipelineLaunches() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.async {
		return
	}
	if _, err := p.call(p.start(opPipeline, 0)); err == nil {
		p.async = true
	}
}

// BatchLaunches implements gpu.LaunchBatcher: launches are held back
// until the next call that is not one, holdBytes of them, or a Flush.
func (p pipelined) BatchLaunches() {
	p.mu.Lock()
	p.hold = true
	p.mu.Unlock()
}

// Flush implements gpu.LaunchBatcher.
func (p pipelined) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead != nil {
		return p.dead
	}
	if err := p.flush(); err != nil {
		p.die(err)
		return p.dead
	}
	return nil
}

// errClosed fails calls on a closed context.
var errClosed = fmt.Errorf("%w: the GPU context is closed", abi.StatusInvalidHandle)

// call is roundTrip for a context: the worker's loss, or a broken reply,
// ends it for good.
// Precondition: p.mu must be locked.
func (p *proxy) call(b []byte) (*abi.Decoder, error) {
	if p.dead != nil {
		return nil, p.dead
	}
	d, err := p.roundTrip(b)
	var ce *childError
	if err != nil && !errors.As(err, &ce) {
		p.die(err)
		return nil, p.dead
	}
	return d, err
}

// ask is call for a request whose body is words.
// Precondition: p.mu must be locked.
func (p *proxy) ask(o op, words ...uint64) (*abi.Decoder, error) {
	return p.call(appendU64s(p.start(o, 0), words...))
}

// done checks a reply's body was read whole and well; a broken one ends
// the worker.
// Precondition: p.mu must be locked.
func (p *proxy) done(d *abi.Decoder) error {
	if err := finish(d); err != nil {
		p.die(err)
		return p.dead
	}
	return nil
}

// die ends the worker (if it still runs), reaps it and fails every later
// call with what became of it, as CUDA fails every call of a context a
// kernel's fault ended.
// Precondition: p.mu must be locked.
func (p *proxy) die(cause error) {
	if p.dead != nil {
		return
	}
	who, how := "", ""
	if p.proc != nil {
		who = fmt.Sprintf(" (pid %d)", p.proc.pid)
		if err := p.proc.end(time.Second); err != nil {
			how = err.Error() + "; "
		} else {
			how = "exited; "
		}
	}
	p.dead = fmt.Errorf("%w: this session's GPU worker%s ended (%s%v): its context and everything in it are lost",
		abi.StatusLaunchFailed, who, how, cause)
	p.be.forget(p)
}

// Window implements gpu.Context.
func (p *proxy) Window() (uint64, uint64) { return p.base, p.size }

// Alloc implements gpu.Context.
func (p *proxy) Alloc(addr, size uint64) error { return p.plain(opAlloc, addr, size) }

// Free implements gpu.Context.
func (p *proxy) Free(addr uint64) error { return p.plain(opFree, addr) }

// plain runs a request whose body is words and whose reply has none.
func (p *proxy) plain(o op, words ...uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.ask(o, words...)
	if err != nil {
		return err
	}
	return p.done(d)
}

// handle runs a request whose reply is one handle.
// Precondition: p.mu must be locked.
func (p *proxy) handle(b []byte) (uint64, error) {
	d, err := p.call(b)
	if err != nil {
		return 0, err
	}
	h := d.U64()
	return h, p.done(d)
}

// CopyHtoD implements gpu.Context.
func (p *proxy) CopyHtoD(dst uint64, src []byte, s gpu.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.send(opCopyHtoD, src, dst, uint64(s))
}

// send writes data to the worker for op o, after the fields words (the
// first an address, which each piece advances): inline, or through the
// shared memory in pieces.
// Precondition: p.mu must be locked.
func (p *proxy) send(o op, data []byte, words ...uint64) error {
	for first := true; first || len(data) > 0; first = false {
		var b []byte
		n := len(data)
		if p.inlined(n) {
			b = appendBytes(appendU64s(p.start(o, 0), words...), data)
		} else {
			n = min(n, len(p.shm))
			copy(p.shm, data[:n])
			b = appendU64s(appendU64s(p.start(o, flagShm), words...), uint64(n))
		}
		d, err := p.call(b)
		if err != nil {
			return err
		}
		if err := p.done(d); err != nil {
			return err
		}
		data, words[0] = data[n:], words[0]+uint64(n)
	}
	return nil
}

// receive reads len(dst) bytes from the worker for op o, asked with
// (address, length, words...): inline, or through the shared memory in
// pieces.
// Precondition: p.mu must be locked.
func (p *proxy) receive(o op, dst []byte, addr uint64, words ...uint64) error {
	for first := true; first || len(dst) > 0; first = false {
		n, flags := len(dst), uint8(0)
		if !p.inlined(n) {
			n, flags = min(n, len(p.shm)), flagShm
		}
		b := appendU64s(appendU64s(p.start(o, flags), addr, uint64(n)), words...)
		d, err := p.call(b)
		if err != nil {
			return err
		}
		var got []byte
		if flags == 0 {
			got = d.Bytes(maxInline)
		}
		if err := p.done(d); err != nil {
			return err
		}
		if flags != 0 {
			copy(dst, p.shm[:n])
		} else if len(got) == n {
			copy(dst, got)
		} else {
			p.die(fmt.Errorf("%w: %d bytes answered, %d asked", errProtocol, len(got), n))
			return p.dead
		}
		dst, addr = dst[n:], addr+uint64(n)
	}
	return nil
}

// CopyDtoH implements gpu.Context.
func (p *proxy) CopyDtoH(dst []byte, src uint64, s gpu.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.receive(opCopyDtoH, dst, src, uint64(s))
}

// CopyDtoD implements gpu.Context.
func (p *proxy) CopyDtoD(dst, src, size uint64, s gpu.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := abi.CopyDtoD{Dst: dst, Src: src, Size: size, Stream: uint64(s)}
	d, err := p.call(r.Append(p.start(opCopyDtoD, 0)))
	if err != nil {
		return err
	}
	return p.done(d)
}

// Memset implements gpu.Context.
func (p *proxy) Memset(dst uint64, width int, value uint32, count uint64, s gpu.Stream) error {
	if width != 1 && width != 2 && width != 4 {
		return fmt.Errorf("%w: memset width %d (want 1, 2 or 4)", abi.StatusInvalidValue, width)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r := abi.Memset{Dst: dst, Width: uint8(width), Value: value, Count: count, Stream: uint64(s)}
	d, err := p.call(r.Append(p.start(opMemset, 0)))
	if err != nil {
		return err
	}
	return p.done(d)
}

// LoadModule implements gpu.Context.
func (p *proxy) LoadModule(img *abi.ModuleImage) (gpu.Module, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, err := p.handle(img.Append(p.start(opLoadModule, 0)))
	return gpu.Module(m), err
}

// UnloadModule implements gpu.Context.
func (p *proxy) UnloadModule(m gpu.Module) error { return p.plain(opUnloadModule, uint64(m)) }

// Function implements gpu.Context.
func (p *proxy) Function(m gpu.Module, name string) (gpu.Function, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := abi.GetFunction{Module: uint64(m), Name: name}
	f, err := p.handle(r.Append(p.start(opFunction, 0)))
	return gpu.Function(f), err
}

// Launch implements gpu.Context. Once launches are pipelined the worker
// does not answer one: its failure comes with the next Sync or SyncStream.
func (p *proxy) Launch(f gpu.Function, cfg gpu.LaunchConfig, args []abi.Arg, s gpu.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := abi.Launch{Function: uint64(f), Grid: cfg.Grid, Block: cfg.Block, SharedBytes: cfg.SharedBytes,
		Stream: uint64(s), Args: args, Cluster: cfg.Cluster, Cooperative: cfg.Cooperative}
	var flags uint8
	if p.async {
		flags = flagAsync
	}
	d, err := p.call(r.Append(p.start(opLaunch, flags)))
	if err != nil || d == nil {
		return err
	}
	return p.done(d)
}

// CreateStream implements gpu.Context.
func (p *proxy) CreateStream() (gpu.Stream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, err := p.handle(p.start(opCreateStream, 0))
	return gpu.Stream(s), err
}

// DestroyStream implements gpu.Context.
func (p *proxy) DestroyStream(s gpu.Stream) error { return p.plain(opDestroyStream, uint64(s)) }

// SyncStream implements gpu.Context.
func (p *proxy) SyncStream(s gpu.Stream) error { return p.plain(opSyncStream, uint64(s)) }

// Sync implements gpu.Context.
func (p *proxy) Sync() error { return p.plain(opSync) }

// Close implements gpu.Context: the worker closes the context, then ends
// and is reaped.
func (p *proxy) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead != nil {
		p.dead = errClosed
		return nil
	}
	d, err := p.ask(opClose)
	if err == nil {
		err = p.done(d)
	}
	if p.dead == nil && p.proc != nil {
		p.proc.end(5 * time.Second)
	}
	p.dead = errClosed
	p.be.forget(p)
	return err
}

// ParamSlots implements gpu.FunctionDescriber.
func (p *proxy) ParamSlots(f gpu.Function) ([]abi.ParamSlot, error) {
	r, err := p.functionParams(opParamSlots, f)
	return r.Slots, err
}

// FunctionAttrs implements gpu.FunctionDescriber (none where the worker's
// GPU gives none).
func (p *proxy) FunctionAttrs(f gpu.Function) ([]int32, error) {
	r, err := p.functionParams(opFunctionAttrs, f)
	return r.Attrs, err
}

func (p *proxy) functionParams(o op, f gpu.Function) (abi.FunctionParamsReply, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var r abi.FunctionParamsReply
	d, err := p.ask(o, uint64(f))
	if err != nil {
		return r, err
	}
	raw := d.Bytes(maxReply)
	if err := p.done(d); err != nil {
		return r, err
	}
	if err := abi.Unmarshal(raw, &r); err != nil {
		p.die(fmt.Errorf("%w: function parameters: %w", errProtocol, err))
		return r, p.dead
	}
	return r, nil
}

// Global implements gpu.GlobalAccessor.
func (p *proxy) Global(m gpu.Module, name string) (addr, size uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.call(appendString(appendU64s(p.start(opGlobal, 0), uint64(m)), name))
	if err != nil {
		return 0, 0, err
	}
	addr, size = d.U64(), d.U64()
	return addr, size, p.done(d)
}

// WriteGlobal implements gpu.GlobalAccessor.
func (p *proxy) WriteGlobal(addr uint64, src []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.send(opWriteGlobal, src, addr)
}

// ReadGlobal implements gpu.GlobalAccessor.
func (p *proxy) ReadGlobal(dst []byte, addr uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.receive(opReadGlobal, dst, addr)
}

// EncodeTensorMapTiled implements gpu.TensorMapEncoder.
func (p *proxy) EncodeTensorMapTiled(r *abi.TensorMapEncode) ([abi.TensorMapBytes]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var m [abi.TensorMapBytes]byte
	d, err := p.call(r.Append(p.start(opTensorMap, 0)))
	if err != nil {
		return m, err
	}
	raw := d.Bytes(abi.TensorMapBytes)
	if err := p.done(d); err != nil {
		return m, err
	}
	if len(raw) != len(m) {
		p.die(fmt.Errorf("%w: a %d-byte tensor map", errProtocol, len(raw)))
		return m, p.dead
	}
	copy(m[:], raw)
	return m, nil
}

// Checksum implements gpu.Checksummer (on the worker's device where its
// backend can).
func (p *proxy) Checksum(addr, n uint64) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.ask(opChecksum, addr, n)
	if err != nil {
		return 0, err
	}
	sum := d.U64()
	return sum, p.done(d)
}

// Occupancy implements gpu.OccupancyCalculator (not supported where the
// worker's GPU has no calculator).
func (p *proxy) Occupancy(f gpu.Function, q *abi.Occupancy) (int32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := *q
	r.Function = uint64(f)
	d, err := p.call(r.Append(p.start(opOccupancy, 0)))
	if err != nil {
		return 0, err
	}
	v := int32(d.U32())
	return v, p.done(d)
}
