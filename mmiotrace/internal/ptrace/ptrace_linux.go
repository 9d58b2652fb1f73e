package ptrace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process owns the ptrace relationship with one guest process. Linux lets
// only the thread that attached issue ptrace requests, so everything here
// runs on one locked OS thread (loop); other goroutines hand it work with
// do, which wakes it with a signal to a guest thread (wakeSignal, caught by
// ptrace and never delivered to the guest) so that the work runs while that
// thread is stopped — which is also when a system call can be injected.
type Process struct {
	pid      int
	pgid     int
	ourChild bool // the guest is this process's child: its exit status is left to the parent's Wait
	cpu      int  // CPU the tracer and the guest threads are pinned to, or -1

	// fault handles a SIGSEGV at addr in thread tid; false means the fault
	// is not the tracer's (the guest gets its SIGSEGV).
	fault func(tid int, addr uint64) bool
	// signal runs before a signal is delivered to stopped thread tid (the
	// kernel then writes its frame).
	signal func(tid int)

	// Tracer-thread state.
	threads  map[int]*Thread
	Mem      *os.File // /proc/PID/mem: instruction bytes and MOVS sources
	sysInsn  uint64   // address of a SYSCALL instruction in the guest (for injection)
	deferred []event  // stops collected while other work held the thread

	mu      sync.Mutex
	work    []func(tid int) // run on the tracer thread with tid stopped
	waiting bool            // a wake-up signal is on its way
	stop    bool            // close asked the loop to detach
	done    chan struct{}
	err     error // why the loop ended
}

// Thread is one guest thread as the tracer sees it (StopThreads returns
// those it stopped, for ResumeOthers).
type Thread struct {
	tid     int
	pending int      // a signal to deliver when the thread is next resumed
	info    *rawInfo // pending's siginfo
	stopped bool
}

type event struct {
	tid int
	ws  unix.WaitStatus
}

// wakeSignal wakes the tracer thread. It is sent with tgkill by this
// process (checked through siginfo), so a guest's own use of the signal
// is still delivered to it. It is one whose default action is to be
// ignored: a wake-up still pending when the tracer goes (its node killed
// while a guest thread had one queued) reaches the guest untraced, and
// SIGSTKFLT, used before, then killed the guest (the demo's aperture
// guest died so about once in fifteen runs). A Go guest's runtime takes a
// stray SIGURG as a preemption request nobody made, and ignores it.
const wakeSignal = unix.SIGURG

// ErrGuestGone is returned once the guest process has exited.
var ErrGuestGone = errors.New("mmiotrace: guest process exited")

// Start attaches to every thread of pid and starts the tracer
// thread. The guest must be in a process group of its own (see waitAny).
func Start(pid int, cpu int, fault func(tid int, addr uint64) bool, signal func(tid int)) (*Process, error) {
	pgid, err := unix.Getpgid(pid)
	if err != nil {
		return nil, fmt.Errorf("guest %d: %w", pid, err)
	}
	if pgid == unix.Getpgrp() {
		return nil, fmt.Errorf("guest %d is in the hypervisor's process group: start it in a group of its own (setpgid) so the tracer waits on its threads only", pid)
	}
	p := &Process{pid: pid, pgid: pgid, cpu: cpu, fault: fault, signal: signal, threads: map[int]*Thread{}, done: make(chan struct{})}
	p.ourChild = parentOf(pid) == os.Getpid()
	started := make(chan error, 1)
	go p.loop(started)
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...; comm may contain spaces and parentheses.
	rest := b[bytes.LastIndexByte(b, ')')+1:]
	f := strings.Fields(string(rest))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func (p *Process) loop(started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, pinned or not
	defer close(p.done)
	if p.cpu >= 0 {
		pinThread(0, p.cpu)
	}
	if err := p.attach(); err != nil {
		p.detachAll()
		started <- err
		return
	}
	started <- nil
	for {
		var ev event
		if len(p.deferred) > 0 {
			ev, p.deferred = p.deferred[0], p.deferred[1:]
		} else {
			var err error
			if ev, err = p.waitAny(); err != nil {
				p.finish(err)
				return
			}
		}
		if err := p.handle(ev); err != nil {
			p.finish(err)
			return
		}
		if p.stopping() {
			p.detachAll()
			p.finish(nil)
			return
		}
	}
}

func (p *Process) finish(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	if p.Mem != nil {
		p.Mem.Close()
	}
}

// attach seizes every thread of the guest; threads it creates later are
// attached by the kernel (PTRACE_O_TRACECLONE).
func (p *Process) attach() error {
	var err error
	if p.Mem, err = os.OpenFile(fmt.Sprintf("/proc/%d/mem", p.pid), os.O_RDWR, 0); err != nil {
		return fmt.Errorf("opening the guest's memory: %w", err)
	}
	if p.sysInsn, err = findSyscallInsn(p.pid, p.Mem); err != nil {
		return err
	}
	for { // until a pass finds no new thread
		tids, err := taskIDs(p.pid)
		if err != nil {
			return err
		}
		added := 0
		for _, tid := range tids {
			if p.threads[tid] != nil {
				continue
			}
			// Options go with the seize: PTRACE_SETOPTIONS needs a stopped tracee.
			err := ptraceInt(unix.PTRACE_SEIZE, tid, unix.PTRACE_O_TRACECLONE)
			if errors.Is(err, unix.ESRCH) {
				continue // the thread exited meanwhile
			}
			if err != nil {
				return fmt.Errorf("attaching to guest Thread %d: %w (the hypervisor needs ptrace permission: root, CAP_SYS_PTRACE or kernel.yama.ptrace_scope=0)", tid, err)
			}
			p.threads[tid] = &Thread{tid: tid}
			p.pin(tid)
			added++
		}
		if added == 0 {
			return nil
		}
	}
}

func taskIDs(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("listing guest threads: %w", err)
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

func (p *Process) pin(tid int) {
	if p.cpu >= 0 {
		pinThread(tid, p.cpu)
	}
}

func pinThread(tid, cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	unix.SchedSetaffinity(tid, &set) // best effort: tracing is correct unpinned, only slower
}

// waitAny waits for the next stop or exit of a guest thread. It waits on
// the guest's process group only, so the hypervisor's other children are
// never reaped here; it first peeks (WNOWAIT) so that the guest's own exit
// is left to its parent's Wait when that parent is this process.
func (p *Process) waitAny() (event, error) {
	ev, _, err := p.nextEvent(0)
	return ev, err
}

// pollEvent is waitAny without blocking: ok is false when no thread has
// anything to report.
func (p *Process) pollEvent() (ev event, ok bool, err error) {
	return p.nextEvent(unix.WNOHANG)
}

func (p *Process) nextEvent(flags int) (event, bool, error) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PGID, p.pgid, &info, unix.WEXITED|unix.WSTOPPED|unix.WNOWAIT|unix.WALL|flags, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ECHILD) {
			return event{}, false, ErrGuestGone
		}
		if err != nil {
			return event{}, false, fmt.Errorf("waiting for the guest: %w", err)
		}
		tid := int(siginfoPID(&info))
		if tid == 0 { // WNOHANG: nothing to report
			return event{}, false, nil
		}
		exited := info.Code == cldExited || info.Code == cldKilled || info.Code == cldDumped
		if exited && tid == p.pid && p.ourChild {
			return event{}, false, ErrGuestGone
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil && !errors.Is(err, unix.EINTR) {
			return event{}, false, fmt.Errorf("collecting guest Thread %d: %w", tid, err)
		}
		if exited && tid == p.pid {
			return event{}, false, ErrGuestGone
		}
		return event{tid: tid, ws: ws}, true, nil
	}
}

const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// handle acts on one stop of a guest thread and resumes it.
func (p *Process) handle(ev event) error {
	ws, tid := ev.ws, ev.tid
	if ws.Exited() || ws.Signaled() {
		delete(p.threads, tid)
		return nil
	}
	if !ws.Stopped() {
		return nil
	}
	th := p.threads[tid]
	if th == nil { // a new thread (PTRACE_O_TRACECLONE) reports before or after its creator's event
		th = &Thread{tid: tid}
		p.threads[tid] = th
		p.pin(tid)
	}
	th.stopped = true
	sig := ws.StopSignal()
	switch {
	case ws.TrapCause() == unix.PTRACE_EVENT_CLONE:
		if msg, err := unix.PtraceGetEventMsg(tid); err == nil && p.threads[int(msg)] == nil {
			p.threads[int(msg)] = &Thread{tid: int(msg)}
			p.pin(int(msg))
		}
		return p.deliver(th, 0)
	case ws.TrapCause() == unix.PTRACE_EVENT_STOP:
		// An interrupt nobody waits for any more, or a group stop: the
		// guest keeps running (job control stops are not kept while traced).
		return p.deliver(th, 0)
	case ws.TrapCause() > 0:
		return p.deliver(th, 0)
	}
	info, err := getSiginfo(tid)
	if err != nil {
		return p.deliver(th, int(sig))
	}
	switch {
	case sig == wakeSignal && info.code == siTKill && info.pid == int32(os.Getpid()):
		p.runWork(tid)
		return p.deliver(th, 0)
	case sig == wakeSignal && p.wakeAwaited():
		// The guest's own SIGURG (a Go runtime preempting itself), with
		// which ours may have merged: a standard signal pending twice is
		// delivered once, with the first sender's siginfo. The work runs
		// now, or it would wait for a stop that may never come.
		p.runWork(tid)
		return p.deliver(th, int(sig))
	case sig == unix.SIGSEGV && info.code == segvAccErr && p.fault(tid, info.addr):
		return p.deliver(th, 0)
	}
	return p.deliver(th, int(sig))
}

// deliver resumes th with signal sig (that of its current stop), or the
// one it has pending, first letting the tracer prepare for the frame the
// kernel writes. The signal keeps its siginfo (the fault address, the
// sender) although the thread may have been stepped meanwhile.
func (p *Process) deliver(th *Thread, sig int) error {
	info := th.info
	if sig == 0 && th.pending != 0 {
		sig, th.pending, th.info = th.pending, 0, nil
	} else if sig != 0 {
		info, _ = getRawSiginfo(th.tid)
	}
	if sig != 0 {
		p.signal(th.tid)
		if info != nil {
			setRawSiginfo(th.tid, info)
		}
	}
	return p.resume(th, sig)
}

// KeepSignal keeps signal sig pending for stopped thread tid: it is
// delivered when the thread is next resumed.
func (p *Process) KeepSignal(tid, sig int) { p.keepSignal(p.threads[tid], sig) }

// keepSignal makes the signal that stopped th (sig) pending: it is
// delivered, with its siginfo, when th is next resumed.
func (p *Process) keepSignal(th *Thread, sig int) {
	th.pending = sig
	th.info, _ = getRawSiginfo(th.tid)
}

func (p *Process) resume(th *Thread, sig int) error {
	if sig == 0 && th.pending != 0 {
		sig, th.pending, th.info = th.pending, 0, nil
	}
	th.stopped = false
	err := unix.PtraceCont(th.tid, sig)
	if errors.Is(err, unix.ESRCH) {
		delete(p.threads, th.tid) // killed meanwhile
		return nil
	}
	return err
}

type siginfo struct {
	code int32
	pid  int32
	addr uint64
}

const (
	siTKill    = -6 // SI_TKILL: sent by tgkill
	segvAccErr = 2  // SEGV_ACCERR: a protection fault on a mapped page
)

// ptraceInt issues a ptrace request whose data is a number (options, a
// signal).
func ptraceInt(req, tid int, data uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), 0, data, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Do runs fn on the tracer thread while a guest thread is stopped, and
// returns when it has run.
func (p *Process) Do(fn func(tid int)) error {
	ran := make(chan struct{})
	p.mu.Lock()
	if p.isDone() {
		p.mu.Unlock()
		return p.doneErr()
	}
	p.work = append(p.work, func(tid int) { fn(tid); close(ran) })
	needWake := !p.waiting
	p.waiting = true
	p.mu.Unlock()
	if needWake {
		p.wake()
	}
	select {
	case <-ran:
		return nil
	case <-p.done:
		return p.doneErr()
	}
}

// wake signals one live guest thread; its stop brings the tracer thread
// out of waitAny.
func (p *Process) wake() {
	tids, _ := taskIDs(p.pid)
	for _, tid := range append([]int{p.pid}, tids...) {
		if unix.Tgkill(p.pid, tid, wakeSignal) == nil {
			return
		}
	}
}

func (p *Process) runWork(tid int) {
	p.mu.Lock()
	work := p.work
	p.work, p.waiting = nil, false
	p.mu.Unlock()
	for _, fn := range work {
		fn(tid)
	}
}

// wakeAwaited reports whether a wake-up signal was sent for queued work.
func (p *Process) wakeAwaited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting
}

// stopRequested is set by close: the loop detaches after its current event.
func (p *Process) stopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stop
}

// Close detaches from the guest (its threads run on untraced) and waits
// for the tracer thread to end.
func (p *Process) Close() error {
	err := p.Do(func(int) {
		p.mu.Lock()
		p.stop = true
		p.mu.Unlock()
	})
	<-p.done
	if err != nil && !errors.Is(err, ErrGuestGone) {
		return err
	}
	return nil
}

func (p *Process) isDone() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *Process) doneErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		return ErrGuestGone
	}
	return p.err
}

// detachAll stops every thread and detaches (PTRACE_DETACH needs a stopped
// tracee), delivering any signal a thread still has to receive. Protection
// faults collected meanwhile are dropped: the regions are unprotected by
// then, and the store runs again. Threads that exit meanwhile (the guest
// may be exiting) are forgotten; it never waits on one thread alone, since
// an exiting thread-group leader reports only after all the others.
func (p *Process) detachAll() {
	for _, ev := range p.deferred {
		p.noteStop(ev)
	}
	p.deferred = nil
	for _, th := range p.threads {
		if !th.stopped {
			unix.PtraceInterrupt(th.tid)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for p.anyRunning() && time.Now().Before(deadline) {
		ev, ok, err := p.pollEvent()
		if err != nil {
			break // the guest is gone
		}
		if !ok {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		p.noteStop(ev)
	}
	for tid, th := range p.threads {
		if th.stopped {
			ptraceInt(unix.PTRACE_DETACH, tid, uintptr(th.pending))
		}
	}
	p.threads = map[int]*Thread{}
}

func (p *Process) anyRunning() bool {
	for _, th := range p.threads {
		if !th.stopped {
			return true
		}
	}
	return false
}

// noteStop records a stop collected while detaching: the thread is
// stopped, with the signal it is to receive.
func (p *Process) noteStop(ev event) {
	if ev.ws.Exited() || ev.ws.Signaled() {
		delete(p.threads, ev.tid)
		return
	}
	th := p.threads[ev.tid]
	if th == nil {
		th = &Thread{tid: ev.tid}
		p.threads[ev.tid] = th
	}
	th.stopped = true
	if ev.ws.Stopped() && ev.ws.TrapCause() <= 0 {
		if sig := ev.ws.StopSignal(); sig != unix.SIGSEGV && sig != wakeSignal && sig != unix.SIGTRAP {
			th.pending = int(sig)
		}
	}
}

// awaitStop waits until th, interrupted (PTRACE_INTERRUPT), is stopped. A
// stop that is not the interrupt (a fault, a signal) is kept in deferred
// and handled once the current work is done. The leader is polled, with a
// deadline: an exiting thread-group leader reports nothing until every
// other thread is gone.
func (p *Process) awaitStop(th *Thread) error {
	flags := unix.WALL
	if th.tid == p.pid {
		flags |= unix.WNOHANG
	}
	deadline := time.Now().Add(time.Second)
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(th.tid, &ws, flags, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if got == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("guest Thread %d did not stop", th.tid)
			}
			time.Sleep(20 * time.Microsecond)
			continue
		}
		if ws.Exited() || ws.Signaled() {
			delete(p.threads, th.tid)
			return ErrGuestGone
		}
		th.stopped = true
		if ws.TrapCause() != unix.PTRACE_EVENT_STOP {
			p.deferred = append(p.deferred, event{tid: th.tid, ws: ws})
		}
		return nil
	}
}

// StopOthers stops every guest thread but tid, for the time a page is
// unprotected or a flush collects pages; resumeOthers lets them go on. all
// is false if a thread did not stop (within awaitStop's deadline). A
// thread stops only in user space: a system call it was in has returned,
// or was interrupted to be restarted. Every thread is interrupted before
// the first is waited for, so they stop at once, each on its own CPU: the
// time the guest stands still does not grow with its threads.
func (p *Process) StopOthers(tid int) (stopped []*Thread, all bool) {
	return p.StopThreads(tid, nil)
}

// StopThreads is stopOthers for the threads in tids only (every thread
// but tid when nil). all is also false if a thread of tids is not (yet)
// known to the tracer.
func (p *Process) StopThreads(tid int, tids []int) (stopped []*Thread, all bool) {
	all = true
	for _, id := range tids {
		if p.threads[id] == nil {
			all = false
		}
	}
	var asked []*Thread
	for id, th := range p.threads {
		if id == tid || th.stopped || (tids != nil && !slices.Contains(tids, id)) {
			continue
		}
		if err := unix.PtraceInterrupt(th.tid); err != nil {
			all = false
			continue
		}
		asked = append(asked, th)
	}
	for _, th := range asked {
		if err := p.awaitStop(th); err == nil {
			stopped = append(stopped, th)
		} else if !errors.Is(err, ErrGuestGone) {
			all = false
		}
	}
	return stopped, all
}

func (p *Process) ResumeOthers(stopped []*Thread) {
	for _, th := range stopped {
		if p.hasDeferred(th.tid) {
			continue // its own stop is handled next, which resumes it
		}
		p.resume(th, 0)
	}
}

func (p *Process) hasDeferred(tid int) bool {
	for _, ev := range p.deferred {
		if ev.tid == tid {
			return true
		}
	}
	return false
}

// SingleStep executes one instruction of stopped thread tid. A signal that
// arrives instead is kept for the thread's next resume; a protection fault
// inside a traced region is returned as *StepFault for the caller to
// resolve and step again.
func (p *Process) SingleStep(tid int) error {
	th := p.threads[tid]
	for {
		if err := unix.PtraceSingleStep(tid); err != nil {
			return err
		}
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(tid, &ws, unix.WALL, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			break
		}
		if ws.Exited() || ws.Signaled() {
			delete(p.threads, tid)
			return ErrGuestGone
		}
		if !ws.Stopped() {
			continue
		}
		sig := ws.StopSignal()
		switch {
		case sig == unix.SIGTRAP && ws.TrapCause() <= 0:
			return nil
		case ws.TrapCause() > 0:
			continue // an event stop (e.g. an interrupt) before the step: step again
		case sig == unix.SIGSEGV:
			info, err := getSiginfo(tid)
			if err == nil && info.code == segvAccErr {
				return &StepFault{Addr: info.addr}
			}
		}
		if th != nil && sig != wakeSignal {
			p.keepSignal(th, int(sig))
		} else if sig == wakeSignal {
			p.runWorkLater()
		}
	}
}

// runWorkLater: a wake-up arrived while the thread was being stepped; the
// queued work runs at the next stop of any thread, so send another.
func (p *Process) runWorkLater() {
	p.mu.Lock()
	p.waiting = len(p.work) > 0
	resend := p.waiting
	p.mu.Unlock()
	if resend {
		go p.wake()
	}
}

type StepFault struct{ Addr uint64 }

func (f *StepFault) Error() string {
	return fmt.Sprintf("protection fault at %#x while stepping", f.Addr)
}

// Mprotect changes the protection of [addr, addr+n) in the guest by
// injecting the system call into stopped thread tid.
func (p *Process) Mprotect(tid int, addr, n uint64, prot int) error {
	ret, err := p.Inject(tid, unix.SYS_MPROTECT, addr, n, uint64(prot))
	if err != nil {
		return err
	}
	if ret < 0 {
		return fmt.Errorf("mprotect(%#x, %d) in the guest: %w", addr, n, syscall.Errno(-ret))
	}
	return nil
}

const ssDisable = 2 // SS_DISABLE: no signal stack

// AltStack returns thread tid's signal stack (sigaltstack(2), injected;
// the kernel writes the answer at scratch, guest memory it may clobber)
// and whether it has one enabled.
func (p *Process) AltStack(tid int, scratch uint64) (lo, hi uint64, ok bool) {
	ret, err := p.Inject(tid, unix.SYS_SIGALTSTACK, 0, scratch)
	var ss [24]byte // stack_t: ss_sp, ss_flags (int, padded), ss_size
	if err != nil || ret != 0 || p.ReadGuest(scratch, ss[:]) != nil {
		return 0, 0, false
	}
	sp, flags, size := binary.LittleEndian.Uint64(ss[0:]), binary.LittleEndian.Uint32(ss[8:]), binary.LittleEndian.Uint64(ss[16:])
	return sp, sp + size, flags&ssDisable == 0 && size > 0 && sp+size > sp
}

// ReadGuest reads guest memory (reads never fault on write-protected pages).
func (p *Process) ReadGuest(addr uint64, b []byte) error {
	n, err := p.Mem.ReadAt(b, int64(addr))
	if n == len(b) {
		return nil
	}
	if err == nil {
		err = errors.New("short read")
	}
	return fmt.Errorf("reading guest memory at %#x: %w", addr, err)
}
