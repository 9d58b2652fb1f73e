package hypervisor

import (
	"errors"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/exactlyonce"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/objects"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Requests that fail, and failover.
//
// A state-changing request that fails (a check refused it, or its kernel
// faulted) is answered as surely as one that was applied: the session's
// exactly-once table notes its failure (exactlyonce.Table.NoteFailed), and
// the log carries it (replicate.OpRequestFailed) for the standby to note
// too. A guest's resume check (every request up to the hello reply's
// Applied was answered) then counts it as answered, not as lost, and the
// guest sees its failure once, whichever node tells it:
//
//   - a synchronous request: its error reply (a commit point: it waits
//     until the standby holds the failure);
//   - an asynchronous one: the error at its stream's next synchronization.
//     The standby keeps it for that stream too, and forgets it once the
//     primary logs that a synchronization reported it
//     (replicate.OpErrorsReported, logged before that reply, which waits
//     for it);
//   - a resend after a failover: the same failure (kept again for the
//     stream's next synchronization if the resend is asynchronous), never
//     a second run: a refused request never becomes applied on the node
//     that takes over.

// answerResend answers a request the exactly-once table answered (a
// resend): an asynchronous resend of a request that failed gets its
// failure at its stream's next synchronization, as it would have the
// first time (an error reply to a pipelined request ends the guest's
// connection).
// Precondition: s.mu must be locked.
func (s *Session) answerResend(r guestconn.Request, req, reply abi.Body, err error) (abi.Body, error) {
	if r.Async && errors.Is(err, exactlyonce.ErrFailedBefore) {
		s.objs.DeferError(handlemap.Handle(abi.StreamOf(req)), err)
		return nil, guesterr.Deferred{Err: err}
	}
	return reply, err
}

// noteOutcome notes a new state-changing request's outcome in the
// exactly-once table, and returns the failure of one that failed.
// Precondition: s.mu must be locked.
func (s *Session) noteOutcome(op abi.Opcode, r guestconn.Request, req, reply abi.Body, err error) *exactlyonce.Failure {
	if err == nil {
		s.once.NoteApplied(r.ID, abi.ResultOf(reply))
		return nil
	}
	f := exactlyonce.NewFailure(op, err, r.Async, abi.StreamOf(req))
	f.Sum, f.Summed = s.once.Sum(r.ID)
	s.once.NoteFailed(r.ID, f)
	return &f
}

// failuresToReport lists, before a request that changes nothing runs (a
// synchronization may report failures kept for their stream), the
// streams that have a failure kept: logHook.outcome tells the standby
// which of them it reported.
// Precondition: s.mu must be locked.
func (s *Session) failuresToReport(info abi.OpInfo) []handlemap.Handle {
	if info.Mutates || s.record == nil {
		return nil
	}
	return s.objs.DeferredStreams()
}

// outcome logs what the standby must know of a request besides its
// change: its failure (request reqID's, if it failed), and which failures
// kept for the streams in reporting it reported (those objs no longer
// keeps).
func (h *logHook) outcome(reqID uint64, failure *exactlyonce.Failure, reporting []handlemap.Handle, objs *objects.Set) {
	if failure != nil {
		h.append(replicate.OpRequestFailed, reqID, failure.Append(nil), 0, 0, nil)
	}
	for _, stream := range reporting {
		if _, kept := objs.Deferred(stream); !kept {
			h.append(replicate.OpErrorsReported, 0, nil, uint64(stream), 0, nil)
		}
	}
}

// deferUnread keeps the failure of a pipelined request the connection
// refused without reading it (over the node's buffer budget) for the
// null stream's next synchronization, and, for a new state-changing
// request, notes and logs it as failed like one the session refused.
func (s *Session) deferUnread(op abi.Opcode, reqID uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs.DeferError(0, err)
	if !op.Info().Mutates || !s.once.IsNew(reqID) {
		return
	}
	f := exactlyonce.NewFailure(op, err, true, 0)
	s.once.NoteFailed(reqID, f)
	if s.record != nil {
		s.record.outcome(reqID, &f, nil, s.objs)
	}
}

// failureRecords carries to a standby that resyncs the failures the
// session's table keeps (as answered, not to be reported again) and the
// failures kept for its streams' next synchronization (without an id).
// Precondition: s.mu must be locked.
func (s *Session) failureRecords() []replicate.Record {
	var recs []replicate.Record
	ids, fs := s.once.Failures()
	for i, f := range fs {
		f.Async = false
		recs = append(recs, replicate.Record{Session: s.id, Op: replicate.OpRequestFailed, ReqID: ids[i], Body: f.Append(nil)})
	}
	for _, stream := range s.objs.DeferredStreams() {
		err, _ := s.objs.Deferred(stream)
		f := exactlyonce.NewFailure(abi.OpStreamSync, err, true, uint64(stream)) // the op is not kept: the synchronization reports it
		recs = append(recs, replicate.Record{Session: s.id, Op: replicate.OpRequestFailed, Body: f.Append(nil)})
	}
	return recs
}
