package cuapi

import "github.com/vgpuha/vgpuha/pvdriver/abi"

// TensorMapEncodeTiled is cuTensorMapEncodeTiled: the node's GPU driver
// encodes the map (its format is the driver's own), after checking that
// the tensor lies in the session's memory; the map names device addresses,
// which a standby shares, so it stays good across a failover. A tensor in
// pinned host memory (unified addressing lets a program name one: XLA's
// autotuner does) is its mirror's (mapped.go). A node without tensor maps
// (the software GPU) answers CUDA_ERROR_NOT_SUPPORTED.
func (d *Driver) TensorMapEncodeTiled(t Thread, r *abi.TensorMapEncode) ([abi.TensorMapBytes]byte, Result) {
	r.Global = d.deviceAddress(t, r.Global)
	d.mu.Lock()
	defer d.mu.Unlock()
	var none [abi.TensorMapBytes]byte
	if res := d.ready(); res != Success {
		return none, res
	}
	if r.Rank == 0 || r.Rank > abi.MaxTensorRank {
		return none, ErrorInvalidValue
	}
	m, err := d.client.EncodeTensorMapTiled(r)
	if err != nil {
		return none, resultOf("cuTensorMapEncodeTiled", err, false)
	}
	return m, Success
}
