// Command vgpuha-lab is the lab tool (internal/lab/labcmd): the agent's
// commands plus example guests, the demo, failover drills, the soak,
// benchmarks, MMIO guests and embedded etcd members. It links the test
// kit and an etcd server; it is not for production hosts.
package main

import (
	"github.com/vgpuha/vgpuha/internal/lab/labcmd"
	"github.com/vgpuha/vgpuha/internal/node"
)

func main() {
	node.RunWorkerIfAsked() // a GPU worker this binary's node started
	labcmd.Program().Main()
}
