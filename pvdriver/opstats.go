package pvdriver

import (
	"fmt"
	"io"
	"sort"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Request counts, per opcode: how many requests the client sent, how many
// of those the caller waited for (a call; the rest were pipelined), and
// the time spent waiting. Remoting costs a round trip only where a caller
// waits, so these are what any work on speed starts from (issue 43).
// Counting is two atomic adds a request and a clock read a call.

// opSlots bounds the opcodes counted; abi's opcodes are far fewer.
const opSlots = 256

type opCounters struct {
	sent, waited, waitNanos [opSlots]atomic.Uint64
	// ownReads counts replies their caller read itself (replies.go): the
	// rest were handed over by another goroutine, a wake-up each.
	ownReads atomic.Uint64
}

// OpStats is one opcode's counts.
type OpStats struct {
	Op     abi.Opcode
	Sent   uint64        // requests sent
	Waited uint64        // of them, calls whose reply the caller waited for
	Wait   time.Duration // time spent waiting for those replies
}

func (o *opCounters) noteSent(op abi.Opcode) {
	if op < opSlots {
		o.sent[op].Add(1)
	}
}

func (o *opCounters) noteWaited(op abi.Opcode, d time.Duration) {
	if op < opSlots {
		o.waited[op].Add(1)
		o.addWait(op, d)
	}
}

// addWait adds d to the time spent waiting for op's replies.
func (o *opCounters) addWait(op abi.Opcode, d time.Duration) {
	if op < opSlots {
		o.waitNanos[op].Add(uint64(max(d, 0)))
	}
}

// OwnReplies is how many replies their callers read themselves, of the
// calls waited for (Stats' Waited, summed): each of the others cost a
// hand-over from the goroutine that read it.
func (c *Client) OwnReplies() uint64 { return c.stats.ownReads.Load() }

// Stats is the client's request counts so far, the most waited-for first.
func (c *Client) Stats() []OpStats {
	var out []OpStats
	for op := range abi.Opcode(opSlots) {
		if n := c.stats.sent[op].Load(); n > 0 {
			out = append(out, OpStats{Op: op, Sent: n, Waited: c.stats.waited[op].Load(),
				Wait: time.Duration(c.stats.waitNanos[op].Load())})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Wait != out[j].Wait {
			return out[i].Wait > out[j].Wait
		}
		return out[i].Sent > out[j].Sent
	})
	return out
}

// WriteStats prints stats as a table: one row an opcode, then the totals.
func WriteStats(w io.Writer, stats []OpStats) {
	var sent, waited uint64
	var wait time.Duration
	fmt.Fprintf(w, "%-22s %10s %10s %12s\n", "op", "sent", "waited", "wait")
	for _, s := range stats {
		fmt.Fprintf(w, "%-22s %10d %10d %12s\n", s.Op, s.Sent, s.Waited, s.Wait.Round(time.Microsecond))
		sent, waited, wait = sent+s.Sent, waited+s.Waited, wait+s.Wait
	}
	fmt.Fprintf(w, "%-22s %10d %10d %12s\n", "total", sent, waited, wait.Round(time.Microsecond))
}

// WriteFailovers prints the client's failovers, one line each: when it
// lost its node, where it resumed, and the pause between (what a guest
// program waited through), with how it moved (a broken connection, or a
// stall on a live one) and the requests it sent again.
func WriteFailovers(w io.Writer, fos []Failover) {
	for i, f := range fos {
		how := "connection lost"
		if f.Stalled {
			how = "stalled"
		}
		fmt.Fprintf(w, "failover %d: %s at %s, resumed on %s (term %d) after %s; %d requests sent again, %d looks\n",
			i+1, how, f.Lost.UTC().Format("15:04:05.000"), f.Endpoint, f.Term, f.Resumed.Sub(f.Lost).Round(time.Millisecond), f.Resent, f.Looks)
	}
}
