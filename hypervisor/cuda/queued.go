package cuda

import "github.com/vgpuha/vgpuha/hypervisor/gpu"

// Marks in a context's queued work (gpu.QueuedCopier): an event recorded
// on the legacy null stream, which completes only once all work queued
// before it has, on every blocking stream too (the guests' streams are
// blocking; CUDA Driver API, "Stream synchronization behavior"). Settle
// waits for events, oldest first, so a replica waits for the run of copies
// before the one the device is working on, not for the device to go idle.

// QueueCopyHtoD implements gpu.QueuedCopier: cuMemcpyHtoDAsync, on the
// null stream too, so a copy from page-locked memory returns at once and
// runs in its stream's order.
func (c *guestContext) QueueCopyHtoD(dst uint64, src []byte, s gpu.Stream) error {
	return c.copyHtoD(dst, src, s, true)
}

// queuedMark is a mark's event.
type queuedMark struct {
	mark uint64
	ev   uintptr
}

// eventDisableTiming is CU_EVENT_DISABLE_TIMING (cuda.h): the cheapest
// event, for ordering only.
const eventDisableTiming = 2

// Mark implements gpu.QueuedCopier: an event after the copies queued since
// the last mark (none when there were none). Where the driver gives no
// event it waits for the context instead, so nothing queued is left
// unmarked, and reports why.
func (c *guestContext) Mark(mark uint64) error {
	return c.do(func() error {
		if !c.queued {
			return nil
		}
		c.queued = false
		var ev uintptr
		err := c.d.check("cuEventCreate", c.d.cuEventCreate(&ev, eventDisableTiming))
		if err == nil {
			if err = c.d.check("cuEventRecord", c.d.cuEventRecord(ev, 0)); err == nil {
				c.marks = append(c.marks, queuedMark{mark: mark, ev: ev})
				return nil
			}
			c.d.cuEventDestroy(ev)
		}
		c.d.cuCtxSynchronize()
		return err
	})
}

// Settle implements gpu.QueuedCopier: it waits for each mark up to upTo.
func (c *guestContext) Settle(upTo uint64) error {
	return c.do(func() error {
		var first error
		for len(c.marks) > 0 && c.marks[0].mark <= upTo {
			m := c.marks[0]
			c.marks = c.marks[1:]
			if err := c.d.check("cuEventSynchronize", c.d.cuEventSynchronize(m.ev)); err != nil && first == nil {
				first = err
			}
			c.d.cuEventDestroy(m.ev)
		}
		return first
	})
}

// dropMarks lets go of the marks' events (the context is closing, after
// cuCtxSynchronize).
// Precondition: c.mu must be locked, the context current.
func (c *guestContext) dropMarks() {
	for _, m := range c.marks {
		c.d.cuEventDestroy(m.ev)
	}
	c.marks, c.queued = nil, false
}
