package drill

import (
	"context"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// probeEvery is how often a serving probe asks its node.
const probeEvery = 5 * time.Millisecond

// servingProbe watches, as a guest would, when nodes answer guests: a
// probe guest of its own per node (no failover list: it stays with its
// node) asks for the device's description every probeEvery, reconnecting
// when refused, and records when its node answered first and last. Two
// nodes served at once if the old primary answered a guest after another
// node had begun to: the overlap is measured on the drill's clock, from
// replies guests got, not from what the nodes say of themselves.
type servingProbe struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu          sync.Mutex
	first, last map[string]time.Time // by endpoint
}

// watch starts probing every endpoint.
func watch(endpoints ...string) *servingProbe {
	p := &servingProbe{stop: make(chan struct{}), first: map[string]time.Time{}, last: map[string]time.Time{}}
	for _, ep := range endpoints {
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.probe(ep) }()
	}
	return p
}

// probe asks ep until stopped.
func (p *servingProbe) probe(ep string) {
	var g *pvdriver.Client
	closed := make(chan struct{})
	go func() { // a call to a frozen node blocks; closing the client ends it
		<-p.stop
		p.mu.Lock()
		if g != nil {
			g.Close()
		}
		p.mu.Unlock()
		close(closed)
	}()
	defer func() { <-closed }()
	for !p.stopped() {
		if g == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			c, err := pvdriver.Open(ctx, ep, pvdriver.Options{GuestName: "serving-probe"})
			cancel()
			if err != nil {
				time.Sleep(probeEvery)
				continue
			}
			p.mu.Lock()
			g = c
			p.mu.Unlock()
			if p.stopped() {
				c.Close()
				return
			}
		}
		if _, err := g.DeviceInfo(); err != nil {
			p.mu.Lock()
			g.Close()
			g = nil
			p.mu.Unlock()
		} else {
			p.answered(ep, time.Now())
		}
		time.Sleep(probeEvery)
	}
}

func (p *servingProbe) answered(ep string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first[ep].IsZero() {
		p.first[ep] = at
	}
	p.last[ep] = at
}

func (p *servingProbe) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// end stops probing.
func (p *servingProbe) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
}

// overlap is how long old answered guests after any of others had begun
// to (0: never), and from when: the longest such window.
func (p *servingProbe) overlap(old string, others ...string) (time.Time, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var from time.Time
	var d time.Duration
	for _, ep := range others {
		if f := p.first[ep]; !f.IsZero() && p.last[old].Sub(f) > d {
			from, d = f, p.last[old].Sub(f)
		}
	}
	return from, d
}
