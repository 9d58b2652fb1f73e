package workload

import (
	"encoding/binary"
	"fmt"

	"github.com/vgpuha/vgpuha/pvdriver"
)

func init() {
	add(Workload{Name: "vadd", DefaultSize: 1 << 18, run: runVadd})
	add(Workload{Name: "saxpy", DefaultSize: 1 << 18, run: runSaxpy})
	add(Workload{Name: "matmul", DefaultSize: 96, run: runMatmul})
	add(Workload{Name: "reduce_sum", DefaultSize: 1 << 18, run: runReduceSum})
	add(Workload{Name: "histogram", DefaultSize: 1 << 18, run: runHistogram})
	add(Workload{Name: "pointer_chase", DefaultSize: 1 << 12, run: runPointerChase})
}

const threads = 256

func runVadd(c *pvdriver.Client, n int) ([]byte, bool, string, error) {
	a, b, want := make([]float32, n), make([]float32, n), make([]float32, n)
	r := rng(n)
	for i := range a {
		a[i] = float32(r.next()%10000) * 0.37
		b[i] = float32(r.next()%10000) * 0.011
		want[i] = a[i] + b[i]
	}
	f, err := kernel(c, "vadd")
	if err != nil {
		return nil, false, "", err
	}
	s, err := c.CreateStream()
	if err != nil {
		return nil, false, "", err
	}
	da, err := upload(c, f32bytes(a), s)
	if err != nil {
		return nil, false, "", err
	}
	db, err := upload(c, f32bytes(b), s)
	if err != nil {
		return nil, false, "", err
	}
	dc, err := c.Alloc(uint64(4 * n))
	if err != nil {
		return nil, false, "", err
	}
	if err := c.Memset32(dc, 0xffffffff, uint64(n)); err != nil {
		return nil, false, "", err
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(blocks(n, threads)), Block: pvdriver.Dim(threads), Stream: s}
	if err := c.Launch(f, cfg, pvdriver.Ptr(da), pvdriver.Ptr(db), pvdriver.Ptr(dc), pvdriver.U32(uint32(n))); err != nil {
		return nil, false, "", err
	}
	if err := c.StreamSynchronize(s); err != nil {
		return nil, false, "", err
	}
	out, err := download(c, dc, 4*n)
	if err != nil {
		return nil, false, "", err
	}
	ok, detail := check(bytesf32(out), want)
	return out, ok, detail, nil
}

func runSaxpy(c *pvdriver.Client, n int) ([]byte, bool, string, error) {
	const a = float32(2.5)
	x, y, want := make([]float32, n), make([]float32, n), make([]float32, n)
	r := rng(n + 1)
	for i := range x {
		x[i] = float32(r.next()%1000) * 0.001
		y[i] = float32(r.next() % 7)
		want[i] = float32(a*x[i]) + y[i]
	}
	f, err := kernel(c, "saxpy")
	if err != nil {
		return nil, false, "", err
	}
	dx, err := upload(c, f32bytes(x), 0)
	if err != nil {
		return nil, false, "", err
	}
	dy0, err := upload(c, f32bytes(y), 0)
	if err != nil {
		return nil, false, "", err
	}
	dy, err := c.Alloc(uint64(4 * n))
	if err != nil {
		return nil, false, "", err
	}
	if err := c.CopyDtoDAsync(dy, dy0, uint64(4*n), 0); err != nil {
		return nil, false, "", err
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(blocks(n, threads)), Block: pvdriver.Dim(threads)}
	if err := c.Launch(f, cfg, pvdriver.Ptr(dx), pvdriver.Ptr(dy), pvdriver.F32(a), pvdriver.U32(uint32(n))); err != nil {
		return nil, false, "", err
	}
	if err := c.Synchronize(); err != nil {
		return nil, false, "", err
	}
	out, err := download(c, dy, 4*n)
	if err != nil {
		return nil, false, "", err
	}
	ok, detail := check(bytesf32(out), want)
	return out, ok, detail, nil
}

func runMatmul(c *pvdriver.Client, n int) ([]byte, bool, string, error) {
	a, b, want := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	r := rng(n + 2)
	for i := range a {
		a[i] = float32(int(r.next()%200)-100) * 0.01
		b[i] = float32(int(r.next()%200)-100) * 0.02
	}
	for row := 0; row < n; row++ {
		for col := 0; col < n; col++ {
			var sum float32
			for k := 0; k < n; k++ {
				sum += float32(a[row*n+k] * b[k*n+col])
			}
			want[row*n+col] = sum
		}
	}
	f, err := kernel(c, "matmul")
	if err != nil {
		return nil, false, "", err
	}
	da, err := upload(c, f32bytes(a), 0)
	if err != nil {
		return nil, false, "", err
	}
	db, err := upload(c, f32bytes(b), 0)
	if err != nil {
		return nil, false, "", err
	}
	dc, err := c.Alloc(uint64(4 * n * n))
	if err != nil {
		return nil, false, "", err
	}
	const tile = 16
	g := blocks(n, tile)
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim3(g, g), Block: pvdriver.Dim3(tile, tile)}
	if err := c.Launch(f, cfg, pvdriver.Ptr(da), pvdriver.Ptr(db), pvdriver.Ptr(dc), pvdriver.U32(uint32(n))); err != nil {
		return nil, false, "", err
	}
	if err := c.Synchronize(); err != nil {
		return nil, false, "", err
	}
	out, err := download(c, dc, 4*n*n)
	if err != nil {
		return nil, false, "", err
	}
	ok, detail := check(bytesf32(out), want)
	return out, ok, detail, nil
}

func runReduceSum(c *pvdriver.Client, n int) ([]byte, bool, string, error) {
	in := make([]float32, n)
	r := rng(n + 3)
	for i := range in {
		in[i] = float32(r.next()%1000) * 0.125
	}
	nb := int(blocks(n, threads))
	want := make([]float32, nb)
	shared := make([]float32, threads)
	for blk := 0; blk < nb; blk++ {
		for t := range shared {
			shared[t] = 0
			if i := blk*threads + t; i < n {
				shared[t] = in[i]
			}
		}
		for s := threads / 2; s > 0; s /= 2 {
			for t := 0; t < s; t++ {
				shared[t] += shared[t+s]
			}
		}
		want[blk] = shared[0]
	}
	f, err := kernel(c, "reduce_sum")
	if err != nil {
		return nil, false, "", err
	}
	din, err := upload(c, f32bytes(in), 0)
	if err != nil {
		return nil, false, "", err
	}
	dout, err := c.Alloc(uint64(4 * nb))
	if err != nil {
		return nil, false, "", err
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(uint32(nb)), Block: pvdriver.Dim(threads), SharedBytes: 4 * threads}
	if err := c.Launch(f, cfg, pvdriver.Ptr(din), pvdriver.Ptr(dout), pvdriver.U32(uint32(n))); err != nil {
		return nil, false, "", err
	}
	if err := c.Synchronize(); err != nil {
		return nil, false, "", err
	}
	out, err := download(c, dout, 4*nb)
	if err != nil {
		return nil, false, "", err
	}
	var total float64
	for _, v := range bytesf32(out) {
		total += float64(v)
	}
	ok, detail := check(bytesf32(out), want)
	if ok {
		detail = fmt.Sprintf("sum %.3f over %d blocks", total, nb)
	}
	return out, ok, detail, nil
}

func runHistogram(c *pvdriver.Client, n int) ([]byte, bool, string, error) {
	const nbins = 64
	data := make([]byte, 4*n)
	want := make([]uint32, nbins)
	r := rng(n + 4)
	for i := 0; i < n; i++ {
		v := uint32(r.next())
		binary.LittleEndian.PutUint32(data[4*i:], v)
		want[v%nbins]++
	}
	f, err := kernel(c, "histogram")
	if err != nil {
		return nil, false, "", err
	}
	ddata, err := upload(c, data, 0)
	if err != nil {
		return nil, false, "", err
	}
	dbins, err := c.Alloc(4 * nbins)
	if err != nil {
		return nil, false, "", err
	}
	if err := c.Memset8(dbins, 0, 4*nbins); err != nil {
		return nil, false, "", err
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(blocks(n, threads)), Block: pvdriver.Dim(threads)}
	if err := c.Launch(f, cfg, pvdriver.Ptr(ddata), pvdriver.U32(uint32(n)), pvdriver.Ptr(dbins), pvdriver.U32(nbins)); err != nil {
		return nil, false, "", err
	}
	if err := c.Synchronize(); err != nil {
		return nil, false, "", err
	}
	out, err := download(c, dbins, 4*nbins)
	if err != nil {
		return nil, false, "", err
	}
	got := make([]uint32, nbins)
	for i := range got {
		got[i] = binary.LittleEndian.Uint32(out[4*i:])
	}
	ok, detail := check(got, want)
	return out, ok, detail, nil
}

// runPointerChase builds a random cycle of n nodes whose next fields are raw
// device addresses, walks it on the device, and checks the walk.
func runPointerChase(c *pvdriver.Client, n int) ([]byte, bool, string, error) {
	f, err := kernel(c, "pointer_chase")
	if err != nil {
		return nil, false, "", err
	}
	nodes, err := c.Alloc(uint64(16 * n))
	if err != nil {
		return nil, false, "", err
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	r := rng(n + 5)
	for i := n - 1; i > 0; i-- {
		j := int(r.next() % uint64(i+1))
		order[i], order[j] = order[j], order[i]
	}
	addr := func(i int) uint64 { return uint64(nodes) + 16*uint64(i) }
	buf := make([]byte, 16*n)
	for k, i := range order {
		next := order[(k+1)%n]
		binary.LittleEndian.PutUint64(buf[16*i:], addr(next))
		binary.LittleEndian.PutUint64(buf[16*i+8:], uint64(3*i+1))
	}
	if err := c.CopyHtoD(nodes, buf); err != nil {
		return nil, false, "", err
	}
	dout, err := c.Alloc(16)
	if err != nil {
		return nil, false, "", err
	}
	steps := n + n/2
	var wantSum uint64
	p := order[0]
	for s := 0; s < steps; s++ {
		wantSum += uint64(3*p + 1)
		p = int((binary.LittleEndian.Uint64(buf[16*p:]) - uint64(nodes)) / 16)
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(1)}
	if err := c.Launch(f, cfg, pvdriver.Ptr(pvdriver.DevicePtr(addr(order[0]))), pvdriver.U32(uint32(steps)), pvdriver.Ptr(dout)); err != nil {
		return nil, false, "", err
	}
	if err := c.Synchronize(); err != nil {
		return nil, false, "", err
	}
	out, err := download(c, dout, 16)
	if err != nil {
		return nil, false, "", err
	}
	gotSum, gotEnd := binary.LittleEndian.Uint64(out), binary.LittleEndian.Uint64(out[8:])
	// The checksum covers the sum and the end node's offset, not its raw
	// address, so it does not depend on where the session's window lies.
	norm := binary.LittleEndian.AppendUint64(nil, gotSum)
	norm = binary.LittleEndian.AppendUint64(norm, gotEnd-uint64(nodes))
	if gotSum != wantSum || gotEnd != addr(p) {
		return norm, false, fmt.Sprintf("walk of %d steps: got sum %d end %#x, want sum %d end %#x", steps, gotSum, gotEnd, wantSum, addr(p)), nil
	}
	return norm, true, fmt.Sprintf("%d steps over %d nodes", steps, n), nil
}
