package pvdriver

import (
	"bytes"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// gatedBackend is the software GPU whose contexts' Sync waits for the
// test to open the gate.
type gatedBackend struct {
	*sim.Backend
	gate chan struct{}
}

type gatedContext struct {
	gpu.Context
	gate chan struct{}
}

func (b gatedBackend) NewContext(base, size uint64) (gpu.Context, error) {
	c, err := b.Backend.NewContext(base, size)
	return gatedContext{c, b.gate}, err
}

func (c gatedContext) Sync() error {
	<-c.gate
	return c.Context.Sync()
}

// TestReadsGoBehindTheWait: SynchronizeThenRead sends every read before it
// awaits the synchronisation's reply (the node holds the synchronisation
// until the test lets it go, and the reads must already be counted as
// sent), and the reads then hold the bytes the device has.
func TestReadsGoBehindTheWait(t *testing.T) {
	gate := make(chan struct{})
	conn := dialNode(t, gatedBackend{sim.New(1 << 30), gate})
	c, err := newClient(conn, nil, Options{GuestName: "g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var reads []Read
	var want [][]byte
	for i := range 3 {
		p, err := c.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		b := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		if err := c.CopyHtoD(p, b); err != nil {
			t.Fatal(err)
		}
		reads, want = append(reads, Read{Dst: make([]byte, 4096), Src: p}), append(want, b)
	}
	done := make(chan error, 1)
	go func() { done <- c.SynchronizeThenRead(reads) }()
	sentReads := func() uint64 {
		for _, s := range c.Stats() {
			if s.Op == abi.OpCopyDtoH {
				return s.Sent
			}
		}
		return 0
	}
	for deadline := time.Now().Add(10 * time.Second); sentReads() < uint64(len(reads)); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			close(gate)
			t.Fatalf("%d of %d reads sent while the synchronisation waited: they wait for its reply", sentReads(), len(reads))
		}
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := range reads {
		if !bytes.Equal(reads[i].Dst, want[i]) {
			t.Errorf("read %d: got %d…, want %d…", i, reads[i].Dst[0], want[i][0])
		}
	}
}
