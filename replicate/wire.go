package replicate

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"time"
)

// Link security: a pre-shared key, HMAC-SHA256 for the handshake, AES-256-GCM
// for the frames.
//
// Both ends prove they hold the key by MACing the other's fresh nonce. Each
// direction then gets its own AES-256-GCM key derived from the key and both
// nonces, and every frame is sealed with a nonce that is the frame counter:
// frames cannot be read, forged, replayed, reordered or spliced in from
// another connection. Large frames (a resync's and live records, and the
// parts of a record over partBytes) are sealed and opened on several
// workers (bulk.go): each takes its counter where it enters the stream
// (the sender when it queues it, the standby when it reads it), so no
// counter is used twice, frames are written in counter order, and each
// is handled in the order read, after every frame before it opened; one
// that fails ends the link and nothing after it is handled. A record in
// parts is handled only once all of them opened. Several TCP
// connections would need counters and ordering across them for the same
// guarantees, and more state to resume after a cut. A CRC32C over the frame header and the tag tells a
// torn or misaligned stream from a forged frame in the logs; it does not
// cover the payload (protocol 2 did): the tag already does, and a second
// pass over every bulk byte cost as much as the encryption. AES-GCM rather
// than HMAC-SHA256 per frame: measured on this project's 2-core machines,
// HMAC-SHA256 over bulk copies took a third of all CPU time in a replicated copy; AES-GCM (AES-NI and
// carry-less multiply) is several times cheaper and also keeps device memory
// contents off the wire in clear. A pre-shared key rather than mutual TLS:
// one secret file on two hosts instead of a CA.

var (
	// ErrAuth: the peer does not hold the replication key.
	ErrAuth = errors.New("replicate: peer failed authentication")
	// ErrCorrupt: a frame failed its checksum or MAC.
	ErrCorrupt = errors.New("replicate: corrupt or forged frame")
)

const (
	helloMagic    = "VGRA"
	frameMagic    = 0x50524756 // "VGRP"
	protoVersion  = 5          // 2: acks carry the received and the applied sequence; 3: the CRC covers header and tag; 4: records over partBytes go in parts; 5: the primary's identity first, refusals (package admission)
	nonceSize     = 32
	macSize       = 16
	frameHeader   = 16
	maxFrameBytes = 32 << 20
	// partBytes bounds a record frame's payload: a larger record goes as
	// a msgRecordBegin frame and then its encoding cut into parts of
	// partBytes (the last one shorter), each a frame of its own, so that
	// one record is sealed and opened on several workers.
	partBytes = 1 << 20
	// maxRecordBytes bounds a record sent in parts (a guest's record is
	// bounded by the node's MaxPayload, 16 MiB by default); the standby
	// receives it into a buffer of that size, lent until it is applied
	// (below maxLentBytes: the parts after it must still be lent).
	maxRecordBytes = 128 << 20
)

// Message types on an established link.
const (
	msgRecord      uint16 = 1 + iota // primary -> standby: one Record
	msgState                         // standby -> primary after auth: applied seq
	msgAck                           // standby -> primary: received seq, applied seq
	msgVerifyReply                   // standby -> primary: checksums
	msgMode                          // primary -> standby after state: the mode and the primary's term
	msgHeartbeat                     // primary -> standby when idle: its term
	msgFenced                        // standby -> primary: a promoted standby's term; stop serving
	msgPromote                       // primary -> standby: planned switchover, take over now
	msgRecordBegin                   // primary -> standby: a record of more than partBytes follows in parts; its size
	msgRecordPart                    // primary -> standby: the next partBytes (or the last) of that record's encoding
	msgIdentity                      // primary -> standby, first after auth: group, id, term, log position (package admission)
	msgRefused                       // standby -> primary instead of state: why it may not stream, whom the standby follows
)

var msgNames = map[uint16]string{msgRecord: "record", msgState: "state", msgAck: "ack", msgVerifyReply: "verify_reply",
	msgMode: "mode", msgHeartbeat: "heartbeat", msgFenced: "fenced", msgPromote: "promote",
	msgRecordBegin: "record_begin", msgRecordPart: "record_part", msgIdentity: "identity", msgRefused: "refused"}

// Direction says which way a message travels.
type Direction int

// Directions.
const (
	FromPrimary Direction = 1 + iota
	FromStandby
)

// Message names one message a link is about to send, for a FaultHook.
type Message struct {
	From Direction
	Type string // record (once per record, even one sent in parts), identity, state, refused, ack, verify_reply, mode, heartbeat, fenced, promote
	// Peer is the other end: the standby's address as configured (from
	// a primary), the primary's remote address (from a standby).
	Peer string
}

// FaultHook sees every message a link is about to send: it may block to
// delay the message and returns false to drop it. Tests inject partitions,
// loss and delay with it at the message level (as hashicorp/raft's fuzzy
// transport does) instead of sleeping; production leaves it nil.
type FaultHook func(Message) bool

// MinKeyBytes is the shortest pre-shared key accepted.
const MinKeyBytes = 16

func mac(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// link is an authenticated, framed connection.
type link struct {
	c     net.Conn
	r     *bufio.Reader
	w     *bufio.Writer
	sendK cipher.AEAD
	recvK cipher.AEAD
	sendN uint64
	recvN uint64
	rbuf  []byte
	// plain and sealed are the writer's reused buffers: a record encoded
	// for sending, and a small frame sealed by a bulkWriter's writeCopy.
	plain  []byte
	sealed []byte
	// lender, when set, holds receive buffers lent out by readSealed (on
	// a GPU standby page-locked, so replicated data is copied to the
	// device at full speed).
	lender *lender
	// parts, when set, holds the buffers record parts are read into
	// (each opened straight into its record's buffer, then given back).
	parts chan []byte
	// wmu serialises writers once more than one goroutine writes (see
	// locked); faults and out are the fault hook and this end's direction.
	wmu    sync.Mutex
	faults FaultHook
	out    Direction
	peer   string // for faults
}

func helloBytes(nonce []byte) []byte {
	b := append([]byte(helloMagic), byte(protoVersion), byte(protoVersion>>8))
	return append(b, nonce...)
}

func readHello(r io.Reader) ([]byte, error) {
	b := make([]byte, len(helloMagic)+2+nonceSize)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("reading peer hello: %w", err)
	}
	if string(b[:4]) != helloMagic {
		return nil, fmt.Errorf("%w: not a vgpuha replication peer", ErrAuth)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != protoVersion {
		return nil, fmt.Errorf("replicate: peer speaks protocol %d, this side %d", v, protoVersion)
	}
	return b[6:], nil
}

func newNonce() []byte {
	n := make([]byte, nonceSize)
	rand.Read(n)
	return n
}

// clientHandshake authenticates the primary's end (the dialer).
func clientHandshake(c net.Conn, key []byte, timeout time.Duration) (*link, error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	br := bufio.NewReaderSize(c, readBuffer)
	nonceS, err := readHello(br)
	if err != nil {
		return nil, err
	}
	nonceP := newNonce()
	msg := append(helloBytes(nonceP), mac(key, []byte("vgpuha primary"), nonceS, nonceP)...)
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(br, proof); err != nil {
		return nil, fmt.Errorf("%w: standby closed the link during authentication (wrong key?): %v", ErrAuth, err)
	}
	if !hmac.Equal(proof, mac(key, []byte("vgpuha standby"), nonceP, nonceS)) {
		return nil, fmt.Errorf("%w: standby's proof does not match our key", ErrAuth)
	}
	return newLink(c, br, mac(key, []byte("p2s"), nonceS, nonceP), mac(key, []byte("s2p"), nonceS, nonceP)), nil
}

// serverHandshake authenticates the standby's end (the listener).
func serverHandshake(c net.Conn, key []byte, timeout time.Duration) (*link, error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	br := bufio.NewReaderSize(c, readBuffer)
	nonceS := newNonce()
	if _, err := c.Write(helloBytes(nonceS)); err != nil {
		return nil, err
	}
	nonceP, err := readHello(br)
	if err != nil {
		return nil, err
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(br, proof); err != nil {
		return nil, fmt.Errorf("reading primary's proof: %w", err)
	}
	if !hmac.Equal(proof, mac(key, []byte("vgpuha primary"), nonceS, nonceP)) {
		return nil, fmt.Errorf("%w: primary's proof does not match our key", ErrAuth)
	}
	if _, err := c.Write(mac(key, []byte("vgpuha standby"), nonceP, nonceS)); err != nil {
		return nil, err
	}
	return newLink(c, br, mac(key, []byte("s2p"), nonceS, nonceP), mac(key, []byte("p2s"), nonceS, nonceP)), nil
}

func newLink(c net.Conn, br *bufio.Reader, sendKey, recvKey []byte) *link {
	return &link{c: c, r: br, w: bufio.NewWriterSize(c, 256<<10), sendK: gcm(sendKey), recvK: gcm(recvKey)}
}

// gcm returns AES-256-GCM under a 32-byte derived key.
func gcm(key []byte) cipher.AEAD {
	b, err := aes.NewCipher(key[:32])
	if err != nil {
		panic(err) // unreachable: the key is a SHA-256 output
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		panic(err)
	}
	return a
}

func nonce(n uint64) []byte {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[4:], n)
	return b[:]
}

// write queues one frame, sealing payload in place (the caller gives up
// payload, which needs macSize bytes of capacity past its length). flush
// sends what is queued. Only one goroutine writes.
func (l *link) write(typ uint16, payload []byte) error {
	return l.seal(typ, payload[:0], payload)
}

// seal encrypts payload into dst (which may be payload[:0]) and queues the
// frame.
func (l *link) seal(typ uint16, dst, payload []byte) error {
	if l.faults != nil && !l.faults(Message{From: l.out, Type: msgNames[typ], Peer: l.peer}) {
		return nil
	}
	h := l.frameHeader(typ, len(payload))
	sealed := l.sealAt(&h, l.takeSendN(), dst, payload)
	if _, err := l.w.Write(h[:]); err != nil {
		return err
	}
	_, err := l.w.Write(sealed)
	return err
}

// frameHeader starts a frame's header (its checksum comes with the seal).
func (l *link) frameHeader(typ uint16, n int) [frameHeader]byte {
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[0:], frameMagic)
	binary.LittleEndian.PutUint16(h[4:], typ)
	binary.LittleEndian.PutUint32(h[8:], uint32(n))
	return h
}

// takeSendN takes the next frame counter: the nonce of the frame sealed
// with it. Frames go on the wire in the order of their counters.
func (l *link) takeSendN() uint64 {
	n := l.sendN
	l.sendN++
	return n
}

// sealAt seals payload into dst under counter n and completes h's
// checksum. It touches nothing else of the link's: frames with counters
// already taken are sealed on several goroutines at once.
func (l *link) sealAt(h *[frameHeader]byte, n uint64, dst, payload []byte) []byte {
	sealed := l.sendK.Seal(dst, nonce(n), payload, h[:12])
	binary.LittleEndian.PutUint32(h[12:], frameCRC(h[:], sealed))
	return sealed
}

func (l *link) flush() error { return l.w.Flush() }

// locked runs fn (which writes and flushes) as the link's only writer.
func (l *link) locked(fn func() error) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return fn()
}

// writeFlush sends one message at once, as the link's only writer.
func (l *link) writeFlush(typ uint16, payload []byte) error {
	return l.locked(func() error {
		if err := l.write(typ, payload); err != nil {
			return err
		}
		return l.flush()
	})
}

// read returns the next frame. The payload is valid until the next read.
// Only one goroutine reads.
func (l *link) read() (uint16, []byte, error) {
	f, err := l.readSealed(0)
	if err != nil {
		return 0, nil, err
	}
	if err := l.open(&f); err != nil {
		return 0, nil, err
	}
	return f.typ(), f.payload, nil
}

// sealedFrame is a frame read off the link: its header, its counter (its
// nonce), the buffer its sealed bytes lie in and, once opened, its
// payload (in the same buffer).
type sealedFrame struct {
	h       [frameHeader]byte
	n       uint64
	buf     []byte
	sealed  []byte
	payload []byte
	// lent: buf was lent from l.lender and the frame holds it (whoever
	// ends up with it gives it back); part: buf came from l.parts; owned:
	// buf is the frame's own copy; otherwise it is the link's own, reused
	// by the next read.
	lent, part, owned bool
	// bodyCRC is the CRC-32C of an opened record's body, when hasCRC
	// (sumRecordBody).
	bodyCRC uint32
	hasCRC  bool
}

// sumRecordBody takes the CRC-32C of the opened record's body when the
// record carries a guest request (Record.BodyCRC): a worker does it while
// the applier applies the records before.
func (f *sealedFrame) sumRecordBody() {
	if rec, err := DecodeRecord(f.payload); err == nil && rec.ReqID != 0 {
		f.bodyCRC, f.hasCRC = crc32.Checksum(rec.Body, castagnoli), true
	}
}

func (f *sealedFrame) typ() uint16 { return binary.LittleEndian.Uint16(f.h[4:]) }

// readSealed reads the next frame, checks its header and checksum and
// takes its counter, without opening it. A frame of at least lendFrom
// payload bytes (0: none) is read into a buffer lent from l.lender, so
// that it can be opened and handled while later frames are read; waiting,
// when too much is lent, for buffers to come back. A record part is read
// into a buffer from l.parts (when set), waiting for one. Only one
// goroutine reads.
func (l *link) readSealed(lendFrom int) (sealedFrame, error) {
	var f sealedFrame
	h := f.h[:]
	if _, err := io.ReadFull(l.r, h); err != nil {
		return f, err
	}
	if binary.LittleEndian.Uint32(h) != frameMagic || binary.LittleEndian.Uint16(h[6:]) != 0 {
		return f, fmt.Errorf("%w: bad frame header", ErrCorrupt)
	}
	n := int(binary.LittleEndian.Uint32(h[8:]))
	if n > maxFrameBytes || n > partBytes && (f.typ() == msgRecord || f.typ() == msgRecordPart) {
		return f, fmt.Errorf("%w: %d-byte %s frame", ErrCorrupt, n, msgNames[f.typ()])
	}
	f.part = l.parts != nil && f.typ() == msgRecordPart
	f.lent = !f.part && l.lender != nil && lendFrom > 0 && n >= lendFrom
	switch {
	case f.part:
		f.buf = <-l.parts
		if cap(f.buf) < n+macSize {
			f.buf = make([]byte, partBytes+macSize)
		}
	case f.lent:
		f.buf = l.lend(n + macSize)
	default:
		if cap(l.rbuf) < n+macSize {
			l.rbuf = make([]byte, n+macSize)
		}
		f.buf = l.rbuf
	}
	f.sealed = f.buf[:n+macSize]
	if _, err := io.ReadFull(l.r, f.sealed); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		l.giveBack(&f)
		return f, err
	}
	if frameCRC(h, f.sealed) != binary.LittleEndian.Uint32(h[12:]) {
		l.giveBack(&f)
		return f, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	f.n = l.recvN
	l.recvN++
	return f, nil
}

// lend returns a receive buffer of at least n bytes, counted as lent.
func (l *link) lend(n int) []byte { return l.lender.borrow(n) }

// giveBack returns a frame's lent or part buffer, if it still holds one.
func (l *link) giveBack(f *sealedFrame) {
	switch {
	case f.buf == nil:
	case f.lent:
		l.lender.give(f.buf)
	case f.part:
		l.parts <- f.buf
	default:
		return
	}
	f.buf = nil
}

// open authenticates and decrypts a frame in place. It touches nothing
// else of the link's: frames read in order are opened on several
// goroutines at once, each under the counter it was read with.
func (l *link) open(f *sealedFrame) error {
	payload, err := l.recvK.Open(f.sealed[:0], nonce(f.n), f.sealed, f.h[:12])
	if err != nil {
		return fmt.Errorf("%w: authentication tag mismatch", ErrCorrupt)
	}
	f.payload = payload
	return nil
}

// openInto authenticates and decrypts a frame into dst, which has room
// for its payload (a record part into its place in the record's buffer:
// no copy). Like open, it touches nothing else of the link's.
func (l *link) openInto(f *sealedFrame, dst []byte) error {
	if cap(dst) < len(f.sealed)-macSize {
		return fmt.Errorf("%w: no room for a %d-byte payload", ErrCorrupt, len(f.sealed)-macSize)
	}
	if _, err := l.recvK.Open(dst[:0], nonce(f.n), f.sealed, f.h[:12]); err != nil {
		return fmt.Errorf("%w: authentication tag mismatch", ErrCorrupt)
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readBuffer is a link's read-ahead. A large payload is read straight into
// its own buffer past what is read ahead, so a small read-ahead copies
// little of it (256 KiB copied a quarter of every 1 MiB resync record);
// small records still arrive many to a read.
const readBuffer = 32 << 10

// frameCRC is a frame's checksum: its header's first 12 bytes and the tag
// that ends sealed.
func frameCRC(h, sealed []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, h[:12]), castagnoli, sealed[len(sealed)-macSize:])
}
