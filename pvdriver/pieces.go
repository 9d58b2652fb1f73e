package pvdriver

import "github.com/vgpuha/vgpuha/pvdriver/abi"

// Windows: how many pieces of one large synchronous copy are in flight
// at once. Enough to keep the node, and a replicated node's link to its
// standby, busy without a round trip between pieces (a replicated node
// runs the next piece while the last one's reply waits for the standby);
// few enough that their replies always fit the reply ring. A host copy's
// pieces name the region's bytes; an inline copy's carry them, in frames
// the client keeps until their replies (four fit the frame pool's idle
// bound, so a long copy reuses its buffers instead of faulting in fresh
// ones).
const (
	hostWindow   = 8
	inlineWindow = 4
)

// callPieces runs a copy of size bytes as calls of at most one chunk
// each, up to window in flight, and returns the first error.
// submit(k, n, ch) sends the piece of n bytes at offset k as a call whose
// reply comes on ch; settle(k, n, err) turns that reply's error into the
// piece's (nil settle: as it is). Pieces run in order on the node; after
// an error no more are sent, and those in flight are waited for.
func (c *Client) callPieces(op abi.Opcode, size, window int,
	submit func(k, n int, ch chan result) (*replyReader, bool, error),
	settle func(k, n int, err error) error,
) error {
	type piece struct {
		k, n  int
		ch    chan result
		rr    *replyReader
		drive bool // the caller reads replies itself (a lone piece)
	}
	var flight []piece
	var firstErr error
	land := func(p piece) {
		err := c.finish(op, nil, p.rr, p.drive, p.ch)
		if settle != nil {
			err = settle(p.k, p.n, err)
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	for k := 0; k < size && firstErr == nil; k += c.chunk() {
		if len(flight) == window {
			land(flight[0])
			flight = flight[1:]
		}
		p := piece{k: k, n: min(c.chunk(), size-k), ch: make(chan result, 1)}
		var err error
		if p.rr, p.drive, err = submit(p.k, p.n, p.ch); err != nil {
			firstErr = err
			break
		}
		if p.drive && (len(flight) > 0 || p.k+p.n < size) {
			// Replies to pieces in flight are read by the connection's
			// reader: a turn held here while waiting for an earlier piece
			// would leave that piece's reply unread. A lone piece (a
			// small copy) keeps it and reads its own reply, as a call
			// does: a hand-off from the reader goroutine costs a
			// wake-up.
			c.releaseTurn(p.rr)
			p.drive = false
		}
		flight = append(flight, p)
	}
	for _, p := range flight {
		land(p)
	}
	return firstErr
}
