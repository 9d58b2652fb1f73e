package hypervisor

import (
	"crypto/sha256"
	"encoding/binary"
)

// The identity of the devices guests see. A guest's device is the
// service, not the card: after a failover its session runs on the
// standby's GPU, whose own UUID differs, yet the guest (its CUDA device
// UUID, its NVML, nvidia-smi, a framework that keys its state by UUID) must
// see the same device. So a pair's nodes derive each GPU's UUID from a
// secret they share (Config.DeviceIdentity, the replication key) and the
// GPU's index, and a session keeps the index of the GPU it was first
// placed on (Session.shown, carried in its session-open record) on every
// node that serves it. What does change across a failover, as it would on
// another card: the PCI bus id, temperature, clocks, power and
// utilisation. A node with no key (unreplicated) shows the GPUs' own UUIDs.

// deviceUUID is the UUID guests see for GPU index of a pair whose secret
// is seed: the first 16 bytes of a SHA-256 over a label, the seed and the
// index, marked as an RFC 9562 version-8 (custom) UUID. It reveals
// nothing of the seed.
func deviceUUID(seed []byte, index int) [16]byte {
	h := sha256.New()
	h.Write([]byte("vgpuha device identity\x00"))
	h.Write(seed)
	h.Write(binary.LittleEndian.AppendUint32(nil, uint32(index)))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // the RFC 9562 variant
	return u
}
