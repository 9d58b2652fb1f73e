package cuda

import (
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestStatusCache: one reading answers for statusFresh, then a new one is
// taken; a failed reading is not kept; a clock that steps back reads anew.
func TestStatusCache(t *testing.T) {
	clock := time.Unix(1000, 0)
	c := statusCache{now: func() time.Time { return clock }}
	reads, ok := 0, true
	read := func(r *abi.DeviceStatusReply) bool {
		reads++
		r.Set(abi.FieldGuestMemoryUsed, uint64(reads))
		return ok
	}
	ask := func() uint64 {
		var r abi.DeviceStatusReply
		c.get(&r, read)
		v, _ := r.Get(abi.FieldGuestMemoryUsed)
		return v
	}
	for _, step := range []struct {
		advance   time.Duration
		ok        bool
		want      uint64
		wantReads int
	}{
		{0, false, 0, 1},              // a failed reading answers nothing and is not kept
		{0, true, 2, 2},               // the first good reading
		{statusFresh / 2, true, 2, 2}, // still fresh: kept
		{statusFresh / 2, true, 3, 3}, // statusFresh old: read again
		{-time.Second, true, 4, 4},    // the clock stepped back
		{statusFresh - time.Nanosecond, true, 4, 4},
	} {
		clock = clock.Add(step.advance)
		ok = step.ok
		if got := ask(); got != step.want || reads != step.wantReads {
			t.Fatalf("after %v: value %d after %d readings, want %d after %d", step.advance, got, reads, step.want, step.wantReads)
		}
	}
}
