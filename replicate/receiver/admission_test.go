package receiver

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/admission"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// termNode is a primary under a fixed term that records the terms its
// standby tells it.
type termNode struct {
	patternNode
	term uint64
	mu   sync.Mutex
	told []uint64
}

func (n *termNode) Term() uint64 { return n.term }
func (n *termNode) PeerTerm(t uint64) {
	n.mu.Lock()
	n.told = append(n.told, t)
	n.mu.Unlock()
}

// resetCounter counts the resets and snapshots a replica saw.
type resetCounter struct {
	mu      sync.Mutex
	resets  int
	applied int
	synced  chan struct{}
	once    sync.Once
}

func (c *resetCounter) Apply(r *replicate.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Op == replicate.OpReset {
		c.resets++
	}
	c.applied++
	return nil
}
func (c *resetCounter) Checksums() []verify.ObjectSum { return nil }
func (c *resetCounter) Heard(uint64)                  {}
func (c *resetCounter) HandOver() (uint64, bool)      { return 0, false }
func (c *resetCounter) Synced(in bool) {
	if in {
		c.once.Do(func() { close(c.synced) })
	}
}

func (c *resetCounter) resetsSoFar() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resets
}

// TestStrayPrimaryRefused: over real sockets, a standby following a
// primary refuses a second one (another group, the same group at a lower
// term, another primary at its term, the same primary restored from an
// image behind the replica), never resets its replica for it, and both
// ends count the refusal; a deposed one is told the term; the real primary
// stays attached. An operator's adoption lets another group's primary in
// once, and the old pair is refused after it.
func TestStrayPrimaryRefused(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep := &resetCounter{synced: make(chan struct{})}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: rep, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go r.Serve(ln)
	defer r.Close()
	start := func(group string, term uint64) (*replicate.Sender, *termNode, func()) {
		lg := replicate.NewLog(64 << 20)
		node := &termNode{patternNode: patternNode{log: lg, records: 2}, term: term}
		s, err := replicate.NewSender(replicate.SenderConfig{Addr: ln.Addr().String(), Key: testKey, Mode: replicate.ModeCommit, Log: lg, Logger: quiet, Group: group}, node)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		return s, node, func() { cancel(); lg.Close(); <-done }
	}
	real, realNode, stopReal := start("pair", 3)
	defer func() { stopReal() }()
	select {
	case <-rep.synced:
	case <-time.After(10 * time.Second):
		t.Fatal("the real primary never synced its standby")
	}
	waitFor(t, "protected", func() bool { return real.Status().Protected })
	for _, tc := range []struct {
		story string
		group string
		term  uint64
		want  admission.RefuseReason
	}{
		{"another group", "", 1, admission.RefusedOtherGroup},
		{"the same group, deposed", "pair", 2, admission.RefusedStaleTerm},
		{"another primary at the term", "pair", 3, admission.RefusedOtherPrimary},
	} {
		before := r.Status().Refused[tc.want.String()]
		stray, node, stop := start(tc.group, tc.term)
		waitFor(t, tc.story+": refused by the standby", func() bool { return r.Status().Refused[tc.want.String()] > before })
		waitFor(t, tc.story+": refusal counted by the stray", func() bool { return stray.Status().Refused[tc.want.String()] > 0 })
		// The count and the last error are set one after the other: wait
		// for the message too (read once, it was sometimes still empty on
		// a loaded machine).
		want := "refused this primary (" + tc.want.String() + ")"
		waitFor(t, tc.story+": the refusal is the stray's last error", func() bool { return strings.Contains(stray.Status().LastError, want) })
		stop()
		node.mu.Lock()
		told := node.told
		node.mu.Unlock()
		if tc.want == admission.RefusedStaleTerm && (len(told) == 0 || told[0] != 3) {
			t.Errorf("%s: the deposed primary was told %v, want term 3", tc.story, told)
		}
		if tc.want != admission.RefusedStaleTerm && len(told) > 0 {
			t.Errorf("%s: a primary refused for %v was told terms %v", tc.story, tc.want, told)
		}
	}
	// The real primary's image restored: its id and term, a log that ends
	// before what the replica applied.
	realNode.log.Append(replicate.Record{Op: replicate.OpMMIO, Body: []byte("x")})
	waitFor(t, "the record applied", func() bool { return r.Status().Applied >= 1 })
	before := r.Status().Refused[admission.RefusedRewound.String()]
	// The same primary (its log's id), its log restored from an image: a
	// log of nothing yet.
	stop := present(t, ln.Addr().String(), admission.Identity{Group: "pair", Primary: real.Status().Primary, Term: 3})
	waitFor(t, "the rewound primary refused", func() bool { return r.Status().Refused[admission.RefusedRewound.String()] > before })
	stop()
	if n := rep.resetsSoFar(); n != 1 {
		t.Errorf("the replica was reset %d times, want once (the real primary's resync)", n)
	}
	if st := real.Status(); !st.Protected || st.Resyncs != 1 {
		t.Errorf("the real primary: protected %v after %d resyncs, want protected after 1", st.Protected, st.Resyncs)
	}
	if f := r.Status().Follows; f == nil || f.Group != "pair" || f.Term != 3 {
		t.Errorf("the standby follows %+v", f)
	}

	// An operator's adoption: the next primary, of another group, is
	// followed (its resync replaces the replica), and the old pair's
	// primary is refused from then on.
	r.armAdoption()
	adopted, _, stopAdopted := start("new-pair", 1)
	defer stopAdopted()
	waitFor(t, "the adopted primary protected", func() bool { return adopted.Status().Protected })
	if f := r.Status().Follows; f == nil || f.Group != "new-pair" {
		t.Errorf("after the adoption the standby follows %+v", f)
	}
	stopReal()
	stopReal = func() {}
	before = r.Status().Refused[admission.RefusedOtherGroup.String()]
	_, _, stopOld := start("pair", 3)
	waitFor(t, "the old pair's primary refused", func() bool { return r.Status().Refused[admission.RefusedOtherGroup.String()] > before })
	stopOld()
	if n := rep.resetsSoFar(); n != 2 {
		t.Errorf("the replica was reset %d times, want twice (the real primary's and the adopted one's resyncs)", n)
	}
}

// present connects to the standby at addr as a primary presenting id, and
// returns what drops the link.
func present(t *testing.T, addr string, id admission.Identity) func() {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l, err := link.ClientHandshake(c, testKey, 5*time.Second)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	l.Out = link.FromPrimary
	if err := l.WriteFlush(link.MsgIdentity, replicate.AppendIdentity(make([]byte, 0, replicate.IdentityFixed+len(id.Group)+link.MacSize), id)); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return func() { c.Close() }
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
