package hypervisor_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// syncBuffer is a log sink tests can read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestResumeNeedsToken: a detached session is resumed only by the guest
// holding its resume token; a resume without it or with a wrong one is
// refused, counted and logged (without the token), and the owner's own
// resume then works.
func TestResumeNeedsToken(t *testing.T) {
	logs := &syncBuffer{}
	e := &env{backend: sim.New(1 << 30), reg: prometheus.NewRegistry()}
	srv, err := hypervisor.NewServer(e.backend, hypervisor.DefaultConfig(), e.reg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.endpoint = srv, serve(t, srv)

	owner := dialRaw(t, e)
	var hr abi.HelloReply
	if st, msg := owner.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "owner", GraceMS: 10000}, &hr); st != abi.StatusOK {
		t.Fatal(msg)
	}
	if len(hr.Token) != abi.ResumeTokenSize || bytes.Equal(hr.Token, make([]byte, abi.ResumeTokenSize)) {
		t.Fatalf("hello reply token %x", hr.Token)
	}
	var a abi.AllocReply
	owner.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 4096}, &a)
	owner.send(abi.OpCopyHtoD, 0, 3, &abi.CopyHtoD{Dst: a.Ptr, Data: []byte("secret")}, nil)
	owner.conn.Close()
	waitDetached(t, srv)

	wrong := append([]byte(nil), hr.Token...)
	wrong[0] ^= 1
	for _, tok := range [][]byte{nil, wrong, hr.Token[:16]} {
		thief := dialRaw(t, e)
		st, msg := thief.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "thief", Resume: hr.Session, Token: tok}, &abi.HelloReply{})
		if st == abi.StatusOK {
			t.Fatalf("resume with token %x accepted", tok)
		}
		if tok != nil && len(tok) != abi.ResumeTokenSize {
			continue // refused as a malformed hello: not a resume attempt
		}
		if !strings.Contains(msg, "resume token") {
			t.Errorf("resume with token %x: %v %q", tok, st, msg)
		}
	}
	if n := refusals(t, e, "resume_token"); n != 2 {
		t.Fatalf("%v resume_token refusals counted, want 2", n)
	}
	again := dialRaw(t, e)
	var back abi.HelloReply
	if st, msg := again.send(abi.OpHello, 0, 4, &abi.Hello{GuestName: "owner", Resume: hr.Session, Token: hr.Token}, &back); st != abi.StatusOK || back.Applied != 3 {
		t.Fatalf("owner's resume: %v %q, applied %d", st, msg, back.Applied)
	}
	var data abi.DataReply
	if st, _ := again.send(abi.OpCopyDtoH, 0, 5, &abi.CopyDtoH{Src: a.Ptr, Size: 6}, &data); st != abi.StatusOK || string(data.Data) != "secret" {
		t.Fatalf("owner's data after its resume: %v %q", st, data.Data)
	}
	out := logs.String()
	if !strings.Contains(out, "resume_token") {
		t.Error("refused resumes left no log line")
	}
	for _, enc := range []string{hex.EncodeToString(hr.Token), base64.StdEncoding.EncodeToString(hr.Token), string(hr.Token)} {
		if strings.Contains(out, enc) {
			t.Fatal("the resume token appears in the log")
		}
	}
}

func serve(t *testing.T, srv *hypervisor.Server) string {
	t.Helper()
	sock := t.TempDir() + "/g.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "unix://" + sock
}

// waitDetached waits until no session is served by a connection (the
// server notices a closed connection asynchronously).
func waitDetached(t *testing.T, srv *hypervisor.Server) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st := srv.Status(); st.Detached == len(st.Sessions) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("session still attached")
}

// TestVersion1Guest: a guest of the previous ABI version is answered in its
// own version, without the token its decoder does not know; it cannot
// resume (it has no token).
func TestVersion1Guest(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	r := dialRaw(t, e)
	r.conn.Write(abi.AppendFrameVersion(nil, abi.Version-1, abi.OpHello, 0, 1, (&abi.Hello{GuestName: "old"}).Append(nil)))
	f, err := r.fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	var hr abi.HelloReply
	if st, _, err := abi.DecodeReply(f.Payload, &hr); err != nil || st != abi.StatusOK || f.Version != abi.Version-1 || hr.Token != nil {
		t.Fatalf("version-1 hello: reply version %d, %v %v, token %x", f.Version, st, err, hr.Token)
	}
}

// TestResumeTokenOnStandby: the standby learns each session's token from
// the log: after a failover the guest resumes there with it, and a resume
// without it is refused there too.
func TestResumeTokenOnStandby(t *testing.T) {
	c := startPair(t, cluster.Options{})
	g := guest(t, c, "owner")
	p, err := g.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CopyHtoD(p, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	c.KillPrimary()
	deadline := time.Now().Add(10 * time.Second)
	for refused := false; !refused; {
		if time.Now().After(deadline) {
			t.Fatal("the standby never answered a resume")
		}
		conn, err := net.Dial("unix", strings.TrimPrefix(c.StandbyEndpoint, "unix://"))
		if err != nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		r := &raw{t: t, conn: conn, fr: abi.NewFrameReader(conn, 1<<20)}
		st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "thief", Resume: g.Session()}, &abi.HelloReply{})
		conn.Close()
		switch {
		case st == abi.StatusOK:
			t.Fatal("resume without a token accepted on the standby")
		case strings.Contains(msg, "resume token"):
			refused = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := make([]byte, 4)
	if err := g.CopyDtoH(got, p); err != nil || string(got) != "kept" {
		t.Fatalf("owner after the failover: %q %v", got, err)
	}
	if len(g.Failovers()) != 1 {
		t.Fatalf("failovers: %+v", g.Failovers())
	}
}

// TestRestartedGuestResumes: a restarted guest (a VM restored from its
// checkpoint) takes its session back with the id and token it saved, and
// numbers its requests on from what the session applied (else its first
// requests would be answered as resends).
func TestRestartedGuestResumes(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	old := dialRaw(t, e)
	var hr abi.HelloReply
	old.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "vm", GraceMS: 10000}, &hr)
	for id := uint64(2); id < 50; id++ {
		old.send(abi.OpStreamCreate, 0, id, &abi.StreamCreate{}, &abi.HandleReply{})
	}
	old.conn.Close()
	waitDetached(t, e.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: "vm", ResumeSession: hr.Session}); err == nil {
		t.Fatal("resume without the saved token accepted")
	}
	c, err := pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: "vm", ResumeSession: hr.Session, ResumeToken: hr.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !bytes.Equal(c.ResumeToken(), hr.Token) {
		t.Fatal("the client does not keep the token it resumed with")
	}
	s, err := c.CreateStream()
	if err != nil || s != 49 {
		t.Fatalf("first request after the restart: stream %d, %v; want a new stream 49 (48 were made)", s, err)
	}
}
