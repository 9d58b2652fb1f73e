// Package soak owns the kill soak (vgpuha-lab soak): two node processes on
// loopback whose primary is SIGKILLed again and again and restarted as the
// new primary's standby, while guests of every kind keep working; it
// counts every acknowledged write read back and every session at the end.
//
// It drives nodes only as processes (nodeproc) and guests only through
// pvdriver, never in-process; it never changes what a drill measures (the
// drill's Quantiles are its figures too).
package soak

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill"
	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Options configure a soak: two nodes on loopback whose primary is
// SIGKILLed every KillMin..KillMax and restarted as the new primary's
// standby, while counter guests write and read back without pause,
// looping guest processes run every workload, a new guest opens a session
// every NewGuestEvery and a guest dies mid-hello every MidHelloEvery.
type Options struct {
	Binary, Backend  string
	Duration         time.Duration
	KillMin, KillMax time.Duration
	CounterGuests    int // in-process guests writing counters (default 2)
	LoopingGuests    int // `vgpuha guest --workload all` processes run in a loop (default 2)
	NewGuestEvery    time.Duration
	MidHelloEvery    time.Duration
	Grace            time.Duration // both nodes' --guest.max-grace
	Seed             uint64
	Note             func(string)
}

// Report is what a soak counted.
type Report struct {
	Seconds     float64         `json:"seconds"`
	Kills       int             `json:"kills"`
	Takeovers   int             `json:"takeovers"`
	DetectionMS drill.Quantiles `json:"detection_ms"`      // the drill's detection: the kill → the standby's decision
	AckedWrites int64           `json:"acked_writes"`      // counter guests' acknowledged writes
	LostAcked   int64           `json:"lost_acked_writes"` // acknowledged writes not read back
	// RolledBack: sessions whose guest was told that acknowledged
	// requests are gone (pvdriver.ErrRolledBack: the node it resumed on
	// lacks them; pvdriver.ErrSessionLost: no node holds the session; both
	// from a two-node primary deposed while it served unprotected);
	// counted apart from LostAcked, which counts what no guest was told.
	RolledBack      int      `json:"rolled_back_sessions"`
	CounterErrors   int      `json:"counter_guest_errors"`
	WorkloadRuns    int      `json:"workload_runs"`
	WorkloadFailed  int      `json:"workload_runs_failed"`
	NewGuests       int      `json:"new_guests"`
	NewRefused      int      `json:"new_guests_refused"`
	MidHellos       int      `json:"mid_hello_deaths"`
	SessionsAtEnd   int      `json:"sessions_at_end"`
	ExpectedAtEnd   int      `json:"expected_sessions_at_end"`
	Problems        []string `json:"problems,omitempty"` // the first few
	Logs            string   `json:"logs,omitempty"`     // kept when something failed
	problemsDropped int
}

// soakNode is one of the two hosts: its addresses stay, its process is
// replaced at each restart.
type soakNode struct {
	name, repl, guestEP string
	agent               *nodeproc.Node
}

type soak struct {
	o         Options
	dir, key  string
	nodes     [2]*soakNode
	primary   int // index of the serving node
	mu        sync.Mutex
	rep       Report
	detection []float64
	stop      chan struct{}
	wg        sync.WaitGroup
}

// Run runs a soak for o.Duration and reports what it counted.
func Run(o Options) (Report, error) {
	fill := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	fill(&o.KillMin, 5*time.Second)
	fill(&o.KillMax, 20*time.Second)
	fill(&o.NewGuestEvery, 5*time.Second)
	fill(&o.MidHelloEvery, time.Minute)
	fill(&o.Grace, 5*time.Second)
	if o.CounterGuests == 0 {
		o.CounterGuests = 2
	}
	if o.LoopingGuests == 0 {
		o.LoopingGuests = 2
	}
	s := &soak{o: o, stop: make(chan struct{})}
	if err := s.start(); err != nil {
		return s.rep, err
	}
	start := time.Now()
	s.guests()
	err := s.kills(start.Add(o.Duration))
	close(s.stop)
	s.wg.Wait()
	s.rep.Seconds = time.Since(start).Seconds()
	if err == nil {
		err = s.countSessions()
	}
	s.rep.DetectionMS = drill.QuantilesOf(s.detection)
	s.finish(err)
	return s.rep, err
}

// start makes the directory and key and starts node 0 as primary, node 1
// as its standby.
func (s *soak) start() error {
	var err error
	if s.dir, err = os.MkdirTemp("", "vgpuha-soak"); err != nil {
		return err
	}
	key := make([]byte, 32)
	rand.Read(key)
	s.key = filepath.Join(s.dir, "key")
	if err := os.WriteFile(s.key, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		return err
	}
	for i, name := range []string{"a", "b"} {
		addr, err := nodeproc.FreeAddr()
		if err != nil {
			return err
		}
		s.nodes[i] = &soakNode{name: name, repl: addr, guestEP: "unix://" + filepath.Join(s.dir, name+".sock")}
	}
	if err := s.startNode(1, "standby"); err != nil {
		return err
	}
	if err := s.startNode(0, "primary"); err != nil {
		return err
	}
	return s.waitProtected(0)
}

// startNode starts node i in role, streaming to (or taking streams from)
// the other node.
func (s *soak) startNode(i int, role string) error {
	n, other := s.nodes[i], s.nodes[1-i]
	n.agent = nodeproc.New(filepath.Join(s.dir, n.name+"-admin.sock"))
	args := []string{role, "--backend", s.o.Backend, "--guest-listen", n.guestEP, "--replicate.key-file", s.key,
		"--admin-listen", n.agent.Admin, "--replicate-to", "tcp://" + other.repl, "--guest.max-grace", s.o.Grace.String()}
	if role == "standby" {
		args = append(args, "--listen", "tcp://"+n.repl)
	}
	n.agent.Cmd = exec.Command(s.o.Binary, args...)
	logf, err := os.OpenFile(filepath.Join(s.dir, n.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	n.agent.Cmd.Stderr = logf
	return n.agent.Cmd.Start()
}

func (s *soak) waitProtected(i int) error {
	return nodeproc.WaitFor(60*time.Second, func() bool {
		var st struct{ Replication struct{ State string } }
		return s.nodes[i].agent.Status(&st) == nil && st.Replication.State == "protected"
	})
}

func (s *soak) note(format string, args ...any) {
	if s.o.Note != nil {
		s.o.Note(fmt.Sprintf(format, args...))
	}
}

// problem records something that went wrong (the first few in full).
func (s *soak) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rep.Problems) < 20 {
		s.rep.Problems = append(s.rep.Problems, fmt.Sprintf(format, args...))
	} else {
		s.rep.problemsDropped++
	}
}

// kills SIGKILLs the primary every KillMin..KillMax until deadline: the
// standby must take over, and the killed node comes back as its standby.
func (s *soak) kills(deadline time.Time) error {
	rng := mrand.New(mrand.NewPCG(s.o.Seed, s.o.Seed^0x9e3779b97f4a7c15))
	for {
		wait := s.o.KillMin + time.Duration(rng.Int64N(int64(s.o.KillMax-s.o.KillMin)+1))
		if time.Now().Add(wait).After(deadline) {
			time.Sleep(time.Until(deadline))
			return nil
		}
		time.Sleep(wait)
		if err := s.killPrimary(); err != nil {
			return err
		}
	}
}

func (s *soak) killPrimary() error {
	old := s.primary
	killed := time.Now()
	s.nodes[old].agent.Cmd.Process.Kill()
	s.nodes[old].agent.Cmd.Wait()
	s.mu.Lock()
	s.rep.Kills++
	s.mu.Unlock()
	next := s.nodes[1-old].agent
	var p *nodeproc.Promotion
	if err := nodeproc.WaitFor(10*time.Second, func() bool { p = next.Promotion(); return p != nil && time.Since(p.Serving) < time.Minute }); err != nil {
		return fmt.Errorf("kill %d: the standby did not take over", s.rep.Kills)
	}
	s.mu.Lock()
	s.primary = 1 - old
	s.rep.Takeovers++
	detection := drill.MS(drill.MeasureSpans(killed, p, nil).Detection)
	s.detection = append(s.detection, detection)
	s.mu.Unlock()
	if err := s.startNode(old, "standby"); err != nil {
		return err
	}
	if err := s.waitProtected(1 - old); err != nil {
		return fmt.Errorf("kill %d: the restarted node never protected the new primary: %w", s.rep.Kills, err)
	}
	s.note("kill %d: node %s took over (%s %.0f ms); node %s resynced as its standby", s.rep.Kills, s.nodes[1-old].name,
		drill.TermDetection, detection, s.nodes[old].name)
	return nil
}

func (s *soak) endpoints() []string { return []string{s.nodes[0].guestEP, s.nodes[1].guestEP} }

// guests starts the counter guests, the looping guest processes, the new
// guests and the mid-hello deaths; all end when s.stop closes.
func (s *soak) guests() {
	for i := range s.o.CounterGuests {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.counterGuest(i) }()
	}
	for i := range s.o.LoopingGuests {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.loopingGuest(i) }()
	}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.every(s.o.NewGuestEvery, s.newGuest) }()
	go func() { defer s.wg.Done(); s.every(s.o.MidHelloEvery, s.midHello) }()
}

func (s *soak) every(d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			f()
		}
	}
}

// stopped reports whether the soak is over (s.stop closed).
func (s *soak) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// counterSlots is how many 8-byte counters a counter guest keeps on the
// device.
const counterSlots = 512

// counterGuest opens sessions one after another (a session that fails
// is counted and replaced) until the soak ends.
func (s *soak) counterGuest(i int) {
	for !s.stopped() {
		if err := s.counterSession(i); err != nil && !s.stopped() {
			s.mu.Lock()
			s.rep.CounterErrors++
			if errors.Is(err, pvdriver.ErrRolledBack) || errors.Is(err, pvdriver.ErrSessionLost) {
				s.rep.RolledBack++
			}
			s.mu.Unlock()
			s.problem("counter guest %d: %v", i, err)
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// counterSession writes an increasing counter into rotating slots, one
// acknowledged write at a time, and reads every slot back every 64
// writes: a slot that does not hold the last value acknowledged for it is
// a lost acknowledged write.
func (s *soak) counterSession(i int) error {
	eps := s.endpoints()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	g, err := pvdriver.Open(ctx, eps[0], pvdriver.Options{GuestName: fmt.Sprintf("counter-%d", i), Failover: eps[1:]})
	cancel()
	if err != nil {
		return fmt.Errorf("opening: %w", err)
	}
	defer g.Close()
	ptr, err := g.Alloc(counterSlots * 8)
	if err == nil {
		err = g.Memset8(ptr, 0, counterSlots*8)
	}
	if err != nil {
		return err
	}
	model := make([]uint64, counterSlots)
	buf, all := make([]byte, 8), make([]byte, counterSlots*8)
	for n := uint64(1); !s.stopped(); n++ {
		slot := n % counterSlots
		binary.LittleEndian.PutUint64(buf, n)
		if err := g.CopyHtoD(ptr+pvdriver.DevicePtr(slot*8), buf); err != nil {
			return fmt.Errorf("write %d: %w", n, err)
		}
		model[slot] = n
		atomic.AddInt64(&s.rep.AckedWrites, 1)
		if n%64 != 0 {
			continue
		}
		if err := g.CopyDtoH(all, ptr); err != nil {
			return fmt.Errorf("read-back after write %d: %w", n, err)
		}
		for j, want := range model {
			if got := binary.LittleEndian.Uint64(all[j*8:]); got != want {
				atomic.AddInt64(&s.rep.LostAcked, 1)
				s.problem("counter guest %d: slot %d holds %d, the last acknowledged write there was %d", i, j, got, want)
			}
		}
	}
	return nil
}

// loopingGuest runs `vgpuha guest --workload all` (every workload,
// checked against the CPU) again and again until the soak ends; a run
// that fails is counted with the end of what it said.
func (s *soak) loopingGuest(i int) {
	eps := s.endpoints()
	for !s.stopped() {
		cmd := exec.Command(s.o.Binary, "guest", "--endpoint", eps[0], "--failover", strings.Join(eps[1:], ","),
			"--workload", "all", "--name", fmt.Sprintf("loop-%d", i))
		var out strings.Builder
		cmd.Stderr, cmd.Stdout = &out, &out
		if err := cmd.Start(); err != nil {
			s.problem("looping guest %d: %v", i, err)
			return
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			s.mu.Lock()
			s.rep.WorkloadRuns++
			if err != nil {
				s.rep.WorkloadFailed++
			}
			if err != nil && (strings.Contains(out.String(), pvdriver.ErrRolledBack.Error()) || strings.Contains(out.String(), pvdriver.ErrSessionLost.Error())) {
				s.rep.RolledBack++
			}
			s.mu.Unlock()
			if err != nil {
				s.problem("looping guest %d: %v: %s", i, err, tail(out.String(), 400))
			}
		case <-s.stop:
			cmd.Process.Kill() // mid-run: its session expires after its grace
			<-done
			return
		}
	}
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// newGuest starts a guest as a new program would: it must be served at
// once (a refusal is counted), write, read back and say bye.
func (s *soak) newGuest() {
	eps := s.endpoints()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := pvdriver.Open(ctx, eps[0], pvdriver.Options{GuestName: "new", Failover: eps[1:]})
	cancel()
	if err == nil {
		defer g.Close()
		var ptr pvdriver.DevicePtr
		if ptr, err = g.Alloc(4096); err == nil {
			err = g.CopyHtoD(ptr, []byte("soak"))
		}
	}
	s.mu.Lock()
	s.rep.NewGuests++
	if err != nil {
		s.rep.NewRefused++
	}
	s.mu.Unlock()
	if err != nil {
		s.problem("a new guest: %v", err)
	}
}

// midHello is a guest that dies right after sending its hello: the node
// opens a session nobody will ever use, which must be freed after its
// grace.
func (s *soak) midHello() {
	s.mu.Lock()
	ep := s.nodes[s.primary].guestEP
	s.mu.Unlock()
	c, err := net.Dial("unix", strings.TrimPrefix(ep, "unix://"))
	if err != nil {
		return // mid-takeover: nobody to die on
	}
	hello := abi.AppendBodyFrame(nil, abi.OpHello, 0, 1, &abi.Hello{GuestName: "mid-hello", GraceMS: uint32(s.o.Grace.Milliseconds())})
	c.Write(hello)
	c.Close()
	s.mu.Lock()
	s.rep.MidHellos++
	s.mu.Unlock()
}

// countSessions waits out every session's grace and counts what the
// serving primary still holds: every guest has gone, so nothing should.
func (s *soak) countSessions() error {
	time.Sleep(s.o.Grace + 3*time.Second)
	var st struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	if err := s.nodes[s.primary].agent.Status(&st); err != nil {
		return fmt.Errorf("reading the primary's sessions: %w", err)
	}
	s.rep.SessionsAtEnd = len(st.Sessions)
	return nil
}

// finish stops the nodes; their logs stay when anything went wrong.
func (s *soak) finish(err error) {
	for _, n := range s.nodes {
		if n != nil && n.agent != nil && n.agent.Cmd != nil && n.agent.Cmd.Process != nil {
			n.agent.Cmd.Process.Signal(syscall.SIGKILL)
			n.agent.Cmd.Wait()
		}
	}
	if err != nil || len(s.rep.Problems) > 0 || s.rep.SessionsAtEnd != s.rep.ExpectedAtEnd {
		s.rep.Logs = s.dir
		return
	}
	os.RemoveAll(s.dir)
}

// errSoakFailed: the soak counted a loss, a leak or a refusal.
var errSoakFailed = errors.New("soak failed")

// Verdict is nil when the soak lost no acknowledged write (silently or
// told), leaked no session and refused no new guest.
func (r Report) Verdict() error {
	if r.LostAcked > 0 || r.SessionsAtEnd != r.ExpectedAtEnd || r.NewRefused > 0 || r.RolledBack > 0 {
		return fmt.Errorf("%w: %d acknowledged writes lost, %d sessions rolled back, %d sessions left (want %d), %d new guests refused",
			errSoakFailed, r.LostAcked, r.RolledBack, r.SessionsAtEnd, r.ExpectedAtEnd, r.NewRefused)
	}
	return nil
}
