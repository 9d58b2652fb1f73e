package bench

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// ResyncOptions sets the resync benchmark's sizes.
type ResyncOptions struct {
	Sizes  []uint64 // guest memory per row, all guests together
	Guests int
	// Baseline is how long guests run before the standby joins.
	Baseline time.Duration
	// Rate bounds the resync stream (bytes/s; 0: none); Budget is the
	// primary's resync budget (0: the default); GuestShare the most of the
	// link guests' writes take meanwhile (0: the primary's default rule).
	Rate, Budget int64
	GuestShare   float64
	// StopTheWorld also measures each size the old way: every guest
	// stopped while all of device memory is copied.
	StopTheWorld bool
	// IdleGuests also measures each size with the guests holding their
	// memory but making no calls while the standby joins (method
	// "idle-guests"): the snapshot stream alone, to tell its own rate
	// from what the guests' load costs it.
	IdleGuests bool
	Progress   io.Writer
	NewBackend func() (gpu.Backend, error)
	// NewStandbyBackend, when set, makes the standby's GPU instead (see
	// ReplicateOptions.NewStandbyBackend).
	NewStandbyBackend func() (gpu.Backend, error)
	// Log, if set, receives both nodes' logs (the resync's progress lines
	// among them).
	Log *slog.Logger
	// Processes, when set, runs the primary and the standby as processes
	// of their own (the backends named there; NewBackend and Log unused):
	// the figures a deployment sees.
	Processes *drill.NodesOptions
}

// ResyncBenchRow is one resync of a standby that joins while guests run.
type ResyncBenchRow struct {
	Method     string  `json:"method"` // concurrent or stop-the-world
	GuestBytes uint64  `json:"guest_bytes"`
	SnapshotMS float64 `json:"snapshot_pause_ms"` // guests stopped to take the snapshot
	// LongestPauseMS is the slowest single guest call while the resync
	// ran; BaselineMaxMS the slowest before it.
	LongestPauseMS float64 `json:"longest_guest_pause_ms"`
	BaselineMaxMS  float64 `json:"baseline_max_call_ms"`
	// LongestCall is the slowest call's kind, LongestAtS when it began
	// (seconds after the standby was started).
	LongestCall string  `json:"longest_call"`
	LongestAtS  float64 `json:"longest_call_at_s"`
	// Slowest are the slowest calls while the resync ran, slowest first
	// (their wall-clock times line up with the nodes' log lines).
	Slowest []SlowCall `json:"slowest_calls"`
	// ResyncSeconds: the standby's attach to protected (the sender's
	// reconnect backoff before it is not counted).
	ResyncSeconds float64 `json:"resync_seconds"`
	// SnapshotSeconds of it went to putting the snapshot on the link,
	// CatchUpSeconds to the standby catching up from the log after it.
	SnapshotSeconds float64 `json:"snapshot_seconds"`
	CatchUpSeconds  float64 `json:"catch_up_seconds"`
	ResyncMBps      float64 `json:"resync_mb_per_s"` // guest memory / ResyncSeconds
	LinkMBps        float64 `json:"link_mb_per_s"`   // plain TCP copy on loopback, right before the row
	VsLink          float64 `json:"vs_link"`
	// CarriedMBps: all the link carried during the resync (the snapshot
	// and the records guests wrote meanwhile) / ResyncSeconds.
	CarriedMBps   float64 `json:"carried_mb_per_s"`
	CarriedVsLink float64 `json:"carried_vs_link"`
	// Guest throughput: mixed-workload calls per second, before and while
	// the resync ran.
	OpsPerSecBefore float64 `json:"guest_ops_per_s_before"`
	OpsPerSecDuring float64 `json:"guest_ops_per_s_during"`
	VsBefore        float64 `json:"guest_throughput_vs_before"`
	Restarts        uint64  `json:"resync_restarts"`
	Verified        bool    `json:"verified"`
	// Mismatches are what verify found different (none when Verified).
	Mismatches []verify.Mismatch `json:"mismatches,omitempty"`
}

// Resync measures a standby joining a primary whose guests hold Sizes of
// device memory and keep running a mixed workload: copies, memsets and
// device-to-device copies into that memory, and pointer_chase launches.
func Resync(opts ResyncOptions) ([]ResyncBenchRow, error) {
	if opts.Guests <= 0 {
		opts.Guests = 2
	}
	if opts.Baseline <= 0 {
		opts.Baseline = time.Second
	}
	var rows []ResyncBenchRow
	for _, size := range opts.Sizes {
		methods := []string{"concurrent"}
		if opts.StopTheWorld {
			methods = append(methods, "stop-the-world")
		}
		if opts.IdleGuests {
			methods = append(methods, "idle-guests")
		}
		for _, m := range methods {
			// The link is measured right before each row: on the H200 host
			// loopback TCP read 3.1-5.4 GB/s in runs minutes apart.
			link, err := linkRate()
			if err != nil {
				return rows, err
			}
			row, err := resyncOnce(opts, size, m)
			if err != nil {
				return rows, fmt.Errorf("%s resync of %d MiB: %w", m, size>>20, err)
			}
			row.LinkMBps = link / 1e6
			row.VsLink = row.ResyncMBps * 1e6 / link
			row.CarriedVsLink = row.CarriedMBps * 1e6 / link
			rows = append(rows, row)
			if opts.Progress != nil {
				fmt.Fprintf(opts.Progress, "%d MiB %s: pause %.1f ms, resync %.2f s\n", size>>20, m, row.LongestPauseMS, row.ResyncSeconds)
				for _, c := range row.Slowest {
					fmt.Fprintf(opts.Progress, "  slow call: %s %s %.1f ms\n", c.Began.UTC().Format("15:04:05.000"), c.Kind, c.MS)
				}
			}
		}
	}
	return rows, nil
}

// linkRate is a plain TCP copy's rate on loopback, in bytes per second
// (the best of five 256 MiB copies).
func linkRate() (float64, error) {
	send, closeTCP, err := plainTCP()
	if err != nil {
		return 0, err
	}
	defer closeTCP()
	data := make([]byte, 256<<20)
	for i := range data {
		// Written, so the copy reads 256 MiB of memory: untouched, every
		// page of data would be the kernel's one zero page, always cached.
		data[i] = byte(i * 131)
	}
	best := 0.0
	for range 5 {
		start := time.Now()
		if err := send(data); err != nil {
			return 0, err
		}
		best = max(best, float64(len(data))/time.Since(start).Seconds())
	}
	return best, nil
}

// resyncOnce runs one row: fill, baseline, join, measure, verify.
func resyncOnce(opts ResyncOptions, size uint64, method string) (ResyncBenchRow, error) {
	row := ResyncBenchRow{Method: method, GuestBytes: size}
	nodes, err := startResyncNodes(opts, size, method)
	if err != nil {
		return row, err
	}
	defer nodes.close()
	perGuest := size / uint64(opts.Guests)
	guests := make([]*mixedGuest, opts.Guests)
	for i := range guests {
		if guests[i], err = newMixedGuest(nodes, perGuest, uint64(i)); err != nil {
			return row, err
		}
		defer guests[i].g.Close()
	}
	run := startMixed(guests)
	time.Sleep(opts.Baseline)
	before := run.cut()
	if method == "idle-guests" {
		if err := run.stop(); err != nil {
			return row, err
		}
	}
	if err := nodes.startStandby(); err != nil {
		run.stop()
		return row, err
	}
	err = nodes.waitProtected(10 * time.Minute)
	during := run.cut()
	if err := run.stop(); err != nil {
		return row, err
	}
	if err != nil {
		return row, err
	}
	time.Sleep(20 * time.Millisecond) // let the sender record the resync's end
	st, err := nodes.lastResync()
	if err != nil {
		return row, err
	}
	row.SnapshotMS, row.ResyncSeconds, row.Restarts = st.PauseSeconds*1000, st.Seconds, st.Restarts
	row.SnapshotSeconds, row.CatchUpSeconds = st.SnapshotSeconds, max(0, st.Seconds-st.SnapshotSeconds)
	row.ResyncMBps = float64(size) / st.Seconds / 1e6
	row.CarriedMBps = float64(st.Bytes) / st.Seconds / 1e6
	row.LongestPauseMS, row.BaselineMaxMS, row.Slowest = during.maxMS(), before.maxMS(), during.slow
	if len(during.slow) > 0 {
		row.LongestCall, row.LongestAtS = during.slow[0].Kind, during.slow[0].Began.Sub(during.since).Seconds()
	}
	row.OpsPerSecBefore, row.OpsPerSecDuring = before.perSec, during.perSec
	if before.perSec > 0 {
		row.VsBefore = during.perSec / before.perSec
	}
	rep, err := nodes.verify()
	row.Verified = err == nil && rep.Match
	row.Mismatches = rep.Mismatches
	return row, err
}

// withoutSnapshots hides the backend's memory snapshots, so the hypervisor
// copies device memory with every guest stopped: the resync before it
// could do otherwise.
func withoutSnapshots(newBackend func() (gpu.Backend, error)) func() (gpu.Backend, error) {
	return func() (gpu.Backend, error) {
		b, err := newBackend()
		if err != nil {
			return nil, err
		}
		return plainBackend{b}, nil
	}
}

type plainBackend struct{ gpu.Backend }

// plainContext has only gpu.Context's methods.
type plainContext struct{ gpu.Context }

func (b plainBackend) NewContext(base, size uint64) (gpu.Context, error) {
	ctx, err := b.Backend.NewContext(base, size)
	if err != nil {
		return nil, err
	}
	return plainContext{ctx}, nil
}

// mixedGuest is a guest holding its share of the memory (64 MiB buffers),
// a ring of pointer_chase nodes and the kernel.
type mixedGuest struct {
	g     *pvdriver.Client
	bufs  []pvdriver.DevicePtr
	sizes []uint64
	rng   *rand.Rand
	chase pvdriver.Function
	nodes pvdriver.DevicePtr
}

// chaseNodes is the length of a guest's pointer_chase ring.
const chaseNodes = 256

const mixedBuffer = 64 << 20

func newMixedGuest(nodes resyncNodes, bytes, seed uint64) (*mixedGuest, error) {
	g, err := nodes.guest(fmt.Sprintf("resync-bench-%d", seed))
	if err != nil {
		return nil, err
	}
	mg := &mixedGuest{g: g, rng: rand.New(rand.NewPCG(seed, 3))}
	fill := make([]byte, 16<<20)
	for left := bytes; left > 0; {
		n := min(left, mixedBuffer)
		p, err := g.Alloc(n)
		if err != nil {
			g.Close()
			return nil, err
		}
		for off := uint64(0); off < n; off += uint64(len(fill)) {
			piece := fill[:min(uint64(len(fill)), n-off)]
			binary.LittleEndian.PutUint64(piece, uint64(p)+off) // each piece marked with its address
			if err := g.CopyHtoD(p+pvdriver.DevicePtr(off), piece); err != nil {
				g.Close()
				return nil, err
			}
		}
		mg.bufs, mg.sizes = append(mg.bufs, p), append(mg.sizes, n)
		left -= n
	}
	if err := mg.loadChase(); err != nil {
		g.Close()
		return nil, err
	}
	return mg, nil
}

// loadChase loads pointer_chase and stores a ring of nodes {next, value}
// for it to follow.
func (mg *mixedGuest) loadChase() error {
	img, err := kernels.Image("pointer_chase")
	if err != nil {
		return err
	}
	m, err := mg.g.LoadModule(img)
	if err != nil {
		return err
	}
	if mg.chase, err = mg.g.GetFunction(m, "pointer_chase"); err != nil {
		return err
	}
	if mg.nodes, err = mg.g.Alloc(16 * chaseNodes); err != nil {
		return err
	}
	ring := make([]byte, 0, 16*chaseNodes)
	for i := range chaseNodes {
		ring = binary.LittleEndian.AppendUint64(ring, uint64(mg.nodes)+16*uint64((i+1)%chaseNodes))
		ring = binary.LittleEndian.AppendUint64(ring, uint64(i))
	}
	return mg.g.CopyHtoD(mg.nodes, ring)
}

// op makes one call of the mixed workload, chosen at random: a 256 KiB
// copy in, a 64 KiB memset, a 256 KiB device-to-device copy, a
// pointer_chase launch writing its result, all at random places in the
// guest's memory, or a 4 KiB read (which waits for the commit rule).
func (mg *mixedGuest) op(data []byte) (string, error) {
	i := mg.rng.IntN(len(mg.bufs))
	n := min(uint64(len(data)), mg.sizes[i])
	at := mg.bufs[i] + pvdriver.DevicePtr(mg.rng.Uint64N(mg.sizes[i]-n+1)&^7)
	switch mg.rng.IntN(5) {
	case 0:
		return "copy_htod", mg.g.CopyHtoD(at, data[:n])
	case 1:
		return "memset", mg.g.Memset32(at, mg.rng.Uint32(), min(n, 64<<10)/4)
	case 2:
		j := mg.rng.IntN(len(mg.bufs))
		m := min(n, mg.sizes[j])
		return "copy_dtod", mg.g.CopyDtoD(at, mg.bufs[j]+pvdriver.DevicePtr(mg.rng.Uint64N(mg.sizes[j]-m+1)), m)
	case 3:
		one := abi.Dim3{X: 1, Y: 1, Z: 1}
		start := uint64(mg.nodes) + 16*mg.rng.Uint64N(chaseNodes)
		return "launch", mg.g.Launch(mg.chase, pvdriver.LaunchConfig{Grid: one, Block: one}, abi.Arg{Kind: abi.ArgPtr, Bits: start},
			abi.Arg{Kind: abi.ArgU32, Bits: 64}, abi.Arg{Kind: abi.ArgPtr, Bits: uint64(at)})
	}
	return "copy_dtoh", mg.g.CopyDtoH(data[:4096], at)
}

// SlowCall is one slow guest call.
type SlowCall struct {
	Kind  string    `json:"kind"`
	Began time.Time `json:"began"`
	MS    float64   `json:"ms"`
}

// slowKept is how many slowest calls a phase keeps.
const slowKept = 8

// keepSlow adds c to slow (slowest first) if it is among the slowKept
// slowest.
func keepSlow(slow []SlowCall, c SlowCall) []SlowCall {
	i := sort.Search(len(slow), func(i int) bool { return slow[i].MS < c.MS })
	if i >= slowKept {
		return slow
	}
	slow = append(slow, SlowCall{})
	copy(slow[i+1:], slow[i:])
	slow[i] = c
	return slow[:min(len(slow), slowKept)]
}

// mixedRun drives every guest's mixed workload until stopped, and cuts the
// figures into phases.
type mixedRun struct {
	mu       sync.Mutex
	ops      int
	slow     []SlowCall // slowest first
	since    time.Time
	err      error
	quit     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// phase is one stretch of a mixed run.
type phase struct {
	perSec float64
	since  time.Time  // when it began
	slow   []SlowCall // slowest first
}

// maxMS is the phase's slowest call in milliseconds (0: none).
func (p phase) maxMS() float64 {
	if len(p.slow) == 0 {
		return 0
	}
	return p.slow[0].MS
}

func startMixed(guests []*mixedGuest) *mixedRun {
	r := &mixedRun{since: time.Now(), quit: make(chan struct{})}
	for _, mg := range guests {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			data := make([]byte, 256<<10)
			for {
				select {
				case <-r.quit:
					return
				default:
				}
				start := time.Now()
				kind, err := mg.op(data)
				lat := time.Since(start)
				r.mu.Lock()
				r.ops++
				r.slow = keepSlow(r.slow, SlowCall{Kind: kind, Began: start, MS: float64(lat.Microseconds()) / 1000})
				if err != nil && r.err == nil {
					r.err = err
				}
				r.mu.Unlock()
			}
		}()
	}
	return r
}

// cut ends the current phase and starts the next.
func (r *mixedRun) cut() phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := phase{perSec: float64(r.ops) / time.Since(r.since).Seconds(), since: r.since, slow: r.slow}
	r.ops, r.slow, r.since = 0, nil, time.Now()
	return p
}

// stop ends the guests' calls (again: nothing more) and returns the
// first error one of them met.
func (r *mixedRun) stop() error {
	r.stopOnce.Do(func() { close(r.quit) })
	r.wg.Wait()
	return r.err
}

// PrintResync writes the rows as a table.
func PrintResync(w io.Writer, rows []ResyncBenchRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tguest MiB\tsnapshot pause ms\tlongest guest call ms\t(which, at s)\t(before)\tresync s\t(snapshot s\tcatch-up s)\tresync MB/s\tcarried MB/s\tlink MB/s\tvs link\tcarried vs link\tguest ops/s before\tduring\tratio\trestarts\tverify\t")
	for _, r := range rows {
		v := "match"
		if !r.Verified {
			v = "DIFFERS"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%s %.2f\t%.1f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.0f\t%.0f\t%.2f\t%d\t%s\t\n", r.Method, r.GuestBytes>>20,
			r.SnapshotMS, r.LongestPauseMS, r.LongestCall, r.LongestAtS, r.BaselineMaxMS, r.ResyncSeconds, r.SnapshotSeconds, r.CatchUpSeconds, r.ResyncMBps, r.CarriedMBps, r.LinkMBps, r.VsLink, r.CarriedVsLink,
			r.OpsPerSecBefore, r.OpsPerSecDuring, r.VsBefore, r.Restarts, v)
	}
	tw.Flush()
	for _, r := range rows {
		for i, m := range r.Mismatches {
			if i == 3 {
				fmt.Fprintf(w, "  ... %d more\n", len(r.Mismatches)-i)
				break
			}
			fmt.Fprintf(w, "  %d MiB differs: session %d %s %s (%d bytes): primary %s, standby %s\n",
				r.GuestBytes>>20, m.Session, m.Kind, m.ID, m.Size, m.Primary, m.Standby)
		}
	}
}
