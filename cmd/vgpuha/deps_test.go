package main

import (
	"os/exec"
	"strings"
	"testing"
)

// labOnly are packages the agent must never link: the test kit and the
// lab (drills, workloads, in-process clusters, fault injection, example
// guests, harnesses), an etcd server, plotting.
var labOnly = []string{
	"testing",
	"github.com/vgpuha/vgpuha/internal/lab/bench",
	"github.com/vgpuha/vgpuha/internal/lab/drill",
	"github.com/vgpuha/vgpuha/internal/lab/workload",
	"github.com/vgpuha/vgpuha/internal/lab/cluster",
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest",
	"github.com/vgpuha/vgpuha/internal/lab/faultnet",
	"github.com/vgpuha/vgpuha/internal/lab/vmtest",
	"github.com/vgpuha/vgpuha/internal/lab/mmioguest",
	"go.etcd.io/etcd/server/",
	"gonum.org/",
}

// deps lists the packages `go build` links into cmd/vgpuha with tags.
func deps(t *testing.T, tags string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-tags", tags, "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	return strings.Fields(string(out))
}

// banned reports the packages of list that labOnly names (a prefix, or
// the package itself).
func banned(list []string) []string {
	var out []string
	for _, p := range list {
		for _, b := range labOnly {
			if p == b || strings.HasSuffix(b, "/") && strings.HasPrefix(p, b) || strings.HasPrefix(p, b+"/") {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// TestAgentDependencies: the agent (go build ./cmd/vgpuha) links no test
// kit, lab package, etcd server or plotting library; the lab tool (-tags
// lab) does, which shows the check sees them.
func TestAgentDependencies(t *testing.T) {
	agent := deps(t, "")
	if b := banned(agent); len(b) > 0 {
		t.Errorf("the agent links %d lab packages (move the command that needs them to a lab_*.go file with //go:build lab): %v", len(b), b)
	}
	lab := deps(t, "lab")
	for _, want := range []string{"github.com/vgpuha/vgpuha/internal/lab/drill", "go.etcd.io/etcd/server/v3/embed", "gonum.org/v1/plot"} {
		if !strings.Contains(" "+strings.Join(banned(lab), " ")+" ", " "+want+" ") {
			t.Errorf("the lab tool does not link %s: the check would not see it", want)
		}
	}
	t.Logf("agent: %d packages; lab tool: %d", len(agent), len(lab))
}
