//go:build lab

package main

import (
	"errors"

	"github.com/vgpuha/vgpuha/internal/lab/drill/etcdproc"
)

func init() {
	commands["etcd-member"] = command{"run one embedded etcd member on loopback (drill --coordinator starts three; not for production)", runEtcdMember}
}

// runEtcdMember runs one embedded etcd member: `vgpuha drill
// --coordinator` starts three as child processes (so that one can be
// killed); not meant for production.
func runEtcdMember(args []string) error {
	fs := newFlags("etcd-member", "--name NAME --dir DIR --client-port N --peer-port N --cluster NAME=http://127.0.0.1:PORT,...")
	name := fs.String("name", "", "member name")
	dir := fs.String("dir", "", "data directory")
	clientPort := intFlag(fs, "client-port", 0, 0, 65535, "loopback port for clients")
	peerPort := intFlag(fs, "peer-port", 0, 0, 65535, "loopback port for peers")
	cluster := fs.String("cluster", "", "initial cluster: NAME=http://127.0.0.1:PORT,... (empty: this member alone)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *name == "" || *dir == "" || *clientPort <= 0 || *peerPort <= 0 {
		return errors.New("--name, --dir, --client-port and --peer-port are required")
	}
	return etcdproc.RunMember(*dir, *name, *clientPort, *peerPort, *cluster)
}
