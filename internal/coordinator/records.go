package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is one node's record in its group, under the node's lease: it
// vanishes when the node stops renewing.
type Member struct {
	ID   string `json:"id"`
	Role string `json:"role"`
	Term uint64 `json:"term"`
	// Addr is where a standby takes a replication stream (tcp HOST:PORT);
	// a standby with one is in the group's pool.
	Addr string `json:"addr,omitempty"`
	// Capacity is how many groups' streams a standby can take (a vgpuha
	// standby takes one).
	Capacity int `json:"capacity,omitempty"`
	// Attached: a standby has a primary's stream; InSync: a complete copy.
	Attached bool `json:"attached"`
	InSync   bool `json:"in_sync"`
	// LagOps is a primary's unacknowledged records.
	LagOps uint64 `json:"lag_ops"`
	// Serving: the node serves guests, as of Updated.
	Serving bool      `json:"serving"`
	Updated time.Time `json:"updated"`
}

// StandbyRecord is the group's standbys as its leader last wrote them:
// every standby it streams to, in priority order, and which of them are in
// sync (hold every reply the leader let out: only those may campaign).
type StandbyRecord struct {
	Standbys []RecordedStandby `json:"standbys"`
	// MinInSync is k: how many in-sync standbys the leader's commit rule
	// waits for when it has them.
	MinInSync int       `json:"min_in_sync"`
	Term      uint64    `json:"term"` // the leader's term when written
	Since     time.Time `json:"since"`
}

// RecordedStandby is one standby in a StandbyRecord.
type RecordedStandby struct {
	Addr   string `json:"addr"`
	InSync bool   `json:"in_sync"`
}

// InSync reports whether the record names the standby at addr in sync.
func (r StandbyRecord) InSync(addr string) bool {
	for _, s := range r.Standbys {
		if s.Addr == addr {
			return s.InSync
		}
	}
	return false
}

// Names reports whether the record lists the standby at addr.
func (r StandbyRecord) Names(addr string) bool {
	for _, s := range r.Standbys {
		if s.Addr == addr {
			return true
		}
	}
	return false
}

// InSyncAddrs lists the standbys the record names in sync.
func (r StandbyRecord) InSyncAddrs() []string {
	var out []string
	for _, s := range r.Standbys {
		if s.InSync {
			out = append(out, s.Addr)
		}
	}
	return out
}

// Same reports whether r and o name the same standbys, in the same
// states, for the same k and term.
func (r StandbyRecord) Same(o StandbyRecord) bool {
	return r.Term == o.Term && r.MinInSync == o.MinInSync && slices.Equal(r.Standbys, o.Standbys)
}

// Publish writes this node's member record under its lease.
func (c *Coordinator) Publish(ctx context.Context, m Member) error {
	m.ID = c.cfg.ID
	if m.Updated.IsZero() {
		m.Updated = c.cfg.Now()
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding member record: %w", err)
	}
	c.mu.Lock()
	lost, lease := c.lost, c.sess.Lease()
	c.mu.Unlock()
	if lost {
		return ErrLeaseLost
	}
	if _, err := c.cli.Put(ctx, c.prefix()+"members/"+c.cfg.ID, string(b), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("publishing member record: %w", err)
	}
	return nil
}

// SetStandby records the group's standbys; only the leader may write it
// (the write is conditioned on its leader key).
func (c *Coordinator) SetStandby(ctx context.Context, rec StandbyRecord) error {
	cmp, err := c.leaderCmp()
	if err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding standby record: %w", err)
	}
	resp, err := c.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(c.prefix()+"standby", string(b))).Commit()
	if err != nil {
		return fmt.Errorf("recording the group's standby: %w", err)
	}
	if !resp.Succeeded {
		return errors.New("recording the group's standby: this node no longer leads")
	}
	return nil
}

// Standbys reads the group's standby record (zero when none).
func (c *Coordinator) Standbys(ctx context.Context) (StandbyRecord, error) {
	rec, _, err := c.standbyRecord(ctx)
	return rec, err
}

// standbyRecord reads the group's standby record (zero when none) and its
// modification revision.
func (c *Coordinator) standbyRecord(ctx context.Context) (StandbyRecord, int64, error) {
	var rec StandbyRecord
	resp, err := c.cli.Get(ctx, c.prefix()+"standby")
	if err != nil {
		return rec, 0, fmt.Errorf("reading the group's standby record: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return rec, 0, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return rec, 0, fmt.Errorf("decoding the group's standby record: %w", err)
	}
	return rec, resp.Kvs[0].ModRevision, nil
}

// PickStandby chooses a free standby from the group's pool (registered,
// with a replication address, not attached to a stream, and none of
// avoid); the leader records it with its other standbys (not yet in sync)
// when it next writes the record. Only the leader may.
func (c *Coordinator) PickStandby(ctx context.Context, avoid ...string) (string, error) {
	if !c.Leader() {
		return "", errors.New("picking a pool standby: this node does not lead the group")
	}
	members, err := c.members(ctx, c.cfg.Group)
	if err != nil {
		return "", err
	}
	for _, m := range members {
		if m.Addr == "" || m.Attached || m.Role != "standby" || m.ID == c.cfg.ID || contains(avoid, m.Addr) {
			continue
		}
		c.metrics.replacements.Inc()
		c.log.Warn("took a standby from the pool", "standby", m.ID, "addr", m.Addr)
		return m.Addr, nil
	}
	return "", errors.New("no free standby in the group's pool")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func (c *Coordinator) members(ctx context.Context, group string) ([]Member, error) {
	resp, err := c.cli.Get(ctx, "/vgpuha/groups/"+group+"/members/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("listing group %s: %w", group, err)
	}
	var ms []Member
	for _, kv := range resp.Kvs {
		var m Member
		if json.Unmarshal(kv.Value, &m) == nil {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	return ms, nil
}

// GroupStatus is one group as etcd holds it.
type GroupStatus struct {
	Group      string        `json:"group"`
	LeaderID   string        `json:"leader_id,omitempty"`
	LeaderTerm uint64        `json:"leader_term,omitempty"`
	Standby    StandbyRecord `json:"standby"`
	Members    []Member      `json:"members"`
}

// Groups reads every group under /vgpuha/groups/ (vgpuha status).
func Groups(ctx context.Context, cli *clientv3.Client) ([]GroupStatus, error) {
	resp, err := cli.Get(ctx, "/vgpuha/groups/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("reading groups: %w", err)
	}
	byName := map[string]*GroupStatus{}
	var names []string
	for _, kv := range resp.Kvs {
		parts := strings.SplitN(strings.TrimPrefix(string(kv.Key), "/vgpuha/groups/"), "/", 3)
		if len(parts) < 2 {
			continue
		}
		g := byName[parts[0]]
		if g == nil {
			g = &GroupStatus{Group: parts[0]}
			byName[parts[0]] = g
			names = append(names, parts[0])
		}
		switch parts[1] {
		case "leader": // the lowest create revision leads
			if g.LeaderTerm == 0 || uint64(kv.CreateRevision) < g.LeaderTerm {
				g.LeaderID, g.LeaderTerm = string(kv.Value), uint64(kv.CreateRevision)
			}
		case "standby":
			json.Unmarshal(kv.Value, &g.Standby)
		case "members":
			var m Member
			if json.Unmarshal(kv.Value, &m) == nil {
				g.Members = append(g.Members, m)
			}
		}
	}
	sort.Strings(names)
	out := make([]GroupStatus, 0, len(names))
	for _, n := range names {
		out = append(out, *byName[n])
	}
	return out, nil
}
