package worker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The protocol between the node (parent) and its worker (child), over
// their socketpair. A request is
//
//	u32 length (of what follows) | u8 op | u8 flags | body
//
// and, unless flags has flagAsync, the child answers it before it reads
// the next one with
//
//	u32 length | u32 abi.Status | u16 message length | message | body
//
// Bodies reuse pvdriver/abi's encodings where one exists (a launch, a
// memset, a module image, a tensor map, a function's parameters, the
// device's description), so a value has one encoding. Bytes a copy moves
// travel inline below inlineMax and through the shared memory otherwise
// (flagShm), one piece of at most the shared memory's size at a time.
type op uint8

const (
	opInvalid op = iota // zero is no operation
	opDescribe
	opNewContext
	opAlloc
	opFree
	opCopyHtoD
	opCopyDtoH
	opCopyDtoD
	opMemset
	opLoadModule
	opUnloadModule
	opFunction
	opLaunch
	opCreateStream
	opDestroyStream
	opSyncStream
	opSync
	opClose
	opPipeline
	opParamSlots
	opFunctionAttrs
	opGlobal
	opWriteGlobal
	opReadGlobal
	opTensorMap
	opChecksum
	opOccupancy
	opCount // one past the last
)

// Request flags.
const (
	// flagAsync: the child sends no reply; a failure is kept and reported
	// by the context's next Sync or SyncStream (a pipelined launch).
	flagAsync uint8 = 1 << iota
	// flagShm: the request's bytes lie at the start of the shared memory,
	// or its reply's go there.
	flagShm
)

// Bounds on what either side reads.
const (
	// maxRequest bounds a request frame: a module image (up to
	// abi.MaxImage, an uploaded one) with room to spare.
	maxRequest = abi.MaxImage + 1<<20
	// maxReply bounds a reply frame: inline bytes, a message, a device
	// description.
	maxReply = 2 << 20
	// inlineMax is the largest copy whose bytes travel in the frame by
	// default; a larger one goes through the shared memory (BenchmarkHop's
	// worker-inline rows measure the other choice). The parent decides
	// (flagShm); the child takes either.
	inlineMax = 16 << 10
	// maxInline bounds the bytes a reply carries inline.
	maxInline = maxReply - 64<<10
	// maxMessage bounds an error message in a reply (abi.AppendReply's).
	maxMessage = 1024
)

// childError is an error the child's backend returned: the status the
// guest sees and the backend's words.
type childError struct {
	status abi.Status
	msg    string
}

func (e *childError) Error() string { return e.msg }
func (e *childError) Unwrap() error { return e.status }

// errProtocol marks a frame that breaks the protocol: the peer is not the
// program it should be, and the worker is ended.
var errProtocol = errors.New("gpu worker protocol")

// appendFrame starts a frame in b: its length is filled in by sealFrame.
func appendFrame(b []byte) []byte { return append(b[:0], 0, 0, 0, 0) }

// sealFrame writes the frame's length into its first four bytes.
func sealFrame(b []byte) []byte {
	binary.LittleEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// readFrame reads one frame's payload (after its length) into buf, grown
// as needed, refusing one longer than limit.
func readFrame(r *bufio.Reader, buf []byte, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int64(binary.LittleEndian.Uint32(hdr[:]))
	if n > int64(limit) {
		return nil, fmt.Errorf("%w: a %d-byte frame, limit %d", errProtocol, n, limit)
	}
	if int64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// appendReply encodes a reply's status and message after the frame's
// length; the body follows.
func appendReply(b []byte, err error, status abi.Status) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(status))
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// splitReply decodes a reply payload's status and message: a failure is
// a childError; otherwise the body follows in d.
func splitReply(payload []byte) (*abi.Decoder, error) {
	d := abi.NewDecoder(payload)
	st := abi.Status(d.U32())
	msg := d.String(maxMessage)
	switch {
	case st == abi.StatusOK:
		return d, nil // a short reply fails the body's finish
	case st.String() == fmt.Sprintf("status %d", uint32(st)):
		return nil, fmt.Errorf("%w: a reply of unknown status %d", errProtocol, uint32(st))
	case msg == "":
		msg = st.String()
	}
	return nil, &childError{status: st, msg: msg}
}

// finish checks that d was read whole and well.
func finish(d *abi.Decoder) error {
	if err := d.Finish(); err != nil {
		return fmt.Errorf("%w: %w", errProtocol, err)
	}
	return nil
}

func appendU64s(b []byte, vs ...uint64) []byte {
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(b, uint32(len(v))), v...)
}

func appendString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint16(b, uint16(len(s))), s...)
}
