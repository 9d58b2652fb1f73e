package drill

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// Large state (Options.StateBytes): the drill's guest (it has one) holds
// all of the N bytes itself, in allocations of up to stateAlloc, while the
// faults strike. Every 4-byte word of the state's 1 MiB chunk c holds
// patternWord(seed, c): the fill is one memset per chunk (a GPU fills at
// memory speed, and the log carries a chunk as one small record), and a
// chunk that is stale, zero, or another chunk's shows. After each
// iteration the guest reads every byte back, stateRead at a time, and the
// first byte that differs fails the iteration with its offset.
const (
	stateAlloc = 1 << 30
	stateChunk = 1 << 20
	stateRead  = 16 << 20
	// stateSlack is the guest quota beyond the state (the workload's own
	// buffers, a failback's second copy never counts: it is another node).
	stateSlack = 1 << 30
	// resyncFloor is the slowest resync rate the drill waits for before
	// it calls a resync stuck: a wait lasts stateWaitBase plus the state
	// at this rate.
	resyncFloor   = 64 << 20
	stateWaitBase = 20 * time.Second
)

// state is the guest's large state on its GPU.
type state struct {
	g     *pvdriver.Client
	bufs  []pvdriver.DevicePtr
	sizes []uint64
	seed  uint64
	bytes uint64
}

// patternWord is the word that fills chunk c of the state seeded seed
// (never zero: fresh device memory is).
func patternWord(seed, c uint64) uint32 {
	x := seed ^ (c+1)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return uint32(x) | 1
}

// fillState allocates n bytes (a multiple of stateChunk) on g and fills
// them with the pattern, noting progress.
func fillState(g *pvdriver.Client, n, seed uint64, note func(string)) (*state, error) {
	s := &state{g: g, seed: seed, bytes: n}
	start, last := time.Now(), time.Now()
	var chunk uint64
	for left := n; left > 0; {
		size := min(left, stateAlloc)
		p, err := g.Alloc(size)
		if err != nil {
			return nil, fmt.Errorf("allocating state: %w", err)
		}
		s.bufs, s.sizes = append(s.bufs, p), append(s.sizes, size)
		for off := uint64(0); off < size; off += stateChunk {
			if err := g.Memset32(p+pvdriver.DevicePtr(off), patternWord(seed, chunk), stateChunk/4); err != nil {
				return nil, fmt.Errorf("filling state: %w", err)
			}
			chunk++
		}
		left -= size
		if time.Since(last) > 2*time.Second {
			last = time.Now()
			note(fmt.Sprintf("state: %d of %d MiB filled", (n-left)>>20, n>>20))
		}
	}
	if err := g.Synchronize(); err != nil {
		return nil, err
	}
	note(fmt.Sprintf("state: %d MiB filled in %v", n>>20, time.Since(start).Round(time.Millisecond)))
	return s, nil
}

// verify reads every byte of the state back and compares it with the
// pattern; it returns the bytes that matched before the first that did
// not, and an error naming that byte's offset.
func (s *state) verify() (uint64, error) {
	buf := make([]byte, stateRead)
	want := make([]byte, stateChunk)
	var verified uint64
	for i, p := range s.bufs {
		for off := uint64(0); off < s.sizes[i]; off += stateRead {
			n := min(stateRead, s.sizes[i]-off)
			if err := s.g.CopyDtoH(buf[:n], p+pvdriver.DevicePtr(off)); err != nil {
				return verified, fmt.Errorf("reading state at byte %d: %w", verified, err)
			}
			for c := uint64(0); c < n; c += stateChunk {
				fillPattern(want, patternWord(s.seed, verified/stateChunk))
				got := buf[c : c+stateChunk]
				if !bytes.Equal(got, want) {
					at := firstDiff(got, want)
					return verified + uint64(at), fmt.Errorf("state byte %d of %d differs: %#x, want %#x", verified+uint64(at), s.bytes, got[at], want[at])
				}
				verified += stateChunk
			}
		}
	}
	return verified, nil
}

// fillPattern fills b (a multiple of 4 bytes) with the little-endian word w.
func fillPattern(b []byte, w uint32) {
	binary.LittleEndian.PutUint32(b, w)
	for k := 4; k < len(b); k *= 2 {
		copy(b[k:], b[:k])
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// stateFlags are the node flags that let the drill's guest hold n bytes:
// its quota, its tenant's, and a software GPU big enough.
func stateFlags(n uint64) []string {
	if n == 0 {
		return nil
	}
	quota := strconv.FormatUint(n+stateSlack, 10)
	return []string{"--guest.memory-quota-bytes", quota, "--tenant.memory-quota-bytes", quota,
		"--sim.memory-bytes", strconv.FormatUint(max(8<<30, n+2*stateSlack), 10)}
}

// stateWait is how long the drill waits for a resync of n bytes.
func stateWait(n uint64) time.Duration { return stateWaitBase + resyncTime(n) }

// resyncTime is n bytes at the slowest resync rate the drill accepts.
func resyncTime(n uint64) time.Duration { return time.Duration(n/resyncFloor) * time.Second }

// waitResynced waits until a's standby protects it (a resync of up to n
// bytes), noting the resync's progress every two seconds.
func waitResynced(a *nodeproc.Node, n uint64, note func(string)) error {
	var st struct {
		Replication struct {
			State  string
			Resync *struct {
				BytesDone  uint64  `json:"bytes_done"`
				BytesTotal uint64  `json:"bytes_total"`
				Rate       float64 `json:"rate_bytes_per_second"`
				ETA        float64 `json:"eta_seconds"`
			}
		}
	}
	start, last := time.Now(), time.Now()
	err := nodeproc.WaitFor(stateWait(n), func() bool {
		if a.Status(&st) != nil {
			return false
		}
		if rs := st.Replication.Resync; rs != nil && time.Since(last) > 2*time.Second {
			last = time.Now()
			note(fmt.Sprintf("resync: %d of %d MiB, %.0f MB/s, ETA %.0f s", rs.BytesDone>>20, rs.BytesTotal>>20, rs.Rate/1e6, rs.ETA))
		}
		return st.Replication.State == "protected"
	})
	if err != nil {
		return fmt.Errorf("the standby was never resynced (replication %s): %w", st.Replication.State, err)
	}
	note(fmt.Sprintf("resync: protected after %v", time.Since(start).Round(time.Millisecond)))
	return nil
}

// errStateSize: the state is not whole chunks.
var errStateSize = errors.New("--state-bytes must be a multiple of 1 MiB")
