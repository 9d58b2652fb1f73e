package cuapi

import (
	"os"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// stack is a calling thread's context stack, as the C half keeps it.
type stack struct{ ctxs []uint64 }

func (s *stack) Top() uint64 {
	if len(s.ctxs) == 0 {
		return 0
	}
	return s.ctxs[len(s.ctxs)-1]
}
func (s *stack) SetTop(c uint64) {
	if len(s.ctxs) == 0 {
		s.ctxs = append(s.ctxs, c)
	} else {
		s.ctxs[len(s.ctxs)-1] = c
	}
}
func (s *stack) Push(c uint64) bool { s.ctxs = append(s.ctxs, c); return true }
func (s *stack) Pop() uint64 {
	c := s.Top()
	if len(s.ctxs) > 0 {
		s.ctxs = s.ctxs[:len(s.ctxs)-1]
	}
	return c
}

// TestLookupsAskOnce: looking a function up asks the node once, and its
// attributes only when first needed; most functions a library looks up are
// never launched, so a lookup is one round trip, not two.
func TestLookupsAskOnce(t *testing.T) {
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("VGPUHA_ENDPOINT", c.Endpoint)
	d, th := New(), &stack{}
	if r := d.Init(0); r != Success {
		t.Fatalf("Init: %d", r)
	}
	defer d.Shutdown()
	if _, r := d.CtxCreate(th, 0, 0, false); r != Success {
		t.Fatalf("CtxCreate: %d", r)
	}
	ptx, err := os.ReadFile("../../kernels/ptx/vadd.ptx")
	if err != nil {
		t.Fatal(err)
	}
	m, r := d.ModuleLoadData(th, append(ptx, 0))
	if r != Success {
		t.Fatalf("ModuleLoadData: %d", r)
	}
	var f uint64
	for range 5 {
		if f, r = d.ModuleGetFunction(m, "vadd"); r != Success {
			t.Fatalf("ModuleGetFunction: %d", r)
		}
	}
	if got := sent(d, abi.OpGetFunction, abi.OpFunctionParams); got != [2]uint64{1, 0} {
		t.Errorf("after 5 lookups: %d get_function, %d function_params sent; want 1, 0", got[0], got[1])
	}
	for range 3 {
		if _, r := d.FuncGetAttribute(0, f); r != Success {
			t.Fatalf("FuncGetAttribute: %d", r)
		}
	}
	if got := sent(d, abi.OpGetFunction, abi.OpFunctionParams); got != [2]uint64{1, 1} {
		t.Errorf("after 3 attribute reads: %d get_function, %d function_params sent; want 1, 1", got[0], got[1])
	}
}

// sent is how many requests of ops a and b d's client sent.
func sent(d *Driver, a, b abi.Opcode) (n [2]uint64) {
	for _, s := range d.client.Stats() {
		switch s.Op {
		case a:
			n[0] = s.Sent
		case b:
			n[1] = s.Sent
		}
	}
	return n
}
