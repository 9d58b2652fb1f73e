// Package abi owns the wire format spoken between the guest's paravirtual GPU
// driver (pvdriver) and the hypervisor backend: frame headers, status codes,
// the enums that travel in requests (aperture kinds and tracing modes), the
// encoding of every request and reply body, and the opcode table
// (optable.go): one row per opcode saying its bodies, whether the driver
// pipelines it, whether it changes device state (and so is replicated and
// applied exactly once), whether its reply is a commit point, and which
// reply field is its result. Every other package asks the table instead of
// listing opcodes.
//
// It is the only package that turns bytes from a guest into Go values, so it
// is the one place that must never trust its input: every decoder checks
// lengths before it reads, refuses trailing bytes, and returns an error rather
// than panicking. Fuzz targets live beside the decoders.
//
// A frame is a fixed 28-byte little-endian header followed by a payload:
//
//	offset size field
//	0      4    magic       "VGPU" (0x55504756 little-endian)
//	4      2    version     Version, or the one before it (see Supported)
//	6      2    opcode      0 is invalid on purpose: a zeroed buffer never parses
//	8      2    flags       FlagReply, FlagAsync
//	10     2    reserved    must be zero
//	12     8    request id  chosen by the guest, echoed in the reply
//	20     4    length      payload bytes, at most the receiver's limit
//	24     4    crc32c      Castagnoli CRC of bytes 0..23 and the payload
package abi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"sync"
)

const (
	// Magic opens every frame; it reads "VGPU" on the wire.
	Magic uint32 = 0x55504756
	// Version is the ABI version this build speaks. Version 2 added the
	// resume token (Hello.Token, HelloReply.Token). A node answers each
	// frame in the frame's own version, so a version-1 guest is still
	// served (it can open sessions, not resume them: it has no token).
	Version uint16 = 2
	// HeaderSize is the size of the fixed frame header.
	HeaderSize = 28
	// DefaultMaxPayload bounds a frame's payload unless a peer is configured
	// otherwise. Bulk copies larger than this are split by pvdriver.
	DefaultMaxPayload = 16 << 20
)

// Flags carried in a frame header.
const (
	// FlagReply marks a frame sent by the hypervisor in answer to a request.
	FlagReply uint16 = 1 << 0
	// FlagAsync marks a request the guest wants no reply for; an error it
	// causes is reported by the next synchronization, as CUDA does.
	FlagAsync uint16 = 1 << 1

	knownFlags = FlagReply | FlagAsync
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Supported reports whether a peer speaking version v is accepted: the
// current version and the one before it, never older, never newer.
func Supported(v uint16) bool {
	return v == Version || (Version > 1 && v == Version-1)
}

// Header is a decoded frame header.
type Header struct {
	Version   uint16
	Op        Opcode
	Flags     uint16
	RequestID uint64
	Length    uint32
}

// Frame is one decoded frame. Payload aliases the reader's buffer and is
// valid only until the next ReadFrame on that buffer.
type Frame struct {
	Header
	Payload []byte
	// InPlace, when set, is a copy's data left in the stream (inplace.go);
	// Payload then holds the copy's fixed fields only.
	InPlace *InPlace
	// PayloadSum is the CRC32C of Payload alone, where PayloadSummed says
	// the reader computed it on the way (a large frame's: crc.go).
	PayloadSum    uint32
	PayloadSummed bool
}

// Errors returned by ReadFrame. A frame error other than ErrTooLarge means
// the byte stream can no longer be trusted to be in step and the connection
// should be closed after replying.
var (
	ErrBadMagic    = errors.New("abi: bad frame magic")
	ErrChecksum    = errors.New("abi: frame checksum mismatch")
	ErrReserved    = errors.New("abi: reserved header bits set")
	ErrTruncated   = errors.New("abi: truncated body")
	ErrTrailing    = errors.New("abi: trailing bytes after body")
	ErrBadOpcode   = errors.New("abi: invalid opcode")
	ErrBadArgument = errors.New("abi: malformed argument")
)

// NotFrameError reports bytes that do not open a vgpuha frame: the peer
// speaks another protocol (an HTTP server answers "HTTP/1.1 ...", a
// replication port its own handshake), or the stream is out of step. It
// is ErrBadMagic under errors.Is, and says what arrived.
type NotFrameError struct{ Head []byte }

func (e *NotFrameError) Error() string {
	if bytes.HasPrefix(e.Head, []byte("HTTP/")) {
		line, _, _ := bytes.Cut(e.Head, []byte("\r"))
		return fmt.Sprintf("%v: the peer answered %q: an HTTP server, not a vgpuha endpoint", ErrBadMagic, line)
	}
	return fmt.Sprintf("%v: the peer sent %q, which opens no vgpuha frame (another protocol on this port?)", ErrBadMagic, e.Head[:min(len(e.Head), 12)])
}

func (e *NotFrameError) Is(target error) bool { return target == ErrBadMagic }

// VersionError reports a frame of an unsupported ABI version.
type VersionError struct{ Got uint16 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("abi: unsupported version %d (this side speaks %d)", e.Got, Version)
}

// TooLargeError reports a frame whose declared payload exceeds the limit.
// Header holds the parsed header so the receiver can address its reply.
type TooLargeError struct {
	Header Header
	Limit  int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("abi: frame payload of %d bytes exceeds limit of %d", e.Header.Length, e.Limit)
}

// AppendFrame appends a complete frame (header, payload, checksum) to dst.
func AppendFrame(dst []byte, op Opcode, flags uint16, requestID uint64, payload []byte) []byte {
	return AppendFrameVersion(dst, Version, op, flags, requestID, payload)
}

// AppendFrameVersion is AppendFrame in ABI version v (a reply to a peer
// speaking the previous version).
func AppendFrameVersion(dst []byte, v uint16, op Opcode, flags uint16, requestID uint64, payload []byte) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, Magic)
	dst = binary.LittleEndian.AppendUint16(dst, v)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(op))
	dst = binary.LittleEndian.AppendUint16(dst, flags)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, requestID)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	crc := crc32.Update(0, castagnoli, dst[start:start+24])
	crc = crc32.Update(crc, castagnoli, payload)
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	return append(dst, payload...)
}

// AppendBodyFrame appends a complete frame whose payload is body's
// encoding, encoding it in place (one copy of bulk data, not two).
func AppendBodyFrame(dst []byte, op Opcode, flags uint16, requestID uint64, body Body) []byte {
	start := len(dst)
	dst = AppendFrame(dst, op, flags, requestID, nil)
	dst = body.Append(dst)
	seal(dst[start:])
	return dst
}

// AppendReplyFrame appends a complete reply frame in ABI version v whose
// payload is AppendReply's encoding of st, msg and body, encoded in place.
func AppendReplyFrame(dst []byte, v uint16, op Opcode, requestID uint64, st Status, msg string, body Body) []byte {
	start := len(dst)
	dst = AppendFrameVersion(dst, v, op, FlagReply, requestID, nil)
	dst = AppendReply(dst, st.For(v), msg, body)
	seal(dst[start:])
	return dst
}

// AppendDataReplyFrameHead is AppendReplyFrame for a successful reply whose
// body is data (a DataReply) without data: the frame's head, whose length
// and checksum cover the data that is to be written right after it. A
// node sends a large read's bytes so, from where it read them, instead of
// copying them into the frame.
func AppendDataReplyFrameHead(dst []byte, v uint16, op Opcode, requestID uint64, data []byte) []byte {
	start := len(dst)
	dst = AppendFrameVersion(dst, v, op, FlagReply, requestID, nil)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(StatusOK.For(v)))
	dst = appendString(dst, "")
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(data)))
	h := dst[start:]
	binary.LittleEndian.PutUint32(h[20:], uint32(len(h)-HeaderSize+len(data)))
	crc := crc32.Update(0, castagnoli, h[:24])
	crc = crc32.Update(crc, castagnoli, h[HeaderSize:])
	crc = crc32.Update(crc, castagnoli, data)
	binary.LittleEndian.PutUint32(h[24:], crc)
	return dst
}

// seal fills in the length and checksum of frame h, whose payload was
// appended after a header made for an empty one.
func seal(h []byte) {
	binary.LittleEndian.PutUint32(h[20:], uint32(len(h)-HeaderSize))
	crc := crc32.Update(0, castagnoli, h[:24])
	crc = crc32.Update(crc, castagnoli, h[HeaderSize:])
	binary.LittleEndian.PutUint32(h[24:], crc)
}

// ParseHeader decodes and checks a frame header, without its checksum.
func ParseHeader(b []byte, maxPayload int) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, ErrTruncated
	}
	if binary.LittleEndian.Uint32(b[0:]) != Magic {
		return Header{}, &NotFrameError{Head: bytes.Clone(b[:HeaderSize])}
	}
	h := Header{
		Version:   binary.LittleEndian.Uint16(b[4:]),
		Op:        Opcode(binary.LittleEndian.Uint16(b[6:])),
		Flags:     binary.LittleEndian.Uint16(b[8:]),
		RequestID: binary.LittleEndian.Uint64(b[12:]),
		Length:    binary.LittleEndian.Uint32(b[20:]),
	}
	if !Supported(h.Version) {
		return h, &VersionError{Got: h.Version}
	}
	if binary.LittleEndian.Uint16(b[10:]) != 0 || h.Flags&^knownFlags != 0 {
		return h, ErrReserved
	}
	if !h.Op.Valid() {
		return h, fmt.Errorf("%w %d", ErrBadOpcode, uint16(h.Op))
	}
	if int64(h.Length) > int64(maxPayload) {
		return h, &TooLargeError{Header: h, Limit: maxPayload}
	}
	return h, nil
}

// FrameReader reads frames from a stream.
//
// A header only announces a payload; the reader commits memory as the
// payload's bytes arrive, not before. Frames up to smallFrame bytes go into
// a buffer the reader keeps. A larger one grows a pooled buffer fourfold
// each time the bytes already received fill it, so a peer that announces
// 16 MiB and sends nothing costs nothing more, and one that trickles holds
// at most four times what it sent. With a Budget set, every pooled buffer
// is taken from it first: a frame the budget cannot hold is skipped and
// refused (ErrBudget), and the stream stays in step.
type FrameReader struct {
	r          io.Reader
	buf        []byte // header and small payloads
	big        []byte // the pooled buffer holding the last large frame
	held       int    // budget held for big
	maxPayload int
	budget     Budget
	spans      SpanReader // set: large copies' data is left in place
	inPlace    *InPlace   // the last frame's in-place data
}

// Budget bounds the frame bytes that many readers buffer together.
type Budget interface {
	// Acquire takes n bytes, or reports false if they cannot be had.
	Acquire(n int) bool
	// Release gives back n bytes taken by Acquire.
	Release(n int)
}

// ErrBudget is returned by ReadFrame for a frame whose payload could not be
// buffered within the reader's Budget. The payload was read and dropped:
// the next frame can be read.
var ErrBudget = errors.New("abi: frame refused: request buffers are over budget")

// smallFrame is the largest frame read into the reader's own buffer.
const smallFrame = 64 << 10

// NewFrameReader returns a reader that refuses payloads over maxPayload.
func NewFrameReader(r io.Reader, maxPayload int) *FrameReader {
	return &FrameReader{r: r, buf: make([]byte, HeaderSize, HeaderSize+4096), maxPayload: maxPayload}
}

// SetMaxPayload changes the payload limit for the frames read next (a node
// allows a guest more once it has said hello).
func (fr *FrameReader) SetMaxPayload(n int) { fr.maxPayload = n }

// SetBudget makes the reader take its large buffers from b.
func (fr *FrameReader) SetBudget(b Budget) { fr.budget = b }

// Release gives back the buffer of the last frame read (ReadFrame does so
// itself before reading the next). Call it when done with the reader.
func (fr *FrameReader) Release() {
	if fr.big != nil {
		putBuf(fr.big)
		fr.big = nil
	}
	if fr.held != 0 {
		fr.budget.Release(fr.held)
		fr.held = 0
	}
}

// ReadFrame reads and checks the next frame. The returned payload is valid
// until the next call. io.EOF is returned only on a clean end between frames;
// a stream cut inside a frame gives io.ErrUnexpectedEOF.
func (fr *FrameReader) ReadFrame() (Frame, error) {
	fr.Release()
	if h, err := fr.settleInPlace(); err != nil {
		return Frame{Header: h}, err
	}
	hdr := fr.buf[:HeaderSize]
	if _, err := io.ReadFull(fr.r, hdr); err != nil {
		return Frame{}, err
	}
	h, err := ParseHeader(hdr, fr.maxPayload)
	if err != nil {
		return Frame{Header: h}, err
	}
	f, got, inPlace, err := fr.readInPlace(h)
	if err != nil || inPlace {
		return f, err
	}
	n := HeaderSize + int(h.Length)
	var buf []byte
	if n <= smallFrame {
		if cap(fr.buf) < n {
			fr.buf = append(fr.buf[:got], make([]byte, n-got)...)
		}
		buf = fr.buf[:n]
		_, err = io.ReadFull(fr.r, buf[got:])
	} else {
		buf, err = fr.readLarge(n, got)
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{Header: h}, err
	}
	f = Frame{Header: h, Payload: buf[HeaderSize:n]}
	if binary.LittleEndian.Uint32(buf[24:]) != f.check(buf[:24]) {
		return Frame{Header: h}, ErrChecksum
	}
	return f, nil
}

// check returns the checksum of a frame with header head and f's payload;
// a large payload is summed alone (f.PayloadSum, crc.go) and that sum
// combined with the header's.
func (f *Frame) check(head []byte) uint32 {
	if len(f.Payload) < smallFrame {
		return crc32.Update(crc32.Update(0, castagnoli, head), castagnoli, f.Payload)
	}
	f.PayloadSum, f.PayloadSummed = crc32.Update(0, castagnoli, f.Payload), true
	return combineCRC(crc32.Update(0, castagnoli, head), f.PayloadSum, uint64(len(f.Payload)))
}

// readLarge reads a frame of n bytes (its first got bytes already in
// fr.buf): up to smallFrame bytes into fr.buf, then into pooled buffers
// each four times what has arrived, until the frame is whole.
func (fr *FrameReader) readLarge(n, got int) ([]byte, error) {
	if cap(fr.buf) < smallFrame {
		fr.buf = append(fr.buf[:got], make([]byte, smallFrame-got)...)
	}
	buf := fr.buf[:smallFrame]
	for {
		k, err := io.ReadFull(fr.r, buf[got:min(n, len(buf))])
		got += k
		if err != nil {
			return nil, err
		}
		if got == n {
			return buf[:n], nil
		}
		nb, ok := fr.grow(min(n, 4*got), buf[:got])
		if !ok {
			if _, err := io.CopyN(io.Discard, fr.r, int64(n-got)); err != nil {
				return nil, err
			}
			return nil, ErrBudget
		}
		buf = nb
	}
}

// grow takes a pooled buffer of size bytes (within the budget), copies from
// into it and makes it the reader's large buffer, giving back the previous
// one.
func (fr *FrameReader) grow(size int, from []byte) ([]byte, bool) {
	c := classSize(size)
	if fr.budget != nil && !fr.budget.Acquire(c) {
		return nil, false
	}
	nb := getBuf(c)[:size]
	copy(nb, from)
	fr.Release() // from may be the previous large buffer: copied now
	fr.big = nb
	if fr.budget != nil {
		fr.held = c
	}
	return nb, true
}

// Large frame buffers are pooled by size class: sizes with four
// significant bits (under 1/8 wasted), one sync.Pool per class.
var bufPools sync.Map // class size -> *sync.Pool of *[]byte

func classSize(n int) int {
	shift := max(bits.Len(uint(n-1))-4, 0)
	return ((n-1)>>shift + 1) << shift
}

func getBuf(c int) []byte {
	if p, ok := bufPools.Load(c); ok {
		if b, ok := p.(*sync.Pool).Get().(*[]byte); ok {
			return *b
		}
	}
	return make([]byte, c)
}

func putBuf(b []byte) {
	c := cap(b)
	if c != classSize(c) {
		return
	}
	p, _ := bufPools.LoadOrStore(c, new(sync.Pool))
	b = b[:c]
	p.(*sync.Pool).Put(&b)
}
