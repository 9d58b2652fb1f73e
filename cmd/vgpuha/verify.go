package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
)

func runVerify(args []string) error {
	fs := newFlags("verify", "--admin HOST:PORT [--json] [--repair]")
	adminAddr := fs.String("admin", "127.0.0.1:9470", "the primary's admin address")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	repair := fs.Bool("repair", false, "copy every diverged allocation from the primary to the standby")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Post(fmt.Sprintf("http://%s/verify?repair=%v", *adminAddr, *repair), "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("primary: %s: %s", resp.Status, body)
	}
	var rep replicate.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("decoding report: %w", err)
	}
	if *asJSON {
		os.Stdout.Write(body)
	} else {
		fmt.Printf("verified %d objects (%d bytes) at one log position: match=%v\n", rep.Objects, rep.Bytes, rep.Match)
		if len(rep.Mismatches) > 0 {
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tKIND\tID\tSIZE\tPRIMARY\tSTANDBY\tREPAIRABLE")
			for _, m := range rep.Mismatches {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%v\n", m.Session, m.Kind, m.ID, m.Size, m.Primary, m.Standby, m.Repairable)
			}
			tw.Flush()
		}
		if rep.Repaired > 0 {
			fmt.Printf("repaired %d objects; run verify again to confirm\n", rep.Repaired)
		}
	}
	if !rep.Match && rep.Repaired == 0 {
		return fmt.Errorf("replica differs from the primary")
	}
	return nil
}

func runSwitchover(args []string) error {
	fs := newFlags("switchover", "--admin HOST:PORT")
	adminAddr := fs.String("admin", "127.0.0.1:9470", "the primary's admin address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Post("http://"+*adminAddr+"/switchover", "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("primary: %s: %s", resp.Status, body)
	}
	fmt.Printf("switched over: %s", body)
	return nil
}
