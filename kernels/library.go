package kernels

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The PTX below targets sm_70 with ISA 7.0 so that any driver of the last
// several years JIT-compiles it (CUDA Programming Guide, "Just-in-Time
// Compilation"). Thread index along x is ctaid.x*ntid.x+tid.x throughout.

const ptxHeader = ".version 7.0\n.target sm_70\n.address_size 64\n\n"

// vadd: c[i] = a[i] + b[i] for i < n.
const vaddPTX = ptxHeader + `.visible .entry vadd(
	.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [pa];
	ld.param.u64 %rd2, [pb];
	ld.param.u64 %rd3, [pc];
	ld.param.u32 %r1, [pn];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	cvta.to.global.u64 %rd3, %rd3;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra DONE;
	mul.wide.u32 %rd4, %r5, 4;
	add.s64 %rd5, %rd1, %rd4;
	add.s64 %rd6, %rd2, %rd4;
	add.s64 %rd7, %rd3, %rd4;
	ld.global.f32 %f1, [%rd5];
	ld.global.f32 %f2, [%rd6];
	add.rn.f32 %f3, %f1, %f2;
	st.global.f32 [%rd7], %f3;
DONE:
	ret;
}
`

// saxpy: y[i] = a*x[i] + y[i], multiply and add rounded separately.
const saxpyPTX = ptxHeader + `.visible .entry saxpy(
	.param .u64 px, .param .u64 py, .param .f32 pa, .param .u32 pn)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<6>;
	.reg .b64 %rd<6>;
	ld.param.u64 %rd1, [px];
	ld.param.u64 %rd2, [py];
	ld.param.f32 %f1, [pa];
	ld.param.u32 %r1, [pn];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra DONE;
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd4, %rd1, %rd3;
	add.s64 %rd5, %rd2, %rd3;
	ld.global.f32 %f2, [%rd4];
	ld.global.f32 %f3, [%rd5];
	mul.rn.f32 %f4, %f1, %f2;
	add.rn.f32 %f5, %f4, %f3;
	st.global.f32 [%rd5], %f5;
DONE:
	ret;
}
`

// matmul: C = A*B for n-by-n row-major matrices; row from y, column from x;
// the dot product accumulates k = 0..n-1 in order.
const matmulPTX = ptxHeader + `.visible .entry matmul(
	.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)
{
	.reg .pred %p<4>;
	.reg .b32 %r<16>;
	.reg .f32 %f<6>;
	.reg .b64 %rd<12>;
	ld.param.u64 %rd1, [pa];
	ld.param.u64 %rd2, [pb];
	ld.param.u64 %rd3, [pc];
	ld.param.u32 %r1, [pn];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	cvta.to.global.u64 %rd3, %rd3;
	mov.u32 %r2, %ctaid.y;
	mov.u32 %r3, %ntid.y;
	mov.u32 %r4, %tid.y;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	mov.u32 %r6, %ctaid.x;
	mov.u32 %r7, %ntid.x;
	mov.u32 %r8, %tid.x;
	mad.lo.u32 %r9, %r6, %r7, %r8;
	setp.ge.u32 %p1, %r5, %r1;
	setp.ge.u32 %p2, %r9, %r1;
	or.pred %p3, %p1, %p2;
	@%p3 bra DONE;
	mov.f32 %f1, 0f00000000;
	mov.u32 %r10, 0;
	mul.lo.u32 %r11, %r5, %r1;
LOOP:
	add.u32 %r12, %r11, %r10;
	mul.wide.u32 %rd4, %r12, 4;
	add.s64 %rd5, %rd1, %rd4;
	ld.global.f32 %f2, [%rd5];
	mad.lo.u32 %r13, %r10, %r1, %r9;
	mul.wide.u32 %rd6, %r13, 4;
	add.s64 %rd7, %rd2, %rd6;
	ld.global.f32 %f3, [%rd7];
	mul.rn.f32 %f4, %f2, %f3;
	add.rn.f32 %f1, %f1, %f4;
	add.u32 %r10, %r10, 1;
	setp.lt.u32 %p1, %r10, %r1;
	@%p1 bra LOOP;
	add.u32 %r14, %r11, %r9;
	mul.wide.u32 %rd8, %r14, 4;
	add.s64 %rd9, %rd3, %rd8;
	st.global.f32 [%rd9], %f1;
DONE:
	ret;
}
`

// reduce_sum: each block loads blockDim.x elements (0 past n) into dynamic
// shared memory, halves the active threads each step (s = blockDim/2, /4 ...,
// sdata[t] += sdata[t+s]), and thread 0 stores the block's sum to
// out[blockIdx.x]. Needs blockDim.x*4 bytes of shared memory.
const reduceSumPTX = ptxHeader + `.extern .shared .align 4 .b8 sdata[];

.visible .entry reduce_sum(
	.param .u64 pin, .param .u64 pout, .param .u32 pn)
{
	.reg .pred %p<4>;
	.reg .b32 %r<12>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [pin];
	ld.param.u64 %rd2, [pout];
	ld.param.u32 %r1, [pn];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	mov.f32 %f1, 0f00000000;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra LOADED;
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd4, %rd1, %rd3;
	ld.global.f32 %f1, [%rd4];
LOADED:
	mov.u32 %r6, sdata;
	shl.b32 %r7, %r4, 2;
	add.u32 %r8, %r6, %r7;
	st.shared.f32 [%r8], %f1;
	bar.sync 0;
	shr.u32 %r9, %r3, 1;
	setp.eq.u32 %p1, %r9, 0;
	@%p1 bra WRITE;
STEP:
	setp.ge.u32 %p2, %r4, %r9;
	@%p2 bra SKIP;
	shl.b32 %r10, %r9, 2;
	add.u32 %r11, %r8, %r10;
	ld.shared.f32 %f2, [%r8];
	ld.shared.f32 %f3, [%r11];
	add.rn.f32 %f2, %f2, %f3;
	st.shared.f32 [%r8], %f2;
SKIP:
	bar.sync 0;
	shr.u32 %r9, %r9, 1;
	setp.ne.u32 %p1, %r9, 0;
	@%p1 bra STEP;
WRITE:
	setp.ne.u32 %p3, %r4, 0;
	@%p3 bra DONE;
	ld.shared.f32 %f2, [%r6];
	mul.wide.u32 %rd5, %r2, 4;
	add.s64 %rd6, %rd2, %rd5;
	st.global.f32 [%rd6], %f2;
DONE:
	ret;
}
`

// histogram: atomically bins[data[i] % nbins] += 1 for i < n; no-op when
// nbins is zero.
const histogramPTX = ptxHeader + `.visible .entry histogram(
	.param .u64 pdata, .param .u32 pn, .param .u64 pbins, .param .u32 pnbins)
{
	.reg .pred %p<3>;
	.reg .b32 %r<10>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [pdata];
	ld.param.u32 %r1, [pn];
	ld.param.u64 %rd2, [pbins];
	ld.param.u32 %r2, [pnbins];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	setp.eq.u32 %p1, %r2, 0;
	@%p1 bra DONE;
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.u32 %r6, %r3, %r4, %r5;
	setp.ge.u32 %p2, %r6, %r1;
	@%p2 bra DONE;
	mul.wide.u32 %rd3, %r6, 4;
	add.s64 %rd4, %rd1, %rd3;
	ld.global.u32 %r7, [%rd4];
	rem.u32 %r8, %r7, %r2;
	mul.wide.u32 %rd5, %r8, 4;
	add.s64 %rd6, %rd2, %rd5;
	atom.global.add.u32 %r9, [%rd6], 1;
DONE:
	ret;
}
`

// pointer_chase: thread 0 of block 0 walks steps nodes of {next u64,
// value u64} from start, and stores the sum of values and the final pointer
// to out[0], out[1]. Every next pointer is a raw device address read from
// device memory, so the result is right only where addresses are identical.
const pointerChasePTX = ptxHeader + `.visible .entry pointer_chase(
	.param .u64 pstart, .param .u32 psteps, .param .u64 pout)
{
	.reg .pred %p<3>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<6>;
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, %ctaid.x;
	or.b32 %r3, %r1, %r2;
	setp.ne.u32 %p1, %r3, 0;
	@%p1 bra DONE;
	ld.param.u64 %rd1, [pstart];
	ld.param.u32 %r4, [psteps];
	ld.param.u64 %rd2, [pout];
	cvta.to.global.u64 %rd2, %rd2;
	mov.u64 %rd3, 0;
	mov.u32 %r5, 0;
	setp.eq.u32 %p2, %r4, 0;
	@%p2 bra STORE;
LOOP:
	cvta.to.global.u64 %rd4, %rd1;
	ld.global.u64 %rd5, [%rd4+8];
	add.s64 %rd3, %rd3, %rd5;
	ld.global.u64 %rd1, [%rd4];
	add.u32 %r5, %r5, 1;
	setp.lt.u32 %p2, %r5, %r4;
	@%p2 bra LOOP;
STORE:
	st.global.u64 [%rd2], %rd3;
	st.global.u64 [%rd2+8], %rd1;
DONE:
	ret;
}
`

func init() {
	p, u32, f32 := abi.ArgPtr, abi.ArgU32, abi.ArgF32
	register(&Kernel{Name: "vadd", Params: []abi.ArgKind{p, p, p, u32}, PTX: vaddPTX, Run: runVadd, footprint: vaddFootprint})
	register(&Kernel{Name: "saxpy", Params: []abi.ArgKind{p, p, f32, u32}, PTX: saxpyPTX, Run: runSaxpy, footprint: saxpyFootprint})
	register(&Kernel{Name: "matmul", Params: []abi.ArgKind{p, p, p, u32}, PTX: matmulPTX, Run: runMatmul, footprint: matmulFootprint})
	register(&Kernel{Name: "reduce_sum", Params: []abi.ArgKind{p, p, u32}, PTX: reduceSumPTX, Run: runReduceSum, footprint: reduceSumFootprint})
	register(&Kernel{Name: "histogram", Params: []abi.ArgKind{p, u32, p, u32}, PTX: histogramPTX, Run: runHistogram, footprint: histogramFootprint})
	register(&Kernel{Name: "pointer_chase", Params: []abi.ArgKind{p, u32, p}, PTX: pointerChasePTX, Run: runPointerChase, footprint: pointerChaseFootprint, FollowsPointers: true})
}

func f32at(b []byte, i uint64) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}
func putf32(b []byte, i uint64, v float32) {
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
}

// active is how many elements a 1-D kernel over n elements touches: the
// threads past n do nothing, and elements past the grid are never reached.
func active(l Launch, n uint32) uint64 { return min(uint64(n), l.Threads()) }

func runVadd(mem Memory, l Launch) error {
	n := active(l, l.Args[3].U32())
	a, err := view(mem, l.Args[0].Bits, n, 4, "vadd a")
	if err != nil {
		return err
	}
	b, err := view(mem, l.Args[1].Bits, n, 4, "vadd b")
	if err != nil {
		return err
	}
	c, err := view(mem, l.Args[2].Bits, n, 4, "vadd c")
	if err != nil {
		return err
	}
	for i := uint64(0); i < n; i++ {
		putf32(c, i, f32at(a, i)+f32at(b, i))
	}
	return nil
}

func runSaxpy(mem Memory, l Launch) error {
	n := active(l, l.Args[3].U32())
	a := l.Args[2].F32()
	x, err := view(mem, l.Args[0].Bits, n, 4, "saxpy x")
	if err != nil {
		return err
	}
	y, err := view(mem, l.Args[1].Bits, n, 4, "saxpy y")
	if err != nil {
		return err
	}
	for i := uint64(0); i < n; i++ {
		putf32(y, i, float32(a*f32at(x, i))+f32at(y, i))
	}
	return nil
}

func runMatmul(mem Memory, l Launch) error {
	n := uint64(l.Args[3].U32())
	rows := min(n, uint64(l.Grid.Y)*uint64(l.Block.Y))
	cols := min(n, uint64(l.Grid.X)*uint64(l.Block.X))
	if rows == 0 || cols == 0 {
		return nil
	}
	elems, err := span(n, n, "matmul n×n")
	if err != nil {
		return err
	}
	a, err := view(mem, l.Args[0].Bits, elems, 4, "matmul A")
	if err != nil {
		return err
	}
	b, err := view(mem, l.Args[1].Bits, elems, 4, "matmul B")
	if err != nil {
		return err
	}
	c, err := view(mem, l.Args[2].Bits, elems, 4, "matmul C")
	if err != nil {
		return err
	}
	for r := uint64(0); r < rows; r++ {
		for col := uint64(0); col < cols; col++ {
			var sum float32
			for k := uint64(0); k < n; k++ {
				sum += float32(f32at(a, r*n+k) * f32at(b, k*n+col))
			}
			putf32(c, r*n+col, sum)
		}
	}
	return nil
}

func runReduceSum(mem Memory, l Launch) error {
	bs := uint64(l.Block.X)
	if uint64(l.SharedBytes) < 4*bs {
		return fmt.Errorf("%w: reduce_sum needs %d bytes of shared memory, launch gave %d", ErrFault, 4*bs, l.SharedBytes)
	}
	n := uint64(l.Args[2].U32())
	in, err := view(mem, l.Args[0].Bits, active(l, uint32(n)), 4, "reduce_sum in")
	if err != nil {
		return err
	}
	out, err := view(mem, l.Args[1].Bits, uint64(l.Grid.X), 4, "reduce_sum out")
	if err != nil {
		return err
	}
	shared := make([]float32, bs)
	for blk := uint64(0); blk < uint64(l.Grid.X); blk++ {
		for t := uint64(0); t < bs; t++ {
			shared[t] = 0
			if i := blk*bs + t; i < n {
				shared[t] = f32at(in, i)
			}
		}
		for s := bs / 2; s > 0; s /= 2 {
			for t := uint64(0); t < s; t++ {
				shared[t] += shared[t+s]
			}
		}
		putf32(out, blk, shared[0])
	}
	return nil
}

func runHistogram(mem Memory, l Launch) error {
	nbins := uint64(l.Args[3].U32())
	if nbins == 0 {
		return nil
	}
	n := active(l, l.Args[1].U32())
	data, err := view(mem, l.Args[0].Bits, n, 4, "histogram data")
	if err != nil {
		return err
	}
	bins, err := view(mem, l.Args[2].Bits, nbins, 4, "histogram bins")
	if err != nil {
		return err
	}
	for i := uint64(0); i < n; i++ {
		b := uint64(binary.LittleEndian.Uint32(data[4*i:])) % nbins
		binary.LittleEndian.PutUint32(bins[4*b:], binary.LittleEndian.Uint32(bins[4*b:])+1)
	}
	return nil
}

func runPointerChase(mem Memory, l Launch) error {
	if l.Threads() == 0 {
		return nil
	}
	p := l.Args[0].Bits
	steps := l.Args[1].U32()
	out, err := view(mem, l.Args[2].Bits, 2, 8, "pointer_chase out")
	if err != nil {
		return err
	}
	var sum uint64
	for s := uint32(0); s < steps; s++ {
		node, err := view(mem, p, 2, 8, fmt.Sprintf("pointer_chase node %d at %#x", s, p))
		if err != nil {
			return err
		}
		sum += binary.LittleEndian.Uint64(node[8:])
		p = binary.LittleEndian.Uint64(node[0:])
	}
	binary.LittleEndian.PutUint64(out[0:], sum)
	binary.LittleEndian.PutUint64(out[8:], p)
	return nil
}
