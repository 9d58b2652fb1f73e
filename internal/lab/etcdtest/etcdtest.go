// Package etcdtest runs a real etcd for tests: embedded members
// (go.etcd.io/etcd/server/v3/embed) with a fast raft tick so that leases
// of one second work, alone or as a cluster, and a proxy that can cut one
// node off a path (a partition: its connections stall, none is refused).
// Tests and drills use it; the product never does.
package etcdtest

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
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
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// FreePort returns a loopback TCP port nobody listens on now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Member is one member of a loopback cluster: its name, its ports and the
// initial cluster it starts in.
type Member struct {
	Name                 string
	ClientPort, PeerPort int
	Cluster              string // name=http://127.0.0.1:PORT,...
}

// Endpoint is the member's client HOST:PORT.
func (m Member) Endpoint() string { return fmt.Sprintf("127.0.0.1:%d", m.ClientPort) }

// Plan names the members of an n-member cluster and picks their ports.
func Plan(n int) ([]Member, error) {
	ms := make([]Member, n)
	var peers []string
	for i := range ms {
		var err error
		ms[i].Name = fmt.Sprintf("m%d", i)
		if ms[i].ClientPort, err = FreePort(); err != nil {
			return nil, err
		}
		if ms[i].PeerPort, err = FreePort(); err != nil {
			return nil, err
		}
		peers = append(peers, fmt.Sprintf("%s=http://127.0.0.1:%d", ms[i].Name, ms[i].PeerPort))
	}
	for i := range ms {
		ms[i].Cluster = strings.Join(peers, ",")
	}
	return ms, nil
}

// StartCluster runs an n-member cluster in this process until t ends and
// returns the members' client endpoints. The members start together (each
// waits for a quorum).
func StartCluster(t testing.TB, n int) []string {
	t.Helper()
	ms, err := Plan(n)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	eps := make([]string, n)
	for i, m := range ms {
		dir := t.TempDir()
		go func() {
			e, ep, err := Run(dir, m.Name, m.ClientPort, m.PeerPort, m.Cluster)
			if err == nil {
				t.Cleanup(e.Close)
				eps[i] = ep
			}
			errs <- err
		}()
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return eps
}

// Proxy forwards TCP connections to a target until partitioned.
type Proxy struct {
	ln     net.Listener
	udp    net.PacketConn
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// NewProxy forwards from a fresh local port to target until t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	p, err := Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Listen forwards TCP connections from a fresh loopback port to target
// (HOST:PORT), and UDP datagrams sent to the same port one way to target
// (a replication link's heartbeats), until Close.
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	if p.udp, err = net.ListenPacket("udp", ln.Addr().String()); err != nil {
		ln.Close()
		return nil, err
	}
	go p.serve()
	go p.forwardUDP()
	return p, nil
}

// forwardUDP sends each datagram on to the target unless cut.
func (p *Proxy) forwardUDP() {
	out, err := net.Dial("udp", p.target)
	if err != nil {
		return
	}
	defer out.Close()
	buf := make([]byte, 64<<10)
	for {
		n, _, err := p.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if !cut {
			out.Write(buf[:n])
		}
	}
}

// Addr is the proxy's HOST:PORT.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Partition cuts (true) or heals (false) the path: while cut, the
// connections it carried are dropped and new ones are accepted but never
// answered (like a silent network), and datagrams are dropped, until
// healed.
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
	p.udp.Close()
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
