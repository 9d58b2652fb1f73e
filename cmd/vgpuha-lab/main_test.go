package main

import (
	"flag"
	"fmt"
	"testing"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/lab/labcmd"
)

// TestEveryNumericFlagIsRanged: no command of either binary (the lab tool
// has the agent's too) takes a number through the flag package's own
// numeric flags, which check neither range nor sign and take no size
// units.
func TestEveryNumericFlagIsRanged(t *testing.T) {
	unranged := map[string]bool{"*flag.intValue": true, "*flag.int64Value": true, "*flag.uintValue": true,
		"*flag.uint64Value": true, "*flag.float64Value": true, "*flag.durationValue": true}
	lab := labcmd.Program()
	for name := range agent.Commands() {
		if _, ok := lab.Commands[name]; !ok {
			t.Errorf("the lab tool lacks the agent's command %s", name)
		}
	}
	flags := 0
	for line, sets := range lab.CommandFlags() {
		for _, fs := range sets {
			fs.VisitAll(func(f *flag.Flag) {
				flags++
				if typ := fmt.Sprintf("%T", f.Value); unranged[typ] {
					t.Errorf("vgpuha-lab %s --%s is a %s: register it with cli.IntVar, SizeVar, DurationVar or FractionVar", line, f.Name, typ)
				}
			})
		}
	}
	if flags < 100 {
		t.Fatalf("read only %d flags from the commands", flags)
	}
}
