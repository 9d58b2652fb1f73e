package x86store

import "testing"

// FuzzDecode feeds arbitrary instruction bytes and registers to the
// decoder and emulator: they must never panic, and an emulated store must
// be exactly as long as the access's target says.
func FuzzDecode(f *testing.F) {
	for _, seed := range [][]byte{
		{0x48, 0x89, 0x07}, {0xf3, 0x48, 0xab}, {0xf3, 0xa4}, {0xc5, 0xfe, 0x7f, 0x07},
		{0xf0, 0x48, 0x0f, 0xc1, 0x07}, {0x48, 0x87, 0x07}, {0x88, 0x27}, {0x0f, 0xae, 0x07},
	} {
		f.Add(seed, uint64(0x7000), uint64(3), uint64(0x1122334455667788), false)
	}
	f.Fuzz(func(t *testing.T, code []byte, dst, count, value uint64, df bool) {
		a, err := Decode(code)
		if err != nil {
			return
		}
		r := &Regs{}
		r.GPR[rdi] = dst
		r.GPR[rcx] = count % 4096 // a REP count the emulator would really meet (bounded by a region)
		r.GPR[rax] = value
		if df {
			r.RFlags |= flagDF
		}
		_, n := a.Target(r)
		if !a.Emulated() {
			return
		}
		st, err := a.Emulate(r, patternRead)
		if err != nil {
			return
		}
		if uint64(len(st.Data)) != n {
			t.Fatalf("%v: emulated %d bytes, target says %d", a.Inst, len(st.Data), n)
		}
	})
}
