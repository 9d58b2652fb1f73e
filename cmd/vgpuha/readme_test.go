package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadmeCommands: the README opens with the two commands a newcomer
// runs (the demo, the tests), each a Makefile target; CI runs the README's
// test command; the README stays a page a newcomer reads (≤ 250 lines).
func TestReadmeCommands(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme, makefile, ci := read("README.md"), read("Makefile"), read(".ci/run")
	if n := strings.Count(readme, "\n"); n > 250 {
		t.Errorf("README.md has %d lines, want at most 250 (details go to docs/)", n)
	}
	lines := regexp.MustCompile(`(?m)^    make (\S+)`).FindAllStringSubmatch(strings.SplitN(readme, "\n## ", 2)[0], -1)
	if len(lines) != 2 || lines[0][1] != "demo" || lines[1][1] != "test" {
		t.Fatalf("README.md opens with %v, want make demo and make test", lines)
	}
	for _, target := range []string{"demo", "test"} {
		if !regexp.MustCompile(`(?m)^` + target + `:`).MatchString(makefile) {
			t.Errorf("the Makefile has no %s target", target)
		}
	}
	if !regexp.MustCompile(`(?m)^make test$`).MatchString(ci) {
		t.Errorf(".ci/run does not run the README's test command (make test):\n%s", ci)
	}
}

// TestReadmeQuickStart pastes the README's quick start into bash, as a
// newcomer would (the agent and the lab tool as this test built them, the
// pair's folder a temporary one): the guest runs and holds its session,
// verify finds primary and standby equal, and once the primary is killed
// the standby serves as primary under term 2.
func TestReadmeQuickStart(t *testing.T) {
	skipShort(t)
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := quickStart(t, string(b))
	repo, pair := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(repo, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{vgpuhaBin, labBin} {
		if err := os.Symlink(bin, filepath.Join(repo, "bin", filepath.Base(bin))); err != nil {
			t.Fatal(err)
		}
	}
	script := strings.ReplaceAll(block, "/tmp/pair", pair)
	script = strings.Replace(script, "make build lab", "true", 1) // built above
	// Its own process group, ended whatever the script left running (a
	// node a broken quick start never killed would hold the output open).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = repo
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	defer func() {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	out, err := cmd.CombinedOutput()
	logs := func() string {
		var all []string
		for _, f := range []string{"primary.log", "standby.log", "guest.log", "standby-a.log", "standby-b.log"} {
			b, _ := os.ReadFile(filepath.Join(pair, f))
			all = append(all, "---- "+f+"\n"+string(b))
		}
		return strings.Join(all, "\n")
	}
	if err != nil {
		t.Fatalf("the quick start failed: %v\n%s\n%s", err, out, logs())
	}
	text := string(out)
	t.Logf("the quick start printed:\n%s", text)
	if !regexp.MustCompile(`verified [1-9][0-9]* objects .*match=true`).MatchString(text) {
		t.Errorf("verify did not find primary and standby equal:\n%s\n%s", text, logs())
	}
	// The standby's status row, after the kill: its admin address, role,
	// term, serving.
	if !regexp.MustCompile(`(?m)^127\.0\.0\.1:19471\s+primary\s+2\s+true\b`).MatchString(text) {
		t.Errorf("after the kill the standby's status does not say primary, term 2, serving:\n%s\n%s", text, logs())
	}
	// Protected again: by the first host back as a standby after the
	// failover, by the second after the switchover.
	for _, want := range []string{`(?m)^127\.0\.0\.1:19471\s+primary\s+2\s+true\b.*\sprotected\s`,
		`(?m)^127\.0\.0\.1:19470\s+primary\s+3\s+true\b.*\sprotected\s`} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("no status row matches %s:\n%s\n%s", want, text, logs())
		}
	}
}

// quickStart is the README's quick start: its indented block from "make
// build lab" to the paragraph after it.
func quickStart(t *testing.T, readme string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "## Quick start")
	if !ok {
		t.Fatal("README.md has no Quick start section")
	}
	var lines []string
	started := false
	for _, l := range strings.Split(rest, "\n") {
		if strings.HasPrefix(l, "    make build lab") {
			started = true
		}
		if !started {
			continue
		}
		if l != "" && !strings.HasPrefix(l, "    ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(l, "    "))
	}
	if len(lines) < 10 {
		t.Fatalf("README.md's quick start block: %d lines", len(lines))
	}
	return strings.Join(lines, "\n")
}
