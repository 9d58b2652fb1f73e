package drill

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/mmiotrace"
)

// pair is a primary and a standby running as child processes of the vgpuha
// binary, sharing a fresh replication key: on loopback, or each in its own
// network namespace joined by a veth link that drills can cut. Guests reach
// both through unix sockets (paths cross namespaces), and so do the admin
// endpoints.
type pair struct {
	dir                  string
	primary, standby     *nodeproc.Node
	primaryEP, standbyEP string
	netns                [2]string // primary's, standby's; empty on loopback
	// cut drops every packet on the veth link between the namespaces
	// (links.go); nil without namespaces.
	cut *linkCut
	// rejoined is the old primary's host back as a standby of the promoted
	// one (the failback fault), listening on rejoinAddr, where the standby
	// replicates to once promoted.
	rejoined              *nodeproc.Node
	rejoinAddr            string
	bin, backend, keyFile string
	// standbyBackend is the standby's backend when not backend's;
	// primaryFlags go to the primary only.
	standbyBackend string
	primaryFlags   []string
	// nodeFlags are given to every node the pair starts (limits that
	// let guests hold large state).
	nodeFlags []string
	// standbyFlags are given to every standby (the failure detector).
	standbyFlags []string
	// replAddr is where the standby listens for the primary (two nodes).
	replAddr string
	// coord is set when a coordinator decides the roles; pool is its
	// third node.
	coord *coordinated
	pool  *nodeproc.Node
}

// NetnsAvailable reports whether network namespaces can be made here.
func NetnsAvailable() bool {
	name := fmt.Sprintf("vgpuha-probe-%d", os.Getpid())
	if exec.Command("ip", "netns", "add", name).Run() != nil {
		return false
	}
	exec.Command("ip", "netns", "del", name).Run()
	return true
}

// pairSeq numbers the pairs this process makes (namespace and veth names).
var pairSeq int

// newPair makes a pair's directory, its agents' admin endpoints and a
// fresh replication key; no node runs yet. Every node it starts gets
// nodeFlags, and every standby standbyFlags too.
func newPair(bin, backend string, nodeFlags []string, standbyFlags ...string) (*pair, error) {
	dir, err := os.MkdirTemp("", "vgpuha-pair")
	if err != nil {
		return nil, err
	}
	p := &pair{dir: dir, bin: bin, backend: backend, nodeFlags: nodeFlags, standbyFlags: standbyFlags,
		primary: nodeproc.New(filepath.Join(dir, "primary-admin.sock")), standby: nodeproc.New(filepath.Join(dir, "standby-admin.sock")),
		primaryEP: "unix://" + filepath.Join(dir, "primary.sock"), standbyEP: "unix://" + filepath.Join(dir, "standby.sock")}
	key := make([]byte, 32)
	rand.Read(key)
	p.keyFile = filepath.Join(dir, "key")
	if err := os.WriteFile(p.keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// startPair starts a standby and a primary from the vgpuha binary bin,
// serving guests on endpoints of scheme (unix or shm+unix), and waits, on
// their admin endpoints, until the standby answers and the primary says
// it is protected. With standbyLater only the primary runs (unprotected)
// until joinStandby.
func startPair(bin, backend, mode string, netns bool, scheme string, nodeFlags []string, standbyLater bool, standbyFlags ...string) (*pair, error) {
	p, err := newPair(bin, backend, nodeFlags, standbyFlags...)
	if err != nil {
		return nil, err
	}
	return p, p.launch(mode, netns, scheme, standbyLater)
}

// launch starts a new pair's nodes as startPair says; on failure the
// pair is stopped.
func (p *pair) launch(mode string, netns bool, scheme string, standbyLater bool) error {
	p.primaryEP, p.standbyEP = withScheme(p.primaryEP, scheme), withScheme(p.standbyEP, scheme)
	var err error
	if p.replAddr, err = p.replicationAddr(netns); err != nil {
		p.stop()
		return err
	}
	if !standbyLater {
		if err := p.startStandby(); err != nil {
			p.stop()
			return err
		}
	}
	args := append([]string{"--backend", p.backend, "--guest-listen", p.primaryEP, "--replicate-to", "tcp://" + p.replAddr,
		"--replicate.key-file", p.keyFile, "--mode", mode, "--admin-listen", p.primary.Admin, "--mmio", mmioMode()}, p.primaryFlags...)
	if err := p.start(p.primary, p.bin, "primary", p.netns[0], args...); err != nil {
		p.stop()
		return err
	}
	if standbyLater {
		err = nodeproc.WaitFor(10*time.Second, p.primary.Healthy)
	} else {
		err = nodeproc.WaitFor(10*time.Second, func() bool { return p.standby.Healthy() && p.protected() })
	}
	if err != nil {
		p.stopKeepingLogs()
		return fmt.Errorf("primary never became ready (logs in %s): %w", p.dir, err)
	}
	return nil
}

// startStandby starts the pair's standby. Once promoted, it protects
// itself with whatever listens at the old primary's host (the failback
// fault puts a standby there).
func (p *pair) startStandby() error {
	backend := p.backend
	if p.standbyBackend != "" {
		backend = p.standbyBackend
	}
	return p.start(p.standby, p.bin, "standby", p.netns[1], "--backend", backend, "--listen", "tcp://"+p.replAddr, "--replicate.key-file", p.keyFile,
		"--guest-listen", p.standbyEP, "--admin-listen", p.standby.Admin, "--mmio", mmioMode(), "--replicate-to", "tcp://"+p.rejoinAddr)
}

// protected reports whether the pair's primary says it is protected.
func (p *pair) protected() bool {
	var st struct{ Replication struct{ State string } }
	return p.primary.Status(&st) == nil && st.Replication.State == "protected"
}

// replicationAddr returns where the standby listens for the primary: a
// free loopback port, or an address on a fresh veth link between two new
// namespaces. It sets p.rejoinAddr, the old primary's host's address for
// a standby that rejoins there.
func (p *pair) replicationAddr(netns bool) (string, error) {
	if !netns {
		var err error
		if p.rejoinAddr, err = nodeproc.FreeAddr(); err != nil {
			return "", err
		}
		return nodeproc.FreeAddr()
	}
	pairSeq++
	id := fmt.Sprintf("%d-%d", os.Getpid()%100000, pairSeq)
	p.netns = [2]string{"vgp-" + id, "vgs-" + id}
	vp, vs := "vp"+id, "vs"+id
	if len(vp) > 15 {
		vp, vs = vp[:15], vs[:15]
	}
	subnet := fmt.Sprintf("10.%d.%d", 100+pairSeq%100, os.Getpid()%250)
	steps := [][]string{
		{"netns", "add", p.netns[0]}, {"netns", "add", p.netns[1]},
		{"link", "add", vp, "type", "veth", "peer", "name", vs},
		{"link", "set", vp, "netns", p.netns[0]}, {"link", "set", vs, "netns", p.netns[1]},
		{"-n", p.netns[0], "addr", "add", subnet + ".1/24", "dev", vp},
		{"-n", p.netns[1], "addr", "add", subnet + ".2/24", "dev", vs},
		{"-n", p.netns[0], "link", "set", vp, "up"}, {"-n", p.netns[1], "link", "set", vs, "up"},
		{"-n", p.netns[0], "link", "set", "lo", "up"}, {"-n", p.netns[1], "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if out, err := exec.Command("ip", st...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("ip %v: %v: %s", st, err, out)
		}
	}
	var err error
	if p.cut, err = startLinkCut(p.netns[:], []string{vp, vs}); err != nil {
		return "", err
	}
	p.rejoinAddr = subnet + ".1:7072"
	return subnet + ".2:7071", nil
}

// servingEndpoints are the guest endpoints of the pair's nodes, the first
// primary's first.
func (p *pair) servingEndpoints() []string {
	eps := []string{p.primaryEP, p.standbyEP}
	if p.coord != nil {
		eps = append(eps, p.coord.poolEP)
	}
	return eps
}

// rejoin starts a standby on the old primary's host (its namespace,
// replication address and guest endpoint), for the promoted node to
// resync and later hand the primary role back to.
func (p *pair) rejoin() error {
	p.rejoined = nodeproc.New(filepath.Join(p.dir, "rejoined-admin.sock"))
	return p.start(p.rejoined, p.bin, "standby", p.netns[0], "--backend", p.backend, "--listen", "tcp://"+p.rejoinAddr,
		"--replicate.key-file", p.keyFile, "--guest-listen", p.primaryEP, "--admin-listen", p.rejoined.Admin, "--mmio", mmioMode())
}

// start runs `bin role args...` as a, in namespace ns unless it is empty,
// logging to role.log in the pair's directory.
func (p *pair) start(a *nodeproc.Node, bin, role, ns string, args ...string) error {
	return p.startNamed(a, role, bin, role, ns, args...)
}

// startNamed is start logging to name.log.
func (p *pair) startNamed(a *nodeproc.Node, name, bin, role, ns string, args ...string) error {
	args = append(append([]string{role}, args...), p.nodeFlags...)
	if role == "standby" {
		args = append(args, p.standbyFlags...)
	}
	a.Cmd = exec.Command(bin, args...)
	if ns != "" {
		a.Cmd = exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	}
	logf, err := os.Create(filepath.Join(p.dir, name+".log"))
	if err != nil {
		return err
	}
	defer logf.Close() // the child holds its own descriptor
	a.Cmd.Stderr = logf
	return a.Cmd.Start()
}

// partition cuts (or heals) the primary's paths to the standby and, with
// a coordinator, to etcd; its guests still reach it.
func (p *pair) partition(cut bool) error {
	if p.coord != nil {
		p.coord.partition(cut)
		return nil
	}
	if p.cut == nil {
		return errors.New("no network namespaces: the link cannot be cut")
	}
	return p.cut.set(cut)
}

// stop kills both nodes and removes their files and namespaces.
func (p *pair) stop() {
	p.stopKeepingLogs()
	os.RemoveAll(p.dir)
}

// stopKeepingLogs kills both nodes and removes their namespaces; the
// directory with their logs stays for whoever is told where it is.
func (p *pair) stopKeepingLogs() {
	for _, a := range []*nodeproc.Node{p.primary, p.standby, p.rejoined, p.pool} {
		if a == nil {
			continue
		}
		if c := a.Cmd; c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Kill()
			c.Wait()
		}
		a.HTTP.CloseIdleConnections()
	}
	if p.cut != nil {
		p.cut.stop()
	}
	for _, ns := range p.netns {
		if ns != "" {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	if p.coord != nil {
		p.coord.stop()
	}
}

// mmioMode is how the pair traces apertures: uffd where the kernel has it
// (the guest needs no ptrace then), else page.
func mmioMode() string {
	if mmiotrace.UffdAvailable() == nil {
		return "uffd"
	}
	return "page"
}
