package cuapi

import (
	"encoding/binary"
)

// The runtime's check of its driver. Before it touches a device, the CUDA
// runtime (cudart, static or shared) asks the driver's integrity export
// table (d4082055-bde6-704b-8d34-ba123c66e1f2, slot 1) three times, with
// its version plus 0, 1 and 2 and the current Unix time, for a 16-byte
// answer, and computes the same answer itself: a driver that answers wrong
// gets cudaErrorSoftwareValidityNotEstablished (103) on every call.
//
// The answers, as ZLUDA documents them (dark_api crate, integrity_check):
// for version%10 == 0 and 1, two constants; otherwise HMAC-MD2 (RFC 1319,
// RFC 2104 with MD2's 16-byte block) under a fixed 16-byte key, over
//
//	driver version, runtime version, process id, low 32 bits of pthread_self   (u32 each)
//	address of the runtime-interface table, of the integrity table, of slot 1  (8 bytes each)
//	the Unix time the runtime passed                                           (u64)
//
// then, for every device, its UUID (16 bytes) and PCI domain, bus and
// device numbers (i32 each); all little-endian, as the runtime lays them
// out in memory.

// IntegrityInput is what the runtime's hash covers besides the devices.
type IntegrityInput struct {
	DriverVersion  uint32
	RuntimeVersion uint32 // the version the runtime passed: its own, plus 0, 1 or 2
	Process        uint32
	Thread         uint32 // low 32 bits of pthread_self()
	RuntimeTable   uint64 // address of the runtime-interface export table
	IntegrityTable uint64 // address of the integrity export table
	CheckFunc      uint64 // address of the integrity table's slot 1
	UnixSeconds    uint64
}

// DeviceIdentity is one device's part of the hash.
type DeviceIdentity struct {
	UUID                 [16]byte
	PCIDomain, Bus, Slot int32
}

// integrityKey is the HMAC key the runtime and driver share.
var integrityKey = [16]byte{0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F}

// IntegrityAnswer is the 16 bytes the integrity slot writes for in.
func IntegrityAnswer(in IntegrityInput, devices []DeviceIdentity) [16]byte {
	switch in.RuntimeVersion % 10 {
	case 0:
		return answerOf(0x3341181C03CB675C, 0x8ED383AA1F4CD1E8)
	case 1:
		return answerOf(0x1841181C03CB675C, 0x8ED383AA1F4CD1E8)
	}
	msg := make([]byte, 0, 48+28*len(devices))
	le := binary.LittleEndian
	msg = le.AppendUint32(msg, in.DriverVersion)
	msg = le.AppendUint32(msg, in.RuntimeVersion)
	msg = le.AppendUint32(msg, in.Process)
	msg = le.AppendUint32(msg, in.Thread)
	msg = le.AppendUint64(msg, in.RuntimeTable)
	msg = le.AppendUint64(msg, in.IntegrityTable)
	msg = le.AppendUint64(msg, in.CheckFunc)
	msg = le.AppendUint64(msg, in.UnixSeconds)
	for _, d := range devices {
		msg = append(msg, d.UUID[:]...)
		msg = le.AppendUint32(msg, uint32(d.PCIDomain))
		msg = le.AppendUint32(msg, uint32(d.Bus))
		msg = le.AppendUint32(msg, uint32(d.Slot))
	}
	return hmacMD2(integrityKey, msg)
}

func answerOf(lo, hi uint64) [16]byte {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], lo)
	binary.LittleEndian.PutUint64(b[8:], hi)
	return b
}

// hmacMD2 is HMAC (RFC 2104) over MD2 with a key of exactly one block.
func hmacMD2(key [16]byte, msg []byte) [16]byte {
	var pad [16]byte
	inner := newMD2()
	for i := range pad {
		pad[i] = key[i] ^ 0x36
	}
	inner.write(pad[:])
	inner.write(msg)
	sum := inner.sum()
	outer := newMD2()
	for i := range pad {
		pad[i] = key[i] ^ 0x5c
	}
	outer.write(pad[:])
	outer.write(sum[:])
	return outer.sum()
}

// md2 is the MD2 message digest (RFC 1319), byte at a time: it hashes
// only a few hundred bytes, once per process.
type md2 struct {
	state    [48]byte
	checksum [16]byte
	block    [16]byte
	n        int // bytes in block
}

func newMD2() *md2 { return &md2{} }

func (m *md2) write(p []byte) {
	for _, b := range p {
		m.block[m.n] = b
		if m.n++; m.n == 16 {
			m.compress()
			m.n = 0
		}
	}
}

// compress mixes a full block into the state and the checksum (RFC 1319
// sections 3.2 and 3.4).
func (m *md2) compress() {
	last := m.checksum[15]
	for i, b := range m.block {
		m.checksum[i] ^= md2Pi[b^last]
		last = m.checksum[i]
	}
	for i, b := range m.block {
		m.state[16+i] = b
		m.state[32+i] = m.state[i] ^ b
	}
	var t byte
	for round := 0; round < 18; round++ {
		for i := range m.state {
			m.state[i] ^= md2Pi[t]
			t = m.state[i]
		}
		t += byte(round)
	}
}

// sum pads (RFC 1319 section 3.1), appends the checksum and returns the
// digest; m is spent.
func (m *md2) sum() [16]byte {
	pad := 16 - m.n
	m.write(bytesOf(byte(pad), pad))
	c := m.checksum
	m.write(c[:])
	var d [16]byte
	copy(d[:], m.state[:16])
	return d
}

func bytesOf(v byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = v
	}
	return b
}

// md2Pi is RFC 1319's permutation of 0..255 built from the digits of pi.
var md2Pi = [256]byte{
	41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19,
	98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202,
	30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
	190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122,
	169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33,
	128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
	255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198,
	79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241,
	69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
	27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15,
	85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38,
	44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82,
	106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
	120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57,
	242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10,
	49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
}
