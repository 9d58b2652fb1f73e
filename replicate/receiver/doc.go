// Package receiver is the standby's end of the replication link: it
// accepts a primary's authenticated link, admits or refuses it (package
// admission's rules: authentication, a promoted node's fence, a deposed
// term, another group or primary), runs the admitted link's stream phase
// (frames read in order, large ones and record parts opened on workers,
// acks on their own goroutine) and applies records in order to its
// Replica (the applier, holding receive buffers until a Settler replica's
// queued work settled them).
//
// It owns the standby's replication positions (the log it follows, what
// it received and applied), its resync progress and its refusals. It
// must never decide a role or a term: its Replica's role authority does,
// and tells it (RefuseBelow, Fence); nor apply a record out of order or
// one that did not authenticate.
// Package replicate owns the records, the log and the wire codecs both
// ends share.
package receiver
