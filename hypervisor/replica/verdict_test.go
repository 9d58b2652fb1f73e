package replica

import (
	"errors"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// TestVerdict: a record the replica applied as the primary did leaves its
// session trusted; any other outcome says why it is not, and a repair's
// result is not compared.
func TestVerdict(t *testing.T) {
	failed := errors.New("boom")
	for _, tc := range []struct {
		name       string
		op         abi.Opcode
		flags      uint16
		err        error
		result     uint64
		want       uint64 // the primary's result
		translated bool
		why        string // "" or a part of the reason
	}{
		{"same result", abi.OpAlloc, 0, nil, 0x1000, 0x1000, false, ""},
		{"both failed", abi.OpLaunch, replicate.FlagFailed, failed, 0, 0, false, ""},
		{"other result", abi.OpAlloc, 0, nil, 0x2000, 0x1000, false, "gave 0x2000 on the replica, 0x1000 on the primary"},
		{"repair's result", abi.OpCopyHtoD, replicate.FlagRepair, nil, 1, 0, false, ""},
		{"failed here only", abi.OpMemset, 0, failed, 0, 0, false, "failed on the replica but not on the primary"},
		{"failed there only", abi.OpMemset, replicate.FlagFailed, nil, 0, 0, false, "succeeded on the replica but failed on the primary"},
		{"launch failed here, translated", abi.OpLaunch, 0, failed, 0, 0, true, "addresses are translated"},
		{"copy failed here, translated", abi.OpCopyHtoD, 0, failed, 0, 0, true, "failed on the replica but not on the primary"},
	} {
		rec := &replicate.Record{Seq: 9, Op: replicate.Op(tc.op), Flags: tc.flags, Result: tc.want}
		got := verdict(rec, tc.op, tc.err, tc.result, tc.translated)
		switch {
		case tc.why == "" && got != "":
			t.Errorf("%s: unsafe (%s), want trusted", tc.name, got)
		case tc.why != "" && !strings.Contains(got, tc.why):
			t.Errorf("%s: %q, want it to say %q", tc.name, got, tc.why)
		}
	}
}
