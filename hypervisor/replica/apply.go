package replica

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/hypervisor/exactlyonce"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Applier applies a primary's log to a node's sessions (a standby's
// receiver.Applier, through standby.Agent).
type Applier struct {
	sessions Sessions
	metrics  Metrics
	log      *slog.Logger
	// queue: replayed copies may stay queued (QueueCopies); mark is the
	// last mark of them (Mark).
	queue atomic.Bool
	mark  atomic.Uint64
}

// New returns an applier of records to sessions.
func New(sessions Sessions, log *slog.Logger) *Applier {
	return &Applier{sessions: sessions, metrics: sessions.ReplicaMetrics(), log: log}
}

// Apply applies one replicated record. It never trusts the record: guest
// operations go through the same validation as on the primary, and the
// result must match what the primary got. Once QueueCopies was called, a
// copy the record makes from its body may still be queued on the device
// when it returns: the caller keeps rec.Body unchanged until a Settle of
// a later Mark returns.
func (a *Applier) Apply(rec *replicate.Record) (err error) {
	defer a.recoverApply(rec, &err)
	switch rec.Op {
	case replicate.OpReset:
		for _, sess := range a.sessions.Replicas() {
			a.sessions.CloseReplica(sess)
		}
		a.sessions.ResetImages()
		return nil
	case replicate.OpImage:
		return a.sessions.ReceiveImage(rec.Body)
	case replicate.OpSessionOpen:
		return a.sessions.OpenReplica(rec.Session, rec.Result, rec.Body)
	case replicate.OpEpoch, replicate.OpVerify, replicate.OpSnapshotEnd:
		return nil
	}
	sess := a.sessions.Replica(rec.Session)
	if sess == nil {
		return fmt.Errorf("%s for unknown session %d", rec.Op, rec.Session)
	}
	if rec.Op == replicate.OpSessionClose {
		a.sessions.CloseReplica(sess)
		return nil
	}
	if fn := sessionRecords[rec.Op]; fn != nil {
		sess.Lock()
		defer sess.Unlock()
		return fn(a, sess, rec)
	}
	return a.applyGuest(sess, rec)
}

// sessionRecords applies the records of one session that are not a
// guest's request, under the session's lock.
var sessionRecords = map[replicate.Op]func(*Applier, Session, *replicate.Record) error{
	replicate.OpMMIO: func(_ *Applier, s Session, rec *replicate.Record) error { return aperture.Apply(s.Memory(), rec.Body) },
	replicate.OpVerifyMMIO: func(_ *Applier, s Session, rec *replicate.Record) error {
		return s.Verify().Compare(s.Memory(), rec.Result, rec.Body)
	},
	replicate.OpRequestFailed: func(_ *Applier, s Session, rec *replicate.Record) error {
		f, err := exactlyonce.DecodeFailure(rec.Body)
		if err != nil {
			return err
		}
		if err := s.Once().CheckFailed(rec.ReqID); err != nil {
			return err
		}
		s.Once().NoteFailed(rec.ReqID, f)
		if f.Async { // reported by the stream's next synchronization, as on the primary
			s.Objects().DeferError(handlemap.Handle(f.Stream), f.Err())
		}
		return nil
	},
	replicate.OpGlobalAddr: func(a *Applier, s Session, rec *replicate.Record) error {
		req, err := abi.DecodeRequest(abi.OpModuleGlobal, rec.Body)
		if err != nil {
			return err
		}
		own, err := s.Objects().NoteGlobalAddr(req.(*abi.ModuleGlobal), rec.Result)
		if err == nil && own != rec.Result {
			a.metrics.GlobalsElsewhere.Inc()
			a.log.Warn("a module variable lies elsewhere on this node than on the primary: an address of it the guest stored in device memory will not follow a failover",
				"session", rec.Session, "variable", req.(*abi.ModuleGlobal).Name, "primary", fmt.Sprintf("%#x", rec.Result), "here", fmt.Sprintf("%#x", own))
		}
		return err
	},
	replicate.OpTensorMap: func(_ *Applier, s Session, rec *replicate.Record) error {
		req, guest, err := replicate.DecodeTensorMap(rec.Body)
		if err != nil {
			return err
		}
		return s.Objects().NoteTensorMap(req, guest)
	},
	replicate.OpErrorsReported: func(_ *Applier, s Session, rec *replicate.Record) error {
		s.Objects().ForgetDeferred(handlemap.Handle(rec.Result))
		return nil
	},
	replicate.OpSetNext: func(_ *Applier, s Session, rec *replicate.Record) error {
		if err := s.Once().Restore(rec.ReqID, rec.Body); err != nil {
			return err
		}
		return s.Objects().SetNext(handlemap.Handle(rec.Result))
	},
}

// applyGuest runs one guest operation from the log on a replica session.
func (a *Applier) applyGuest(s Session, rec *replicate.Record) error {
	op, _ := rec.Op.Guest()
	info := op.Info()
	if !info.Mutates {
		return fmt.Errorf("record kind %s is not a state change", rec.Op)
	}
	req, err := abi.DecodeRequest(op, rec.Body)
	if err != nil {
		return err
	}
	s.Lock()
	defer s.Unlock()
	if rec.Flags&replicate.FlagPlaced != 0 {
		if err := place(s, info.Result, rec.Result); err != nil {
			return err
		}
	}
	if rec.Flags&replicate.FlagReadBack != 0 {
		a.noteReadBack(s.Memory(), req)
	}
	reply, err := a.replay(s, op, req)
	result := abi.ResultOf(reply)
	if err == nil {
		s.Once().NoteApplied(rec.ReqID, result)
		if alloc, ok := req.(*abi.Alloc); ok && rec.Flags&replicate.FlagPlaced != 0 {
			s.Memory().Prefault(result, alloc.Size) // its contents follow
		}
	}
	switch {
	case rec.Flags&replicate.FlagPieces != 0: // the whole request's sum, not this piece's
		s.Once().NoteContent(rec.ReqID, uint32(rec.Result))
	case rec.ReqID != 0: // a resync's contents carry none: no checksum pass over them
		s.Once().NoteContent(rec.ReqID, rec.BodyCRC())
	}
	why := verdict(rec, op, err, result, s.Memory().Translated())
	if why == "" {
		return nil
	}
	return fmt.Errorf("session %d: %s", s.ID(), s.MarkUnsafe(why))
}

// verdict says why a record applied with err and result makes its
// replica session unsafe, or "" if the replica did what the primary did.
func verdict(rec *replicate.Record, op abi.Opcode, err error, result uint64, translated bool) string {
	primaryFailed := rec.Flags&replicate.FlagFailed != 0
	switch {
	case err != nil && !primaryFailed && translated && op.Info().RunsKernel:
		return fmt.Sprintf("unsafe: addresses are translated and kernel launch (seq %d) failed on the replica only; it likely follows device pointers stored in memory: %v", rec.Seq, err)
	case err != nil && !primaryFailed:
		return fmt.Sprintf("%s (seq %d) failed on the replica but not on the primary: %v", op, rec.Seq, err)
	case err == nil && primaryFailed:
		return fmt.Sprintf("%s (seq %d) succeeded on the replica but failed on the primary", op, rec.Seq)
	case err == nil && result != rec.Result && rec.Flags&(replicate.FlagRepair|replicate.FlagPieces) == 0:
		return fmt.Sprintf("%s (seq %d) gave %#x on the replica, %#x on the primary", op, rec.Seq, result, rec.Result)
	}
	return ""
}

// replay runs a replicated request on the session with it replaying (its
// copies may stay queued, a load by hash takes an image the log carried),
// and ends that and any placement however the handler ends, a panic
// included.
func (a *Applier) replay(s Session, op abi.Opcode, req abi.Body) (abi.Body, error) {
	s.Objects().Replaying(true)
	s.Memory().Replaying(true, a.queue.Load())
	defer func() {
		s.Objects().Replaying(false)
		s.Memory().Replaying(false, false)
	}()
	return s.Run(op, req)
}

// place makes the object a resync record creates take the address or
// handle the primary gave it (kind is the op's result) instead of the
// one the standby would choose.
func place(s Session, kind abi.ResultKind, result uint64) error {
	switch kind {
	case abi.ResultAddress:
		s.Memory().Place(result)
	case abi.ResultHandle:
		return s.Objects().SetNext(handlemap.Handle(result))
	}
	return nil
}

// noteReadBack counts a read-back that finds the replica's bytes different
// from what the guest read on the primary: the replica diverged there (a
// kernel that is not reproducible) and the record about to be applied
// repairs it.
func (a *Applier) noteReadBack(mem Memory, req abi.Body) {
	w, ok := req.(*abi.CopyHtoD)
	if !ok || len(w.Data) == 0 {
		return
	}
	if held, err := holds(mem, w.Dst, uint64(len(w.Data)), gpu.Checksum(w.Data), "read-back"); err == nil && !held {
		a.metrics.ReadBackRepairs.Inc()
	}
}

// holds reports whether mem holds, at [addr, addr+n), bytes whose checksum
// (gpu.Checksum) is sum: false where the checksum fails. err is the
// range's refusal (what names the range in it).
func holds(mem Memory, addr, n, sum uint64, what string) (bool, error) {
	if err := mem.CheckRange(addr, n, what); err != nil {
		return false, err
	}
	got, err := mem.Checksum(addr, n)
	return err == nil && got == sum, nil
}

// recoverApply is deferred around applying one record: a panic marks the
// record's session unsafe and fails the record, never the node.
func (a *Applier) recoverApply(rec *replicate.Record, err *error) {
	p := recover()
	if p == nil {
		return
	}
	a.metrics.Panics.WithLabelValues(rec.Op.String()).Inc()
	a.log.Error("recovered from a panic while applying a replicated record",
		"session", rec.Session, "op", rec.Op, "seq", rec.Seq, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	why := fmt.Sprintf("internal error applying %s (seq %d)", rec.Op, rec.Seq)
	if sess := a.sessions.Replica(rec.Session); sess != nil {
		sess.Lock()
		sess.MarkUnsafe(why)
		sess.Unlock()
	}
	*err = errors.New(why)
}

// Idle implements the standby's receiver.Idler: the session's records
// (session 0: every session's) are applied for now, and launches its
// context holds back go on to the GPU.
func (a *Applier) Idle(session uint64) {
	if session != 0 {
		if sess := a.sessions.Replica(session); sess != nil {
			sess.Idle()
		}
		return
	}
	for _, sess := range a.sessions.Replicas() {
		sess.Idle()
	}
}

// QueueCopies lets Apply leave a record's host-to-device copy queued on
// the device (gpu.QueuedCopier) instead of waiting for it: the caller
// promises to keep each record's body unchanged until it has settled the
// copies (Mark, then Settle). A replica then applies runs of records
// while the device works through them, rather than one device round trip
// per copy.
func (a *Applier) QueueCopies() { a.queue.Store(true) }

// Mark notes how far every session's queued copies have come and returns
// the mark, for Settle.
func (a *Applier) Mark() uint64 {
	mark := a.mark.Add(1)
	if err := a.eachQueued(func(q gpu.QueuedCopier) error { return q.Mark(mark) }); err != nil {
		a.log.Warn("marking queued copies", "err", err) // the backend waited for them instead
	}
	return mark
}

// Settle returns once no copy queued before Mark returned upTo (or an
// earlier mark) reads a record's body any more. An error is a queued
// copy's failure (the replica may differ from the primary); every session
// is settled all the same.
func (a *Applier) Settle(upTo uint64) error {
	return a.eachQueued(func(q gpu.QueuedCopier) error { return q.Settle(upTo) })
}

// Checksums describes every object, for a standby answering verify.
func (a *Applier) Checksums() []verify.ObjectSum { return a.sessions.Checksums() }

// eachQueued runs fn on every open session whose context queues copies,
// under the session's lock, and returns the first error.
func (a *Applier) eachQueued(fn func(gpu.QueuedCopier) error) error {
	var first error
	for _, sess := range a.sessions.Replicas() {
		sess.Lock()
		q, ok := sess.Memory().Queued()
		var err error
		if ok && !sess.Closed() { // closing waited for the device
			err = fn(q)
		}
		sess.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("session %d: %w", sess.ID(), err)
		}
	}
	return first
}
