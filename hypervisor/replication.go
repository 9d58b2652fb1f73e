package hypervisor

import (
	"fmt"
	"sort"
	"time"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// This file connects sessions to replication. On the primary, every state
// change a session makes is appended to a replicate.Log in execution order,
// replies obey the mode's commit rule, and a verify point is taken with
// every session stopped (a resync snapshot too, but only for a moment:
// resync.go). On the standby, the same
// Session code applies the records (ApplyRecord): one implementation of
// validation and execution for both sides, so a standby checks the stream
// exactly as the primary checked the guest. The one difference is waiting:
// a replica's host-to-device copy may stay queued on its GPU
// (QueueReplayedCopies), since the standby keeps the record's buffer until
// it settles the copy, where a guest's buffer is reused once its call
// returns. (Measured on two H200s, primary and standby on a GPU each: the
// standby's applier spent 53% of a catch-up in cuMemcpyHtoD waiting for
// each 256 KiB copy and the GPU work queued before it.)

// Replicate makes the server log every state change to log, and hold
// replies according to mode. Call before serving guests.
func (s *Server) Replicate(log *replicate.Log, mode replicate.Mode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repl, s.mode = log, mode
	log.SetTerm(s.term)
	// A promoted standby starts replicating with sessions already open:
	// from now on their changes are logged too (a new standby gets their
	// state from its resync snapshot).
	for id, sess := range s.sessions {
		sess.mu.Lock()
		if sess.failed == "" {
			sess.setRecord(s.recorder(id))
		}
		sess.mu.Unlock()
	}
}

// setRecord sets (or, nil, clears) the session's hook into the log.
// Precondition: s.mu must be locked.
func (s *Session) setRecord(h *logHook) {
	s.record = h
	if h == nil {
		s.objs.Replicate(nil)
		return
	}
	s.objs.Replicate(h.log)
}

// recorder returns the session's hook into the log.
// Precondition: s.mu must be locked (or s.repl otherwise stable).
func (s *Server) recorder(id uint64) *logHook {
	return &logHook{log: s.repl, session: id}
}

// logHook is a session's way into the replication log: it appends the
// session's state changes, and gives out drafts, log buffers that an
// in-place payload is read into once (inplace.go).
type logHook struct {
	log     *replicate.Log
	session uint64
}

// append logs one state change; payload is copied. With draft set,
// payload is the draft's body and the log takes it without a copy.
func (h *logHook) append(op replicate.Op, reqID uint64, payload []byte, result uint64, flags uint16, draft *replicate.Draft) {
	r := replicate.Record{Session: h.session, ReqID: reqID, Op: op, Flags: flags, Result: result, Body: payload}
	if draft != nil {
		h.log.AppendDraft(r, draft)
		return
	}
	h.log.Append(r)
}

// mustWait is the commit rule: whether the reply to a synchronous request
// waits until the standby has applied everything before it.
func (s *Server) mustWait(op abi.Opcode, err error) bool {
	if s.repl == nil {
		return false
	}
	switch s.mode {
	case replicate.ModeSync:
		return true
	case replicate.ModeCommit:
		return err != nil || op.Info().Commits
	}
	return false
}

// replyGate returns what a reply to op (which ended in err) waits for
// under the mode's rule, or nil if it may go at once: in sync mode the
// standby applied everything before it, in commit mode it holds
// everything before it (and applies it before it could ever serve). The
// returned function reports false when the node is going down: the reply
// must not be sent. It is called after the request ran, so "before it"
// is the log as it stands now.
func (s *Server) replyGate(op abi.Opcode, err error) func() bool {
	if !s.mustWait(op, err) {
		return nil
	}
	repl, last := s.repl, s.repl.Last()
	held := func() bool { return repl.WaitReceived(last) }
	if s.mode == replicate.ModeSync {
		held = func() bool { return repl.WaitApplied(last) }
	}
	return func() bool { return held() || !repl.Closed() && s.mayAnswerUnprotected(held) }
}

// stopTheWorld runs fn with the server and every session locked, so that
// no request runs and the log does not move.
func (s *Server) stopTheWorld(fn func(sessions []*Session)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sessions := make([]*Session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].id < sessions[j].id })
	for _, sess := range sessions {
		sess.mu.Lock()
	}
	defer func() {
		for _, sess := range sessions {
			sess.mu.Unlock()
		}
	}()
	live := sessions[:0:0]
	for _, sess := range sessions {
		if !sess.closed && sess.failed == "" { // a failed session's state is not to be copied: the standby dropped it
			live = append(live, sess)
		}
	}
	fn(live)
}

// VerifyPoint computes checksums of every object and, at the same log
// position, appends a verify record asking the standby for its own. In
// epoch mode it first cuts an epoch, so the standby applies what it holds.
// With apertures, each aperture's file is also compared byte by byte with
// the device copy here, and sent (OpVerifyMMIO) for the standby to compare
// with its own.
func (s *Server) VerifyPoint(id uint64, apertures bool) []replicate.ObjectSum {
	var sums []replicate.ObjectSum
	s.stopTheWorld(func(sessions []*Session) {
		for _, sess := range sessions {
			sess.flushMMIO() // apertures are compared with their files (aperture.Set.Sum)
		}
		for _, sess := range sessions {
			if !apertures {
				break
			}
			if sess.mmio == nil {
				continue
			}
			apSums, recs := sess.mmio.Verify(sess.id, id)
			sums = append(sums, apSums...)
			for _, rec := range recs {
				s.repl.Append(rec)
			}
		}
		if s.mode == replicate.ModeEpoch {
			s.repl.Append(replicate.Record{Op: replicate.OpEpoch}) // apply what the standby holds
		}
		sums = append(sums, checksums(sessions)...)
		s.repl.Append(replicate.Record{Op: replicate.OpVerify, Result: id})
	})
	return sums
}

// Checksums describes every object, for a standby answering verify.
func (s *Server) Checksums() []replicate.ObjectSum {
	var sums []replicate.ObjectSum
	s.stopTheWorld(func(sessions []*Session) { sums = checksums(sessions) })
	return sums
}

func checksums(sessions []*Session) []replicate.ObjectSum {
	var sums []replicate.ObjectSum
	for _, sess := range sessions {
		sums = append(sums, replicate.ObjectSum{Session: sess.id, Kind: replicate.ObjSession, ID: sess.mem.base, Sum: replicate.Checksum([]byte(sess.guest))})
		sums = append(sums, sess.verifyMMIO.Sums(sess.id)...) // a standby's verify --apertures
		for _, r := range sess.mem.ranges.All() {
			sum, err := sess.mem.Checksum(r.Addr, r.Size)
			if err != nil {
				sum = 0 // reported as a mismatch
			}
			if sess.mmio == nil {
				// no aperture
			} else if fileSum, ok := sess.mmio.Sum(r.Addr); ok {
				sum = fileSum
			}
			sums = append(sums, replicate.ObjectSum{Session: sess.id, Kind: replicate.ObjMemory, ID: r.Addr, Size: r.Size, Sum: sum})
		}
		sums = append(sums, sess.objs.Sums(sess.id)...)
	}
	return sums
}

// Repair sends the primary's contents of one allocation to the standby, as
// a logged copy.
func (s *Server) Repair(session, addr uint64) error {
	s.mu.Lock()
	sess := s.sessions[session]
	s.mu.Unlock()
	if sess == nil {
		return fmt.Errorf("no session %d", session)
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	r, ok := sess.mem.ranges.Find(addr, 0)
	if !ok || r.Addr != addr {
		return fmt.Errorf("session %d has no allocation at %#x", session, addr)
	}
	if sess.mmio != nil && sess.mmio.Resend(addr) {
		return sess.flushMMIO()
	}
	recs, err := sess.mem.contentRecords(sess.id, r, replicate.FlagRepair)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		s.repl.Append(rec)
	}
	return nil
}

// ApplyRecord applies one replicated record to this (standby) server. It
// never trusts the record: guest operations go through the same validation
// as on the primary, and the result must match what the primary got. Once
// QueueReplayedCopies was called, a copy the record makes from its body
// may still be queued on the device when it returns: the caller keeps
// rec.Body unchanged until a Settle of a later Mark returns.
func (s *Server) ApplyRecord(rec *replicate.Record) (err error) {
	defer s.recoverApply(rec, &err)
	switch rec.Op {
	case replicate.OpReset:
		for _, sess := range s.sessionList() {
			s.closeSession(sess)
		}
		s.images.ResetReceived()
		return nil
	case replicate.OpImage:
		return s.images.Receive(rec.Body)
	case replicate.OpSessionOpen:
		return s.openReplica(rec.Session, rec.Result, rec.Body)
	case replicate.OpEpoch, replicate.OpVerify, replicate.OpSnapshotEnd:
		return nil
	}
	s.mu.Lock()
	sess := s.sessions[rec.Session]
	s.mu.Unlock()
	if sess == nil {
		return fmt.Errorf("%s for unknown session %d", rec.Op, rec.Session)
	}
	switch rec.Op {
	case replicate.OpSessionClose:
		s.closeSession(sess)
		return nil
	case replicate.OpMMIO:
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return aperture.Apply(&sess.mem, rec.Body)
	case replicate.OpVerifyMMIO:
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return sess.verifyMMIO.Compare(&sess.mem, rec.Result, rec.Body)
	case replicate.OpSetNext:
		sess.mu.Lock()
		defer sess.mu.Unlock()
		if err := sess.once.Restore(rec.ReqID, rec.Body); err != nil {
			return err
		}
		return sess.objs.SetNext(handlemap.Handle(rec.Result))
	}
	return sess.apply(rec)
}

// QueueReplayedCopies lets ApplyRecord leave a record's host-to-device
// copy queued on the device (gpu.QueuedCopier) instead of waiting for it:
// the caller promises to keep each record's body unchanged until it has
// settled the copies (Mark, then Settle). A replica then applies runs of
// records while the device works through them, rather than one device
// round trip per copy.
func (s *Server) QueueReplayedCopies() { s.queueReplay.Store(true) }

// Mark notes how far every session's queued copies have come and returns
// the mark, for Settle.
func (s *Server) Mark() uint64 {
	mark := s.replayMark.Add(1)
	if err := s.eachQueued(func(q gpu.QueuedCopier) error { return q.Mark(mark) }); err != nil {
		s.log.Warn("marking queued copies", "err", err) // the backend waited for them instead
	}
	return mark
}

// Settle returns once no copy queued before Mark returned upTo (or an
// earlier mark) reads a record's body any more. An error is a queued
// copy's failure (the replica may differ from the primary); every session
// is settled all the same.
func (s *Server) Settle(upTo uint64) error {
	return s.eachQueued(func(q gpu.QueuedCopier) error { return q.Settle(upTo) })
}

// eachQueued runs fn on every open session whose context queues copies,
// under the session's lock, and returns the first error.
func (s *Server) eachQueued(fn func(gpu.QueuedCopier) error) error {
	var first error
	for _, sess := range s.sessionList() {
		sess.mu.Lock()
		q, ok := sess.ctx.(gpu.QueuedCopier)
		var err error
		if ok && !sess.closed { // closing waited for the device
			err = fn(q)
		}
		sess.mu.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("session %d: %w", sess.id, err)
		}
	}
	return first
}

// openReplica creates a standby's copy of a primary session, asking the
// backend for the same window base.
func (s *Server) openReplica(id, base uint64, body []byte) error {
	open, err := decodeSessionOpen(body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.sessions[id] != nil {
		s.mu.Unlock()
		return fmt.Errorf("session %d is already open", id)
	}
	// Once promoted, this node opens sessions of its own: their ids and
	// windows must not collide with the replicated ones.
	s.nextID = max(s.nextID, id)
	slot := s.replicaSlot(base)
	if slot < 0 {
		s.mu.Unlock()
		return fmt.Errorf("no free session slot for session %d", id)
	}
	s.slots[slot] = true
	t := s.tenantLocked(open.tenant) // counted as on the primary, not limited
	if t != nil {
		t.sessions++
	}
	s.mu.Unlock()
	sess, err := s.newSession(id, slot, open, base)
	if err != nil {
		s.giveSlotBack(slot, t)
		return err
	}
	if sess.mem.delta != 0 {
		s.log.Warn("replica window not at the primary's base; translating addresses", "session", id,
			"want", fmt.Sprintf("%#x", base), "got", fmt.Sprintf("%#x", base+sess.mem.delta))
	}
	return nil
}

// replicaSlot is the slot of the primary's window at base (the same one,
// when the windows are laid out alike), or else the first free slot.
// Precondition: s.mu must be locked.
func (s *Server) replicaSlot(base uint64) int {
	if base >= s.cfg.WindowBase && (base-s.cfg.WindowBase)%s.cfg.WindowSize == 0 {
		if i := (base - s.cfg.WindowBase) / s.cfg.WindowSize; i < uint64(len(s.slots)) && !s.slots[i] {
			return int(i)
		}
	}
	for i, used := range s.slots {
		if !used {
			return i
		}
	}
	return -1
}

// apply runs one guest operation from the log on a replica session.
func (s *Session) apply(rec *replicate.Record) error {
	op, _ := rec.Op.Guest()
	run, info := opTable[op], op.Info()
	if run == nil || !info.Mutates {
		return fmt.Errorf("record kind %s is not a state change", rec.Op)
	}
	req, err := abi.DecodeRequest(op, rec.Body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec.Flags&replicate.FlagPlaced != 0 {
		if err := s.place(info.Result, rec.Result); err != nil {
			return err
		}
	}
	if rec.Flags&replicate.FlagReadBack != 0 {
		s.noteReadBack(req)
	}
	reply, err := s.replay(run, req)
	result := abi.ResultOf(reply)
	if err == nil {
		s.once.NoteApplied(rec.ReqID, result)
		s.prefaultPlaced(rec, req, result)
	}
	if rec.ReqID != 0 { // a resync's contents carry none: no checksum pass over them
		s.once.NoteContent(rec.ReqID, rec.BodyCRC())
	}
	primaryFailed := rec.Flags&replicate.FlagFailed != 0
	switch {
	case err != nil && !primaryFailed && s.mem.delta != 0 && info.RunsKernel:
		s.markUnsafe(fmt.Sprintf("unsafe: addresses are translated and kernel launch (seq %d) failed on the replica only; it likely follows device pointers stored in memory: %v", rec.Seq, err))
	case err != nil && !primaryFailed:
		s.markUnsafe(fmt.Sprintf("%s (seq %d) failed on the replica but not on the primary: %v", op, rec.Seq, err))
	case err == nil && primaryFailed:
		s.markUnsafe(fmt.Sprintf("%s (seq %d) succeeded on the replica but failed on the primary", op, rec.Seq))
	case err == nil && result != rec.Result && rec.Flags&replicate.FlagRepair == 0:
		s.markUnsafe(fmt.Sprintf("%s (seq %d) gave %#x on the replica, %#x on the primary", op, rec.Seq, result, rec.Result))
	default:
		return nil
	}
	return fmt.Errorf("session %d: %s", s.id, s.unsafe)
}

// replay runs a replicated request's handler with the session replaying
// (its copies may stay queued), and ends that and any placement however
// the handler ends, a panic included.
// Precondition: s.mu must be locked.
func (s *Session) replay(run handler, req abi.Body) (abi.Body, error) {
	s.objs.Replaying(true)
	s.mem.queue = s.srv.queueReplay.Load()
	defer func() {
		s.objs.Replaying(false)
		s.mem.queue, s.mem.placed = false, 0
	}()
	return run(s, req)
}

// prefaultPlaced asks the backend to make an allocation that a resync
// recreated ready for its contents, which follow (gpu.Prefaulter).
// Precondition: s.mu must be locked.
func (s *Session) prefaultPlaced(rec *replicate.Record, req abi.Body, addr uint64) {
	alloc, ok := req.(*abi.Alloc)
	p, can := s.ctx.(gpu.Prefaulter)
	if ok && can && rec.Flags&replicate.FlagPlaced != 0 {
		p.Prefault(s.mem.dev(addr), alloc.Size)
	}
}

// place makes the object a resync record creates take the address or
// handle the primary gave it (kind is the op's result) instead of the
// one the standby would choose.
// Precondition: s.mu must be locked.
func (s *Session) place(kind abi.ResultKind, result uint64) error {
	switch kind {
	case abi.ResultAddress:
		s.mem.placed = result
	case abi.ResultHandle:
		return s.objs.SetNext(handlemap.Handle(result))
	}
	return nil
}

// Precondition: s.mu must be locked.
func (s *Session) markUnsafe(why string) {
	if s.unsafe == "" {
		s.unsafe = why
	}
}

// Switchover hands the primary role to the standby with nothing lost: with
// every session stopped it waits until the standby has applied the whole
// log and runs handover, which asks the standby to take over and returns
// the role the node's authority then decided for this node (fenced, once
// the standby took over or the node gave its leadership away). The server
// takes that role before any guest request can run again, whether or not
// the handover succeeded. Guests then resume on the new primary. It
// returns how long guests were stopped.
func (s *Server) Switchover(handover func() (Role, error)) (time.Duration, error) {
	if s.repl == nil {
		return 0, fmt.Errorf("this primary does not replicate")
	}
	var pause time.Duration
	var err error
	var role Role
	s.stopTheWorld(func([]*Session) {
		start := time.Now()
		if !s.repl.WaitApplied(s.repl.Last()) {
			err = fmt.Errorf("the standby is not in sync (state %+v)", s.repl.Status())
			return
		}
		role, err = handover()
		if role.Term != 0 {
			s.setRoleLocked(role)
		}
		pause = time.Since(start)
	})
	if err == nil {
		s.log.Warn("switchover: the standby took over; this node is fenced", "term", role.Term, "guest_pause", pause)
	}
	return pause, err
}
