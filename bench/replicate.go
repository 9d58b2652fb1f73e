package bench

import (
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
)

// ReplicateOptions sets the replication benchmark's size.
type ReplicateOptions struct {
	BulkBytes int // bytes copied per bulk timing
	Rounds    int
	Calls     int // small calls per latency timing
	Progress  io.Writer
	// NewBackend makes each node's GPU; nil means the software GPU.
	NewBackend func() (gpu.Backend, error)
	// NewStandbyBackend, when set, makes the standbys' GPUs instead. On
	// one GPU a standby replays every state change on a second context of
	// the primary's device, and the GPU time-slices the two: a small
	// host-to-device copy then pays a context switch on the primary (the
	// +230 µs measured on an H100 in every mode). A second device, or the
	// software GPU, takes that out of the figures.
	NewStandbyBackend func() (gpu.Backend, error)
}

// ThroughputRow is one bulk-copy configuration.
type ThroughputRow struct {
	Path      string  `json:"path"`
	MBPerSec  float64 `json:"mb_per_s"`
	VsTCPCopy float64 `json:"vs_tcp_copy"`
}

// LatencyRow is one small synchronous call under one mode.
type LatencyRow struct {
	Call    string  `json:"call"`
	Mode    string  `json:"mode"`
	NsPerOp float64 `json:"ns_per_op"`
	AddedNs float64 `json:"added_ns"` // over no replication
}

// ResyncRow is one resync of a standby that joins late.
type ResyncRow struct {
	GuestBytes uint64  `json:"guest_bytes"`
	PauseMS    float64 `json:"guest_pause_ms"` // guests stopped while the snapshot was taken
	ResyncMS   float64 `json:"resync_ms"`      // attach to protected
}

// ReplicateReport is what `vgpuha bench replicate` prints.
type ReplicateReport struct {
	Throughput []ThroughputRow `json:"throughput"`
	Latency    []LatencyRow    `json:"latency"`
	Resync     []ResyncRow     `json:"resync"`
	// Baseline names what VsTCPCopy divides by when it is not the plain
	// TCP copy (a live run compares with the backend in-process).
	Baseline string `json:"baseline,omitempty"`
}

// Replicate measures bulk host-to-device copy throughput with a standby
// applying every byte against a plain TCP copy of the same bytes on
// loopback, and the latency a small synchronous call gains in each mode.
// Configurations run interleaved, round by round.
func Replicate(opts ReplicateOptions) (ReplicateReport, error) {
	if opts.BulkBytes <= 0 {
		opts.BulkBytes = 256 << 20
	}
	if opts.Rounds <= 0 {
		opts.Rounds = 5
	}
	if opts.Calls <= 0 {
		opts.Calls = 1000
	}
	nodes, err := startReplicaNodes(opts)
	defer func() {
		for _, n := range nodes {
			n.g.Close()
			n.c.Close()
		}
	}()
	if err != nil {
		return ReplicateReport{}, err
	}
	data := make([]byte, opts.BulkBytes)
	for i := range data {
		data[i] = byte(i * 7)
	}
	tcpCopy, closeTCP, err := plainTCP()
	if err != nil {
		return ReplicateReport{}, err
	}
	defer closeTCP()

	// bulk copies: unreplicated, replicated in commit mode (a D->H read at
	// the end waits until the standby applied every byte), plain TCP.
	bulk := func(n replicaNode) func() error {
		return func() error {
			if err := n.g.CopyHtoD(n.buf, data); err != nil {
				return err
			}
			return n.g.CopyDtoH(make([]byte, 8), n.buf)
		}
	}
	paths := []struct {
		name string
		run  func() error
	}{
		{"tcp copy (loopback)", func() error { return tcpCopy(data) }},
		{"pv copy, no replication", bulk(nodes[0])},
		{"pv copy, replicated (commit)", bulk(nodes[2])},
	}
	bulkNs := make([][]float64, len(paths))
	lat := make([][2][]float64, len(nodes))
	small := make([]byte, 64)
	for round := 0; round < opts.Rounds; round++ {
		for i, p := range paths {
			start := time.Now()
			if err := p.run(); err != nil {
				return ReplicateReport{}, fmt.Errorf("%s: %w", p.name, err)
			}
			bulkNs[i] = append(bulkNs[i], float64(time.Since(start).Nanoseconds()))
		}
		for i, n := range nodes {
			start := time.Now()
			for range opts.Calls {
				if err := n.g.CopyHtoD(n.buf, small); err != nil {
					return ReplicateReport{}, err
				}
			}
			lat[i][0] = append(lat[i][0], float64(time.Since(start).Nanoseconds())/float64(opts.Calls))
			start = time.Now()
			for range opts.Calls {
				if err := n.g.CopyDtoH(small, n.buf); err != nil {
					return ReplicateReport{}, err
				}
			}
			lat[i][1] = append(lat[i][1], float64(time.Since(start).Nanoseconds())/float64(opts.Calls))
		}
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "round %d/%d done\n", round+1, opts.Rounds)
		}
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = p.name
	}
	rep := summarize(opts.BulkBytes, names, bulkNs, nodes, lat)
	for _, size := range []int{opts.BulkBytes / 4, opts.BulkBytes} {
		row, err := measureResync(opts, size)
		if err != nil {
			return rep, err
		}
		rep.Resync = append(rep.Resync, row)
	}
	return rep, nil
}

// summarize turns the rounds' timings into the report's medians.
func summarize(bulkBytes int, paths []string, bulkNs [][]float64, nodes []replicaNode, lat [][2][]float64) ReplicateReport {
	var rep ReplicateReport
	base := median(bulkNs[0])
	for i, p := range paths {
		ns := median(bulkNs[i])
		rep.Throughput = append(rep.Throughput, ThroughputRow{Path: p,
			MBPerSec: float64(bulkBytes) / ns * 1e3, VsTCPCopy: base / ns})
	}
	for ci, call := range []string{"copy_htod_64B", "copy_dtoh_64B"} {
		none := median(lat[0][ci])
		for i, n := range nodes {
			m := median(lat[i][ci])
			rep.Latency = append(rep.Latency, LatencyRow{Call: call, Mode: n.name, NsPerOp: m, AddedNs: m - none})
		}
	}
	return rep
}

// replicaNode is one mode's cluster with a guest and its bulk buffer.
type replicaNode struct {
	name string
	c    *cluster.Cluster
	g    *pvdriver.Client
	buf  pvdriver.DevicePtr
}

// startReplicaNodes starts a cluster per replication mode (and one
// without), each with a guest holding a BulkBytes buffer.
func startReplicaNodes(opts ReplicateOptions) ([]replicaNode, error) {
	modes := []struct {
		name string
		opts cluster.Options
	}{
		{"none", cluster.Options{}},
		{"sync", cluster.Options{Replicate: true, Mode: replicate.ModeSync, StartStandby: true}},
		{"commit", cluster.Options{Replicate: true, Mode: replicate.ModeCommit, StartStandby: true}},
		{"async", cluster.Options{Replicate: true, Mode: replicate.ModeAsync, StartStandby: true}},
		{"epoch", cluster.Options{Replicate: true, Mode: replicate.ModeEpoch, StartStandby: true}},
	}
	var nodes []replicaNode
	for _, m := range modes {
		m.opts.NewBackend, m.opts.NewStandbyBackend = opts.NewBackend, opts.NewStandbyBackend
		c, err := cluster.Start(m.opts)
		if err != nil {
			return nodes, err
		}
		if m.opts.Replicate {
			if err := c.WaitProtected(10 * time.Second); err != nil {
				c.Close()
				return nodes, err
			}
		}
		g, err := c.Guest("bench")
		if err != nil {
			c.Close()
			return nodes, err
		}
		p, err := g.Alloc(uint64(opts.BulkBytes))
		if err != nil {
			g.Close()
			c.Close()
			return nodes, err
		}
		nodes = append(nodes, replicaNode{m.name, c, g, p})
	}
	return nodes, nil
}

// measureResync fills a guest's memory with no standby attached, then
// starts one and reports the snapshot's guest pause and the whole resync.
func measureResync(opts ReplicateOptions, size int) (ResyncRow, error) {
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, NewBackend: opts.NewBackend, NewStandbyBackend: opts.NewStandbyBackend})
	if err != nil {
		return ResyncRow{}, err
	}
	defer c.Close()
	g, err := c.Guest("resync")
	if err != nil {
		return ResyncRow{}, err
	}
	defer g.Close()
	p, err := g.Alloc(uint64(size))
	if err != nil {
		return ResyncRow{}, err
	}
	if err := g.CopyHtoD(p, make([]byte, size)); err != nil {
		return ResyncRow{}, err
	}
	if err := c.StartStandby(); err != nil {
		return ResyncRow{}, err
	}
	if err := c.WaitProtected(time.Minute); err != nil {
		return ResyncRow{}, err
	}
	time.Sleep(20 * time.Millisecond) // let the sender record the resync's end
	st := c.Sender.Status()
	return ResyncRow{GuestBytes: uint64(size), PauseMS: st.LastPauseMS, ResyncMS: st.LastResync * 1000}, nil
}

// plainTCP returns a function that sends bytes over a loopback TCP
// connection to a reader that discards them, and waits for the reader's
// one-byte acknowledgement: the floor for shipping the same bytes.
func plainTCP() (func([]byte) error, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [8]byte
		buf := make([]byte, 1<<20)
		for {
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			n := int64(0)
			for i := 0; i < 8; i++ {
				n |= int64(hdr[i]) << (8 * i)
			}
			// Read as the standby reads a large record: up to 1 MiB at a
			// time into one buffer (io.Discard reads 8 KiB at a time).
			for n > 0 {
				m, err := c.Read(buf[:min(int64(len(buf)), n)])
				if err != nil {
					return
				}
				n -= int64(m)
			}
			c.Write([]byte{1})
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	send := func(b []byte) error {
		var hdr [8]byte
		for i := 0; i < 8; i++ {
			hdr[i] = byte(len(b) >> (8 * i))
		}
		if _, err := c.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := c.Write(b); err != nil {
			return err
		}
		_, err := io.ReadFull(c, hdr[:1])
		return err
	}
	return send, func() { c.Close(); ln.Close() }, nil
}

// PrintReplicate writes the report as two tables.
func PrintReplicate(w io.Writer, rep ReplicateReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	baseline := "tcp copy"
	if rep.Baseline != "" {
		baseline = rep.Baseline
	}
	fmt.Fprintf(tw, "bulk host->device copy\tMB/s\tvs %s\t\n", baseline)
	for _, r := range rep.Throughput {
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t\n", r.Path, r.MBPerSec, r.VsTCPCopy)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "small sync call\tmode or path\tns/op\tadded ns\t")
	for _, r := range rep.Latency {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%+.0f\t\n", r.Call, r.Mode, r.NsPerOp, r.AddedNs)
	}
	tw.Flush()
	if len(rep.Resync) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "late standby resync	guest MiB	guest pause ms	resync ms	")
	for _, r := range rep.Resync {
		fmt.Fprintf(tw, "\t%d\t%.1f\t%.1f\t\n", r.GuestBytes>>20, r.PauseMS, r.ResyncMS)
	}
	tw.Flush()
}
