package replica_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

func sessionOpens() []replica.SessionOpen {
	tok := bytes.Repeat([]byte{9}, abi.ResumeTokenSize)
	return []replica.SessionOpen{
		{Guest: "g", Token: tok, Tenant: "10.0.0.1", Grace: 30 * time.Second, GraceKnown: true},
		{Guest: "pinned", Token: tok, Grace: time.Second, GraceKnown: true, GPU: "1"},
		{Guest: "by-uuid", Token: tok, Tenant: "t", GraceKnown: true, GPU: "GPU-abcd0001-0000-0000-0000-000000000001"},
		{Guest: "placed", Token: tok, Grace: time.Minute, GraceKnown: true, Device: 3},
		{Guest: "pinned and placed", Token: tok, GraceKnown: true, GPU: "1", Device: 1},
	}
}

// TestSessionOpenRoundTrip: every format decodes to what was encoded; an
// unpinned session on GPU 0 is written in format 2, which an older standby
// reads (and which names GPU 0).
func TestSessionOpenRoundTrip(t *testing.T) {
	for _, o := range sessionOpens() {
		b := o.Append(nil)
		got, err := replica.DecodeSessionOpen(b)
		if err != nil || !cmp.Equal(got, o) {
			t.Fatalf("%+v: decoded %+v, %v", o, got, err)
		}
		if format := b[len(o.Guest)+1]; (o.GPU == "" && o.Device == 0) != (format == 2) {
			t.Errorf("%+v written in format %d", o, format)
		}
	}
	for _, i := range []int{1, 4} {
		rec := sessionOpens()[i].Append(nil)
		for _, bad := range [][]byte{rec[:len(rec)-1], append(rec[:len(rec):len(rec)], 'x'), rec[:len(rec)-2]} {
			if o, err := replica.DecodeSessionOpen(bad); err == nil {
				t.Errorf("a torn record of %q decoded as %+v", sessionOpens()[i].Guest, o)
			}
		}
	}
}

// FuzzDecodeSessionOpen: any body decodes or fails, never panics; what
// decodes re-encodes to a body that decodes to the same (format 1 as 2).
func FuzzDecodeSessionOpen(f *testing.F) {
	for _, o := range sessionOpens() {
		f.Add(o.Append(nil))
	}
	f.Add([]byte("bare name of an older primary"))
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := replica.DecodeSessionOpen(body)
		if err != nil || bytes.IndexByte(body, 0) < 0 {
			return
		}
		again, err := replica.DecodeSessionOpen(o.Append(nil))
		o.GraceKnown = true // a format-1 record is written again in format 2, with its grace of 0
		if err != nil || !cmp.Equal(again, o) {
			t.Fatalf("%+v re-encoded decodes as %+v, %v", o, again, err)
		}
	})
}

// TestSessionOpenOnGPU0: a session placed on GPU 0 is written without its
// device (format 2, or 3 when pinned), and reads back as one that does not
// say: GPU 0.
func TestSessionOpenOnGPU0(t *testing.T) {
	tok := bytes.Repeat([]byte{9}, abi.ResumeTokenSize)
	for _, o := range []replica.SessionOpen{
		{Guest: "g", Token: tok, GraceKnown: true, Device: 0},
		{Guest: "p", Token: tok, GraceKnown: true, GPU: "0", Device: 0},
	} {
		b := o.Append(nil)
		if format := b[len(o.Guest)+1]; format > 3 {
			t.Errorf("%+v written in format %d, which an older standby cannot read", o, format)
		}
		got, err := replica.DecodeSessionOpen(b)
		if err != nil || got.Device != 0 || got.GPU != o.GPU {
			t.Errorf("%+v decoded as %+v, %v", o, got, err)
		}
	}
}
