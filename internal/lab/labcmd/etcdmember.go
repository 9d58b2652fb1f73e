package labcmd

import (
	"errors"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/drill/etcdproc"
)

// runEtcdMember runs one embedded etcd member: `vgpuha drill
// --coordinator` starts three as child processes (so that one can be
// killed); not meant for production.
func runEtcdMember(args []string) error {
	fs := cli.NewFlags("etcd-member", "--name NAME --dir DIR --client-port N --peer-port N --cluster NAME=http://127.0.0.1:PORT,...")
	name := fs.String("name", "", "member name")
	dir := fs.String("dir", "", "data directory")
	clientPort := cli.Int(fs, "client-port", 0, 0, 65535, "loopback port for clients")
	peerPort := cli.Int(fs, "peer-port", 0, 0, 65535, "loopback port for peers")
	cluster := fs.String("cluster", "", "initial cluster: NAME=http://127.0.0.1:PORT,... (empty: this member alone)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *name == "" || *dir == "" || *clientPort <= 0 || *peerPort <= 0 {
		return errors.New("--name, --dir, --client-port and --peer-port are required")
	}
	return etcdproc.RunMember(*dir, *name, *clientPort, *peerPort, *cluster)
}
