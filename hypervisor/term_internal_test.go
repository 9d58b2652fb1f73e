package hypervisor

import (
	"testing"
	"time"
)

// TestTermWhileWorldStopped: the term (which the replication sender's
// heartbeats carry) is readable while the server is stopped for a resync
// snapshot; a heartbeat that waited would be silence to the standby.
func TestTermWhileWorldStopped(t *testing.T) {
	srv := newSimSession(t).srv
	srv.SetRole(Role{Term: 7})
	srv.stopTheWorld(func([]*Session) {
		got := make(chan uint64, 1)
		go func() { got <- srv.Term() }()
		select {
		case term := <-got:
			if term != 7 {
				t.Errorf("term %d, want 7", term)
			}
		case <-time.After(2 * time.Second):
			t.Error("Term waited for the stopped world")
		}
	})
}
