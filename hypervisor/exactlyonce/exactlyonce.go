// Package exactlyonce is a session's table of the guest requests it
// answered: what makes a request resent after a failover take effect once.
//
// It owns the last answered request id, the results and payload checksums
// of recent requests, the window of ids known applied, and the failures of
// recent requests that failed (Failure, with its encoding in the log); the
// primary fills it as requests run, a standby as it applies their records,
// and a resync carries it (AppendApplied, Restore, Failures). It must
// never run a request or trust an id: a resend it cannot vouch for is
// refused, and a request that failed is answered with its failure again,
// never run a second time.
package exactlyonce

import (
	"encoding/binary"
	"fmt"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"hash/crc32"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Exactly once across a failover: a guest numbers its requests, and a
// state-changing request whose id is at or below the last one the session
// applied is a resend, answered from the session's state instead of run
// again. Two guest mistakes (or attacks) must not turn that into harm:
//   - an id far ahead (2^64−1) would make every later id look like a
//     resend, so a new id may lead the last applied one by at most
//     maxIDJump (a guest's ids grow by one per request);
//   - a resend under an applied id with other content is not a resend: it
//     is refused, counted and logged, not silently answered "done";
//   - an id at or below the last applied one that the session never applied
//     (never sent, or sent out of order) is refused: answering it "done"
//     would tell the guest of a change that never happened (an allocation
//     answered with pointer 0). The session remembers which of its latest
//     appliedWindow ids it applied (appliedIDs); an older id is refused
//     too: resends follow a failover closely, and a guest's ids grow by one
//     per request.
//
// A new request that fails (refused by a check, or a kernel that faulted)
// is answered too: its id counts as the session's last (Last), not as
// applied, and its failure is kept (NoteFailed). The primary logs the
// failure (the standby notes it the same way), so that a guest's resume
// check (pvdriver: the node holds everything up to the hello reply's
// Applied) counts a failed request as answered, not as lost, and a resend
// of it gets the same failure instead of being run: a refused request
// never becomes applied after a failover.

// maxIDJump bounds how far past the last applied request a new request's
// id may be.
const maxIDJump = 1 << 32

// sumsKept bounds the content checksums a session keeps: those of its
// latest requests (resends follow a failover closely).
const sumsKept = 16384

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// resultsKept bounds the results a table keeps (the recent ones: resends
// follow a failover closely).
const resultsKept = 8192

// Table is one session's exactly-once state. Its user serialises calls
// (the session's lock).
type Table struct {
	// last is the guest's newest request whose state change the session
	// holds; results keeps what recent ones returned. A request resent
	// after a failover with an id up to last is answered from here
	// instead of being run twice.
	last    uint64
	results recent[uint64]
	// applied remembers which of the latest ids were applied: an id at or
	// below last that was not is refused.
	applied appliedIDs
	// sums holds a checksum of each recent request's payload, so that a
	// resend under an applied id with other content is refused.
	sums recent[uint32]
	// failed keeps the failures of recent requests that failed, so that a
	// resend of one is answered with its failure.
	failed map[uint64]Failure
}

// Last is the newest request id the session answered: applied, or failed
// (NoteFailed). The guest holds every answer up to it.
func (t *Table) Last() uint64 { return t.last }

// NoteApplied records that request reqID changed state and returned result.
func (t *Table) NoteApplied(reqID, result uint64) {
	if reqID == 0 {
		return
	}
	t.last = max(t.last, reqID)
	t.applied.mark(reqID, true)
	if result != 0 {
		t.results.put(reqID, result, resultsKept)
	} else {
		t.results.drop(reqID)
	}
}

// AppendApplied encodes which requests were applied (the body of a resync
// snapshot's OpSetNext record: a standby that resyncs knows what the
// primary applied).
func (t *Table) AppendApplied(b []byte) []byte { return t.applied.append(b) }

// Restore takes what a resync record carries: the primary's last applied
// id and its window of applied ids (AppendApplied's encoding).
func (t *Table) Restore(last uint64, applied []byte) error {
	a, err := decodeAppliedIDs(applied)
	if err != nil {
		return err
	}
	t.last, t.applied = max(t.last, last), a
	return nil
}

// Sum is the content checksum the table keeps of a request's payload
// (CRC32C; a frame reader that summed the payload on its way in has it
// already: abi.Frame.PayloadSum).
func Sum(payload []byte) uint32 { return crc32.Checksum(payload, castagnoli) }

// Check decides what a state-changing request's id means: a resend
// (done: answered from state, or refused if its content differs), an id too
// far ahead (done: refused), or a new request (not done; its content's
// checksum, sum, is kept for later resends). A copy streamed from shared
// memory (inPlace) keeps no checksum (sum is ignored): its data is read
// once, by the device copy; a resend under its id is answered from state,
// as one whose checksum was pruned.
func (t *Table) Check(op abi.Opcode, reqID uint64, sum uint32, inPlace bool) (reply abi.Body, err error, done bool) {
	if reqID == 0 {
		return nil, nil, false
	}
	if reqID <= t.last {
		applied, remembered := t.applied.knows(reqID)
		f, failed := t.failed[reqID]
		switch {
		case !applied && !(failed && remembered):
			return nil, guesterr.Refuse(guesterr.UnknownRequest, abi.StatusInvalidValue, "%s", unknownRequest(reqID, t.last, remembered)), true
		case !inPlace && t.sumDiffers(reqID, sum):
			return nil, guesterr.Refuse(guesterr.ReplayMismatch, abi.StatusInvalidValue,
				"request id %d was already answered with other content: a resend must repeat the request", reqID), true
		case !applied:
			return nil, f.again(reqID), true
		}
		result, _ := t.results.get(reqID)
		return op.Info().ReplayReply(result), nil, true
	}
	if reqID-t.last > maxIDJump {
		return nil, guesterr.Refuse(guesterr.RequestID, abi.StatusInvalidValue,
			"request id %d is more than %d past the last applied request %d", reqID, uint64(maxIDJump), t.last), true
	}
	if inPlace {
		t.sums.drop(reqID) // a sum left by an earlier attempt that failed is not this content's
	} else {
		t.NoteContent(reqID, sum)
	}
	return nil, nil, false
}

// sumDiffers reports whether the table keeps a checksum of request
// reqID's payload other than sum.
func (t *Table) sumDiffers(reqID uint64, sum uint32) bool {
	kept, ok := t.Sum(reqID)
	return ok && kept != sum
}

// NoteContent keeps the checksum of request reqID's payload.
func (t *Table) NoteContent(reqID uint64, sum uint32) {
	if reqID == 0 {
		return
	}
	t.sums.put(reqID, sum, sumsKept)
}

// unknownRequest says why a request id at or below the last applied one
// is refused.
func unknownRequest(reqID, last uint64, remembered bool) string {
	if !remembered {
		return fmt.Sprintf("request id %d is older than the %d latest requests this session remembers (its last applied is %d): it cannot say whether it applied it", reqID, appliedWindow, last)
	}
	return fmt.Sprintf("request id %d was never applied by this session (its last applied is %d): a resend must repeat a request that was sent, a new request needs an id past %d", reqID, last, last)
}

// appliedWindow is how many of its latest request ids a session
// remembers as applied or not.
const appliedWindow = sumsKept

// appliedIDs remembers which of the ids (top-appliedWindow, top] a
// session applied: bit id%appliedWindow of bits.
type appliedIDs struct {
	top  uint64
	bits [appliedWindow / 64]uint64
}

// mark notes that request id was answered, and whether it was applied.
func (a *appliedIDs) mark(id uint64, applied bool) {
	switch {
	case id == 0 || id <= a.top && a.top-id >= appliedWindow:
		return
	case id > a.top && id-a.top >= appliedWindow:
		a.bits = [appliedWindow / 64]uint64{} // none of the window's ids was applied
		a.top = id
	case id > a.top:
		for i := a.top + 1; i < id; i++ { // the ids skipped were not applied
			a.bits[i%appliedWindow/64] &^= 1 << (i % 64)
		}
		a.top = id
	}
	if applied {
		a.bits[id%appliedWindow/64] |= 1 << (id % 64)
	} else {
		a.bits[id%appliedWindow/64] &^= 1 << (id % 64)
	}
}

// knows reports whether id was applied, and whether it is recent enough
// to be remembered at all (an id past top was not applied).
func (a *appliedIDs) knows(id uint64) (applied, remembered bool) {
	switch {
	case id > a.top:
		return false, true
	case a.top-id >= appliedWindow:
		return false, false
	}
	return a.bits[id%appliedWindow/64]&(1<<(id%64)) != 0, true
}

// appliedIDsBytes is an encoded appliedIDs' size: top, then the bits.
const appliedIDsBytes = 8 + appliedWindow/8

// append encodes a into b (the body of a snapshot's OpSetNext record: a
// standby that resyncs knows what the primary applied).
func (a *appliedIDs) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, a.top)
	for _, w := range a.bits {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b
}

// decodeAppliedIDs decodes an encoded appliedIDs; an empty body knows of
// no request.
func decodeAppliedIDs(b []byte) (appliedIDs, error) {
	var a appliedIDs
	switch len(b) {
	case 0:
		return a, nil
	case appliedIDsBytes:
	default:
		return a, fmt.Errorf("applied request ids of %d bytes, want %d", len(b), appliedIDsBytes)
	}
	a.top = binary.LittleEndian.Uint64(b)
	for i := range a.bits {
		a.bits[i] = binary.LittleEndian.Uint64(b[8+8*i:])
	}
	return a, nil
}
