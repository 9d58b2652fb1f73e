package kernels

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite ptx/*.ptx from the library")

// TestPTXFiles checks that ptx/NAME.ptx holds exactly the PTX of library
// kernel NAME, and that no file names a kernel the library lacks. The files
// are what C programs load (cuModuleLoad) to run library kernels; the Go
// source is their source of truth: `go test ./kernels -run
// TestPTXFiles -update` rewrites them.
func TestPTXFiles(t *testing.T) {
	for _, name := range Names() {
		k, _ := Lookup(name)
		path := filepath.Join("ptx", name+".ptx")
		if *update {
			if err := os.WriteFile(path, []byte(k.PTX), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != k.PTX {
			t.Errorf("%s differs from kernel %s's PTX (err %v): run go test ./kernels -run TestPTXFiles -update", path, name, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join("ptx", "*.ptx"))
	for _, f := range files {
		if _, ok := Lookup(filepath.Base(f[:len(f)-len(".ptx")])); !ok {
			t.Errorf("%s names no library kernel", f)
		}
	}
}
