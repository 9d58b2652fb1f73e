package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// memberEnv, set in a test binary's environment, makes RunMemberIfAsked
// run one etcd member instead of the tests: name;dir;clientPort;peerPort;cluster.
const memberEnv = "VGPUHA_ETCDTEST_MEMBER"

// RunMemberIfAsked runs the etcd member StartProcesses asked this process
// for, until it is killed, and never returns; without the ask it returns
// at once. A test package that uses StartProcesses calls it first thing
// in its TestMain.
func RunMemberIfAsked() {
	spec := os.Getenv(memberEnv)
	if spec == "" {
		return
	}
	f := strings.SplitN(spec, ";", 5)
	if len(f) != 5 {
		fmt.Fprintf(os.Stderr, "%s=%q: want name;dir;clientPort;peerPort;cluster\n", memberEnv, spec)
		os.Exit(2)
	}
	client, err1 := strconv.Atoi(f[2])
	peer, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: bad ports\n", memberEnv, spec)
		os.Exit(2)
	}
	e, _, err := Run(f[1], f[0], client, peer, f[4])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = <-e.Err()
	fmt.Fprintln(os.Stderr, "etcd member ended:", err)
	os.Exit(1)
}

// Processes is a loopback etcd cluster whose members are processes (this
// test binary run again, see RunMemberIfAsked), so that a test can freeze
// one (SIGSTOP) as it would a real member.
type Processes struct {
	cmds []*exec.Cmd
	eps  []string
}

// StartProcesses starts an n-member cluster of processes that live until
// t ends and waits until it answers.
func StartProcesses(t testing.TB, n int) *Processes {
	t.Helper()
	ms, err := Plan(n)
	if err != nil {
		t.Fatal(err)
	}
	p := &Processes{}
	for _, m := range ms {
		spec := strings.Join([]string{m.Name, t.TempDir(), strconv.Itoa(m.ClientPort), strconv.Itoa(m.PeerPort), m.Cluster}, ";")
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), memberEnv+"="+spec)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		p.cmds = append(p.cmds, cmd)
		p.eps = append(p.eps, m.Endpoint())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: p.eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "/etcdtest/ready", "1")
		cancel()
		if err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the etcd cluster of processes never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Endpoints are the members' client HOST:PORTs.
func (p *Processes) Endpoints() []string { return p.eps }
