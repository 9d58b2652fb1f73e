package mmiotrace

import (
	"errors"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The tracing modes and region kinds travel to and from the guest (in its
// aperture requests), so the wire ABI defines them and this package uses
// them under its own names.

// Mode is how a tracer catches writes to memory regions (see
// abi.ApertureMode for each mode).
type Mode = abi.ApertureMode

const (
	ModeOff  = abi.ApertureModeOff
	ModeInsn = abi.ApertureModeInsn
	ModePage = abi.ApertureModePage
	ModeUffd = abi.ApertureModeUffd
	ModeAuto = abi.ApertureModeAuto // per page, insn or page (auto_linux.go)
	// The kernel module's modes (kmod_linux.go).
	ModeKmod     = abi.ApertureModeKmod
	ModeKmodPage = abi.ApertureModeKmodPage
	ModeKmodAuto = abi.ApertureModeKmodAuto
)

// Modes lists every mode.
func Modes() []Mode { return abi.ApertureModes() }

// ParseMode reads a mode name.
func ParseMode(s string) (Mode, error) { return abi.ParseApertureMode(s) }

// ErrUnsupportedArch: what was asked needs x86-64. The ptrace modes (insn,
// page) read x86-64 registers and emulate x86-64 stores; off and uffd
// work on every architecture Linux runs on.
var ErrUnsupportedArch = errors.New("mmiotrace: unsupported on this architecture")

// Kind is what a region holds, which decides how its writes are traced
// (see abi.ApertureKind).
type Kind = abi.ApertureKind

const (
	KindMemory   = abi.ApertureMemory
	KindRegister = abi.ApertureRegister
)
