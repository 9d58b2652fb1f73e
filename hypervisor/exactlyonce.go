package hypervisor

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
//     (never sent, sent out of order, or refused when it was) is refused:
//     answering it "done" would tell the guest of a change that never
//     happened (an allocation answered with pointer 0). The session
//     remembers which of its latest appliedWindow ids it applied
//     (appliedIDs); an older id is refused too: resends follow a failover
//     closely, and a guest's ids grow by one per request.

// maxIDJump bounds how far past the last applied request a new request's
// id may be.
const maxIDJump = 1 << 32

// sumsKept bounds the content checksums a session keeps; it prunes to the
// most recent half (resends follow a failover closely).
const sumsKept = 16384

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checkReqID decides what a state-changing request's id means: a resend
// (done: answered from state, or refused if its content differs), an id too
// far ahead (done: refused), or a new request (not done; its content's
// checksum is kept for later resends). A copy streamed from shared memory
// (inPlace) keeps no checksum: its data is read once, by the device copy;
// a resend under its id is answered from state, as one whose checksum was
// pruned.
// Precondition: s.mu must be locked.
func (s *Session) checkReqID(op abi.Opcode, reqID uint64, payload []byte, inPlace bool) (reply abi.Body, err error, done bool) {
	if reqID == 0 {
		return nil, nil, false
	}
	var sum uint32
	if !inPlace {
		sum = crc32.Checksum(payload, castagnoli)
	}
	if reqID <= s.lastReq {
		if applied, remembered := s.applied.knows(reqID); !applied {
			return nil, refuse(guesterr.UnknownRequest, abi.StatusInvalidValue, "%s", unknownRequest(reqID, s.lastReq, remembered)), true
		}
		if want, ok := s.sums[reqID]; ok && !inPlace && want != sum {
			return nil, refuse(guesterr.ReplayMismatch, abi.StatusInvalidValue,
				"request id %d was already applied with other content: a resend must repeat the request", reqID), true
		}
		return op.Info().ReplayReply(s.results[reqID]), nil, true
	}
	if reqID-s.lastReq > maxIDJump {
		return nil, refuse(guesterr.RequestID, abi.StatusInvalidValue,
			"request id %d is more than %d past the last applied request %d", reqID, uint64(maxIDJump), s.lastReq), true
	}
	if inPlace {
		delete(s.sums, reqID) // a sum left by an earlier attempt that failed is not this content's
	} else {
		s.noteContent(reqID, sum)
	}
	return nil, nil, false
}

// noteContent keeps the checksum of request reqID's payload.
// Precondition: s.mu must be locked.
func (s *Session) noteContent(reqID uint64, sum uint32) {
	if reqID == 0 {
		return
	}
	if s.sums == nil {
		s.sums = map[uint64]uint32{}
	}
	s.sums[reqID] = sum
	if len(s.sums) > sumsKept {
		for id := range s.sums {
			if id != reqID && (id > s.lastReq || s.lastReq-id > sumsKept/2) {
				delete(s.sums, id)
			}
		}
	}
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

// mark notes that request id was applied.
func (a *appliedIDs) mark(id uint64) {
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
	a.bits[id%appliedWindow/64] |= 1 << (id % 64)
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
