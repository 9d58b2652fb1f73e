package failover

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios runs the golden scenarios in testdata/detector: each file drives a
// detector with heartbeats at made-up times and records when it suspects
// the primary. Rewrite the expected output with -rewrite.
//
//	new kind=fixed|phi             start a detector with the defaults
//	beat every=MS from=MS to=MS    heartbeats every MS in [from, to]
//	probe from=MS to=MS step=MS    print the first time it suspects, or "alive"
//	phi at=MS                      print the suspicion level
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/detector", func(t *testing.T, path string) {
		var d Detector
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			ms := func(key string, def int) int {
				v := def
				if td.HasArg(key) {
					td.ScanArgs(t, key, &v)
				}
				return v
			}
			switch td.Cmd {
			case "new":
				var kind string
				td.ScanArgs(t, "kind", &kind)
				d = mustNew(kind)
				return "ok"
			case "beat":
				every, from, to := ms("every", 50), ms("from", 0), ms("to", 0)
				for at := from; at <= to; at += every {
					d.Heartbeat(t0.Add(time.Duration(at) * time.Millisecond))
				}
				return "ok"
			case "probe":
				from, to, step := ms("from", 0), ms("to", 0), ms("step", 1)
				for at := from; at <= to; at += step {
					if d.Suspect(t0.Add(time.Duration(at) * time.Millisecond)) {
						return fmt.Sprintf("suspect at %d ms", at)
					}
				}
				return "alive"
			case "phi":
				p, ok := d.(*PhiAccrual)
				if !ok {
					return "not a phi detector"
				}
				return fmt.Sprintf("%.2f", p.Phi(t0.Add(time.Duration(ms("at", 0))*time.Millisecond)))
			}
			return "unknown command " + strings.TrimSpace(td.Cmd)
		})
	})
}
