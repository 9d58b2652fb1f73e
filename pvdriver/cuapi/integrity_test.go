package cuapi

import (
	"encoding/hex"
	"testing"
)

// RFC 1319's test suite (appendix A.5).
func TestMD2(t *testing.T) {
	for in, want := range map[string]string{
		"":                           "8350e5a3e24c153df2275c9f80692773",
		"a":                          "32ec01ec4a6dac72c0ab96fb34c0b5d1",
		"abc":                        "da853b0d3f88d99b30283a69e6ded6bb",
		"message digest":             "ab4f496bfb2a530b219ff33031fe06b0",
		"abcdefghijklmnopqrstuvwxyz": "4e8ddff3650292ab5a4108c3aa47940b",
		"12345678901234567890123456789012345678901234567890123456789012345678901234567890": "d5976f79d83d3a0dc9806c3c66f3efd8",
	} {
		m := newMD2()
		m.write([]byte(in))
		if got := m.sum(); hex.EncodeToString(got[:]) != want {
			t.Errorf("MD2(%q) = %x, want %s", in, got, want)
		}
	}
}

// The inner hash's state after the padded key, as traced from a real
// driver answering a CUDA 12.8 runtime (ZLUDA's dark_api records it).
func TestIntegrityInnerKeyBlock(t *testing.T) {
	m := newMD2()
	var pad [16]byte
	for i := range pad {
		pad[i] = integrityKey[i] ^ 0x36
	}
	m.write(pad[:])
	if got, want := hex.EncodeToString(m.state[:16]), "8b219a49e86d1aeef237f9b54a8c3c75"; got != want {
		t.Fatalf("state after the key block: %s, want %s", got, want)
	}
}

func TestIntegrityAnswerConstantsAndInputs(t *testing.T) {
	in := IntegrityInput{DriverVersion: 13000, RuntimeVersion: 13000, Process: 7, Thread: 9,
		RuntimeTable: 0x1000, IntegrityTable: 0x2000, CheckFunc: 0x3000, UnixSeconds: 1_700_000_000}
	dev := []DeviceIdentity{{UUID: [16]byte{1, 2, 3}, Bus: 2}}
	if got := IntegrityAnswer(in, dev); got != answerOf(0x3341181C03CB675C, 0x8ED383AA1F4CD1E8) {
		t.Fatalf("version%%10 == 0: %x", got)
	}
	in.RuntimeVersion = 13002
	base := IntegrityAnswer(in, dev)
	// Every input changes the answer.
	for name, change := range map[string]func(*IntegrityInput, []DeviceIdentity){
		"process": func(i *IntegrityInput, _ []DeviceIdentity) { i.Process++ },
		"thread":  func(i *IntegrityInput, _ []DeviceIdentity) { i.Thread++ },
		"table":   func(i *IntegrityInput, _ []DeviceIdentity) { i.RuntimeTable += 8 },
		"time":    func(i *IntegrityInput, _ []DeviceIdentity) { i.UnixSeconds++ },
		"uuid":    func(_ *IntegrityInput, d []DeviceIdentity) { d[0].UUID[15] = 1 },
		"bus":     func(_ *IntegrityInput, d []DeviceIdentity) { d[0].Bus = 3 },
	} {
		i, d := in, append([]DeviceIdentity(nil), dev...)
		change(&i, d)
		if IntegrityAnswer(i, d) == base {
			t.Errorf("changing the %s leaves the answer as it was", name)
		}
	}
}
