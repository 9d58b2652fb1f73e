package objects

import (
	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Module variables, found and copied by name (abi/globals.go): a guest
// reaches only the variables of modules its session loaded, and only
// inside each variable's bounds. A named write is logged as it came, so
// the standby applies it to its own copy of the variable, wherever its
// backend put it.

// global resolves (module, name) of the session to the backend's variable
// and checks that [off, off+n) lies inside it.
func (o *Set) global(module uint64, name string, off, n uint64) (gpu.GlobalAccessor, uint64, uint64, error) {
	m, err := o.handles.Lookup(handlemap.KindModule, handlemap.Handle(module))
	if err != nil {
		return nil, 0, 0, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	acc, ok := o.ctx.(gpu.GlobalAccessor)
	if !ok {
		return nil, 0, 0, guesterr.Fail(abi.StatusNotSupported, "this GPU backend cannot reach module variables (%q): use --backend cuda", name)
	}
	addr, size, err := acc.Global(gpu.Module(m), name)
	if err != nil {
		return nil, 0, 0, err
	}
	if off > size || n > size-off {
		return nil, 0, 0, guesterr.Fail(abi.StatusOutOfRange, "[%d, +%d) of module variable %q exceeds its %d bytes", off, n, name, size)
	}
	return acc, addr + off, size, nil
}

// ModuleGlobal returns a module variable's address and size.
func (o *Set) ModuleGlobal(r *abi.ModuleGlobal) (abi.Body, error) {
	_, addr, size, err := o.global(r.Module, r.Name, 0, 0)
	if err != nil {
		return nil, err
	}
	o.globals.note(globalRef{module: r.Module, name: r.Name, guest: addr, own: addr, size: size})
	return &abi.GlobalReply{Addr: addr, Size: size}, nil
}

// GlobalWrite writes into a module variable, by module and name.
func (o *Set) GlobalWrite(r *abi.GlobalWrite) (abi.Body, error) {
	acc, addr, _, err := o.global(r.Module, r.Name, r.Offset, uint64(len(r.Data)))
	if err != nil {
		return nil, err
	}
	return nil, acc.WriteGlobal(addr, r.Data)
}

// GlobalRead reads from a module variable, by module and name.
func (o *Set) GlobalRead(r *abi.GlobalRead) (abi.Body, error) {
	if r.Length > abi.MaxGlobalCopy {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "a read of %d bytes of module variable %q exceeds the %d-byte limit", r.Length, r.Name, abi.MaxGlobalCopy)
	}
	acc, addr, _, err := o.global(r.Module, r.Name, r.Offset, uint64(r.Length))
	if err != nil {
		return nil, err
	}
	buf := make([]byte, r.Length)
	if err := acc.ReadGlobal(buf, addr); err != nil {
		return nil, err
	}
	return &abi.DataReply{Data: buf}, nil
}
