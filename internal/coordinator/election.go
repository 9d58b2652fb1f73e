package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

func nopZap() *zap.Logger { return zap.NewNop() }

// Lead campaigns for the group's leader key and returns the term (the
// key's create revision) once this node leads: a first primary calls it
// before it serves anyone. It fails when ctx ends first (another node
// leads).
func (c *Coordinator) Lead(ctx context.Context) (uint64, error) {
	c.mu.Lock()
	elect := c.elect
	c.mu.Unlock()
	if err := elect.Campaign(ctx, c.cfg.ID); err != nil {
		c.metrics.elections.WithLabelValues("failed").Inc()
		return 0, fmt.Errorf("campaigning for group %s: %w", c.cfg.Group, err)
	}
	if err := c.recordTerm(ctx, elect, 0); err != nil {
		c.metrics.elections.WithLabelValues("failed").Inc()
		return 0, fmt.Errorf("leading group %s: %w", c.cfg.Group, err)
	}
	c.markLeading()
	term := uint64(elect.Rev())
	c.log.Info("leading the group", "term", term)
	return term, nil
}

// Campaign runs for leader in the background (the authority asked: the
// standby suspects its primary). Only a standby the group's record names
// as in sync may run (of several, the first to put its key wins; the
// others wait behind it and follow the winner's stream), and the record is checked again once the key is won
// (a deposed leader can no longer change it then). A usable win is fed as
// ElectionWon under the term; anything else as CampaignEnded.
func (c *Coordinator) Campaign() {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	if c.stopCamp != nil {
		c.stopCamp()
	}
	c.stopCamp = cancel
	elect, feed := c.elect, c.feed
	c.mu.Unlock()
	go func() {
		term, err := c.campaign(ctx, elect, c.cfg.Advertise)
		if err != nil {
			c.log.Warn("campaign ended without a usable win", "err", err)
			select { // a refused standby asks again at most every 200 ms
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			feed(failover.Event{Kind: failover.CampaignEnded})
			return
		}
		feed(failover.Event{Kind: failover.ElectionWon, Term: term})
	}()
}

// errNotInSync: the group's record does not name this standby in sync.
var errNotInSync = errors.New("the group's record does not name this standby as in sync")

func (c *Coordinator) campaign(ctx context.Context, elect *concurrency.Election, self string) (uint64, error) {
	if err := c.checkInSync(ctx, self); err != nil {
		c.metrics.elections.WithLabelValues("refused").Inc()
		return 0, err
	}
	c.log.Info("campaigning for the group's leadership (the primary is suspected, or hands over)")
	if err := elect.Campaign(ctx, c.cfg.ID); err != nil {
		c.metrics.elections.WithLabelValues("failed").Inc()
		return 0, fmt.Errorf("campaigning: %w", err)
	}
	err := c.checkInSync(ctx, self)
	if err == nil {
		err = c.recordTerm(ctx, elect, 0) // before it serves: a node leading again checks it
	}
	if err != nil {
		c.metrics.elections.WithLabelValues("refused").Inc()
		c.resignWithin(elect, time.Second)
		return 0, err
	}
	c.markLeading()
	term := uint64(elect.Rev())
	c.log.Warn("won the group's election", "term", term)
	return term, nil
}

func (c *Coordinator) checkInSync(ctx context.Context, self string) error {
	rec, _, err := c.standbyRecord(ctx)
	if err != nil {
		return err
	}
	if !rec.InSync(self) {
		return fmt.Errorf("%w (record: in sync %v; this node: %s)", errNotInSync, rec.InSyncAddrs(), self)
	}
	return nil
}

// Resign withdraws a campaign in progress, or gives up the leader key.
func (c *Coordinator) Resign() {
	c.mu.Lock()
	for _, stop := range []*context.CancelFunc{&c.stopCamp, &c.stopRelead} {
		if *stop != nil {
			(*stop)()
			*stop = nil
		}
	}
	elect, leader, lost, sess := c.elect, c.leader, c.lost, c.sess
	c.leader = false
	c.mu.Unlock()
	if leader {
		ctx, cancel := context.WithTimeout(c.ctx, time.Second)
		defer cancel()
		if err := elect.Resign(ctx); err != nil {
			c.log.Warn("resigning the group's leadership", "err", err)
		}
	}
	if leader && lost { // a suspended leader kept its lease: give it back
		sess.Orphan()
		go c.revoke(sess.Lease())
	}
}

// Leader reports whether this node holds the group's leader key (as far
// as it knows: LeaseLost clears it).
func (c *Coordinator) Leader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader && !c.lost
}

// WatchTerm calls fn with the term (create revision) of each leader the
// group gets, from the current one on, until Close. A standby hands it to
// its receiver: nothing below it is ever applied.
func (c *Coordinator) WatchTerm(fn func(term uint64)) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for c.ctx.Err() == nil {
			c.mu.Lock()
			elect := c.elect
			c.mu.Unlock()
			for resp := range elect.Observe(c.ctx) {
				if len(resp.Kvs) > 0 {
					fn(uint64(resp.Kvs[0].CreateRevision))
				}
			}
			select {
			case <-c.ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// leaderCmp holds while this node's leader key still exists under its
// revision: every write a leader makes is conditioned on it.
func (c *Coordinator) leaderCmp() (clientv3.Cmp, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leader || c.lost {
		return clientv3.Cmp{}, errors.New("this node does not lead the group")
	}
	return clientv3.Compare(clientv3.CreateRevision(c.elect.Key()), "=", c.elect.Rev()), nil
}

// HandOff gives the group's leadership to the standby that takes streams
// at addr (a planned switchover, with every guest stopped): it waits until
// that standby campaigns (its key waits behind this leader's), calls
// beforeResign, and resigns, so that the standby's key leads next; no
// other node can win in between (only the standby the record names in
// sync may). It fails, still leading, when ctx ends first.
func (c *Coordinator) HandOff(ctx context.Context, addr string, beforeResign func()) error {
	if !c.Leader() {
		return errors.New("this node does not lead the group")
	}
	for {
		ok, err := c.campaigns(ctx, addr)
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the standby at %s did not campaign (%v): %w", addr, err, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	beforeResign()
	c.Resign()
	c.log.Warn("handed the group's leadership to its standby", "standby", addr)
	return nil
}

// campaigns reports whether a member whose stream address is addr holds a
// key in the group's election.
func (c *Coordinator) campaigns(ctx context.Context, addr string) (bool, error) {
	members, err := c.members(ctx, c.cfg.Group)
	if err != nil {
		return false, err
	}
	ids := map[string]bool{}
	for _, m := range members {
		if m.Addr == addr && m.ID != c.cfg.ID {
			ids[m.ID] = true
		}
	}
	resp, err := c.cli.Get(ctx, c.prefix()+"leader/", clientv3.WithPrefix())
	if err != nil {
		return false, err
	}
	for _, kv := range resp.Kvs {
		if ids[string(kv.Value)] {
			return true, nil
		}
	}
	return false, nil
}

// resignWithin gives up elect's leadership, waiting at most d for etcd.
func (c *Coordinator) resignWithin(elect *concurrency.Election, d time.Duration) {
	ctx, cancel := context.WithTimeout(c.ctx, d)
	defer cancel()
	elect.Resign(ctx)
}

// markLeading notes that this node won its election and leads the group.
func (c *Coordinator) markLeading() {
	c.mu.Lock()
	c.leader = true
	c.mu.Unlock()
	c.metrics.elections.WithLabelValues("won").Inc()
}
