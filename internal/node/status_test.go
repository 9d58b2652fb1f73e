package node_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// docFields reads docs/STATUS.md's tables: each documented field (dotted
// under its section) and the series its row names.
func docFields(t *testing.T) (fields map[string]bool, series []string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/STATUS.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\|([^|]*)\\|")
	name := regexp.MustCompile("`(vgpuha_[a-z_]+)`")
	fields = map[string]bool{}
	prefix := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## Top level"):
			prefix = ""
		case strings.HasPrefix(line, "#") && strings.Contains(line, " replication.resync"):
			prefix = "replication.resync."
		case strings.HasPrefix(line, "#") && strings.Contains(line, " replication.standbys"):
			prefix = "replication.standbys."
		case strings.HasPrefix(line, "#") && strings.Contains(line, " replication.refused_peers"):
			prefix = "replication.refused_peers."
		case strings.HasPrefix(line, "## tenancy"):
			prefix = "tenancy."
		case strings.HasPrefix(line, "#") && strings.Contains(line, " tenancy.tenants"):
			prefix = "-" // a list: its elements' keys are not walked
		case strings.HasPrefix(line, "## replication"):
			prefix = "replication."
		case strings.HasPrefix(line, "## promotion"):
			prefix = "promotion."
		case strings.HasPrefix(line, "## "):
			prefix = "-"
		}
		if m := row.FindStringSubmatch(line); m != nil && prefix != "-" {
			fields[prefix+m[1]] = true
			for _, s := range name.FindAllStringSubmatch(m[2], -1) {
				series = append(series, s[1])
			}
		}
	}
	return fields, series
}

// jsonFields lists a status's JSON keys, dotted (objects that are null
// list only their own key).
func jsonFields(t *testing.T, st node.Status) map[string]bool {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	out := map[string]bool{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			out[prefix+k] = true
			if list, ok := v.([]any); ok && k == "standbys" && len(list) > 0 {
				v = list[0] // each element has the same keys
			}
			if sub, ok := v.(map[string]any); ok && k != "sessions" {
				walk(prefix+k+".", sub)
			}
		}
	}
	walk("", m)
	return out
}

func seriesNames(t *testing.T, regs ...*prometheus.Registry) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			out[mf.GetName()] = true
		}
	}
	return out
}

// TestOneStatusSchema: a primary, its standby, the standby once promoted
// (and protected by a third node), and that node once fenced by a
// switchover all answer /status in the one documented shape, with their
// role's values; every series the document names is exported, the
// promoted standby's vgpuha_replication_* included.
func TestOneStatusSchema(t *testing.T) {
	dir := t.TempDir()
	ep := func(name string) string { return "unix://" + filepath.Join(dir, name) }
	docs, series := docFields(t)
	check := func(name string, st node.Status, want func(node.Status) bool) {
		t.Helper()
		got := jsonFields(t, st)
		// resync and promotion may be null, standbys empty: their inner
		// keys are checked where they are present.
		for f := range docs {
			inner := strings.HasPrefix(f, "promotion.") && st.Promotion == nil ||
				strings.HasPrefix(f, "replication.resync.") && st.Replication.Resync == nil ||
				strings.HasPrefix(f, "replication.standbys.") && len(st.Replication.Standbys) == 0
			if !got[f] && !inner {
				t.Errorf("%s: /status lacks documented %s", name, f)
			}
		}
		for f := range got {
			if !docs[f] {
				t.Errorf("%s: /status has %s, which docs/STATUS.md does not describe", name, f)
			}
		}
		if !want(st) {
			b, _ := json.MarshalIndent(st, "", "  ")
			t.Errorf("%s: unexpected status\n%s", name, b)
		}
	}

	lnC, lnB := listen(t), listen(t)
	c, err := node.StartStandby(config(t, ep("c.sock")), lnC)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	regB, regA := prometheus.NewRegistry(), prometheus.NewRegistry()
	cfgB := config(t, ep("b.sock"))
	cfgB.ReplicateTo, cfgB.Registry = []string{lnC.Addr().String()}, regB
	b, err := node.StartStandby(cfgB, lnB)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfgA := config(t, ep("a.sock"))
	cfgA.ReplicateTo, cfgA.Registry = []string{lnB.Addr().String()}, regA
	a, err := node.StartPrimary(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, ep("a.sock"), pvdriver.Options{GuestName: "g", Failover: []string{ep("b.sock"), ep("c.sock")}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if p, err := g.Alloc(4096); err != nil || g.CopyHtoD(p, make([]byte, 4096)) != nil || g.Synchronize() != nil {
		t.Fatalf("guest: %v", err)
	}
	waitFor(t, "A protected by B", protected(a))
	waitFor(t, "B applied everything", func() bool {
		r := a.Status().Replication
		return r.LastSequence > 0 && r.AppliedSequence == r.LastSequence
	})
	waitFor(t, "B heard A", func() bool { return b.Status().Replication.HeartbeatAgeSeconds != nil })

	check("primary", a.Status(), func(s node.Status) bool {
		r := s.Replication
		return s.Role == "primary" && s.Term == 1 && s.Serving && s.Promotion == nil && len(s.Sessions) == 1 &&
			s.DeviceMemoryBytes == 4096 && r.Direction == node.ToStandby && r.LagRecords == 0 &&
			r.State == "protected" && r.Protected && r.InSync && r.Connected && r.Peer == lnB.Addr().String() && r.Mode == "commit"
	})
	check("standby", b.Status(), func(s node.Status) bool {
		r := s.Replication
		return s.Role == "standby" && s.Term == 1 && !s.Serving && s.Promotion == nil && len(s.Sessions) == 1 &&
			s.DeviceMemoryBytes == 4096 && r.Direction == node.FromPrimary && r.AppliedSequence > 0 &&
			r.State == "in_sync" && r.InSync && r.Connected && !r.Protected && *r.HeartbeatAgeSeconds < 5
	})
	if got := seriesNames(t, regB); got["vgpuha_replication_protected"] {
		t.Error("a standby exports vgpuha_replication_protected before it replicates")
	}

	a.Log().Close() // a crash: nothing more reaches B
	a.Close()
	waitFor(t, "B promoted", func() bool { return b.Promoted() != nil })
	waitFor(t, "B protected by C", protected(b))
	check("promoted standby", b.Status(), func(s node.Status) bool {
		r := s.Replication
		return s.Role == "primary" && s.Term == 2 && s.Serving && s.Promotion != nil && s.Promotion.Term == 2 &&
			s.Promotion.DetectionSeconds > 0 && r.Direction == node.ToStandby && r.State == "protected" &&
			r.Peer == lnC.Addr().String() && r.HeartbeatAgeSeconds == nil
	})
	got := seriesNames(t, regA, regB)
	for _, s := range series {
		if !got[s] {
			t.Errorf("docs/STATUS.md names %s, which neither the primary nor the promoted standby exports", s)
		}
	}
	promoted := seriesNames(t, regB)
	for _, s := range []string{"vgpuha_replication_protected", "vgpuha_replication_lag_records", "vgpuha_replication_applied_sequence"} {
		if !promoted[s] {
			t.Errorf("the promoted standby does not export %s (has %v)", s, slices.Sorted(maps.Keys(promoted)))
		}
	}

	if _, _, err := b.Switchover(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	check("fenced", b.Status(), func(s node.Status) bool {
		return s.Role == "fenced" && s.Term == 3 && !s.Serving && s.Promotion != nil
	})
	waitFor(t, "C promoted", func() bool { return c.Promoted() != nil })
	check("promoted without a standby", c.Status(), func(s node.Status) bool {
		r := s.Replication
		return s.Role == "primary" && s.Term == 3 && s.Serving && r.Direction == node.NoPeer && r.State == "off"
	})
}
