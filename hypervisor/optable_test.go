package hypervisor

import (
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestOpTableCoversABI: every opcode is either served from opTable or
// handled by the connection itself, and the async and mutating sets agree
// with what the guest driver pipelines.
func TestOpTableCoversABI(t *testing.T) {
	byConn := map[abi.Opcode]bool{abi.OpHello: true, abi.OpReject: true, abi.OpBye: true}
	for _, op := range abi.Opcodes() {
		_, inTable := opTable[op]
		if inTable == byConn[op] {
			t.Errorf("%s: in opTable %v, handled by the connection %v; want exactly one", op, inTable, byConn[op])
		}
	}
	for op, spec := range opTable {
		if spec.async && !op.Mutates() {
			t.Errorf("%s is async but changes nothing: nothing to pipeline", op)
		}
	}
}
