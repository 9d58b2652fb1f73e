package cli

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/BurntSushi/toml"
)

// Every flag of a node has a key in a TOML config file (its name; the
// dotted part of a name is a table, so "replicate.key-file" is key-file in
// [replicate]) and an environment variable (VGPUHA_ and the name in upper
// case, '.' and '-' as '_': VGPUHA_REPLICATE_KEY_FILE). A flag that is
// also a table's name (--coordinator beside --coordinator.ttl) is the
// table's empty key: "" = "etcd://..." under [coordinator]. Precedence: a flag
// on the command line, then the environment, then the file, then the
// default.

// ConfigFlag adds --config to fs.
func ConfigFlag(fs *flag.FlagSet) *string {
	return fs.String("config", "", "TOML file with a key for any flag (flags and VGPUHA_* variables override it)")
}

// envName is the environment variable for flag name.
func envName(name string) string {
	return "VGPUHA_" + strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(name))
}

// ParseWithConfig parses args, then fills every flag not given on the
// command line from the environment, then from the config file. It
// returns where each flag's value came from.
func ParseWithConfig(fs *flag.FlagSet, args []string, configPath *string) (map[string]string, error) {
	if err := Parse(fs, args); err != nil {
		return nil, err
	}
	source := map[string]string{}
	fs.Visit(func(f *flag.Flag) { source[f.Name] = "flag" })
	file, err := ReadConfig(*configPath)
	if err != nil {
		return nil, err
	}
	errs := unknownKeys(fs, file, *configPath)
	fs.VisitAll(func(f *flag.Flag) {
		if source[f.Name] == "" && f.Name != "config" {
			errs = append(errs, setFromEnvOrFile(fs, f.Name, file, *configPath, source)...)
		}
	})
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, usageError{fmt.Errorf("configuration: %s", strings.Join(errs, "; "))}
	}
	for _, w := range misspeltEnv(fs, os.Environ()) {
		fmt.Fprintf(os.Stderr, "warning: %s\n", w)
	}
	return source, nil
}

// misspeltEnv names each VGPUHA_ variable in env that sets no flag of fs
// but is one typo from a variable that would (VGPUHA_REPLICATE_KEYFILE for
// VGPUHA_REPLICATE_KEY_FILE): a variable the operator meant for this
// command that it silently ignores. Variables near none of its flags are
// left alone: they may be another command's or the guest library's.
func misspeltEnv(fs *flag.FlagSet, env []string) []string {
	byEnv := map[string]string{}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		byEnv[envName(f.Name)] = f.Name
		names = append(names, envName(f.Name))
	})
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "VGPUHA_") || byEnv[name] != "" {
			continue
		}
		if near := closestEnv(name, names); near != "" {
			out = append(out, fmt.Sprintf("%s sets no flag of this command (did you mean %s, for --%s?)", name, near, byEnv[near]))
		}
	}
	sort.Strings(out)
	return out
}

// closestEnv is the variable in names at most two edits from name (past
// the VGPUHA_ both share), "" when none is.
func closestEnv(name string, names []string) string {
	best, bestDist := "", 3
	for _, n := range names {
		if d := editDistance(name[len("VGPUHA_"):], n[len("VGPUHA_"):]); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// unknownKeys words each key of the config file that is no flag.
func unknownKeys(fs *flag.FlagSet, file map[string]string, path string) []string {
	var errs []string
	for key := range file {
		if fs.Lookup(key) == nil || key == "config" {
			msg := fmt.Sprintf("%s in %s: no such flag", key, path)
			if s := suggestFlag(fs, key); s != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", s)
			}
			errs = append(errs, msg)
		}
	}
	return errs
}

// setFromEnvOrFile sets flag name, not given on the command line, from its
// VGPUHA_ variable or else the config file, noting where it came from.
func setFromEnvOrFile(fs *flag.FlagSet, name string, file map[string]string, path string, source map[string]string) []string {
	if v, ok := os.LookupEnv(envName(name)); ok {
		source[name] = "env"
		if err := fs.Set(name, v); err != nil {
			return []string{fmt.Sprintf("%s=%q (from the environment, for --%s): %v", envName(name), v, name, err)}
		}
		return nil
	}
	if v, ok := file[name]; ok {
		source[name] = "file"
		if err := fs.Set(name, v); err != nil {
			return []string{fmt.Sprintf("%s in the config file %s: %v", name, path, err)}
		}
	}
	return nil
}

// ReadConfig reads a TOML file into flag name → value ("" path: none).
func ReadConfig(path string) (map[string]string, error) {
	out := map[string]string{}
	if path == "" {
		return out, nil
	}
	var doc map[string]any
	if _, err := toml.DecodeFile(path, &doc); err != nil {
		return nil, usageError{fmt.Errorf("reading the config file: %w", err)}
	}
	flatten("", doc, out)
	return out, nil
}

// flatten turns nested tables into dotted flag names.
func flatten(prefix string, doc map[string]any, out map[string]string) {
	for k, v := range doc {
		name := k
		if prefix != "" && k == "" {
			name = prefix // the table's own flag: "" = ... under [coordinator]
		} else if prefix != "" {
			name = prefix + "." + k
		}
		if table, ok := v.(map[string]any); ok {
			flatten(name, table, out)
			continue
		}
		out[name] = fmt.Sprint(v)
	}
}

// PrintConfig writes every flag's effective value and where it came from
// (vgpuha COMMAND --config.show).
func PrintConfig(fs *flag.FlagSet, source map[string]string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "FLAG\tVALUE\tFROM\tENVIRONMENT")
	fs.VisitAll(func(f *flag.Flag) {
		from := source[f.Name]
		if from == "" {
			from = "default"
		}
		fmt.Fprintf(w, "--%s\t%s\t%s\t%s\n", f.Name, f.Value, from, envName(f.Name))
	})
	w.Flush()
}
