// Package coordinator connects a node to an etcd cluster that decides
// which node of a replication group leads: a lease per node, one leader
// key per group (an etcd election, go.etcd.io/etcd/client/v3/concurrency),
// a record of the group's standbys and which are in sync, and a pool of
// registered standbys the leader may take a replacement from.
//
// It owns the etcd session and the keys under /vgpuha/groups/GROUP/. It
// must never decide a role: what it observes goes to the node's role
// authority (failover.Node) as events (LeaseLost, ElectionWon,
// CampaignEnded) and it campaigns or resigns only when the authority asks.
// It knows failover's event types and nothing else of the project.
//
// # Fencing token
//
// A leader's term is the create revision of its leader key. etcd's
// revision only grows across the cluster, so every election yields a term
// above every term an earlier election yielded (on the same etcd cluster):
// the token the replication link carries and every standby checks
// (WatchTerm tells a standby the newest leader's term; it refuses records
// below it).
//
// # Clock-safe margin
//
// etcd expires a lease no earlier than TTL after it received the last
// renewal, which was after the node sent it. The node measures from the
// send time of its last successful renewal on its own monotonic clock and
// reports LeaseLost once TTL/2 passed without another: the node stops
// serving with at least TTL/2 to spare. That holds as long as the node's
// clock runs no more than twice as slow as the etcd leader's and the node
// stops within the rest of that half (the server checks LeadsUntil per
// request). A process frozen (SIGSTOP) past its lease may still answer a
// request already read before its deadline check runs.
//
// # Losing and regaining a lease
//
// A lease that went unrenewed for TTL/2 is not necessarily gone: an etcd
// stall shorter than the TTL (every member frozen, a slow leader
// election) loses nothing. So a leader keeps its lease and its key after
// LeaseLost and keeps renewing. When etcd answers again:
//
//   - the lease is still there: the leader key, which lives and dies with
//     it, is still the group's, so no other node can have won meanwhile;
//     the coordinator checks it in one transaction (the key at this term's
//     revision, and the group's term record naming this term) and reports
//     LeaseRegained under the same term;
//   - etcd says the lease is gone (LeaseExpired): if the authority asks
//     (Relead), the coordinator takes a new lease, campaigns, and once its
//     new key leads writes the term record in a transaction that holds only
//     while the record still names the old term. No node led in between
//     (every winner writes the record before it serves), so the node
//     resumes under the new key's revision (LeaseRegained); a record naming
//     another term is reported as Deposed and the node never serves again.
//
// A node that does not lead lets a lost lease go (revoked when etcd
// answers) and takes a new one for its member record.
//
// # Keys
//
//	/vgpuha/groups/G/leader/LEASE   election keys; the lowest create revision leads
//	/vgpuha/groups/G/standby        the leader's standbys: addresses, which are in sync, k (written only by the leader)
//	/vgpuha/groups/G/members/ID     each node's record under its lease: role, term, lag, capacity
//	/vgpuha/groups/G/term           the term of the last leader that served (written by each winner before it serves)
package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/grpclog"
)

// Config configures a node's coordinator.
type Config struct {
	// Endpoints are etcd's client URLs (host:port); see ParseURL.
	Endpoints []string
	// Group names the replication group (a guest VM's pair and its pool).
	Group string
	// ID names this node in the group (unique).
	ID string
	// Advertise is where this node takes a replication stream (a
	// standby's tcp HOST:PORT); the group's standby record names it.
	Advertise string
	// TLS, when set, secures the client connection (see TLSFiles).
	TLS *tls.Config
	// Username and Password authenticate to etcd ("" : no auth).
	Username, Password string
	// TTL is the node's lease (whole seconds, at least 1 s; default 5 s).
	TTL time.Duration
	// DialTimeout bounds connecting to etcd (default 5 s).
	DialTimeout time.Duration
	// Now is the clock the margin is measured on (time.Now when nil).
	Now      func() time.Time
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// DefaultTTL is the lease a node holds when Config.TTL is zero.
const DefaultTTL = 5 * time.Second

// ErrLeaseLost: the node's lease was not renewed within the margin.
var ErrLeaseLost = errors.New("coordinator lease lost")

// ParseURL turns etcd://host:2379[,host:2379...] into client endpoints.
func ParseURL(s string) ([]string, error) {
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok || rest == "" {
		return nil, fmt.Errorf("coordinator %q: want etcd://HOST:PORT[,HOST:PORT...]", s)
	}
	eps := strings.Split(rest, ",")
	for _, ep := range eps {
		if ep == "" || !strings.Contains(ep, ":") {
			return nil, fmt.Errorf("coordinator %q: endpoint %q is not HOST:PORT", s, ep)
		}
	}
	return eps, nil
}

// TLSFiles names the files an etcd client takes for TLS.
type TLSFiles struct{ CA, Cert, Key string }

// Config loads the files ("": no TLS when all are empty).
func (f TLSFiles) Config() (*tls.Config, error) {
	if f == (TLSFiles{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("reading coordinator CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("coordinator CA %s holds no PEM certificate", f.CA)
		}
	}
	if f.Cert != "" || f.Key != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("loading coordinator client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Coordinator is one node's connection to the group's etcd.
type Coordinator struct {
	cfg     Config
	cli     *clientv3.Client
	log     *slog.Logger
	metrics *metrics
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu       sync.Mutex
	sess     *concurrency.Session
	elect    *concurrency.Election
	lastOK   time.Time // send time of the last successful renewal
	lost     bool      // LeaseLost was reported for the current lease
	leader   bool      // this node holds the group's leader key
	feed     func(failover.Event)
	stopCamp context.CancelFunc // a campaign in progress
	// stopRelead ends a Relead (Resign and Close do; a lease lost during
	// it only fails one attempt).
	stopRelead context.CancelFunc
	lastFail   time.Time // a renewal failure to report once
}

func init() { grpclog.SetLoggerV2(grpclog.NewLoggerV2(discard{}, discard{}, discard{})) }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Dial connects to etcd and takes a lease. Events go nowhere until Start.
func Dial(cfg Config) (*Coordinator, error) {
	if err := fill(&cfg); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, TLS: cfg.TLS,
		Username: cfg.Username, Password: cfg.Password, Logger: nopZap()})
	if err != nil {
		return nil, fmt.Errorf("connecting to the coordinator %v: %w", cfg.Endpoints, err)
	}
	c := &Coordinator{cfg: cfg, cli: cli, log: cfg.Logger.With("group", cfg.Group, "node", cfg.ID), feed: func(failover.Event) {}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	// The lease first: a dial that fails leaves nothing registered, so the
	// caller may dial again with the same registry.
	if err := c.newSession(); err != nil {
		c.cancel()
		cli.Close()
		return nil, err
	}
	if c.metrics, err = newMetrics(cfg.Registry, c); err != nil {
		c.sess.Close() // revokes the lease
		c.cancel()
		cli.Close()
		return nil, err
	}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.renew() }()
	return c, nil
}

func fill(cfg *Config) error {
	if len(cfg.Endpoints) == 0 || cfg.Group == "" || cfg.ID == "" {
		return errors.New("a coordinator needs endpoints, a group and a node id")
	}
	if strings.ContainsAny(cfg.Group+cfg.ID, "/ ") {
		return fmt.Errorf("group %q and node id %q may not hold '/' or spaces", cfg.Group, cfg.ID)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second || cfg.TTL%time.Second != 0 {
		return fmt.Errorf("coordinator lease TTL %v: want whole seconds, at least 1 s", cfg.TTL)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	return nil
}

// newSession grants a fresh lease and builds the group's election on it.
func (c *Coordinator) newSession() error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	sent := c.cfg.Now()
	grant, err := c.cli.Grant(ctx, int64(c.cfg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("granting a coordinator lease: %w", err)
	}
	if c.cfg.Now().Sub(sent) > c.cfg.TTL/4 {
		// The grant waited (etcd stalled): its lease's time began when etcd
		// granted it, which the send time understates; renew it now so
		// the margin is measured from a recent send.
		again := c.cfg.Now()
		if _, err := c.cli.KeepAliveOnce(ctx, grant.ID); err == nil {
			sent = again
		}
	}
	sess, err := concurrency.NewSession(c.cli, concurrency.WithLease(grant.ID), concurrency.WithContext(c.ctx))
	if err != nil {
		return fmt.Errorf("opening a coordinator session: %w", err)
	}
	c.mu.Lock()
	c.sess, c.elect = sess, concurrency.NewElection(sess, c.prefix()+"leader")
	c.lastOK, c.lost = sent, false
	c.mu.Unlock()
	return nil
}

// Start sends events to feed (the node's role authority) from now on.
func (c *Coordinator) Start(feed func(failover.Event)) {
	c.mu.Lock()
	c.feed = feed
	c.mu.Unlock()
}

// TTL is the lease's time to live.
func (c *Coordinator) TTL() time.Duration { return c.cfg.TTL }

// Advertise is where this node takes a replication stream ("" for none).
func (c *Coordinator) Advertise() string { return c.cfg.Advertise }

// Group is the group's name.
func (c *Coordinator) Group() string { return c.cfg.Group }

// Client is the etcd client (for status readers).
func (c *Coordinator) Client() *clientv3.Client { return c.cli }

func (c *Coordinator) prefix() string { return "/vgpuha/groups/" + c.cfg.Group + "/" }

// renew keeps the lease alive on its own clock: a renewal every TTL/6,
// each bounded by TTL/6, and a check every few milliseconds that the last
// successful one was sent less than TTL/2 ago (the package doc says why).
// The check runs on its own goroutine: a renewal stuck for its whole
// timeout must not delay the fence.
func (c *Coordinator) renew() {
	every := c.cfg.TTL / 6
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		check := time.NewTicker(min(every/10, 10*time.Millisecond))
		defer check.Stop()
		for {
			select {
			case <-c.ctx.Done():
				return
			case <-check.C:
				c.checkMargin()
			}
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		next := t.C
		if !c.renewOnce(every) {
			// Try again soon, not at the next tick: after an etcd
			// leader change the first renewal that can succeed counts.
			next = time.After(min(every, renewRetry))
		}
		select {
		case <-c.ctx.Done():
			return
		case <-next:
		}
	}
}

// renewRetry is how soon a failed renewal is tried again.
const renewRetry = 25 * time.Millisecond

// renewOnce sends one keepalive and reports whether it succeeded. A
// leader whose lease went unrenewed keeps renewing the same lease and,
// once etcd answers, proves it still leads (resume.go). A node that holds
// no leadership and lost its lease takes a new one for its member record
// (status then shows a suspended or fenced leader as such); that never
// makes it a leader again: only its authority's Campaign or Relead does.
func (c *Coordinator) renewOnce(timeout time.Duration) bool {
	c.mu.Lock()
	sess, lost, leader := c.sess, c.lost, c.leader
	c.mu.Unlock()
	if lost && !leader {
		if c.newSession() == nil {
			c.log.Info("coordinator lease renewed after a loss (a new lease; this node does not lead)")
		}
		return true
	}
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	sent := c.cfg.Now()
	_, err := c.cli.KeepAliveOnce(ctx, sess.Lease())
	if err != nil {
		return c.renewFailed(sess, lost, sent, err)
	}
	c.metrics.renewals.Inc()
	if lost {
		return c.proveLeading(ctx, sess, sent)
	}
	c.mu.Lock()
	if !c.lost && sess == c.sess {
		c.lastOK, c.lastFail = sent, time.Time{}
	}
	c.mu.Unlock()
	return true
}

// renewFailed counts a failed renewal (the first of a run is logged). A
// suspended leader told that its lease is gone lets the session go and
// reports LeaseExpired.
func (c *Coordinator) renewFailed(sess *concurrency.Session, lost bool, sent time.Time, err error) bool {
	c.metrics.renewFailures.Inc()
	if lost && errors.Is(err, rpctypes.ErrLeaseNotFound) {
		c.leaseExpired(sess)
		return true
	}
	c.mu.Lock()
	first := c.lastFail.IsZero()
	c.lastFail = sent
	c.mu.Unlock()
	if first {
		c.log.Warn("coordinator lease renewal failed", "err", err)
	}
	return false
}

// checkMargin reports LeaseLost once TTL/2 passed since the last renewal
// was sent. A leader keeps its lease and its key (it may still hold them:
// renewOnce finds out); any other node lets its lease go.
func (c *Coordinator) checkMargin() {
	now := c.cfg.Now()
	c.mu.Lock()
	if c.lost || now.Sub(c.lastOK) < c.cfg.TTL/2 {
		c.mu.Unlock()
		return
	}
	c.lost = true
	leader, sess, feed, lastOK := c.leader, c.sess, c.feed, c.lastOK
	if c.stopCamp != nil {
		c.stopCamp()
		c.stopCamp = nil
	}
	c.mu.Unlock()
	c.metrics.leasesLost.Inc()
	feed(failover.Event{Kind: failover.LeaseLost, At: now})
	since := now.Sub(lastOK)
	if leader {
		c.log.Warn("coordinator lease unrenewed for half its TTL: this leader answers no guest until it proves it still leads",
			"since_renewal_ms", since.Milliseconds(), "expires_no_earlier_than_ms", (c.cfg.TTL - since).Milliseconds())
		return
	}
	c.log.Warn("coordinator lease unrenewed for half its TTL; letting it go", "since_renewal_ms", since.Milliseconds())
	sess.Orphan() // stop renewing; revoke below when etcd answers
	go c.revoke(sess.Lease())
}

// revoke gives the lease back so a standby need not wait out the TTL.
func (c *Coordinator) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.TTL)
	defer cancel()
	for ctx.Err() == nil {
		if _, err := c.cli.Revoke(ctx, id); err == nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LastRenewal is the send time of the last successful renewal.
func (c *Coordinator) LastRenewal() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastOK
}

// LeadsUntil is how long this node may act as the group's leader: half a
// TTL after its last successful renewal while it leads, the zero time
// while it does not (suspended, releading, or never led).
func (c *Coordinator) LeadsUntil() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leader || c.lost {
		return time.Time{}
	}
	return c.lastOK.Add(c.cfg.TTL / 2)
}

// Close resigns, revokes the lease (best effort) and disconnects.
func (c *Coordinator) Close() {
	c.mu.Lock()
	sess, lost := c.sess, c.lost
	for _, stop := range []context.CancelFunc{c.stopCamp, c.stopRelead} {
		if stop != nil {
			stop()
		}
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	if !lost && sess != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c.cli.Revoke(ctx, sess.Lease())
		cancel()
	}
	c.cli.Close()
}
