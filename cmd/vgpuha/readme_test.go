package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
