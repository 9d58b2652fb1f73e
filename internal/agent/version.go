package agent

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/internal/cli"
)

// buildInfo is the version and the commit this binary was built from, as
// the Go toolchain recorded them.
func buildInfo() (version, commit string) {
	version, commit = "(devel)", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, commit
	}
	if bi.Main.Version != "" {
		version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			commit = s.Value
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			commit += " (modified)"
		}
	}
	return version, commit
}

func runVersion(args []string) error {
	fs := cli.NewFlags("version", "")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	version, commit := buildInfo()
	fmt.Printf("vgpuha %s, commit %s, %s\n", version, commit, runtime.Version())
	return nil
}

// buildInfoMetric is vgpuha_build_info{version, commit, goversion} = 1.
func buildInfoMetric() prometheus.Collector {
	version, commit := buildInfo()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "vgpuha_build_info",
		Help:        "Always 1; the labels say which build this node runs.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}
