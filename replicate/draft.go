package replicate

import (
	"github.com/vgpuha/vgpuha/replicate/internal/bufpool"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// Draft is a record body filled in place before it is appended: a guest's
// bulk payload is copied once, from the memory it shares with the node
// straight into the buffer the log keeps and the sender seals, instead of
// into a private buffer first and then into the log's (Append copies).
type Draft struct {
	enc  []byte // record header (written by AppendDraft), body, room for the link's tag
	pool *bufpool.Pool
}

// NewDraft returns a draft for a body of n bytes, in a host buffer where
// the log has one (SetHostBuffers).
func (l *Log) NewDraft(n int) *Draft {
	enc := l.pool.GetHost(recordHeader + n + link.MacSize)[:recordHeader+n]
	return &Draft{enc: enc, pool: &l.pool}
}

// SetHostBuffers makes large drafts come from alloc, up to limit bytes in
// all: the primary's GPU backend allocates page-locked memory there, and a
// guest's bulk write, read once into its draft, is copied to the device
// from that buffer at DMA rate rather than through the driver's staging
// copy of pageable memory. The buffers are reused for as long as the log
// lives and never freed. Call before the log is used.
func (l *Log) SetHostBuffers(alloc func(n int) ([]byte, error), limit int) {
	l.pool.SetHost(alloc, limit)
}

// Body is the draft's body, for the caller to fill.
func (d *Draft) Body() []byte { return d.enc[recordHeader:] }

// Discard gives back the buffer of a draft that will not be appended.
func (d *Draft) Discard() {
	if d.enc != nil {
		d.pool.Put(d.enc)
		d.enc = nil
	}
}

// AppendDraft is Append of r with the draft's body, which the log takes
// without copying; the draft is spent.
func (l *Log) AppendDraft(r Record, d *Draft) uint64 {
	r.Body = d.Body()
	enc := encodeAt(d.enc, &r)
	d.enc = nil
	if !l.keeping.Load() {
		seq := l.add(r, entry{}) // encodes r afresh if the log began retaining meanwhile
		l.pool.Put(enc)          // nobody else needs it
		return seq
	}
	return l.add(r, entry{Record: r, enc: enc})
}
