package cuapi

import "github.com/vgpuha/vgpuha/pvdriver"

// Contexts. All of a process's contexts share its one session: a context
// owns the allocations, modules, streams and events made while it was
// current, and destroying it frees them, as in CUDA.

// CtxCreate is cuCtxCreate (all versions): a new context, pushed onto the
// calling thread's stack. Execution-affinity and CIG parameters
// (cuCtxCreate_v3/_v4) are not supported: unsupportedParams reports them.
func (d *Driver) CtxCreate(t Thread, flags uint32, dev int32, unsupportedParams bool) (uint64, Result) {
	if r := d.device(dev); r != Success {
		return 0, r
	}
	if unsupportedParams {
		return 0, ErrorNotSupported
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := &ctxState{handle: d.mint(), flags: flags, refs: 1}
	if !t.Push(c.handle) {
		return 0, ErrorOutOfMemory
	}
	d.ctxs[c.handle] = c
	return c.handle, Success
}

// CtxDestroy is cuCtxDestroy_v2. The primary context is not destroyed this
// way (cuDevicePrimaryCtxRelease_v2 and _Reset_v2 do).
func (d *Driver) CtxDestroy(t Thread, ctx uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	c := d.ctxs[ctx]
	if c == nil || c == d.primary {
		return ErrorInvalidContext
	}
	d.dropCtx(ctx)
	if t.Top() == ctx {
		t.Pop()
	}
	return Success
}

// dropCtx frees everything ctx owns and forgets it.
// Precondition: d.mu must be locked.
func (d *Driver) dropCtx(ctx uint64) {
	for h, e := range d.events {
		if e.ctx == ctx {
			delete(d.events, h)
		}
	}
	for h, s := range d.streams {
		if s.ctx == ctx {
			d.client.DestroyStream(s.remote)
			delete(d.streams, h)
		}
	}
	for h, m := range d.modules {
		if m.ctx == ctx {
			d.unloadModule(h, m)
		}
	}
	d.unloadParked(ctx)
	for p, a := range d.allocs {
		if a.ctx == ctx {
			d.client.Free(pvdriver.DevicePtr(p))
			d.used -= a.size
			delete(d.allocs, p)
		}
	}
	delete(d.ctxs, ctx)
	if d.primary != nil && d.primary.handle == ctx {
		d.primary = nil
	}
	d.changed()
}

// context checks that ctx is a live context (zero allowed when nullOK).
// Precondition: d.mu must be locked.
func (d *Driver) context(ctx uint64, nullOK bool) Result {
	if r := d.ready(); r != Success {
		return r
	}
	if ctx == 0 && nullOK || d.ctxs[ctx] != nil {
		return Success
	}
	return ErrorInvalidContext
}

// CtxSetCurrent is cuCtxSetCurrent: ctx replaces the top of the thread's
// stack (zero unbinds it).
func (d *Driver) CtxSetCurrent(t Thread, ctx uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.context(ctx, true); r != Success {
		return r
	}
	t.SetTop(ctx)
	return Success
}

// CtxGetCurrent is cuCtxGetCurrent.
func (d *Driver) CtxGetCurrent(t Thread) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	return t.Top(), Success
}

// CtxPushCurrent is cuCtxPushCurrent_v2.
func (d *Driver) CtxPushCurrent(t Thread, ctx uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.context(ctx, false); r != Success {
		return r
	}
	if !t.Push(ctx) {
		return ErrorOutOfMemory
	}
	return Success
}

// CtxPopCurrent is cuCtxPopCurrent_v2.
func (d *Driver) CtxPopCurrent(t Thread) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	if t.Top() == 0 {
		return 0, ErrorInvalidContext
	}
	return t.Pop(), Success
}

// CtxGetDevice is cuCtxGetDevice.
func (d *Driver) CtxGetDevice(t Thread) (int32, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, r := d.current(t)
	return 0, r
}

// CtxSynchronize is cuCtxSynchronize: waits for all of the session's work
// and reports the first deferred error of any stream.
func (d *Driver) CtxSynchronize(t Thread) Result {
	d.mu.Lock()
	_, r := d.current(t)
	c := d.client
	capturing := r == Success && d.invalidateCaptures()
	d.mu.Unlock()
	if capturing {
		return ErrorCaptureUnsupported // waiting for the device while a stream captures invalidates the capture
	}
	if r != Success {
		return r
	}
	return d.waitAndPull(c, "cuCtxSynchronize", coversAll, c.SynchronizeThenRead)
}

// PrimaryCtxRetain is cuDevicePrimaryCtxRetain: the device's primary
// context, made on first retain; it does not become current.
func (d *Driver) PrimaryCtxRetain(dev int32) (uint64, Result) {
	if r := d.device(dev); r != Success {
		return 0, r
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.primary == nil {
		d.primary = &ctxState{handle: d.mint()}
		d.ctxs[d.primary.handle] = d.primary
		d.changed()
	}
	d.primary.refs++
	return d.primary.handle, Success
}

// PrimaryCtxRelease is cuDevicePrimaryCtxRelease_v2: the last release
// frees the primary context's resources.
func (d *Driver) PrimaryCtxRelease(dev int32) Result {
	if r := d.device(dev); r != Success {
		return r
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.primary == nil {
		return ErrorInvalidContext
	}
	if d.primary.refs--; d.primary.refs == 0 {
		d.dropCtx(d.primary.handle)
	}
	return Success
}

// PrimaryCtxReset is cuDevicePrimaryCtxReset_v2: frees the primary
// context's resources at once.
func (d *Driver) PrimaryCtxReset(dev int32) Result {
	if r := d.device(dev); r != Success {
		return r
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.primary != nil {
		d.dropCtx(d.primary.handle)
	}
	return Success
}
