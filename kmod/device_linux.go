//go:build linux

package kmod

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The in-kernel MMIO tracer's device (module/vgpuha_mmio.c; the numbers
// and layouts below mirror module/vgpuha_mmio.h). A tracer opens the
// device and creates an aperture for a guest process; the guest maps it
// (MapGuest) and its stores fault into the module, which records them as
// events the tracer reads (ReadEvents), or, in page mode, marks their
// pages open until the tracer's next Flush.

// DevicePath is where the module's device appears.
const DevicePath = "/dev/vgpuha_mmio"

// ErrNoModule: the device is not there (the module is not loaded).
var ErrNoModule = errors.New("kmod: " + DevicePath + " is missing: load the module (insmod kmod/module/vgpuha_mmio.ko; build it with make kmod-module)")

// Aperture modes of the module.
const (
	ModeWrite = 1 // every store recorded, in order
	ModePage  = 2 // first store per page per flush marks the page open
	// ModeAuto is per write, but a page that takes more than the module's
	// auto_streak stores between two flushes stays open until the next
	// (page mode for that page); doorbell-like pages stay per write.
	ModeAuto = 3
)

// Event types.
const (
	EventStore = 1 // one store: Insn at IP wrote at Off; Data holds the bytes from Off after it ran
	EventRange = 2 // bytes another thread changed on a page open for a step
)

// EventSize is the size of one event as read(2) returns it.
const EventSize = 128

const (
	iocCreate  = 3<<30 | 48<<16 | 'v'<<8 | 1
	iocDestroy = 1<<30 | 4<<16 | 'v'<<8 | 2
	iocFlush   = 3<<30 | 24<<16 | 'v'<<8 | 3
	iocStats   = 2<<30 | 128<<16 | 'v'<<8 | 4
	iocAdopt   = 3<<30 | 56<<16 | 'v'<<8 | 5
)

// viewShift is VG_VIEW_SHIFT: an aperture's mmap page offset is
// id<<(viewShift+1) | view<<viewShift.
const viewShift = 20

// vgCreate is struct vg_create.
type vgCreate struct {
	Size      uint64
	PID       int32
	Mode      uint32
	Memfd     int32
	ID        uint32
	GuestOff  uint64
	TracerOff uint64
	Backing   uint64
}

// vgAdopt is struct vg_adopt.
type vgAdopt struct {
	ID         uint32
	PID        int32
	Mode       uint32
	_          uint32
	Size       uint64
	Backing    uint64
	GuestStart uint64
	GuestOff   uint64
	TracerOff  uint64
}

// vgFlush is struct vg_flush.
type vgFlush struct {
	ID     uint32
	NPages uint32
	Bitmap uint64
	NOpen  uint32
	_      uint32
}

// Stats are the module's own counters (struct vg_stats; also in
// /sys/class/misc/vgpuha_mmio/stats).
type Stats struct {
	Faults       uint64 // write faults handled
	Steps        uint64 // stores completed under the trap flag
	Events       uint64 // events queued
	Overflows    uint64 // events the ring had no room for (their pages compared at flush)
	WindowBytes  uint64 // bytes other threads changed on pages open for a step
	Refused      uint64 // write faults refused (SIGBUS, EFAULT)
	FlushedPages uint64 // pages taken away by flushes
	Apertures    uint64 // live
	Mappings     uint64 // live guest mappings
	Pending      uint64 // stores stepping now
	Pages        uint64 // pages held by apertures
	Files        uint64 // open device files
	Unfinished   uint64 // traps that found the thread moved elsewhere (a signal handler): pages compared at flush
	Streaks      uint64 // auto mode: pages switched to page tracking until the next flush
	OrphanStores uint64 // store faults on apertures whose tracer is gone (pages marked open)
	Adopted      uint64 // apertures taken over by another tracer (Adopt)
}

// Aperture is one aperture the device created.
type Aperture struct {
	ID        uint32
	Size      uint64
	GuestOff  uint64 // the guest maps the device at this offset
	TracerOff uint64 // the tracer's own mapping (never traced)
}

// Event is one record from the ring.
type Event struct {
	Seq  uint64
	ID   uint32 // aperture
	Type uint16
	Off  uint64 // offset in the aperture
	IP   uint64
	Insn []byte // the instruction's bytes (up to 16)
	Data []byte // the bytes at Off after the store
}

// Device is an open tracer file.
type Device struct{ f *os.File }

// Open opens the device.
func Open() (*Device, error) {
	f, err := os.OpenFile(DevicePath, os.O_RDWR|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoModule
	}
	if err != nil {
		return nil, fmt.Errorf("kmod: opening %s: %w", DevicePath, err)
	}
	return &Device{f: f}, nil
}

// Close closes the device. Its apertures backed by a file (CreateOver, or
// a memfd) are left to their guests: their stores go on into the file's
// pages, each page marked open, until a tracer adopts the aperture
// (Adopt); apertures on the module's own pages are detached (the guest's
// later stores are refused with SIGBUS).
func (d *Device) Close() error { return d.f.Close() }

// Fd is the device file's descriptor (for poll).
func (d *Device) Fd() int { return int(d.f.Fd()) }

// Create makes an aperture of size bytes for process pid (0: this one) in
// mode, backed by memfd's pages (or, with memfd -1, zeroed pages of the
// module's own).
func (d *Device) Create(pid int, size uint64, mode int, memfd int) (Aperture, error) {
	return d.create(vgCreate{Size: size, PID: int32(pid), Mode: uint32(mode), Memfd: int32(memfd)})
}

// CreateOver makes an aperture for process pid in mode whose pages are
// those of mem, a shared mapping in this process (pinned while the
// aperture lives): the tracer keeps reading mem.
func (d *Device) CreateOver(pid int, mem []byte, mode int) (Aperture, error) {
	if len(mem) == 0 {
		return Aperture{}, errors.New("kmod: an aperture over no memory")
	}
	return d.create(vgCreate{Size: uint64(len(mem)), PID: int32(pid), Mode: uint32(mode), Memfd: -1, Backing: addrOf(mem)})
}

func (d *Device) create(c vgCreate) (Aperture, error) {
	size, pid := c.Size, c.PID
	if err := ioctlPtr(d.Fd(), iocCreate, &c); err != nil {
		return Aperture{}, fmt.Errorf("kmod: creating a %d-byte aperture for process %d: %w", size, pid, err)
	}
	return Aperture{ID: c.ID, Size: size, GuestOff: c.GuestOff, TracerOff: c.TracerOff}, nil
}

// Adopt takes over aperture id of process pid, whose tracer is gone (its
// file closed without destroying it: the guest's stores since went into
// the backing file's pages, each page marked open), and traces it in mode
// from now on; the first Flush lists the pages stored to meanwhile. mem
// must be this process's mapping of the file backing the aperture, at the
// same offsets (the module checks it). guestAddr is where the guest maps
// the aperture (0: nowhere).
func (d *Device) Adopt(id uint32, pid int, mem []byte, mode int) (a Aperture, guestAddr uint64, err error) {
	if len(mem) == 0 {
		return Aperture{}, 0, errors.New("kmod: adopting an aperture over no memory")
	}
	c := vgAdopt{ID: id, PID: int32(pid), Mode: uint32(mode), Size: uint64(len(mem)), Backing: addrOf(mem)}
	if err := ioctlPtr(d.Fd(), iocAdopt, &c); err != nil {
		return Aperture{}, 0, fmt.Errorf("kmod: adopting aperture %d of process %d: %w", id, pid, err)
	}
	return Aperture{ID: id, Size: c.Size, GuestOff: c.GuestOff, TracerOff: c.TracerOff}, c.GuestStart, nil
}

// GuestView reports which aperture a mapping of the device at byte
// offset off is the guest's view of.
func GuestView(off uint64) (id uint32, ok bool) {
	const page = 4096
	pg := off / page
	if off%page != 0 || pg&(1<<(viewShift+1)-1) != 0 {
		return 0, false // the tracer's view, or no aperture's start
	}
	id64 := pg >> (viewShift + 1)
	if id64 == 0 || id64 >= 1<<20 { // the module's ids: [1, 1<<20)
		return 0, false
	}
	return uint32(id64), true
}

// Destroy detaches aperture id: the guest's later stores are refused.
func (d *Device) Destroy(id uint32) error {
	v := id
	if err := ioctlPtr(d.Fd(), iocDestroy, &v); err != nil {
		return fmt.Errorf("kmod: destroying aperture %d: %w", id, err)
	}
	return nil
}

// Flush takes aperture a's open pages away from the guest and returns
// them (page indexes), to be compared with what was last sent.
func (d *Device) Flush(a Aperture) ([]uint64, error) {
	npages := a.Size / 4096
	words := make([]uint64, (npages+63)/64)
	if err := flushIoctl(d.Fd(), a.ID, words); err != nil {
		return nil, fmt.Errorf("kmod: flushing aperture %d: %w", a.ID, err)
	}
	var pages []uint64
	for w, bits := range words {
		for b := 0; bits != 0; b++ {
			if bits&1 != 0 {
				pages = append(pages, uint64(w)*64+uint64(b))
			}
			bits >>= 1
		}
	}
	return pages, nil
}

// ReadEvents appends the events queued now to evs (never waits).
func (d *Device) ReadEvents(evs []Event, buf []byte) ([]Event, error) {
	for {
		n, err := unix.Read(d.Fd(), buf)
		if err == unix.EAGAIN || n == 0 {
			return evs, nil
		}
		if err != nil {
			return evs, fmt.Errorf("kmod: reading events: %w", err)
		}
		for off := 0; off+EventSize <= n; off += EventSize {
			evs = append(evs, ParseEvent(buf[off:off+EventSize]))
		}
		if n < len(buf)-EventSize {
			return evs, nil
		}
	}
}

// ParseEvent decodes one struct vg_event.
func ParseEvent(b []byte) Event {
	le := binary.LittleEndian
	e := Event{Seq: le.Uint64(b[0:]), ID: le.Uint32(b[8:]), Type: le.Uint16(b[12:]), Off: le.Uint64(b[16:]), IP: le.Uint64(b[24:])}
	insnLen := min(int(b[48]), 16)
	n := min(int(le.Uint16(b[14:])), 64)
	e.Insn = append([]byte(nil), b[32:32+insnLen]...)
	e.Data = append([]byte(nil), b[64:64+n]...)
	return e
}

// Stats reads the module's counters.
func (d *Device) Stats() (Stats, error) {
	var s Stats
	if err := ioctlPtr(d.Fd(), iocStats, &s); err != nil {
		return s, fmt.Errorf("kmod: reading stats: %w", err)
	}
	return s, nil
}

// MapTracer maps aperture a for the tracer: the same pages, never traced.
func (d *Device) MapTracer(a Aperture) ([]byte, error) {
	m, err := unix.Mmap(d.Fd(), int64(a.TracerOff), int(a.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kmod: mapping aperture %d for the tracer: %w", a.ID, err)
	}
	return m, nil
}

// MapGuest maps aperture a into this process, the guest it was created
// for: its stores are traced.
func MapGuest(a Aperture) ([]byte, error) {
	fd, err := unix.Open(DevicePath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kmod: opening %s: %w", DevicePath, err)
	}
	defer unix.Close(fd)
	m, err := unix.Mmap(fd, int64(a.GuestOff), int(a.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kmod: mapping aperture %d: %w", a.ID, err)
	}
	return m, nil
}
