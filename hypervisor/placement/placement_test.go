package placement_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/placement"
)

func uuid(b byte) [16]byte { return [16]byte{0xab, 0xcd, 0, b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b} }

var errLost = errors.New("CUDA state lost")

func TestPlace(t *testing.T) {
	const gib = 1 << 30
	two := func(promised0, promised1 uint64, s0, s1 int) []placement.GPU {
		return []placement.GPU{
			{Index: 0, UUID: uuid(1), Memory: 8 * gib, Promised: promised0, Sessions: s0},
			{Index: 2, UUID: uuid(2), Memory: 8 * gib, Promised: promised1, Sessions: s1},
		}
	}
	cases := []struct {
		name   string
		policy placement.Policy
		gpus   []placement.GPU
		req    placement.Request
		want   int    // position; -1: an error
		errHas string // part of the error
	}{
		{"most-free: more memory left wins", placement.MostFree, two(4*gib, 1*gib, 1, 3), placement.Request{Quota: gib}, 1, ""},
		{"most-free: a tie goes to fewer sessions", placement.MostFree, two(2*gib, 2*gib, 2, 1), placement.Request{Quota: gib}, 1, ""},
		{"most-free: a full tie goes to the lowest position", placement.MostFree, two(0, 0, 0, 0), placement.Request{Quota: gib}, 0, ""},
		{"fewest-guests: fewer sessions wins over memory", placement.FewestGuests, two(1*gib, 4*gib, 3, 1), placement.Request{Quota: gib}, 1, ""},
		{"fewest-guests: a tie goes to more memory", placement.FewestGuests, two(1*gib, 4*gib, 2, 2), placement.Request{Quota: gib}, 0, ""},
		{"a full GPU is passed over while another has room", placement.FewestGuests, two(7*gib+1, 0, 0, 5), placement.Request{Quota: gib}, 1, ""},
		{"all full: the policy still chooses", placement.MostFree, two(9*gib, 7*gib+gib/2, 1, 1), placement.Request{Quota: gib}, 1, ""},
		{"an unhealthy GPU is never chosen", placement.MostFree,
			[]placement.GPU{{Index: 0, Memory: 8 * gib, Health: errLost}, {Index: 1, Memory: 8 * gib, Promised: 7 * gib}}, placement.Request{Quota: gib}, 1, ""},
		{"no healthy GPU", placement.MostFree, []placement.GPU{{Index: 0, Health: errLost}}, placement.Request{}, -1, "CUDA state lost"},
		{"pin by index (the host's, not the position)", placement.MostFree, two(7*gib, 0, 0, 0), placement.Request{Pin: "0", Strict: true}, 0, ""},
		{"pin by index, second GPU", placement.MostFree, two(0, 7*gib, 0, 0), placement.Request{Pin: "2", Strict: true}, 1, ""},
		{"pin to a full GPU holds", placement.MostFree, two(0, 9*gib, 0, 0), placement.Request{Pin: "2", Quota: gib, Strict: true}, 1, ""},
		{"pin by full UUID", placement.MostFree, two(0, 7*gib, 0, 0), placement.Request{Pin: "GPU-abcd0002-0000-0000-0000-000000000002", Strict: true}, 1, ""},
		{"pin by UUID prefix, any case", placement.MostFree, two(0, 7*gib, 0, 0), placement.Request{Pin: "gpu-ABCD0002", Strict: true}, 1, ""},
		{"an ambiguous UUID prefix", placement.MostFree, two(0, 0, 0, 0), placement.Request{Pin: "GPU-abcd", Strict: true}, -1, "more than one GPU"},
		{"pin to an index the node does not serve", placement.MostFree, two(0, 0, 0, 0), placement.Request{Pin: "1", Strict: true}, -1, "pinned GPU 1; this node serves 0 (GPU-abcd0001"},
		{"pin to a UUID the node does not serve", placement.MostFree, two(0, 0, 0, 0), placement.Request{Pin: "GPU-ffff", Strict: true}, -1, "no such GPU"},
		{"a pin that is neither", placement.MostFree, two(0, 0, 0, 0), placement.Request{Pin: "fast", Strict: true}, -1, "want an index or GPU-<uuid>"},
		{"not strict: an unknown pin falls back to the policy", placement.FewestGuests, two(0, 0, 3, 1), placement.Request{Pin: "5"}, 1, ""},
		{"not strict: a known pin still holds", placement.FewestGuests, two(0, 0, 3, 1), placement.Request{Pin: "0"}, 0, ""},
		{"pin to an unhealthy GPU fails even when not strict", placement.MostFree,
			[]placement.GPU{{Index: 0, Health: errLost}, {Index: 1, Memory: gib}}, placement.Request{Pin: "0"}, -1, "takes no guests"},
		{"an unknown policy", placement.Policy("random"), two(0, 0, 0, 0), placement.Request{}, -1, "have: fewest-guests, most-free"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := placement.Place(c.policy, c.gpus, c.req)
			if c.want < 0 {
				if err == nil || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("Place = %d, %v; want an error containing %q", got, err, c.errHas)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Place = %d, %v; want %d", got, err, c.want)
			}
		})
	}
}

// TestPinErrors: a pin naming no GPU is ErrNoSuchGPU, so the hypervisor
// tells it from a GPU that broke.
func TestPinErrors(t *testing.T) {
	_, err := placement.Place(placement.MostFree, []placement.GPU{{Index: 0}}, placement.Request{Pin: "3", Strict: true})
	if !errors.Is(err, placement.ErrNoSuchGPU) {
		t.Fatalf("err = %v, want ErrNoSuchGPU", err)
	}
}

// TestSpread: sessions placed one after another by either policy spread
// over equal GPUs instead of piling on one.
func TestSpread(t *testing.T) {
	for _, p := range placement.Names() {
		gpus := []placement.GPU{{Index: 0, Memory: 4 << 30}, {Index: 1, Memory: 4 << 30}, {Index: 2, Memory: 4 << 30}}
		for range 6 {
			i, err := placement.Place(placement.Policy(p), gpus, placement.Request{Quota: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			gpus[i].Sessions++
			gpus[i].Promised += 1 << 30
		}
		for _, g := range gpus {
			if g.Sessions != 2 {
				t.Fatalf("%s: GPU %d got %d sessions of 6 over 3 GPUs, want 2 each", p, g.Index, g.Sessions)
			}
		}
	}
}

func TestCheck(t *testing.T) {
	for _, p := range placement.Names() {
		if err := placement.Check(p); err != nil {
			t.Errorf("Check(%q) = %v", p, err)
		}
	}
	if placement.Check("most_free") == nil {
		t.Error("Check(most_free) accepted a name no policy has")
	}
}
