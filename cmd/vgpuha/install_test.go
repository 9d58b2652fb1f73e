package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// operatorSecrets are files the units name that `make install` must not
// make: the operator creates them (README, Installing).
var operatorSecrets = []string{"/etc/vgpuha/key", "/etc/vgpuha/admin-token"}

// TestMakeInstall runs `make install` into a temporary root and checks
// what the installed units name: the binary, the documentation, every file
// under /etc/vgpuha (the operator's secrets aside), and that each unit's
// command line, run from the root, is accepted by the installed binary.
func TestMakeInstall(t *testing.T) {
	skipShort(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed (apt-get install make)")
	}
	root := t.TempDir()
	if out, err := exec.Command("make", "-C", filepath.Join("..", ".."), "install", "DESTDIR="+root).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, f := range []string{
		"usr/local/share/bash-completion/completions/vgpuha",
		"usr/local/share/zsh/site-functions/_vgpuha",
		"usr/local/share/fish/vendor_completions.d/vgpuha.fish",
	} {
		if st, err := os.Stat(filepath.Join(root, f)); err != nil || st.Size() == 0 {
			t.Errorf("completion %s not installed: %v", f, err)
		}
	}
	for _, s := range operatorSecrets { // as the README's Installing says
		if err := os.WriteFile(filepath.Join(root, s), []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	units, _ := filepath.Glob(filepath.Join(root, "usr/local/lib/systemd/system/*.service"))
	if len(units) != 2 {
		t.Fatalf("installed units: %v, want vgpuha-primary.service and vgpuha-standby.service", units)
	}
	for _, unit := range units {
		checkInstalledUnit(t, root, unit)
	}
}

// checkInstalledUnit checks one installed unit against the root it was
// installed in.
func checkInstalledUnit(t *testing.T, root, unit string) {
	t.Helper()
	text, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(unit)
	for _, l := range strings.Split(string(text), "\n") {
		if doc, ok := strings.CutPrefix(l, "Documentation=file://"); ok {
			if _, err := os.Stat(filepath.Join(root, doc)); err != nil {
				t.Errorf("%s: Documentation %s not installed", name, doc)
			}
		}
	}
	argv := strings.Fields(execStart(string(text)))
	if len(argv) < 2 {
		t.Fatalf("%s: no ExecStart", name)
	}
	for i, a := range argv {
		if !strings.HasPrefix(a, "/") {
			continue
		}
		st, err := os.Stat(filepath.Join(root, a))
		switch {
		case err != nil && slices.Contains(operatorSecrets, a):
		case err != nil:
			t.Errorf("%s names %s, which make install did not install", name, a)
		case i == 0 && st.Mode()&0o111 == 0:
			t.Errorf("%s: %s is not executable", name, a)
		}
		argv[i] = filepath.Join(root, a)
	}
	cmd := exec.Command(argv[0], append(argv[1:], "--config.show")...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "FROM") {
		t.Errorf("%s: the installed binary refuses the unit's command line %v: %v\n%s", name, argv, err, out)
	}
}

// execStart is a unit's ExecStart= command line, continuation lines
// joined.
func execStart(text string) string {
	var line string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "ExecStart=") || line != "" && strings.HasSuffix(line, "\\") {
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimPrefix(l, "ExecStart=")
		}
	}
	return line
}
