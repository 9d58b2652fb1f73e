package cuapi

import (
	"errors"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Occupancy: the node's GPU driver answers (abi.Occupancy), once per
// function and question; libraries choose kernels and split work by these
// answers (cuDNN skips every kernel with thread-block clusters when no
// cluster can be resident), so they must be the GPU's, not an estimate.
// Where the node has no answer (a software GPU), activeBlocks estimates
// blocks per multiprocessor from the device's limits, and no cluster is
// resident.

// occupancyKey is one question about one function.
type occupancyKey struct {
	kind                 abi.OccupancyKind
	flags                uint32
	block, grid, cluster abi.Dim3
	shared, maxDyn       uint32
	nonPortable          bool
}

// askOccupancy asks the node question q about fn (its answer is kept);
// ok is false when the node has no answer.
func (d *Driver) askOccupancy(fn *function, q abi.Occupancy) (v int32, ok bool, r Result) {
	d.mu.Lock()
	c := d.client
	key := occupancyKey{q.Kind, q.Flags, q.Block, q.Grid, q.Cluster, q.SharedBytes, uint32(max(fn.maxDyn, 0)), fn.nonPortable}
	v, known := fn.occupancy[key]
	d.mu.Unlock()
	if known {
		return v, true, Success
	}
	q.Function, q.MaxDynamicShared, q.NonPortable = uint64(fn.remote), key.maxDyn, key.nonPortable
	v, err := c.Occupancy(&q)
	if errors.Is(err, abi.StatusNotSupported) {
		return 0, false, Success
	}
	if err != nil {
		return 0, false, resultOf("cuOccupancy", err, false)
	}
	d.mu.Lock()
	if fn.occupancy == nil {
		fn.occupancy = map[occupancyKey]int32{}
	}
	fn.occupancy[key] = v
	d.mu.Unlock()
	return v, true, Success
}

// blocksPerSM is how many blocks of blockSize threads with smem bytes of
// dynamic shared memory fit on one multiprocessor: the node's answer, else
// the estimate.
func (d *Driver) blocksPerSM(fn *function, blockSize int32, smem uint64, flags uint32) (int32, Result) {
	if blockSize <= 0 || smem > 1<<32-1 {
		return 0, Success
	}
	q := abi.Occupancy{Kind: abi.OccupancyBlocks, Flags: flags, Block: abi.Dim3{X: uint32(blockSize), Y: 1, Z: 1}, SharedBytes: uint32(smem)}
	if uint64(blockSize) <= 1024 {
		if v, ok, r := d.askOccupancy(fn, q); ok || r != Success {
			return v, r
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.activeBlocks(blockSize, smem), Success
}

// OccupancyClusters is cuOccupancyMaxActiveClusters (kind
// abi.OccupancyClusters) and cuOccupancyMaxPotentialClusterSize
// (abi.OccupancyClusterSize) for a launch of f shaped as q says.
func (d *Driver) OccupancyClusters(f uint64, q abi.Occupancy) (int32, Result) {
	d.mu.Lock()
	fn, r := d.function(f)
	d.mu.Unlock()
	if r != Success {
		return 0, r
	}
	if n := q.Block.Count(); n == 0 || n > uint64(max(d.attr(1), 0)) {
		return 0, ErrorInvalidValue
	}
	v, ok, r := d.askOccupancy(fn, q)
	if !ok || r != Success {
		return 0, r // no answer: no cluster is resident
	}
	return v, Success
}
