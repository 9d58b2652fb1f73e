package abi

import "testing"

// TestOpTableRows checks each row of the opcode table against the rules
// that tie its columns together.
func TestOpTableRows(t *testing.T) {
	names := map[string]Opcode{}
	for _, op := range Opcodes() {
		info := op.Info()
		if info.Name == "" || info.NewRequest == nil {
			t.Fatalf("%d: row without a name or a request constructor", uint16(op))
		}
		if other, dup := names[info.Name]; dup {
			t.Errorf("%s: name used by %d too", op, uint16(other))
		}
		names[info.Name] = op
		_, resultReply := newReplyOf(info).(ResultReply)
		if hasResult := info.Result != NoResult; hasResult != resultReply {
			t.Errorf("%s: result %d, but reply body %T carries a result: %v", op, info.Result, newReplyOf(info), resultReply)
		}
		if info.Result != NoResult && (!info.Mutates || !info.Commits) {
			t.Errorf("%s: a result the standby must reproduce needs a mutating, committing op", op)
		}
		if info.Async && info.NewReply != nil {
			t.Errorf("%s: pipelined, yet it has a reply body", op)
		}
		if _, onStream := info.NewRequest().(StreamRequest); info.Async && !info.Control && !onStream {
			t.Errorf("%s: pipelined, but its request names no stream to report its error on", op)
		}
		if info.RunsKernel && !info.Mutates {
			t.Errorf("%s: runs a kernel but is not replicated", op)
		}
		if info.Control && info.Mutates {
			t.Errorf("%s: a control op changes no device state", op)
		}
	}
	for _, op := range []Opcode{OpInvalid, opLimit, 999} {
		if info := op.Info(); info.NewRequest != nil || info.Mutates || info.Commits || NewRequest(op) != nil {
			t.Errorf("%s: undefined opcode has a row %+v", op, info)
		}
	}
}

func newReplyOf(info OpInfo) Body {
	if info.NewReply == nil {
		return nil
	}
	return info.NewReply()
}

func TestReplayReplyCarriesResult(t *testing.T) {
	for _, op := range Opcodes() {
		info := op.Info()
		reply := info.ReplayReply(0x7e0000200000)
		switch {
		case info.Result == NoResult && reply != nil:
			t.Errorf("%s: replay of a status-only reply gave %T", op, reply)
		case info.Result != NoResult && ResultOf(reply) != 0x7e0000200000:
			t.Errorf("%s: replayed reply %#v lost its result", op, reply)
		}
	}
}

func TestStreamOf(t *testing.T) {
	for op, req := range sampleRequests() {
		_, queued := req.(StreamRequest)
		if got := StreamOf(req); queued && got == 0 || !queued && got != 0 {
			t.Errorf("%s: StreamOf(%#v) = %d", op, req, got)
		}
	}
}
