package drill

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
)

// linkCut drops every packet on a veth link, both ways, and lets them
// through again, without touching the link's state: each end gets a root
// qdisc that queues nothing (pfifo, limit 0), as a switch that loses
// every frame would. Setting the link down instead is another fault, a
// pulled cable: the kernel flushes the link's routes and neighbour
// entries, and after it comes up a lost ARP request is retried only a
// second later, so a 100 ms cut was heard as a second of silence.
//
// Commands go through a `tc -batch` process per namespace, started
// beforehand: a command written to it takes effect within a millisecond,
// where starting tc for it would take tens of ms on a loaded host (and the
// drill measures pauses from the moment it strikes).
type linkCut struct {
	ends []linkEnd
}

// linkEnd is one end of the link: a device in a namespace.
type linkEnd struct {
	ns, dev string
	cmd     *exec.Cmd
	in      io.WriteCloser
}

// startLinkCut prepares to cut the link whose ends are devs[i] in
// namespaces[i].
func startLinkCut(namespaces, devs []string) (*linkCut, error) {
	c := &linkCut{}
	for i, ns := range namespaces {
		cmd := exec.Command("tc", "-n", ns, "-force", "-batch", "-")
		in, err := cmd.StdinPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("starting tc -batch in %s: %w", ns, err)
		}
		c.ends = append(c.ends, linkEnd{ns: ns, dev: devs[i], cmd: cmd, in: in})
	}
	return c, nil
}

// set cuts the link (every packet dropped) or heals it, then waits until
// tc shows every end so.
func (c *linkCut) set(cut bool) error {
	for _, e := range c.ends {
		line := fmt.Sprintf("qdisc del dev %s root\n", e.dev)
		if cut {
			line = fmt.Sprintf("qdisc replace dev %s root pfifo limit 0\n", e.dev)
		}
		if _, err := io.WriteString(e.in, line); err != nil {
			return fmt.Errorf("tc -batch in %s: %w", e.ns, err)
		}
	}
	for _, e := range c.ends {
		err := nodeproc.WaitFor(2*time.Second, func() bool {
			out, err := exec.Command("tc", "-n", e.ns, "qdisc", "show", "dev", e.dev, "root").Output()
			return err == nil && dropsAll(string(out)) == cut
		})
		if err != nil {
			return fmt.Errorf("%s in %s: %w", e.dev, e.ns, err)
		}
	}
	return nil
}

// dropsAll reports whether `tc qdisc show` output names the cut's qdisc:
// "qdisc pfifo 8001: root refcnt 2 limit 0p".
func dropsAll(out string) bool {
	return strings.Contains(out, "qdisc pfifo ") && strings.Contains(out, " limit 0p")
}

// stop ends the tc processes.
func (c *linkCut) stop() {
	for _, e := range c.ends {
		e.in.Close()
		e.cmd.Wait()
	}
}

// limitLink makes the primary's end of the pair's veth link send at most
// rate bytes per second (tc's token bucket filter: a burst of 64 KiB,
// packets queued up to 100 ms beyond it).
func (p *pair) limitLink(rate int64) error {
	if p.cut == nil || len(p.cut.ends) == 0 {
		return fmt.Errorf("a link rate needs the pair in network namespaces")
	}
	e := p.cut.ends[0]
	out, err := exec.Command("tc", "-n", e.ns, "qdisc", "replace", "dev", e.dev, "root", "tbf",
		"rate", fmt.Sprintf("%dbit", rate*8), "burst", "64kb", "latency", "100ms").CombinedOutput()
	if err != nil {
		return fmt.Errorf("limiting %s in %s to %d B/s: %v: %s", e.dev, e.ns, rate, err, out)
	}
	return nil
}
