// Package agent is the command line of the agent that runs on every GPU
// host: primary, standby, status, verify, switchover, run and version
// (internal/cli adds completion). It parses and checks flags, builds nodes
// only through node.Run and prints what nodes and the coordinator answer.
// cmd/vgpuha runs its Program; the lab tool (cmd/vgpuha-lab) runs the same
// commands beside its own, so a drill's nodes are this code.
//
// It must never import the lab (internal/lab): the agent links no test
// kit, workload, etcd server, plotting library or eBPF loader
// (cmd/vgpuha's TestAgentDependencies holds it to that).
package agent

import "github.com/vgpuha/vgpuha/internal/cli"

// Commands returns a new table of the agent's commands.
func Commands() map[string]cli.Command {
	return map[string]cli.Command{
		"primary":    {Summary: "serve guests' GPU calls on the local backend", Run: runPrimary},
		"standby":    {Summary: "apply a primary's replication stream to a replica GPU", Run: runStandby},
		"verify":     {Summary: "compare every object on primary and standby (and repair)", Run: runVerify},
		"switchover": {Summary: "hand the primary role to the standby with nothing lost (maintenance, migration)", Run: runSwitchover},
		"run":        {Summary: "serve one guest program started here, tracing its aperture writes: run [flags] -- PROGRAM ARGS", Run: runRun},
		"version":    {Summary: "print the version and the commit it was built from", Run: runVersion},
		"status":     {Summary: "one node's status (--admin), or every replication group's members from the coordinator (etcd)", Run: runStatus},
	}
}

// Program is the agent's command line.
func Program() *cli.Program {
	return &cli.Program{
		Name:     "vgpuha",
		Summary:  "vgpuha keeps a guest's GPU state alive when its host dies: the agent that runs on every GPU host.",
		Commands: Commands(),
	}
}
