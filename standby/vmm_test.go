package standby_test

import (
	"bytes"
	"testing"

	"github.com/vgpuha/vgpuha/replicate"
)

// TestResyncKeepsMappings: a standby resynced while a guest holds a
// reservation with mappings in it gets them as reservation and mappings,
// where the primary has them (also with its window elsewhere: translated),
// with their contents: after the resync the guest unmaps, maps again and
// frees its reservation, the standby applies each, and both stay
// identical. (testdata/vmm.c in pvdriver/libcuda fails a guest over.)
func TestResyncKeepsMappings(t *testing.T) {
	for _, shift := range []uint64{0, 1 << 40} {
		c := newCluster(t, replicate.ModeCommit, shift, false)
		g := c.guest("vmm")
		const gran = 2 << 20
		res, err := g.ReserveAddress(8*gran, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte{1, 2, 3, 5, 8, 13, 21}, 1000)
		steps := []func() error{
			func() error { return g.Map(res, gran) },
			func() error { return g.Map(res+gran, 2*gran) },
			func() error { return g.CopyHtoD(res+gran+100, data) },
		}
		for i, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("shift %#x, step %d: %v", shift, i, err)
			}
		}
		c.startStandby()
		c.waitProtected()
		mustMatch(t, c.verify())
		steps = []func() error{
			func() error { return g.Unmap(res, gran) },
			func() error { return g.Map(res+4*gran, gran) },
			func() error { return g.Memset8(res+4*gran, 7, gran) },
		}
		for i, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("shift %#x, step %d after the resync: %v", shift, i, err)
			}
		}
		mustMatch(t, c.verify())
		got := make([]byte, len(data))
		if err := g.CopyDtoH(got, res+gran+100); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("shift %#x: read back %v (equal %v)", shift, err, bytes.Equal(got, data))
		}
		if err := g.Unmap(res+gran, 2*gran); err != nil {
			t.Fatal(err)
		}
		if err := g.Unmap(res+4*gran, gran); err != nil {
			t.Fatal(err)
		}
		if err := g.FreeAddress(res, 8*gran); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Alloc(4096); err != nil { // verify compares objects: leave one
			t.Fatal(err)
		}
		mustMatch(t, c.verify())
		c.Close()
	}
}
