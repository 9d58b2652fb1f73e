package hypervisor

import (
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// ExpireDetached frees the sessions whose grace has run out by the
// server's clock (what each session's timer does), for tests that move
// their own clock.
func (s *Server) ExpireDetached() { s.expireDetached() }

// SessionEnding notes a session being let go (what a connection's end
// does) until the returned function is called.
func (s *Server) SessionEnding() func() { return s.sessionEnding() }

// SessionOpenRecord is the record a primary logs when a guest opens
// session id at base with the given resume token and grace period.
func SessionOpenRecord(id, base uint64, guest, tenant string, token []byte, grace time.Duration) replicate.Record {
	open := sessionOpen{Guest: guest, Token: token, Tenant: tenant, Grace: grace, GraceKnown: true}
	return replicate.Record{Session: id, Op: replicate.OpSessionOpen, Result: base, Body: open.Append(nil)}
}

// handle runs one request whose body is its payload, as a connection
// hands it over with nothing out of the frame (Serve).
func (s *Session) handle(op abi.Opcode, reqID uint64, async bool, payload []byte) (abi.Body, error) {
	return s.Serve(guestconn.Request{Op: op, ID: reqID, Async: async, Payload: payload})
}
