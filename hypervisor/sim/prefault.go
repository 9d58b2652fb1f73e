package sim

import "runtime"

// Prefault implements gpu.Prefaulter: the allocation's pages are faulted
// in (populate, without writing) by a few background workers, in the
// order asked, a piece at a time, so that a resync's contents, which
// arrive in the same order, are copied into memory already mapped. Each
// worker runs on its own core: on a host with cores to spare the kernel's
// zeroing and mapping (measured at 0.1-1 GB/s on this project's 2-core
// VMs) happens beside the apply instead of inside it. A piece that finds
// the queue full is skipped: its first write maps it, as without this.
func (c *guestContext) Prefault(addr, size uint64) {
	c.mu.Lock()
	i, off, err := c.span(addr, size)
	var mem []byte
	if err == nil {
		mem = c.allocs[i].data[off : off+size]
	}
	c.mu.Unlock()
	if mem == nil {
		return
	}
	q := c.be.prefaultQueue()
	for len(mem) > 0 {
		n := min(len(mem), prefaultPiece)
		select {
		case q <- mem[:n]:
		default:
			return
		}
		mem = mem[n:]
	}
}

// prefaultPiece is what one worker populates at a time.
const prefaultPiece = 8 << 20

// prefaultQueue returns the backend's queue of pieces to populate,
// starting its workers the first time (a quarter of the cores, at least
// one). They live as long as the process: a backend is made once.
func (b *Backend) prefaultQueue() chan<- []byte {
	b.prefaultOnce.Do(func() {
		b.prefault = make(chan []byte, 4096)
		for range max(1, runtime.NumCPU()/4) {
			go func() {
				for piece := range b.prefault {
					populate(piece)
				}
			}()
		}
	})
	return b.prefault
}
