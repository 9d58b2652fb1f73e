package hypervisor

import (
	"fmt"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/placement"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The GPUs a node serves (gpu.DevicesOf its backend: one, or a gpu.Set)
// and where each session runs. Every session is placed on one GPU when it
// opens (package placement decides, by Config.Placement or the guest's
// pin; a standby places each replica by its own policy), and keeps it:
// its context, memory, modules and the device_info and device_status
// answers its guest gets all come from that GPU's backend.

// device is one GPU as the server counts it.
type device struct {
	index   int
	backend gpu.Backend
	uuid    [16]byte
	name    string
	memory  uint64
	// sessions and promised count the sessions placed here and the
	// memory they were promised (each its --guest.memory-quota-bytes),
	// from placement to close, under Server.mu.
	sessions int
	promised uint64
}

// newDevices describes the GPUs b serves.
func newDevices(b gpu.Backend) []*device {
	var out []*device
	for _, d := range gpu.DevicesOf(b) {
		dev := &device{index: d.Index, backend: d.Backend, name: d.Backend.Name()}
		if desc, ok := d.Backend.(gpu.DeviceDescriber); ok {
			if info, err := desc.DeviceInfo(); err == nil {
				dev.uuid, dev.name, dev.memory = info.UUID, info.Name, info.TotalMem
			}
		}
		out = append(out, dev)
	}
	return out
}

// deviceMemory is the memory of every GPU together: what tenants share
// unless Config.DeviceMemory says.
func deviceMemory(devs []*device) uint64 {
	var sum uint64
	for _, d := range devs {
		sum += d.memory
	}
	return sum
}

// place chooses the GPU a new session runs on and counts the session
// there (unplace undoes it). strict fails a pin that names no GPU of this
// node (a guest's session); a replica's pin falls back to the policy.
func (s *Server) place(pin string, strict bool) (*device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, err := placement.Place(s.cfg.Placement, s.loadsLocked(), placement.Request{Pin: pin, Quota: s.cfg.MemoryQuota, Strict: strict})
	if err != nil {
		return nil, fmt.Errorf("%w: placing the session on a GPU: %w", abi.StatusInvalidValue, err)
	}
	d := s.devices[i]
	d.sessions++
	d.promised += s.cfg.MemoryQuota
	return d, nil
}

// loadsLocked is what placement knows of each GPU.
// Precondition: s.mu must be locked.
func (s *Server) loadsLocked() []placement.GPU {
	loads := make([]placement.GPU, len(s.devices))
	for i, d := range s.devices {
		loads[i] = placement.GPU{Index: d.index, UUID: d.uuid, Memory: d.memory, Promised: d.promised, Sessions: d.sessions,
			Health: gpu.DeviceHealth(d.backend)}
	}
	return loads
}

// pinned is the GPU pin names (index or UUID), counting nothing: what a
// status connection asks about; the node's first GPU without a pin.
func (s *Server) pinned(pin string) (*device, error) {
	if pin == "" {
		return s.devices[0], nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i, err := placement.Place(s.cfg.Placement, s.loadsLocked(), placement.Request{Pin: pin, Strict: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", abi.StatusInvalidValue, err)
	}
	return s.devices[i], nil
}

// unplace forgets a session placed on d.
func (s *Server) unplace(d *device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unplaceLocked(d)
}

// Precondition: s.mu must be locked.
func (s *Server) unplaceLocked(d *device) {
	d.sessions--
	d.promised -= s.cfg.MemoryQuota
}

// GPUStatus is one of the node's GPUs in Status.
type GPUStatus struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// GuestUUID is the UUID guests see for this GPU where the node has a
	// pair's key (identity.go); empty: guests see UUID.
	GuestUUID string `json:"guest_uuid,omitempty"`
	Name      string `json:"name"`
	// MemoryBytes is the device's memory (0: its backend does not say).
	MemoryBytes uint64 `json:"memory_bytes"`
	Sessions    int    `json:"sessions"`
	// PromisedBytes is the memory the sessions placed here may allocate
	// (their quotas); UsedBytes what they hold now.
	PromisedBytes uint64 `json:"promised_bytes"`
	UsedBytes     uint64 `json:"used_bytes"`
	// Spares is how many contexts (with --guest.workers, GPU workers that
	// have opened the GPU) are ready for new sessions, of SparesKept
	// (--cuda.spare-contexts): a session that finds none waits for one.
	Spares     int `json:"spares"`
	SparesKept int `json:"spares_kept"`
	// Unhealthy says why the GPU takes no new guests.
	Unhealthy string `json:"unhealthy,omitempty"`
}

// gpuStatus reports the GPUs, their used bytes summed from the sessions
// rows (each naming its GPU).
func (s *Server) gpuStatus(sessions []SessionStatus) []GPUStatus {
	s.mu.Lock()
	out := make([]GPUStatus, len(s.devices))
	at := map[int]int{}
	for i, d := range s.devices {
		out[i] = GPUStatus{Index: d.index, UUID: abi.UUIDString(d.uuid), Name: d.name, MemoryBytes: d.memory,
			Sessions: d.sessions, PromisedBytes: d.promised}
		if s.cfg.DeviceIdentity != nil {
			out[i].GuestUUID = abi.UUIDString(deviceUUID(s.cfg.DeviceIdentity, d.index))
		}
		at[d.index] = i
	}
	s.mu.Unlock()
	for i, d := range s.devices { // health may ask the driver: not under s.mu
		if err := gpu.DeviceHealth(d.backend); err != nil {
			out[i].Unhealthy = err.Error()
		}
		out[i].Spares, out[i].SparesKept = gpu.DeviceSpares(d.backend)
	}
	for _, ss := range sessions {
		if i, ok := at[ss.GPU]; ok {
			out[i].UsedBytes += ss.Bytes
		}
	}
	return out
}
