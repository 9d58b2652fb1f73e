package sim

import (
	"fmt"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// simAttrs are the software GPU's CUdevice_attribute values (cuda.h
// numbering): a compute capability 7.0 device with CUDA's launch limits
// (gpu.MaxThreadsPerBlock and friends), 80 multiprocessors, unified
// addressing. Attributes not listed are zero (feature absent).
var simAttrs = map[int]int32{
	1: gpu.MaxThreadsPerBlock, 2: 1024, 3: 1024, 4: gpu.MaxBlockZ, // threads per block, block dims
	5: gpu.MaxGridX, 6: gpu.MaxGridYZ, 7: gpu.MaxGridYZ, // grid dims
	8: gpu.MaxSharedBytes, 9: 64 << 10, 10: 32, 11: 2147483647, // shared/block, constant, warp, pitch
	12: 65536, 13: 1380000, 14: 512, 15: 1, 16: 80, // registers/block, clock kHz, texture align, overlap, SMs
	19: 1, 20: 0, 30: 512, 31: 1, 33: 0, 34: 0, 36: 877000, 37: 4096, 38: 6 << 20, // map host, compute mode, …
	39: simThreadsPerSM, 40: 2, 41: 1, 50: 0, 51: 32, // threads/SM, async engines, unified addressing, PCI domain, pitch align
	75: 7, 76: 0, 78: 1, 79: 1, 80: 1, // compute capability 7.0, stream priorities, L1 caches
	81: simSharedPerSM, 82: 65536, 83: 1, 86: 0, 87: 2, // shared/SM, registers/SM, managed memory, …
	95: 1, 97: 96 << 10, 106: simBlocksPerSM, 111: 0, 115: 1, 126: 1, 134: -1, // cooperative launch, shared opt-in, blocks/SM, …
	102: 1, // virtual memory management (reserve, map at exact addresses: the window allocator)
}

// maxCoResidentBlocks is how many blocks the software GPU holds at once
// (multiprocessors × blocks per multiprocessor, simAttrs 16 and 106): the
// most a cooperative launch may ask for, as CUDA bounds it.
const maxCoResidentBlocks = 80 * simBlocksPerSM

// DeviceInfo implements gpu.DeviceDescriber with fixed values, so a
// standby's software GPU describes itself exactly as the primary's of the
// same Number.
func (b *Backend) DeviceInfo() (abi.DeviceInfoReply, error) {
	r := abi.DeviceInfoReply{
		Name:     "vgpuha software GPU",
		UUID:     [16]byte{'v', 'g', 'p', 'u', 'h', 'a', '-', 's', 'i', 'm', 15: b.Number},
		TotalMem: b.limit,
		Attrs:    make([]int32, gpu.DeviceAttrCount),
		// The granularity CUDA reports for device memory on every current
		// GPU (cuMemGetAllocationGranularity, minimum and recommended).
		Granularity: 2 << 20,
	}
	for a, v := range simAttrs {
		r.Attrs[a] = v
	}
	return r, nil
}

// The software GPU's residency: what maxCoResidentBlocks bounds per
// multiprocessor (simAttrs 39, 106 and 81: threads, blocks and shared
// memory per multiprocessor; it has no registers to run out of).
const (
	simThreadsPerSM = 2048
	simBlocksPerSM  = 32
	simSharedPerSM  = 96 << 10
)

// Occupancy implements gpu.OccupancyCalculator: blocks per multiprocessor
// by the limits above; the software GPU launches no clusters
// (CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH is 0), so cluster questions are not
// supported.
func (c *guestContext) Occupancy(f gpu.Function, q *abi.Occupancy) (int32, error) {
	c.mu.Lock()
	_, ok := c.functions[f]
	c.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
	}
	if q.Kind != abi.OccupancyBlocks {
		return 0, fmt.Errorf("%w: the software GPU launches no thread-block clusters", abi.StatusNotSupported)
	}
	n := min(simBlocksPerSM, simThreadsPerSM/int(q.Block.Count()))
	if q.SharedBytes > 0 {
		n = min(n, simSharedPerSM/int(q.SharedBytes))
	}
	return int32(n), nil
}
