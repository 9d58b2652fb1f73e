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
	r.Set(FieldRemappedCorrectable, 2) // past the first mask word
	r.Set(FieldTemperatureMemoryMax, 95)
	r.SetText(TextInforomPower, "2.0") // past the first mask byte
	return &r
}

// TestDeviceStatusRoundTrip: the fields and texts set come back, those
// left out stay out, unknown ones are dropped and empty texts refused.
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
	// A newer node's fields and texts (past this version's) are read and
	// dropped; the ones known still come through.
	newer := appendU64(nil, 1|1<<FieldTemperature)
	newer = appendU64(newer, 1<<62)                                 // field 63+62: unknown
	newer = appendU64(appendU64(newer, 41), 7)                      // their values
	newer = appendString(append(newer, 1<<TextSerial|1, 1<<7), "s") // text 14: unknown
	newer = appendString(newer, "x")
	if err := Unmarshal(newer, &got); err != nil {
		t.Fatalf("a newer node's reply: %v", err)
	}
	if v, ok := got.Get(FieldTemperature); !ok || v != 41 || got.has[1] != 0 {
		t.Errorf("a newer node's reply: temperature %d %v, fields %x", v, ok, got.has)
	}
	if s, ok := got.Text(TextSerial); !ok || s != "s" || got.hasTxt != 1<<TextSerial {
		t.Errorf("a newer node's reply: serial %q %v, texts %b", s, ok, got.hasTxt)
	}
	endless := appendU64(appendU64(appendU64(appendU64(nil, 1), 1), 1), 1)
	if err := Unmarshal(append(endless, 0), &got); !errors.Is(err, ErrBadArgument) {
		t.Errorf("%d field mask words: %v", maxMaskWords, err)
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
// an accepted reply must re-encode to a reply that decodes to the same
// values (exactly its input, unless the input held fields or texts this
// version drops or mask words it need not have sent).
func FuzzDeviceStatusReply(f *testing.F) {
	f.Add(sampleDeviceStatus().Append(nil))
	f.Add((&DeviceStatusReply{}).Append(nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(append(appendU64(appendU64(nil, 1), 1<<62), 0, 0, 0, 0, 0, 0, 0, 7, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r DeviceStatusReply
		if err := Unmarshal(data, &r); err != nil {
			return
		}
		enc := r.Append(nil)
		var again DeviceStatusReply
		if err := Unmarshal(enc, &again); err != nil || again != r {
			t.Fatalf("re-encoded %x (input %x) decodes to %+v, %v; want %+v", enc, data, again, err, r)
		}
		if len(enc) > len(data) {
			t.Fatalf("re-encoded %x is longer than the input %x", enc, data)
		}
	})
}
