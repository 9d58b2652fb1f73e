//go:build lab

package main

// The lab build (go build -tags lab, make lab: bin/vgpuha-lab) is the
// agent plus the lab_*.go commands: example guests, the demo, failover
// drills, benchmarks, MMIO guests and embedded etcd members. It links the
// test kit, an etcd server and a plotting library, which the agent never
// does (TestAgentDependencies).
func init() {
	progName = "vgpuha-lab"
	progSummary = "vgpuha-lab: the vgpuha agent's commands plus the lab's (guests, demo, drills, benchmarks); not for production hosts."
}
