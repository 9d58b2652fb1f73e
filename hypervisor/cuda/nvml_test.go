package cuda_test

import (
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestDeviceStatusOnGPU: the host's NVML answers the GPU's live state for
// the GPU the backend serves: a temperature, a power draw below its limit,
// clocks, and the driver's version; the memory fields are the
// hypervisor's, never the backend's.
func TestDeviceStatusOnGPU(t *testing.T) {
	b := backend(t)
	var r abi.DeviceStatusReply
	b.DeviceStatus(&r)
	temp, ok := r.Get(abi.FieldTemperature)
	if !ok || temp == 0 || temp > 120 {
		t.Errorf("temperature %d °C (%v)", temp, ok)
	}
	power, ok1 := r.Get(abi.FieldPowerUsage)
	limit, ok2 := r.Get(abi.FieldPowerLimit)
	if !ok1 || !ok2 || power == 0 || power > limit {
		t.Errorf("power %d mW of %d mW (%v, %v)", power, limit, ok1, ok2)
	}
	if sm, ok := r.Get(abi.FieldMaxClockSM); !ok || sm == 0 {
		t.Errorf("max SM clock %d MHz (%v)", sm, ok)
	}
	if v, ok := r.Text(abi.TextDriverVersion); !ok || v == "" {
		t.Errorf("driver version %q (%v)", v, ok)
	}
	for _, f := range []abi.DeviceField{abi.FieldGuestMemoryUsed, abi.FieldSessionMemory, abi.FieldGuestMemoryQuota} {
		if v, ok := r.Get(f); ok {
			t.Errorf("the backend set memory field %d (%d): that is the hypervisor's", f, v)
		}
	}
}
