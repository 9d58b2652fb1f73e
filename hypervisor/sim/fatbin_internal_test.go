package sim

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// entry is one fatbin entry: its kind and payload.
type entry struct {
	kind    uint16
	payload string
}

// fatbin is a fatbin of the given entries.
func fatbin(entries ...entry) []byte {
	le := binary.LittleEndian
	b := make([]byte, 16)
	le.PutUint32(b, abi.FatbinMagic)
	le.PutUint16(b[4:], 1)
	le.PutUint16(b[6:], 16)
	for _, e := range entries {
		hdr := make([]byte, 64)
		le.PutUint16(hdr, e.kind)
		le.PutUint32(hdr[4:], 64)
		le.PutUint64(hdr[8:], uint64(len(e.payload)))
		b = append(append(b, hdr...), e.payload...)
	}
	le.PutUint64(b[8:], uint64(len(b)-16))
	return b
}

// TestFatbinKernels: a fatbin's PTX entries that are library kernels run
// (NUL padding after the text as nvcc writes it), everything else is
// skipped, and a fatbin with none is refused naming the backend that runs
// it.
func TestFatbinKernels(t *testing.T) {
	vadd, _ := kernels.Lookup("vadd")
	saxpy, _ := kernels.Lookup("saxpy")
	img, err := fatbinKernels(fatbin(entry{abi.FatbinCubin, "sass for sm_90"}, entry{abi.FatbinPTX, vadd.PTX + "\x00\x00\x00"},
		entry{abi.FatbinPTX, saxpy.PTX + "// not the library's"}, entry{abi.FatbinPTX, vadd.PTX}))
	if err != nil || len(img.Kernels) != 1 || !vadd.Matches(img.Kernels[0]) {
		t.Fatalf("fatbinKernels: %+v, %v; want vadd alone", img, err)
	}
	if _, err := fatbinKernels(fatbin(entry{abi.FatbinCubin, "sass"})); err == nil {
		t.Fatal("a fatbin without the library's PTX was taken")
	}
}

// FuzzFatbinKernels feeds fatbins the hypervisor's framing check accepts
// to the software GPU's loader: it never panics and runs only the
// library's own kernels.
func FuzzFatbinKernels(f *testing.F) {
	vadd, _ := kernels.Lookup("vadd")
	f.Add(fatbin(entry{abi.FatbinPTX, vadd.PTX}))
	f.Add(fatbin(entry{abi.FatbinCubin, "x"}, entry{abi.FatbinPTX, ".entry k (.param .u64 a) { ret; }"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if abi.CheckFatbin(b) != nil {
			return
		}
		img, err := fatbinKernels(b)
		if err != nil {
			return
		}
		for _, k := range img.Kernels {
			if !kernels.IsLibrary(k) {
				t.Fatalf("took kernel %q, not the library's", k.Name)
			}
		}
	})
}

// TestTypedArgs: bytes of a parameter's size become the declared kind;
// any other size or kind is refused.
func TestTypedArgs(t *testing.T) {
	vadd, _ := kernels.Lookup("vadd")
	le := binary.LittleEndian
	ptr := le.AppendUint64(nil, 0x7e0000001000)
	args, err := typedArgs(vadd, []abi.Arg{abi.Bytes(ptr), abi.Bytes(ptr), abi.Ptr(0x7e0000002000), abi.Bytes(le.AppendUint32(nil, 64))})
	want := []abi.Arg{abi.Ptr(0x7e0000001000), abi.Ptr(0x7e0000001000), abi.Ptr(0x7e0000002000), abi.U32(64)}
	if err != nil || !reflect.DeepEqual(args, want) {
		t.Fatalf("typedArgs: %+v, %v", args, err)
	}
	for _, bad := range [][]abi.Arg{
		{abi.Bytes(ptr[:4]), abi.Bytes(ptr), abi.Bytes(ptr), abi.U32(1)},
		{abi.U64(1), abi.Bytes(ptr), abi.Bytes(ptr), abi.U32(1)},
		{abi.Bytes(ptr), abi.Bytes(ptr), abi.Bytes(ptr)},
	} {
		if _, err := typedArgs(vadd, bad); err == nil {
			t.Errorf("typedArgs took %+v", bad)
		}
	}
}
