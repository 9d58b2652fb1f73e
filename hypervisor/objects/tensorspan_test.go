package objects

import (
	"errors"
	"math"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestTensorSpan: how far a tensor map's tensor reaches, and the maps
// refused before any backend sees them (ranks, types, empty dimensions,
// spans past 2^64, whatever the guest's values).
func TestTensorSpan(t *testing.T) {
	ok := []struct {
		r    abi.TensorMapEncode
		want uint64
	}{
		{abi.TensorMapEncode{DataType: 7, Rank: 1, Dims: [5]uint64{100}}, 400},
		{abi.TensorMapEncode{DataType: 9, Rank: 2, Dims: [5]uint64{128, 64}, Strides: [4]uint64{256}}, 256 + 63*256},
		{abi.TensorMapEncode{DataType: 0, Rank: 3, Dims: [5]uint64{16, 4, 2}, Strides: [4]uint64{16, 64}}, 16 + 3*16 + 64},
	}
	for _, c := range ok {
		if got, err := tensorSpan(&c.r); err != nil || got != c.want {
			t.Errorf("%+v: span %d, %v; want %d", c.r, got, err, c.want)
		}
	}
	refused := map[string]abi.TensorMapEncode{
		"rank 0":              {DataType: 7},
		"rank 6":              {DataType: 7, Rank: 6},
		"type 13":             {DataType: 13, Rank: 1, Dims: [5]uint64{1}},
		"empty dimension":     {DataType: 7, Rank: 2, Dims: [5]uint64{4, 0}, Strides: [4]uint64{16}},
		"first dimension":     {DataType: 8, Rank: 1, Dims: [5]uint64{math.MaxUint64 / 4}},
		"stride product":      {DataType: 0, Rank: 2, Dims: [5]uint64{1, 1 << 40}, Strides: [4]uint64{1 << 30}},
		"sum past 2^64":       {DataType: 0, Rank: 3, Dims: [5]uint64{1, 2, 2}, Strides: [4]uint64{math.MaxUint64 - 1, math.MaxUint64 - 1}},
		"sum past 2^64 first": {DataType: 0, Rank: 2, Dims: [5]uint64{math.MaxUint64, 2}, Strides: [4]uint64{2}},
	}
	for name, r := range refused {
		if got, err := tensorSpan(&r); err == nil {
			t.Errorf("%s: span %d, want a refusal", name, got)
		} else if !errors.Is(err, abi.StatusInvalidValue) && !errors.Is(err, abi.StatusNotSupported) {
			t.Errorf("%s: %v, want invalid value or not supported", name, err)
		}
	}
}
