package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// FairnessOptions sets the fairness benchmark (issue 47): a light guest's
// request latency in commit mode while another guest reads or writes as
// fast as it can, with the log's session share set as each configuration
// says.
type FairnessOptions struct {
	// Nodes says how to start each configuration's primary and standby
	// (processes of their own); its PrimaryFlags get the share.
	Nodes drill.NodesOptions
	// Shares are the primary's --replicate.session-share-bytes, one pair
	// each, measured side by side (0: no share, the log as before).
	Shares []int64
	Rounds int
	// Calls is the light guest's timed calls per load and round: reads of
	// LightBytes (a commit point: each waits for its read-back to reach
	// the standby).
	Calls      int
	LightBytes int
	// HeavyBytes is what the busy guest reads or writes per call.
	HeavyBytes int
	// BusyGuest is the command line that runs the busy guest in a
	// process of its own (RunBusyGuest), to which the bench adds the
	// endpoint, the load and HeavyBytes: in the light guest's process its
	// 16 MiB replies would make that process's garbage collector part of
	// the light guest's latency.
	BusyGuest func(endpoint, load string, bytes int) *exec.Cmd
	Progress  io.Writer
}

// FairnessRow is the light guest's latency under one load and share.
type FairnessRow struct {
	Share int64   `json:"session_share_bytes"`
	Load  string  `json:"load"`
	Calls int     `json:"calls"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	// VsIdleP99 is P99us divided by the idle p99 of the same share.
	VsIdleP99 float64 `json:"vs_idle_p99"`
	// HeavyMBps is what the busy guest moved meanwhile.
	HeavyMBps float64 `json:"heavy_mb_per_s"`
	// PeakLagBytes is the most the light guest's primary's log held
	// unapplied meanwhile (read every 5 ms).
	PeakLagBytes int64 `json:"peak_lag_bytes"`
}

// fairnessLoad is what runs beside the light guest: a busy guest reading
// or writing flat out (busy, "" for none), on the light guest's pair or,
// to show what the host's shared cores alone cost the light guest, on
// another pair (elsewhere: no log in common).
type fairnessLoad struct {
	name, busy string
	elsewhere  bool
}

// fairnessLoads are the loads, in the order each round runs them.
var fairnessLoads = []fairnessLoad{
	{name: "idle"}, {name: "1 reader", busy: "reader"}, {name: "1 writer", busy: "writer"},
	{name: "1 reader, other pair", busy: "reader", elsewhere: true}, {name: "1 writer, other pair", busy: "writer", elsewhere: true},
}

// fairnessPair is one configuration's nodes and light guest.
type fairnessPair struct {
	share    int64
	nodes    *drill.Nodes
	endpoint string
	light    *pvdriver.Client
	lightPtr pvdriver.DevicePtr
}

// Fairness runs every share's pair, interleaved round by round and load by
// load, and reports each share's light-guest percentiles over all rounds.
func Fairness(o FairnessOptions) ([]FairnessRow, error) {
	var pairs []*fairnessPair
	defer func() {
		for _, p := range pairs {
			p.close(o.Progress)
		}
	}()
	for _, share := range o.Shares {
		p, err := startFairnessPair(o, share)
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, p)
	}
	other, err := startFairnessPair(o, o.Shares[0]) // the busy guest's, for the loads elsewhere
	if err != nil {
		return nil, err
	}
	defer other.close(o.Progress)
	cells := make([][]fairnessCell, len(pairs))
	for round := range o.Rounds {
		for i, p := range pairs {
			cells[i] = slices.Grow(cells[i], len(fairnessLoads))[:len(fairnessLoads)]
			for j, load := range fairnessLoads {
				busyAt := p.endpoint
				if load.elsewhere {
					busyAt = other.endpoint
				}
				if err := p.measure(o, load.busy, busyAt, &cells[i][j]); err != nil {
					return nil, fmt.Errorf("share %d, %s: %w", p.share, load.name, err)
				}
			}
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "round %d/%d done\n", round+1, o.Rounds)
		}
	}
	for _, p := range pairs {
		if fo := p.light.Failovers(); len(fo) > 0 && o.Progress != nil {
			fmt.Fprintf(o.Progress, "warning: share %d: the standby took over %d time(s) (heartbeats delayed past its detector on a loaded host); the figures after it are of an unprotected node\n",
				p.share, len(fo))
		}
	}
	return fairnessRows(pairs, cells), nil
}

// fairnessCell is what one share's pair measured under one load, over the
// rounds so far.
type fairnessCell struct {
	lat     []time.Duration
	moved   float64 // bytes the busy guest moved
	took    time.Duration
	peakLag int64
}

// fairnessRows turns the cells into rows, share by share.
func fairnessRows(pairs []*fairnessPair, cells [][]fairnessCell) []FairnessRow {
	var rows []FairnessRow
	for i, p := range pairs {
		var idleP99 float64
		for j, load := range fairnessLoads {
			c := cells[i][j]
			s := c.lat
			slices.Sort(s)
			r := FairnessRow{Share: p.share, Load: load.name, Calls: len(s), P50us: micros(s[len(s)/2]), P99us: micros(s[len(s)*99/100]),
				PeakLagBytes: c.peakLag}
			if j == 0 {
				idleP99 = r.P99us
			}
			r.VsIdleP99 = r.P99us / idleP99
			if c.took > 0 {
				r.HeavyMBps = c.moved / c.took.Seconds() / 1e6
			}
			rows = append(rows, r)
		}
	}
	return rows
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// startFairnessPair starts a protected pair whose primary has the given
// share, and opens its two guests.
func startFairnessPair(o FairnessOptions, share int64) (*fairnessPair, error) {
	no := o.Nodes
	no.PrimaryFlags = append(slices.Clone(no.PrimaryFlags), "--replicate.session-share-bytes", strconv.FormatInt(share, 10))
	n, err := drill.StartNodes(no)
	if err != nil {
		return nil, err
	}
	p := &fairnessPair{share: share, nodes: n}
	var failover []string
	p.endpoint, failover = n.Endpoints()
	if err = n.StartStandby(); err == nil {
		err = n.WaitProtected(30 * time.Second)
	}
	if err == nil {
		// It can follow its session to the standby: on a host loaded
		// enough to delay heartbeats past the detector the standby may
		// take over (reported, not fatal).
		p.light, p.lightPtr, err = openWithBuffer(p.endpoint, "light", o.LightBytes, failover...)
	}
	if err != nil {
		p.close(o.Progress)
		return nil, err
	}
	return p, nil
}

// openWithBuffer opens a guest at endpoint (that may fail over to
// failover) and gives it an allocation of size bytes, written once.
func openWithBuffer(endpoint, name string, size int, failover ...string) (*pvdriver.Client, pvdriver.DevicePtr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, endpoint, pvdriver.Options{GuestName: name, Failover: failover})
	if err != nil {
		return nil, 0, err
	}
	ptr, err := g.Alloc(uint64(size))
	if err == nil {
		err = g.CopyHtoD(ptr, make([]byte, size))
	}
	if err != nil {
		g.Close()
	}
	return g, ptr, err
}

// measure times o.Calls light reads while a busy guest runs load (none
// for "") at busyAt, and adds their latencies, the bytes the busy guest
// moved meanwhile, over how long, and the log's peak lag to c.
func (p *fairnessPair) measure(o FairnessOptions, load, busyAt string, c *fairnessCell) error {
	var busy *busyGuest
	if load != "" {
		var err error
		if busy, err = startBusyGuest(o.BusyGuest(busyAt, load, o.HeavyBytes)); err != nil {
			return err
		}
		defer busy.stop()
		time.Sleep(200 * time.Millisecond) // the log fills to what the share lets it
	}
	stopLag := p.watchLag(c)
	buf := make([]byte, o.LightBytes)
	start, from := time.Now(), busy.moved()
	var err error
	for range o.Calls {
		t := time.Now()
		if err = p.light.CopyDtoH(buf, p.lightPtr); err != nil {
			break
		}
		c.lat = append(c.lat, time.Since(t))
	}
	c.took, c.moved = c.took+time.Since(start), c.moved+float64(busy.moved()-from)
	stopLag()
	return errors.Join(err, busy.stop())
}

// watchLag reads the primary's log lag every 5 ms, keeping its peak in c,
// until the returned function is called.
func (p *fairnessPair) watchLag(c *fairnessCell) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if lag, err := p.nodes.LagBytes(); err == nil {
				c.peakLag = max(c.peakLag, lag)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-ended }
}

// busyGuest is a busy guest's process, which prints the bytes it moved so
// far after every call.
type busyGuest struct {
	cmd   *exec.Cmd
	bytes atomic.Int64
	done  chan error
}

// startBusyGuest starts cmd and waits for its first call.
func startBusyGuest(cmd *exec.Cmd) (*busyGuest, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &busyGuest{cmd: cmd, done: make(chan error, 1)}
	first := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			n, _ := strconv.ParseInt(sc.Text(), 10, 64)
			if b.bytes.Swap(n) == 0 {
				close(first)
			}
		}
		b.done <- cmd.Wait()
	}()
	select {
	case <-first:
		return b, nil
	case err := <-b.done:
		return nil, fmt.Errorf("the busy guest ended before its first call: %v", err)
	case <-time.After(10 * time.Second):
		b.stop()
		return nil, errors.New("the busy guest made no call in 10 s")
	}
}

// moved is what the busy guest moved so far (0 for none).
func (b *busyGuest) moved() int64 {
	if b == nil {
		return 0
	}
	return b.bytes.Load()
}

// stop ends the busy guest's process and waits for it; an error is one it
// reported before it was told to stop.
func (b *busyGuest) stop() error {
	if b == nil || b.cmd.Process == nil {
		return nil
	}
	b.cmd.Process.Signal(os.Interrupt)
	err := <-b.done
	b.done <- nil // a second stop finds it ended
	b.cmd.Process = nil
	var exit *exec.ExitError
	if errors.As(err, &exit) && !exit.Exited() { // ended by the signal
		return nil
	}
	return err
}

// RunBusyGuest is the busy guest's process: it reads (load "reader") or
// writes ("writer") an allocation of size bytes at endpoint as fast as
// it can, and prints the bytes it moved after every call, until it is
// signalled.
func RunBusyGuest(endpoint, load string, size int, out io.Writer) error {
	g, ptr, err := openWithBuffer(endpoint, "busy", size)
	if err != nil {
		return err
	}
	defer g.Close()
	buf := make([]byte, size)
	w := bufio.NewWriter(out)
	for n := int64(size); ; n += int64(size) {
		if load == "reader" {
			err = g.CopyDtoH(buf, ptr)
		} else {
			err = g.CopyHtoD(ptr, buf)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(w, n)
		if err := w.Flush(); err != nil {
			return err
		}
	}
}

func (p *fairnessPair) close(progress io.Writer) {
	if p.light != nil {
		p.light.Close()
	}
	p.nodes.Close()
	if dir := p.nodes.KeptLogs(); dir != "" && progress != nil {
		fmt.Fprintf(progress, "  the nodes' logs (share %d) are in %s\n", p.share, dir)
	}
}

// PrintFairness prints the rows as a table.
func PrintFairness(w io.Writer, rows []FairnessRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "session share\tload\tcalls\tp50 µs\tp99 µs\tp99 vs idle\tbusy guest MB/s\tpeak log lag\t")
	for _, r := range rows {
		share := "off"
		if r.Share > 0 {
			share = sizeName(r.Share)
		}
		busy := "-"
		if r.HeavyMBps > 0 {
			busy = fmt.Sprintf("%.0f", r.HeavyMBps)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.2fx\t%s\t%.1f MiB\t\n", share, r.Load, r.Calls, r.P50us, r.P99us, r.VsIdleP99, busy, float64(r.PeakLagBytes)/(1<<20))
	}
	tw.Flush()
}

// sizeName writes n bytes with the largest binary unit that divides it.
func sizeName(n int64) string {
	for _, u := range []struct {
		name  string
		bytes int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n%u.bytes == 0 {
			return fmt.Sprintf("%d %s", n/u.bytes, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
