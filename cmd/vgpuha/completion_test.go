package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// helpFlags lists the flags `vgpuha ARGS --help` prints (its "  --name"
// lines): what a completion script must offer for that command.
func helpFlags(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command(labBin, append(args, "--help")...).Output()
	if err != nil {
		t.Fatalf("vgpuha %v --help: %v", args, err)
	}
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  (--[a-z0-9.-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// TestCompletion: every shell's script passes that shell's syntax check
// and names every command, benchmark and flag --help lists; bash and fish
// complete real command lines (commands, benchmarks, a command's flags, a
// choice flag's values).
func TestCompletion(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	commandsOut, err := exec.Command(labBin, "help").Output()
	if err != nil {
		t.Fatal(err)
	}
	var cmds [][]string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z-]+) `).FindAllStringSubmatch(string(commandsOut), -1) {
		if m[1] != "bench" && m[1] != "completion" {
			cmds = append(cmds, []string{m[1]})
		}
	}
	for _, b := range []string{"pv", "replicate", "resync", "apply", "mmio", "fairness", "step"} {
		cmds = append(cmds, []string{"bench", b})
	}
	if len(cmds) < 15 {
		t.Fatalf("vgpuha help lists %d commands:\n%s", len(cmds), commandsOut)
	}
	syntax := map[string][]string{"bash": {"bash", "-n"}, "zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		script, err := exec.Command(labBin, "completion", shell).Output()
		if err != nil {
			t.Fatalf("completion %s: %v", shell, err)
		}
		path := filepath.Join(dir, "vgpuha."+shell)
		os.WriteFile(path, script, 0o644)
		if _, err := exec.LookPath(shell); err != nil {
			t.Logf("no %s here: its script's syntax is not checked", shell)
		} else if out, err := exec.Command(syntax[shell][0], append(syntax[shell][1:], path)...).CombinedOutput(); err != nil {
			t.Errorf("%s -n on the %s script: %v\n%s", shell, shell, err, out)
		}
		for _, c := range cmds {
			if !strings.Contains(string(script), c[len(c)-1]) {
				t.Errorf("the %s script lacks the command %v", shell, c)
			}
			section := scriptSection(string(script), shell, strings.Join(c, " "))
			for _, f := range helpFlags(t, c...) {
				if !regexp.MustCompile(regexp.QuoteMeta(flagWord(shell, f)) + `\b`).MatchString(section) {
					t.Errorf("the %s script lacks %s of %v", shell, f, c)
				}
			}
		}
	}
	if _, err := exec.LookPath("fish"); err == nil {
		for line, want := range map[string][]string{
			"vgpuha sta":                   {"standby", "status"},
			"vgpuha status --wa":           {"--watch"},
			"vgpuha bench ":                {"apply", "fairness", "mmio", "pv", "replicate", "resync", "step"},
			"vgpuha bench mmio --pl":       {"--plot"},
			"vgpuha primary --log.level ":  {"debug", "error", "info", "warn"},
			"vgpuha completion ":           {"bash", "fish", "zsh"},
			"vgpuha standby --replicate.k": {"--replicate.key-file"},
		} {
			out, err := exec.Command("fish", "-c", "source "+filepath.Join(dir, "vgpuha.fish")+"; complete -C '"+labLine(line)+"'").Output()
			if got := firstFields(string(out)); err != nil || !slices.Equal(got, want) {
				t.Errorf("fish completes %q to %v (%v), want %v", line, got, err, want)
			}
		}
	}
	for line, want := range map[string][]string{
		"vgpuha sta":                     {"standby", "status"},
		"vgpuha status --wa":             {"--watch"},
		"vgpuha bench ":                  {"apply", "fairness", "mmio", "pv", "replicate", "resync", "step"},
		"vgpuha bench mmio --pl":         {"--plot"},
		"vgpuha primary --log.level ":    {"debug", "info", "warn", "error"},
		"vgpuha primary --log.format=j":  {"json"},
		"vgpuha completion ":             {"bash", "fish", "zsh"},
		"vgpuha help sw":                 {"switchover"},
		"vgpuha standby --replicate.k":   {"--replicate.key-file"},
		"vgpuha standby --config ":       nil, // a file name: left to bash's default
		"vgpuha verify --json --rep":     {"--repair"},
		"vgpuha switchover --admin.tok":  {"--admin.token-file"},
		"vgpuha primary --backend sim -": nil, // checked below: every primary flag
	} {
		if want == nil && strings.HasSuffix(line, "-") {
			want = helpFlags(t, "primary")
		}
		if got := bashComplete(t, filepath.Join(dir, "vgpuha.bash"), "_vgpuha_lab", labLine(line)); !slices.Equal(got, want) {
			t.Errorf("bash completes %q to %v, want %v", labLine(line), got, want)
		}
	}
	agentScript, err := exec.Command(vgpuhaBin, "completion", "bash").Output()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.bash")
	os.WriteFile(path, agentScript, 0o644)
	for line, want := range map[string][]string{
		"vgpuha sta": {"standby", "status"},
		"vgpuha ":    {"completion", "primary", "run", "standby", "status", "switchover", "verify", "version", "--help", "--version"},
	} {
		if got := bashComplete(t, path, "_vgpuha", line); !slices.Equal(got, want) {
			t.Errorf("the agent's bash script completes %q to %v, want %v", line, got, want)
		}
	}
}

// labLine is a command line of the lab tool's: its scripts complete
// vgpuha-lab, the agent's vgpuha.
func labLine(line string) string { return "vgpuha-lab" + strings.TrimPrefix(line, "vgpuha") }

// bashComplete runs the bash script's completion function on line (its
// last word the one being completed, split at '=' as bash does).
func bashComplete(t *testing.T, script, function, line string) []string {
	t.Helper()
	words := strings.Fields(strings.ReplaceAll(line, "=", " = "))
	if strings.HasSuffix(line, " ") || strings.HasSuffix(line, "=") {
		words = append(words, "")
	}
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + w + "'"
	}
	prog := "source " + script + "; COMP_WORDS=(" + strings.Join(quoted, " ") + "); COMP_CWORD=" + strconv.Itoa(len(words)-1) + "; " + function + "; printf '%s\\n' \"${COMPREPLY[@]}\""
	out, err := exec.Command("bash", "-c", prog).Output()
	if err != nil {
		t.Fatalf("bash completion of %q: %v", line, err)
	}
	return strings.Fields(string(out))
}

// firstFields is the first field of every line (fish prints "word\tdescription").
func firstFields(s string) []string {
	var out []string
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

// flagWord is how a shell's script names a flag.
func flagWord(shell, flag string) string {
	if shell == "fish" {
		return "-l " + strings.TrimPrefix(flag, "--")
	}
	return flag
}

// scriptSection is the part of a script that completes one command.
func scriptSection(script, shell, cmd string) string {
	switch shell {
	case "bash", "zsh":
		start := strings.Index(script, "'"+cmd+"')")
		if start < 0 {
			return ""
		}
		end := strings.Index(script[start:], ";;")
		return script[start : start+end]
	}
	var lines []string
	for line := range strings.SplitSeq(script, "\n") {
		if strings.Contains(line, `__vgpuha_lab_cmd_is \'`+cmd+`\'`) {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}
