package drill

import (
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// TestStateVerify: a filled state reads back equal; one byte changed (or
// a chunk holding another chunk's pattern) fails with its offset.
func TestStateVerify(t *testing.T) {
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.Guest("state")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const n = 3 * stateChunk
	s, err := fillState(g, n, 7, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.verify(); err != nil || got != n {
		t.Fatalf("fresh state: %d bytes verified, %v", got, err)
	}
	at := uint64(stateChunk + 12345)
	if err := g.CopyHtoD(s.bufs[0]+pvdriver.DevicePtr(at), []byte{0}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.verify(); err == nil || got != at || !strings.Contains(err.Error(), "state byte 1060921 of 3145728 differs") {
		t.Fatalf("one byte changed at %d: %d bytes verified, %v", at, got, err)
	}
	// Chunk 1 restored, then chunk 2 given chunk 0's pattern.
	if err := g.Memset32(s.bufs[0]+stateChunk, patternWord(7, 1), stateChunk/4); err != nil {
		t.Fatal(err)
	}
	if err := g.CopyDtoD(s.bufs[0]+2*stateChunk, s.bufs[0], stateChunk); err != nil {
		t.Fatal(err)
	}
	if got, err := s.verify(); err == nil || got != 2*stateChunk {
		t.Fatalf("a chunk with another's pattern: %d bytes verified, %v", got, err)
	}
}
