package agent

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/node"
)

// A deposed primary must never serve again by restarting: its guests'
// state is on its standby, which took over (or will, once its heartbeats
// stop), and a fresh primary at term 1 beside it is a second primary. A
// primary of a two-node pair (--replicate-to, no --coordinator, where
// etcd would decide instead) therefore leaves a record in its state
// directory once it serves, notes there when it is fenced, and refuses to
// start while the record is there: whether it was fenced, killed or
// stopped, its standby holds the pair now. The way back is as that
// node's standby (docs/OPERATIONS.md, Fail-back); an operator who starts
// a new pair on purpose deletes the record.

// ExitDeposed is the status of a primary that refuses to start because
// it was deposed; contrib/systemd's unit does not restart on it
// (RestartPreventExitStatus).
const ExitDeposed = 3

// primaryRecordFile is the record's name in the state directory.
const primaryRecordFile = "primary.json"

// stateDirFlag adds --state-dir; its default is systemd's
// $STATE_DIRECTORY (StateDirectory= in the unit).
func stateDirFlag(fs *flag.FlagSet) *string {
	return fs.String("state-dir", os.Getenv("STATE_DIRECTORY"), "directory where a two-node primary records that it served (and whether it was fenced); "+
		"a primary finding that record refuses to start, exit status 3 (default $STATE_DIRECTORY; empty: no record)")
}

// primaryRecord is the record's content.
type primaryRecord struct {
	Term        uint64    `json:"term"`
	Since       time.Time `json:"serving_since"`
	ReplicateTo string    `json:"replicate_to"`
	// FencedAt and FencedBy: when a node under term FencedBy took over.
	FencedAt *time.Time `json:"fenced_at,omitempty"`
	FencedBy uint64     `json:"fenced_by_term,omitempty"`
}

// pairState is where a primary keeps its record ("" path: it keeps none).
type pairState struct {
	path        string
	replicateTo string
	rec         primaryRecord
}

// pairRecord is the record of a primary with these flags: none without a
// state directory, a standby to stream to, or with a coordinator.
func pairRecord(stateDir, replicateTo, coordinator string) pairState {
	if stateDir == "" || replicateTo == "" || coordinator != "" {
		return pairState{}
	}
	return pairState{path: filepath.Join(stateDir, primaryRecordFile), replicateTo: replicateTo}
}

// refuseIfDeposed refuses to start a primary whose record is there.
func (p pairState) refuseIfDeposed() error {
	if p.path == "" {
		return nil
	}
	if fi, err := os.Stat(filepath.Dir(p.path)); err != nil || !fi.IsDir() {
		return cli.Usage(fmt.Errorf("--state-dir %s: not a directory this node can keep its record in (%v)", filepath.Dir(p.path), err))
	}
	b, err := os.ReadFile(p.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return cli.Usage(fmt.Errorf("--state-dir: reading the record of an earlier run, %s: %w", p.path, unwrapPath(err)))
	}
	var rec primaryRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return cli.Usage(fmt.Errorf("--state-dir: the record of an earlier run, %s, is corrupt (%v): it says whether this node was deposed, so the node will not guess; "+
			"if another node serves this pair now, rejoin this host as its standby (docs/OPERATIONS.md, Fail-back), else delete the file to start a new pair", p.path, err))
	}
	how := fmt.Sprintf("it served as primary under term %d from %s, streaming to %s, and stopped without handing over: its standby has taken over, or will",
		rec.Term, rec.Since.Format(time.RFC3339), rec.ReplicateTo)
	if rec.FencedAt != nil {
		how = fmt.Sprintf("it was fenced at %s: a node under term %d took over", rec.FencedAt.Format(time.RFC3339), rec.FencedBy)
	}
	return cli.ExitError{Code: ExitDeposed, Err: fmt.Errorf("refusing to start as primary: this node was deposed (%s; %s). "+
		"Rejoin it as the new primary's standby (vgpuha standby; docs/OPERATIONS.md, Fail-back); to start a new pair on purpose, delete %s",
		p.path, how, p.path)}
}

// serving records that the node serves as primary of its pair.
func (p *pairState) serving(n *node.Node, log *slog.Logger) error {
	if p.path == "" {
		return nil
	}
	_, term := n.Role()
	p.rec = primaryRecord{Term: term, Since: time.Now().UTC(), ReplicateTo: p.replicateTo}
	if err := p.write(); err != nil {
		return fmt.Errorf("recording that this node serves (--state-dir): %w", err)
	}
	log.Info("recorded in the state directory that this node serves the pair; it will not start as primary again while the record is there", "record", p.path)
	return nil
}

// fenced notes the fence in the record.
func (p *pairState) fenced(term uint64, log *slog.Logger) {
	if p.path == "" || p.rec.FencedAt != nil {
		return
	}
	now := time.Now().UTC()
	p.rec.FencedAt, p.rec.FencedBy = &now, term
	if err := p.write(); err != nil {
		log.Error("could not note the fence in the state directory (the record that this node served stays)", "record", p.path, "err", err)
	}
}

// write replaces the record whole (a new file renamed over it, synced).
func (p *pairState) write() error {
	b, err := json.MarshalIndent(p.rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := p.path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p.path)
	}
	return err
}
