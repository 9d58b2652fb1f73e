package agent

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate"
)

// standbyFlags are a standby's flags: its own, and the ones every node
// takes (nodeFlags).
type standbyFlags struct {
	nodeFlags
	listen, keyFile, adminAddr, adminToken, guestListen, next, modeName, detector, advertise *string
	minInSync                                                                                *int
}

func (f *standbyFlags) register(fs *flag.FlagSet) {
	f.listen = cli.String(fs, "listen", "tcp://127.0.0.1:7071", checkTCP, "where the primary's replication stream connects: tcp://HOST:PORT")
	f.keyFile = fs.String("replicate.key-file", "", "file holding the pre-shared replication key (the primary's)")
	f.adminAddr = cli.String(fs, "admin-listen", "", checkAdminAddr, "HOST:PORT for /metrics, /healthz and /status (off when empty)")
	f.adminToken = adminTokenFlag(fs)
	f.guestListen = cli.String(fs, "guest-listen", "", CheckEndpoint, "endpoint to serve guests on once promoted; empty: never take over (a pure replica)")
	f.next = cli.String(fs, "replicate-to", "", checkTCPList, "once promoted, replicate to these next standbys: tcp://HOST:PORT[,...] (same key; under --coordinator also to the group's other standbys)")
	f.minInSync = cli.Int(fs, "replicate.min-in-sync", 1, 1, 64, "k once promoted: replies the mode holds wait for the first k caught-up standbys")
	f.modeName = cli.Choice(fs, "mode", "commit", ReplicationModes, "replication mode once promoted")
	f.detector = cli.Choice(fs, "failover.detector", "fixed", []string{"fixed", "phi"}, "failure detector: fixed (270 ms without a heartbeat) or phi (phi-accrual, threshold 8: about 270 ms on a steady link)")
	f.advertise = cli.String(fs, "coordinator.advertise", "", checkTCP, "tcp://HOST:PORT primaries reach --listen at (the group's records name it; default: --listen)")
	f.nodeFlags.register(fs, true)
}

func runStandby(args []string) error {
	fs := cli.NewFlags("standby", "--listen tcp://HOST:PORT --replicate.key-file FILE [flags]")
	var sf standbyFlags
	sf.register(fs)
	if stop, err := sf.parse(fs, args); stop {
		return err
	}
	rc, err := sf.runConfig()
	defer sf.release()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return node.Run(ctx, rc)
}

// runConfig reads the key, binds the standby's addresses and says what
// node.Run runs.
func (f *standbyFlags) runConfig() (node.RunConfig, error) {
	key, err := readKey(*f.keyFile)
	if err != nil {
		return node.RunConfig{}, err
	}
	listenAddr, err := tcpFlag("listen", *f.listen)
	if err != nil {
		return node.RunConfig{}, err
	}
	adv := listenAddr
	if *f.advertise != "" {
		if adv, err = tcpFlag("coordinator.advertise", *f.advertise); err != nil {
			return node.RunConfig{}, err
		}
	}
	rc, err := f.nodeFlags.runConfig(true, *f.guestListen, adv, f.newLog())
	if err != nil {
		return rc, err
	}
	rc.Detector, rc.AdminTokenFile, rc.Node.Key, rc.Node.MinInSync = *f.detector, *f.adminToken, key, *f.minInSync
	if rc.Node.Mode, err = replicate.ParseMode(*f.modeName); err != nil {
		return rc, err
	}
	if *f.next != "" {
		if rc.Node.ReplicateTo, err = tcpListFlag("replicate-to", *f.next); err != nil {
			return rc, err
		}
		if err := refuseSelf(rc.Node.ReplicateTo, listenAddr, adv); err != nil {
			return rc, err
		}
	}
	if err := f.claimGuestListen(*f.guestListen); err != nil {
		return rc, err
	}
	rc.Replication, rc.Admin, err = bindStandbyAddresses(*f.guestListen, listenAddr, *f.adminAddr)
	return rc, err
}

// refuseSelf refuses a standby whose --replicate-to names its own
// --listen (or --coordinator.advertise): promoted, it would stream to
// itself, be refused and retry forever, protected by nobody.
func refuseSelf(next []string, listenAddr, advertise string) error {
	for _, addr := range next {
		if sameTCPAddr(addr, listenAddr) || sameTCPAddr(addr, advertise) {
			return cli.Usage(fmt.Errorf("--replicate-to tcp://%s is this standby's own --listen: once promoted it would stream to itself; "+
				"--replicate-to names the other node's --listen (where this node's standby will listen after a takeover)", addr))
		}
	}
	return nil
}

// sameTCPAddr: a and b (HOST:PORT) name one address, by their text or,
// for IP addresses and localhost, by their IP (no name is looked up).
func sameTCPAddr(a, b string) bool {
	if a == b {
		return true
	}
	hostA, portA, errA := net.SplitHostPort(a)
	hostB, portB, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || portA != portB {
		return false
	}
	ip := func(host string) net.IP {
		if host == "localhost" {
			return net.IPv4(127, 0, 0, 1)
		}
		return net.ParseIP(host)
	}
	ipA, ipB := ip(hostA), ip(hostB)
	return ipA != nil && ipA.Equal(ipB)
}

// bindStandbyAddresses binds a standby's replication and admin addresses
// and tries its guest endpoint (served once promoted; listen.go).
func bindStandbyAddresses(guestListen, replicationAddr, adminAddr string) (replication, admin net.Listener, err error) {
	if guestListen != "" {
		if err := tryListen("guest-listen", guestListen); err != nil {
			return nil, nil, err
		}
	}
	if replication, err = listenTCP("listen", replicationAddr); err != nil {
		return nil, nil, err
	}
	if admin, err = listenAdmin(adminAddr); err != nil {
		replication.Close()
		return nil, nil, err
	}
	return replication, admin, nil
}
