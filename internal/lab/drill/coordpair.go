package drill

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/internal/coordinator"
	"github.com/vgpuha/vgpuha/internal/lab/drill/etcdproc"
	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
)

// Drill settings of a coordinated pair: a standby replaced from the pool
// after a second without it (the lease is Options.CoordinatorTTL).
const (
	drillStandbyAfter = "1s"
	drillGroup        = "drill"
)

// coordinated is what a pair under a coordinator has beyond two nodes: an
// etcd cluster, a third node in the group's pool, and proxies on every
// path of the primary's except its guests' (replication to the standby,
// and each etcd member), so that a partition cuts the primary off from
// the standby and etcd while guests still reach it. Everything runs on
// loopback.
type coordinated struct {
	etcd     *etcdproc.Cluster
	link     *etcdtest.Proxy   // primary → standby replication
	toEtcd   []*etcdtest.Proxy // primary → each etcd member
	poolAddr string            // where the pair's pool standby takes a stream
	poolEP   string            // its guest endpoint (it serves only if promoted)
	ttl      time.Duration     // every node's lease
}

// startCoordinatedPair starts an etcd cluster, a standby and a pool
// standby registered in the drill's group, and a primary that leads it,
// and waits until the group records the standby in sync.
func startCoordinatedPair(bin, backend, mode string, ttl time.Duration, nodeFlags []string, standbyFlags ...string) (*pair, error) {
	p, err := newPair(bin, backend, nodeFlags, standbyFlags...)
	if err != nil {
		return nil, err
	}
	c := &coordinated{poolEP: "unix://" + filepath.Join(p.dir, "pool.sock"), ttl: ttl}
	p.coord, p.pool = c, nodeproc.New(filepath.Join(p.dir, "pool-admin.sock"))
	if err := c.connect(bin, p.dir); err != nil {
		p.stop()
		return nil, err
	}
	standbyAddr, err := nodeproc.FreeAddr()
	if err != nil {
		p.stop()
		return nil, err
	}
	if c.link, err = etcdtest.Listen(standbyAddr); err != nil {
		p.stop()
		return nil, err
	}
	direct := c.flags("etcd://" + strings.Join(c.etcd.Endpoints(), ","))
	if err := p.start(p.standby, bin, "standby", "", append([]string{"--backend", backend, "--listen", "tcp://" + standbyAddr, "--replicate.key-file", p.keyFile,
		"--guest-listen", p.standbyEP, "--admin-listen", p.standby.Admin, "--mmio", mmioMode(), "--coordinator.id", "standby",
		"--coordinator.advertise", "tcp://" + c.link.Addr()}, direct...)...); err != nil {
		p.stop()
		return nil, err
	}
	if err := p.startNamed(p.pool, "pool", bin, "standby", "", append([]string{"--backend", backend, "--listen", "tcp://" + c.poolAddr, "--replicate.key-file", p.keyFile,
		"--guest-listen", c.poolEP, "--admin-listen", p.pool.Admin, "--mmio", mmioMode(), "--coordinator.id", "pool"}, direct...)...); err != nil {
		p.stop()
		return nil, err
	}
	if err := p.start(p.primary, bin, "primary", "", append([]string{"--backend", backend, "--guest-listen", p.primaryEP, "--replicate-to", "tcp://" + c.link.Addr(),
		"--replicate.key-file", p.keyFile, "--mode", mode, "--admin-listen", p.primary.Admin, "--mmio", mmioMode(), "--coordinator.id", "primary",
		"--coordinator.standby-timeout", drillStandbyAfter}, c.flags(c.proxiedURL())...)...); err != nil {
		p.stop()
		return nil, err
	}
	if err := nodeproc.WaitFor(15*time.Second, func() bool { return p.pool.Healthy() && c.standbyInSync(c.link.Addr()) }); err != nil {
		p.stopKeepingLogs()
		return nil, fmt.Errorf("the group never recorded its standby in sync (logs in %s): %w", p.dir, err)
	}
	return p, nil
}

// connect starts the etcd cluster and the proxies the primary reaches
// it through, and picks the pool standby's address.
func (c *coordinated) connect(bin, dir string) error {
	var err error
	if c.etcd, err = etcdproc.Start(bin, dir); err != nil {
		return err
	}
	for _, ep := range c.etcd.Endpoints() {
		px, err := etcdtest.Listen(ep)
		if err != nil {
			return err
		}
		c.toEtcd = append(c.toEtcd, px)
	}
	c.poolAddr, err = nodeproc.FreeAddr()
	return err
}

// flags are a node's coordinator flags with etcd at url.
func (c *coordinated) flags(url string) []string {
	return []string{"--coordinator", url, "--coordinator.group", drillGroup, "--coordinator.ttl", c.ttl.String()}
}

// proxiedURL is etcd as the primary reaches it: through the proxies.
func (c *coordinated) proxiedURL() string {
	addrs := make([]string, len(c.toEtcd))
	for i, px := range c.toEtcd {
		addrs[i] = px.Addr()
	}
	return "etcd://" + strings.Join(addrs, ",")
}

// group reads the drill's group from etcd.
func (c *coordinated) group() (coordinator.GroupStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	gs, err := coordinator.Groups(ctx, c.etcd.Client())
	if err != nil {
		return coordinator.GroupStatus{}, err
	}
	for _, g := range gs {
		if g.Group == drillGroup {
			return g, nil
		}
	}
	return coordinator.GroupStatus{}, fmt.Errorf("no group %s in etcd", drillGroup)
}

// standbyInSync reports whether the group records addr as its in-sync
// standby.
func (c *coordinated) standbyInSync(addr string) bool {
	g, err := c.group()
	return err == nil && g.Standby.InSync(addr)
}

// partition cuts (or heals) every path of the primary's but its guests'.
func (c *coordinated) partition(cut bool) {
	c.link.Partition(cut)
	for _, px := range c.toEtcd {
		px.Partition(cut)
	}
}

func (c *coordinated) stop() {
	if c.link != nil {
		c.link.Close()
	}
	for _, px := range c.toEtcd {
		px.Close()
	}
	if c.etcd != nil {
		c.etcd.Stop()
	}
}
