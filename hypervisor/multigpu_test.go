package hypervisor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/placement"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// twoGPUs starts a server on two software GPUs, numbered 0 and 3 (a node
// serving cuda:0,3), placing by policy.
func twoGPUs(t *testing.T, policy placement.Policy, adjust ...func(*hypervisor.Config)) (*env, [2]*sim.Backend) {
	t.Helper()
	var sims [2]*sim.Backend
	var devs []gpu.Device
	for i, n := range []int{0, 3} {
		sims[i] = sim.New(1 << 30)
		sims[i].Number = uint8(n)
		devs = append(devs, gpu.Device{Index: n, Backend: sims[i]})
	}
	set, err := gpu.NewSet(devs...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := hypervisor.DefaultConfig()
	cfg.MemoryQuota, cfg.Placement = 256<<20, policy
	for _, f := range adjust {
		f(&cfg)
	}
	e := &env{reg: prometheus.NewRegistry()}
	srv, err := hypervisor.NewServer(set, cfg, e.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.srv, e.endpoint = srv, "unix://"+sock
	return e, sims
}

func openPinned(e *env, name, pin string) (*pvdriver.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: name, GPU: pin})
}

// TestTwoGPUs: guests spread over a node's two GPUs by its policy, each
// session's memory, kernels and device description are its own GPU's,
// a pin chooses the GPU, a pin to a GPU the node does not serve fails
// that session alone, and status and metrics say who is where.
func TestTwoGPUs(t *testing.T) {
	e, sims := twoGPUs(t, placement.FewestGuests)
	const n = 64 << 20
	var clients []*pvdriver.Client
	for i := range 4 {
		c := e.client(t, "g")
		mustAlloc(t, c, n, byte(i+1))
		clients = append(clients, c)
	}
	if sims[0].Used() != 2*n || sims[1].Used() != 2*n {
		t.Fatalf("4 guests over 2 GPUs by fewest-guests: GPU memory used %d and %d, want %d each", sims[0].Used(), sims[1].Used(), 2*n)
	}
	st := e.srv.Status()
	for i, c := range clients {
		info, err := c.DeviceInfo()
		if err != nil {
			t.Fatal(err)
		}
		gpuIndex := st.Sessions[i].GPU // sessions are listed by id, opened in order
		if info.UUID[15] != byte(gpuIndex) {
			t.Errorf("session %d placed on GPU %d describes a device of UUID %s", st.Sessions[i].ID, gpuIndex, abi.UUIDString(info.UUID))
		}
		ws, _ := workload.Select("vadd")
		if r, err := ws[0].Run(context.Background(), c, 0); err != nil || !r.Verified {
			t.Fatalf("vadd on GPU %d: %+v %v", gpuIndex, r, err)
		}
	}

	pinned, err := openPinned(e, "pinned", "3")
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	before := sims[1].Used()
	mustAlloc(t, pinned, n, 9)
	if sims[1].Used() != before+n {
		t.Fatalf("a guest pinned to GPU 3: its memory used %d, want %d", sims[1].Used(), before+n)
	}
	byUUID, err := openPinned(e, "by-uuid", abi.UUIDString(uuidOf(t, sims[0])))
	if err != nil {
		t.Fatal(err)
	}
	defer byUUID.Close()
	if _, err := openPinned(e, "lost", "1"); err == nil || !strings.Contains(err.Error(), "no such GPU") || !strings.Contains(err.Error(), "serves 0 (") {
		t.Fatalf("a pin to GPU 1, which the node does not serve: %v", err)
	}
	mustAlloc(t, e.client(t, "after"), 1<<20, 1) // the node goes on

	st = e.srv.Status()
	want := map[int]int{0: 4, 3: 3} // 2 + by-uuid + after (fewest), 2 + pinned
	for _, g := range st.GPUs {
		if g.Sessions != want[g.Index] || g.PromisedBytes != uint64(want[g.Index])*(256<<20) || g.Name != "vgpuha software GPU" {
			t.Errorf("GPU %d in status: %+v; want %d sessions", g.Index, g, want[g.Index])
		}
	}
	if st.GPUs[0].UsedBytes != sims[0].Used() || st.GPUs[1].UsedBytes != sims[1].Used() {
		t.Errorf("used bytes in status: GPU 0 %d, GPU 3 %d; the GPUs hold %d and %d", st.GPUs[0].UsedBytes, st.GPUs[1].UsedBytes, sims[0].Used(), sims[1].Used())
	}
	got := gpuGauges(t, e.reg, "vgpuha_gpu_sessions")
	if got["0"] != 4 || got["3"] != 3 {
		t.Errorf("vgpuha_gpu_sessions = %v, want 0:4 3:3", got)
	}
	if got := gpuGauges(t, e.reg, "vgpuha_gpu_memory_used_bytes"); got["3"] != float64(sims[1].Used()) || got["0"] != float64(sims[0].Used()) {
		t.Errorf("vgpuha_gpu_memory_used_bytes = %v", got)
	}

	for _, c := range append(clients, pinned, byUUID) {
		c.Close()
	}
	waitFor(t, func() bool { return len(e.srv.Status().Sessions) == 1 })
	if st := e.srv.Status(); st.GPUs[0].Sessions+st.GPUs[1].Sessions != 1 || st.GPUs[0].PromisedBytes+st.GPUs[1].PromisedBytes != 256<<20 {
		t.Errorf("after the guests left, GPUs count %+v", st.GPUs)
	}
}

// TestMostFreePlacement: most-free counts what each GPU's sessions were
// promised, so a GPU whose guests were given more is passed over.
func TestMostFreePlacement(t *testing.T) {
	e, _ := twoGPUs(t, placement.MostFree)
	pinned, err := openPinned(e, "big", "0")
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	for range 3 {
		e.client(t, "g")
	}
	want := map[int]int{0: 2, 3: 2} // after one pinned on GPU 0: GPU 3 (more left), then a tie (GPU 0, the lower), then GPU 3
	st := e.srv.Status()
	for _, g := range st.GPUs {
		if g.Sessions != want[g.Index] {
			t.Errorf("GPU %d: %d sessions, want %d (%+v)", g.Index, g.Sessions, want[g.Index], st.GPUs)
		}
	}
}

func uuidOf(t *testing.T, b *sim.Backend) [16]byte {
	info, err := b.DeviceInfo()
	if err != nil {
		t.Fatal(err)
	}
	return info.UUID
}

// gpuGauges reads a per-GPU gauge by its gpu label.
func gpuGauges(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			out[label(m, "gpu")] = m.GetGauge().GetValue()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestReplicaPlacement: a standby places each replica by its own policy,
// honouring a pin to a GPU it serves and placing one pinned to a GPU it
// lacks rather than refusing the primary's session.
func TestReplicaPlacement(t *testing.T) {
	e, _ := twoGPUs(t, placement.FewestGuests)
	open := func(id uint64, pin string) {
		t.Helper()
		// A grace of a minute: with none, the node's reaper may end a
		// replica no guest holds before Status is read (seen on a loaded
		// machine).
		body := replica.SessionOpen{Guest: "r", Token: make([]byte, abi.ResumeTokenSize), Grace: time.Minute, GraceKnown: true, GPU: pin}.Append(nil)
		base := hypervisor.DefaultConfig().WindowBase + id*hypervisor.DefaultConfig().WindowSize
		if err := e.srv.OpenReplica(id, base, body); err != nil {
			t.Fatal(err)
		}
	}
	open(1, "3") // pinned, served here
	open(2, "7") // pinned on the primary to a GPU this node lacks: the policy places it
	open(3, "")  // the policy
	open(4, "3")
	got := map[uint64]int{}
	for _, s := range e.srv.Status().Sessions {
		got[s.ID] = s.GPU
	}
	if want := map[uint64]int{1: 3, 2: 0, 3: 0, 4: 3}; !maps.Equal(got, want) {
		t.Fatalf("replicas placed on %v, want %v", got, want)
	}
}

// TestStatusConnectionPinned: a status connection (a guest's NVML with no
// session) describes the GPU its pin names, the node's first without one,
// and a pin to a GPU the node does not serve is refused.
func TestStatusConnectionPinned(t *testing.T) {
	e, sims := twoGPUs(t, placement.FewestGuests)
	for _, c := range []struct {
		pin  string
		want *sim.Backend
	}{{"", sims[0]}, {"3", sims[1]}, {abi.UUIDString(uuidOf(t, sims[1])), sims[1]}, {"0", sims[0]}} {
		if got := statusUUID(t, e.endpoint, c.pin); got != uuidOf(t, c.want) {
			t.Errorf("status connection pinned %q describes %s, want %s", c.pin, abi.UUIDString(got), abi.UUIDString(uuidOf(t, c.want)))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if sc, err := pvdriver.OpenStatus(ctx, e.endpoint, pvdriver.Options{GuestName: "nvml", GPU: "1"}); err == nil {
		sc.Close()
		t.Fatal("a status connection pinned to GPU 1, which the node does not serve, was opened")
	}
}

// statusUUID is the UUID a status connection pinned to pin (a guest's NVML
// with no session) is told for its GPU.
func statusUUID(t *testing.T, endpoint, pin string) [16]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sc, err := pvdriver.OpenStatus(ctx, endpoint, pvdriver.Options{GuestName: "nvml", GPU: pin})
	if err != nil {
		t.Fatalf("status connection pinned %q: %v", pin, err)
	}
	defer sc.Close()
	info, err := sc.DeviceInfo()
	if err != nil {
		t.Fatalf("status connection pinned %q: device_info: %v", pin, err)
	}
	return info.UUID
}

// TestDeviceIdentity: with a pair's secret (Config.DeviceIdentity, the
// replication key), guests see each GPU under a UUID derived from the
// secret and the GPU's index, not the card's own: two nodes holding the
// same secret show the same UUID for the same index, whatever their cards
// (a standby's differ from its primary's), and another secret shows
// another. A session shows the GPU it was placed on.
func TestDeviceIdentity(t *testing.T) {
	withKey := func(key string) func(*hypervisor.Config) {
		return func(cfg *hypervisor.Config) { cfg.DeviceIdentity = []byte(key) }
	}
	primary, sims := twoGPUs(t, placement.FewestGuests, withKey("pair-secret-0123456789abcdef"))
	standby, _ := twoGPUs(t, placement.FewestGuests, withKey("pair-secret-0123456789abcdef"))
	other, _ := twoGPUs(t, placement.FewestGuests, withKey("another-secret-0123456789abcdef"))
	shown := func(e *env, pin string) [16]byte { t.Helper(); return statusUUID(t, e.endpoint, pin) }
	for i, pin := range []string{"0", "3"} {
		u := shown(primary, pin)
		if u == uuidOf(t, sims[i]) {
			t.Errorf("GPU %s shows its card's own UUID %s", pin, abi.UUIDString(u))
		}
		if v := shown(standby, pin); v != u {
			t.Errorf("GPU %s: the primary shows %s, a node with the same secret %s", pin, abi.UUIDString(u), abi.UUIDString(v))
		}
		if v := shown(other, pin); v == u {
			t.Errorf("GPU %s: another secret shows the same UUID %s", pin, abi.UUIDString(u))
		}
	}
	if shown(primary, "0") == shown(primary, "3") {
		t.Error("both GPUs show one UUID")
	}
	for _, g := range primary.srv.Status().GPUs { // what an operator reads beside the card's own
		if want := abi.UUIDString(shown(primary, fmt.Sprint(g.Index))); g.GuestUUID != want {
			t.Errorf("status of GPU %d: guests see %q, want %s", g.Index, g.GuestUUID, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, primary.endpoint, pvdriver.Options{GuestName: "g", GPU: "3"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info, err := c.DeviceInfo(); err != nil || info.UUID != shown(primary, "3") {
		t.Errorf("a session on GPU 3 sees %s (%v), want GPU 3's %s", abi.UUIDString(info.UUID), err, abi.UUIDString(shown(primary, "3")))
	}
}
