// Package etcdtest runs a real etcd for tests: an embedded single member
// (go.etcd.io/etcd/server/v3/embed) with a fast raft tick so that leases
// of one second work, and a TCP proxy that can cut one client off it (a
// partition: its connections stall, none is refused). Tests and drills
// use it; the product never does.
package etcdtest

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start runs an embedded etcd in dir until t ends and returns its client
// endpoint (HOST:PORT).
func Start(t testing.TB) string {
	t.Helper()
	e, ep, err := Run(t.TempDir(), "default", freePort(t), freePort(t), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return ep
}

// Run starts one etcd member named name with data in dir, serving clients
// on 127.0.0.1:clientPort and peers on 127.0.0.1:peerPort. cluster is the
// initial cluster (name=http://HOST:PORT,...; "" for a single member).
func Run(dir, name string, clientPort, peerPort int, cluster string) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Dir, cfg.Name = dir, name
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	if cluster == "" {
		cluster = name + "=" + pu.String()
	}
	cfg.InitialCluster = cluster
	cfg.TickMs, cfg.ElectionMs = 10, 100 // leases down to 1 s
	cfg.UnsafeNoFsync = true             // tests: a slow disk must not stall renewals
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd %s not ready after 20 s", name)
	}
	return e, cu.Host, nil
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Proxy forwards TCP connections to a target until partitioned.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// NewProxy forwards from a fresh local port to target until t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's HOST:PORT.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Partition cuts (true) or heals (false) the path: while cut, the
// connections it carried are dropped and new ones are accepted but never
// answered (like a silent network), until healed.
func (p *Proxy) Partition(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Partition(true)
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = true
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // held silent until heal closes it
		}
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut || !p.conns[c] {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[u] = true
	p.mu.Unlock()
	go func() { io.Copy(u, c); u.Close() }()
	io.Copy(c, u)
	c.Close()
}
