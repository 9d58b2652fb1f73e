package node_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate"
)

func TestCheckGPU(t *testing.T) {
	for name, ok := range map[string]bool{"sim": true, "cuda": true, "auto": true, "cuda:0": true, "cuda:3": true,
		"cuda:all": true, "cuda:0,2": true, "cuda:GPU-5e1f": true, "cuda:1, GPU-5e1f": true,
		"cuda:-1": false, "cuda:x": false, "gpu": false, "": false, "cuda:": false, "cuda:0,0": false, "cuda:01": false,
		"cuda:GPU-": false, "cuda:GPU-ab,gpu-AB": false, "cuda:all,1": false, "cuda:0,": false} {
		if err := node.CheckGPU(name); (err == nil) != ok {
			t.Errorf("CheckGPU(%q) = %v, want ok=%v", name, err, ok)
		}
	}
	b, err := node.GPU{Name: "sim", SimMemoryBytes: 1 << 24}.Open()
	if err != nil || b.Name() != "sim" {
		t.Fatalf("sim: %v, %v", b, err)
	}
	b.Close()
	if _, err := (node.GPU{Name: "gpu"}).Open(); err == nil {
		t.Fatal("an unknown backend opened")
	}
}

// runConfig is a node process's configuration on the software GPU.
func runConfig(t *testing.T, standby bool, guests string) node.RunConfig {
	return node.RunConfig{Standby: standby, GPU: node.GPU{Name: "sim", SimMemoryBytes: 1 << 28}, Detector: "fixed",
		Registry: prometheus.NewRegistry(), Admin: listen(t),
		Node: node.Config{Hypervisor: hypervisor.DefaultConfig(), Key: key, Mode: replicate.ModeCommit,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), GuestListen: guests}}
}

// answers polls a node's /healthz until it answers want (0: anything; a
// standby with no primary connected answers 503).
func answers(t *testing.T, rc node.RunConfig, want int) {
	t.Helper()
	url := "http://" + rc.Admin.Addr().String() + "/healthz"
	waitFor(t, "/healthz at "+url, func() bool {
		r, err := http.Get(url)
		if err != nil {
			return false
		}
		r.Body.Close()
		return want == 0 || r.StatusCode == want
	})
}

// TestRunLife: node.Run runs a standby and a primary streaming to it, each
// with its admin endpoint, its hooks called in order; the primary ends
// with OnReady's channel (vgpuha run's guest program), returning its
// error and telling no fence; the standby ends with its context.
func TestRunLife(t *testing.T) {
	dir := t.TempDir()
	sb := runConfig(t, true, "unix://"+filepath.Join(dir, "b.sock"))
	sb.Replication = listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	standbyDone := make(chan error, 1)
	go func() { standbyDone <- node.Run(ctx, sb) }()
	answers(t, sb, 0)

	pr := runConfig(t, false, "unix://"+filepath.Join(dir, "a.sock"))
	pr.Node.ReplicateTo = []string{sb.Replication.Addr().String()}
	var order []string
	guest := make(chan error, 1)
	pr.OnServe = func(n *node.Node) error { order = append(order, "serve"); return nil }
	pr.OnReady = func() (<-chan error, error) { order = append(order, "ready"); return guest, nil }
	pr.OnFenced = func(uint64) { order = append(order, "fenced") }
	primaryDone := make(chan error, 1)
	go func() { primaryDone <- node.Run(context.Background(), pr) }()
	answers(t, pr, http.StatusOK)
	answers(t, sb, http.StatusOK) // the primary's stream reached it
	exited := errors.New("guest program exited 3")
	guest <- exited
	select {
	case err := <-primaryDone:
		if !errors.Is(err, exited) {
			t.Errorf("primary's Run returned %v, want the guest program's %v", err, exited)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("primary did not stop when its guest program ended")
	}
	if len(order) != 2 || order[0] != "serve" || order[1] != "ready" {
		t.Errorf("hooks ran %v, want [serve ready]", order)
	}
	cancel()
	select {
	case err := <-standbyDone:
		if err != nil {
			t.Errorf("standby's Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("standby did not stop when its context ended")
	}
	if _, err := http.Get("http://" + sb.Admin.Addr().String() + "/healthz"); err == nil {
		t.Error("the standby's admin endpoint still answers after Run returned")
	}
}
