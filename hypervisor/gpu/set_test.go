package gpu_test

import (
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
)

// lost is a software GPU whose process lost its CUDA state, as a CUDA
// backend reports it (gpu.HealthReporter).
type lost struct{ *sim.Backend }

var errLost = errors.New("CUDA state lost")

func (lost) Healthy() error { return errLost }

func TestSet(t *testing.T) {
	a, b := sim.New(1<<20), sim.New(1<<20)
	if devs := gpu.DevicesOf(a); len(devs) != 1 || devs[0].Index != 0 || devs[0].Backend != a || gpu.Host(a) != a {
		t.Fatalf("one backend: devices %+v", devs)
	}
	if _, err := gpu.NewSet(); err == nil {
		t.Fatal("a set of no GPU")
	}
	set, err := gpu.NewSet(gpu.Device{Index: 2, Backend: a}, gpu.Device{Index: 5, Backend: lost{b}})
	if err != nil {
		t.Fatal(err)
	}
	devs := gpu.DevicesOf(set)
	if len(devs) != 2 || devs[0].Index != 2 || devs[1].Index != 5 || gpu.Host(set) != a || set.Name() != "sim" {
		t.Fatalf("set: %+v, host %v", devs, gpu.Host(set))
	}
	devs[0].Index = 9 // a copy: the set keeps its own
	if gpu.DevicesOf(set)[0].Index != 2 {
		t.Fatal("Devices hands out the set's own slice")
	}
	if err := set.Healthy(); err != nil {
		t.Fatalf("a set with one healthy GPU: %v", err)
	}
	if gpu.DeviceHealth(devs[1].Backend) != errLost || gpu.IsolatesContexts(set) {
		t.Fatal("per-GPU health, or isolation, misreported")
	}
	broken, _ := gpu.NewSet(gpu.Device{Backend: lost{a}}, gpu.Device{Index: 1, Backend: lost{b}})
	if !errors.Is(broken.Healthy(), errLost) {
		t.Fatal("a set of unhealthy GPUs says it is healthy")
	}
}
