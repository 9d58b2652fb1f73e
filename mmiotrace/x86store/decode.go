package x86store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// Regs is the part of a thread's CPU state a store can depend on. GPR is
// indexed RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8 … R15 (x86 encoding
// order); Vec holds the 32-byte YMM registers (XMM is the low half).
type Regs struct {
	GPR            [16]uint64
	RIP, RFlags    uint64
	FSBase, GSBase uint64
	Vec            [16][32]byte
}

const flagDF = 1 << 10 // RFLAGS direction flag: string ops count down

// How a decoded store is handled.
type handling int

const (
	// emulate: the tracer computes the stored bytes, writes them itself and
	// advances RIP; the page is never unprotected.
	emulate handling = iota + 1
	// stepRange: the tracer knows where and how wide the store is but not
	// its value (a read-modify-write such as LOCK XADD): it single-steps
	// the instruction and records the bytes at that range afterwards.
	stepRange
	// stepCompare: the decoder cannot bound what the instruction writes
	// (BTS with a register bit offset reaches far beyond its operand): it
	// is single-stepped like an undecodable one, and the pages it touched
	// compared before and after.
	stepCompare
)

// Access is a decoded instruction that stores to memory.
type Access struct {
	Inst     x86asm.Inst
	how      handling
	width    int  // bytes per element (per iteration for string ops)
	rep      bool // REP prefix: RCX elements
	stringOp bool // STOS/MOVS: destination [RDI], advances RDI (and RSI)
}

// Emulated reports whether the tracer writes the value itself.
func (a *Access) Emulated() bool { return a.how == emulate }

// Bounded reports whether the decoder proves where the store lands
// (Target): true for emulated stores and plain read-modify-writes, false
// for those the tracer must compare (a bit-test with a register offset).
func (a *Access) Bounded() bool { return a.how != stepCompare }

// VectorSource reports whether the stored value comes from an XMM or YMM
// register, which the tracer must then read from the thread's XSAVE area.
func (a *Access) VectorSource() bool {
	r, ok := a.Inst.Args[1].(x86asm.Reg)
	return ok && (r >= x86asm.X0 && r <= x86asm.X15 || r >= x86asm.Y0 && r <= x86asm.Y15)
}

// Width is the bytes stored per element.
func (a *Access) Width() int { return a.width }

// Rep reports a REP prefix: the store repeats for RCX elements.
func (a *Access) Rep() bool { return a.rep }

// StringOp reports a STOS or MOVS: the destination is [RDI], which
// advances (and RSI with it).
func (a *Access) StringOp() bool { return a.stringOp }

// ErrNotStore is returned by Decode for an instruction that does not write
// memory, or whose store it cannot describe: the tracer then single-steps
// it and compares the page before and after.
var ErrNotStore = errors.New("not a decodable store")

// Decode decodes the instruction at the start of code (64-bit mode).
func Decode(code []byte) (*Access, error) {
	inst, err := x86asm.Decode(code, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotStore, err)
	}
	a := &Access{Inst: inst}
	rep := hasPrefix(inst, x86asm.PrefixREP) || hasPrefix(inst, x86asm.PrefixREPN)
	switch inst.Op {
	case x86asm.STOSB, x86asm.STOSW, x86asm.STOSD, x86asm.STOSQ:
		a.how, a.width, a.rep, a.stringOp = emulate, stringWidth(inst.Op), rep, true
		return a, nil
	case x86asm.MOVSB, x86asm.MOVSW, x86asm.MOVSD, x86asm.MOVSQ:
		if _, isMem := inst.Args[1].(x86asm.Mem); !isMem {
			break // MOVSD xmm form: an SSE move, handled below
		}
		a.how, a.width, a.rep, a.stringOp = emulate, stringWidth(inst.Op), rep, true
		return a, nil
	}
	if _, ok := inst.Args[0].(x86asm.Mem); !ok || inst.MemBytes == 0 {
		return nil, fmt.Errorf("%w: %v", ErrNotStore, inst)
	}
	a.width = inst.MemBytes
	switch inst.Op {
	case x86asm.MOV, x86asm.MOVNTI, x86asm.XCHG,
		x86asm.MOVDQU, x86asm.MOVDQA, x86asm.MOVUPS, x86asm.MOVAPS, x86asm.MOVUPD, x86asm.MOVAPD,
		x86asm.MOVNTDQ, x86asm.MOVNTPS, x86asm.MOVNTPD, x86asm.MOVQ, x86asm.MOVD, x86asm.MOVSD_XMM, x86asm.MOVSS,
		x86asm.VMOVDQU, x86asm.VMOVDQA, x86asm.VMOVUPS, x86asm.VMOVAPS, x86asm.VMOVNTDQ:
		if _, err := a.source(&Regs{}); err == nil && plainAddress(inst) {
			a.how = emulate
			return a, nil
		}
	}
	a.how = stepRange
	if !plainAddress(inst) {
		// A vector index (VSIB: scatters store one element per lane, each
		// at its own address) or an EVEX encoding (masked, broadcast):
		// neither the address nor the bytes follow from the operand.
		a.how = stepCompare
		return a, nil
	}
	switch inst.Op {
	case x86asm.BTS, x86asm.BTR, x86asm.BTC:
		// BTS [mem], reg addresses the bit at mem + reg/8 (signed, up to
		// ±2^60 bytes away): the operand says nothing about where it lands.
		if _, isReg := inst.Args[1].(x86asm.Reg); isReg {
			a.how = stepCompare
		}
	}
	return a, nil
}

// plainAddress reports whether inst's memory operand is addressed by
// general-purpose registers only and it has no EVEX prefix, so that Target
// is where it stores.
func plainAddress(inst x86asm.Inst) bool {
	for _, p := range inst.Prefix {
		if p == 0 {
			break
		}
		if p.IsEVEX() {
			return false
		}
	}
	for _, arg := range inst.Args {
		switch arg := arg.(type) {
		case x86asm.Mem:
			for _, reg := range []x86asm.Reg{arg.Base, arg.Index} {
				if _, _, _, ok := gpr(reg); !ok && reg != 0 && reg != x86asm.RIP {
					return false
				}
			}
		case x86asm.Reg:
			if arg >= x86asm.Z0 { // ZMM and mask registers: AVX-512 only
				return false
			}
		}
	}
	return true
}

func hasPrefix(inst x86asm.Inst, p x86asm.Prefix) bool {
	for _, q := range inst.Prefix {
		if q == 0 {
			break
		}
		if q&0xFF == p {
			return true
		}
	}
	return false
}

func stringWidth(op x86asm.Op) int {
	switch op {
	case x86asm.STOSB, x86asm.MOVSB:
		return 1
	case x86asm.STOSW, x86asm.MOVSW:
		return 2
	case x86asm.STOSD, x86asm.MOVSD:
		return 4
	}
	return 8
}

// Target is where the store lands: the first byte and the total length
// (for REP string ops, all iterations).
func (a *Access) Target(r *Regs) (addr uint64, n uint64) {
	if a.stringOp {
		count := uint64(1)
		if a.rep {
			count = r.GPR[rcx]
		}
		n = count * uint64(a.width)
		addr = r.GPR[rdi]
		if r.RFlags&flagDF != 0 && count > 0 {
			addr -= n - uint64(a.width)
		}
		return addr, n
	}
	return effectiveAddr(a.Inst.Args[0].(x86asm.Mem), a.Inst, r), uint64(a.width)
}

// Register indexes into Regs.GPR.
const (
	rax = iota
	rcx
	rdx
	rbx
	rsp
	rbp
	rsi
	rdi
)

// gpr maps an x86asm register to its GPR index, its width in bytes and
// whether it is a legacy high-byte register (AH, CH, DH, BH).
func gpr(reg x86asm.Reg) (idx, width int, high, ok bool) {
	switch {
	case reg >= x86asm.AL && reg <= x86asm.R15B:
		i := int(reg - x86asm.AL)
		switch reg {
		case x86asm.AH, x86asm.CH, x86asm.DH, x86asm.BH:
			return int(reg-x86asm.AH) + 0, 1, true, true // AH..BH follow AL..BL in x86asm's order
		case x86asm.SPB, x86asm.BPB, x86asm.SIB, x86asm.DIB:
			return int(reg-x86asm.SPB) + 4, 1, false, true
		}
		if i < 4 {
			return i, 1, false, true
		}
		return int(reg-x86asm.R8B) + 8, 1, false, true
	case reg >= x86asm.AX && reg <= x86asm.R15W:
		return int(reg - x86asm.AX), 2, false, true
	case reg >= x86asm.EAX && reg <= x86asm.R15L:
		return int(reg - x86asm.EAX), 4, false, true
	case reg >= x86asm.RAX && reg <= x86asm.R15:
		return int(reg - x86asm.RAX), 8, false, true
	}
	return 0, 0, false, false
}

// regValue reads a general-purpose register at its own width.
func regValue(r *Regs, reg x86asm.Reg) (uint64, bool) {
	if reg == x86asm.RIP {
		return r.RIP, true
	}
	idx, w, high, ok := gpr(reg)
	if !ok {
		return 0, false
	}
	v := r.GPR[idx]
	if high {
		return (v >> 8) & 0xFF, true
	}
	if w < 8 {
		v &= 1<<(8*w) - 1
	}
	return v, true
}

// setReg writes a general-purpose register with the CPU's rules: 32-bit
// writes zero the upper half, 8- and 16-bit writes keep the rest.
func setReg(r *Regs, reg x86asm.Reg, v uint64) {
	idx, w, high, ok := gpr(reg)
	if !ok {
		return
	}
	switch {
	case high:
		r.GPR[idx] = r.GPR[idx]&^0xFF00 | (v&0xFF)<<8
	case w == 4:
		r.GPR[idx] = v & 0xFFFFFFFF
	case w == 8:
		r.GPR[idx] = v
	default:
		mask := uint64(1)<<(8*w) - 1
		r.GPR[idx] = r.GPR[idx]&^mask | v&mask
	}
}

func effectiveAddr(m x86asm.Mem, inst x86asm.Inst, r *Regs) uint64 {
	var addr uint64
	if m.Base == x86asm.RIP {
		addr = r.RIP + uint64(inst.Len)
	} else if m.Base != 0 {
		addr, _ = regValue(r, m.Base)
	}
	if m.Index != 0 {
		v, _ := regValue(r, m.Index)
		addr += v * uint64(m.Scale)
	}
	addr += uint64(m.Disp)
	if inst.AddrSize == 32 {
		addr &= 0xFFFFFFFF
	}
	switch m.Segment {
	case x86asm.FS:
		addr += r.FSBase
	case x86asm.GS:
		addr += r.GSBase
	}
	return addr
}

// source is the bytes a non-string store writes, from its register or
// immediate operand.
func (a *Access) source(r *Regs) ([]byte, error) {
	out := make([]byte, a.width)
	switch src := a.Inst.Args[1].(type) {
	case x86asm.Imm:
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(src)) // sign-extended by the decoder
		if a.width > 8 {
			return nil, ErrNotStore
		}
		copy(out, b[:a.width])
		return out, nil
	case x86asm.Reg:
		switch {
		case src >= x86asm.X0 && src <= x86asm.X15:
			if a.width > 16 {
				return nil, ErrNotStore
			}
			copy(out, r.Vec[src-x86asm.X0][:a.width])
			return out, nil
		case src >= x86asm.Y0 && src <= x86asm.Y15:
			if a.width > 32 {
				return nil, ErrNotStore
			}
			copy(out, r.Vec[src-x86asm.Y0][:a.width])
			return out, nil
		}
		v, ok := regValue(r, src)
		if !ok || a.width > 8 {
			return nil, ErrNotStore
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		copy(out, b[:a.width])
		return out, nil
	}
	return nil, ErrNotStore
}

// Store is one emulated write.
type Store struct {
	Addr uint64
	Data []byte
}

// Emulate computes what an emulated access stores and updates r as the
// CPU would have (RIP past the instruction, string registers, the
// register XCHG loads). read fetches guest memory (the old value for XCHG,
// the source of MOVS). It must only be called when Emulated is true.
func (a *Access) Emulate(r *Regs, read func(addr uint64, b []byte) error) (Store, error) {
	addr, n := a.Target(r)
	st := Store{Addr: addr}
	switch {
	case a.stringOp && isStos(a.Inst.Op):
		v, _ := regValue(r, [...]x86asm.Reg{1: x86asm.AL, 2: x86asm.AX, 4: x86asm.EAX, 8: x86asm.RAX}[a.width])
		var elem [8]byte
		binary.LittleEndian.PutUint64(elem[:], v)
		st.Data = make([]byte, n)
		for i := uint64(0); i < n; i += uint64(a.width) {
			copy(st.Data[i:], elem[:a.width])
		}
		a.advanceString(r, n, false)
	case a.stringOp: // MOVS: copy from [RSI]
		src := r.GPR[rsi]
		if r.RFlags&flagDF != 0 {
			src -= n - uint64(a.width)
		}
		data, err := a.copyElements(r, src, addr, n, read)
		if err != nil {
			return Store{}, err
		}
		st.Data = data
		a.advanceString(r, n, true)
	case a.Inst.Op == x86asm.XCHG:
		data, err := a.source(r)
		if err != nil {
			return Store{}, err
		}
		old := make([]byte, a.width)
		if err := read(addr, old); err != nil {
			return Store{}, err
		}
		var b [8]byte
		copy(b[:], old)
		setReg(r, a.Inst.Args[1].(x86asm.Reg), binary.LittleEndian.Uint64(b[:]))
		st.Data = data
		r.RIP += uint64(a.Inst.Len)
	default:
		data, err := a.source(r)
		if err != nil {
			return Store{}, err
		}
		st.Data = data
		r.RIP += uint64(a.Inst.Len)
	}
	return st, nil
}

// copyElements is what MOVS leaves at [dst, dst+n): its elements are
// copied one at a time, in the direction flag's order, so where source and
// destination overlap a later element reads what an earlier one stored
// (as the CPU does); the result is exactly the bytes stored, once.
func (a *Access) copyElements(r *Regs, src, dst, n uint64, read func(addr uint64, b []byte) error) ([]byte, error) {
	if !overlaps(src, dst, n) || n <= uint64(a.width) {
		data := make([]byte, n)
		if err := read(src, data); err != nil {
			return nil, fmt.Errorf("reading the source of %v: %w", a.Inst, err)
		}
		return data, nil
	}
	lo, hi := min(src, dst), max(src, dst)+n
	buf := make([]byte, hi-lo)
	if err := read(lo, buf); err != nil {
		return nil, fmt.Errorf("reading the source of %v: %w", a.Inst, err)
	}
	w := uint64(a.width)
	s, d := buf[src-lo:], buf[dst-lo:]
	count := n / w
	for k := uint64(0); k < count; k++ {
		i := k
		if r.RFlags&flagDF != 0 {
			i = count - 1 - k
		}
		copy(d[i*w:(i+1)*w], s[i*w:(i+1)*w])
	}
	return d[:n:n], nil
}

func isStos(op x86asm.Op) bool {
	return op == x86asm.STOSB || op == x86asm.STOSW || op == x86asm.STOSD || op == x86asm.STOSQ
}

func overlaps(a, b, n uint64) bool { return a < b+n && b < a+n }

func (a *Access) advanceString(r *Regs, n uint64, movs bool) {
	step := n
	if r.RFlags&flagDF != 0 {
		step = -n
	}
	r.GPR[rdi] += step
	if movs {
		r.GPR[rsi] += step
	}
	if a.rep {
		r.GPR[rcx] = 0
	}
	r.RIP += uint64(a.Inst.Len)
}
