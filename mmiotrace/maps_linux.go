package mmiotrace

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The guest's mappings, asked by address: PROCMAP_QUERY answers per
// mapping; kernels without it are answered from the maps text.

// PROCMAP_QUERY_VMA_* flags (linux/fs.h), also what the text answer gives.
const (
	vmaReadable   = 1 << 0
	vmaWritable   = 1 << 1
	vmaExecutable = 1 << 2
)

// vma is one guest mapping: its bounds, vma* flags and file (inode; 0 for
// anonymous memory).
type vma struct{ start, end, flags, ino uint64 }

// vmaAt returns the guest mapping that contains addr or, if none does, the
// next one above it; ok is false when there is none.
func vmaAt(maps *os.File, addr uint64) (v vma, ok bool, err error) {
	v, e := queryVMA(maps.Fd(), addr)
	switch e {
	case 0:
		return v, true, nil
	case unix.ENOENT:
		return vma{}, false, nil
	case unix.ENOTTY, unix.EINVAL:
		return vmaFromText(maps, addr)
	}
	return vma{}, false, fmt.Errorf("querying the guest's mappings at %#x: %w", addr, e)
}

func vmaFromText(maps *os.File, addr uint64) (v vma, ok bool, err error) {
	if _, err := maps.Seek(0, 0); err != nil {
		return vma{}, false, err
	}
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 5 || len(f[1]) < 3 {
			continue
		}
		v = vma{}
		if _, err := fmt.Sscanf(f[0], "%x-%x", &v.start, &v.end); err != nil || v.end <= addr {
			continue
		}
		for i, bit := range []uint64{vmaReadable, vmaWritable, vmaExecutable} {
			if f[1][i] != '-' {
				v.flags |= bit
			}
		}
		v.ino, _ = strconv.ParseUint(f[4], 10, 64)
		return v, true, nil
	}
	return vma{}, false, sc.Err()
}

// vmaRanges calls fn for each part of [lo, hi) that the guest maps with a
// mapping for which match is true.
func vmaRanges(maps *os.File, lo, hi uint64, match func(vma) bool, fn func(lo, hi uint64)) error {
	for at := lo; at < hi; {
		v, ok, err := vmaAt(maps, at)
		if err != nil || !ok || v.start >= hi {
			return err
		}
		if match(v) {
			fn(max(v.start, lo), min(v.end, hi))
		}
		at = v.end
	}
	return nil
}

// writable: stores to the mapping do not fault. The tracer protects what
// it traces, so a writable part it did not open is one the guest opened
// itself (its own mprotect).
func writable(v vma) bool { return v.flags&vmaWritable != 0 }

// tracerProtected: the mapping has the tracer's protection (protTraced),
// not one the guest chose.
func tracerProtected(v vma) bool {
	return v.flags&(vmaReadable|vmaWritable|vmaExecutable) == vmaReadable|vmaExecutable
}

// mapped reports whether v maps r's file. Where the guest unmapped the
// aperture and mapped something else at its address, the tracer must
// never change that memory's protection, nor take its faults.
func (r *Region) mapped(v vma) bool { return r.ino == 0 || v.ino == r.ino }

// mappedAnd is match restricted to the mappings of r's file.
func (r *Region) mappedAnd(match func(vma) bool) func(vma) bool {
	return func(v vma) bool { return r.mapped(v) && match(v) }
}
