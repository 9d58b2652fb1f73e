package cuapi

import "github.com/vgpuha/vgpuha/pvdriver"

// Waits answered without asking. PyTorch reads a value back with a copy
// to the host and then synchronises the stream: two round trips where the
// copy alone already waited. A wait that completes leaves the streams it
// covered idle as of its last request; while no request at all has gone
// out since (pvdriver.Client.Sent), a synchronisation of such a stream has
// nothing to wait for and is answered here. Any request, of any thread,
// ends that; an error of earlier work would have been the covering wait's.
//
// What a wait covers, on the node (whose streams are all blocking ones): a
// synchronisation of the null stream and cuCtxSynchronize wait for the
// whole context, and so does a copy to the host (the null stream's order
// includes every blocking stream's); a stream's synchronisation covers
// that stream.

// coversAll marks a wait that covers every stream.
const coversAll = ^uint64(0)

// idleMarks are, for the client they were taken on, the newest request id
// when a wait covering every stream completed, and per stream (by the
// program's handle; 0 for the null stream) when one covering it did.
type idleMarks struct {
	client  *pvdriver.Client
	all     uint64
	streams map[uint64]uint64
}

// nullStream is the program's handle s with the null stream's three names
// made one.
func nullStream(s uint64) uint64 {
	if s == streamLegacy || s == streamPerThread {
		return 0
	}
	return s
}

// markIdleLocked records that a wait covering covers (a stream, or
// coversAll) completed on c with upTo as its last request's id.
// Precondition: d.mu must be locked.
func (d *Driver) markIdleLocked(c *pvdriver.Client, covers, upTo uint64) {
	m := &d.idle
	if m.client != c {
		*m = idleMarks{client: c}
	}
	if covers == coversAll {
		m.all = max(m.all, upTo)
		return
	}
	if m.streams == nil {
		m.streams = map[uint64]uint64{}
	}
	s := nullStream(covers)
	m.streams[s] = max(m.streams[s], upTo)
}

// idleLocked reports whether stream s is known to be idle on c: a wait
// covering it was the last thing sent.
// Precondition: d.mu must be locked.
func (d *Driver) idleLocked(c *pvdriver.Client, s uint64) bool {
	m := &d.idle
	if c == nil || m.client != c {
		return false
	}
	mark := max(m.all, m.streams[nullStream(s)])
	return mark != 0 && c.Sent() == mark
}
