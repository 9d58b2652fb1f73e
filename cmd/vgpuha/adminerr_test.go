package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestAdminCommandsSpeakPlainly: verify and switchover answer in one
// readable line: at a standby they say so and where to go instead, at a
// dead address what to check; a switchover says the new term and pause.
func TestAdminCommandsSpeakPlainly(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile, tokenFile := writeKey(t, dir), filepath.Join(dir, "admin-token")
	os.WriteFile(tokenFile, []byte("test-admin-token-0123456789\n"), 0o600)
	replAddr, adminP, adminS := freePort(t), freePort(t), freePort(t)
	startNode(t, "standby", "--listen", "tcp://"+replAddr, "--replicate.key-file", keyFile, "--guest-listen",
		"unix://"+filepath.Join(dir, "s.sock"), "--admin-listen", adminS, "--admin.token-file", tokenFile)
	startPrimary(t, "--guest-listen", "unix://"+filepath.Join(dir, "p.sock"), "--admin-listen", adminP, "--admin.token-file", tokenFile,
		"--replicate-to", "tcp://"+replAddr, "--replicate.key-file", keyFile)
	waitStatus(t, adminP, "protected", nodeStatus.protected)
	dead := freePort(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"verify", "--admin", adminS}, `^vgpuha verify: ` + regexp.QuoteMeta(adminS) + ` answered 409 Conflict: this node is a standby \(term 1\): verify, switchover and epoch go to the primary's admin address\n$`},
		{[]string{"switchover", "--admin", adminS}, `^vgpuha switchover: .* 409 Conflict: this node is a standby \(term 1\)`},
		{[]string{"verify", "--admin", dead}, `^vgpuha verify: no admin endpoint at ` + regexp.QuoteMeta(dead) + ` \(connection refused\): is the node running with --admin-listen`},
		{[]string{"switchover", "--admin", adminP}, `^switched over: the standby serves under term 2; ` + regexp.QuoteMeta(adminP) + ` is fenced; guests paused \d+\.\d ms\n$`},
		{[]string{"verify", "--admin", adminP}, `this node is fenced \(a node under term 2 took over\): verify, switchover and epoch go to the new primary's admin address\n$`},
	} {
		out, err := exec.Command(vgpuhaBin, append(c.args, "--admin.token-file", tokenFile)...).CombinedOutput()
		if wantOK := strings.HasPrefix(c.args[0], "switchover") && c.args[2] == adminP; (err == nil) != wantOK {
			t.Errorf("vgpuha %v: exit %v", c.args, err)
		}
		if !regexp.MustCompile(c.want).Match(out) || strings.Count(string(out), "\n") != 1 {
			t.Errorf("vgpuha %v printed %q, want one line matching %q", c.args, out, c.want)
		}
	}
}

// TestFailbackProcedure runs contrib/failback-loopback.sh, the fail-back
// procedure of docs/OPERATIONS.md with its commands, on free loopback
// ports: the documented commands work as written.
func TestFailbackProcedure(t *testing.T) {
	skipShort(t)
	cmd := exec.Command("bash", "../../contrib/failback-loopback.sh")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(vgpuhaBin)+":"+os.Getenv("PATH"),
		"A_GUEST=tcp://"+freePort(t), "A_REPL=tcp://"+freePort(t), "A_ADMIN="+freePort(t),
		"B_GUEST=tcp://"+freePort(t), "B_REPL=tcp://"+freePort(t), "B_ADMIN="+freePort(t))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fail-back done") {
		t.Fatalf("the fail-back procedure: %v\n%s", err, out)
	}
}
