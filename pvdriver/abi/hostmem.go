package abi

import "encoding/binary"

// Host-memory copies. A guest on the shared-memory transport may hand the
// node a host-memory region with its connection (package shm): memory the
// guest's page-locked allocations (cuMemAllocHost) come from, which the
// node maps and page-locks with the GPU. A copy whose host side lies there
// names only where (HostCopy: an offset and a length into the region);
// the node runs the device copy straight from or into the region.
//
// Rules both sides keep:
//   - a HostCopy is always a synchronous call (never FlagAsync): its reply
//     is a commit point, so a guest may reuse the region's bytes once it
//     has the reply to a null-stream copy, or once it has synchronised the
//     copy's stream, and no resend after a failover can read bytes the
//     guest has rewritten since;
//   - a node whose connection maps no region (plain unix, tcp or vsock, or
//     a region it refused) answers StatusNotSupported, and the guest sends
//     the same copy inline (CopyHtoD, CopyDtoH) instead: what happens after
//     a failover onto a node on another host;
//   - a copy moves at most the node's frame limit (MaxPayload less a
//     copy's header), as an inline copy does, so a replicated one becomes
//     one log record (an OpCopyHtoD record with the data).

// HostCopy copies Size bytes between the connection's host-memory region at
// Offset and device address Dev, on Stream (zero: the null stream).
// OpCopyHtoDHost reads the region, OpCopyDtoHHost writes it.
type HostCopy struct {
	Dev    uint64
	Offset uint64
	Size   uint64
	Stream uint64
}

func (m *HostCopy) Append(b []byte) []byte {
	return appendU64(appendU64(appendU64(appendU64(b, m.Dev), m.Offset), m.Size), m.Stream)
}

func (m *HostCopy) decode(d *Decoder) {
	m.Dev = d.U64()
	m.Offset = d.U64()
	m.Size = d.U64()
	m.Stream = d.U64()
}

func (m *HostCopy) OnStream() uint64 { return m.Stream }

// CopyPrefixSize is the size of a CopyHtoD body before its data.
const CopyPrefixSize = copyPrefix

// AppendCopyHtoDPrefix appends the fields of a CopyHtoD body that come
// before its n bytes of data (destination, stream, the data's length): with
// the data appended, the body decodes as CopyHtoD{Dst: dst, Stream: stream}.
func AppendCopyHtoDPrefix(b []byte, dst, stream uint64, n uint32) []byte {
	return binary.LittleEndian.AppendUint32(appendU64(appendU64(b, dst), stream), n)
}
