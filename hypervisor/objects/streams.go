package objects

import (
	"maps"
	"slices"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Stream is the backend's stream of guest handle h (0: the null stream).
func (o *Set) Stream(h uint64) (gpu.Stream, error) {
	if h == 0 {
		return 0, nil
	}
	b, err := o.handles.Lookup(handlemap.KindStream, handlemap.Handle(h))
	if err != nil {
		return 0, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	return gpu.Stream(b), nil
}

// DeferError keeps the first error of a stream's asynchronous work for
// its next synchronization.
func (o *Set) DeferError(stream handlemap.Handle, err error) {
	if _, seen := o.deferred[stream]; !seen {
		o.deferred[stream] = err
	}
}

// StreamCreate makes a stream.
func (o *Set) StreamCreate(*abi.StreamCreate) (abi.Body, error) {
	if err := o.CheckRoom(); err != nil {
		return nil, err
	}
	st, err := o.ctx.CreateStream()
	if err != nil {
		return nil, err
	}
	h, err := o.handles.Insert(handlemap.KindStream, uint64(st), 0)
	if err != nil {
		return nil, err
	}
	return &abi.HandleReply{Handle: uint64(h)}, nil
}

// StreamDestroy destroys a stream (not the null one).
func (o *Set) StreamDestroy(r *abi.StreamDestroy) (abi.Body, error) {
	if r.Stream == 0 {
		return nil, guesterr.Fail(abi.StatusInvalidHandle, "the null stream cannot be destroyed")
	}
	st, err := o.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := o.ctx.DestroyStream(st); err != nil {
		return nil, err
	}
	o.handles.Remove(handlemap.KindStream, handlemap.Handle(r.Stream))
	delete(o.deferred, handlemap.Handle(r.Stream))
	return nil, nil
}

// StreamSync waits for a stream and returns its deferred error.
func (o *Set) StreamSync(r *abi.StreamSync) (abi.Body, error) {
	st, err := o.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := o.ctx.SyncStream(st); err != nil {
		return nil, err
	}
	h := handlemap.Handle(r.Stream)
	if err := o.deferred[h]; err != nil {
		delete(o.deferred, h)
		return nil, err
	}
	return nil, nil
}

// Sync waits for the device and returns the first deferred error.
func (o *Set) Sync(*abi.Sync) (abi.Body, error) {
	if err := o.ctx.Sync(); err != nil {
		return nil, err
	}
	var first error
	var firstStream handlemap.Handle
	for h, err := range o.deferred {
		if first == nil || h < firstStream {
			first, firstStream = err, h
		}
	}
	clear(o.deferred)
	return nil, first
}

// DeferredStreams lists the streams whose asynchronous work left an error
// for their next synchronization (nil for none).
func (o *Set) DeferredStreams() []handlemap.Handle {
	if len(o.deferred) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(o.deferred))
}

// Deferred returns the error kept for stream's next synchronization, if
// any.
func (o *Set) Deferred(stream handlemap.Handle) (error, bool) {
	err, ok := o.deferred[stream]
	return err, ok
}

// ForgetDeferred drops the error kept for stream (a standby whose primary
// reported it to the guest).
func (o *Set) ForgetDeferred(stream handlemap.Handle) { delete(o.deferred, stream) }
