package x86store

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"golang.org/x/arch/x86/x86asm"
)

// TestDecodeGolden is the decoder's golden table: instruction bytes and
// register values in, the decoded store out (how it is handled, where it
// lands, the exact bytes for emulated stores, and the registers it
// changes). Regenerate with -rewrite after a deliberate change, and read
// the diff.
func TestDecodeGolden(t *testing.T) {
	datadriven.RunTest(t, "testdata/decode", func(t *testing.T, td *datadriven.TestData) string {
		code, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(td.Input), " ", ""))
		if err != nil {
			t.Fatalf("bad bytes %q: %v", td.Input, err)
		}
		var r Regs
		for _, arg := range td.CmdArgs {
			setTestReg(t, &r, arg.Key, arg.Vals[0])
		}
		a, err := Decode(code)
		if errors.Is(err, ErrNotStore) {
			return "not a store: single-step and compare the page\n"
		} else if err != nil {
			return "error: " + err.Error() + "\n"
		}
		addr, n := a.Target(&r)
		var b strings.Builder
		fmt.Fprintf(&b, "%s\n", x86asm.IntelSyntax(a.Inst, 0, nil))
		if !a.Bounded() {
			fmt.Fprintf(&b, "step, then compare the pages it touched\n")
			return b.String()
		}
		if !a.Emulated() {
			fmt.Fprintf(&b, "step, then record %d bytes at %#x\n", n, addr)
			return b.String()
		}
		before := r
		st, err := a.Emulate(&r, patternRead)
		if err != nil {
			fmt.Fprintf(&b, "emulate refused: %v\n", err)
			return b.String()
		}
		fmt.Fprintf(&b, "emulate: %d bytes at %#x: % x\n", len(st.Data), st.Addr, st.Data)
		fmt.Fprintf(&b, "%s\n", regChanges(&before, &r))
		return b.String()
	})
}

// patternRead is the memory the golden table sees: each byte is the low
// byte of its address.
func patternRead(addr uint64, b []byte) error {
	for i := range b {
		b[i] = byte(addr + uint64(i))
	}
	return nil
}

var gprNames = [16]string{"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}

func setTestReg(t *testing.T, r *Regs, name, val string) {
	t.Helper()
	if strings.HasPrefix(name, "v") { // v0=hex bytes of ymm0
		i, _ := strconv.Atoi(name[1:])
		b, err := hex.DecodeString(val)
		if err != nil {
			t.Fatal(err)
		}
		copy(r.Vec[i][:], b)
		return
	}
	v, err := strconv.ParseUint(val, 0, 64)
	if err != nil {
		t.Fatalf("%s=%s: %v", name, val, err)
	}
	switch name {
	case "rip":
		r.RIP = v
	case "df":
		r.RFlags |= flagDF
	case "fs":
		r.FSBase = v
	default:
		for i, n := range gprNames {
			if n == name {
				r.GPR[i] = v
				return
			}
		}
		t.Fatalf("unknown register %s", name)
	}
}

func regChanges(a, b *Regs) string {
	var out []string
	if b.RIP != a.RIP {
		out = append(out, fmt.Sprintf("rip+=%d", b.RIP-a.RIP))
	}
	for i := range a.GPR {
		if a.GPR[i] != b.GPR[i] {
			out = append(out, fmt.Sprintf("%s=%#x", gprNames[i], b.GPR[i]))
		}
	}
	return strings.Join(out, " ")
}
