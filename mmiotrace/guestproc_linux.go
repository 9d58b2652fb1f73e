package mmiotrace

import (
	"errors"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/mmiotrace/internal/ptrace"
)

// ErrGuestGone is returned once the guest process has exited (the ptrace
// layer finds it first; errors.Is matches it from either).
var ErrGuestGone = ptrace.ErrGuestGone

// GuestCommand prepares cmd to run as a traceable guest: in a process
// group of its own, as the tracer requires.
func GuestCommand(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return cmd
}

// WaitExit waits for a started guest command that this process may be
// tracing. os/exec's Wait must not run while the child is traced — the
// wait would take the tracer's stops — so it first waits for the exit on a
// pidfd (which only becomes readable once every thread has exited), then
// collects the status with cmd.Wait.
func WaitExit(cmd *exec.Cmd) error {
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		return errors.Join(err, cmd.Wait())
	}
	defer unix.Close(pidfd)
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
			break
		}
	}
	return cmd.Wait()
}
