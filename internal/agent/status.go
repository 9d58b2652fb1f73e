package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/node"
)

// nodeStatusOptions say how `vgpuha status --admin` shows a node.
type nodeStatusOptions struct {
	addr, tokenFile string
	asJSON          bool
	// watch: poll again every watch until ctx ends (0: once).
	watch time.Duration
	// tty: out is a terminal, so a watch redraws the screen and a resync
	// is a bar; otherwise every poll is one plain line.
	tty bool
}

// fetchNodeStatus reads one node's /status (node.Status, every role's
// shape) and its raw JSON.
func fetchNodeStatus(addr, tokenFile string) (node.Status, []byte, error) {
	var st node.Status
	body, err := adminRequest("GET", addr, "/status", tokenFile, 5*time.Second)
	if err != nil {
		return st, nil, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, nil, fmt.Errorf("decoding %s's status: %w", addr, err)
	}
	return st, body, nil
}

// showNodeStatus prints one node's status once or, with o.watch, until ctx
// ends.
func showNodeStatus(ctx context.Context, out io.Writer, o nodeStatusOptions) error {
	for {
		st, body, err := fetchNodeStatus(o.addr, o.tokenFile)
		switch {
		case err != nil && o.watch == 0:
			return err
		case err != nil:
			fmt.Fprintf(out, "%s node=%s error=%q\n", time.Now().Format(watchTime), o.addr, err.Error())
		case o.asJSON:
			out.Write(body)
		case o.watch > 0 && !o.tty:
			fmt.Fprintln(out, statusLine(time.Now(), o.addr, st))
		default:
			if o.watch > 0 {
				fmt.Fprint(out, "\033[H\033[2J") // home, clear: redraw like watch(1)
			}
			if err := printStatusTable(out, o.addr, st, o.tty); err != nil {
				return err
			}
		}
		if o.watch == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.watch):
		}
	}
}

// printStatusTable writes the node's row and, while a resync runs, its
// progress (a bar on a terminal, a plain line otherwise).
func printStatusTable(out io.Writer, addr string, st node.Status, tty bool) error {
	r := st.Replication
	hb := "-"
	if r.HeartbeatAgeSeconds != nil {
		hb = fmt.Sprintf("%.3f", *r.HeartbeatAgeSeconds)
	}
	peer := r.Peer
	if peer == "" {
		peer = "-"
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tROLE\tTERM\tSERVING\tSESSIONS\tREPLICATION\tSTATE\tPEER\tLAG RECORDS\tLAG BYTES\tLAG s\tHEARTBEAT AGE s")
	fmt.Fprintf(w, "%s\t%s\t%d\t%v\t%d\t%s\t%s\t%s\t%d\t%d\t%.3f\t%s\n", addr, st.Role, st.Term, st.Serving, len(st.Sessions),
		r.Direction, r.State, peer, r.LagRecords, r.LagBytes, r.LagSeconds, hb)
	if err := w.Flush(); err != nil {
		return err
	}
	if err := printGPUs(out, st); err != nil {
		return err
	}
	if p := st.Promotion; p != nil {
		fmt.Fprintf(out, "promoted to term %d at %s (%.3f s of silence, serving %.3f s later)\n",
			p.Term, p.Serving.Format(time.RFC3339), p.DetectionSeconds, p.PromotionSeconds)
	}
	if r.LastError != "" && r.State != "protected" && r.State != "in_sync" {
		fmt.Fprintf(out, "last replication error: %s\n", r.LastError)
	}
	if r.Resync != nil {
		if tty {
			fmt.Fprintln(out, resyncBar(*r.Resync, 30))
		} else {
			fmt.Fprintln(out, resyncPlain(*r.Resync))
		}
	}
	return nil
}

// printGPUs writes the node's GPUs, the sessions placed on each (ids,
// with the admin token) and their memory.
func printGPUs(out io.Writer, st node.Status) error {
	placed := map[int][]string{}
	for _, s := range st.Sessions {
		if s.ID != 0 {
			placed[s.GPU] = append(placed[s.GPU], fmt.Sprint(s.ID))
		}
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GPU\tUUID\tNAME\tSESSIONS\tPROMISED\tUSED\tMEMORY\tSPARES\tSESSION IDS")
	for _, g := range st.GPUs {
		ids := strings.Join(placed[g.Index], ",")
		if ids == "" {
			ids = "-"
		}
		name := g.Name
		if g.Unhealthy != "" {
			name += " (unhealthy: takes no guests)"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%d/%d\t%s\n", g.Index, g.UUID, name, g.Sessions,
			humanBytes(float64(g.PromisedBytes)), humanBytes(float64(g.UsedBytes)), humanBytes(float64(g.MemoryBytes)), g.Spares, g.SparesKept, ids)
	}
	return w.Flush()
}

// resyncBar draws a resync's progress for a terminal:
// resync [#######.......]  45%  1.2 GiB / 2.7 GiB  310.0 MiB/s  ETA 5s
func resyncBar(p node.Resync, width int) string {
	frac := 0.0
	if p.BytesTotal > 0 {
		frac = min(1, float64(p.BytesDone)/float64(p.BytesTotal))
	}
	full := int(frac * float64(width))
	return fmt.Sprintf("resync [%s%s] %3.0f%%  %s / %s  %s/s  ETA %s", strings.Repeat("#", full), strings.Repeat(".", width-full),
		frac*100, humanBytes(float64(p.BytesDone)), humanBytes(float64(p.BytesTotal)), humanBytes(p.RateBytesPerSecond), eta(p.ETASeconds))
}

// resyncPlain is a resync's progress as one plain line (logs, pipes).
func resyncPlain(p node.Resync) string {
	return fmt.Sprintf("resync bytes_done=%d bytes_total=%d rate_bytes_per_second=%.0f eta_seconds=%.1f",
		p.BytesDone, p.BytesTotal, p.RateBytesPerSecond, p.ETASeconds)
}

// watchTime stamps a watch's lines (milliseconds: polls may be closer
// than a second).
const watchTime = "2006-01-02T15:04:05.000Z07:00"

// statusLine is one poll of a watch as one logfmt line, for a log file.
func statusLine(now time.Time, addr string, st node.Status) string {
	r := st.Replication
	line := fmt.Sprintf("%s node=%s role=%s term=%d serving=%v sessions=%d replication=%s state=%s lag_records=%d lag_bytes=%d lag_seconds=%.3f",
		now.Format(watchTime), addr, st.Role, st.Term, st.Serving, len(st.Sessions), r.Direction, r.State, r.LagRecords, r.LagBytes, r.LagSeconds)
	if p := r.Resync; p != nil {
		line += fmt.Sprintf(" resync_bytes_done=%d resync_bytes_total=%d resync_rate_bytes_per_second=%.0f resync_eta_seconds=%.1f",
			p.BytesDone, p.BytesTotal, p.RateBytesPerSecond, p.ETASeconds)
	}
	return line
}

// humanBytes writes n bytes in binary units (KiB, MiB, GiB, TiB).
func humanBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for ; n >= 1024 && i < len(units)-1; i++ {
		n /= 1024
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// eta writes a time left in whole seconds ("-" before a rate is known).
func eta(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	return (time.Duration(seconds+0.5) * time.Second).String()
}

// IsTerminal reports whether f is a terminal (a character device).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
