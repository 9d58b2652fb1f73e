package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// termKey is the group's term record: the term of the last leader that
// served, written by every winner before it serves (recordTerm).
func (c *Coordinator) termKey() string { return c.prefix() + "term" }

// DeposedError: the group's term record names another node's term.
type DeposedError struct{ Term uint64 }

func (e *DeposedError) Error() string {
	return fmt.Sprintf("the group's term record names term %d: another node led", e.Term)
}

// recordTerm writes the term record for a leader that just won under
// elect, conditioned on its key still leading; with prev > 0 also on the
// record still naming prev (a node leading again after its lease
// expired). A failed condition is a DeposedError naming the record.
func (c *Coordinator) recordTerm(ctx context.Context, elect *concurrency.Election, prev uint64) error {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(elect.Key()), "=", elect.Rev())}
	if prev > 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(c.termKey()), "=", strconv.FormatUint(prev, 10)))
	}
	resp, err := c.cli.Txn(ctx).If(cmps...).
		Then(clientv3.OpPut(c.termKey(), strconv.FormatInt(elect.Rev(), 10))).
		Else(clientv3.OpGet(c.termKey())).Commit()
	if err != nil {
		return fmt.Errorf("recording the group's term: %w", err)
	}
	if resp.Succeeded {
		return nil
	}
	return &DeposedError{Term: recordedTerm(resp.Responses[0].GetResponseRange().Kvs)}
}

func recordedTerm(kvs []*mvccpb.KeyValue) uint64 {
	if len(kvs) == 0 {
		return 0
	}
	t, _ := strconv.ParseUint(string(kvs[0].Value), 10, 64)
	return t
}

// termRecord reads the group's term record (0: none).
func (c *Coordinator) termRecord(ctx context.Context) (uint64, error) {
	resp, err := c.cli.Get(ctx, c.termKey())
	if err != nil {
		return 0, err
	}
	return recordedTerm(resp.Kvs), nil
}

// proveLeading: a suspended leader's lease was renewed after all. It
// checks in one read that its key still leads at its term and the term
// record names that term, and reports LeaseRegained (or, if another node's
// term is on record, Deposed).
func (c *Coordinator) proveLeading(ctx context.Context, sess *concurrency.Session, sent time.Time) bool {
	c.mu.Lock()
	elect, feed := c.elect, c.feed
	c.mu.Unlock()
	term := uint64(elect.Rev())
	resp, err := c.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(elect.Key()), "=", elect.Rev()),
		clientv3.Compare(clientv3.Value(c.termKey()), "=", strconv.FormatUint(term, 10)),
	).Else(clientv3.OpGet(c.termKey())).Commit()
	if err != nil {
		return false
	}
	if !resp.Succeeded {
		rec := recordedTerm(resp.Responses[0].GetResponseRange().Kvs)
		c.log.Error("lease renewed, but this node's leader key or term record is gone: deposed", "term", term, "recorded_term", rec)
		c.mu.Lock()
		c.leader = false
		c.mu.Unlock()
		feed(failover.Event{Kind: failover.Deposed, Term: max(rec, term), At: c.cfg.Now()})
		return true
	}
	c.mu.Lock()
	if sess == c.sess {
		c.lost, c.lastOK, c.lastFail = false, sent, time.Time{}
	}
	c.mu.Unlock()
	c.metrics.leasesRegained.Inc()
	c.log.Warn("coordinator lease renewed in time: still leading the group", "term", term)
	feed(failover.Event{Kind: failover.LeaseRegained, Term: term, At: c.cfg.Now()})
	return true
}

// leaseExpired: etcd says a suspended leader's lease is gone (its key with
// it). The session goes; renewOnce takes a new lease.
func (c *Coordinator) leaseExpired(sess *concurrency.Session) {
	c.mu.Lock()
	if sess != c.sess {
		c.mu.Unlock()
		return
	}
	c.leader = false
	feed := c.feed
	c.mu.Unlock()
	sess.Orphan()
	c.log.Warn("etcd expired this leader's lease; it leads again only if no node led since")
	feed(failover.Event{Kind: failover.LeaseExpired, At: c.cfg.Now()})
}

// Relead runs for leader again in the background for a node whose lease
// expired while it led under term (its authority asked): it campaigns on
// its new lease and, once its key leads, takes the term record over from
// term (recordTerm). The outcome comes back as LeaseRegained under the
// new key's revision, or Deposed when the record names another term; a
// record that changes while the campaign waits ends it as Deposed.
func (c *Coordinator) Relead(term uint64) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	if c.stopRelead != nil {
		c.stopRelead()
	}
	c.stopRelead = cancel // not stopCamp: losing the new lease only fails one attempt
	feed := c.feed
	c.mu.Unlock()
	go func() {
		for ctx.Err() == nil {
			won, err := c.relead(ctx, term)
			var dep *DeposedError
			switch {
			case err == nil:
				c.log.Warn("leading the group again: no node led since its lease expired", "term", won, "previous_term", term)
				feed(failover.Event{Kind: failover.LeaseRegained, Term: won, At: c.cfg.Now()})
				return
			case errors.As(err, &dep):
				c.log.Warn("not leading again: another node led since this node's lease expired", "term", term, "recorded_term", dep.Term)
				feed(failover.Event{Kind: failover.Deposed, Term: dep.Term, At: c.cfg.Now()})
				return
			case ctx.Err() == nil:
				c.log.Warn("leading the group again", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// relead is one attempt of Relead.
func (c *Coordinator) relead(ctx context.Context, term uint64) (uint64, error) {
	elect, err := c.freshElection(ctx)
	if err != nil {
		return 0, err
	}
	if rec, err := c.termRecord(ctx); err != nil {
		return 0, err
	} else if rec != term {
		return 0, &DeposedError{Term: rec}
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	changed := make(chan uint64, 1)
	go c.watchTermRecord(wctx, term, changed, stop)
	if err := elect.Campaign(wctx, c.cfg.ID); err != nil {
		select {
		case rec := <-changed:
			return 0, &DeposedError{Term: rec}
		default:
			return 0, fmt.Errorf("campaigning again: %w", err)
		}
	}
	if err := c.recordTerm(ctx, elect, term); err != nil {
		c.resignWithin(elect, time.Second)
		return 0, err
	}
	c.markLeading()
	return uint64(elect.Rev()), nil
}

// watchTermRecord reports a term record that stops naming term, and
// stops the campaign.
func (c *Coordinator) watchTermRecord(ctx context.Context, term uint64, changed chan<- uint64, stop func()) {
	for resp := range c.cli.Watch(ctx, c.termKey()) {
		for _, ev := range resp.Events {
			if rec := recordedTerm([]*mvccpb.KeyValue{ev.Kv}); rec != term {
				changed <- rec
				stop()
				return
			}
		}
	}
}

// freshElection waits until the node holds a new lease (renewOnce takes
// it after a loss) and returns the election on it.
func (c *Coordinator) freshElection(ctx context.Context) (*concurrency.Election, error) {
	for {
		c.mu.Lock()
		lost, elect := c.lost, c.elect
		c.mu.Unlock()
		if !lost {
			return elect, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(renewRetry):
		}
	}
}
