package drill

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
)

// Guest transports the drill runs its guest over. Over unix the guest
// reaches the primary through a proxy (which the guest-cut fault cuts);
// over shared memory it maps rings with the node itself, so it connects
// to the primary directly (no proxy can carry a memory file), and both
// nodes listen with the shm+unix scheme (the socket serves plain unix
// guests too).
const (
	TransportUnix = "unix"
	TransportShm  = "shm"
)

// validTransport refuses a transport the drill cannot run, and a fault
// it cannot drill over it.
func (o Options) validTransport() error {
	switch o.transport() {
	case TransportUnix:
		return nil
	case TransportShm:
	default:
		return fmt.Errorf("unknown transport %q (valid: %s, %s)", o.Transport, TransportUnix, TransportShm)
	}
	switch {
	case runtime.GOOS != "linux":
		return errors.New("--transport shm needs Linux (memfd, SCM_RIGHTS)")
	case o.Coordinator:
		return errors.New("--transport shm is drilled by two nodes, not with --coordinator")
	}
	for _, name := range o.Faults {
		if f := lookup(name); f != nil && !f.overShm() {
			return fmt.Errorf("fault %q is not drilled over --transport shm: its guest's connection goes through a proxy", name)
		}
	}
	return nil
}

func (o Options) transport() string {
	if o.Transport == "" {
		return TransportUnix
	}
	return o.Transport
}

// overShm reports whether f can be drilled with a guest on shared memory.
func (f *fault) overShm() bool { return f.name != "guest-cut" }

// guestScheme is the endpoint scheme the pair's nodes serve guests on.
func guestScheme(transport string) string {
	if transport == TransportShm {
		return "shm+unix"
	}
	return "unix"
}

// withScheme gives a unix:// endpoint another scheme.
func withScheme(ep, scheme string) string {
	return scheme + "://" + strings.TrimPrefix(ep, "unix://")
}
