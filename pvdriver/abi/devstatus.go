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

// DeviceField names one numeric value of a DeviceStatusReply. Zero is
// invalid; new fields are appended, never renumbered (at most 63).
type DeviceField uint8

// Device fields. Memory is in bytes, temperatures in °C, power in
// milliwatts, clocks in MHz, utilization in percent; the enums are NVML's
// values (nvml.h).
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
	fieldLimit
)

// DeviceText names one text value of a DeviceStatusReply (at most 7).
type DeviceText uint8

// Device texts.
const (
	TextInvalid       DeviceText = iota
	TextSerial                   // the board's serial number
	TextBoardPart                // the board's part number
	TextVBIOS                    // the VBIOS version
	TextDriverVersion            // the node's GPU driver version ("580.95.05")
	textLimit
)

// MaxDeviceText bounds each text of a DeviceStatusReply.
const MaxDeviceText = 96

// DeviceStatusReply is the live state of the node's device: the fields
// and texts the node has. Encoded as a mask of the fields present, their
// values in field order, a mask of the texts present and the texts.
type DeviceStatusReply struct {
	has    uint64
	values [fieldLimit]uint64
	hasTxt uint8
	texts  [textLimit]string
}

// Set records field f's value; an unknown field is ignored.
func (r *DeviceStatusReply) Set(f DeviceField, v uint64) {
	if f > FieldInvalid && f < fieldLimit {
		r.has |= 1 << f
		r.values[f] = v
	}
}

// Get is field f's value, and whether the node sent it.
func (r *DeviceStatusReply) Get(f DeviceField) (uint64, bool) {
	if f <= FieldInvalid || f >= fieldLimit || r.has&(1<<f) == 0 {
		return 0, false
	}
	return r.values[f], true
}

// Clear leaves field f out.
func (r *DeviceStatusReply) Clear(f DeviceField) {
	if f > FieldInvalid && f < fieldLimit {
		r.has &^= 1 << f
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
	b = appendU64(b, m.has)
	for f := FieldInvalid + 1; f < fieldLimit; f++ {
		if m.has&(1<<f) != 0 {
			b = appendU64(b, m.values[f])
		}
	}
	b = append(b, m.hasTxt)
	for t := TextInvalid + 1; t < textLimit; t++ {
		if m.hasTxt&(1<<t) != 0 {
			b = appendString(b, m.texts[t])
		}
	}
	return b
}

// knownFields and knownTexts are the masks of the fields and texts this
// version defines.
const (
	knownFields = (uint64(1)<<fieldLimit - 1) &^ 1
	knownTexts  = uint8((1<<textLimit - 1) &^ 1)
)

func (m *DeviceStatusReply) decode(d *Decoder) {
	*m = DeviceStatusReply{}
	has := d.U64()
	if d.err == nil && has&^knownFields != 0 {
		d.fail(fmt.Errorf("%w: device status fields %#x unknown", ErrBadArgument, has&^knownFields))
		return
	}
	for rest := has; rest != 0 && d.err == nil; rest &= rest - 1 {
		m.Set(DeviceField(bits.TrailingZeros64(rest)), d.U64())
	}
	txt := d.U8()
	if d.err == nil && txt&^knownTexts != 0 {
		d.fail(fmt.Errorf("%w: device status texts %#x unknown", ErrBadArgument, txt&^knownTexts))
		return
	}
	for rest := txt; rest != 0 && d.err == nil; rest &= rest - 1 {
		t := DeviceText(bits.TrailingZeros8(rest))
		s := d.String(MaxDeviceText)
		if d.err == nil && s == "" {
			d.fail(fmt.Errorf("%w: an empty device text is sent as none", ErrBadArgument))
			return
		}
		m.SetText(t, s)
	}
}
