// Package replicate owns the primary-to-standby replication protocol: the
// operation log (Log), the primary's end of the link (Sender), the standby's
// end (Receiver), the records they exchange, the replication modes, resync
// from a snapshot, and verification (package verify).
//
// It knows nothing of sessions or GPUs: the hypervisor appends records and
// builds snapshots, the standby applies them through the Applier interface.
// It must never apply anything from a peer that has not proved it holds the
// pre-shared key, nor a frame that fails its checksum or authentication tag
// (see package link), nor let a primary it does not follow touch its replica: a
// standby follows one pair's primaries, under rising terms, and refuses
// every other one before it lets go of its link (see package admission).
//
//	primary (Sender, dials)                            standby (Receiver, listens)
//	  |--- TCP connect ------------------------------------>|
//	  |<-- "VGRA" v6, nonceS --------------------------------|  another version: refused
//	  |--- "VGRA" v6, nonceP, HMAC(key, P|nonceS|nonceP) --->|  refuse + close on mismatch
//	  |<-- HMAC(key, S|nonceP|nonceS) -----------------------|  primary refuses on mismatch
//	  |        ... every frame below: AES-256-GCM, per-direction keys, counter nonces ...
//	  |        ... a record over 1 MiB: record_begin {size}, then its encoding in 1 MiB
//	  |            parts, one frame each, sealed on the sender's workers; the standby
//	  |            opens them on workers straight into one buffer and handles the
//	  |            record once its last part is (see "Records on the link" below) ...
//	  |--- identity {group, primary id, term, last seq} --->|  admission rules (admission):
//	  |<-- refused {reason, whom it follows} ----------------|  another group, a lower term,
//	  |    (counted, logged; a lower term fences the node)   |  another primary at the term,
//	  |<-- fenced {term} (a promoted standby) ---------------|  a rewound log: refused, the
//	  |    or, admitted (the previous link, if any, closed): |  replica and link untouched
//	  |<-- state {log id, applied seq} ----------------------|
//	  |--- mode --------------------------------------------->|
//	  | same log id and the log still holds applied+1...:    |
//	  |--- records applied+1 ... last ---------------------->|  catch up
//	  | otherwise (fresh, restarted, or too far behind):     |
//	  |    stop every session: BeginSnapshot (position S),   |  guest pause: O(objects),
//	  |    objects, backend memory snapshot; guests resume   |  not O(memory)
//	  |--- reset {log id, contents bytes} ------------------->|  drop the replica; not in sync
//	  |--- objects (placed allocs, modules, handles) -------->|  rebuild
//	  |--- contents, 4 MiB records, paced (guests running) -->|  state at S; progress logged
//	  |    (read ahead, device memory straight into the      |  opened on workers,
//	  |     record; sealed in parts on workers, written in    |  handled in order
//	  |     counter order;                                    |
//	  |     the log keeps S+1...: half the resync budget at   |
//	  |     once (or a guest share's burst), the rest as the  |
//	  |     snapshot goes out; a write                        |
//	  |     past it waits at most the resync stall, at the    |
//	  |     budget for the stream; one larger: start over)    |
//	  |--- snapshot end {S} --------------------------------->|  applied = S, in sync
//	  |--- record S+1, S+2, ... (live) ---------------------->|  validate, translate, apply
//	  |    (batches of up to 16 MiB taken from the log: large |
//	  |     records sealed on workers, small ones on the      |
//	  |     sender; written in counter order, flushed per     |
//	  |     batch, so a lone small record goes out at once)   |
//	  |    (protected once the standby applied what the log  |
//	  |     held at the snapshot's end and lags < 4 MiB)     |
//	  |<-- ack {held seq, applied seq} (pauses, each MiB) ----|  read and apply run apart
//	  |    (commit-mode replies wait for held, sync for       |
//	  |     applied; a promoted standby applies all it holds) |
//	  |    (log releases acked records; guests waiting on the |
//	  |     commit rule wake; a silent standby is dropped)    |
//	  |--- verify {id} (in-stream, at one log position) ----->|
//	  |<-- checksums {id, objects} ---------------------------|
//	  |--- read check {range, sum} (a large read; its reply ->|  applied in its session's
//	  |    waits until the standby applied it)               |  order; own bytes summed
//	  |<-- read need {seq} (bytes differ: before the ack) ----|
//	  |--- the read's bytes (a read-back), then the reply --->|
//
// Records on the link (package link, package receiver): AES-GCM runs at 2-4 GB/s a
// core, below a fast link, so one record must not be sealed or opened on
// one core. The sender queues each batch's frames on a link.BulkWriter: a
// frame of 64 KiB or more is sealed on one of up to four workers, out of
// the log's copy (which stays, for a standby that reconnects) into the
// writer's own buffers, and frames are written in the order of their
// counters, which were fixed when queued, by one goroutine (link.InOrder); a
// backlog streams batch after batch without draining the link between
// them. A record of more than 1 MiB
// (link.PartBytes) goes as a record_begin frame with its size and then its
// encoding cut into 1 MiB parts, so its parts are sealed at once like
// separate records. The standby reads frames in order; it opens a
// record_begin at once (the size is authenticated and bounded by
// link.MaxRecordBytes before a buffer that large is lent), checks each part's
// length as it reads it, opens parts on workers straight into their
// place in the record's buffer, and handles the record when its last
// part's turn comes, after every frame before it. A part that fails to
// open, a part out of place, anything else between parts or a link cut
// off mid-record ends the link, and the record is given back, never
// applied. A record frame below 64 KiB is opened by the reader, unless
// frames before it are still being opened: then it is copied into a
// buffer of its own and waits for its turn like them (a guest's mix of
// large copies and small calls otherwise held the reader to one record at
// a time). The worker that opens a guest request's record also takes the
// CRC-32C of its body (Record.BodyCRC), the exactly-once sum the
// hypervisor keeps, so the applier does not.
//
// Applying (package receiver, link.Lender): one applier applies records in
// order. A record of 64 KiB or more is read into a lent buffer: from the
// heap, or on a GPU standby carved from one page-locked region used as a
// ring, exactly as large as the record. It may be applied with its copy
// left queued on the device (a Settler replica): the receiver keeps the
// buffer until that work is settled, marking it every 32 MiB of buffers
// and settling the mark before the last, so the device works through one
// run while the applier queues the next, and settling everything once no
// record came for 1 ms. Queued work counts as applied for acks:
// the replica's device runs it in order before anything after it, as it
// runs the memsets and launches that never waited.
//
// Resync (resync.go, Snapshot) is a point-in-time snapshot streamed while
// guests run, not pre-copy: the node stops its guests only to fix S and
// take a snapshot of device memory that the backend can keep cheaply
// (copy-on-write on the software GPU, a device-to-device copy on CUDA), so
// the pause is bounded by the number of objects, not the bytes. Pre-copy
// (copy, then re-copy what changed) needs to know what a launch wrote,
// which no one does for a kernel that writes through pointers it read
// from memory; a snapshot at S plus the log after S is exact for every
// kind of write, and the contents cross the link once. The price is the
// backend's extra memory for pages written before they are sent, and a
// log that holds everything after S until the standby catches up (the
// resync budget: by default a quarter of the snapshot, at least 1 GiB, so
// that guests writing while a large snapshot streams keep a share of the
// link instead of waiting for it; see DefaultResyncBudget). An operator
// who would rather have the pair protected sooner than keep guests fast
// sets a guest share (SetResyncGuestShare): guests then earn room in the
// log only in proportion to the snapshot bytes sent, and get that share
// of what a catching-up standby drains. It is off by default: with 16
// GiB and bench resync's mixed workload (guests writing about a fifth of
// the link) a share of 0.11 made the resync 6% shorter (5.8 s against 6.2,
// five runs each on two H200s) and cut guests from 0.62-0.70 of their
// call rate to 0.48-0.61, below the half they are promised. This package never
// reads device memory or knows what a record's body means: it pulls
// records and counts bytes.
//
// A primary may stream to several standbys at once: one Log, one Sender
// (and one cursor in the log) per standby, each going through the
// exchange above on its own. The log keeps a record until every standby
// that holds a position in it applied it, bounded as for one standby (a
// standby that falls behind past the bound is dropped and resynced, never
// waited for past it unless the commit rule counts it). The commit rule
// waits for the sync set, the first k caught-up standbys in priority
// order; peers.go says what happens with fewer than k, and why (the rule
// operators know from PostgreSQL's synchronous_standby_names and Patroni's
// synchronous_node_count).
//
// Modes (Mode) decide what a guest waits for ("the standby": every
// standby of the sync set): sync, every synchronous reply
// waits for the standby to apply everything before it; commit, only replies
// that carry something out (data, handles, addresses, errors, syncs) wait;
// async, nothing waits and the log bound limits the lag; epoch, the standby
// buffers records and applies an epoch only when the next epoch record
// arrives, and discards an uncommitted one at failover.
//
// The log is one ordered stream, so a reply the mode holds waits for every
// record before it, whoever logged it. It is shared fairly between guest
// sessions (fairness.go): a session may hold at most its share of bytes
// the sync set has not received (SetSessionShare), past which it waits
// for its own backlog, and the hypervisor logs large writes and read-backs
// in pieces (Log.Piece, FlagPieces) so other sessions' records go in
// between. Nothing is reordered: each session's order and the log's one
// sequence stay as they are.
//
// Replication replays the guest's operations, which holds only where a
// kernel run twice writes the same bytes. Kernels with floating-point
// atomics do not, and frameworks use them unasked, so the log also carries
// what the guest saw: a read of device memory becomes a write of the bytes
// read (FlagReadBack), which a standby applies like any write. A module
// image that guests name by hash travels once per resync (OpImage) and is
// named by hash after that. A guest request that failed travels too
// (OpRequestFailed), and so does a synchronization that reported
// asynchronous failures (OpErrorsReported): the standby answers a resend
// of a failed request with its failure, and reports a pipelined one's at
// the next synchronization, exactly once, whichever node serves it.
package replicate
