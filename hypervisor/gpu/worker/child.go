package worker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// child is a worker process's end: the real backend it opened and the one
// context it serves.
type child struct {
	be  gpu.Backend
	ctx gpu.Context
	shm []byte
	// failed is a pipelined launch's failure the parent has not heard yet
	// (its next Sync or SyncStream reports it).
	failed error
	out    []byte // the reply's body, as a handler builds it
	frame  []byte // the reply
	buf    []byte // inline bytes read from the device
}

// Describe's capability bits of the backend, NewContext's of the context.
const (
	capAccessChecker uint32 = 1 << iota // gpu.AccessChecker says every access is checked
	capDeviceInfo                       // gpu.DeviceDescriber: a description follows
)

// capPipeline: the worker takes launches unanswered (every worker does:
// the child runs each as it reads it and keeps a failure for the next
// synchronization, whatever its backend).
const capPipeline uint32 = 1

// handlers is the child's dispatch table, by op. A handler reads its body
// and appends its reply's body to c.out; ctx says it needs the context.
var handlers = [opCount]struct {
	ctx bool
	run func(c *child, body []byte, flags uint8) error
}{
	opDescribe:      {false, (*child).describe},
	opNewContext:    {false, (*child).newContext},
	opAlloc:         {true, func(c *child, b []byte, _ uint8) error { return c.addrSize(b, c.ctx.Alloc) }},
	opFree:          {true, func(c *child, b []byte, _ uint8) error { return c.addr(b, c.ctx.Free) }},
	opCopyHtoD:      {true, (*child).copyHtoD},
	opCopyDtoH:      {true, (*child).copyDtoH},
	opCopyDtoD:      {true, (*child).copyDtoD},
	opMemset:        {true, (*child).memset},
	opLoadModule:    {true, (*child).loadModule},
	opUnloadModule:  {true, func(c *child, b []byte, _ uint8) error { return c.addr(b, c.unload) }},
	opFunction:      {true, (*child).function},
	opLaunch:        {true, (*child).launch},
	opCreateStream:  {true, (*child).createStream},
	opDestroyStream: {true, func(c *child, b []byte, _ uint8) error { return c.addr(b, c.destroyStream) }},
	opSyncStream:    {true, func(c *child, b []byte, _ uint8) error { return c.addr(b, c.syncStream) }},
	opSync:          {true, (*child).sync},
	opClose:         {true, (*child).close},
	opPipeline:      {true, (*child).pipeline},
	opParamSlots:    {true, (*child).paramSlots},
	opFunctionAttrs: {true, (*child).functionAttrs},
	opGlobal:        {true, (*child).global},
	opWriteGlobal:   {true, (*child).writeGlobal},
	opReadGlobal:    {true, (*child).readGlobal},
	opTensorMap:     {true, (*child).tensorMap},
	opChecksum:      {true, (*child).checksum},
	opOccupancy:     {true, (*child).occupancy},
}

// serve answers the parent's requests on conn with be until the parent
// closes its end (nil) or breaks the protocol. shm is the memory the two
// share. The caller closes what serve leaves open (the context, if the
// parent never closed it, and be).
func serve(conn io.ReadWriter, be gpu.Backend, shm []byte) (gpu.Context, error) {
	c := &child{be: be, shm: shm}
	r := bufio.NewReaderSize(conn, 64<<10)
	var req []byte
	for {
		var err error
		if req, err = readFrame(r, req, maxRequest); err != nil {
			if errors.Is(err, io.EOF) {
				return c.ctx, nil
			}
			return c.ctx, err
		}
		if len(req) < 2 || req[0] == byte(opInvalid) || req[0] >= byte(opCount) {
			return c.ctx, fmt.Errorf("%w: a request of %d bytes, op %d", errProtocol, len(req), firstByte(req))
		}
		h, flags := handlers[req[0]], req[1]
		c.out = c.out[:0]
		if h.ctx && c.ctx == nil {
			err = fmt.Errorf("%w: the worker has no context (not made, or closed)", abi.StatusInvalidHandle)
		} else {
			err = h.run(c, req[2:], flags)
		}
		if flags&flagAsync != 0 {
			if err != nil && c.failed == nil {
				c.failed = err
			}
			continue
		}
		c.frame = appendReply(appendFrame(c.frame), err, guesterr.StatusOf(err))
		if err == nil {
			c.frame = append(c.frame, c.out...)
		}
		if _, err := conn.Write(sealFrame(c.frame)); err != nil {
			return c.ctx, err
		}
	}
}

func firstByte(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// decode runs read over body and checks it was read whole.
func decode(body []byte, read func(d *abi.Decoder)) error {
	d := abi.NewDecoder(body)
	read(d)
	return finish(d)
}

func (c *child) addr(b []byte, fn func(uint64) error) error {
	var a uint64
	if err := decode(b, func(d *abi.Decoder) { a = d.U64() }); err != nil {
		return err
	}
	return fn(a)
}

func (c *child) addrSize(b []byte, fn func(a, n uint64) error) error {
	var a, n uint64
	if err := decode(b, func(d *abi.Decoder) { a, n = d.U64(), d.U64() }); err != nil {
		return err
	}
	return fn(a, n)
}

func (c *child) describe(b []byte, _ uint8) error {
	if err := decode(b, func(*abi.Decoder) {}); err != nil {
		return err
	}
	if u, ok := c.be.(unopened); ok {
		return u.err
	}
	var caps, optIn uint32
	if a, ok := c.be.(gpu.AccessChecker); ok && a.ChecksEveryAccess() {
		caps |= capAccessChecker
	}
	if l, ok := c.be.(gpu.SharedMemoryLimiter); ok {
		optIn = l.MaxSharedBytesOptIn()
	}
	var info abi.DeviceInfoReply
	if d, ok := c.be.(gpu.DeviceDescriber); ok {
		var err error
		if info, err = d.DeviceInfo(); err != nil {
			return err
		}
		caps |= capDeviceInfo
	}
	c.out = appendString(c.out, c.be.Name())
	c.out = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(c.out, caps), optIn)
	var raw []byte
	if caps&capDeviceInfo != 0 {
		raw = info.Append(nil)
	}
	c.out = appendBytes(c.out, raw)
	return nil
}

func (c *child) newContext(b []byte, _ uint8) error {
	return c.addrSize(b, func(base, size uint64) error {
		if c.ctx != nil {
			return fmt.Errorf("%w: a worker serves one context", abi.StatusInvalidValue)
		}
		start := time.Now()
		ctx, err := c.be.NewContext(base, size)
		if err != nil {
			return err
		}
		slow("making its context", start)
		c.ctx = ctx
		caps := capPipeline
		got, n := ctx.Window()
		c.out = binary.LittleEndian.AppendUint32(appendU64s(c.out, got, n), caps)
		return nil
	})
}

// data is a request's bytes: after the fields read reads, either inline
// or, with flagShm, their length, at the start of the shared memory.
func (c *child) data(b []byte, flags uint8, read func(d *abi.Decoder)) ([]byte, error) {
	var inline []byte
	var n uint64
	err := decode(b, func(d *abi.Decoder) {
		read(d)
		if flags&flagShm == 0 {
			inline = d.Bytes(maxRequest)
		} else {
			n = d.U64()
		}
	})
	switch {
	case err != nil:
		return nil, err
	case flags&flagShm == 0:
		return inline, nil
	case n > uint64(len(c.shm)):
		return nil, fmt.Errorf("%w: %d bytes in a shared memory of %d", errProtocol, n, len(c.shm))
	}
	return c.shm[:n], nil
}

// into is where n bytes read from the device go: the reply's inline
// bytes, or, with flagShm, the shared memory.
func (c *child) into(n uint64, flags uint8) ([]byte, error) {
	switch {
	case flags&flagShm == 0 && n <= maxInline:
		if uint64(cap(c.buf)) < n {
			c.buf = make([]byte, n)
		}
		return c.buf[:n], nil
	case flags&flagShm != 0 && n <= uint64(len(c.shm)):
		return c.shm[:n], nil
	}
	return nil, fmt.Errorf("%w: %d bytes asked, more than a reply or the shared memory holds", errProtocol, n)
}

// reply adds bytes read into (into's) to the reply when they are inline.
func (c *child) reply(p []byte, flags uint8) {
	if flags&flagShm == 0 {
		c.out = appendBytes(c.out, p)
	}
}

func (c *child) copyHtoD(b []byte, flags uint8) error {
	var dst, s uint64
	data, err := c.data(b, flags, func(d *abi.Decoder) { dst, s = d.U64(), d.U64() })
	if err != nil {
		return err
	}
	return c.ctx.CopyHtoD(dst, data, gpu.Stream(s))
}

func (c *child) copyDtoH(b []byte, flags uint8) error {
	var src, n, s uint64
	if err := decode(b, func(d *abi.Decoder) { src, n, s = d.U64(), d.U64(), d.U64() }); err != nil {
		return err
	}
	p, err := c.into(n, flags)
	if err != nil {
		return err
	}
	if err := c.ctx.CopyDtoH(p, src, gpu.Stream(s)); err != nil {
		return err
	}
	c.reply(p, flags)
	return nil
}

func (c *child) copyDtoD(b []byte, _ uint8) error {
	var r abi.CopyDtoD
	if err := abi.Unmarshal(b, &r); err != nil {
		return err
	}
	return c.ctx.CopyDtoD(r.Dst, r.Src, r.Size, gpu.Stream(r.Stream))
}

func (c *child) memset(b []byte, _ uint8) error {
	var r abi.Memset
	if err := abi.Unmarshal(b, &r); err != nil {
		return err
	}
	return c.ctx.Memset(r.Dst, int(r.Width), r.Value, r.Count, gpu.Stream(r.Stream))
}

func (c *child) loadModule(b []byte, _ uint8) error {
	// The image's own copy: the request's buffer is the next request's,
	// and a backend may keep a raw image's bytes.
	img, err := abi.DecodeOwnedModuleImage(append([]byte(nil), b...))
	if err != nil {
		return err
	}
	m, err := c.ctx.LoadModule(img)
	if err == nil {
		c.out = appendU64s(c.out, uint64(m))
	}
	return err
}

func (c *child) unload(m uint64) error        { return c.ctx.UnloadModule(gpu.Module(m)) }
func (c *child) destroyStream(s uint64) error { return c.ctx.DestroyStream(gpu.Stream(s)) }

func (c *child) function(b []byte, _ uint8) error {
	var r abi.GetFunction
	if err := abi.Unmarshal(b, &r); err != nil {
		return err
	}
	f, err := c.ctx.Function(gpu.Module(r.Module), r.Name)
	if err == nil {
		c.out = appendU64s(c.out, uint64(f))
	}
	return err
}

func (c *child) launch(b []byte, _ uint8) error {
	var r abi.Launch
	if err := abi.Unmarshal(b, &r); err != nil {
		return err
	}
	cfg := gpu.LaunchConfig{Grid: r.Grid, Block: r.Block, SharedBytes: r.SharedBytes, Cluster: r.Cluster, Cooperative: r.Cooperative}
	return c.ctx.Launch(gpu.Function(r.Function), cfg, r.Args, gpu.Stream(r.Stream))
}

func (c *child) createStream(b []byte, _ uint8) error {
	if err := decode(b, func(*abi.Decoder) {}); err != nil {
		return err
	}
	s, err := c.ctx.CreateStream()
	if err == nil {
		c.out = appendU64s(c.out, uint64(s))
	}
	return err
}

// takeFailed returns, once, a pipelined launch's failure.
func (c *child) takeFailed() error {
	err := c.failed
	c.failed = nil
	return err
}

func (c *child) syncStream(s uint64) error {
	if err := c.takeFailed(); err != nil {
		return err
	}
	return c.ctx.SyncStream(gpu.Stream(s))
}

func (c *child) sync(b []byte, _ uint8) error {
	if err := decode(b, func(*abi.Decoder) {}); err != nil {
		return err
	}
	if err := c.takeFailed(); err != nil {
		return err
	}
	return c.ctx.Sync()
}

func (c *child) close(b []byte, _ uint8) error {
	if err := decode(b, func(*abi.Decoder) {}); err != nil {
		return err
	}
	err := c.ctx.Close()
	c.ctx = nil
	return err
}

func (c *child) pipeline(b []byte, _ uint8) error {
	if err := decode(b, func(*abi.Decoder) {}); err != nil {
		return err
	}
	// The parent stops waiting for launches; the child still runs each
	// as it reads it and keeps a failure for the next synchronization
	// (serve). The context's own launcher thread is not started: it
	// spins for a while after each launch, a core per worker with
	// sixteen guests' workers on one host, and a worker has nothing else
	// to do while the driver takes a launch.
	return nil
}

func (c *child) describer() (gpu.FunctionDescriber, bool) {
	d, ok := c.ctx.(gpu.FunctionDescriber)
	return d, ok
}

func (c *child) paramSlots(b []byte, _ uint8) error {
	return c.addr(b, func(f uint64) error {
		d, ok := c.describer()
		if !ok {
			return fmt.Errorf("%w: this GPU cannot report a kernel's parameters", abi.StatusNotSupported)
		}
		slots, err := d.ParamSlots(gpu.Function(f))
		if err == nil {
			c.out = appendBytes(c.out, (&abi.FunctionParamsReply{Slots: slots}).Append(nil))
		}
		return err
	})
}

// functionAttrs answers no attributes where the GPU gives none, as a
// context without gpu.FunctionDescriber.
func (c *child) functionAttrs(b []byte, _ uint8) error {
	return c.addr(b, func(f uint64) error {
		var attrs []int32
		if d, ok := c.describer(); ok {
			var err error
			if attrs, err = d.FunctionAttrs(gpu.Function(f)); err != nil {
				return err
			}
		}
		c.out = appendBytes(c.out, (&abi.FunctionParamsReply{Attrs: attrs}).Append(nil))
		return nil
	})
}

func (c *child) globals() (gpu.GlobalAccessor, error) {
	if g, ok := c.ctx.(gpu.GlobalAccessor); ok {
		return g, nil
	}
	return nil, fmt.Errorf("%w: this GPU backend cannot reach module variables: use --backend cuda", abi.StatusNotSupported)
}

func (c *child) global(b []byte, _ uint8) error {
	var m uint64
	var name string
	if err := decode(b, func(d *abi.Decoder) { m, name = d.U64(), d.String(abi.MaxKernelName) }); err != nil {
		return err
	}
	g, err := c.globals()
	if err != nil {
		return err
	}
	addr, size, err := g.Global(gpu.Module(m), name)
	if err == nil {
		c.out = appendU64s(c.out, addr, size)
	}
	return err
}

func (c *child) writeGlobal(b []byte, flags uint8) error {
	var addr uint64
	data, err := c.data(b, flags, func(d *abi.Decoder) { addr = d.U64() })
	if err != nil {
		return err
	}
	g, err := c.globals()
	if err != nil {
		return err
	}
	return g.WriteGlobal(addr, data)
}

func (c *child) readGlobal(b []byte, flags uint8) error {
	var addr, n uint64
	if err := decode(b, func(d *abi.Decoder) { addr, n = d.U64(), d.U64() }); err != nil {
		return err
	}
	g, err := c.globals()
	if err != nil {
		return err
	}
	p, err := c.into(n, flags)
	if err != nil {
		return err
	}
	if err := g.ReadGlobal(p, addr); err != nil {
		return err
	}
	c.reply(p, flags)
	return nil
}

func (c *child) tensorMap(b []byte, _ uint8) error {
	var r abi.TensorMapEncode
	if err := abi.Unmarshal(b, &r); err != nil {
		return err
	}
	enc, ok := c.ctx.(gpu.TensorMapEncoder)
	if !ok {
		return fmt.Errorf("%w: this node's GPU encodes no tensor maps (the software GPU has no tensor-memory accelerator)", abi.StatusNotSupported)
	}
	m, err := enc.EncodeTensorMapTiled(&r)
	if err == nil {
		c.out = appendBytes(c.out, m[:])
	}
	return err
}

func (c *child) occupancy(b []byte, _ uint8) error {
	var r abi.Occupancy
	if err := abi.Unmarshal(b, &r); err != nil {
		return err
	}
	calc, ok := c.ctx.(gpu.OccupancyCalculator)
	if !ok {
		return fmt.Errorf("%w: occupancy: the %s GPU has no occupancy calculator", abi.StatusNotSupported, c.be.Name())
	}
	v, err := calc.Occupancy(gpu.Function(r.Function), &r)
	if err == nil {
		c.out = binary.LittleEndian.AppendUint32(c.out, uint32(v))
	}
	return err
}

// maxChecksumCopy bounds the bytes a checksum copies to the host where
// the context cannot checksum on the device.
const maxChecksumCopy = 1 << 34

func (c *child) checksum(b []byte, _ uint8) error {
	return c.addrSize(b, func(addr, n uint64) error {
		var sum uint64
		var err error
		if cs, ok := c.ctx.(gpu.Checksummer); ok {
			sum, err = cs.Checksum(addr, n)
		} else if n > maxChecksumCopy {
			err = fmt.Errorf("%w: a checksum of %d bytes", abi.StatusInvalidValue, n)
		} else {
			buf := make([]byte, n)
			if err = c.ctx.CopyDtoH(buf, addr, 0); err == nil {
				sum = gpu.Checksum(buf)
			}
		}
		if err == nil {
			c.out = appendU64s(c.out, sum)
		}
		return err
	})
}

// unopened stands for a backend the worker could not open: every request
// answers why, so the node hears it (a worker's stderr may go nowhere).
type unopened struct{ err error }

func (u unopened) Name() string                                   { return "unopened" }
func (u unopened) NewContext(uint64, uint64) (gpu.Context, error) { return nil, u.err }
func (u unopened) Close() error                                   { return nil }

// slowStep is how long a worker's start-up step may take before the
// worker says so on its standard error (the node's log): a session waits
// for its worker's steps while its guest waits for its hello's answer.
const slowStep = time.Second

// slow tells the node's log how long a step begun at start took, if long.
func slow(step string, start time.Time) {
	if took := time.Since(start); took >= slowStep {
		fmt.Fprintf(os.Stderr, "vgpuha gpu worker %d: %s took %v\n", os.Getpid(), step, took.Round(time.Millisecond))
	}
}
