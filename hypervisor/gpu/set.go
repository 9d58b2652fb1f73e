package gpu

import "errors"

// Device is one of the GPUs a node serves: the backend that runs its
// contexts, and the number the host knows it by (CUDA's device ordinal;
// a software GPU's number among --sim.gpus).
type Device struct {
	Index   int
	Backend Backend
}

// Set is the GPUs one node serves (--backend cuda:all, cuda:0,2, or
// --sim.gpus N), each a Backend of its own. It is a Backend itself so a
// node passes one value around; the hypervisor places every session on
// one of its Devices (package placement) and never calls Set.NewContext.
// Work that belongs to the host and not to one GPU (page-locked host
// memory, gpu.HostAllocator and gpu.HostRegistrar) goes through the first
// device's backend (Host), whose CUDA allocations are portable to every
// context of the process.
type Set struct{ devs []Device }

// NewSet returns the set of devs, in the order given (at least one).
func NewSet(devs ...Device) (*Set, error) {
	if len(devs) == 0 {
		return nil, errors.New("a GPU set of no GPU")
	}
	return &Set{devs: append([]Device(nil), devs...)}, nil
}

// Devices implements DeviceLister.
func (s *Set) Devices() []Device { return append([]Device(nil), s.devs...) }

// Name implements Backend: the first device's kind (every device of a set
// is of one kind).
func (s *Set) Name() string { return s.devs[0].Backend.Name() }

// NewContext implements Backend on the first device, for a caller that
// does not place (a tool, a test); a node places through Devices.
func (s *Set) NewContext(base, size uint64) (Context, error) {
	return s.devs[0].Backend.NewContext(base, size)
}

// Close implements Backend: every device is closed; the first error is
// returned.
func (s *Set) Close() error {
	var first error
	for _, d := range s.devs {
		if err := d.Backend.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// IsolatesContexts implements ProcessIsolator: every device's backend does.
func (s *Set) IsolatesContexts() bool {
	for _, d := range s.devs {
		if !IsolatesContexts(d.Backend) {
			return false
		}
	}
	return true
}

// Healthy implements HealthReporter: nil while one device still takes new
// guests (placement skips the others: DeviceHealth); else the first
// device's error.
func (s *Set) Healthy() error {
	var first error
	for _, d := range s.devs {
		err := DeviceHealth(d.Backend)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// DeviceLister is implemented by backends made of several GPUs (Set).
type DeviceLister interface {
	Devices() []Device
}

// DevicesOf is the GPUs b serves: a Set's devices, or b alone as GPU 0.
func DevicesOf(b Backend) []Device {
	if l, ok := b.(DeviceLister); ok {
		return l.Devices()
	}
	return []Device{{Index: 0, Backend: b}}
}

// Host is the backend that host-wide work goes through (page-locked host
// memory): b itself, or a Set's first device.
func Host(b Backend) Backend {
	if l, ok := b.(DeviceLister); ok {
		return l.Devices()[0].Backend
	}
	return b
}

// DeviceSpares is how many contexts b has ready ahead, of how many it
// keeps (SpareReporter; zero where it makes none).
func DeviceSpares(b Backend) (ready, kept int) {
	if s, ok := b.(SpareReporter); ok {
		return s.Spares()
	}
	return 0, 0
}

// DeviceHealth is nil while b takes new contexts (HealthReporter; a
// backend that cannot break always does).
func DeviceHealth(b Backend) error {
	if h, ok := b.(HealthReporter); ok {
		return h.Healthy()
	}
	return nil
}
