package hypervisor

import (
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
//     is refused, counted and logged, not silently answered "done".

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
		if want, ok := s.sums[reqID]; ok && !inPlace && want != sum {
			return nil, refuse(refusedReplayMismatch, abi.StatusInvalidValue,
				"request id %d was already applied with other content: a resend must repeat the request", reqID), true
		}
		return op.Info().ReplayReply(s.results[reqID]), nil, true
	}
	if reqID-s.lastReq > maxIDJump {
		return nil, refuse(refusedRequestID, abi.StatusInvalidValue,
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
