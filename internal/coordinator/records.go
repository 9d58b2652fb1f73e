package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// StandbyRecord is the group's standby as its leader last wrote it.
type StandbyRecord struct {
	Addr   string    `json:"addr"`
	InSync bool      `json:"in_sync"`
	Term   uint64    `json:"term"` // the leader's term when written
	Since  time.Time `json:"since"`
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

// SetStandby records the group's standby; only the leader may write it
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

// PickStandby takes a free standby from the group's pool (registered,
// with a replication address, not attached to a stream, and none of
// avoid) and records it as the group's standby, not yet in sync. Only
// the leader may.
func (c *Coordinator) PickStandby(ctx context.Context, term uint64, avoid ...string) (string, error) {
	cmp, err := c.leaderCmp()
	if err != nil {
		return "", err
	}
	members, err := c.members(ctx, c.cfg.Group)
	if err != nil {
		return "", err
	}
	for _, m := range members {
		if m.Addr == "" || m.Attached || m.Role != "standby" || m.ID == c.cfg.ID || contains(avoid, m.Addr) {
			continue
		}
		b, _ := json.Marshal(StandbyRecord{Addr: m.Addr, Term: term, Since: c.cfg.Now()})
		resp, err := c.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(c.prefix()+"standby", string(b))).Commit()
		if err != nil {
			return "", fmt.Errorf("claiming pool standby %s: %w", m.ID, err)
		}
		if !resp.Succeeded {
			return "", errors.New("claiming a pool standby: this node no longer leads")
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
