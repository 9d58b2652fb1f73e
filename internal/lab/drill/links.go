package drill

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// linkControl sets links up and down in one network namespace through an
// `ip -batch` process started beforehand: a command written to it takes
// effect within a millisecond, where starting ip for it would take tens of
// ms on a loaded host (and the drill measures pauses from the moment it
// strikes).
type linkControl struct {
	ns  string
	cmd *exec.Cmd
	in  io.WriteCloser
}

func startLinkControl(ns string) (*linkControl, error) {
	cmd := exec.Command("ip", "-n", ns, "-force", "-batch", "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting ip -batch in %s: %w", ns, err)
	}
	return &linkControl{ns: ns, cmd: cmd, in: in}, nil
}

// set sets dev up or down, then waits until ip shows it so.
func (l *linkControl) set(dev string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	if _, err := fmt.Fprintf(l.in, "link set dev %s %s\n", dev, state); err != nil {
		return fmt.Errorf("ip -batch in %s: %w", l.ns, err)
	}
	return waitFor(2*time.Second, func() bool {
		out, err := exec.Command("ip", "-n", l.ns, "-o", "link", "show", "dev", dev).Output()
		return err == nil && adminUp(string(out)) == up
	})
}

// adminUp reports whether a line of `ip -o link show` has the UP flag:
// "7: vp1@if6: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu ...".
func adminUp(line string) bool {
	_, flags, _ := strings.Cut(line, "<")
	flags, _, _ = strings.Cut(flags, ">")
	for _, f := range strings.Split(flags, ",") {
		if f == "UP" {
			return true
		}
	}
	return false
}

// stop ends the ip process.
func (l *linkControl) stop() {
	l.in.Close()
	l.cmd.Wait()
}
