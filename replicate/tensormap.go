package replicate

import (
	"fmt"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// AppendTensorMap encodes an OpTensorMap body: the request, then the map
// the guest was given.
func AppendTensorMap(b []byte, r *abi.TensorMapEncode, mp [abi.TensorMapBytes]byte) []byte {
	return append(r.Append(b), mp[:]...)
}

// DecodeTensorMap decodes an OpTensorMap body.
func DecodeTensorMap(body []byte) (*abi.TensorMapEncode, [abi.TensorMapBytes]byte, error) {
	var mp [abi.TensorMapBytes]byte
	if len(body) < abi.TensorMapBytes {
		return nil, mp, fmt.Errorf("tensor_map record of %d bytes: shorter than a map", len(body))
	}
	cut := len(body) - abi.TensorMapBytes
	req, err := abi.DecodeRequest(abi.OpTensorMapEncode, body[:cut])
	if err != nil {
		return nil, mp, fmt.Errorf("tensor_map record: %w", err)
	}
	copy(mp[:], body[cut:])
	return req.(*abi.TensorMapEncode), mp, nil
}
