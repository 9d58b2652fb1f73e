package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// SessionOpen is what the record that opens a session carries: Body is the
// guest name, then a NUL, a format byte, the resume token and the tenant
// (u16 length, bytes) and, from format 2 on, the grace period the guest
// was granted (u32 milliseconds), so that a node that takes over keeps the
// session as long as its primary would have (the hypervisor's lifetime.go),
// and, from format 3 on, the GPU its guest pinned (u8 length, bytes; a
// standby honours it where it serves that GPU, else places the replica by
// its own policy: package placement). Format 3 is written only for a
// pinned session, so an older standby reads every unpinned one. Guest names
// never hold a NUL (hello refuses control characters), so a body without
// one is the bare name an older primary sent.
type SessionOpen struct {
	Guest  string
	Token  []byte
	Tenant string
	// Grace is the session's grace period; GraceKnown is false for a
	// record of an older primary, which did not say.
	Grace      time.Duration
	GraceKnown bool
	// GPU is the pin the guest asked for (abi.Hello.GPU; empty: none).
	GPU string
	// Device is the index of the GPU the session was first placed on:
	// the GPU whose identity its guest is shown on every node
	// (hypervisor's identity.go), wherever a replica of it runs. A record
	// says it only where it is not 0, so that a session on GPU 0 stays
	// readable by an older standby; a record that does not say (an older
	// primary's too) names GPU 0.
	Device int
}

// Session-open record formats: 1 without the grace period, 2 with it, 3
// with it and a pin, 4 with it, a pin field (maybe empty) and the device.
const (
	sessionOpenFormatV1     = 1
	sessionOpenFormat       = 2
	sessionOpenFormatPinned = 3
	sessionOpenFormatDevice = 4
)

// Append encodes o as a record body into b.
func (o SessionOpen) Append(b []byte) []byte {
	format := byte(sessionOpenFormat)
	switch {
	case o.Device != 0:
		format = sessionOpenFormatDevice
	case o.GPU != "":
		format = sessionOpenFormatPinned
	}
	b = append(b, o.Guest...)
	b = append(b, 0, format)
	b = append(b, o.Token...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(o.Tenant)))
	b = append(b, o.Tenant...)
	b = binary.LittleEndian.AppendUint32(b, uint32(min(o.Grace.Milliseconds(), math.MaxUint32)))
	if format == sessionOpenFormat {
		return b
	}
	b = append(b, byte(len(o.GPU)))
	b = append(b, o.GPU...)
	if format == sessionOpenFormatPinned {
		return b
	}
	return binary.LittleEndian.AppendUint16(b, uint16(o.Device))
}

var errSessionOpen = errors.New("malformed session-open record")

// DecodeSessionOpen decodes an OpSessionOpen record's body.
func DecodeSessionOpen(body []byte) (SessionOpen, error) {
	name, rest, found := bytes.Cut(body, []byte{0})
	o := SessionOpen{Guest: string(name)}
	if !found {
		return o, nil
	}
	if len(rest) < 1+abi.ResumeTokenSize+2 || rest[0] < sessionOpenFormatV1 || rest[0] > sessionOpenFormatDevice {
		return o, fmt.Errorf("%w (%d bytes after the name)", errSessionOpen, len(rest))
	}
	format := rest[0]
	o.GraceKnown = format >= sessionOpenFormat
	o.Token = append([]byte(nil), rest[1:1+abi.ResumeTokenSize]...)
	rest = rest[1+abi.ResumeTokenSize:]
	n := int(binary.LittleEndian.Uint16(rest))
	graceBytes := 0
	if o.GraceKnown {
		graceBytes = 4
	}
	if len(rest) < 2+n+graceBytes || format < sessionOpenFormatPinned && len(rest) != 2+n+graceBytes {
		return o, fmt.Errorf("%w (tenant of %d bytes in %d)", errSessionOpen, n, len(rest)-2-graceBytes)
	}
	o.Tenant = string(rest[2 : 2+n])
	if o.GraceKnown {
		o.Grace = time.Duration(binary.LittleEndian.Uint32(rest[2+n:])) * time.Millisecond
	}
	if format < sessionOpenFormatPinned {
		return o, nil
	}
	pin := rest[2+n+graceBytes:]
	if format == sessionOpenFormatDevice {
		if len(pin) < 3 || int(pin[0]) != len(pin)-3 {
			return o, fmt.Errorf("%w (pin and device fields of %d bytes)", errSessionOpen, len(pin))
		}
		o.GPU = string(pin[1 : len(pin)-2])
		o.Device = int(binary.LittleEndian.Uint16(pin[len(pin)-2:]))
		return o, nil
	}
	if len(pin) < 2 || int(pin[0]) != len(pin)-1 {
		return o, fmt.Errorf("%w (a pin field of %d bytes)", errSessionOpen, len(pin))
	}
	o.GPU = string(pin[1:])
	return o, nil
}

// GraceOr is the grace period the record gave, or fallback when it did
// not say (an older primary's record).
func (o SessionOpen) GraceOr(fallback time.Duration) time.Duration {
	if o.GraceKnown {
		return o.Grace
	}
	return fallback
}
