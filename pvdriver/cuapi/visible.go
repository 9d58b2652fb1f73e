package cuapi

import (
	"strconv"
	"strings"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// VisibleDevices is which of the served devices (by their UUIDs, in the
// order the node serves them) a process may use, in the order it numbers
// them: all of them when CUDA_VISIBLE_DEVICES is unset (set false),
// otherwise those its comma-separated entries name, each an index or a
// UUID ("GPU-" and a prefix of the UUID that names one device alone). As
// CUDA reads it, the list ends at the first entry that names no device
// or one already named, so a value naming no served device leaves none
// (CUDA C Programming Guide, "CUDA Environment Variables"). The library's
// driver and its NVML both count, order and name devices by it.
func VisibleDevices(spec string, set bool, uuids [][16]byte) []int {
	all := make([]int, len(uuids))
	for i := range all {
		all[i] = i
	}
	if !set {
		return all
	}
	var vis []int
	seen := map[int]bool{}
	for _, e := range strings.Split(spec, ",") {
		i := deviceNamed(strings.TrimSpace(e), uuids)
		if i < 0 || seen[i] {
			break
		}
		seen[i] = true
		vis = append(vis, i)
	}
	return vis
}

// deviceNamed is the served device entry e names, or -1.
func deviceNamed(e string, uuids [][16]byte) int {
	if n, err := strconv.Atoi(e); err == nil {
		if n < 0 || n >= len(uuids) {
			return -1
		}
		return n
	}
	prefix, ok := strings.CutPrefix(e, "GPU-")
	if !ok || prefix == "" {
		return -1
	}
	found := -1
	for i, u := range uuids {
		if strings.HasPrefix(abi.UUIDString(u)[len("GPU-"):], strings.ToLower(prefix)) {
			if found >= 0 {
				return -1 // ambiguous
			}
			found = i
		}
	}
	return found
}
