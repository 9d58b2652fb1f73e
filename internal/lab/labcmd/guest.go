package labcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// guestReport is what `vgpuha guest --json` prints.
type guestReport struct {
	Endpoint  string            `json:"endpoint"`
	Session   uint64            `json:"session"`
	Workloads []workload.Result `json:"workloads"`
	Verified  bool              `json:"verified"`
}

func runGuest(args []string) error {
	fs := cli.NewFlags("guest", "--endpoint ENDPOINT --workload NAME [flags]")
	endpoint := cli.String(fs, "endpoint", "unix:///tmp/vgpuha.sock", agent.CheckEndpoint, "hypervisor endpoint (the primary's --guest-listen)")
	name := cli.String(fs, "workload", "all", func(v string) error { _, err := workload.Select(v); return err },
		fmt.Sprintf("workload to run: one of %v, a comma-separated list of them, or all", workload.Names()))
	size := cli.Int(fs, "size", 0, 0, 1<<30, "problem size (elements; matrix dimension for matmul; nodes for pointer_chase); 0 for each workload's default")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	guestName := fs.String("name", "guest", "guest name shown in the hypervisor's status")
	failoverTo := fs.String("failover", "", "comma-separated endpoints (the standby's) to resume the session on if the hypervisor is lost")
	hold := fs.Bool("hold", false, "keep the session (and its device memory) open after the workloads until SIGINT/SIGTERM; each SIGUSR1 meanwhile runs the workloads again on it")
	pin := fs.String("gpu", "", "the node's GPU to run on, by index or UUID (what VGPUHA_GPU asks of the guest library; empty: the node places the session)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	ws, err := workload.Select(*name)
	if err != nil {
		return err
	}
	c, err := guestOpen(*endpoint, *guestName, *failoverTo, *pin)
	if err != nil {
		return err
	}
	defer c.Close() // after --hold: the session lives until then
	rep, err := runWorkloads(context.Background(), c, ws, *size)
	if err != nil {
		return err
	}
	rep.Endpoint = *endpoint
	if err := printGuest(rep, *asJSON); err != nil {
		return err
	}
	if *hold {
		holdSession(c, ws, *size)
	}
	return nil
}

// holdSession keeps the session until SIGINT/SIGTERM, running the
// workloads again on each SIGUSR1 (after a failover: on the node that
// took over) and saying how each round went.
func holdSession(c *pvdriver.Client, ws []workload.Workload, size int) {
	fmt.Fprintln(os.Stderr, "guest: holding the session open until SIGINT/SIGTERM")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGUSR1)
	defer signal.Stop(again)
	for round := 2; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-again:
		}
		rep, err := runWorkloads(ctx, c, ws, size)
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "guest: round %d failed: %v\n", round, err)
		case !rep.Verified:
			fmt.Fprintf(os.Stderr, "guest: round %d: some results are wrong\n", round)
		default:
			fmt.Fprintf(os.Stderr, "guest: round %d verified\n", round)
		}
	}
}

// printGuest prints the report (a table, or JSON) and fails when a result
// is wrong.
func printGuest(rep guestReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printResults(os.Stdout, rep.Workloads)
	}
	if !rep.Verified {
		return fmt.Errorf("some results are wrong")
	}
	return nil
}

// guestOpen opens a session at endpoint, on the GPU pin names (empty:
// where the node places it), resumable on failoverTo.
func guestOpen(endpoint, name, failoverTo, pin string) (*pvdriver.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := pvdriver.Options{GuestName: name, GPU: pin}
	if failoverTo != "" {
		opts.Failover = strings.Split(failoverTo, ",")
	}
	return pvdriver.Open(ctx, endpoint, opts)
}

func runWorkloads(ctx context.Context, c *pvdriver.Client, ws []workload.Workload, size int) (guestReport, error) {
	rep := guestReport{Session: c.Session(), Verified: true}
	for _, w := range ws {
		r, err := w.Run(ctx, c, size)
		if err != nil {
			return rep, err
		}
		rep.Workloads = append(rep.Workloads, r)
		rep.Verified = rep.Verified && r.Verified
	}
	return rep, nil
}

func printResults(w io.Writer, rs []workload.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tSIZE\tVERIFIED\tCHECKSUM\tDETAIL")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%v\t%s\t%s\n", r.Name, r.Size, r.Verified, r.Checksum, r.Detail)
	}
	tw.Flush()
}
