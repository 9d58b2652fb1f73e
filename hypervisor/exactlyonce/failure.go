package exactlyonce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Failure is how a guest request failed: what the guest was told (or,
// for an asynchronous request, will be told at its stream's next
// synchronization). It travels in the log (Append, DecodeFailure) so
// that a standby answers a resend of the request with it.
type Failure struct {
	Op     abi.Opcode
	Status abi.Status
	// Message is the failure's text, at most maxFailureMessage bytes.
	Message string
	// Async: the guest pipelined the request; its failure waits for the
	// next synchronization of Stream.
	Async  bool
	Stream uint64
	// Sum is the request payload's checksum, when Summed (a copy read in
	// place has none): a resend with other content is refused.
	Sum    uint32
	Summed bool
}

// ErrFailedBefore marks the answer to a resend of a request that failed
// when it was first sent: the same failure, not a second run.
var ErrFailedBefore = errors.New("failed when first sent")

// maxFailureMessage bounds a failure's text in the table and the log.
const maxFailureMessage = 1024

// failuresKept bounds the failures a table keeps (the recent ones).
const failuresKept = 1024

// NewFailure describes request op's failure err.
func NewFailure(op abi.Opcode, err error, async bool, stream uint64) Failure {
	msg := err.Error()
	if len(msg) > maxFailureMessage {
		msg = msg[:maxFailureMessage]
	}
	return Failure{Op: op, Status: guesterr.StatusOf(err), Message: msg, Async: async, Stream: stream}
}

// Err is the failure as the guest sees it.
func (f Failure) Err() error { return guesterr.Fail(f.Status, "%s", f.Message) }

// again is the answer to a resend of request reqID, which failed with f.
func (f Failure) again(reqID uint64) error {
	return guesterr.Fail(f.Status, "%s (request %d %w; a resend is not run again)", f.Message, reqID, ErrFailedBefore)
}

// NoteFailed records that new request reqID (IsNew) failed with f: it is the
// session's last answered request, not an applied one, and a resend of
// it is answered with f. The failure's checksum, if it has one, is kept
// for later resends (a primary noted it already as the request came in).
func (t *Table) NoteFailed(reqID uint64, f Failure) {
	if reqID == 0 {
		return
	}
	if f.Summed {
		t.NoteContent(reqID, f.Sum)
	}
	t.last = max(t.last, reqID)
	t.applied.mark(reqID, false)
	if t.failed == nil {
		t.failed = map[uint64]Failure{}
	}
	t.failed[reqID] = f
	if len(t.failed) > failuresKept {
		for id := range t.failed {
			if t.last-id >= failuresKept/2 {
				delete(t.failed, id)
			}
		}
	}
}

// IsNew reports whether reqID is a new request the table may note: past
// the last answered one, and not too far past it (Check).
func (t *Table) IsNew(reqID uint64) bool {
	return reqID > t.last && reqID-t.last <= maxIDJump
}

// CheckFailed refuses a failure of request reqID that the log reports
// (a standby's check of its primary's record): an applied request cannot
// have failed, and an id too far ahead would make later ids resends.
func (t *Table) CheckFailed(reqID uint64) error {
	if applied, _ := t.applied.knows(reqID); applied && reqID != 0 {
		return fmt.Errorf("request %d failed on the primary, but this replica applied it", reqID)
	}
	if reqID > t.last && reqID-t.last > maxIDJump {
		return fmt.Errorf("request %d failed on the primary, more than %d past the last answered request %d", reqID, uint64(maxIDJump), t.last)
	}
	return nil
}

// Sum returns the checksum the table keeps of request reqID's payload.
func (t *Table) Sum(reqID uint64) (sum uint32, ok bool) {
	return t.sums.get(reqID)
}

// Failures returns the failures the table keeps, by request id in
// order (a resync snapshot carries them).
func (t *Table) Failures() (ids []uint64, fs []Failure) {
	ids = slices.Sorted(maps.Keys(t.failed))
	for _, id := range ids {
		fs = append(fs, t.failed[id])
	}
	return ids, fs
}

// Failure flags in the encoding.
const (
	failureAsync = 1 << iota
	failureSummed
)

// failureHeader is an encoded Failure's size before its message: op (2),
// flags (2), status (4), stream (8), sum (4).
const failureHeader = 2 + 2 + 4 + 8 + 4

// Append encodes f into b (the body of a replicate.OpRequestFailed record).
func (f Failure) Append(b []byte) []byte {
	var flags uint16
	if f.Async {
		flags |= failureAsync
	}
	if f.Summed {
		flags |= failureSummed
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(f.Op))
	b = binary.LittleEndian.AppendUint16(b, flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(f.Status))
	b = binary.LittleEndian.AppendUint64(b, f.Stream)
	b = binary.LittleEndian.AppendUint32(b, f.Sum)
	return append(b, f.Message...)
}

// DecodeFailure decodes Append's encoding (network input on a standby).
func DecodeFailure(b []byte) (Failure, error) {
	if len(b) < failureHeader || len(b) > failureHeader+maxFailureMessage {
		return Failure{}, fmt.Errorf("request failure of %d bytes, want %d to %d", len(b), failureHeader, failureHeader+maxFailureMessage)
	}
	flags := binary.LittleEndian.Uint16(b[2:])
	if flags&^(failureAsync|failureSummed) != 0 {
		return Failure{}, fmt.Errorf("request failure with unknown flags %#x", flags)
	}
	f := Failure{
		Op:      abi.Opcode(binary.LittleEndian.Uint16(b)),
		Async:   flags&failureAsync != 0,
		Summed:  flags&failureSummed != 0,
		Status:  abi.Status(binary.LittleEndian.Uint32(b[4:])),
		Stream:  binary.LittleEndian.Uint64(b[8:]),
		Sum:     binary.LittleEndian.Uint32(b[16:]),
		Message: string(b[failureHeader:]),
	}
	if !f.Op.Valid() {
		return Failure{}, fmt.Errorf("request failure of unknown op %d", uint16(f.Op))
	}
	return f, nil
}
