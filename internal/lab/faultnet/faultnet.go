// Package faultnet injects network faults between a guest and a node: a
// proxy that forwards stream connections to a target until Cut drops every
// connection it carries (a network blip seen by both ends as a reset), or
// Freeze silences them (a frozen node, seen by the guest as a connection
// that stays open and never answers). Tests and drills use it; the product
// never does.
package faultnet

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// Proxy forwards connections from its endpoint to a target endpoint.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	frozen atomic.Bool
	closed chan struct{} // closed by Close
	once   sync.Once
}

// Listen starts a proxy on listen (an endpoint URL) forwarding to target.
func Listen(listen, target string) (*Proxy, error) {
	ln, err := transport.Listen(listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, closed: make(chan struct{})}
	go p.serve()
	return p, nil
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.frozen.Load() { // taken, never answered
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			continue
		}
		u, err := transport.Dial(context.Background(), p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

// pipe forwards src to dst and closes dst when src ends, unless the proxy
// is frozen: then it stops reading, as a frozen node does (what src sends
// fills the socket's buffers and then blocks its writer), and dst stays
// open until Close, even after src ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		if p.frozen.Load() {
			<-p.closed
			return
		}
		n, err := src.Read(buf)
		if p.frozen.Load() {
			continue // read as the freeze came: dropped, never delivered
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
}

// Freeze stops forwarding for good: every connection the proxy carries
// stays open both ways and carries nothing more (nor reads: a guest's
// writes fill the buffers, then block), even once the target
// closes its end, and new ones are taken but never answered, as a frozen
// (SIGSTOPped) node looks to its guests.
func (p *Proxy) Freeze() { p.frozen.Store(true) }

// Cut drops every connection the proxy carries; new ones are still taken.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() {
	p.once.Do(func() { close(p.closed) })
	p.ln.Close()
	p.Cut()
}
