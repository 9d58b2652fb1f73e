package abi

import (
	"bytes"
	"testing"
)

// TestCopyHtoDPrefix: the prefix and the data decode as the CopyHtoD they
// stand for, byte for byte its encoding.
func TestCopyHtoDPrefix(t *testing.T) {
	data := []byte("some bytes of a host-memory region")
	b := append(AppendCopyHtoDPrefix(nil, 0x7e0000001000, 3, uint32(len(data))), data...)
	want := &CopyHtoD{Dst: 0x7e0000001000, Stream: 3, Data: data}
	if !bytes.Equal(b, want.Append(nil)) {
		t.Fatalf("prefix and data %x, CopyHtoD encodes as %x", b, want.Append(nil))
	}
	if len(AppendCopyHtoDPrefix(nil, 1, 2, 3)) != CopyPrefixSize {
		t.Fatal("the prefix is not CopyPrefixSize bytes")
	}
}
