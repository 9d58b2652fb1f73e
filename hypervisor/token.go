package hypervisor

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Resume needs a secret. A session's id is small and sequential; what lets
// a guest take its session back after a dropped connection or a failover is
// the session's resume token: ResumeTokenSize random bytes (crypto/rand)
// handed to the guest in the reply to the hello that opened the session,
// compared in constant time, never shown in status or logs. The standby
// learns it from the record that opens the session (sessionOpen), so a
// resume works there after a failover.

// newToken returns a fresh resume token.
func newToken() []byte {
	t := make([]byte, abi.ResumeTokenSize)
	rand.Read(t) // never fails (crypto/rand)
	return t
}

// tokenMatches reports whether got is the session's resume token. A session
// without one (opened by an older primary) cannot be resumed.
func tokenMatches(want, got []byte) bool {
	return len(want) == abi.ResumeTokenSize && subtle.ConstantTimeCompare(want, got) == 1
}

// sessionOpen is what the record that opens a session carries: Body is the
// guest name, then a NUL, a format byte, the resume token and the tenant
// (u16 length, bytes) and, from format 2 on, the grace period the guest
// was granted (u32 milliseconds), so that a node that takes over keeps the
// session as long as its primary would have (lifetime.go). Guest names
// never hold a NUL (hello refuses control characters), so a body without
// one is the bare name an older primary sent.
type sessionOpen struct {
	guest  string
	token  []byte
	tenant string
	// grace is the session's grace period; graceKnown is false for a
	// record of an older primary, which did not say.
	grace      time.Duration
	graceKnown bool
}

// Session-open record formats: 1 without the grace period, 2 with it.
const (
	sessionOpenFormatV1 = 1
	sessionOpenFormat   = 2
)

func (o sessionOpen) append(b []byte) []byte {
	b = append(b, o.guest...)
	b = append(b, 0, sessionOpenFormat)
	b = append(b, o.token...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(o.tenant)))
	b = append(b, o.tenant...)
	return binary.LittleEndian.AppendUint32(b, uint32(min(o.grace.Milliseconds(), math.MaxUint32)))
}

var errSessionOpen = errors.New("malformed session-open record")

func decodeSessionOpen(body []byte) (sessionOpen, error) {
	name, rest, found := bytes.Cut(body, []byte{0})
	o := sessionOpen{guest: string(name)}
	if !found {
		return o, nil
	}
	if len(rest) < 1+abi.ResumeTokenSize+2 || rest[0] != sessionOpenFormatV1 && rest[0] != sessionOpenFormat {
		return o, fmt.Errorf("%w (%d bytes after the name)", errSessionOpen, len(rest))
	}
	o.graceKnown = rest[0] == sessionOpenFormat
	o.token = append([]byte(nil), rest[1:1+abi.ResumeTokenSize]...)
	rest = rest[1+abi.ResumeTokenSize:]
	n := int(binary.LittleEndian.Uint16(rest))
	graceBytes := 0
	if o.graceKnown {
		graceBytes = 4
	}
	if len(rest) != 2+n+graceBytes {
		return o, fmt.Errorf("%w (tenant of %d bytes in %d)", errSessionOpen, n, len(rest)-2-graceBytes)
	}
	o.tenant = string(rest[2 : 2+n])
	if o.graceKnown {
		o.grace = time.Duration(binary.LittleEndian.Uint32(rest[2+n:])) * time.Millisecond
	}
	return o, nil
}

// checkGuestName refuses names that are not printable UTF-8: they go to
// logs, status and the session-open record.
func checkGuestName(name string) error {
	if !utf8.ValidString(name) {
		return fail(abi.StatusInvalidValue, "guest name is not UTF-8")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fail(abi.StatusInvalidValue, "guest name holds the unprintable character %U", r)
		}
	}
	return nil
}
