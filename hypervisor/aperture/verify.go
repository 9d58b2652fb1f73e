package aperture

import (
	"cmp"
	"slices"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// verify --apertures: each aperture's file (what the guest wrote is the
// truth the device copies must hold) is compared byte by byte with the
// primary's device copy (Set.Verify) and, carried in OpVerifyMMIO records,
// with the standby's (Comparisons).

// Verify is verify --apertures on the primary: each aperture's file
// compared byte by byte with this node's device copy (ObjAperture sums of
// session), and the OpVerifyMMIO records of verification id that carry
// the file to the standby, which compares it with its own copy.
func (a *Set) Verify(session, id uint64) (sums []verify.ObjectSum, recs []replicate.Record) {
	ptrs := make([]uint64, 0, len(a.apertures))
	for ptr := range a.apertures {
		ptrs = append(ptrs, ptr)
	}
	slices.Sort(ptrs)
	const chunk = replicate.MaxMMIOBody - 20 // header and one write's
	for _, ptr := range ptrs {
		file := a.apertures[ptr].region.Mem
		d := diff{first: verify.NoMismatch}
		dev := make([]byte, min(len(file), chunk))
		for off := 0; off < len(file); off += chunk {
			part := file[off:min(off+chunk, len(file))]
			d.add(compareDevice(a.dev, ptr, uint64(off), part, dev[:len(part)]))
			body := replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, ptr), uint64(off), part)
			recs = append(recs, replicate.Record{Session: session, Op: replicate.OpVerifyMMIO, Result: id, Body: body})
		}
		sums = append(sums, verify.ApertureSum(session, ptr, d.mismatched, d.first))
	}
	return sums, recs
}

// Sum is what verify reports for the allocation at addr when it is one of
// the apertures: the checksum of the guest's file, inverted where this
// node's own device copy differs from it, so that a write the tracer lost
// shows as a mismatch whether it is missing on the primary, the standby
// or both. ok is false for other allocations. The caller flushed first; a
// guest still writing its aperture meanwhile may show as a mismatch too
// (verify again).
func (a *Set) Sum(addr uint64) (sum uint64, ok bool) {
	ap := a.apertures[addr]
	if ap == nil {
		return 0, false
	}
	file := gpu.Checksum(ap.region.Mem)
	if dev, err := a.dev.Checksum(addr, uint64(len(ap.region.Mem))); err != nil || dev != file {
		return ^file, true
	}
	return file, true
}

// diff counts one aperture's mismatched bytes and the first of them.
type diff struct{ mismatched, first uint64 }

func (d *diff) add(mismatched, first uint64) {
	d.mismatched += mismatched
	d.first = min(d.first, first)
}

// compareDevice compares want, an aperture's bytes at offset off, with
// the device copy there (read into buf, as long as want) and returns the
// mismatched bytes and the first mismatched offset in the aperture
// (verify.NoMismatch when none). An unreadable copy mismatches whole.
func compareDevice(dev Device, ptr, off uint64, want, buf []byte) (mismatched, first uint64) {
	if err := dev.Read(buf, ptr+off); err != nil {
		return uint64(len(want)), off
	}
	if mismatched, first = verify.DiffBytes(want, buf); first != verify.NoMismatch {
		first += off
	}
	return mismatched, first
}

// Comparisons is a standby session's aperture comparisons for the
// verification in progress (verify --apertures), by device address,
// answered at its OpVerify (Sums).
type Comparisons struct {
	id     uint64
	checks map[uint64]*diff
}

// Compare is a standby's part of verify --apertures: an OpVerifyMMIO
// record's bytes (the primary's aperture file) compared with this node's
// device copy, kept for the verification's answer. A write outside the
// session's allocations fails the record, as in Apply.
func (c *Comparisons) Compare(dev Device, id uint64, body []byte) error {
	if err := Check(dev, body); err != nil {
		return err
	}
	if c.checks == nil || c.id != id {
		c.id, c.checks = id, map[uint64]*diff{}
	}
	return replicate.DecodeMMIO(body, func(ptr, off uint64, data []byte) error {
		d := c.checks[ptr]
		if d == nil {
			d = &diff{first: verify.NoMismatch}
			c.checks[ptr] = d
		}
		d.add(compareDevice(dev, ptr, off, data, make([]byte, len(data))))
		return nil
	})
}

// Sums hands over the comparisons for the verification answered now
// (ObjAperture sums of session), in address order, and forgets them.
func (c *Comparisons) Sums(session uint64) []verify.ObjectSum {
	checks := c.checks
	c.checks = nil
	var sums []verify.ObjectSum
	for ptr, d := range checks {
		sums = append(sums, verify.ApertureSum(session, ptr, d.mismatched, d.first))
	}
	slices.SortFunc(sums, func(a, b verify.ObjectSum) int { return cmp.Compare(a.ID, b.ID) })
	return sums
}
