package abi

import (
	"fmt"
	"math/bits"
)

// The live state of the node's device (OpDeviceStatus): what a guest's
// NVML reports beside the static description of OpDeviceInfo. A node
// answers each value it truly has and leaves the others out; the guest
// answers a value left out as not supported, never with a number of its
// own.

// UUIDString is a device UUID (DeviceInfoReply.UUID) as NVIDIA's tools
// write it: "GPU-" and 8-4-4-4-12 lower-case hex digits.
func UUIDString(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// DeviceStatus asks for the live state of the node's device.
type DeviceStatus struct{}

// StatusHello opens a status connection: a connection that asks about
// the device (OpDeviceInfo, OpDeviceStatus) and nothing else, for a
// process that only watches it (a guest's NVML in nvidia-smi). The node
// vouches for its guest as for a session's (the transport's identity),
// but opens no session: no slot, no GPU context, no device memory, nothing
// logged or replicated. GPU names the GPU it asks about, as Hello.GPU
// pins a session (empty: the node's first); sent only when set, so an
// older node refuses a pinned status hello rather than answer for
// another GPU.
type StatusHello struct{ GuestName, GPU string }

// StatusHelloReply is the serving node's term.
type StatusHelloReply struct{ Term uint64 }

func (m *StatusHello) Append(b []byte) []byte {
	b = appendString(b, m.GuestName)
	if m.GPU != "" {
		b = appendString(b, m.GPU)
	}
	return b
}
func (m *StatusHello) decode(d *Decoder) {
	m.GuestName = d.String(MaxNameLen)
	if d.err != nil || len(d.b) == 0 {
		return
	}
	m.GPU = d.gpuPin()
}

// gpuPin decodes a GPU pin (Hello.GPU, StatusHello.GPU): present means
// not empty.
func (d *Decoder) gpuPin() string {
	pin := d.String(MaxGPUPinLen)
	if pin == "" {
		d.fail(fmt.Errorf("%w: an empty GPU pin", ErrBadArgument))
	}
	return pin
}
func (m *StatusHelloReply) Append(b []byte) []byte { return appendU64(b, m.Term) }
func (m *StatusHelloReply) decode(d *Decoder)      { m.Term = d.U64() }

// DeviceField names one numeric value of a DeviceStatusReply. Zero is
// invalid; new fields are appended, never renumbered (at most
// maxMaskWords*63).
type DeviceField uint8

// Device fields. Memory is in bytes, temperatures in °C, power in
// milliwatts, clocks in MHz, utilization in percent, PCIe throughput in
// KB/s, error and page counts as counts; the enums and bit sets are
// NVML's values (nvml.h).
const (
	FieldInvalid DeviceField = iota
	// FieldGuestMemoryUsed is the device memory the asking guest (its
	// tenant: every session of it on the node) holds; FieldSessionMemory
	// the asking session's share of it; FieldGuestMemoryQuota the most the
	// guest may hold, sent only when it is below the device's memory.
	FieldGuestMemoryUsed
	FieldSessionMemory
	FieldGuestMemoryQuota
	FieldTemperature // NVML_TEMPERATURE_GPU
	FieldTemperatureShutdown
	FieldTemperatureSlowdown
	FieldTemperatureGPUMax
	FieldPowerUsage
	FieldPowerLimit // enforced
	FieldPowerDefaultLimit
	FieldUtilGPU
	FieldUtilMemory
	FieldClockGraphics // current clocks, then the maxima
	FieldClockSM
	FieldClockMemory
	FieldClockVideo
	FieldMaxClockGraphics
	FieldMaxClockSM
	FieldMaxClockMemory
	FieldMaxClockVideo
	FieldPState // nvmlPstates_t
	FieldECCCurrent
	FieldECCPending
	FieldComputeMode // nvmlComputeMode_t
	FieldPersistenceMode
	FieldPCIDeviceID // device id << 16 | vendor id
	FieldPCISubsystemID
	FieldMinorNumber
	FieldBrand        // nvmlBrandType_t
	FieldArchitecture // nvmlDeviceArchitecture_t
	FieldBAR1Total
	FieldBAR1Used
	FieldFanSpeed // percent
	FieldPCIeLinkGen
	FieldPCIeLinkWidth
	FieldPCIeMaxLinkGen
	FieldPCIeMaxLinkWidth
	FieldPowerManagementLimit
	// FieldECCTotal, FieldECCDRAM and FieldECCSRAM each begin a group of
	// ECCCounters memory error counts (ECCField): the device's totals
	// (nvmlDeviceGetTotalEccErrors), and those of its DRAM and its SRAM
	// (nvmlDeviceGetMemoryErrorCounter).
	FieldECCTotal
	_
	_
	_
	FieldECCDRAM
	_
	_
	_
	FieldECCSRAM
	_
	_
	_
	// Retired pages (nvmlDeviceGetRetiredPages): how many, by cause; and
	// whether a retirement waits for a reboot (nvmlEnableState_t).
	FieldRetiredSingleBit
	FieldRetiredDoubleBit
	FieldRetiredPending
	// Remapped rows (nvmlDeviceGetRemappedRows): correctable,
	// uncorrectable, a remapping pending, a remapping failed.
	FieldRemappedCorrectable
	FieldRemappedUncorrectable
	FieldRemapPending
	FieldRemapFailed
	FieldInforomChecksum // nvmlDeviceGetInforomConfigurationChecksum
	// Encoder and decoder utilization, each with its sampling period (µs).
	FieldEncoderUtil
	FieldEncoderSamplingUS
	FieldDecoderUtil
	FieldDecoderSamplingUS
	// FieldAppClock, FieldDefaultAppClock and FieldBoostClock each begin a
	// group of ClockTypes clocks, by nvmlClockType_t (ClockField): the
	// applications clocks, their defaults, the customer boost maxima.
	FieldAppClock
	_
	_
	_
	FieldDefaultAppClock
	_
	_
	_
	FieldBoostClock
	_
	_
	_
	// Clocks event reasons (nvmlClocksEventReasons bits): active now, and
	// those the device reports.
	FieldClocksEventReasons
	FieldSupportedClocksEventReasons
	FieldPowerMinLimit // nvmlDeviceGetPowerManagementLimitConstraints
	FieldPowerMaxLimit
	FieldPCIeTxThroughput // nvmlDeviceGetPcieThroughput
	FieldPCIeRxThroughput
	FieldPCIeReplays          // nvmlDeviceGetPcieReplayCounter
	FieldTemperatureMemoryMax // NVML_TEMPERATURE_THRESHOLD_MEM_MAX
	fieldLimit
)

// ECCCounters is how many counts a memory error group holds: corrected
// and uncorrected (nvmlMemoryErrorType_t), each volatile and aggregate
// (nvmlEccCounterType_t).
const ECCCounters = 4

// ECCField is the field of group (FieldECCTotal, FieldECCDRAM,
// FieldECCSRAM) that counts errors of errorType (nvmlMemoryErrorType_t)
// by counterType (nvmlEccCounterType_t); ok is false for a type past
// NVML's.
func ECCField(group DeviceField, errorType, counterType uint64) (f DeviceField, ok bool) {
	if errorType > 1 || counterType > 1 {
		return FieldInvalid, false
	}
	return group + DeviceField(errorType+2*counterType), true
}

// ClockTypes is how many clocks a clock group holds (NVML_CLOCK_COUNT).
const ClockTypes = 4

// ClockField is the field of group (FieldAppClock, FieldDefaultAppClock,
// FieldBoostClock) for clock type typ (nvmlClockType_t); ok is false for
// a type past NVML's.
func ClockField(group DeviceField, typ uint64) (f DeviceField, ok bool) {
	if typ >= ClockTypes {
		return FieldInvalid, false
	}
	return group + DeviceField(typ), true
}

// DeviceText names one text value of a DeviceStatusReply. Zero is
// invalid; new texts are appended (at most maxMaskWords*7).
type DeviceText uint8

// Device texts.
const (
	TextInvalid       DeviceText = iota
	TextSerial                   // the board's serial number
	TextBoardPart                // the board's part number
	TextVBIOS                    // the VBIOS version
	TextDriverVersion            // the node's GPU driver version ("580.95.05")
	TextInforomImage             // the inforom image's version
	TextInforomOEM               // the version of each inforom object: OEM, ECC, power (nvmlInforomObject_t order)
	TextInforomECC
	TextInforomPower
	textLimit
)

// MaxDeviceText bounds each text of a DeviceStatusReply.
const MaxDeviceText = 96

// DeviceStatusReply is the live state of the node's device: the fields
// and texts the node has.
//
// Encoded as the masks of the fields present, their values in field
// order, the masks of the texts present and the texts. A field mask is
// one or more u64 words: bit 0 of a word says another word follows, and
// bits 1 to 63 of word k stand for fields 63k+1 to 63k+63 (so a reply
// with fields below 64 only is one word, as the first version wrote it).
// Text masks are bytes, the same way: bit 0 says another byte follows,
// bits 1 to 7 of byte k stand for texts 7k+1 to 7k+7. At most
// maxMaskWords words or bytes; a field or text this version does not
// know is read and dropped (a newer node may send more), never refused.
type DeviceStatusReply struct {
	has    [(fieldLimit + 63) / 64]uint64 // bit f%64 of word f/64: field f is present
	values [fieldLimit]uint64
	hasTxt uint16 // bit t: text t is present
	texts  [textLimit]string
}

// maxMaskWords bounds a reply's field and text masks.
const maxMaskWords = 4

// Set records field f's value; an unknown field is ignored.
func (r *DeviceStatusReply) Set(f DeviceField, v uint64) {
	if f > FieldInvalid && f < fieldLimit {
		r.has[f/64] |= 1 << (f % 64)
		r.values[f] = v
	}
}

// Get is field f's value, and whether the node sent it.
func (r *DeviceStatusReply) Get(f DeviceField) (uint64, bool) {
	if f <= FieldInvalid || f >= fieldLimit || r.has[f/64]&(1<<(f%64)) == 0 {
		return 0, false
	}
	return r.values[f], true
}

// Clear leaves field f out.
func (r *DeviceStatusReply) Clear(f DeviceField) {
	if f > FieldInvalid && f < fieldLimit {
		r.has[f/64] &^= 1 << (f % 64)
		r.values[f] = 0
	}
}

// ClearText leaves text t out.
func (r *DeviceStatusReply) ClearText(t DeviceText) {
	if t > TextInvalid && t < textLimit {
		r.hasTxt &^= 1 << t
		r.texts[t] = ""
	}
}

// SetText records text t (cut to MaxDeviceText bytes); an unknown text or
// an empty one is ignored.
func (r *DeviceStatusReply) SetText(t DeviceText, s string) {
	if t > TextInvalid && t < textLimit && s != "" {
		r.hasTxt |= 1 << t
		r.texts[t] = s[:min(len(s), MaxDeviceText)]
	}
}

// Text is text t, and whether the node sent it.
func (r *DeviceStatusReply) Text(t DeviceText) (string, bool) {
	if t <= TextInvalid || t >= textLimit || r.hasTxt&(1<<t) == 0 {
		return "", false
	}
	return r.texts[t], true
}

func (m *DeviceStatus) Append(b []byte) []byte { return b }
func (m *DeviceStatus) decode(d *Decoder)      {}

func (m *DeviceStatusReply) Append(b []byte) []byte {
	var words [(fieldLimit - 1 + 62) / 63]uint64
	for f := FieldInvalid + 1; f < fieldLimit; f++ {
		if _, ok := m.Get(f); ok {
			words[(f-1)/63] |= 1 << ((f-1)%63 + 1)
		}
	}
	for i := range words {
		w := words[i]
		if more(words[i+1:]) {
			w |= 1
		}
		b = appendU64(b, w)
		if w&1 == 0 {
			break
		}
	}
	for f := FieldInvalid + 1; f < fieldLimit; f++ {
		if v, ok := m.Get(f); ok {
			b = appendU64(b, v)
		}
	}
	var bytes [(textLimit - 1 + 6) / 7]uint8
	for t := TextInvalid + 1; t < textLimit; t++ {
		if _, ok := m.Text(t); ok {
			bytes[(t-1)/7] |= 1 << ((t-1)%7 + 1)
		}
	}
	for i := range bytes {
		w := bytes[i]
		if more(bytes[i+1:]) {
			w |= 1
		}
		b = append(b, w)
		if w&1 == 0 {
			break
		}
	}
	for t := TextInvalid + 1; t < textLimit; t++ {
		if s, ok := m.Text(t); ok {
			b = appendString(b, s)
		}
	}
	return b
}

// more reports whether any of the mask words ws is not zero.
func more[W uint8 | uint64](ws []W) bool {
	for _, w := range ws {
		if w != 0 {
			return true
		}
	}
	return false
}

func (m *DeviceStatusReply) decode(d *Decoder) {
	*m = DeviceStatusReply{}
	var fields []DeviceField // present, in order
	for k := 0; ; k++ {
		if k == maxMaskWords {
			d.fail(fmt.Errorf("%w: device status fields past %d mask words", ErrBadArgument, maxMaskWords))
			return
		}
		w := d.U64()
		for rest := w &^ 1; rest != 0 && d.err == nil; rest &= rest - 1 {
			fields = append(fields, DeviceField(63*k+bits.TrailingZeros64(rest)))
		}
		if d.err != nil || w&1 == 0 {
			break
		}
	}
	for _, f := range fields {
		if v := d.U64(); d.err == nil {
			m.Set(f, v) // a field this version does not know is dropped
		}
	}
	var texts []DeviceText
	for k := 0; d.err == nil; k++ {
		if k == maxMaskWords {
			d.fail(fmt.Errorf("%w: device status texts past %d mask bytes", ErrBadArgument, maxMaskWords))
			return
		}
		w := d.U8()
		for rest := w &^ 1; rest != 0 && d.err == nil; rest &= rest - 1 {
			texts = append(texts, DeviceText(7*k+bits.TrailingZeros8(rest)))
		}
		if w&1 == 0 {
			break
		}
	}
	for _, t := range texts {
		s := d.String(MaxDeviceText)
		if d.err == nil && s == "" {
			d.fail(fmt.Errorf("%w: an empty device text is sent as none", ErrBadArgument))
			return
		}
		m.SetText(t, s) // a text this version does not know is dropped
	}
}
