package mmiotrace

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// writableRanges calls fn for each part of [lo, hi) that the guest maps
// writable now. The tracer protects what it traces, so a writable part it
// did not open is one the guest opened itself (its own mprotect), where
// stores no longer fault. PROCMAP_QUERY answers per mapping; kernels
// without it are answered from the maps text.
func writableRanges(maps *os.File, lo, hi uint64, fn func(lo, hi uint64)) error {
	for at := lo; at < hi; {
		start, end, flags, e := queryVMA(maps.Fd(), at)
		switch e {
		case 0:
		case unix.ENOENT:
			return nil
		case unix.ENOTTY, unix.EINVAL:
			return writableFromText(maps, lo, hi, fn)
		default:
			return fmt.Errorf("querying the guest's mappings at %#x: %w", at, e)
		}
		if start >= hi || end <= at {
			return nil
		}
		if flags&procmapWritable != 0 {
			fn(max(start, lo), min(end, hi))
		}
		at = end
	}
	return nil
}

func writableFromText(maps *os.File, lo, hi uint64, fn func(lo, hi uint64)) error {
	if _, err := maps.Seek(0, 0); err != nil {
		return err
	}
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var start, end uint64
		if len(f) < 2 || len(f[1]) < 2 {
			continue
		}
		if _, err := fmt.Sscanf(f[0], "%x-%x", &start, &end); err != nil {
			continue
		}
		if start < hi && lo < end && f[1][1] == 'w' {
			fn(max(start, lo), min(end, hi))
		}
	}
	return sc.Err()
}
