package pvdriver_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// TestCallersReadTheirReplies: over a socket, a caller that waits alone
// reads its reply on its own thread (replies.go), so no other goroutine
// hands it over, and calls from several goroutines at once still each get
// their own reply, whoever read it.
func TestCallersReadTheirReplies(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("callers wait on sockets themselves on Linux only")
	}
	for _, tcp := range []bool{false, true} {
		t.Run(map[bool]string{false: "unix", true: "tcp"}[tcp], func(t *testing.T) {
			g := plainGuest(t, cluster.Options{GuestTCP: tcp})
			p, err := g.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			before := g.OwnReplies()
			const calls = 200
			buf := make([]byte, 8)
			for i := range calls {
				if err := g.Memset(p, 1, uint32(i), 8, 0, true); err != nil {
					t.Fatal(err)
				}
				if err := g.CopyDtoH(buf, p); err != nil {
					t.Fatal(err)
				}
				if buf[0] != byte(i) || buf[7] != byte(i) {
					t.Fatalf("call %d read %v", i, buf)
				}
			}
			// Memset with sync set waits too: 400 calls, each alone.
			if own := g.OwnReplies() - before; own != 2*calls {
				t.Errorf("%d of %d replies read by their caller", own, 2*calls)
			}
			burstReads(t, g, p)
			concurrentReads(t, g)
		})
	}
}

// burstReads: a read with two more behind it (a wait and the mirrors
// of mapped memory) goes as one burst whose three replies the caller reads
// itself (readBurst), none handed over by the reader goroutine.
func burstReads(t *testing.T, g *pvdriver.Client, p pvdriver.DevicePtr) {
	t.Helper()
	q, err := g.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	before := g.OwnReplies()
	const bursts = 100
	main, r1, r2 := make([]byte, 8), make([]byte, 4), make([]byte, 4)
	for i := range bursts {
		if err := g.Memset(q, 1, uint32(i), 4, 0, false); err != nil {
			t.Fatal(err)
		}
		reads := []pvdriver.Read{{Dst: r1, Src: q}, {Dst: r2, Src: p + 4}}
		if err := g.CopyDtoHThenRead(main, p, reads); err != nil {
			t.Fatal(err)
		}
		if r1[0] != byte(i) || r1[3] != byte(i) || r2[0] != main[4] {
			t.Fatalf("burst %d read %v %v behind %v", i, r1, r2, main)
		}
	}
	if own := g.OwnReplies() - before; own != 3*bursts {
		t.Errorf("%d of %d replies of bursts read by their caller", own, 3*bursts)
	}
}

// plainGuest opens a guest session on a node started with opts; the test
// closes both.
func plainGuest(t *testing.T, opts cluster.Options) *pvdriver.Client {
	t.Helper()
	c, err := cluster.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	g, err := pvdriver.Open(context.Background(), c.Endpoint, pvdriver.Options{GuestName: "g"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// concurrentReads has eight goroutines read their own allocations at once.
func concurrentReads(t *testing.T, g *pvdriver.Client) {
	t.Helper()
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			errs <- func() error {
				q, err := g.Alloc(64)
				if err != nil {
					return err
				}
				in := make([]byte, 64)
				for i := range in {
					in[i] = byte(w*31 + i)
				}
				out := make([]byte, 64)
				for range 50 {
					if err := g.CopyHtoD(q, in); err != nil {
						return err
					}
					if err := g.CopyDtoH(out, q); err != nil {
						return err
					}
					for i := range out {
						if out[i] != in[i] {
							t.Errorf("goroutine %d read %v, wrote %v", w, out, in)
							return nil
						}
					}
				}
				return nil
			}()
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestIdleGuestSeesItsConnectionEnd: a guest that makes no call while its
// connection ends (no caller reads then: the reader goroutine only watches
// for the end) resumes at once, within the grace its node keeps the
// session for, not at its next call.
func TestIdleGuestSeesItsConnectionEnd(t *testing.T) {
	_, px, g := guestViaProxy(t, cluster.Options{})
	p, err := g.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	deadline := time.Now().Add(10 * time.Second)
	for len(g.Failovers()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("an idle guest whose connection was cut never resumed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.Memset8(p, 7, 64); err != nil {
		t.Fatalf("a call after the resume: %v", err)
	}
}
