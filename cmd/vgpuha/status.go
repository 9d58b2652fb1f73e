package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// nodeStatusView is what `vgpuha status --admin` shows of a node's
// /status, a primary's and a standby's alike.
type nodeStatusView struct {
	Role      string `json:"role"`
	Term      uint64 `json:"term"`
	IsPrimary bool   `json:"is_primary"`
	Sessions  []any  `json:"sessions"`
	// A primary's link to its standby (a standby's "replication" is the
	// stream it takes; a promoted standby's own link is "protection").
	Replication *linkView `json:"replication"`
	Protection  *linkView `json:"protection"`
	Replica     *struct {
		Term      uint64 `json:"term"`
		IsPrimary bool   `json:"is_primary"`
		Sessions  []any  `json:"sessions"`
	} `json:"replica"`
}

type linkView struct {
	State      string  `json:"state"`
	LagOps     uint64  `json:"lag_ops"`
	LagSeconds float64 `json:"lag_seconds"`
	Connected  bool    `json:"connected"`
	InSync     bool    `json:"in_sync"`
	Applied    uint64  `json:"applied_seq"`
}

// printNodeStatus prints one node's status as a table (or its JSON).
func printNodeStatus(out io.Writer, addr, tokenFile string, asJSON bool) error {
	body, err := adminRequest("GET", addr, "/status", tokenFile, 5*time.Second)
	if err != nil {
		return err
	}
	if asJSON {
		_, err := out.Write(body)
		return err
	}
	var v nodeStatusView
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("decoding %s's status: %w", addr, err)
	}
	serving, sessions, term := v.IsPrimary, len(v.Sessions), v.Term
	if v.Replica != nil {
		serving, sessions, term = v.Replica.IsPrimary, len(v.Replica.Sessions), max(term, v.Replica.Term)
	}
	link := "-"
	var lagOps uint64
	var lagS float64
	switch {
	case v.Protection != nil:
		link, lagOps, lagS = "protected by a standby: "+v.Protection.State, v.Protection.LagOps, v.Protection.LagSeconds
	case v.Replica != nil && v.Replication != nil:
		link = fmt.Sprintf("stream from the primary: connected %v, in sync %v, applied %d", v.Replication.Connected, v.Replication.InSync, v.Replication.Applied)
	case v.Replication != nil:
		link, lagOps, lagS = "replicating: "+v.Replication.State, v.Replication.LagOps, v.Replication.LagSeconds
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tROLE\tTERM\tSERVING\tSESSIONS\tLAG OPS\tLAG s\tLINK")
	fmt.Fprintf(w, "%s\t%s\t%d\t%v\t%d\t%d\t%.3f\t%s\n", addr, v.Role, term, serving, sessions, lagOps, lagS, link)
	return w.Flush()
}
