package receiver

import (
	"hash/crc32"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// As package replicate's tests and sizes have them.

var testKey = []byte("0123456789abcdef0123456789abcdef")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordHeader is an encoded record's size without its body.
const recordHeader = 8*5 + 2 + 2 + 4

// resyncChunk is the contents a resync record carries.
const resyncChunk = 4<<20 - recordHeader - link.MacSize - 64

// discardReplica applies nothing and ignores what the link tells it; a
// test's replica embeds it for the Replica methods it does not watch.
type discardReplica struct{}

func (discardReplica) Apply(*replicate.Record) error { return nil }
func (discardReplica) Checksums() []verify.ObjectSum { return nil }
func (discardReplica) Heard(uint64)                  {}
func (discardReplica) HandOver() (uint64, bool)      { return 0, false }
func (discardReplica) Synced(bool)                   {}
