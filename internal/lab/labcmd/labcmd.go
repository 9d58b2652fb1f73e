// Package labcmd is the lab tool's command line (cmd/vgpuha-lab): the
// agent's commands (internal/agent) plus example guests, the demo,
// failover drills, the soak, benchmarks, MMIO guests and embedded etcd
// members. A drill's or the demo's nodes are this binary run as the agent.
//
// It links the test kit, an etcd server, a plotting library and an eBPF
// loader, which the agent never does; it must never be installed on a
// production host.
package labcmd

import (
	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
)

// labCommands are the commands only the lab tool has.
var labCommands = map[string]cli.Command{
	"guest":       {Summary: "run an example guest workload through pvdriver and verify it", Run: runGuest},
	"demo":        {Summary: "start a primary and run every workload against it on loopback", Run: runDemo},
	"drill":       {Summary: "inject faults into a primary/standby pair under a guest workload and measure", Run: runDrill},
	"soak":        {Summary: "kill the primary of a two-node pair again and again under guests; count lost writes, leaked sessions, refusals", Run: runSoak},
	"bench":       {Summary: "run a benchmark ('bench --help' lists them)", Run: runBench, Sub: benchmarks},
	"mmio-guest":  {Summary: "a guest that writes to apertures (the MMIO benchmark's workloads)", Run: runMMIOGuest},
	"etcd-member": {Summary: "run one embedded etcd member on loopback (drill --coordinator starts three; not for production)", Run: runEtcdMember},
}

// Program is the lab tool's command line: the agent's commands and the
// lab's.
func Program() *cli.Program {
	cmds := agent.Commands()
	for name, c := range labCommands {
		cmds[name] = c
	}
	return &cli.Program{
		Name:     "vgpuha-lab",
		Summary:  "vgpuha-lab: the vgpuha agent's commands plus the lab's (guests, demo, drills, benchmarks); not for production hosts.",
		Commands: cmds,
	}
}
