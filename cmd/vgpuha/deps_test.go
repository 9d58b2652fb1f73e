package main

import (
	"os/exec"
	"strings"
	"testing"
)

// labOnly are packages the agent must never link: the test kit, the lab
// (internal/lab: drills, workloads, in-process clusters, fault injection,
// example guests; bench, the harnesses), an etcd server, plotting, an eBPF loader
// (the fault counter, kmod/faultcount, is the lab's).
var labOnly = []string{
	"testing",
	"github.com/vgpuha/vgpuha/internal/lab/",
	"github.com/vgpuha/vgpuha/bench",
	"go.etcd.io/etcd/server/",
	"gonum.org/",
	"github.com/cilium/ebpf",
}

// deps lists the packages `go build` links into the command in dir.
func deps(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", dir).Output()
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
// kit, lab package, etcd server or plotting library; the lab tool
// (./cmd/vgpuha-lab) does, which shows the check sees them.
func TestAgentDependencies(t *testing.T) {
	agent := deps(t, ".")
	if b := banned(agent); len(b) > 0 {
		t.Errorf("the agent links %d lab packages (move the command that needs them to internal/lab/labcmd): %v", len(b), b)
	}
	lab := deps(t, "../vgpuha-lab")
	for _, want := range []string{"github.com/vgpuha/vgpuha/internal/lab/drill", "go.etcd.io/etcd/server/v3/embed", "gonum.org/v1/plot", "github.com/cilium/ebpf"} {
		if !strings.Contains(" "+strings.Join(banned(lab), " ")+" ", " "+want+" ") {
			t.Errorf("the lab tool does not link %s: the check would not see it", want)
		}
	}
	t.Logf("agent: %d packages; lab tool: %d", len(agent), len(lab))
}

// TestLayers: imports point down. No product package imports the lab
// (internal/lab, bench) or cmd, no package at the top level imports one under
// internal/ (internal/node and internal/coordinator sit above them), and
// the command-line kit (internal/cli) imports no package of the module.
func TestLayers(t *testing.T) {
	const mod = "github.com/vgpuha/vgpuha/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := strings.TrimPrefix(fields[0], mod), fields[1:]
		if isLab(pkg) || strings.HasPrefix(pkg, "cmd/") {
			continue
		}
		checked++
		for _, imp := range imports {
			dep, ok := strings.CutPrefix(imp, mod)
			switch {
			case !ok:
			case isLab(dep), strings.HasPrefix(dep, "cmd/"):
				t.Errorf("product package %s imports %s", pkg, dep)
			case !strings.HasPrefix(pkg, "internal/") && strings.HasPrefix(dep, "internal/"):
				t.Errorf("%s imports %s, up the layers", pkg, dep)
			case pkg == "internal/cli":
				t.Errorf("the command-line kit imports %s: it must stay below every package (both binaries share it)", dep)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d product packages listed", checked)
	}
}

// isLab reports whether pkg (a path inside the module) is a lab package:
// under internal/lab, or bench, which the customer's layout keeps at the
// top level.
func isLab(pkg string) bool {
	return strings.HasPrefix(pkg, "internal/lab/") || pkg == "bench" || strings.HasPrefix(pkg, "bench/")
}
