package replica

import (
	"github.com/vgpuha/vgpuha/replicate"
)

// ReadMatches implements receiver.ReadChecker: whether the replica holds,
// where a read check (replicate.OpReadCheck) names, bytes of the checksum
// the guest read on the primary. It runs after every record of its
// session before it (other sessions' records may be applied beside it,
// under their own locks): the replica's bytes there are what the
// primary's were when the guest read them, unless a kernel that is not
// reproducible wrote them. False where it cannot tell (no such session,
// a malformed check, a range outside the session's memory, a failed
// checksum): the primary then logs the bytes.
func (a *Applier) ReadMatches(rec *replicate.Record) bool {
	c, err := replicate.DecodeReadCheck(rec.Body)
	if err != nil {
		return false
	}
	sess := a.sessions.Replica(rec.Session)
	if sess == nil {
		return false
	}
	sess.Lock()
	defer sess.Unlock()
	if sess.Closed() {
		return false
	}
	held, err := holds(sess.Memory(), c.Addr, c.N, c.Sum, "read check")
	return err == nil && held // the bytes, if they come, count as a repair (noteReadBack)
}
