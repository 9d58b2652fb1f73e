package node

import (
	"context"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/replicate"
)

// replication is a primary's log and its links to its standbys, one
// sender each, in priority order (the log's sync set is the first k
// caught-up ones: replicate/peers.go).
type replication struct {
	log *replicate.Log

	mu    sync.Mutex
	links []*standbyLink
}

// standbyLink is one standby's sender.
type standbyLink struct {
	addr    string
	sender  *replicate.Sender
	metrics *registered // the sender's collectors, dropped when it is removed
	cancel  context.CancelFunc
	done    chan struct{}
}

func (l *standbyLink) stop() {
	l.cancel()
	<-l.done
	l.metrics.unregisterAll()
}

// registered remembers what was registered through it, so that a sender
// replaced by another (a standby taken from the pool) can take its
// metrics away first.
type registered struct {
	prometheus.Registerer
	cs []prometheus.Collector
}

func (r *registered) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.cs = append(r.cs, c)
	return nil
}

func (r *registered) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *registered) unregisterAll() {
	for _, c := range r.cs {
		r.Unregister(c)
	}
	r.cs = nil
}

// stop ends every link and closes the log (the node is no longer
// primary, or is going down).
func (r *replication) stop() {
	r.log.Close()
	r.mu.Lock()
	links := r.links
	r.links = nil
	r.mu.Unlock()
	for _, l := range links {
		l.stop()
	}
}

// add starts streaming to addr (last in priority) unless a link to it
// exists.
func (n *Node) addStandby(r *replication, addr string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.ContainsFunc(r.links, func(l *standbyLink) bool { return l.addr == addr }) {
		return nil
	}
	reg := &registered{Registerer: n.cfg.Registry}
	sender, err := replicate.NewSender(replicate.SenderConfig{
		Addr: addr, Key: n.cfg.Key, Mode: n.cfg.Mode, Log: r.log, Logger: n.log,
		Registry: reg, Faults: n.cfg.Faults, ResyncRate: n.cfg.ResyncRate, Group: n.pairGroup(),
	}, protected{n})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(n.ctx)
	l := &standbyLink{addr: addr, sender: sender, metrics: reg, cancel: cancel, done: make(chan struct{})}
	r.links = append(r.links, l)
	go func() { defer close(l.done); sender.Run(ctx) }()
	n.log.Info("replicating", "standby", addr, "mode", n.cfg.Mode)
	return nil
}

// removeStandby stops streaming to addr; the standby leaves the log's
// sync set (under a coordinator, replies wait until that is on record).
func (r *replication) removeStandby(addr string) {
	r.mu.Lock()
	i := slices.IndexFunc(r.links, func(l *standbyLink) bool { return l.addr == addr })
	if i < 0 {
		r.mu.Unlock()
		return
	}
	l := r.links[i]
	r.links = slices.Delete(r.links, i, i+1)
	r.mu.Unlock()
	l.stop()
}

// senders are the links' senders in priority order.
func (r *replication) senders() []*replicate.Sender {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*replicate.Sender, len(r.links))
	for i, l := range r.links {
		out[i] = l.sender
	}
	return out
}

// addrs are the standbys streamed to, in priority order.
func (r *replication) addrs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.links))
	for i, l := range r.links {
		out[i] = l.addr
	}
	return out
}

// first is the standby verify and a switchover go to: the first in sync,
// else the first (nil without one).
func (r *replication) first() *replicate.Sender {
	ss := r.senders()
	for _, s := range ss {
		if s.Status().InSync {
			return s
		}
	}
	if len(ss) > 0 {
		return ss[0]
	}
	return nil
}
