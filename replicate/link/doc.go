// Package link owns the bytes between a primary and a standby: the
// authenticated, encrypted, framed TCP connection (Conn: a pre-shared-key
// handshake, AES-256-GCM per direction under counter nonces, a CRC over
// each frame's header and tag), sealing and opening large frames on
// several workers while frames still go out and are handled in counter
// order (InOrder, BulkWriter), a record larger than PartBytes cut into
// parts, the receive buffers lent to the standby's applier (Lender: heap,
// or one page-locked region used as a ring), the fault hook tests drop
// and delay messages with, and the authenticated UDP heartbeats.
//
// It carries opaque payloads: it never decodes a record, never applies
// one, and never decides who may stream (package admission) or what a
// message means (package replicate). It must never hand out a frame that
// failed its checksum or tag, nor one out of counter order, nor reuse a
// counter.
package link
