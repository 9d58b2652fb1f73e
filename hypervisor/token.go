package hypervisor

import (
	"crypto/rand"
	"crypto/subtle"
	"unicode"
	"unicode/utf8"

	"github.com/vgpuha/vgpuha/hypervisor/replica"
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

// sessionOpen is what the record that opens a session carries (package
// replica, which decodes it on a standby).
type sessionOpen = replica.SessionOpen

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
