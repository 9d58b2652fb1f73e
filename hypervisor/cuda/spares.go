package cuda

import "sync"

// Spare contexts: cuCtxCreate takes ~100-125 ms (H100, H200, driver 580),
// and a standby recreating a primary's sessions at the start of a resync
// makes one per session, one after another, while the snapshot's contents
// wait behind them (two sessions: a quarter of a second before the first
// byte is applied). A backend told to keep spares makes them then, and
// each one taken again in the background; NewContext takes one when there
// is one. A spare is a plain context with nothing in it: the window is
// reserved when it is taken, so it is not tied to any base. Each one holds
// the device memory a context costs (~0.5 GiB on an H200, driver 580).

// spares are contexts made ahead.
type spares struct {
	ready chan uintptr  // made, not yet taken
	need  chan struct{} // a token per spare taken, to make another
	stop  chan struct{}
	once  sync.Once
}

// KeepSpareContexts makes the backend keep n contexts made ahead: the
// first n now (a standby is then ready before a primary's snapshot could
// wait for the driver behind it), each taken one remade in the
// background. Call it once, before the first NewContext.
func (b *Backend) KeepSpareContexts(n int) {
	if n <= 0 {
		return
	}
	s := &spares{ready: make(chan uintptr, n), need: make(chan struct{}, n), stop: make(chan struct{})}
	b.spares = s
	for range n {
		b.makeSpare(s)
	}
	go b.makeSpares(s)
}

// makeSpares makes a context for each token in s.need (one per spare
// taken) until s is stopped; one it could not make is not retried
// (NewContext then makes its own).
func (b *Backend) makeSpares(s *spares) {
	for {
		select {
		case <-s.stop:
			return
		case <-s.need:
			b.makeSpare(s)
		}
	}
}

// makeSpare makes one spare context.
func (b *Backend) makeSpare(s *spares) {
	var ctx uintptr
	if err := onThread(func() error { return b.d.check("cuCtxCreate", b.d.cuCtxCreate(&ctx, b.ctxFlags, b.dev)) }); err != nil {
		return
	}
	select {
	case <-s.stop: // closed while it was being made
		b.destroySpare(ctx)
	default:
		s.ready <- ctx // never blocks: at most n tokens are out
	}
}

// takeSpare returns a spare context and has another made, or 0 when none
// is ready.
func (b *Backend) takeSpare() uintptr {
	s := b.spares
	if s == nil {
		return 0
	}
	select {
	case ctx := <-s.ready:
		s.need <- struct{}{} // never blocks: its token was spent making ctx
		return ctx
	default:
		return 0
	}
}

// Spares implements gpu.SpareReporter.
func (b *Backend) Spares() (ready, kept int) {
	if s := b.spares; s != nil {
		return len(s.ready), cap(s.ready)
	}
	return 0, 0
}

// closeSpares stops making spares and destroys those not taken.
func (b *Backend) closeSpares() {
	s := b.spares
	if s == nil {
		return
	}
	s.once.Do(func() { close(s.stop) })
	for {
		select {
		case ctx := <-s.ready:
			b.destroySpare(ctx)
		default:
			return
		}
	}
}

// destroySpare destroys a spare context nobody took.
func (b *Backend) destroySpare(ctx uintptr) {
	onThread(func() error { return b.d.check("cuCtxDestroy", b.d.cuCtxDestroy(ctx)) })
}

// MakeContextAhead makes one context now, for the backend's first
// NewContext, and none after it is taken: a GPU worker serves one context
// (hypervisor/gpu/worker), and a spare kept for a second would hold its
// device memory for nothing. Call it instead of KeepSpareContexts.
func (b *Backend) MakeContextAhead() {
	s := &spares{ready: make(chan uintptr, 1), need: make(chan struct{}, 1), stop: make(chan struct{})}
	b.spares = s
	b.makeSpare(s)
}
