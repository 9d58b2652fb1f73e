package devmem

// A read's reply buffer. A copy to the host (copy_dtoh) is read into a
// buffer that its reply then carries; a fresh one per read cost the node
// a zeroed allocation of the read's size and the garbage collector's work
// (on the 2-core VM, a loop of 3 MiB reads spent 17% of the node's CPU
// clearing buffers and 5% returning them to the kernel). So a session
// keeps the buffer of its last read once the reply is sent
// (abi.DataReply.Release) and reads the next into it.
//
// The spare is the session's own: what it holds was read from this
// session's memory by this session, so even a backend that filled a
// buffer only in part could show a guest nothing but its own bytes.
// Buffers over maxSpare are not kept: a session holds at most that much
// between reads.

// maxSpare is the largest read buffer a session keeps.
const maxSpare = 8 << 20

// readBuffer returns a buffer of n bytes for a read: the spare if it is
// large enough, else a new one. Its bytes are undefined: the read
// overwrites them all.
func (m *Memory) readBuffer(n int) []byte {
	if b := m.spare.Swap(nil); b != nil && cap(*b) >= n {
		return (*b)[:n]
	}
	return make([]byte, n)
}

// keepSpare keeps b, a buffer readBuffer gave and nothing uses any more,
// for the session's next read.
func (m *Memory) keepSpare(b []byte) {
	if cap(b) <= maxSpare {
		m.spare.Store(&b)
	}
}
