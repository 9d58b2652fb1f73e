package verify

import "testing"

func TestCompare(t *testing.T) {
	p := []ObjectSum{{Session: 1, Kind: ObjMemory, ID: 10, Size: 4, Sum: 1}, {Session: 1, Kind: ObjModule, ID: 1, Sum: 2}}
	if rep := Compare(p, p); !rep.Match || rep.Objects != 2 || rep.Bytes != 4 {
		t.Fatalf("identical: %+v", rep)
	}
	s := []ObjectSum{{Session: 1, Kind: ObjMemory, ID: 10, Size: 4, Sum: 9}, {Session: 2, Kind: ObjStream, ID: 1}}
	rep := Compare(p, s)
	if rep.Match || len(rep.Mismatches) != 3 || !rep.Mismatches[0].Repairable {
		t.Fatalf("differing: %+v", rep)
	}
}

// TestCompareApertures: ObjAperture entries (verify --apertures) pair up by
// session and address, one side differing fails the match, and an
// aperture the standby did not compare shows as missing.
func TestCompareApertures(t *testing.T) {
	file := make([]byte, 8192)
	dev := append([]byte(nil), file...)
	if n, first := DiffBytes(file, dev); n != 0 || first != NoMismatch {
		t.Fatalf("equal: %d from %d", n, first)
	}
	dev[4097], dev[4099] = 1, 2
	n, first := DiffBytes(file, dev)
	if n != 2 || first != 4097 {
		t.Fatalf("two bytes lost: %d from %d", n, first)
	}
	mem := ObjectSum{Session: 1, Kind: ObjMemory, ID: 0x1000, Size: 8192, Sum: 7}
	p := []ObjectSum{mem, ApertureSum(1, 0x1000, 0, NoMismatch)}
	if rep := Compare(p, []ObjectSum{mem, ApertureSum(1, 0x1000, 0, NoMismatch)}); !rep.Match || len(rep.Apertures) != 1 || rep.Apertures[0].Size != 8192 {
		t.Fatalf("both match: %+v", rep)
	}
	rep := Compare(p, []ObjectSum{mem, ApertureSum(1, 0x1000, n, first)})
	if a := rep.Apertures[0]; rep.Match || !a.Primary.Match() || a.Standby.MismatchedBytes != 2 || a.Standby.FirstOffset != 4097 || len(rep.Mismatches) != 0 {
		t.Fatalf("lost on the standby: %+v", rep)
	}
	if rep := Compare(p, []ObjectSum{mem}); rep.Match || !rep.Apertures[0].Standby.Missing {
		t.Fatalf("not compared on the standby: %+v", rep)
	}
}

// TestChecksummer: pieces written in order sum to Checksum of the whole,
// however they are cut.
func TestChecksummer(t *testing.T) {
	b := []byte("a module image, checksummed piece by piece")
	for _, n := range []int{1, 3, 7, len(b)} {
		var c Checksummer
		for off := 0; off < len(b); off += n {
			c.Write(b[off:min(off+n, len(b))])
		}
		if c.Sum() != Checksum(b) {
			t.Errorf("pieces of %d: %x, want %x", n, c.Sum(), Checksum(b))
		}
	}
}
