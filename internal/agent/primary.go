package agent

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate"
)

// primaryReplication sets a primary's standbys, key, mode and k from its
// flags.
func primaryReplication(ncfg *node.Config, replicateTo, keyFile, modeName string, minInSync int) error {
	var err error
	if replicateTo != "" {
		if ncfg.ReplicateTo, err = tcpListFlag("replicate-to", replicateTo); err != nil {
			return err
		}
		if ncfg.Key, err = readKey(keyFile); err != nil {
			return err
		}
	}
	if ncfg.Mode, err = replicate.ParseMode(modeName); err != nil {
		return err
	}
	ncfg.MinInSync = minInSync
	return nil
}

func runPrimary(args []string) error {
	return servePrimary(cli.NewFlags("primary", "--guest-listen ENDPOINT [flags]"), args, nil)
}

// primaryFlags are a primary's flags: its own, and the ones every node
// takes (nodeFlags).
type primaryFlags struct {
	nodeFlags
	listen, adminAddr, adminToken, replicateTo, modeName, keyFile, stateDir *string
	minInSync                                                               *int
	maxLag, resyncBudget, resyncRate, sessionShare, readCheck               *int64
	guestShare                                                              float64
	resyncStall                                                             *time.Duration
}

func (p *primaryFlags) register(fs *flag.FlagSet, defaultListen string) {
	p.listen = cli.String(fs, "guest-listen", defaultListen, CheckEndpoint, "endpoint guests connect to: unix:///PATH, tcp://HOST:PORT or vsock://CID|any:PORT")
	p.adminAddr = cli.String(fs, "admin-listen", "", checkAdminAddr, "HOST:PORT (or unix:///PATH) for /metrics, /healthz, /status, POST /verify and POST /epoch (off when empty)")
	p.adminToken = adminTokenFlag(fs)
	p.replicateTo = cli.String(fs, "replicate-to", "", checkTCPList, "standbys to stream every state change to, in priority order: tcp://HOST:PORT[,tcp://HOST:PORT...] (off when empty)")
	p.minInSync = cli.Int(fs, "replicate.min-in-sync", 1, 1, 64, "k: replies the mode holds wait for the first k caught-up standbys; with fewer, for those there are (under --coordinator once etcd records it)")
	p.modeName = cli.Choice(fs, "mode", "commit", ReplicationModes, "replication mode: sync, commit, async or epoch")
	p.keyFile = fs.String("replicate.key-file", "", "file holding the pre-shared replication key (at least 16 bytes)")
	p.maxLag = cli.Size[int64](fs, "replicate.max-lag-bytes", 256<<20, 1<<20, cli.MaxInt64, "unapplied log bytes held before guests are slowed down (the async mode's lag bound)")
	p.sessionShare = cli.Size[int64](fs, "replicate.session-share-bytes", replicate.DefaultSessionShare, 0, cli.MaxInt64, "bytes of one guest session's records the log holds that the standbys have not received; past them that session waits for its own backlog, so one busy guest does not hold up the others' replies (0: no share, a session may fill the log up to --replicate.max-lag-bytes)")
	p.readCheck = cli.Size[int64](fs, "replicate.read-check-bytes", replicate.DefaultReadCheckMin, 0, cli.MaxInt64, "a guest's read of this many bytes or more goes to the standbys as a checksum, its bytes only where a standby's differ, and its reply waits until they applied it (commit and sync modes; 0: every read's bytes go, as a write the standbys apply)")
	p.resyncBudget = cli.Size[int64](fs, "replicate.resync-budget-bytes", 0, 0, cli.MaxInt64, "log bytes kept while a resync streams (0: a quarter of the snapshot, at least 1 GiB): guests write half of it freely, the rest as the snapshot goes out (each write waits at most --replicate.resync-stall for it), then wait for the stream; only a single write larger than it restarts the resync")
	cli.FractionVar(fs, &p.guestShare, "replicate.resync-guest-share", 0, 0, 1, "most of the link guests' writes take while a standby joins, 0 to 1 (0: half the resync budget at once, the rest as the snapshot goes out)")
	p.resyncStall = cli.Duration(fs, "replicate.resync-stall", replicate.DefaultResyncStall, time.Millisecond, time.Minute, "longest one guest write waits for a resync's snapshot stream to earn it room in the log (the bound on a guest call's slowdown while a standby joins, whatever the memory size)")
	p.resyncRate = cli.Size[int64](fs, "replicate.resync-rate", 0, 0, cli.MaxInt64, "bytes per second a resync streams at most (0: as fast as the link takes it)")
	p.stateDir = stateDirFlag(fs)
	p.nodeFlags.register(fs, false)
}

// servePrimary runs a primary until a signal, or, with a guest program,
// until that program exits (vgpuha run).
func servePrimary(fs *flag.FlagSet, args []string, guest []string) error {
	defaultListen, cleanup, err := guestEndpoint(guest)
	if err != nil {
		return err
	}
	defer cleanup()
	var pf primaryFlags
	pf.register(fs, defaultListen)
	if stop, err := pf.parse(fs, args); stop {
		return err
	}
	rc, err := pf.runConfig()
	defer pf.release()
	if err != nil {
		return err
	}
	if guest != nil {
		rc.OnReady = guestProgram(guest, *pf.listen, pf.hv.MMIO, rc.Registry)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return node.Run(ctx, rc)
}

// guestEndpoint is a primary's default guest endpoint: for vgpuha run, a
// socket in a directory of its own that cleanup removes.
func guestEndpoint(guest []string) (endpoint string, cleanup func(), err error) {
	if guest == nil {
		return "unix:///tmp/vgpuha.sock", func() {}, nil
	}
	dir, err := os.MkdirTemp("", "vgpuha-run")
	if err != nil {
		return "", nil, err
	}
	return "unix://" + dir + "/guest.sock", func() { os.RemoveAll(dir) }, nil
}

// runConfig checks that this node may serve as primary (its pair record),
// binds its addresses, reads its key and says what node.Run runs.
func (p *primaryFlags) runConfig() (node.RunConfig, error) {
	log := p.newLog()
	record := pairRecord(*p.stateDir, *p.replicateTo, p.coord.url)
	if err := record.refuseIfDeposed(); err != nil {
		return node.RunConfig{}, err
	}
	if err := p.claimGuestListen(*p.listen); err != nil {
		return node.RunConfig{}, err
	}
	if err := tryListen("guest-listen", *p.listen); err != nil {
		return node.RunConfig{}, err
	}
	rc, err := p.nodeFlags.runConfig(false, *p.listen, "", log)
	if err != nil {
		return rc, err
	}
	if rc.Admin, err = listenAdmin(*p.adminAddr); err != nil {
		return rc, err
	}
	rc.AdminTokenFile = *p.adminToken
	n := &rc.Node
	n.MaxLagBytes, n.ResyncBudgetBytes, n.ResyncStall, n.ResyncGuestShare, n.ResyncRate = *p.maxLag, *p.resyncBudget, *p.resyncStall, p.guestShare, *p.resyncRate
	n.SessionShareBytes, n.ReadCheckBytes = *p.sessionShare, *p.readCheck
	if n.ReadCheckBytes == 0 {
		n.ReadCheckBytes = -1 // the flag's 0: no read is checked
	}
	if n.SessionShareBytes == 0 {
		n.SessionShareBytes = -1 // the flag's 0 is no share; the node's, the default
	}
	rc.OnServe = func(n *node.Node) error { return record.serving(n, log) }
	rc.OnFenced = func(term uint64) { record.fenced(term, log) }
	return rc, primaryReplication(n, *p.replicateTo, *p.keyFile, *p.modeName, *p.minInSync)
}
