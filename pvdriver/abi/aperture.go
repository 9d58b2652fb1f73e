package abi

import "fmt"

// The aperture enums travel in OpApertureAttach and its reply. They are
// defined here, with the wire format, so that a guest links no tracer;
// package mmiotrace's region kinds and tracing modes are these types.

// ApertureKind is what an aperture holds, which decides how the
// hypervisor traces the guest's writes to it.
type ApertureKind uint8

const (
	// ApertureMemory: only the final contents matter (descriptor rings,
	// buffers), so writes may be batched per page.
	ApertureMemory ApertureKind = iota + 1
	// ApertureRegister: every write matters, in order (doorbells): traced
	// one write at a time in every mode but off.
	ApertureRegister
)

func (k ApertureKind) String() string {
	switch k {
	case ApertureMemory:
		return "memory"
	case ApertureRegister:
		return "register"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ApertureMode is how the hypervisor catches the guest's writes to its
// apertures.
type ApertureMode uint8

const (
	// ApertureModeOff traces nothing: an aperture's contents are sent once,
	// when it is attached, and later writes stay local (not replicated, and
	// not seen by the device). The baseline for benchmarks.
	ApertureModeOff ApertureMode = iota
	// ApertureModeInsn traps every store (the apertures stay
	// write-protected), decodes it and emulates it, or single-steps it: one
	// record per write.
	ApertureModeInsn
	// ApertureModePage traps the first write to each page after a flush
	// (ptrace and mprotect); a flush re-protects the dirty pages and sends
	// what changed.
	ApertureModePage
	// ApertureModeUffd tracks written pages with userfaultfd's asynchronous
	// write-protection (the kernel resolves the fault itself; the guest
	// arms it) and collects them with the PAGEMAP_SCAN ioctl at each flush.
	ApertureModeUffd
	// ApertureModeKmod traps every store in the kernel (the vgpuha_mmio
	// module: a fault, the store under the trap flag, a debug trap): one
	// record per write, no process switch.
	ApertureModeKmod
	// ApertureModeKmodPage: the module marks the first store to each page
	// after a flush; the flush takes those pages away and sends what
	// changed. Register apertures are traced per write.
	ApertureModeKmodPage
	// ApertureModeKmodAuto: per write, but a page of a memory aperture that
	// takes a streak of stores between two flushes is tracked per page
	// until the next flush (doorbell-like pages stay per write).
	ApertureModeKmodAuto
	// ApertureModeAuto chooses per page, in user space (ptrace): per write
	// as insn, but a page of a memory aperture that takes a streak of
	// write faults between two flushes (or changed a lot since the last)
	// is opened until the next flush, which compares it, as page mode
	// does. Doorbell-like pages stay per write. Register apertures are
	// traced per write.
	ApertureModeAuto
)

var apertureModeNames = [...]string{
	ApertureModeOff: "off", ApertureModeInsn: "insn", ApertureModePage: "page", ApertureModeUffd: "uffd",
	ApertureModeKmod: "kmod", ApertureModeKmodPage: "kmod-page", ApertureModeKmodAuto: "kmod-auto",
	ApertureModeAuto: "auto",
}

func (m ApertureMode) String() string {
	if int(m) < len(apertureModeNames) {
		return apertureModeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ApertureModes lists every mode.
func ApertureModes() []ApertureMode {
	return []ApertureMode{ApertureModeOff, ApertureModeInsn, ApertureModePage, ApertureModeAuto, ApertureModeUffd, ApertureModeKmod, ApertureModeKmodPage, ApertureModeKmodAuto}
}

// ParseApertureMode reads a mode name.
func ParseApertureMode(s string) (ApertureMode, error) {
	for m, n := range apertureModeNames {
		if n == s {
			return ApertureMode(m), nil
		}
	}
	return 0, fmt.Errorf("unknown MMIO mode %q (want off, insn, page, auto, uffd, kmod, kmod-page or kmod-auto)", s)
}
