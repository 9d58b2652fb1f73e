package worker_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/gpu/worker"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// workerCluster starts a primary whose guests bring their own kernels,
// each in a worker (--guest.kernels, workers on), with no one-guest
// limit; backends collects the workers' backends it opened.
func workerCluster(t *testing.T) (*cluster.Cluster, *[]*worker.Backend) {
	t.Helper()
	var mu sync.Mutex
	var backends []*worker.Backend
	c, err := cluster.Start(cluster.Options{
		NewBackend: func() (gpu.Backend, error) {
			be, err := node.GPU{Name: "sim", SimMemoryBytes: 1 << 30, Workers: true, SpareContexts: 2}.Open()
			if err == nil {
				mu.Lock()
				backends = append(backends, be.(*worker.Backend))
				mu.Unlock()
			}
			return be, err
		},
		Hypervisor: func(cfg *hypervisor.Config) { cfg.GuestKernels, cfg.MaxSessions = true, 8 },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for _, be := range backends {
			be.Close()
		}
	})
	return c, &backends
}

// chaser is a guest with pointer_chase loaded (a kernel that follows a
// pointer stored in device memory: on a GPU that does not check every
// access it runs only where the guest is alone in its process) and 1 MiB
// of memory.
type chaser struct {
	g   *pvdriver.Client
	f   pvdriver.Function
	mem pvdriver.DevicePtr
}

func newChaser(t *testing.T, c *cluster.Cluster, name string) *chaser {
	t.Helper()
	g, err := c.Guest(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	img, _ := kernels.Image("pointer_chase")
	m, err := g.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	ch := &chaser{g: g}
	if ch.f, err = g.GetFunction(m, "pointer_chase"); err != nil {
		t.Fatal(err)
	}
	if ch.mem, err = g.Alloc(1 << 20); err != nil {
		t.Fatal(err)
	}
	return ch
}

// chase follows a node at the guest's memory whose next pointer is next,
// two steps, and returns the sum it read.
func (ch *chaser) chase(next uint64) (uint64, error) {
	node := make([]byte, 16)
	binary.LittleEndian.PutUint64(node, next)
	binary.LittleEndian.PutUint64(node[8:], 21)
	if err := ch.g.CopyHtoD(ch.mem, node); err != nil {
		return 0, err
	}
	one := abi.Dim3{X: 1, Y: 1, Z: 1}
	out := ch.mem + 4096
	if err := ch.g.Launch(ch.f, pvdriver.LaunchConfig{Grid: one, Block: one}, abi.Ptr(uint64(ch.mem)), abi.U32(2), abi.Ptr(uint64(out))); err != nil {
		return 0, err
	}
	if err := ch.g.Synchronize(); err != nil {
		return 0, err
	}
	got := make([]byte, 8)
	err := ch.g.CopyDtoH(got, out)
	return binary.LittleEndian.Uint64(got), err
}

// TestGuestsInWorkers: two guests with kernels that follow stored
// pointers are served by one primary at once, each in its own worker;
// each reaches its own memory and faults reaching the other's; SIGKILL
// of one's worker fails that guest's next call with a clear error, while
// the other's calls, a new guest and the node's health carry on.
func TestGuestsInWorkers(t *testing.T) {
	c, backends := workerCluster(t)
	a, b := newChaser(t, c, "a"), newChaser(t, c, "b")
	if sum, err := a.chase(uint64(a.mem)); err != nil || sum != 42 {
		t.Fatalf("a chasing its own memory: %d, %v", sum, err)
	}
	secret := bytes.Repeat([]byte{0xb}, 4096)
	if err := b.g.CopyHtoD(b.mem+8192, secret); err != nil {
		t.Fatal(err)
	}
	if _, err := a.chase(uint64(b.mem + 8192)); !errors.Is(err, abi.StatusLaunchFailed) {
		t.Fatalf("a chasing into b's memory: %v, want a launch failure", err)
	}
	got := make([]byte, 4096)
	if err := a.g.CopyDtoH(got, b.mem+8192); !errors.Is(err, abi.StatusOutOfRange) {
		t.Fatalf("a copying b's memory: %v, want out of range", err)
	}
	if sum, err := b.chase(uint64(b.mem)); err != nil || sum != 42 {
		t.Fatalf("b chasing its own memory: %d, %v", sum, err)
	}

	be := (*backends)[0]
	pid := workerOf(t, be, uint64(b.mem))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := b.g.CopyHtoD(b.mem, []byte{1})
	if !errors.Is(err, abi.StatusLaunchFailed) || !strings.Contains(err.Error(), "GPU worker") || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("b's call after its worker was killed: %v, want a launch failure naming the killed worker", err)
	}
	if sum, err := a.chase(uint64(a.mem)); err != nil || sum != 42 {
		t.Fatalf("a after b's worker died: %d, %v", sum, err)
	}
	n := newChaser(t, c, "new")
	if sum, err := n.chase(uint64(n.mem)); err != nil || sum != 42 {
		t.Fatalf("a new guest after b's worker died: %d, %v", sum, err)
	}
	rec := httptest.NewRecorder()
	c.PrimaryNode.AdminHandler(prometheus.NewRegistry()).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/healthz after a worker died: %d %s", rec.Code, rec.Body)
	}
	if w := be.Workers(); len(w) != 2 {
		t.Fatalf("workers %+v, want a's and the new guest's", w)
	}
}

// workerOf is the pid of the worker whose context holds addr.
func workerOf(t *testing.T, be *worker.Backend, addr uint64) int {
	t.Helper()
	for _, w := range be.Workers() {
		if addr >= w.WindowBase && addr-w.WindowBase < w.Size {
			return w.Pid
		}
	}
	t.Fatalf("no worker holds %#x: %+v", addr, be.Workers())
	return 0
}
