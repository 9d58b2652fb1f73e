package replicate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Record is one state change in the primary's order of execution. Guest
// operations carry the request body exactly as the guest encoded it (package
// abi decodes it on the standby, which validates it again); session
// lifecycle, epochs, resync and verification use the control kinds below.
type Record struct {
	Seq     uint64 // log position, from 1, without gaps
	Term    uint64 // the primary's term when it executed the op
	Session uint64
	ReqID   uint64 // the guest's request id (exactly-once on resume)
	Op      Op
	Flags   uint16
	// Result is what the primary's execution produced and the standby must
	// reproduce: the device address of an alloc, the guest handle of a new
	// module, function or stream, a session's window slot.
	Result uint64
	Body   []byte
	// bodyCRC is Body's CRC-32C when hasCRC: a standby's receiver takes it
	// on the worker that opened the record, off the applier's path. Never
	// on the wire.
	bodyCRC uint32
	hasCRC  bool
}

// BodyCRC is the CRC-32C (Castagnoli) of r.Body, the sum the hypervisor
// keeps of each request for exactly-once (taken on arrival where it could
// be).
func (r *Record) BodyCRC() uint32 {
	if r.hasCRC {
		return r.bodyCRC
	}
	return crc32.Checksum(r.Body, castagnoli)
}

// SetBodyCRC records sum as Body's CRC-32C, taken by the caller (a
// standby's receiver takes it on the worker that opened the record, off
// the applier's path), so BodyCRC need not take it again. Never on the
// wire.
func (r *Record) SetBodyCRC(sum uint32) { r.bodyCRC, r.hasCRC = sum, true }

// HasBodyCRC reports whether Body's CRC was taken ahead (SetBodyCRC).
func (r *Record) HasBodyCRC() bool { return r.hasCRC }

// Op is a record kind: a guest opcode (abi.Opcode values) or a control kind.
type Op uint16

// Control kinds, numbered above every guest opcode.
const (
	// OpSessionOpen opens session Session in window slot Result; Body is
	// the guest name.
	OpSessionOpen Op = 0x100 + iota
	// OpSessionClose closes session Session and frees its objects.
	OpSessionClose
	// OpReset drops every replica session: the start of a resync.
	OpReset
	// OpEpoch commits the epoch Result (epoch mode).
	OpEpoch
	// OpVerify asks the standby for checksums at this log position; Result
	// is the verification id.
	OpVerify
	// OpSetNext forces session Session's next guest handle to Result (resync
	// of a table with gaps).
	OpSetNext
	// OpSnapshotEnd ends a resync snapshot; Result is the log position the
	// snapshot stands for, from which streaming continues.
	OpSnapshotEnd
	// OpMMIO carries guest writes to one aperture (mapped device memory),
	// flushed into the log before the guest call that followed them. Body
	// is built by AppendMMIO.
	OpMMIO
	// OpVerifyMMIO carries an aperture's current bytes (the guest's file)
	// for verify --apertures, in an OpMMIO body; Result is the
	// verification id. The standby compares them with its device copy
	// and answers at the OpVerify that follows (ObjAperture).
	OpVerifyMMIO
	// OpImage carries a module image (an OpModuleLoad body) that later
	// OpModuleLoadCached records name by hash: the standby keeps it until
	// the next OpReset.
	OpImage
	// OpRequestFailed: guest request ReqID of session Session failed on
	// the primary (refused by a check, or a kernel that faulted, whose
	// own record comes first with FlagFailed). Nothing is run: the
	// standby notes the request as answered but not applied, so that a
	// resend gets the same failure and a guest's resume counts it as
	// answered, and keeps an asynchronous request's failure for its
	// stream's next synchronization. Body: the hypervisor's encoding of
	// the failure.
	OpRequestFailed
	// OpErrorsReported: a synchronization of session Session reported the
	// failures kept for stream Result (the guest was told): the standby
	// forgets them too.
	OpErrorsReported
	// OpGlobalAddr: the guest of session Session was told that a module
	// variable (Body: an abi.ModuleGlobal request, its module handle and
	// name) lies at Result. Each node's GPU driver places module variables
	// where it likes, so the standby maps that address to its own copy's
	// wherever a kernel argument holds it (hypervisor/objects/globalmap.go).
	OpGlobalAddr
	// OpTensorMap: the guest of session Session was given a tensor map
	// over a module variable. Body (AppendTensorMap): the abi.TensorMapEncode
	// request, then the map's bytes. The standby encodes the same tensor
	// over its own copy of the variable and uses that map wherever a kernel
	// argument is the guest's (hypervisor/objects/tensormaps.go).
	OpTensorMap
	// OpReadCheck: the guest of session Session read bytes from device
	// memory, too many to log them again: Body (AppendReadCheck) names the
	// range and the checksum of what the guest got. The standby compares
	// its own bytes there and asks for them (link.MsgReadNeed, naming the
	// record's Seq) where they differ; the primary's reply waits until
	// the standby applied the check, and logs the bytes as a read-back if
	// asked (readcheck.go).
	OpReadCheck
)

// lastControl is the last control kind.
const lastControl = OpReadCheck

// Record flags.
const (
	// FlagFailed: the backend ran the op on the primary and reported an
	// error (a kernel fault): the standby must see the same failure.
	FlagFailed uint16 = 1 << iota
	// FlagPlaced: a resync record whose address or handle is given, not
	// chosen by the standby's allocator.
	FlagPlaced
	// FlagRepair: a copy of the primary's contents sent by verify --repair.
	FlagRepair
	// FlagReadBack: bytes a guest read from the primary's device, written
	// on the standby so that it holds what the guest saw even where a
	// kernel is not reproducible (floating-point atomics).
	FlagReadBack
	// FlagPieces: the last piece of a guest write the primary logged as
	// pieces (for fairness between guests: replicate's fairness.go). The
	// pieces before it came without a request id, each a write of its
	// part; this one carries the request's id, and Result holds the
	// CRC-32C of the whole request's body (its exactly-once sum), not an
	// op result.
	FlagPieces
)

// Guest returns the record's guest opcode, or false for a control kind.
func (o Op) Guest() (abi.Opcode, bool) {
	if o < 0x100 && abi.Opcode(o).Valid() {
		return abi.Opcode(o), true
	}
	return 0, false
}

// SessionScoped reports whether a record of kind o reads and changes its
// own session (Record.Session) and nothing else: a guest request, or a
// control record about one session's objects. A standby may apply it
// beside other sessions' records (package receiver's lanes), in log order
// with its own session's. Opening or closing a session, a reset, an image
// and a verify are not: they are applied with nothing else under way.
func (o Op) SessionScoped() bool {
	if _, ok := o.Guest(); ok {
		return true
	}
	switch o {
	case OpMMIO, OpVerifyMMIO, OpRequestFailed, OpErrorsReported, OpGlobalAddr, OpTensorMap, OpSetNext, OpReadCheck:
		return true
	}
	return false
}

func (o Op) String() string {
	if g, ok := o.Guest(); ok {
		return g.String()
	}
	switch o {
	case OpSessionOpen:
		return "session_open"
	case OpSessionClose:
		return "session_close"
	case OpReset:
		return "reset"
	case OpEpoch:
		return "epoch"
	case OpVerify:
		return "verify"
	case OpSetNext:
		return "set_next"
	case OpSnapshotEnd:
		return "snapshot_end"
	case OpMMIO:
		return "mmio"
	case OpVerifyMMIO:
		return "verify_mmio"
	case OpImage:
		return "image"
	case OpRequestFailed:
		return "request_failed"
	case OpErrorsReported:
		return "errors_reported"
	case OpGlobalAddr:
		return "global_addr"
	case OpTensorMap:
		return "tensor_map"
	case OpReadCheck:
		return "read_check"
	}
	return fmt.Sprintf("op(%#x)", uint16(o))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const recordHeader = 8*5 + 2 + 2 + 4

// Size is the record's encoded size.
func (r *Record) Size() int { return recordHeader + len(r.Body) }

// AppendRecord encodes r.
func AppendRecord(b []byte, r *Record) []byte {
	b = binary.LittleEndian.AppendUint64(b, r.Seq)
	b = binary.LittleEndian.AppendUint64(b, r.Term)
	b = binary.LittleEndian.AppendUint64(b, r.Session)
	b = binary.LittleEndian.AppendUint64(b, r.ReqID)
	b = binary.LittleEndian.AppendUint64(b, r.Result)
	b = binary.LittleEndian.AppendUint16(b, uint16(r.Op))
	b = binary.LittleEndian.AppendUint16(b, r.Flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Body)))
	return append(b, r.Body...)
}

// encodeAt encodes r into buf (from its start, growing it if needed).
// When r's body already lies at buf[recordHeader:] (it was built there in
// place), only the header is written: the body is not copied.
func encodeAt(buf []byte, r *Record) []byte {
	n := r.Size()
	if len(r.Body) == 0 || n > cap(buf) || &buf[:n][recordHeader] != &r.Body[0] {
		return AppendRecord(buf[:0], r)
	}
	buf = buf[:n]
	head := *r
	head.Body = nil
	AppendRecord(buf[:0], &head)
	binary.LittleEndian.PutUint32(buf[recordHeader-4:], uint32(len(r.Body)))
	return buf
}

// ErrBadRecord is wrapped by record decoding errors.
var ErrBadRecord = errors.New("replicate: malformed record")

// DecodeRecord decodes one record. Body aliases b.
func DecodeRecord(b []byte) (Record, error) {
	if len(b) < recordHeader {
		return Record{}, fmt.Errorf("%w: %d bytes", ErrBadRecord, len(b))
	}
	le := binary.LittleEndian
	r := Record{
		Seq: le.Uint64(b), Term: le.Uint64(b[8:]), Session: le.Uint64(b[16:]),
		ReqID: le.Uint64(b[24:]), Result: le.Uint64(b[32:]),
		Op: Op(le.Uint16(b[40:])), Flags: le.Uint16(b[42:]),
	}
	n := le.Uint32(b[44:])
	if uint64(n) != uint64(len(b)-recordHeader) {
		return Record{}, fmt.Errorf("%w: body length %d, frame holds %d", ErrBadRecord, n, len(b)-recordHeader)
	}
	if _, guest := r.Op.Guest(); !guest && (r.Op < OpSessionOpen || r.Op > lastControl) {
		return Record{}, fmt.Errorf("%w: unknown kind %#x", ErrBadRecord, uint16(r.Op))
	}
	if r.Flags&^(FlagFailed|FlagPlaced|FlagRepair|FlagReadBack|FlagPieces) != 0 {
		return Record{}, fmt.Errorf("%w: unknown flags %#x", ErrBadRecord, r.Flags)
	}
	r.Body = b[recordHeader:]
	return r, nil
}
