package abi

import (
	"bytes"
	"testing"
)

// TestDataReplyFrameHead: a data reply's head followed by its data is the
// frame AppendReplyFrame makes of it, byte for byte, in this ABI version
// and the one before.
func TestDataReplyFrameHead(t *testing.T) {
	for _, v := range []uint16{Version, Version - 1} {
		for _, n := range []int{0, 1, 4096, 3 << 20} {
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(i * 7)
			}
			want := AppendReplyFrame(nil, v, OpCopyDtoH, 42, StatusOK, "", &DataReply{Data: data})
			got := append(AppendDataReplyFrameHead([]byte("x"), v, OpCopyDtoH, 42, data)[1:], data...)
			if !bytes.Equal(got, want) {
				t.Fatalf("version %d, %d bytes: the head and data differ from the whole frame", v, n)
			}
		}
	}
}
