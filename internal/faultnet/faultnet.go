// Package faultnet injects network faults between a guest and a node: a
// proxy that forwards stream connections to a target until Cut drops every
// connection it carries (a network blip seen by both ends as a reset).
// Tests and drills use it; the product never does.
package faultnet

import (
	"context"
	"io"
	"net"
	"sync"

	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// Proxy forwards connections from its endpoint to a target endpoint.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
}

// Listen starts a proxy on listen (an endpoint URL) forwarding to target.
func Listen(listen, target string) (*Proxy, error) {
	ln, err := transport.Listen(listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target}
	go p.serve()
	return p, nil
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := transport.Dial(context.Background(), p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { io.Copy(u, c); u.Close() }()
		go func() { io.Copy(c, u); c.Close() }()
	}
}

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
	p.ln.Close()
	p.Cut()
}
