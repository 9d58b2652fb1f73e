// Package replicate owns the primary-to-standby replication protocol: the
// operation log (Log), the primary's end of the link (Sender), the standby's
// end (Receiver), the records they exchange, the replication modes, resync
// from a snapshot, and verification (Verifier, Compare).
//
// It knows nothing of sessions or GPUs: the hypervisor appends records and
// builds snapshots, the standby applies them through the Applier interface.
// It must never apply anything from a peer that has not proved it holds the
// pre-shared key, nor a frame that fails its checksum or authentication tag
// (see wire.go).
//
//	primary (Sender, dials)                            standby (Receiver, listens)
//	  |--- TCP connect ------------------------------------>|
//	  |<-- "VGRA" v1, nonceS --------------------------------|
//	  |--- "VGRA" v1, nonceP, HMAC(key, P|nonceS|nonceP) --->|  refuse + close on mismatch
//	  |<-- HMAC(key, S|nonceP|nonceS) -----------------------|  primary refuses on mismatch
//	  |        ... every frame below: AES-256-GCM, per-direction keys, counter nonces ...
//	  |<-- state {log id, applied seq} ----------------------|
//	  |--- mode --------------------------------------------->|
//	  | same log id and the log still holds applied+1...:    |
//	  |--- records applied+1 ... last ---------------------->|  catch up
//	  | otherwise (fresh, restarted, or too far behind):     |
//	  |    stop every session, BeginSnapshot (position S)    |  guest pause measured here
//	  |--- reset {log id} ----------------------------------->|  drop the replica
//	  |--- snapshot records (placed allocs, contents, handles)|  rebuild
//	  |--- snapshot end {S} --------------------------------->|  applied = S
//	  |--- record S+1, S+2, ... (live) ---------------------->|  validate, translate, apply
//	  |<-- ack {held seq, applied seq} (pauses, >= 10/s) -----|  read and apply run apart
//	  |    (commit-mode replies wait for held, sync for       |
//	  |     applied; a promoted standby applies all it holds) |
//	  |    (log releases acked records; guests waiting on the |
//	  |     commit rule wake; a silent standby is dropped)    |
//	  |--- verify {id} (in-stream, at one log position) ----->|
//	  |<-- checksums {id, objects} ---------------------------|
//
// Modes (Mode) decide what a guest waits for: sync, every synchronous reply
// waits for the standby to apply everything before it; commit, only replies
// that carry something out (data, handles, addresses, errors, syncs) wait;
// async, nothing waits and the log bound limits the lag; epoch, the standby
// buffers records and applies an epoch only when the next epoch record
// arrives, and discards an uncommitted one at failover.
package replicate
