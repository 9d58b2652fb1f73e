// Package etcdproc owns the drill's etcd cluster as processes: Members
// `vgpuha-lab etcd-member` children on loopback, each with its own data
// directory, so that a drill can kill the leader or freeze them all like
// any process, and the member's own side (RunMember).
//
// It never decides what a drill strikes; it starts, signals and stops
// members, and the product never links it.
package etcdproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Members is how many members the drill's etcd cluster has: one may
// die and a quorum remains.
const Members = 3

// Cluster is the drill's etcd: Members `vgpuha etcd-member`
// processes on loopback, each with its own data directory, so that a
// member can be killed like any process.
type Cluster struct {
	members []etcdtest.Member
	cmds    []*exec.Cmd
	cli     *clientv3.Client
}

// Start starts the cluster's members from bin, logging to
// etcd-NAME.log in dir, and waits until it answers.
func Start(bin, dir string) (*Cluster, error) {
	ms, err := etcdtest.Plan(Members)
	if err != nil {
		return nil, err
	}
	c := &Cluster{members: ms}
	for _, m := range ms {
		cmd := exec.Command(bin, "etcd-member", "--name", m.Name, "--dir", filepath.Join(dir, "etcd-"+m.Name),
			"--client-port", strconv.Itoa(m.ClientPort), "--peer-port", strconv.Itoa(m.PeerPort), "--cluster", m.Cluster)
		logf, err := os.Create(filepath.Join(dir, "etcd-"+m.Name+".log"))
		if err != nil {
			c.Stop()
			return nil, err
		}
		cmd.Stderr = logf
		err = cmd.Start()
		logf.Close() // the child holds its own descriptor
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.cmds = append(c.cmds, cmd)
	}
	if c.cli, err = clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()}); err != nil {
		c.Stop()
		return nil, err
	}
	err = nodeproc.WaitFor(20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.cli.Put(ctx, "/vgpuha/drill/ready", "1")
		return err == nil
	})
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("the drill's etcd cluster never answered: %w", err)
	}
	return c, nil
}

// Endpoints are the members' client HOST:PORTs.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.Endpoint()
	}
	return eps
}

// Leader returns the index of the member that leads the cluster's raft.
func (c *Cluster) Leader() (int, error) {
	for i, ep := range c.Endpoints() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.cli.Status(ctx, ep)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return 0, errors.New("no etcd member says it leads")
}

// Client is a client of the cluster (closed by Stop).
func (c *Cluster) Client() *clientv3.Client { return c.cli }

// Kill SIGKILLs member i.
func (c *Cluster) Kill(i int) error { return c.cmds[i].Process.Kill() }

// SignalAll sends sig to every member (SIGSTOP freezes the cluster).
func (c *Cluster) SignalAll(sig os.Signal) error {
	for _, cmd := range c.cmds {
		if err := cmd.Process.Signal(sig); err != nil {
			return err
		}
	}
	return nil
}

// Stop kills every member.
func (c *Cluster) Stop() {
	if c.cli != nil {
		c.cli.Close()
	}
	for _, cmd := range c.cmds {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// RunMember runs one member of the drill's etcd cluster (`vgpuha
// etcd-member`) until SIGTERM or SIGINT.
func RunMember(dir, name string, clientPort, peerPort int, cluster string) error {
	e, _, err := etcdtest.Run(dir, name, clientPort, peerPort, cluster)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
	case err = <-e.Err():
	}
	e.Close()
	return err
}
