package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/agent"
)

// unitCommand is the ExecStart of a contrib/systemd unit, with the binary,
// addresses and files the unit names replaced as subst says (old, new,
// ...), the example config files for the ones `make install` puts in
// /etc/vgpuha, and --backend sim.
func unitCommand(t *testing.T, unit string, subst ...string) *exec.Cmd {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "..", "contrib", "systemd", unit))
	if err != nil {
		t.Fatal(err)
	}
	line := execStart(string(text))
	configs, err := filepath.Abs(filepath.Join("..", "..", "contrib", "config"))
	if err != nil {
		t.Fatal(err)
	}
	subst = append([]string{"/usr/local/bin/vgpuha", vgpuhaBin, "/etc/vgpuha/primary.toml", filepath.Join(configs, "primary.toml"),
		"/etc/vgpuha/standby.toml", filepath.Join(configs, "standby.toml")}, subst...)
	argv := strings.Fields(strings.NewReplacer(subst...).Replace(line))
	for _, a := range argv {
		if strings.Contains(a, "10.0.0.") || strings.HasPrefix(a, "/etc/") {
			t.Fatalf("%s: %s left unreplaced in %v", unit, a, argv)
		}
	}
	return exec.Command(argv[0], append(argv[1:], "--backend", "sim")...)
}

// startUnit starts a unit's command line as a node of the test.
func startUnit(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, stderr: &syncBuffer{}}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", cmd.Args[1], p.stderr.String())
		}
	})
	return p
}

// deposedPair runs the standby and primary units' command lines on
// loopback; the primary keeps its record in stateDir.
type deposedPair struct {
	primary, standby                 *proc
	primaryCmd                       func() *exec.Cmd
	primaryAdmin, standbyAdmin, gate string
}

func startDeposedPair(t *testing.T, stateDir string) deposedPair {
	dir := t.TempDir()
	key := writeKey(t, dir)
	token := filepath.Join(dir, "admin-token")
	os.WriteFile(token, []byte("test-admin-token-0123456789\n"), 0o600)
	repl, aRepl, aGuests, bGuests := freePort(t), freePort(t), freePort(t), freePort(t)
	p := deposedPair{primaryAdmin: freePort(t), standbyAdmin: freePort(t), gate: aGuests}
	p.standby = startUnit(t, unitCommand(t, "vgpuha-standby.service", "tcp://10.0.0.2:7071", "tcp://"+repl, "tcp://0.0.0.0:7070", "tcp://"+bGuests,
		"127.0.0.1:9471", p.standbyAdmin, "/etc/vgpuha/key", key, "/etc/vgpuha/admin-token", token, "tcp://10.0.0.1:7071", "tcp://"+aRepl))
	p.primaryCmd = func() *exec.Cmd {
		cmd := unitCommand(t, "vgpuha-primary.service", "tcp://0.0.0.0:7070", "tcp://"+aGuests, "127.0.0.1:9470", p.primaryAdmin,
			"/etc/vgpuha/admin-token", token, "tcp://10.0.0.2:7071", "tcp://"+repl, "/etc/vgpuha/key", key)
		cmd.Env = append(os.Environ(), "STATE_DIRECTORY="+stateDir) // what StateDirectory= gives the unit
		return cmd
	}
	p.primary = startUnit(t, p.primaryCmd())
	waitStatus(t, p.primaryAdmin, "protected", nodeStatus.protected)
	if _, err := os.Stat(filepath.Join(stateDir, "primary.json")); err != nil {
		t.Fatalf("the serving primary left no record: %v", err)
	}
	return p
}

// restartRefused runs the primary unit's command line again, as
// Restart=on-failure would: it must exit 3 (RestartPreventExitStatus) at
// once, saying why, and never serve guests.
func (p deposedPair) restartRefused(t *testing.T, want string) {
	t.Helper()
	start := time.Now()
	out, err := p.primaryCmd().CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != agent.ExitDeposed || !strings.Contains(string(out), "refusing to start as primary: this node was deposed") ||
		!strings.Contains(string(out), want) {
		t.Fatalf("restarted deposed primary: %v\n%s\nwant exit %d saying %q", err, out, agent.ExitDeposed, want)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the refusal took %v", time.Since(start))
	}
	if c, err := net.Dial("tcp", p.gate); err == nil {
		c.Close()
		t.Fatal("the refused primary's guest endpoint accepts connections")
	}
}

// TestDeposedPrimaryDoesNotServeAgain: the units' own command lines; a
// primary fenced by its promoted standby, and one SIGKILLed (a crash
// Restart=on-failure restarts), each refuse to start as primary again.
func TestDeposedPrimaryDoesNotServeAgain(t *testing.T) {
	skipShort(t)
	t.Run("fenced", func(t *testing.T) {
		p := startDeposedPair(t, t.TempDir())
		p.primary.cmd.Process.Signal(syscall.SIGSTOP)
		waitStatus(t, p.standbyAdmin, "promoted", nodeStatus.promoted)
		p.primary.cmd.Process.Signal(syscall.SIGCONT)
		waitStatus(t, p.primaryAdmin, "fenced", isRole("fenced"))
		waitLog(t, p.primary, "fenced; no longer serving guests")
		p.primary.cmd.Process.Signal(syscall.SIGTERM)
		p.primary.cmd.Wait()
		p.restartRefused(t, "it was fenced at")
		waitStatus(t, p.standbyAdmin, "still the serving primary", nodeStatus.promoted)
	})
	t.Run("no state directory", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "missing")
		out, err := exec.Command(vgpuhaBin, "primary", "--replicate-to", "tcp://"+freePort(t), "--replicate.key-file", writeKey(t, t.TempDir()),
			"--state-dir", missing, "--guest-listen", "tcp://"+freePort(t), "--backend", "sim").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--state-dir "+missing+": not a directory") {
			t.Fatalf("a primary whose state directory is missing: %v\n%s", err, out)
		}
	})
	t.Run("killed", func(t *testing.T) {
		p := startDeposedPair(t, t.TempDir())
		p.primary.cmd.Process.Signal(syscall.SIGKILL)
		p.primary.cmd.Wait()
		p.restartRefused(t, "stopped without handing over")
		waitStatus(t, p.standbyAdmin, "promoted", nodeStatus.promoted)
	})
}
