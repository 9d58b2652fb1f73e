package hypervisor

import (
	"fmt"
	"sort"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// This file is the primary's side of replication: every state change a
// session makes is appended to a replicate.Log in execution order, replies
// obey the mode's commit rule, and a verify point is taken with every
// session stopped (a resync snapshot too, but only for a moment:
// resync.go). The standby's side, applying the records through the same
// session code, is package replica (replicas.go plugs the sessions in).

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
		s.objs.Replicate(nil, 0)
		return
	}
	s.objs.Replicate(h.log, h.session)
}

// recorder returns the session's hook into the log.
// Precondition: s.mu must be locked (or s.repl otherwise stable).
func (s *Server) recorder(id uint64) *logHook {
	return &logHook{log: s.repl, session: id, repliesWait: s.mode == replicate.ModeCommit || s.mode == replicate.ModeSync}
}

// logHook is a session's way into the replication log: it appends the
// session's state changes, and gives out drafts, log buffers that an
// in-place payload is read into once (inplace.go).
type logHook struct {
	log     *replicate.Log
	session uint64
	// repliesWait: replies wait for what the standby holds (commit and
	// sync modes). Large writes and read-backs may then go as pieces (the
	// log's fairness between sessions: replicate.Log.Piece), and large
	// reads as checks (readback.go). Never in epoch mode, whose cut may
	// fall anywhere in the log (an epoch must not end inside a request),
	// nor in async mode, where no reply waits.
	repliesWait bool
}

// piece is the most bytes a write the hook may cut goes in at once (0:
// whole).
func (h *logHook) piece() int {
	if !h.repliesWait {
		return 0
	}
	return h.log.Piece()
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

// request logs what a guest request of op (info) with payload (whose
// exactly-once sum is sum, for a request with an id) did: the
// change it made (the log takes in's draft, whose body payload is, if it
// has one), or a kernel that ran and faulted, which the standby must run
// too. A refused or non-mutating request logs nothing here (its failure,
// if it failed, is logged by outcome: failures.go). A large write goes as
// pieces where the hook may cut it (appendWritePieces).
func (h *logHook) request(op abi.Opcode, info abi.OpInfo, reqID uint64, payload []byte, sum uint32, req, reply abi.Body, err error, in *inPlaceCopy) {
	switch {
	case !info.Mutates:
	case err == nil:
		if w, ok := req.(*abi.CopyHtoD); ok && in.draft == nil && h.appendWritePieces(reqID, w, sum) {
			return
		}
		h.append(replicate.Op(op), reqID, payload, abi.ResultOf(reply), 0, in.takeDraft())
	case info.RunsKernel && !isRefusal(err):
		// The kernel ran and faulted: it may have written memory before
		// it did, and the standby must run it too.
		h.append(replicate.Op(op), reqID, payload, 0, replicate.FlagFailed, nil)
	}
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
func (s *Server) VerifyPoint(id uint64, apertures bool) []verify.ObjectSum {
	var sums []verify.ObjectSum
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
func (s *Server) Checksums() []verify.ObjectSum {
	var sums []verify.ObjectSum
	s.stopTheWorld(func(sessions []*Session) { sums = checksums(sessions) })
	return sums
}

func checksums(sessions []*Session) []verify.ObjectSum {
	var sums []verify.ObjectSum
	for _, sess := range sessions {
		sums = append(sums, verify.ObjectSum{Session: sess.id, Kind: verify.ObjSession, ID: sess.mem.Base(), Sum: verify.Checksum([]byte(sess.guest))})
		sums = append(sums, sess.verifyMMIO.Sums(sess.id)...) // a standby's verify --apertures
		for _, r := range sess.mem.Ranges() {
			sum, err := sess.mem.Checksum(r.Addr, r.Size)
			if err != nil {
				sum = 0 // reported as a mismatch
			}
			if sess.mmio == nil {
				// no aperture
			} else if fileSum, ok := sess.mmio.Sum(r.Addr); ok {
				sum = fileSum
			}
			sums = append(sums, verify.ObjectSum{Session: sess.id, Kind: verify.ObjMemory, ID: r.Addr, Size: r.Size, Sum: sum})
		}
		for _, r := range sess.mem.Reservations() {
			sums = append(sums, verify.ObjectSum{Session: sess.id, Kind: verify.ObjReservation, ID: r.Addr, Size: r.Size})
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
	r, ok := sess.mem.Allocation(addr)
	if !ok {
		return fmt.Errorf("session %d has no allocation at %#x", session, addr)
	}
	if sess.mmio != nil && sess.mmio.Resend(addr) {
		return sess.flushMMIO()
	}
	recs, err := sess.mem.ContentRecords(sess.id, r, replicate.FlagRepair)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		s.repl.Append(rec)
	}
	return nil
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

// recordTensorMap logs a tensor map over a module variable the guest was
// just given, the first time (replicate.OpTensorMap), so a standby encodes
// its own (objects/tensormaps.go).
// Precondition: s.mu must be locked; s.record is set.
func (s *Session) recordTensorMap(op abi.Opcode, reply abi.Body) {
	m, ok := reply.(*abi.TensorMapReply)
	if op != abi.OpTensorMapEncode || !ok {
		return
	}
	req, ok := s.objs.TensorMapRecord(m.Map)
	if !ok {
		return
	}
	s.record.append(replicate.OpTensorMap, 0, replicate.AppendTensorMap(nil, req, m.Map), 0, 0, nil)
	if !s.loggedTensorMap {
		s.loggedTensorMap = true
		s.srv.log.Info("the guest encodes tensor maps over module variables; its standby encodes each over its own copy",
			"session", s.id, "guest", s.guest, "global", fmt.Sprintf("%#x", req.Global))
	}
}

// recordGlobalAddr logs the address of a module variable the guest was
// just told (replicate.OpGlobalAddr), so a standby maps it to its own
// copy's in kernel arguments (objects/globalmap.go).
// Precondition: s.mu must be locked; s.record is set.
func (s *Session) recordGlobalAddr(op abi.Opcode, req, reply abi.Body) {
	g, ok := reply.(*abi.GlobalReply)
	if op != abi.OpModuleGlobal || !ok {
		return
	}
	s.record.append(replicate.OpGlobalAddr, 0, req.(*abi.ModuleGlobal).Append(nil), g.Addr, 0, nil)
}
