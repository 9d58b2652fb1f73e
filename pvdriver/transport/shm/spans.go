package shm

import "io"

// ReadSpans hands fn the next n bytes of the stream where they lie in the
// shared ring, in order, as spans that never wrap the ring's end and are
// at most a quarter of the ring (chunkBytes where that is more): the peer
// fills the next spans while fn works on this one. ReadSpans waits until
// a whole span has arrived before it calls fn, and gives the span's room
// back to the peer once fn returns.
//
// fn sees shared memory: the peer can rewrite it at any moment, so fn must
// read it once (copy it somewhere, or hand it to a device copy) and decide
// nothing from it. After fn fails, the rest of the n bytes are consumed
// without calling fn again (the stream stays in step) and fn's first error
// is returned; a failure of the connection itself is returned as from Read
// (io.ErrUnexpectedEOF if the peer left mid-way).
func (c *Conn) ReadSpans(n int, fn func(span []byte) error) error {
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	var fnErr error
	for left := uint64(n); left > 0; {
		off := c.in.pos & (c.in.size - 1)
		k := min(left, c.in.size-off, max(c.in.size/4, chunkBytes))
		if err := c.awaitIn(k); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if fnErr == nil {
			fnErr = fn(c.in.data[off : off+k])
		}
		c.in.pos += k
		c.in.tail.Store(c.in.pos)
		c.wake(c.in.spaceSleep, bellSpace)
		left -= k
	}
	return fnErr
}

// awaitIn waits until at least want bytes (at most the ring's size) are
// readable. Precondition: rdMu and mu (shared) are held.
func (c *Conn) awaitIn(want uint64) error {
	enough := func() (uint64, error) {
		n, err := c.in.readable()
		if n < want {
			n = 0
		}
		return n, err
	}
	for {
		if err := c.usable(); err != nil {
			return c.opError("read", err)
		}
		n, err := enough()
		if err != nil {
			return c.opError("read", c.fail(err))
		}
		if n > 0 {
			return nil
		}
		err = c.wait(enough, c.in.dataSleep, c.dataCh, &c.rdDeadline, &c.in.spin)
		if err == errPeerGone {
			return io.EOF
		}
		if err != nil {
			return c.opError("read", err)
		}
	}
}

// Buffered is how many bytes the peer has published that were not read
// yet (at least; more may be arriving).
func (c *Conn) Buffered() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.area == nil {
		return 0 // closed: unmapped
	}
	n, err := c.in.readable()
	if err != nil {
		return 0
	}
	return int(n)
}
