package worker

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
)

// childEnv, in a process's environment, makes RunIfAsked serve as a
// worker: its value is the spec the parent's Config gave.
const childEnv = "VGPUHA_GPU_WORKER_SPEC"

// The descriptors a worker inherits, and nothing else but stdin, stdout
// and stderr (every other descriptor of the node is close-on-exec).
const (
	childConnFD = 3 // its end of the socketpair
	childShmFD  = 4 // the shared memory (a memfd)
)

// process is one worker process, as its parent holds it.
type process struct {
	pid    int
	os     *os.Process
	conn   *os.File
	r      *bufio.Reader
	shm    []byte
	exited chan struct{} // closed once reaped; waitErr is then set
	// waitErr is how the process ended (exec.Cmd.Wait's error).
	waitErr error
}

// spawner starts worker processes from one OS thread that lives as long
// as the backend: a child's parent-death signal (PR_SET_PDEATHSIG) is sent
// when the thread that forked it exits, not the process, and Go may end
// a thread a goroutine left locked.
type spawner struct {
	reqs     chan func()
	done     chan struct{} // closed by stop
	stopOnce sync.Once
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the backend
		for {
			select {
			case f := <-s.reqs:
				f()
			case <-s.done:
				return
			}
		}
	}()
	return s
}

// stop ends the spawner's thread; children it started that still live
// get their parent-death signal, and later starts fail.
func (s *spawner) stop() { s.stopOnce.Do(func() { close(s.done) }) }

// errStopped fails a start after the backend closed.
var errStopped = errors.New("the GPU backend is closed")

// onThread runs f on the spawner's thread.
func (s *spawner) onThread(f func() error) error {
	done := make(chan error, 1)
	select {
	case s.reqs <- func() { done <- f() }:
		return <-done
	case <-s.done:
		return errStopped
	}
}

// start runs path as a worker for spec, sharing shmBytes of memory.
func (s *spawner) start(path, spec string, shmBytes int) (*process, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	conn, theirs := os.NewFile(uintptr(fds[0]), "gpu-worker"), os.NewFile(uintptr(fds[1]), "gpu-worker-child")
	defer theirs.Close()
	memfd, err := unix.MemfdCreate("vgpuha-gpu-worker", unix.MFD_CLOEXEC)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	mem := os.NewFile(uintptr(memfd), "gpu-worker-shm")
	defer mem.Close()
	p := &process{conn: conn, exited: make(chan struct{})}
	if err = unix.Ftruncate(memfd, int64(shmBytes)); err == nil {
		p.shm, err = unix.Mmap(memfd, 0, shmBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("shared memory for a GPU worker: %w", err)
	}
	cmd := &exec.Cmd{
		Path: path, Args: []string{"vgpuha-gpu-worker"}, Env: childEnviron(spec),
		Stderr: os.Stderr, ExtraFiles: []*os.File{theirs, mem},
		// Its own process group: a terminal's ^C is the node's to handle
		// (it closes its sessions, and with them their workers).
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true},
	}
	if err := s.onThread(cmd.Start); err != nil {
		p.release()
		return nil, fmt.Errorf("starting a GPU worker (%s): %w", path, err)
	}
	p.pid, p.os, p.r = cmd.Process.Pid, cmd.Process, bufio.NewReaderSize(conn, 64<<10)
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// childEnviron is the node's environment (the GPU driver's variables
// included) with the worker's spec.
func childEnviron(spec string) []string { return environWith(childEnv, spec) }

// environWith is this process's environment with key set to value, first
// and only once (a C library's getenv takes the first).
func environWith(key, value string) []string {
	env := []string{key + "=" + value}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, key+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// release closes the parent's end and unmaps the shared memory.
func (p *process) release() {
	p.conn.Close()
	if p.shm != nil {
		unix.Munmap(p.shm)
		p.shm = nil
	}
}

// end lets the process go: it closes the parent's end (a worker exits on
// it), waits up to grace for the process to exit, kills it if it has not,
// and reaps it. It returns how the process ended.
func (p *process) end(grace time.Duration) error {
	p.conn.Close()
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.os.Kill() // safe once reaped: os.Process knows
		<-p.exited
	}
	if p.shm != nil {
		unix.Munmap(p.shm)
		p.shm = nil
	}
	return p.waitErr
}

// signalKill sends the process SIGKILL, and nothing else: its parent's
// end and the shared memory stay its context's to let go.
func (p *process) signalKill() { p.os.Kill() }

// kill ends the process at once.
func (p *process) kill() error {
	p.os.Kill()
	return p.end(time.Minute)
}

// RunIfAsked serves as a GPU worker, and exits, when this process was
// started as one (a Backend re-runs its binary); otherwise it returns at
// once. A binary that makes a Backend calls it first thing in main (a
// test binary, in TestMain). open opens the real backend the spec names.
func RunIfAsked(open func(spec string) (gpu.Backend, error)) {
	spec, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	sameLayoutEverywhere()
	os.Unsetenv(childEnv)
	os.Exit(runChild(spec, open))
}

// addrNoRandomize is personality(2)'s ADDR_NO_RANDOMIZE.
const addrNoRandomize = 0x0040000

// sameLayoutEverywhere makes this worker's address space laid out the same
// way on every node: it runs the worker again (execve, same arguments,
// environment and descriptors) with address-space randomisation off and
// one malloc arena, once. The GPU driver puts module variables in a region
// it maps where the kernel's mmap places it, at the same offsets in it for
// the same loads; with the same layout, a module variable lies at the same
// address in the primary's worker and in its replica's, so an address a
// guest stored in device memory still names the variable after a failover.
// Randomisation moves the region per process; so does each 64 MiB arena
// glibc's malloc maps for a thread that finds the others busy, as many as
// the threads' timing makes (seen on an H200: 16 guests' variables, a third
// of them 64 MiB apart on the two nodes). Where personality(2) is refused
// (a container's seccomp profile) the worker runs as started: a standby
// then finds variables elsewhere and says so (replica.Metrics).
func sameLayoutEverywhere() {
	cur, _, errno := unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	if errno != 0 || cur&addrNoRandomize != 0 && os.Getenv(arenaEnv) == oneArena {
		return
	}
	if _, _, errno = unix.RawSyscall(unix.SYS_PERSONALITY, cur|addrNoRandomize, 0, 0); errno != 0 {
		return
	}
	err := unix.Exec("/proc/self/exe", os.Args, environWith(arenaEnv, oneArena))
	unix.RawSyscall(unix.SYS_PERSONALITY, cur, 0, 0) // the exec failed: run as started
	fmt.Fprintln(os.Stderr, "vgpuha gpu worker: running again with the same address layout on every node:", err)
}

// arenaEnv=oneArena keeps glibc's malloc to its main arena (a worker's
// one busy thread drives the GPU: no contention to spread).
const arenaEnv, oneArena = "MALLOC_ARENA_MAX", "1"

// runChild is a worker's life; its exit status.
func runChild(spec string, open func(string) (gpu.Backend, error)) int {
	// The node decides when a worker ends (it closes the socket, or dies):
	// a signal meant for the node's whole group or unit is not ours.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	conn := os.NewFile(childConnFD, "gpu-worker")
	var st unix.Stat_t
	if err := unix.Fstat(childShmFD, &st); err != nil || st.Size <= 0 || st.Size > 1<<40 {
		fmt.Fprintf(os.Stderr, "vgpuha gpu worker: no shared memory on descriptor %d (%v): started by hand?\n", childShmFD, err)
		return 2
	}
	shm, err := unix.Mmap(childShmFD, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vgpuha gpu worker: mapping the shared memory:", err)
		return 2
	}
	start := time.Now()
	be, err := open(spec)
	if err != nil {
		be = unopened{err}
	}
	slow("opening the GPU", start)
	if reg, ok := be.(gpu.HostRegistrar); ok {
		if unregister, err := reg.RegisterHost(shm); err == nil {
			defer unregister()
		}
	}
	ctx, err := serve(conn, be, shm)
	if ctx != nil {
		ctx.Close()
	}
	be.Close()
	if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		fmt.Fprintln(os.Stderr, "vgpuha gpu worker:", err)
		return 1
	}
	return 0
}
