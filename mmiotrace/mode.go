package mmiotrace

import "fmt"

// Mode is how a tracer catches writes to memory regions.
type Mode int

const (
	// ModeOff traces nothing: a region's contents are sent once, when it is
	// added, and later writes stay local (not replicated, and not seen by
	// the device). The baseline for benchmarks.
	ModeOff Mode = iota
	// ModeInsn traps every store (the regions stay write-protected),
	// decodes it and emulates it, or single-steps it: one record per write.
	ModeInsn
	// ModePage traps the first write to each page after a flush (ptrace and
	// mprotect); a flush re-protects the dirty pages and sends what changed.
	ModePage
	// ModeUffd tracks written pages with userfaultfd's asynchronous
	// write-protection (the kernel resolves the fault itself) and collects
	// them with the PAGEMAP_SCAN ioctl at each flush.
	ModeUffd
)

var modeNames = [...]string{ModeOff: "off", ModeInsn: "insn", ModePage: "page", ModeUffd: "uffd"}

func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Modes lists every mode.
func Modes() []Mode { return []Mode{ModeOff, ModeInsn, ModePage, ModeUffd} }

// ParseMode reads a mode name.
func ParseMode(s string) (Mode, error) {
	for m, n := range modeNames {
		if n == s {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("unknown MMIO mode %q (want off, insn, page or uffd)", s)
}

// Kind is what a region holds, which decides how its writes are traced
// (DESIGN.md decision 7).
type Kind uint8

const (
	// KindMemory: only the final contents matter, so writes may be batched
	// per page.
	KindMemory Kind = iota + 1
	// KindRegister: every write matters, in order (doorbells): traced one
	// write at a time in every mode but off.
	KindRegister
)

func (k Kind) String() string {
	switch k {
	case KindMemory:
		return "memory"
	case KindRegister:
		return "register"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}
