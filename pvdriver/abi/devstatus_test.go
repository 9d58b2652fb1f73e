package abi

import (
	"bytes"
	"errors"
	"testing"
)

// sampleDeviceStatus has some fields and texts set, some left out.
func sampleDeviceStatus() *DeviceStatusReply {
	var r DeviceStatusReply
	r.Set(FieldGuestMemoryUsed, 3<<30)
	r.Set(FieldTemperature, 41)
	r.Set(FieldPCIeMaxLinkWidth, 16)
	r.SetText(TextSerial, "1654922012345")
	r.SetText(TextDriverVersion, "580.95.05")
	return &r
}

// TestDeviceStatusRoundTrip: the fields and texts set come back, those
// left out stay out, and unknown or empty ones are refused.
func TestDeviceStatusRoundTrip(t *testing.T) {
	want := sampleDeviceStatus()
	var got DeviceStatusReply
	if err := Unmarshal(want.Append(nil), &got); err != nil {
		t.Fatal(err)
	}
	if got != *want {
		t.Fatalf("round trip: got %+v, want %+v", got, *want)
	}
	if v, ok := got.Get(FieldTemperature); !ok || v != 41 {
		t.Errorf("temperature %d, %v", v, ok)
	}
	if _, ok := got.Get(FieldPowerUsage); ok {
		t.Error("power usage was never set but reads as sent")
	}
	if s, ok := got.Text(TextSerial); !ok || s != "1654922012345" {
		t.Errorf("serial %q, %v", s, ok)
	}
	if _, ok := got.Text(TextVBIOS); ok {
		t.Error("VBIOS was never set but reads as sent")
	}
	unknown := appendU64(nil, 1<<fieldLimit)
	if err := Unmarshal(append(unknown, 0), &got); !errors.Is(err, ErrBadArgument) {
		t.Errorf("an unknown field: %v", err)
	}
	empty := append(appendU64(nil, 0), 1<<TextSerial)
	if err := Unmarshal(appendString(empty, ""), &got); !errors.Is(err, ErrBadArgument) {
		t.Errorf("an empty text: %v", err)
	}
	var long DeviceStatusReply
	long.SetText(TextBoardPart, string(bytes.Repeat([]byte("x"), 2*MaxDeviceText)))
	if s, _ := long.Text(TextBoardPart); len(s) != MaxDeviceText {
		t.Errorf("a long text kept %d bytes, want %d", len(s), MaxDeviceText)
	}
}

// FuzzDeviceStatusReply feeds arbitrary bytes to the device status
// decoder (a guest decodes what a node sends): it must never panic, and
// an accepted reply must re-encode to exactly its input.
func FuzzDeviceStatusReply(f *testing.F) {
	f.Add(sampleDeviceStatus().Append(nil))
	f.Add((&DeviceStatusReply{}).Append(nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r DeviceStatusReply
		if err := Unmarshal(data, &r); err != nil {
			return
		}
		if got := r.Append(nil); !bytes.Equal(got, data) {
			t.Fatalf("re-encoded %x, input %x", got, data)
		}
	})
}
