package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vgpuha/vgpuha/hypervisor/cuda"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/gpu/worker"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// GPU says which GPUs a node opens. Name is cuda (device 0), cuda:N
// (device N), cuda:all (every GPU of the host), cuda:LIST (a comma-
// separated set of ordinals and UUIDs, "GPU-" and enough of the UUID to
// name one GPU), sim (SimGPUs software GPUs, each of SimMemoryBytes) or
// auto (cuda device 0 where a GPU is present, else sim). One GPU is a
// plain backend; several are a gpu.Set, whose sessions the hypervisor
// places (package placement).
type GPU struct {
	Name           string
	SimMemoryBytes uint64
	SimBaseShift   uint64 // forces address translation on a standby (tests)
	// SimGPUs is how many software GPUs a sim node serves (0 or 1: one);
	// SimNumber which of them a worker's is.
	SimGPUs   int
	SimNumber int
	// SpareContexts is how many CUDA contexts are kept made ahead, or,
	// with Workers, how many workers are kept started (per GPU).
	SpareContexts int
	// Workers runs each context in a worker process of its own
	// (hypervisor/gpu/worker), which opens the one GPU its session was
	// placed on; the node itself then opens no GPU.
	Workers bool
	// OneContext is a worker's GPU: it serves one context, made ahead on
	// CUDA (instead of SpareContexts).
	OneContext bool
}

// MaxSimGPUs bounds --sim.gpus.
const MaxSimGPUs = 64

// CheckGPU accepts the backend names Open knows.
func CheckGPU(name string) error {
	if list, ok := strings.CutPrefix(name, "cuda:"); ok {
		_, err := cudaSelection(list)
		return err
	}
	switch name {
	case "sim", "cuda", "auto":
		return nil
	}
	return fmt.Errorf("unknown backend %q (have: cuda, cuda:N, cuda:all, cuda:N,M,... or UUIDs, sim, auto)", name)
}

// cudaSelection splits cuda:'s list into its entries (nil: all), each an
// ordinal or GPU-<uuid prefix>, none twice.
func cudaSelection(list string) ([]string, error) {
	if list == "all" {
		return nil, nil
	}
	var out []string
	for _, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		ord, err := strconv.Atoi(e)
		switch {
		case err == nil && ord < 0, err != nil && !strings.HasPrefix(e, "GPU-"), e == "GPU-":
			return nil, fmt.Errorf("bad backend cuda:%s: %q is neither a device ordinal nor GPU-<uuid> (want cuda:N, cuda:all or cuda:N,M,...)", list, e)
		case err == nil && strconv.Itoa(ord) != e:
			return nil, fmt.Errorf("bad backend cuda:%s: write the ordinal %q as %d", list, e, ord)
		}
		for _, o := range out {
			if strings.EqualFold(o, e) {
				return nil, fmt.Errorf("bad backend cuda:%s: %s is named twice", list, e)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// Open opens the GPUs.
func (g GPU) Open() (gpu.Backend, error) {
	if err := CheckGPU(g.Name); err != nil {
		return nil, err
	}
	kind, list, _ := strings.Cut(g.Name, ":")
	var numbers []int
	switch kind {
	case "sim":
		numbers = g.simNumbers()
	case "auto":
		if b, err := g.openOne("cuda", 0); err == nil {
			return b, nil
		}
		kind, numbers = "sim", g.simNumbers()
	case "cuda":
		if g.SimGPUs > 1 {
			return nil, errors.New("--sim.gpus is the software GPU's (--backend sim): choose CUDA's GPUs with --backend cuda:all or cuda:N,M")
		}
		var err error
		if numbers, err = cudaOrdinals(list); err != nil {
			return nil, err
		}
	}
	return g.openSet(kind, numbers)
}

func (g GPU) simNumbers() []int {
	if g.OneContext { // a worker's: the one software GPU its spec names
		return []int{g.SimNumber}
	}
	n := make([]int, max(g.SimGPUs, 1))
	for i := range n {
		n[i] = i
	}
	return n
}

// cudaOrdinals resolves cuda:'s list ("" for plain cuda: device 0) to
// device ordinals, asking the driver for its GPUs where the list says all
// or names a UUID.
func cudaOrdinals(list string) ([]int, error) {
	if list == "" {
		return []int{0}, nil
	}
	sel, _ := cudaSelection(list) // checked
	var uuids [][16]byte
	needDevices := sel == nil
	for _, e := range sel {
		needDevices = needDevices || strings.HasPrefix(e, "GPU-")
	}
	if needDevices {
		var err error
		if uuids, err = cuda.Devices(); err != nil {
			return nil, err
		}
		if len(uuids) == 0 {
			return nil, errors.New("cuda:all: the driver reports no GPU")
		}
	}
	if sel == nil {
		all := make([]int, len(uuids))
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	out := make([]int, 0, len(sel))
	for _, e := range sel {
		ord, err := strconv.Atoi(e)
		if err != nil {
			if ord, err = ordinalOf(e, uuids); err != nil {
				return nil, err
			}
		}
		for _, o := range out {
			if o == ord {
				return nil, fmt.Errorf("backend cuda:%s names GPU %d twice", list, ord)
			}
		}
		out = append(out, ord)
	}
	return out, nil
}

// ordinalOf is the ordinal of the one GPU whose UUID starts as e says.
func ordinalOf(e string, uuids [][16]byte) (int, error) {
	prefix := strings.ToLower(strings.TrimPrefix(e, "GPU-"))
	found := -1
	for i, u := range uuids {
		if strings.HasPrefix(abi.UUIDString(u)[len("GPU-"):], prefix) {
			if found >= 0 {
				return 0, fmt.Errorf("%s names more than one GPU (ordinals %d and %d): give more of the UUID", e, found, i)
			}
			found = i
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("%s names none of this host's %d GPUs (nvidia-smi -L lists them)", e, len(uuids))
	}
	return found, nil
}

// openSet opens each GPU numbered: one at number 0 (or a worker's) as a
// plain backend, as a node always did; else a gpu.Set.
func (g GPU) openSet(kind string, numbers []int) (gpu.Backend, error) {
	if len(numbers) == 1 && (numbers[0] == 0 || g.OneContext) {
		return g.openOne(kind, numbers[0])
	}
	devs := make([]gpu.Device, 0, len(numbers))
	for _, n := range numbers {
		b, err := g.openOne(kind, n)
		if err != nil {
			for _, d := range devs {
				d.Backend.Close()
			}
			return nil, fmt.Errorf("opening GPU %d: %w", n, err)
		}
		devs = append(devs, gpu.Device{Index: n, Backend: b})
	}
	return gpu.NewSet(devs...)
}

// openOne opens GPU n of kind (cuda or sim), in workers when g says.
func (g GPU) openOne(kind string, n int) (gpu.Backend, error) {
	if g.Workers {
		return g.openWorkers(kind, n)
	}
	if kind == "sim" {
		if n >= MaxSimGPUs {
			return nil, fmt.Errorf("software GPU %d: a node has at most %d", n, MaxSimGPUs)
		}
		s := sim.New(g.SimMemoryBytes)
		s.BaseShift, s.Number = g.SimBaseShift, uint8(n)
		return s, nil
	}
	c, err := cuda.New(n)
	if err != nil {
		return nil, err
	}
	if g.OneContext { // a worker's: its one guest's context
		c.BlockWhileWaiting()
		c.MakeContextAhead()
	} else {
		c.KeepSpareContexts(g.SpareContexts)
	}
	return c, nil
}

// openWorkers starts the backend whose contexts run in worker processes,
// each of which opens GPU n of kind for one context (so a CUDA worker
// makes its one context ahead, and a spare worker is a spare context).
func (g GPU) openWorkers(kind string, n int) (gpu.Backend, error) {
	child := g
	child.Workers, child.SpareContexts, child.OneContext, child.SimGPUs = false, 0, true, 0
	child.Name, child.SimNumber = kind, n
	if kind == "cuda" {
		child.Name, child.SimNumber = "cuda:"+strconv.Itoa(n), 0
	}
	spec, err := json.Marshal(child)
	if err != nil {
		return nil, err
	}
	return worker.New(worker.Config{Spec: string(spec), Spares: max(g.SpareContexts, 1)})
}

// OpenWorkerSpec opens the GPU a worker's spec names (openWorkers').
func OpenWorkerSpec(spec string) (gpu.Backend, error) {
	var g GPU
	if err := json.Unmarshal([]byte(spec), &g); err != nil || g.Workers || !g.OneContext {
		return nil, fmt.Errorf("a GPU worker's spec %q: not one a node wrote (%v)", spec, err)
	}
	return g.Open()
}

// RunWorkerIfAsked serves as a GPU worker, and exits, when a node started
// this process as one; otherwise it returns at once. The agent's and the
// lab's main call it first, as does the TestMain of a test binary whose
// nodes run workers.
func RunWorkerIfAsked() { worker.RunIfAsked(OpenWorkerSpec) }
