package receiver

import (
	"hash/crc32"

	"github.com/vgpuha/vgpuha/replicate/link"
)

// As package replicate's tests and sizes have them.

var testKey = []byte("0123456789abcdef0123456789abcdef")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordHeader is an encoded record's size without its body.
const recordHeader = 8*5 + 2 + 2 + 4

// resyncChunk is the contents a resync record carries.
const resyncChunk = 4<<20 - recordHeader - link.MacSize - 64
