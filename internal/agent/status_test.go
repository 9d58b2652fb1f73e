package agent

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/node"
)

// resyncing is a standby halfway through a 3 GiB resync at 100 MiB/s.
var resyncing = node.Status{Role: "standby", Term: 4, Replication: node.Replication{Direction: node.FromPrimary,
	Peer: "10.0.0.1:40000", State: "resyncing", Connected: true,
	Resync: &node.Resync{BytesDone: 3 << 29, BytesTotal: 3 << 30, RateBytesPerSecond: 100 << 20, ETASeconds: 15.36}}}

// TestStatusRendering: a resync is a bar on a terminal and one plain line
// (no \r, no escape sequences) otherwise; a watch's line is logfmt.
func TestStatusRendering(t *testing.T) {
	cases := []struct {
		tty  bool
		want []string
	}{
		{true, []string{"resync [###############...............]  50%  1.5 GiB / 3.0 GiB  100.0 MiB/s  ETA 15s\n"}},
		{false, []string{"resync bytes_done=1610612736 bytes_total=3221225472 rate_bytes_per_second=104857600 eta_seconds=15.4\n"}},
	}
	for _, c := range cases {
		var out bytes.Buffer
		if err := printStatusTable(&out, "n1", resyncing, c.tty); err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^n1 +standby +4 +false +0 +from_primary +resyncing +10\.0\.0\.1:40000 +0 +0 +0\.000 +- *$`).Match(out.Bytes()) {
			t.Errorf("tty=%v: no status row:\n%s", c.tty, out.String())
		}
		for _, w := range c.want {
			if !strings.HasSuffix(out.String(), w) {
				t.Errorf("tty=%v: output does not end with %q:\n%s", c.tty, w, out.String())
			}
		}
		if strings.ContainsAny(out.String(), "\r\033") {
			t.Errorf("tty=%v: carriage return or escape in %q", c.tty, out.String())
		}
	}
	line := statusLine(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), "n1", resyncing)
	want := "2025-01-02T03:04:05.000Z node=n1 role=standby term=4 serving=false sessions=0 replication=from_primary state=resyncing " +
		"lag_records=0 lag_bytes=0 lag_seconds=0.000 resync_bytes_done=1610612736 resync_bytes_total=3221225472 " +
		"resync_rate_bytes_per_second=104857600 resync_eta_seconds=15.4"
	if line != want {
		t.Errorf("watch line:\n got %s\nwant %s", line, want)
	}
	for _, c := range []struct {
		done, total uint64
		bar         string
	}{{0, 0, "[....]   0%"}, {0, 10, "[....]   0%"}, {10, 10, "[####] 100%"}, {20, 10, "[####] 100%"}, {3, 4, "[###.]  75%"}} {
		if got := resyncBar(node.Resync{BytesDone: c.done, BytesTotal: c.total}, 4); !strings.HasPrefix(got, "resync "+c.bar) {
			t.Errorf("bar for %d/%d: %q, want %q", c.done, c.total, got, c.bar)
		}
	}
	for n, want := range map[float64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1.5 * (1 << 30): "1.5 GiB", 1 << 50: "1024.0 TiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%v) = %q, want %q", n, got, want)
		}
	}
	for s, want := range map[float64]string{0: "-", 0.4: "0s", 0.6: "1s", 61: "1m1s"} {
		if got := eta(s); got != want {
			t.Errorf("eta(%v) = %q, want %q", s, got, want)
		}
	}
}
