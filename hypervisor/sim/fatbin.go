package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Fatbins on the software GPU. NVIDIA's driver, given a fatbin with no
// machine code for its GPU, compiles the PTX the fatbin carries (CUDA C
// Programming Guide, "Binary Compatibility" and "PTX Compatibility"). The
// software GPU does the same with the one PTX it can run: an entry
// (uncompressed, as nvcc writes it without --compress-all) whose text is
// exactly one of the library's kernels runs as that kernel's Go
// implementation; every other entry (code for some GPU, other PTX) is
// skipped, as a driver skips code for other GPUs. A function taken from a
// fatbin takes its parameters as bytes, in the slots its PTX lays out
// (gpu.FunctionDescriber), as on a CUDA node.

// fatbinKernels returns the library's kernels a fatbin carries as PTX, as
// a kernel list.
func fatbinKernels(raw []byte) (*abi.ModuleImage, error) {
	img := &abi.ModuleImage{}
	seen := map[string]bool{}
	_, err := abi.FatbinEntries(raw, func(kind uint16, payload []byte) {
		if kind != abi.FatbinPTX {
			return
		}
		text := string(bytes.TrimRight(payload, "\x00"))
		entries, err := abi.ParsePTX(text)
		if err != nil || len(entries) != 1 || seen[entries[0].Name] {
			return
		}
		if k, ok := kernels.Lookup(entries[0].Name); ok && k.PTX == text {
			seen[k.Name] = true
			img.Kernels = append(img.Kernels, abi.KernelSpec{Name: k.Name, Params: k.Params, PTX: k.PTX})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", abi.ErrBadImage, err)
	}
	if len(img.Kernels) == 0 || len(img.Kernels) > abi.MaxKernels {
		return nil, fmt.Errorf("%w: the software GPU runs a fatbin's PTX only where it is one of the library's kernels %v, "+
			"and this one carries %d of them; other code needs --backend cuda", abi.StatusNotSupported, kernels.Names(), len(img.Kernels))
	}
	return img, nil
}

// ParamSlots implements gpu.FunctionDescriber: where each parameter of a
// library kernel lies in its parameter buffer, as its PTX lays them out.
func (c *guestContext) ParamSlots(f gpu.Function) ([]abi.ParamSlot, error) {
	c.mu.Lock()
	k := c.functions[f]
	c.mu.Unlock()
	if k == nil {
		return nil, fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
	}
	entries, err := abi.ParsePTX(k.PTX)
	if err != nil || len(entries) != 1 {
		return nil, fmt.Errorf("%w: kernel %s's PTX: %v", abi.StatusInternal, k.Name, err)
	}
	offs, _ := entries[0].Offsets()
	slots := make([]abi.ParamSlot, len(offs))
	for i, p := range entries[0].Params {
		slots[i] = abi.ParamSlot{Offset: uint32(offs[i]), Size: uint32(p.Size)}
	}
	return slots, nil
}

// FunctionAttrs implements gpu.FunctionDescriber: the software GPU reports
// no attributes.
func (c *guestContext) FunctionAttrs(gpu.Function) ([]int32, error) { return nil, nil }

// typedArgs gives a library kernel the arguments of a launch that passed
// them as bytes (a function taken from a fatbin) as the kernel declares
// them; arguments of their declared kind pass as they are.
func typedArgs(k *kernels.Kernel, args []abi.Arg) ([]abi.Arg, error) {
	if len(args) != len(k.Params) {
		return nil, fmt.Errorf("%w: kernel %s takes %d arguments, launch gave %d", abi.StatusInvalidValue, k.Name, len(k.Params), len(args))
	}
	var typed []abi.Arg
	for i, a := range args {
		if a.Kind == k.Params[i] {
			continue
		}
		want := abi.Arg{Kind: k.Params[i]}
		if a.Kind != abi.ArgBytes || len(a.Raw) != want.Size() || (want.Size() != 4 && want.Size() != 8) {
			return nil, fmt.Errorf("%w: kernel %s argument %d: %d bytes of kind %d for a parameter of kind %d",
				abi.StatusInvalidValue, k.Name, i, len(a.Raw), a.Kind, want.Kind)
		}
		if typed == nil {
			typed = append([]abi.Arg(nil), args...)
		}
		if want.Size() == 4 {
			want.Bits = uint64(binary.LittleEndian.Uint32(a.Raw))
		} else {
			want.Bits = binary.LittleEndian.Uint64(a.Raw)
		}
		typed[i] = want
	}
	if typed == nil {
		return args, nil
	}
	return typed, nil
}
