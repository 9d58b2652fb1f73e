package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// movesWithin bounds how long a guest of a deposed primary takes to learn
// where it stands.
const movesWithin = time.Second

// TestGuestOnDeposedPrimary: two nodes alone, the replication link cut:
// the standby takes over while the old primary, deposed without knowing
// it, still serves (the two-node mode's risk) and opens a session for
// guest B. Once the link heals the old primary learns the new term and is
// fenced. Then, each within a second: guest A, whose session the standby
// holds, resumes there; guest B, whose session only the deposed node
// ever held, is told it is lost (not left searching for 30 s); a new
// guest given the old primary first is refused at once as deposed and
// served by the new primary.
func TestGuestOnDeposedPrimary(t *testing.T) {
	dir := t.TempDir()
	lnS := listen(t)
	link := etcdtest.NewProxy(t, lnS.Addr().String())
	cfgS := config(t, "unix://"+filepath.Join(dir, "s.sock"))
	s, err := node.StartStandby(cfgS, lnS)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cfgP := config(t, "unix://"+filepath.Join(dir, "p.sock"))
	cfgP.ReplicateTo = []string{link.Addr()}
	p, err := node.StartPrimary(cfgP)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	open := func(name string) *pvdriver.Client {
		t.Helper()
		g, err := pvdriver.Open(context.Background(), cfgP.GuestListen, pvdriver.Options{GuestName: name, Failover: []string{cfgS.GuestListen}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}
	a := open("a")
	ptrA, err := a.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "P protected", protected(p))
	link.Partition(true)
	waitFor(t, "S serving", func() bool { from, _ := s.Serving(); return !from.IsZero() })
	b := open("b") // on P, deposed but not yet told
	if _, err := b.Alloc(8); err != nil {
		t.Fatalf("B on the deposed primary before it knows: %v", err)
	}
	link.Partition(false)
	// Fenced as its server enforces it: the authority's role changes a
	// moment before the view reaches the server (the push), and a loaded
	// machine stretches that moment (A's read was once served in it).
	waitFor(t, "P fenced", func() bool {
		r, _ := p.Role()
		_, until := p.Serving()
		return r == failover.Fenced && !until.IsZero()
	})
	fenced := time.Now()

	start := time.Now()
	if err := a.CopyDtoH(make([]byte, 8), ptrA); err != nil {
		t.Fatalf("A after P's fence: %v", err)
	}
	fo := a.Failovers()
	if took := time.Since(start); len(fo) != 1 || fo[0].Endpoint != cfgS.GuestListen || took > movesWithin {
		t.Fatalf("A: failovers %+v, its call took %v; want one move to S within %v", fo, took, movesWithin)
	}
	start = time.Now()
	_, err = b.Alloc(8)
	if took := time.Since(start); !errors.Is(err, pvdriver.ErrSessionLost) || took > movesWithin {
		t.Fatalf("B after P's fence: %v after %v; want ErrSessionLost within %v", err, took, movesWithin)
	}
	t.Logf("B told within %v of P's fence: %v", time.Since(fenced).Round(time.Millisecond), err)
	start = time.Now()
	c := open("c")
	if _, err := c.Alloc(8); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > movesWithin {
		t.Fatalf("a new guest given the deposed primary first was served after %v", took)
	}
}
