package abi

import "testing"

func TestApertureModeNames(t *testing.T) {
	for _, m := range ApertureModes() {
		if got, err := ParseApertureMode(m.String()); err != nil || got != m {
			t.Errorf("%s: parsed back as %v, %v", m, got, err)
		}
	}
	if _, err := ParseApertureMode("mode(9)"); err == nil {
		t.Error("an unknown mode name parsed")
	}
}
