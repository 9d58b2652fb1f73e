package agent

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/cli"
)

var rewrite = flag.Bool("rewrite", false, "rewrite contrib/config/*.toml from the commands' flag sets")

// exampleConfigs are the example files `make install` puts in /etc/vgpuha,
// one per node command: every flag the command takes, as a commented key.
var exampleConfigs = map[string]func([]string) error{
	"primary": runPrimary,
	"standby": runStandby,
}

// notInFile are flags a config file cannot usefully hold.
var notInFile = []string{"config", "config.show"}

// variableDefaults are flags whose default differs from run to run: the
// example says what it is instead.
var variableDefaults = map[string]string{
	"coordinator.id": "this host's name and the process id: HOST-PID",
}

// flagSetOf returns the flag set a command makes.
func flagSetOf(t *testing.T, run func([]string) error) *flag.FlagSet {
	t.Helper()
	sets := cli.FlagSets(run, []string{"--help"})
	if len(sets) == 0 {
		t.Fatal("the command made no flag set")
	}
	return sets[len(sets)-1]
}

// exampleConfig writes every flag of fs as a commented TOML key with its
// usage and default, top-level keys first, then one table per prefix.
func exampleConfig(command string, fs *flag.FlagSet) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# vgpuha %s: every setting, with its default (commented out).\n", command)
	fmt.Fprintf(&b, "# Given with --config; a flag (--NAME) or VGPUHA_NAME wins over this file.\n")
	fmt.Fprintf(&b, "# A dotted flag is a key in a table: --replicate.key-file is key-file in [replicate];\n")
	fmt.Fprintf(&b, "# a flag that names a table too (--coordinator) is that table's key \"\".\n")
	fmt.Fprintf(&b, "# Generated from the command's flags: go test ./internal/agent -run TestExampleConfigs -rewrite\n")
	tables := map[string][]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		if slices.Contains(notInFile, f.Name) {
			return
		}
		table, _, _ := strings.Cut(f.Name, ".")
		if !strings.Contains(f.Name, ".") && !isTable(fs, f.Name) {
			table = ""
		}
		tables[table] = append(tables[table], f)
	})
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	slices.Sort(names) // "" (top-level keys) sorts first
	for _, table := range names {
		if table != "" {
			fmt.Fprintf(&b, "\n[%s]\n", table)
		}
		for _, f := range tables[table] {
			_, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(&b, "\n# %s\n", strings.ReplaceAll(usage, "\n", "\n# "))
			key := strings.TrimPrefix(f.Name, table+".")
			if key == table {
				key = `""`
			}
			if d, ok := variableDefaults[f.Name]; ok {
				fmt.Fprintf(&b, "# (default: %s)\n# %s = \"\"\n", d, key)
				continue
			}
			fmt.Fprintf(&b, "# %s = %s\n", key, tomlValue(f))
		}
	}
	return b.Bytes()
}

// isTable reports whether some flag's name is name + "." + more.
func isTable(fs *flag.FlagSet, name string) bool {
	found := false
	fs.VisitAll(func(f *flag.Flag) { found = found || strings.HasPrefix(f.Name, name+".") })
	return found
}

// tomlValue is a flag's default as a TOML value: booleans bare, the rest
// quoted (the file's values are read back as strings, so "4GiB" and
// "250ms" keep their units).
func tomlValue(f *flag.Flag) string {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return f.DefValue
	}
	return strconv.Quote(f.DefValue)
}

// TestExampleConfigs keeps contrib/config/*.toml equal to what the
// commands' flags say, and checks that each file, every key uncommented,
// is accepted by its command with the same values.
func TestExampleConfigs(t *testing.T) {
	for command, run := range exampleConfigs {
		path := filepath.Join("..", "..", "contrib", "config", command+".toml")
		want := exampleConfig(command, flagSetOf(t, run))
		if *rewrite {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what vgpuha %s's flags say; run: go test ./internal/agent -run TestExampleConfigs -rewrite", path, command)
			continue
		}
		checkUncommented(t, command, run, string(got))
	}
}

// checkUncommented turns every "# key = value" line of an example file
// into a key, reads the file as --config does, and checks that each key is
// one of the command's flags, that every flag has a key, and that each
// value (the default) sets the flag to its default.
func checkUncommented(t *testing.T, command string, run func([]string) error, text string) {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if k, _, ok := strings.Cut(strings.TrimPrefix(l, "# "), " = "); ok && strings.HasPrefix(l, "# ") && !strings.ContainsAny(k, " ,") {
			l = strings.TrimPrefix(l, "# ")
		}
		lines = append(lines, l)
	}
	path := filepath.Join(t.TempDir(), command+".toml")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	keys, err := cli.ReadConfig(path)
	if err != nil {
		t.Fatalf("%s, uncommented: %v", command, err)
	}
	fs := flagSetOf(t, run)
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := keys[f.Name]
		switch {
		case slices.Contains(notInFile, f.Name):
		case !ok:
			t.Errorf("%s: --%s has no key in the example", command, f.Name)
		case v != "" && fs.Set(f.Name, v) != nil:
			t.Errorf("%s: the example's %s = %q is refused: %v", command, f.Name, v, fs.Set(f.Name, v))
		case f.Value.String() != f.DefValue:
			t.Errorf("%s: the example's %s sets %q, the default is %q", command, f.Name, f.Value.String(), f.DefValue)
		}
		delete(keys, f.Name)
	})
	for k := range keys {
		t.Errorf("%s: the example's key %s is no flag", command, k)
	}
}
