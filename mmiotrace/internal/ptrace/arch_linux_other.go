//go:build linux && !amd64

package ptrace

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/mmiotrace/x86store"
)

// waitSyscallsArch: the waits of waitSyscalls only some architectures
// have are left to amd64 (leaving one out only costs a comparison).
var waitSyscallsArch []int

// The ptrace modes (insn, page) read x86-64 registers, decode and emulate
// x86-64 stores and inject system calls through the x86-64 SYSCALL
// instruction. On other architectures they are refused when a region is
// added (Tracer.AddRegion); uffd mode, which needs none of that, works.
// The functions below are never reached; each still says why it cannot
// work here.

func unsupported() error { return fmt.Errorf("%w (%s)", ErrUnsupportedArch, runtime.GOARCH) }

func findSyscallInsn(int, *os.File) (uint64, error) { return 0, unsupported() }

func (p *Process) Inject(int, uintptr, ...uint64) (int64, error) { return 0, unsupported() }

func (p *Process) Regs(int, bool) (*x86store.Regs, *unix.PtraceRegs, error) {
	return nil, nil, unsupported()
}

func SetRegs(int, *x86store.Regs, *unix.PtraceRegs) error { return unsupported() }

func ReadVectors(int, *x86store.Regs) error { return unsupported() }
