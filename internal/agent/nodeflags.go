package agent

import (
	"flag"
	"io"
	"log/slog"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/node"
)

// nodeFlags are the flags primary and standby share: the backend, the
// hypervisor's limits, the coordinator, the pair, logging and --config.
type nodeFlags struct {
	backend BackendFlags
	coord   coordFlags
	pair    pairFlags
	hv      hypervisor.Config
	newLog  func() *slog.Logger
	config  *string
	show    *bool
	// claim holds the node's unix guest socket path (claimGuestSocket)
	// until the command returns.
	claim io.Closer
}

// claimGuestListen claims a unix guest endpoint's path for this node.
func (f *nodeFlags) claimGuestListen(endpoint string) error {
	c, err := claimGuestSocket("guest-listen", endpoint)
	f.claim = c
	return err
}

// release lets go of what the node claimed.
func (f *nodeFlags) release() {
	if f.claim != nil {
		f.claim.Close()
	}
}

func (f *nodeFlags) register(fs *flag.FlagSet, standby bool) {
	f.coord.register(fs, true)
	f.pair.register(fs, standby)
	f.backend.Register(fs)
	f.hv = hypervisor.DefaultConfig()
	configFlags(fs, &f.hv)
	workersFlag(fs, &f.backend)
	f.newLog = cli.LogFlag(fs)
	f.config = cli.ConfigFlag(fs)
	f.show = fs.Bool("config.show", false, "print every flag's effective value and where it came from (flag, env, file, default), then exit")
}

// parse parses args, then the environment and --config; stop is true
// when --config.show printed the values and the command is done.
func (f *nodeFlags) parse(fs *flag.FlagSet, args []string) (stop bool, err error) {
	source, err := cli.ParseWithConfig(fs, args, f.config)
	if err != nil || !*f.show {
		return err != nil, err
	}
	cli.PrintConfig(fs, source)
	return true, nil
}

// runConfig is what the shared flags say of a node's life: advertise is
// where a standby takes its stream (the coordinator's records name it).
func (f *nodeFlags) runConfig(standby bool, guestListen, advertise string, log *slog.Logger) (node.RunConfig, error) {
	f.backend.Spares = min(f.backend.Spares, f.hv.MaxSessions) // no more contexts ahead than sessions that could take them
	if f.backend.Workers == "auto" && f.hv.GuestKernels {
		f.backend.Workers = "on"
	}
	rc := node.RunConfig{Standby: standby, GPU: f.backend.gpu(), Registry: newRegistry()}
	rc.Node = node.Config{Hypervisor: f.hv, Logger: log, GuestListen: guestListen, StandbyLossAfter: f.coord.standbyLossAfter}
	f.pair.apply(&rc.Node)
	var err error
	rc.Etcd, err = f.coord.config(advertise)
	return rc, err
}
