package standby_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/replicate"
)

// TestReadChecks: a guest's large read goes on the link as a check, not as
// its bytes. Where the standby's bytes differ from what the guest read
// (a replica changed behind replication's back, as a kernel with
// floating-point atomics leaves it), the standby asks, the bytes follow
// before the guest has its reply, and verify matches; a read of bytes the
// standby holds adds a few dozen bytes to the link; after a SIGKILL of
// the primary the guest reads on the standby what it read before.
func TestReadChecks(t *testing.T) {
	c := failoverCluster(t, replicate.ModeCommit)
	g := c.guest("g")
	const n = 4 * replicate.DefaultReadCheckMin
	p, err := g.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{7}, n)
	if err := g.CopyHtoD(p, want); err != nil {
		t.Fatal(err)
	}
	mustMatch(t, c.verify())
	replica.New(c.Standby.Server(), quiet()).Apply(&replicate.Record{Session: g.Session(), Op: replicate.Op(4 /* copy_htod */), Flags: replicate.FlagRepair,
		Body: appendCopy(uint64(p)+100, []byte{1, 2, 3})})

	read := func(what string) uint64 {
		t.Helper()
		before := c.Sender.Status().SentBytes
		got := make([]byte, n)
		if err := g.CopyDtoH(got, p); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the guest read other bytes than it wrote", what)
		}
		return c.Sender.Status().SentBytes - before
	}
	if sent := read("a read the standby holds differently"); sent < n {
		t.Fatalf("the standby's bytes differ, yet the link carried %d bytes for a read of %d", sent, n)
	}
	mustMatch(t, c.verify())
	if sent := read("a read the standby holds"); sent >= 1024 {
		t.Fatalf("a read of %d bytes the standby holds put %d bytes on the link", n, sent)
	}
	if sent := read("the same read again"); sent >= 1024 {
		t.Fatalf("again: %d bytes", sent)
	}

	c.KillPrimary()
	c.waitPromoted(10 * time.Second)
	got := make([]byte, n)
	if err := g.CopyDtoH(got, p); err != nil {
		t.Fatalf("reading on the promoted standby: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("after the failover the guest read other bytes than before it")
	}
	if fo := g.Failovers(); len(fo) != 1 {
		t.Fatalf("failovers %+v, want one", fo)
	}
}
