package objects

import (
	"math/bits"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Tensor maps (cuTensorMapEncodeTiled): 128 opaque bytes the GPU driver
// encodes from a tensor's address, dimensions and strides, which a kernel
// takes as an argument and Hopper's tensor-memory accelerator follows. The
// tensor must lie in the session's allocations (at the same address on
// every node) or inside a module variable the guest holds: XLA encodes
// maps over its constants, which are module variables, and each node's
// copy of a variable lies elsewhere (globalmap.go), so a map encoded on
// the primary names the primary's copy.
//
// So the node that answers the guest keeps every map it encoded over a
// module variable, and the primary logs it once (replicate.OpTensorMap:
// the request and the map's bytes). A standby encodes the same tensor over
// its own copy and keeps the primary's bytes with its own; in every launch
// an argument of exactly 128 bytes equal to a map the guest holds from
// another node is replaced by this node's map. A promoted node goes on
// doing so, and encodes the guest's new maps over its own copies; a resync
// logs every kept map again. Not covered: a map the guest copies into
// device memory (the format is the driver's, so it cannot be found there).

// maxTensorMaps bounds the maps over module variables a session keeps (a
// map is kept until the session ends): a guest that encodes more is
// refused, never forgotten.
const maxTensorMaps = 4096

// tensorElementBytes is the size of an element of each tensor-map data
// type (CUtensorMapDataType, UINT8 to TFLOAT32_FTZ); the packed sub-byte
// types after them are not served.
var tensorElementBytes = [...]uint64{1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4}

// tensorMap is a map over a module variable the guest holds.
type tensorMap struct {
	req    abi.TensorMapEncode // as the guest asked, its address the guest's
	own    [abi.TensorMapBytes]byte
	logged bool // the primary logged it (TensorMapRecord)
}

// tensorMaps are a session's maps over module variables, by the bytes the
// guest holds.
type tensorMaps struct {
	byGuest map[[abi.TensorMapBytes]byte]*tensorMap
	foreign int // maps whose bytes here differ from the guest's
}

// keep records that the guest holds map guest, encoded for r, which is
// own on this node.
func (t *tensorMaps) keep(guest [abi.TensorMapBytes]byte, r *abi.TensorMapEncode, own [abi.TensorMapBytes]byte) error {
	m := t.byGuest[guest]
	if m == nil {
		if len(t.byGuest) >= maxTensorMaps {
			return guesterr.Fail(abi.StatusOutOfMemory, "the session already holds %d tensor maps over module variables, the most a node keeps", maxTensorMaps)
		}
		if t.byGuest == nil {
			t.byGuest = map[[abi.TensorMapBytes]byte]*tensorMap{}
		}
		m = &tensorMap{req: *r, own: guest}
		t.byGuest[guest] = m
	}
	if m.own != guest {
		t.foreign--
	}
	m.own = own
	if own != guest {
		t.foreign++
	}
	return nil
}

// local is this node's map for argument a, if a is a map the guest holds
// from another node.
func (t *tensorMaps) local(a abi.Arg) ([]byte, bool) {
	if t.foreign == 0 || a.Kind != abi.ArgBytes || len(a.Raw) != abi.TensorMapBytes {
		return nil, false
	}
	m := t.byGuest[[abi.TensorMapBytes]byte(a.Raw)]
	if m == nil || m.own == [abi.TensorMapBytes]byte(a.Raw) {
		return nil, false
	}
	return append([]byte(nil), m.own[:]...), true
}

// localArgs is a launch's arguments as this node runs them: every address
// inside a module variable the guest holds at another node's address made
// this node's (globalmap.go), and each tensor map the guest holds from
// another node replaced, whole, by this node's (its words are this node's
// addresses already, which another node's variables may overlap). It is
// args itself when nothing changes.
func (o *Set) localArgs(args []abi.Arg) []abi.Arg {
	out := o.globals.args(args)
	if o.tensorMaps.foreign == 0 {
		return out
	}
	for i, a := range args {
		own, ok := o.tensorMaps.local(a)
		if !ok {
			continue
		}
		if &out[0] == &args[0] {
			out = append([]abi.Arg(nil), args...)
		}
		out[i].Raw = own
	}
	return out
}

// TensorMapEncode has the GPU driver encode a tiled tensor map over
// memory the session holds, and keeps a map over a module variable.
func (o *Set) TensorMapEncode(r *abi.TensorMapEncode) (abi.Body, error) {
	mp, overGlobal, err := o.encodeTensorMap(r)
	if err != nil {
		return nil, err
	}
	if overGlobal {
		if err := o.tensorMaps.keep(mp, r, mp); err != nil {
			return nil, err
		}
	}
	return &abi.TensorMapReply{Map: mp}, nil
}

// NoteTensorMap records that the guest holds map guest, which another
// node encoded for r over a module variable (a replicated
// replicate.OpTensorMap): this node encodes the same tensor over its own
// copy.
func (o *Set) NoteTensorMap(r *abi.TensorMapEncode, guest [abi.TensorMapBytes]byte) error {
	own, overGlobal, err := o.encodeTensorMap(r)
	if err != nil {
		return err
	}
	if !overGlobal {
		return guesterr.Fail(abi.StatusInvalidValue, "a logged tensor map at %#x lies in no module variable the guest holds", r.Global)
	}
	return o.tensorMaps.keep(guest, r, own)
}

// TensorMapRecord returns the request a map the guest was just given was
// encoded for, if it is a map over a module variable not logged yet: the
// primary logs it, once.
func (o *Set) TensorMapRecord(mp [abi.TensorMapBytes]byte) (*abi.TensorMapEncode, bool) {
	m := o.tensorMaps.byGuest[mp]
	if m == nil || m.logged {
		return nil, false
	}
	m.logged = true
	return &m.req, true
}

// TensorMapRecords calls emit with every map over a module variable the
// guest holds, as it holds it: what a resync's snapshot logs after the
// module variables' addresses, so a new standby maps them too.
func (o *Set) TensorMapRecords(emit func(r *abi.TensorMapEncode, guest [abi.TensorMapBytes]byte)) {
	for guest, m := range o.tensorMaps.byGuest {
		emit(&m.req, guest)
	}
}

// encodeTensorMap encodes r over this node's memory: the tensor's every
// byte, as its dimensions and strides place it, must lie in one of the
// session's allocations or inside a module variable the guest holds
// (overGlobal); either address is made this node's.
func (o *Set) encodeTensorMap(r *abi.TensorMapEncode) (mp [abi.TensorMapBytes]byte, overGlobal bool, err error) {
	span, err := tensorSpan(r)
	if err != nil {
		return mp, false, err
	}
	local := *r
	if ref, ok := o.globals.holding(r.Global, span); ok && !o.mem.Contains(r.Global, span) {
		local.Global, overGlobal = ref.own+(r.Global-ref.guest), true
	} else if err := o.mem.CheckRange(r.Global, span, "tensor map"); err != nil {
		return mp, false, err
	} else {
		local.Global += o.mem.Delta()
	}
	enc, ok := o.ctx.(gpu.TensorMapEncoder)
	if !ok {
		return mp, false, guesterr.Fail(abi.StatusNotSupported, "this node's GPU encodes no tensor maps (the software GPU has no tensor-memory accelerator)")
	}
	mp, err = enc.EncodeTensorMapTiled(&local)
	return mp, overGlobal, err
}

// tensorSpan is how many bytes from its base a tensor map's tensor
// reaches: a dense first dimension, then each further dimension's last
// entry a stride per step away. Every product and sum is checked.
func tensorSpan(r *abi.TensorMapEncode) (uint64, error) {
	if r.Rank == 0 || r.Rank > abi.MaxTensorRank {
		return 0, guesterr.Fail(abi.StatusInvalidValue, "tensor map of rank %d (1 to %d)", r.Rank, abi.MaxTensorRank)
	}
	if r.DataType >= uint32(len(tensorElementBytes)) {
		return 0, guesterr.Fail(abi.StatusNotSupported, "tensor map data type %d is not served", r.DataType)
	}
	for i := range r.Rank {
		if r.Dims[i] == 0 {
			return 0, guesterr.Fail(abi.StatusInvalidValue, "tensor map dimension %d is empty", i)
		}
	}
	hi, span := bits.Mul64(r.Dims[0], tensorElementBytes[r.DataType])
	for i := uint32(1); i < r.Rank && hi == 0; i++ {
		var reach, carry uint64
		hi, reach = bits.Mul64(r.Dims[i]-1, r.Strides[i-1])
		span, carry = bits.Add64(span, reach, 0)
		hi += carry
	}
	if hi != 0 {
		return 0, guesterr.Fail(abi.StatusInvalidValue, "tensor map reaches past 2^64 bytes")
	}
	return span, nil
}
