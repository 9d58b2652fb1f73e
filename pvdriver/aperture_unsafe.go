package pvdriver

import "unsafe"

// Addr is the aperture's address in this process.
func (a *Aperture) Addr() uintptr { return uintptr(unsafe.Pointer(&a.Mem[0])) }
