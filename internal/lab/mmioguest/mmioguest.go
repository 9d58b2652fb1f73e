// Package mmioguest is a guest program that writes to apertures: the
// workloads of the MMIO benchmark (sequential, random, bulk and doorbell
// writes) and the checks that the device saw them. It runs as its own
// process (`vgpuha mmio-guest`), since the tracer cannot trace the process
// it runs in. It owns nothing but the workloads; measuring the tracer is
// the benchmark's job.
package mmioguest

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// Workloads, as the benchmark names them.
var Workloads = []string{"seq", "random", "bulk", "doorbell", "goroutines", "threads"}

// The failover workload writes, makes a call, waits for Options.Pause (the
// test kills the primary meanwhile), writes again and checks the device
// copy on whichever node now serves the session.

// Result is what one run reports (one JSON line on stdout).
type Result struct {
	Workload string `json:"workload"`
	Mode     string `json:"mode"`
	// Writes counts stores: 8-byte words for bulk copies, every descriptor
	// and doorbell store for doorbell.
	Writes uint64 `json:"writes"`
	Calls  uint64 `json:"calls"`
	// Failovers the session went through (resumed on another node).
	Failovers int   `json:"failovers"`
	Nanos     int64 `json:"nanos"`
	// Verified: after the run the device's copy of every aperture equals
	// what the guest wrote (read back with CopyDtoH).
	Verified bool `json:"verified"`
}

// Options size a run.
type Options struct {
	Endpoint      string
	Workload      string
	Writes        int    // stores to make (rounded to the workload's unit)
	ApertureBytes uint64 // the memory aperture (the doorbell register aperture is one page)
	// Threads is how many OS threads the threads workload stores from at
	// once (default 4).
	Threads int
	// Hold keeps the session and its apertures after the run, until the
	// process is killed (so an operator can verify the standby meanwhile).
	Hold func(Result)
	// Failover lists standby endpoints to resume on; Pause is the failover
	// workload's wait.
	Failover []string
	Pause    func()
}

// Run maps the apertures, runs the workload and checks the device copy.
func Run(ctx context.Context, opts Options) (Result, error) {
	c, err := pvdriver.Open(ctx, opts.Endpoint, pvdriver.Options{GuestName: "mmio-" + opts.Workload, Failover: opts.Failover})
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	mem, err := c.MapAperture(opts.ApertureBytes, pvdriver.Memory)
	if err != nil {
		return Result{}, err
	}
	defer mem.Close()
	res := Result{Workload: opts.Workload, Mode: mem.Mode.String()}
	apertures := []*pvdriver.Aperture{mem}
	start := time.Now()
	switch opts.Workload {
	case "seq":
		res.Writes = seq(mem.Mem, opts.Writes)
	case "random":
		res.Writes = random(mem.Mem, opts.Writes)
	case "bulk":
		res.Writes = bulk(mem.Mem, opts.Writes)
	case "goroutines":
		res.Writes = goroutines(mem.Mem, opts.Writes, 4)
	case "threads":
		res.Writes = threads(mem.Mem, opts.Writes, max(opts.Threads, 1))
	case "failover":
		res.Writes = seq(mem.Mem, opts.Writes)
		if err := c.Synchronize(); err != nil {
			return res, err
		}
		if opts.Pause != nil {
			opts.Pause()
		}
		res.Writes += random(mem.Mem, opts.Writes) // written while no node traces them, or to the new one
	case "doorbell":
		bell, err := c.MapAperture(4096, pvdriver.Register)
		if err != nil {
			return res, err
		}
		defer bell.Close()
		apertures = append(apertures, bell)
		start = time.Now()
		res.Writes, res.Calls, err = doorbell(c, mem.Mem, bell.Mem, opts.Writes)
		if err != nil {
			return res, err
		}
	default:
		return res, fmt.Errorf("unknown workload %q (want one of %v)", opts.Workload, Workloads)
	}
	res.Nanos = time.Since(start).Nanoseconds()
	res.Verified, err = deviceMatches(c, apertures)
	res.Failovers = len(c.Failovers())
	if err == nil && opts.Hold != nil {
		opts.Hold(res)
	}
	return res, err
}

// seq stores 8-byte words one after another, wrapping around.
func seq(mem []byte, n int) uint64 {
	words := len(mem) / 8
	for i := 0; i < n; i++ {
		*word(mem, 8*(i%words)) = uint64(i) | 1<<63
	}
	return uint64(n)
}

// random stores 8-byte words at pseudo-random places across every page.
func random(mem []byte, n int) uint64 {
	words := uint64(len(mem) / 8)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < n; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		*word(mem, int(8*(x%words))) = x
	}
	return uint64(n)
}

// bulk copies 64 KiB blocks (memcpy-style); a write is 8 bytes copied.
func bulk(mem []byte, n int) uint64 {
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	total := uint64(0)
	for off := 0; total < uint64(n); off = (off + len(src)) % len(mem) {
		k := copy(mem[off:], src)
		total += uint64(k / 8)
		src[0]++
	}
	return total
}

// goroutines has several goroutines store to their own stretch at once.
func goroutines(mem []byte, n, g int) uint64 {
	var wg sync.WaitGroup
	part := len(mem) / g / 8 * 8
	for k := 0; k < g; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := k * part
			for i := 0; i < n/g; i++ {
				*word(mem, base+8*(i%(part/8))) = uint64(k)<<56 | uint64(i)
			}
		}()
	}
	wg.Wait()
	return uint64(n / g * g)
}

// threads has n OS threads store 8-byte words at pseudo-random places
// across every page at once, writes in all (each its own sequence): the
// multi-threaded guest whose stores meet on the same pages.
func threads(mem []byte, writes, n int) uint64 {
	var wg sync.WaitGroup
	words := uint64(len(mem) / 8)
	per := writes / n
	for k := 0; k < n; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // a thread of its own for the whole run
			defer runtime.UnlockOSThread()
			x := 0x9e3779b97f4a7c15 ^ uint64(k+1)*0xbf58476d1ce4e5b9
			for i := 0; i < per; i++ {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				*word(mem, int(8*(x%words))) = x
			}
		}()
	}
	wg.Wait()
	return uint64(per * n)
}

// doorbell is a driver submitting work: four descriptor words into a ring
// slot, one doorbell register store, then a call. Five stores per round.
func doorbell(c *pvdriver.Client, ring, bell []byte, n int) (writes, calls uint64, err error) {
	slots := len(ring) / 32
	for i := 0; writes < uint64(n); i++ {
		slot := 32 * (i % slots)
		*word(ring, slot) = uint64(i)
		*word(ring, slot+8) = uint64(i) * 3
		*word(ring, slot+16) = 0x1000
		*word(ring, slot+24) = 1
		*word32(bell, 0) = uint32(i)
		writes += 5
		if err := c.Synchronize(); err != nil {
			return writes, calls, err
		}
		calls++
	}
	return writes, calls, nil
}

// deviceMatches reads every aperture's device copy back and compares it
// with the guest's mapping. The read is a call, so it flushes first.
func deviceMatches(c *pvdriver.Client, aps []*pvdriver.Aperture) (bool, error) {
	for _, a := range aps {
		got := make([]byte, len(a.Mem))
		if err := c.CopyDtoH(got, a.Ptr); err != nil {
			return false, err
		}
		if string(got) != string(a.Mem) {
			return false, nil
		}
	}
	return true, nil
}

// MainArgs is Main with `vgpuha mmio-guest`'s flags, unchecked: for test
// binaries that act as the guest (vgpuha mmio-guest checks every value).
func MainArgs(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("mmio-guest", flag.ContinueOnError)
	var opts Options
	fs.StringVar(&opts.Endpoint, "addr", os.Getenv("VGPUHA_ADDR"), "")
	fs.StringVar(&opts.Workload, "workload", "seq", "")
	fs.IntVar(&opts.Writes, "writes", 20000, "")
	fs.Uint64Var(&opts.ApertureBytes, "aperture-bytes", 4<<20, "")
	fs.IntVar(&opts.Threads, "threads", 4, "")
	hold := fs.Bool("hold", false, "")
	failoverTo := fs.String("failover", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return Main(opts, *hold, *failoverTo, stdout)
}

// Main is `vgpuha mmio-guest`: one run of opts (internal/lab/labcmd parses its
// flags into them), the Result as JSON; with hold, the session is kept
// until the process is killed; failoverTo is a standby to resume on.
func Main(opts Options, hold bool, failoverTo string, stdout io.Writer) error {
	if failoverTo != "" {
		opts.Failover = []string{failoverTo}
	}
	opts.Pause = func() { // the failover workload: wait for a line on stdin
		fmt.Fprintln(stdout, `{"paused":true}`)
		bufio.NewReader(os.Stdin).ReadString('\n')
	}
	if hold {
		opts.Hold = func(res Result) {
			json.NewEncoder(stdout).Encode(res)
			fmt.Fprintln(os.Stderr, "mmio-guest: holding the session; kill to end")
			select {}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}
