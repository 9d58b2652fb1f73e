package cuapi

import "slices"

// Host memory the program pins: cuMemAllocHost/cuMemHostAlloc's (the C
// half allocates, NoteHost records) and its own memory it registers
// (cuMemHostRegister). The GPU is on another host, so "pinned" here means
// what a program can observe of it: pointer attributes that say host
// memory, in the context that pinned it, and copies that accept it. A
// kernel cannot reach the guest's memory across the link: the device
// address cuMemHostGetDevicePointer gives names a mirror (mapped.go).

// CU_MEMHOSTREGISTER_* flags (cuda.h).
const (
	hostRegisterPortable  = 0x01
	hostRegisterDeviceMap = 0x02
	hostRegisterIOMemory  = 0x04
	hostRegisterReadOnly  = 0x08
)

// CUDA's answers for registering twice and unregistering what is not.
const (
	ErrorHostMemoryAlreadyRegistered Result = 712
	ErrorHostMemoryNotRegistered     Result = 713
)

// NoteHost records n bytes of host memory at p the C half allocated:
// region is the buffer HostAllocRegion gave, nil for ordinary memory.
func (d *Driver) NoteHost(t Thread, p uintptr, n uint64, region []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, _ := d.current(t)
	d.noteHostLocked(p, hostAlloc{size: n, region: region, ctx: ctx})
}

// noteHostLocked records h at p. Precondition: d.mu must be locked.
func (d *Driver) noteHostLocked(p uintptr, h hostAlloc) {
	if d.hosts == nil {
		d.hosts = map[uintptr]hostAlloc{}
	}
	d.hosts[p] = h
	if i, found := slices.BinarySearch(d.hostBases, p); !found {
		d.hostBases = slices.Insert(d.hostBases, i, p)
	}
	if d.hostHi == 0 || uint64(p) < d.hostLo {
		d.hostLo = uint64(p)
	}
	d.hostHi = max(d.hostHi, uint64(p)+h.size)
}

// HostRegister is cuMemHostRegister_v2: n bytes of the program's own
// memory at p become host memory this driver knows. A range overlapping
// host memory it already knows is refused as CUDA refuses it; I/O memory
// (device registers of another device) cannot be reached from the GPU's
// host and is not supported.
func (d *Driver) HostRegister(t Thread, p uintptr, n uint64, flags uint32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return r
	}
	if p == 0 || n == 0 || n > 1<<46 || uint64(p) > ^uint64(0)-n ||
		flags&^(hostRegisterPortable|hostRegisterDeviceMap|hostRegisterIOMemory|hostRegisterReadOnly) != 0 {
		return ErrorInvalidValue
	}
	if flags&hostRegisterIOMemory != 0 {
		return ErrorNotSupported
	}
	for base, h := range d.hosts {
		if uint64(p) < uint64(base)+h.size && uint64(base) < uint64(p)+n {
			return ErrorHostMemoryAlreadyRegistered
		}
	}
	d.noteHostLocked(p, hostAlloc{size: n, ctx: ctx, registered: true, readOnly: flags&hostRegisterReadOnly != 0})
	return Success
}

// HostUnregister is cuMemHostUnregister: p must be where a registration
// began. Its mirror on the device, if it had one, goes with it.
func (d *Driver) HostUnregister(p uintptr) Result {
	r := d.hostUnregister(p)
	if r == Success {
		d.dropMirror(p)
	}
	return r
}

func (d *Driver) hostUnregister(p uintptr) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	h, ok := d.hosts[p]
	if !ok || !h.registered {
		return ErrorHostMemoryNotRegistered
	}
	d.forgetHostLocked(p)
	return Success
}

// forgetHostLocked forgets the host memory at p.
// Precondition: d.mu must be locked.
func (d *Driver) forgetHostLocked(p uintptr) {
	delete(d.hosts, p)
	if i, found := slices.BinarySearch(d.hostBases, p); found {
		d.hostBases = slices.Delete(d.hostBases, i, i+1)
	}
}
