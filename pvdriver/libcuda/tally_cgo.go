package main

/*
#include "tally.h"
*/
import "C"

import (
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// entryTally is one Go entry's count from tally.c.
type entryTally struct {
	name  string
	calls uint64
	took  time.Duration
}

// readTally names and returns tally.c's counts, the most time first.
func readTally() []entryTally {
	var out []entryTally
	for i := range int(C.vg_tally_slots()) {
		var fn C.uintptr_t
		var calls, nanos C.uint64_t
		if C.vg_tally_slot(C.int(i), &fn, &calls, &nanos) == 0 {
			continue
		}
		out = append(out, entryTally{name: entryName(uintptr(fn)), calls: uint64(calls), took: time.Duration(nanos)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].took > out[j].took })
	return out
}

// entryName names a cgo entry by its Go function: "_cgoexp_HASH_vgLaunchKernel"
// is vgLaunchKernel, the library's side of cuLaunchKernel.
func entryName(fn uintptr) string {
	f := runtime.FuncForPC(fn)
	if f == nil {
		return fmt.Sprintf("%#x", fn)
	}
	name := f.Name()
	if rest, ok := strings.CutPrefix(name, "_cgoexp_"); ok {
		if _, entry, ok := strings.Cut(rest, "_"); ok {
			return entry
		}
	}
	return name
}

// writeTally prints the entry tally, when VGPUHA_STATS=1 turned it on.
func writeTally(w io.Writer) {
	if C.vg_tally_on == 0 {
		return
	}
	fmt.Fprintf(w, "vgpuha libcuda: calls into the library, per entry (the most time inside first):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "entry\tcalls\ttime\tper call\t\n")
	for _, e := range readTally() {
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t\n", e.name, e.calls, e.took.Round(time.Microsecond), (e.took / time.Duration(max(e.calls, 1))).Round(10*time.Nanosecond))
	}
	tw.Flush()
}
