package abi

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePTX(t *testing.T) {
	text := `// comment .entry fake(
.version 8.4
.target sm_90
.address_size 64
.visible .global .align 4 .b8 table[64];
/* block .entry alsofake */
.visible .entry _Z4vaddPfS_S_i(
	.param .u64 .ptr .global .align 4 _Z4vaddPfS_S_i_param_0,
	.param .u64 _Z4vaddPfS_S_i_param_1,
	.param .u32 n
)
.maxntid 256, 1, 1
{ ret; }
.entry noargs
{ ret; }
.entry mixed(.param .u8 c, .param .align 8 .b8 s[12], .param .f32 f, .param .f64 d, .param .u16 h)
{ ret; }
`
	got, err := ParsePTX(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []PTXEntry{
		{Name: "_Z4vaddPfS_S_i", Params: []PTXParam{
			{"_Z4vaddPfS_S_i_param_0", "u64", 8, 4}, {"_Z4vaddPfS_S_i_param_1", "u64", 8, 8}, {"n", "u32", 4, 4}}},
		{Name: "noargs"},
		{Name: "mixed", Params: []PTXParam{{"c", "u8", 1, 1}, {"s", "b8", 12, 8}, {"f", "f32", 4, 4}, {"d", "f64", 8, 8}, {"h", "u16", 2, 2}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("entries (-want +got):\n%s", diff)
	}
	offs, total := got[2].Offsets()
	if diff := cmp.Diff([]int{0, 8, 20, 24, 32}, offs); diff != "" || total != 34 {
		t.Errorf("offsets %v total %d", offs, total)
	}
	kinds := []ArgKind{got[2].Params[0].Kind(), got[2].Params[1].Kind(), got[2].Params[2].Kind(), got[2].Params[3].Kind(), got[0].Params[0].Kind(), got[0].Params[2].Kind()}
	if diff := cmp.Diff([]ArgKind{ArgBytes, ArgBytes, ArgF32, ArgF64, ArgU64, ArgU32}, kinds); diff != "" {
		t.Errorf("kinds: %s", diff)
	}
	if v := PTXVersion(text); v != 84 {
		t.Errorf("version %d", v)
	}
	for _, bad := range []string{".version 7.0", ".entry (", ".entry k(.param .u64)", ".entry k(.param .u32 a, .param .b8 x[99999])", ".entry k(.param .u32 a"} {
		if _, err := ParsePTX(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func FuzzParsePTX(f *testing.F) {
	f.Add(".version 7.0\n.entry k(.param .u64 a, .param .align 8 .b8 s[16])\n{ret;}")
	f.Add(".entry")
	f.Fuzz(func(t *testing.T, text string) {
		entries, err := ParsePTX(text)
		if err != nil {
			return
		}
		for _, e := range entries {
			if _, total := e.Offsets(); total > MaxParamBytes || len(e.Params) > MaxArgs {
				t.Fatalf("entry %s exceeds limits: %d bytes", e.Name, total)
			}
		}
	})
}
