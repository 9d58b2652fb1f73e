// Package placement decides which of a node's GPUs a new guest session
// runs on: the one place that choice is made, by a stated policy
// (--guest.placement), or by the GPU the guest pinned (its library's
// VGPUHA_GPU, carried in the session-open request). A standby places each
// replica by its own policy the same way.
//
// Policies (a table, Policies):
//
//	most-free      the GPU with the most device memory left once every
//	               session placed there is promised its quota; ties: the
//	               fewest sessions, then the lowest index
//	fewest-guests  the GPU with the fewest sessions; ties: the most memory
//	               left, then the lowest index
//
// A GPU that does not take guests (its backend's health: a CUDA process
// state lost to a fault) is never chosen. A GPU whose memory left is
// below the new session's quota is full: the policy chooses among the
// others while any has room, and among all healthy GPUs when none has
// (the device then refuses what it cannot back, as one GPU does).
//
// A pin is a GPU's index, or its UUID as nvidia-smi prints it
// ("GPU-" and hex digits; a prefix naming one GPU alone is enough). A pin
// that names no GPU of the node (or an ambiguous one) fails with
// ErrNoSuchGPU; a pin to a GPU that takes no guests fails with its
// health's error. A standby whose GPUs the pin does not name places by
// its policy (Request.Strict off): the replica must be made.
//
// The package is pure: it reads the loads it is given and decides; it
// never opens, counts or locks anything.
package placement

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Policy names a placement policy (--guest.placement).
type Policy string

// The policies.
const (
	MostFree     Policy = "most-free"
	FewestGuests Policy = "fewest-guests"
)

// DefaultPolicy is the policy of a node whose flags do not say.
const DefaultPolicy = MostFree

// Policies orders GPUs for each policy: better reports whether a is a
// better place than b (the first GPU no other is better than wins).
var Policies = map[Policy]func(a, b *GPU) bool{
	MostFree: func(a, b *GPU) bool {
		if a.Free() != b.Free() {
			return a.Free() > b.Free()
		}
		return a.Sessions < b.Sessions
	},
	FewestGuests: func(a, b *GPU) bool {
		if a.Sessions != b.Sessions {
			return a.Sessions < b.Sessions
		}
		return a.Free() > b.Free()
	},
}

// Names lists the policies' names, sorted (for flags and messages).
func Names() []string {
	out := make([]string, 0, len(Policies))
	for p := range Policies {
		out = append(out, string(p))
	}
	slices.Sort(out)
	return out
}

// Check accepts a policy's name.
func Check(name string) error {
	if _, ok := Policies[Policy(name)]; !ok {
		return fmt.Errorf("unknown placement policy %q (have: %s)", name, strings.Join(Names(), ", "))
	}
	return nil
}

// GPU is one GPU's load as the caller counts it.
type GPU struct {
	Index  int
	UUID   [16]byte
	Memory uint64 // the device's memory (0: unknown, counted as none left)
	// Promised is the memory the sessions placed on it were promised
	// (each its quota, or what it holds where that is more).
	Promised uint64
	Sessions int
	// Health is nil while the GPU takes new guests.
	Health error
}

// Free is the memory left once every session is given its promise (zero
// when promised past the device's memory).
func (g *GPU) Free() uint64 {
	if g.Promised >= g.Memory {
		return 0
	}
	return g.Memory - g.Promised
}

// Request is what a new session asks of placement.
type Request struct {
	// Pin names the GPU the guest asked for (empty: none).
	Pin string
	// Quota is the memory the session is promised.
	Quota uint64
	// Strict fails a pin that names no GPU here (a guest's session); off,
	// such a pin is ignored (a standby's replica of a session pinned on
	// its primary).
	Strict bool
}

// ErrNoSuchGPU is a pin that names no GPU of the node.
var ErrNoSuchGPU = errors.New("no such GPU")

// MaxPinLen bounds a pin: an index, or a UUID as nvidia-smi prints it.
const MaxPinLen = 64

// Place returns the position in gpus of the GPU the session goes on.
func Place(p Policy, gpus []GPU, req Request) (int, error) {
	better, ok := Policies[p]
	if !ok {
		return 0, Check(string(p))
	}
	if req.Pin != "" {
		i, err := pinned(gpus, req.Pin)
		switch {
		case err == nil && gpus[i].Health != nil:
			return 0, fmt.Errorf("GPU %d (%s), which the guest pinned, takes no guests: %w", gpus[i].Index, abi.UUIDString(gpus[i].UUID), gpus[i].Health)
		case err == nil:
			return i, nil
		case req.Strict:
			return 0, err
		}
	}
	best, roomy := -1, false
	for i := range gpus {
		g := &gpus[i]
		if g.Health != nil {
			continue
		}
		room := g.Free() >= req.Quota
		if best < 0 || room && !roomy || room == roomy && better(g, &gpus[best]) {
			best, roomy = i, room
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("none of the node's %d GPUs takes guests: %w", len(gpus), firstHealth(gpus))
	}
	return best, nil
}

func firstHealth(gpus []GPU) error {
	for _, g := range gpus {
		if g.Health != nil {
			return g.Health
		}
	}
	return errors.New("no GPU")
}

// pinned is the position of the GPU pin names.
func pinned(gpus []GPU, pin string) (int, error) {
	if n, err := strconv.Atoi(pin); err == nil {
		for i, g := range gpus {
			if g.Index == n {
				return i, nil
			}
		}
		return 0, fmt.Errorf("%w: the guest pinned GPU %d; this node serves %s", ErrNoSuchGPU, n, served(gpus))
	}
	prefix, ok := strings.CutPrefix(strings.ToLower(pin), "gpu-")
	found := -1
	for i, g := range gpus {
		if ok && prefix != "" && strings.HasPrefix(abi.UUIDString(g.UUID)[len("GPU-"):], prefix) {
			if found >= 0 {
				return 0, fmt.Errorf("%w: the guest pinned %q, which names more than one GPU (%s); give more of the UUID", ErrNoSuchGPU, pin, served(gpus))
			}
			found = i
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("%w: the guest pinned %q (want an index or GPU-<uuid>); this node serves %s", ErrNoSuchGPU, pin, served(gpus))
	}
	return found, nil
}

// served names a node's GPUs for a message.
func served(gpus []GPU) string {
	names := make([]string, len(gpus))
	for i, g := range gpus {
		names[i] = fmt.Sprintf("%d (%s)", g.Index, abi.UUIDString(g.UUID))
	}
	return strings.Join(names, ", ")
}
