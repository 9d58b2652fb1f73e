package mmiotrace

import (
	"bufio"
	"fmt"
	"os"
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

// vmaAt returns the guest mapping that contains addr or, if none does, the
// next one above it: its bounds and vma* flags; ok is false when there is
// none.
func vmaAt(maps *os.File, addr uint64) (start, end, flags uint64, ok bool, err error) {
	start, end, flags, e := queryVMA(maps.Fd(), addr)
	switch e {
	case 0:
		return start, end, flags, true, nil
	case unix.ENOENT:
		return 0, 0, 0, false, nil
	case unix.ENOTTY, unix.EINVAL:
		return vmaFromText(maps, addr)
	}
	return 0, 0, 0, false, fmt.Errorf("querying the guest's mappings at %#x: %w", addr, e)
}

func vmaFromText(maps *os.File, addr uint64) (start, end, flags uint64, ok bool, err error) {
	if _, err := maps.Seek(0, 0); err != nil {
		return 0, 0, 0, false, err
	}
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || len(f[1]) < 3 {
			continue
		}
		if _, err := fmt.Sscanf(f[0], "%x-%x", &start, &end); err != nil || end <= addr {
			continue
		}
		for i, bit := range []uint64{vmaReadable, vmaWritable, vmaExecutable} {
			if f[1][i] != '-' {
				flags |= bit
			}
		}
		return start, end, flags, true, nil
	}
	return 0, 0, 0, false, sc.Err()
}

// vmaRanges calls fn for each part of [lo, hi) that the guest maps with
// flags for which match is true.
func vmaRanges(maps *os.File, lo, hi uint64, match func(flags uint64) bool, fn func(lo, hi uint64)) error {
	for at := lo; at < hi; {
		start, end, flags, ok, err := vmaAt(maps, at)
		if err != nil || !ok || start >= hi {
			return err
		}
		if match(flags) {
			fn(max(start, lo), min(end, hi))
		}
		at = end
	}
	return nil
}

// writable: stores to the mapping do not fault. The tracer protects what
// it traces, so a writable part it did not open is one the guest opened
// itself (its own mprotect).
func writable(flags uint64) bool { return flags&vmaWritable != 0 }

// tracerProtected: the mapping has the tracer's protection (protTraced),
// not one the guest chose.
func tracerProtected(flags uint64) bool {
	return flags&(vmaReadable|vmaWritable|vmaExecutable) == vmaReadable|vmaExecutable
}
