package kernels

// Extent is memory one pointer argument of a launch reaches: Bytes bytes
// from the argument's address.
type Extent struct {
	Arg   int
	Bytes uint64
	What  string
}

// Footprint lists the memory a launch of k reaches through its pointer
// arguments, computed from the launch alone, so the hypervisor checks it
// against the guest's allocations before any backend runs the kernel: the
// software GPU also checks every access, a GPU runs the PTX unchecked. A
// kernel that follows pointers stored in memory (FollowsPointers) reaches
// more than its footprint says. The Go twins never view outside their
// footprint (TestFootprintCoversRun). The extents are appended to dst
// (whose buffer the caller may reuse from launch to launch).
func (k *Kernel) Footprint(l Launch, dst []Extent) ([]Extent, error) {
	if err := k.checkLaunch(l); err != nil {
		return nil, err
	}
	if k.footprint == nil {
		return dst[:0], nil
	}
	return k.footprint(l, dst[:0])
}

// elems is an extent of count 4-byte elements.
func elems(arg int, count uint64, what string) (Extent, error) {
	n, err := span(count, 4, what)
	return Extent{Arg: arg, Bytes: n, What: what}, err
}

func extents(out []Extent, parts ...func() (Extent, error)) ([]Extent, error) {
	for _, p := range parts {
		e, err := p()
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func arrayOf(arg int, count uint64, what string) func() (Extent, error) {
	return func() (Extent, error) { return elems(arg, count, what) }
}

func vaddFootprint(l Launch, dst []Extent) ([]Extent, error) {
	n := active(l, l.Args[3].U32())
	return extents(dst, arrayOf(0, n, "vadd a"), arrayOf(1, n, "vadd b"), arrayOf(2, n, "vadd c"))
}

func saxpyFootprint(l Launch, dst []Extent) ([]Extent, error) {
	n := active(l, l.Args[3].U32())
	return extents(dst, arrayOf(0, n, "saxpy x"), arrayOf(1, n, "saxpy y"))
}

func matmulFootprint(l Launch, dst []Extent) ([]Extent, error) {
	n := uint64(l.Args[3].U32())
	if min(n, uint64(l.Grid.Y)*uint64(l.Block.Y)) == 0 || min(n, uint64(l.Grid.X)*uint64(l.Block.X)) == 0 {
		return dst, nil
	}
	count, err := span(n, n, "matmul n×n")
	if err != nil {
		return nil, err
	}
	return extents(dst, arrayOf(0, count, "matmul A"), arrayOf(1, count, "matmul B"), arrayOf(2, count, "matmul C"))
}

func reduceSumFootprint(l Launch, dst []Extent) ([]Extent, error) {
	return extents(dst, arrayOf(0, active(l, l.Args[2].U32()), "reduce_sum in"), arrayOf(1, uint64(l.Grid.X), "reduce_sum out"))
}

func histogramFootprint(l Launch, dst []Extent) ([]Extent, error) {
	nbins := uint64(l.Args[3].U32())
	if nbins == 0 {
		return dst, nil
	}
	return extents(dst, arrayOf(0, active(l, l.Args[1].U32()), "histogram data"), arrayOf(2, nbins, "histogram bins"))
}

// pointerChaseFootprint is the output and the first node; the nodes after
// it are wherever the stored pointers lead (FollowsPointers).
func pointerChaseFootprint(l Launch, dst []Extent) ([]Extent, error) {
	if l.Threads() == 0 {
		return dst, nil
	}
	return append(dst, Extent{Arg: 2, Bytes: 16, What: "pointer_chase out"}, Extent{Arg: 0, Bytes: 16, What: "pointer_chase first node"}), nil
}
