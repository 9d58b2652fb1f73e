package hypervisor

import (
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// What a guest learns of the node's device: its description
// (OpDeviceInfo) and its live state (OpDeviceStatus), asked in a session
// or on a status connection.
//
// A status connection (abi.OpStatusHello) is how a process that only
// watches the device (nvidia-smi, a monitoring agent: a guest's NVML
// with no CUDA session in its process) asks, without taking a session:
// no window slot (--guest.max-sessions), no GPU context, no device
// memory, nothing in the log. Its hello is checked as a session's is (the
// node serves, its lease holds, its GPU is healthy, the guest's name is
// printable) and its guest is the tenant the transport vouches for, never
// one it names; every request is checked again (fenced, lease). It can
// ask nothing but the two questions above, so it can reach no guest's
// memory or handles: it names none, and the only guest number it is told
// is its own tenant's memory. Status connections are bounded by
// Config.MaxStatusConns (each costs a goroutine and 8 KiB of buffers).

// deviceInfo describes the backend's device, its allocation granularity
// raised to the node's allocation alignment (every allocation and
// mapping is aligned to it), its UUID the identity of GPU shown
// (identity.go). The guest keeps it, so every node of a pair must
// describe the same kind of device.
func (s *Server) deviceInfo(dev *device, shown int) (abi.Body, error) {
	d, ok := dev.backend.(gpu.DeviceDescriber)
	if !ok {
		return nil, fail(abi.StatusNotSupported, "the %s backend cannot describe its device", dev.backend.Name())
	}
	info, err := d.DeviceInfo()
	if err != nil {
		return nil, err
	}
	info.Granularity = max(info.Granularity, s.cfg.AllocAlign)
	if s.cfg.DeviceIdentity != nil {
		info.UUID = deviceUUID(s.cfg.DeviceIdentity, shown)
	}
	return &info, nil
}

// deviceStatus is the device's live state as the backend reads it
// (gpu.DeviceStatusReporter; nothing from a backend that cannot) and the
// memory the asking guest holds: held (its tenant's sessions together),
// the asking session's bytes (nil: no session asks), and its tenant's
// quota where one applies (hasQuota) and is below the device's memory.
func (s *Server) deviceStatus(dev *device, held uint64, session *uint64, quota uint64, hasQuota bool) *abi.DeviceStatusReply {
	r := &abi.DeviceStatusReply{}
	if rep, ok := dev.backend.(gpu.DeviceStatusReporter); ok {
		rep.DeviceStatus(r)
	}
	if session != nil {
		r.Set(abi.FieldSessionMemory, *session)
	}
	r.Set(abi.FieldGuestMemoryUsed, held)
	if d, ok := dev.backend.(gpu.DeviceDescriber); ok && hasQuota {
		if info, err := d.DeviceInfo(); err == nil && quota < info.TotalMem {
			r.Set(abi.FieldGuestMemoryQuota, quota)
		}
	}
	return r
}

// admitLocked refuses a hello (a session's or a status connection's)
// the node must not answer now: fenced, its lease run out, or its GPU
// unhealthy.
// Precondition: s.mu must be locked.
func (s *Server) admitLocked() error {
	if s.fenced {
		return s.deposedLocked()
	}
	if s.leaseExpired() {
		return errLeaseExpired()
	}
	if h, ok := s.backend.(gpu.HealthReporter); ok {
		if err := h.Healthy(); err != nil {
			return err
		}
	}
	return nil
}

// statusConn is one status connection (guestconn.Status): its tenant,
// and the server it asks.
type statusConn struct {
	srv    *Server
	tenant string
	dev    *device // the GPU it asks about (StatusHello.GPU; the node's first)
}

// statusHello opens a status connection for a guest of tenant p.Tenant.
func (s *Server) statusHello(payload []byte, p guestconn.Peer) (*statusConn, abi.Body, error) {
	var req abi.StatusHello
	if err := abi.Unmarshal(payload, &req); err != nil {
		return nil, nil, fail(abi.StatusInvalidValue, "decoding status_hello: %w", err)
	}
	if err := checkGuestName(req.GuestName); err != nil {
		return nil, nil, err
	}
	dev, err := s.pinned(req.GPU)
	if err != nil {
		return nil, nil, fail(abi.StatusInvalidValue, "status_hello: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admitLocked(); err != nil {
		return nil, nil, err
	}
	if s.closed || s.statusConns >= s.cfg.MaxStatusConns {
		return nil, nil, refuse(guesterr.StatusConns, abi.StatusUnavailable,
			"the node already serves %d status connections (its --guest.max-status-connections)", s.cfg.MaxStatusConns)
	}
	s.statusConns++
	p.Log.Debug("status connection", "guest", req.GuestName)
	return &statusConn{srv: s, tenant: p.Tenant, dev: dev}, &abi.StatusHelloReply{Term: s.term}, nil
}

// Serve implements guestconn.Status: the two questions about the device,
// each checked as a session's request is.
func (c *statusConn) Serve(op abi.Opcode, payload []byte) (abi.Body, error) {
	s := c.srv
	if op != abi.OpDeviceInfo && op != abi.OpDeviceStatus {
		return nil, fail(abi.StatusInvalidValue, "%s is not served on a status connection (device_info and device_status are)", op)
	}
	if _, err := abi.DecodeRequest(op, payload); err != nil {
		return nil, fail(abi.StatusInvalidValue, "%w", err)
	}
	if s.fencedFlag.Load() {
		return nil, fail(abi.StatusDeposed, "deposed: this node was fenced; ask the node that took over")
	}
	if s.leaseExpired() {
		return nil, errLeaseExpired()
	}
	dev := c.dev
	if op == abi.OpDeviceInfo {
		return s.deviceInfo(dev, dev.index)
	}
	if c.tenant == "" { // a guest of no tenant (a test's pipe): it holds nothing here
		return s.deviceStatus(dev, 0, nil, 0, false), nil
	}
	s.mu.Lock()
	held := s.tenants.Lookup(c.tenant).Held() // never admits one: a status connection holds nothing
	quota := s.tenants.QuotaOf(c.tenant).Memory
	s.mu.Unlock()
	return s.deviceStatus(dev, held, nil, quota, true), nil
}

// statusConnections is how many status connections are open.
func (s *Server) statusConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusConns
}

// Close implements guestconn.Status.
func (c *statusConn) Close() {
	c.srv.mu.Lock()
	c.srv.statusConns--
	c.srv.mu.Unlock()
}

func (n guestNode) StatusHello(payload []byte, p guestconn.Peer) (guestconn.Status, abi.Body, error) {
	c, reply, err := n.s.statusHello(payload, p)
	if c == nil {
		return nil, reply, err
	}
	return c, reply, err
}
