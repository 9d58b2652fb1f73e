package cuapi

import (
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Module variables (__device__ and __constant__ globals). cuModuleGetGlobal
// hands out the address the primary's GPU gave the variable, outside the
// session's window; the driver remembers it with its module and name, and
// a copy, memset or cuMemcpy that touches it goes to the node by name
// (pvdriver.Client.WriteGlobal, ReadGlobal), so the standby writes its own
// copy of the variable and, after a failover, the new primary writes its
// own. Kernels reach a variable by its symbol, on every node. What does
// not carry over: an address of a variable that a program stores in device
// memory or passes to a kernel names the old primary's copy after a
// failover.

type moduleGlobal struct {
	module uint64 // the driver's module handle
	name   string
	size   uint64
}

// globalAt finds the variable [p, p+n) lies in.
// Precondition: d.mu must be locked.
func (d *Driver) globalAt(p, n uint64) (g moduleGlobal, off uint64, ok bool) {
	for base, g := range d.globals {
		if p >= base && p-base < g.size && n <= g.size-(p-base) {
			return g, p - base, true
		}
	}
	return moduleGlobal{}, 0, false
}

// remoteGlobal is the variable's module on the node.
// Precondition: d.mu must be locked.
func (d *Driver) remoteGlobal(g moduleGlobal) (pvdriver.Module, Result) {
	m := d.modules[g.module]
	if m == nil {
		return 0, ErrorInvalidHandle // its module was unloaded
	}
	return m.remote, Success
}

// moduleGetGlobal asks the node for a variable of the loaded module m
// (handle h) and remembers it.
// Precondition: d.mu must be locked.
func (d *Driver) moduleGetGlobal(h uint64, m *module, name string) (uint64, uint64, Result) {
	if len(name) > abi.MaxKernelName {
		return 0, 0, ErrorNotFound
	}
	addr, size, err := d.client.ModuleGlobal(m.remote, name)
	if err != nil {
		if r := resultOf("cuModuleGetGlobal", err, false); r != ErrorInvalidValue {
			return 0, 0, r
		}
		return 0, 0, ErrorNotFound // the module has no such variable
	}
	if d.globals == nil {
		d.globals = map[uint64]moduleGlobal{}
	}
	d.globals[addr] = moduleGlobal{module: h, name: name, size: size}
	return addr, size, Success
}

// forgetGlobals drops the variables of module h.
// Precondition: d.mu must be locked.
func (d *Driver) forgetGlobals(h uint64) {
	for base, g := range d.globals {
		if g.module == h {
			delete(d.globals, base)
		}
	}
}

// copyGlobal serves a copy whose destination (write) or source (!write)
// lies in a module variable; ok is false when neither does.
func (d *Driver) copyGlobal(t Thread, p uint64, buf []byte, write bool) (r Result, ok bool) {
	d.mu.Lock()
	g, off, found := d.globalAt(p, uint64(len(buf)))
	if !found {
		d.mu.Unlock()
		return Success, false
	}
	if _, r = d.current(t); r != Success {
		d.mu.Unlock()
		return r, true
	}
	remote, r := d.remoteGlobal(g)
	c := d.client
	d.mu.Unlock()
	if r != Success {
		return r, true
	}
	if write {
		return resultOf("cuMemcpyHtoD(module variable)", c.WriteGlobal(remote, g.name, off, buf), false), true
	}
	return resultOf("cuMemcpyDtoH(module variable)", c.ReadGlobal(buf, remote, g.name, off), false), true
}

// IsGlobal reports whether [p, p+n) lies in a module variable the program
// took the address of (cuMemcpy tells device from host addresses by it).
func (d *Driver) IsGlobal(p, n uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, _, ok := d.globalAt(p, n)
	return ok
}

// copyThroughHost is a device-to-device copy of n bytes with a module
// variable at one end or both: read into host memory, then written (a
// variable is at most abi.MaxGlobalCopy bytes, so is the copy). It is
// ordered after all of the session's earlier work, as every named copy.
func (d *Driver) copyThroughHost(t Thread, dst, src, n, s uint64) Result {
	if n > abi.MaxGlobalCopy {
		return ErrorInvalidValue
	}
	buf := make([]byte, n)
	if r := d.MemcpyDtoH(t, buf, src, s); r != Success {
		return r
	}
	return d.MemcpyHtoD(t, dst, buf, s, false)
}
