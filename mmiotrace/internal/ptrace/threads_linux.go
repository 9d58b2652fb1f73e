package ptrace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// waitSyscalls are the system calls a thread can be blocked in with no
// memory pinned for a device or the kernel to write later: they wait (for
// a futex, a descriptor, a timer, a child, a signal) and write the
// caller's memory, if at all, through its page tables, where uffd mode's
// tracking sees it. A read, an ioctl, a recvmsg (AF_ALG writes pinned
// pages), io_uring_enter and the rest may pin; they are not here.
var waitSyscalls = append([]int{
	unix.SYS_FUTEX, unix.SYS_FUTEX_WAITV, unix.SYS_NANOSLEEP, unix.SYS_CLOCK_NANOSLEEP,
	unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2, unix.SYS_PPOLL, unix.SYS_PSELECT6,
	unix.SYS_WAIT4, unix.SYS_WAITID, unix.SYS_RT_SIGSUSPEND, unix.SYS_RT_SIGTIMEDWAIT,
	unix.SYS_SCHED_YIELD, unix.SYS_RESTART_SYSCALL,
}, waitSyscallsArch...)

// ThreadWatch tells which threads of a process may be inside a system
// call other than a wait (waitSyscalls), per /proc/PID/task/TID/syscall.
// It keeps the files open: opening one costs several times reading it.
type ThreadWatch struct {
	pid   int
	self  bool             // pid is this process
	task  *os.File         // /proc/PID/task
	files map[int]*os.File // by thread id
	buf   []byte
}

func NewThreadWatch(pid int) (*ThreadWatch, error) {
	task, err := os.Open(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("listing guest threads: %w", err)
	}
	return &ThreadWatch{pid: pid, self: pid == os.Getpid(), task: task, files: map[int]*os.File{}, buf: make([]byte, 512)}, nil
}

// InCalls lists the threads that may be inside a system call other than
// a wait: those running (the kernel does not tell user space from a call
// then) and those blocked in any other call. Threads blocked outside any
// call, or waiting, are left out, and so are threads that exited; when
// pid is this process, so is the calling thread (it is running this).
// tids: look at these threads only (nil: every thread). Reading the files
// needs ptrace permission.
func (w *ThreadWatch) InCalls(tids []int) ([]int, error) {
	self := 0
	if w.self {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		self = unix.Gettid()
	}
	if tids == nil {
		var err error
		if tids, err = w.List(); err != nil {
			return nil, err
		}
	}
	var busy []int
	for _, tid := range tids {
		if tid == self {
			continue
		}
		line, gone, err := w.syscallLine(tid)
		if err != nil {
			return nil, err
		}
		if !gone && !waitingOrOutside(line) {
			busy = append(busy, tid)
		}
	}
	return busy, nil
}

// List returns the process's thread ids, closing the files of threads
// that are gone.
func (w *ThreadWatch) List() ([]int, error) {
	if _, err := w.task.Seek(0, 0); err != nil {
		return nil, fmt.Errorf("listing guest threads: %w", err)
	}
	names, err := w.task.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("listing guest threads: %w", err)
	}
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if tid, err := strconv.Atoi(n); err == nil {
			tids = append(tids, tid)
		}
	}
	for tid, f := range w.files {
		if !slices.Contains(tids, tid) {
			f.Close()
			delete(w.files, tid)
		}
	}
	return tids, nil
}

// syscallLine reads thread tid's system call line; gone: it exited (its
// calls have returned). A file kept open for an earlier thread of the same
// id reads ESRCH: the file is opened again.
func (w *ThreadWatch) syscallLine(tid int) (line string, gone bool, err error) {
	for fresh := false; ; fresh = true {
		f := w.files[tid]
		if f == nil {
			f, err = os.Open(fmt.Sprintf("/proc/%d/task/%d/syscall", w.pid, tid))
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
				return "", true, nil
			}
			if err != nil {
				return "", false, fmt.Errorf("reading guest thread %d's system call: %w", tid, err)
			}
			w.files[tid] = f
		}
		n, err := f.ReadAt(w.buf, 0)
		if n > 0 {
			return string(w.buf[:n]), false, nil
		}
		f.Close()
		delete(w.files, tid)
		if !errors.Is(err, unix.ESRCH) && !errors.Is(err, io.EOF) {
			return "", false, fmt.Errorf("reading guest thread %d's system call: %w", tid, err)
		}
		if fresh {
			return "", true, nil
		}
	}
}

func (w *ThreadWatch) Close() {
	for _, f := range w.files {
		f.Close()
	}
	w.task.Close()
}

// waitingOrOutside reads a /proc/PID/task/TID/syscall line: "running",
// "-1 SP PC" (blocked, in no system call) or "NR ARG1..ARG6 SP PC".
func waitingOrOutside(line string) bool {
	f := strings.Fields(line)
	if len(f) == 0 {
		return false
	}
	nr, err := strconv.Atoi(f[0])
	return err == nil && (nr == -1 || slices.Contains(waitSyscalls, nr))
}
