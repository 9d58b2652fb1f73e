package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/admin"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

func runVerify(args []string) error {
	fs := cli.NewFlags("verify", "--admin HOST:PORT [--json] [--repair] [--apertures]")
	adminAddr := cli.String(fs, "admin", DefaultAdmin, checkAdminAddr, "the primary's admin address (HOST:PORT or unix:///PATH)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	repair := fs.Bool("repair", false, "copy every diverged allocation from the primary to the standby")
	apertures := fs.Bool("apertures", false, "also compare each aperture's bytes (the guest's file) with its device copy on the primary and on the standby, "+
		"reporting mismatched bytes and the first mismatched offset per side (sends the apertures' bytes to the standby)")
	tokenFile := adminTokenFlag(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	body, err := postAdminToken(*adminAddr, fmt.Sprintf("/verify?repair=%v&apertures=%v", *repair, *apertures), *tokenFile, 60*time.Second)
	if err != nil {
		return err
	}
	var rep verify.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("decoding report: %w", err)
	}
	if *asJSON {
		os.Stdout.Write(body)
	} else {
		printVerify(rep)
	}
	if !rep.Match && rep.Repaired == 0 {
		return fmt.Errorf("replica differs from the primary")
	}
	return nil
}

// printVerify prints a verify report as tables.
func printVerify(rep verify.Report) {
	fmt.Printf("verified %d objects (%d bytes) at one log position: match=%v\n", rep.Objects, rep.Bytes, rep.Match)
	if len(rep.Mismatches) > 0 {
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SESSION\tKIND\tID\tSIZE\tPRIMARY\tSTANDBY\tREPAIRABLE")
		for _, m := range rep.Mismatches {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%v\n", m.Session, m.Kind, m.ID, m.Size, m.Primary, m.Standby, m.Repairable)
		}
		tw.Flush()
	}
	printApertures(rep.Apertures)
	if rep.Repaired > 0 {
		fmt.Printf("repaired %d objects; run verify again to confirm\n", rep.Repaired)
	}
}

// printApertures prints verify --apertures' table: per aperture and node,
// the bytes of its device copy that differ from the guest's file.
func printApertures(checks []verify.ApertureCheck) {
	if len(checks) == 0 {
		return
	}
	side := func(s verify.ApertureSide) string {
		switch {
		case s.Missing:
			return "not compared"
		case s.MismatchedBytes == 0:
			return "match"
		}
		return fmt.Sprintf("%d bytes differ from offset %#x", s.MismatchedBytes, s.FirstOffset)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tAPERTURE\tSIZE\tPRIMARY\tSTANDBY")
	for _, c := range checks {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", c.Session, c.ID, c.Size, side(c.Primary), side(c.Standby))
	}
	tw.Flush()
}

func runSwitchover(args []string) error {
	fs := cli.NewFlags("switchover", "--admin HOST:PORT")
	adminAddr := cli.String(fs, "admin", DefaultAdmin, checkAdminAddr, "the primary's admin address (HOST:PORT or unix:///PATH)")
	tokenFile := adminTokenFlag(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	body, err := postAdminToken(*adminAddr, "/switchover", *tokenFile, 30*time.Second)
	if err != nil {
		return err
	}
	var rep struct {
		Pause float64 `json:"guest_pause_seconds"`
		Term  uint64  `json:"term"`
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("decoding %s's answer %q: %w", *adminAddr, body, err)
	}
	fmt.Printf("switched over: the standby serves under term %d; %s is fenced; guests paused %.1f ms\n", rep.Term, *adminAddr, rep.Pause*1000)
	return nil
}

// unreachable is a failed admin request as one line that says what to
// check.
func unreachable(addr string, err error) error {
	var op *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no admin endpoint at %s (connection refused): is the node running with --admin-listen %s?", addr, addr)
	case errors.Is(err, os.ErrDeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout"):
		return fmt.Errorf("%s did not answer in time (a node stopped or frozen, or a firewall dropping the admin port)", addr)
	case strings.Contains(err.Error(), "malformed HTTP"):
		return fmt.Errorf("%s is not a vgpuha admin endpoint: it does not answer HTTP (a guest endpoint, --guest-listen, or a replication port, --listen?); "+
			"give the node's --admin-listen address", addr)
	case errors.As(err, &op):
		return fmt.Errorf("cannot reach the admin endpoint %s: %v", addr, op.Err)
	}
	return fmt.Errorf("cannot reach the admin endpoint %s: %v", addr, err)
}

// postAdmin POSTs to a node's admin endpoint and returns the body of a
// 200 reply, or the node's error.
func postAdmin(addr, path string, timeout time.Duration) ([]byte, error) {
	return postAdminToken(addr, path, "", timeout)
}

// postAdminToken is postAdmin presenting the admin token held in tokenFile
// (none if empty: a unix:// admin socket needs none).
func postAdminToken(addr, path, tokenFile string, timeout time.Duration) ([]byte, error) {
	return adminRequest(http.MethodPost, addr, path, tokenFile, timeout)
}

// adminRequest sends one request to a node's admin endpoint, with the
// admin token held in tokenFile if it is set, and returns the body of a
// 200 reply, or the node's error.
func adminRequest(method, addr, path, tokenFile string, timeout time.Duration) ([]byte, error) {
	c, base := adminClient(addr, timeout)
	req, err := http.NewRequest(method, base+path, nil)
	if err != nil {
		return nil, err
	}
	if tokenFile != "" {
		toks, err := admin.ReadTokens(tokenFile)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+string(toks[0]))
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, unreachable(addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s: %s", addr, resp.Status, strings.Join(strings.Fields(string(body)), " "))
	}
	return body, nil
}
