// Command vgpuha is the agent that runs on every GPU host: primary,
// standby, status, verify, switchover, run, version and completion
// (internal/agent). It links no test kit, workload, etcd server, plotting
// library or eBPF loader (TestAgentDependencies holds it to that); the lab
// tool is cmd/vgpuha-lab.
package main

import (
	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/node"
)

func main() {
	node.RunWorkerIfAsked() // a GPU worker this binary's node started
	agent.Program().Main()
}
