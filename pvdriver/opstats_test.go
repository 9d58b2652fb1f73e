package pvdriver_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestStats: the client counts what it sent per opcode, and which of those
// the caller waited for: pipelined memsets are sent, not waited for; a
// synchronization and a read are.
func TestStats(t *testing.T) {
	g := plainGuest(t, cluster.Options{})
	p, err := g.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := g.Memset(p, 1, 7, 4096, 0, false); err != nil { // async: not waited for
			t.Fatal(err)
		}
	}
	if err := g.Synchronize(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if err := g.CopyDtoH(buf, p); err != nil {
		t.Fatal(err)
	}
	got := map[abi.Opcode]pvdriver.OpStats{}
	for _, s := range g.Stats() {
		got[s.Op] = s
	}
	if s := got[abi.OpMemset]; s.Sent != 5 || s.Waited != 0 {
		t.Errorf("memset: %+v, want 5 sent, none waited for", s)
	}
	if s := got[abi.OpSync]; s.Sent != 1 || s.Waited != 1 || s.Wait <= 0 {
		t.Errorf("sync: %+v, want 1 sent and waited for", s)
	}
	if s := got[abi.OpCopyDtoH]; s.Sent == 0 || s.Waited != s.Sent {
		t.Errorf("copy_dtoh: %+v, want every piece waited for", s)
	}
	var out bytes.Buffer
	pvdriver.WriteStats(&out, g.Stats())
	if !strings.Contains(out.String(), "memset") || !strings.Contains(out.String(), "total") {
		t.Errorf("the table lacks rows:\n%s", out.String())
	}
}
