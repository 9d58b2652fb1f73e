package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/mmioguest"
	"github.com/vgpuha/vgpuha/internal/workload"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// runDemo shows the product's point on one machine: it starts a standby and
// a primary as separate processes (the embedded default: the software GPU
// unless a GPU is present, everything on loopback), runs every workload
// through a guest, SIGKILLs the primary in the middle of the second round,
// and the guest finishes on the promoted standby with verified results.
func runDemo(args []string) error {
	fs := newFlags("demo", "[flags]")
	backendName := fs.String("backend", "auto", "GPU backend for both nodes: auto, cuda or sim")
	mode := fs.String("mode", "commit", "replication mode")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pair, err := startPair(*backendName, *mode, false)
	if err != nil {
		return err
	}
	defer pair.stop()
	pr, sb, dir := pair.primary, pair.standby, pair.dir
	primaryAdmin, standbyAdmin, primaryEP, standbyEP := pair.primaryAdmin, pair.standbyAdmin, pair.primaryEP, pair.standbyEP

	var pst struct {
		Backend     string
		Replication struct{ State string }
	}
	getJSON(primaryAdmin, &pst)
	fmt.Printf("primary (pid %d) and standby (pid %d) up: %s backend, %s mode, protected\n", pr.Process.Pid, sb.Process.Pid, pst.Backend, *mode)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := pvdriver.Open(ctx, primaryEP, pvdriver.Options{GuestName: "demo", Failover: []string{standbyEP}})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	ws, _ := workload.Select("all")
	first, err := runWorkloads(context.Background(), c, ws, 0)
	if err != nil {
		return err
	}
	fmt.Printf("round 1 on the primary: %d workloads, all verified: %v\n", len(first.Workloads), first.Verified)

	// An aperture guest: a separate process that writes mapped device
	// memory directly (no calls); the primary traces those writes and
	// replicates them. It writes half, pauses across the kill, writes the
	// rest, and checks the device copy on whichever node serves it then.
	apGuest, err := startApertureGuest(primaryEP, standbyEP)
	if err != nil {
		return err
	}

	// Round 2: kill the primary after the first workload.
	var killed time.Time
	second := guestReport{Verified: true}
	for i, w := range ws {
		r, err := w.Run(context.Background(), c, 0)
		if err != nil {
			return fmt.Errorf("after the failover: %w", err)
		}
		r.Verified = r.Verified && r.Checksum == first.Workloads[i].Checksum
		second.Workloads = append(second.Workloads, r)
		second.Verified = second.Verified && r.Verified
		if i == 0 {
			killed = time.Now()
			pr.Process.Kill()
			fmt.Printf("SIGKILL primary after %s in round 2\n", r.Name)
			apGuest.resume()
		}
	}
	apRes, err := apGuest.result()
	if err != nil {
		return fmt.Errorf("aperture guest: %w", err)
	}
	fmt.Println()
	printResults(os.Stdout, second.Workloads)
	var sst struct {
		Role      string
		Promotion *struct {
			Term        uint64
			DetectionMS float64 `json:"detection_ms"`
			PromotionMS float64 `json:"promotion_ms"`
			Serving     time.Time
		}
	}
	getJSON(standbyAdmin, &sst)
	fmt.Println("\ntimeline:")
	fmt.Printf("  t=0        primary killed\n")
	if p := sst.Promotion; p != nil {
		fmt.Printf("  +%-8s  standby detected the silence (%.0f ms without a heartbeat) and was promoted to term %d in %.1f ms\n",
			p.Serving.Sub(killed).Round(time.Millisecond), p.DetectionMS, p.Term, p.PromotionMS)
	}
	for _, f := range c.Failovers() {
		fmt.Printf("  +%-8s  guest resumed its session on %s (resent %d requests); guest paused for %v\n",
			f.Resumed.Sub(killed).Round(time.Millisecond), strings.TrimPrefix(f.Endpoint, "unix://"), f.Resent, f.Resumed.Sub(f.Lost).Round(time.Millisecond))
	}
	fmt.Printf("\nround 2 finished on the promoted standby (%s); results verified and identical to round 1: %v\n", sst.Role, second.Verified)
	fmt.Printf("aperture guest (pid %d, writes traced in %s mode): %d stores to mapped device memory, half of them after the primary died;\n"+
		"  resumed on the standby (%d failover), whose device copy equals everything it wrote: %v\n",
		apGuest.cmd.Process.Pid, apRes.Mode, apRes.Writes, apRes.Failovers, apRes.Verified)
	if !second.Verified || len(c.Failovers()) != 1 || !apRes.Verified || apRes.Failovers != 1 {
		return fmt.Errorf("failover demo failed (logs in %s)", dir)
	}
	return nil
}

// pair is a primary and a standby running as child processes of this
// binary, sharing a fresh replication key: on loopback, or each in its own
// network namespace joined by a veth link that drills can cut. Guests reach
// both through unix sockets (paths cross namespaces), and so do the admin
// endpoints.
type pair struct {
	dir                        string
	primary, standby           *exec.Cmd
	primaryEP, standbyEP       string
	primaryAdmin, standbyAdmin string
	netns                      [2]string // primary's, standby's; empty on loopback
}

// netnsAvailable reports whether network namespaces can be made here.
func netnsAvailable() bool {
	name := fmt.Sprintf("vgpuha-probe-%d", os.Getpid())
	if exec.Command("ip", "netns", "add", name).Run() != nil {
		return false
	}
	exec.Command("ip", "netns", "del", name).Run()
	return true
}

var pairSeq int

func startPair(backend, mode string, netns bool) (*pair, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "vgpuha-pair")
	if err != nil {
		return nil, err
	}
	p := &pair{dir: dir}
	key := make([]byte, 32)
	rand.Read(key)
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		return nil, err
	}
	p.primaryAdmin, p.standbyAdmin = "unix://"+filepath.Join(dir, "primary-admin.sock"), "unix://"+filepath.Join(dir, "standby-admin.sock")
	p.primaryEP, p.standbyEP = "unix://"+filepath.Join(dir, "primary.sock"), "unix://"+filepath.Join(dir, "standby.sock")
	repl := ""
	if netns {
		pairSeq++
		id := fmt.Sprintf("%d-%d", os.Getpid()%100000, pairSeq)
		p.netns = [2]string{"vgp-" + id, "vgs-" + id}
		vp, vs := "vp"+id, "vs"+id
		if len(vp) > 15 {
			vp, vs = vp[:15], vs[:15]
		}
		subnet := fmt.Sprintf("10.%d.%d", 100+pairSeq%100, os.Getpid()%250)
		steps := [][]string{
			{"netns", "add", p.netns[0]}, {"netns", "add", p.netns[1]},
			{"link", "add", vp, "type", "veth", "peer", "name", vs},
			{"link", "set", vp, "netns", p.netns[0]}, {"link", "set", vs, "netns", p.netns[1]},
			{"-n", p.netns[0], "addr", "add", subnet + ".1/24", "dev", vp},
			{"-n", p.netns[1], "addr", "add", subnet + ".2/24", "dev", vs},
			{"-n", p.netns[0], "link", "set", vp, "up"}, {"-n", p.netns[1], "link", "set", vs, "up"},
			{"-n", p.netns[0], "link", "set", "lo", "up"}, {"-n", p.netns[1], "link", "set", "lo", "up"},
		}
		for _, st := range steps {
			if out, err := exec.Command("ip", st...).CombinedOutput(); err != nil {
				p.stop()
				return nil, fmt.Errorf("ip %v: %v: %s", st, err, out)
			}
		}
		repl = subnet + ".2:7071"
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		repl = ln.Addr().String()
		ln.Close()
	}
	start := func(name, ns string, args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(self, args...)
		if ns != "" {
			cmd = exec.Command("ip", append([]string{"netns", "exec", ns, self}, args...)...)
		}
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		cmd.Stderr = logf
		return cmd, cmd.Start()
	}
	if p.standby, err = start("standby", p.netns[1], "standby", "--backend", backend, "--listen", "tcp://"+repl, "--replicate.key-file", keyFile,
		"--guest-listen", p.standbyEP, "--admin-listen", p.standbyAdmin, "--mmio", demoMMIOMode()); err != nil {
		p.stop()
		return nil, err
	}
	if p.primary, err = start("primary", p.netns[0], "primary", "--backend", backend, "--guest-listen", p.primaryEP, "--replicate-to", "tcp://"+repl,
		"--replicate.key-file", keyFile, "--mode", mode, "--admin-listen", p.primaryAdmin, "--mmio", demoMMIOMode()); err != nil {
		p.stop()
		return nil, err
	}
	var st struct{ Replication struct{ State string } }
	if err := waitFor(10*time.Second, func() bool {
		return getJSON(p.primaryAdmin, &st) == nil && st.Replication.State == "protected"
	}); err != nil {
		p.stop()
		return nil, fmt.Errorf("primary never became protected (logs in %s): %w", dir, err)
	}
	return p, nil
}

// link sets the primary's end of the replication link up or down (a
// partition between primary and standby; namespaces only).
func (p *pair) link(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	out, err := exec.Command("ip", "-n", p.netns[0], "-o", "link", "show", "type", "veth").Output()
	if err != nil {
		return err
	}
	name := strings.TrimSpace(strings.SplitN(strings.SplitN(string(out), ":", 3)[1], "@", 2)[0])
	return exec.Command("ip", "-n", p.netns[0], "link", "set", name, state).Run()
}

// stop kills both nodes and removes their files and namespaces.
func (p *pair) stop() {
	for _, c := range []*exec.Cmd{p.primary, p.standby} {
		if c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Kill()
			c.Wait()
		}
	}
	for _, ns := range p.netns {
		if ns != "" {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	os.RemoveAll(p.dir)
}

func waitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func getJSON(addr string, v any) error {
	c, base := adminClient(addr, 2*time.Second)
	resp, err := c.Get(base + "/status")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// apertureGuest is `vgpuha mmio-guest --workload failover` run by the demo.
type apertureGuest struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startApertureGuest starts the guest and waits until it has written its
// first half and paused.
func startApertureGuest(primaryEP, standbyEP string) (*apertureGuest, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := mmiotrace.GuestCommand(exec.Command(self, "mmio-guest", "--addr", primaryEP, "--failover", standbyEP,
		"--workload", "failover", "--writes", "20000", "--aperture-bytes", "1048576"))
	cmd.Stderr = os.Stderr
	g := &apertureGuest{cmd: cmd}
	if g.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	g.out = bufio.NewScanner(out)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if !g.out.Scan() || g.out.Text() != `{"paused":true}` {
		mmiotrace.WaitExit(cmd)
		return nil, fmt.Errorf("aperture guest did not start: %q", g.out.Text())
	}
	return g, nil
}

// resume lets the guest write its second half.
func (g *apertureGuest) resume() { fmt.Fprintln(g.stdin) }

// result waits for the guest's report.
func (g *apertureGuest) result() (mmioguest.Result, error) {
	var res mmioguest.Result
	for g.out.Scan() {
		json.Unmarshal(g.out.Bytes(), &res)
	}
	return res, mmiotrace.WaitExit(g.cmd)
}

// demoMMIOMode is how the pair traces apertures: uffd where the kernel has
// it (the guest needs no ptrace then), else page.
func demoMMIOMode() string {
	if mmiotrace.UffdAvailable() == nil {
		return "uffd"
	}
	return "page"
}
