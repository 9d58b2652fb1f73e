//go:build linux && !amd64

package mmiotrace

import (
	"fmt"
	"runtime"
)

// The ptrace modes (insn, page) read x86-64 registers, decode and emulate
// x86-64 stores and inject system calls through the x86-64 SYSCALL
// instruction (package ptrace). On other architectures they are refused
// when a region is added (Tracer.AddRegion); uffd mode, which needs none
// of that, works.

func ptraceArchErr(m Mode) error {
	return fmt.Errorf("%w (%s): %s mode decodes and emulates x86-64 stores through ptrace; use uffd mode", ErrUnsupportedArch, runtime.GOARCH, m)
}
