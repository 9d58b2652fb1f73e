package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/coordinator"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// coordFlags are the --coordinator flags (etcd's client options).
type coordFlags struct {
	url, group, id        string
	ca, cert, key         string
	user, passwordFile    string
	ttl, standbyLossAfter time.Duration
}

func (f *coordFlags) register(fs *flag.FlagSet, withNode bool) {
	fs.StringVar(&f.url, "coordinator", "", "etcd://HOST:2379[,HOST:2379...]: leadership, fencing and standby pools in etcd (off when empty: two-node mode)")
	fs.StringVar(&f.ca, "coordinator.ca-file", "", "CA certificate that signs etcd's server certificate (TLS)")
	fs.StringVar(&f.cert, "coordinator.cert-file", "", "client certificate for etcd (TLS)")
	fs.StringVar(&f.key, "coordinator.key-file", "", "client certificate's key for etcd (TLS)")
	fs.StringVar(&f.user, "coordinator.user", "", "etcd user (auth)")
	fs.StringVar(&f.passwordFile, "coordinator.password-file", "", "file holding the etcd user's password")
	if !withNode {
		return
	}
	host, _ := os.Hostname()
	fs.StringVar(&f.group, "coordinator.group", "default", "replication group (a guest VM's primary, standby and pool)")
	fs.StringVar(&f.id, "coordinator.id", fmt.Sprintf("%s-%d", host, os.Getpid()), "this node's name in the group (unique)")
	cli.DurationVar(fs, &f.ttl, "coordinator.ttl", coordinator.DefaultTTL, time.Second, time.Hour, "lease TTL (whole seconds): a primary that cannot renew stops serving after TTL/2")
	cli.DurationVar(fs, &f.standbyLossAfter, "coordinator.standby-timeout", 3*time.Second, time.Millisecond, time.Hour, "a leader whose standby has not protected it this long takes one from the pool")
}

func (f *coordFlags) clientConfig() (clientv3.Config, error) {
	eps, err := coordinator.ParseURL(f.url)
	if err != nil {
		return clientv3.Config{}, err
	}
	tlsCfg, err := coordinator.TLSFiles{CA: f.ca, Cert: f.cert, Key: f.key}.Config()
	if err != nil {
		return clientv3.Config{}, err
	}
	cfg := clientv3.Config{Endpoints: eps, TLS: tlsCfg, Username: f.user, DialTimeout: 5 * time.Second}
	if f.passwordFile != "" {
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return cfg, fmt.Errorf("reading coordinator password: %w", err)
		}
		cfg.Password = string(bytes.TrimSpace(b))
	}
	return cfg, nil
}

// config is the node's coordinator (nil without --coordinator);
// advertise is where a standby takes a replication stream.
func (f *coordFlags) config(advertise string) (*coordinator.Config, error) {
	if f.url == "" {
		return nil, nil
	}
	cc, err := f.clientConfig()
	if err != nil {
		return nil, err
	}
	return &coordinator.Config{Endpoints: cc.Endpoints, Group: f.group, ID: f.id, Advertise: advertise,
		TLS: cc.TLS, Username: cc.Username, Password: cc.Password, TTL: f.ttl}, nil
}

// DefaultAdmin is the admin address status, verify and switchover talk to
// without --admin (the units' primary's --admin-listen).
const DefaultAdmin = "127.0.0.1:9470"

func runStatus(args []string) error {
	fs := cli.NewFlags("status", "[--admin HOST:PORT] [--json] [--watch [1s]] | --coordinator etcd://HOST:2379")
	var cf coordFlags
	cf.register(fs, false)
	adminAddr := cli.String(fs, "admin", DefaultAdmin, checkAdminAddr, "one node's admin address (HOST:PORT or unix:///PATH): print that node's status (the default, unless --coordinator is given)")
	tokenFile := adminTokenFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	watch := cli.OptionalDuration(fs, "watch", time.Second, time.Millisecond, cli.MaxDuration,
		"poll one node every this long until interrupted: --watch alone every second, --watch 100ms (a terminal is redrawn, with a resync's progress bar; anything else gets one plain line per poll)")
	if err := cli.ParseOptional(fs, args); err != nil {
		return err
	}
	adminGiven := false
	fs.Visit(func(f *flag.Flag) { adminGiven = adminGiven || f.Name == "admin" })
	if cf.url != "" && !adminGiven {
		return showGroups(&cf, *asJSON)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return showNodeStatus(ctx, os.Stdout, nodeStatusOptions{addr: *adminAddr, tokenFile: *tokenFile, asJSON: *asJSON,
		watch: *watch, tty: IsTerminal(os.Stdout)})
}

// showGroups prints every replication group's members from etcd.
func showGroups(cf *coordFlags, asJSON bool) error {
	cc, err := cf.clientConfig()
	if err != nil {
		return err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return fmt.Errorf("connecting to the coordinator: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	groups, err := coordinator.Groups(ctx, cli)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(groups)
	}
	printGroups(os.Stdout, groups, time.Now())
	return nil
}

// printGroups writes one row per member: its group, role, term, whether it
// leads or is a recorded standby, lag and age. IN SYNC is, for a standby,
// its own replica's state; for the leader, whether k standbys are in sync.
func printGroups(out io.Writer, groups []coordinator.GroupStatus, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tNODE\tROLE\tTERM\tPART\tSERVING\tIN SYNC\tLAG OPS\tADDR\tAGE")
	for _, g := range groups {
		if len(g.Members) == 0 {
			fmt.Fprintf(w, "%s\t-\t-\t%d\tno live members\t\t\t\t\t\n", g.Group, g.LeaderTerm)
		}
		for _, m := range g.Members {
			var part []string
			if m.ID == g.LeaderID {
				part = append(part, "leader")
			}
			if m.Addr != "" && g.Standby.Names(m.Addr) {
				part = append(part, "standby")
			} else if m.Addr != "" {
				part = append(part, "pool")
			}
			inSync := m.InSync
			if m.ID == g.LeaderID {
				inSync = len(g.Standby.InSyncAddrs()) >= max(g.Standby.MinInSync, 1)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%v\t%v\t%d\t%s\t%s\n", g.Group, m.ID, m.Role, m.Term, strings.Join(part, ","),
				m.Serving, inSync, m.LagOps, m.Addr, now.Sub(m.Updated).Round(time.Millisecond))
		}
	}
	w.Flush()
}
