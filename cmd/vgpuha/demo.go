package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/workload"
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
	pair, err := startPair(*backendName, *mode)
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
		}
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
	if !second.Verified || len(c.Failovers()) != 1 {
		return fmt.Errorf("failover demo failed (logs in %s)", dir)
	}
	return nil
}

// pair is a primary and a standby running as child processes of this
// binary, on loopback, sharing a fresh replication key.
type pair struct {
	dir                        string
	primary, standby           *exec.Cmd
	primaryEP, standbyEP       string
	primaryAdmin, standbyAdmin string
}

func startPair(backend, mode string) (*pair, error) {
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
	ports := make([]string, 3)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ports[i] = ln.Addr().String()
		ln.Close()
	}
	repl := ports[0]
	p.primaryAdmin, p.standbyAdmin = ports[1], ports[2]
	p.primaryEP, p.standbyEP = "unix://"+filepath.Join(dir, "primary.sock"), "unix://"+filepath.Join(dir, "standby.sock")
	start := func(name string, args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(self, args...)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		cmd.Stderr = logf
		return cmd, cmd.Start()
	}
	if p.standby, err = start("standby", "standby", "--backend", backend, "--listen", "tcp://"+repl, "--replicate.key-file", keyFile,
		"--guest-listen", p.standbyEP, "--admin-listen", p.standbyAdmin); err != nil {
		p.stop()
		return nil, err
	}
	if p.primary, err = start("primary", "primary", "--backend", backend, "--guest-listen", p.primaryEP, "--replicate-to", "tcp://"+repl,
		"--replicate.key-file", keyFile, "--mode", mode, "--admin-listen", p.primaryAdmin); err != nil {
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

// stop kills both nodes and removes their files.
func (p *pair) stop() {
	for _, c := range []*exec.Cmd{p.primary, p.standby} {
		if c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Kill()
			c.Wait()
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
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/status")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
