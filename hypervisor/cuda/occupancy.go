package cuda

import (
	"fmt"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// guestContext answers occupancy questions through the GPU's driver.
var _ gpu.OccupancyCalculator = (*guestContext)(nil)

// Function attributes an occupancy answer depends on (cuda.h).
const (
	funcAttrNonPortableCluster = 14 // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
	portableClusterSize        = 8  // the largest cluster any GPU with clusters runs without it
)

// Occupancy implements gpu.OccupancyCalculator: the driver's answer for f
// with the guest's attributes set on it first (they are the function's
// state the guest set through its library; a launch sets them as well).
func (c *guestContext) Occupancy(f gpu.Function, q *abi.Occupancy) (v int32, err error) {
	if !c.d.hasOccupancy(q.Kind) {
		return 0, fmt.Errorf("%w: this node's CUDA driver does not answer occupancy question %d", abi.StatusNotSupported, q.Kind)
	}
	err = c.do(func() error {
		fn, ok := c.functions[f]
		if !ok {
			return fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
		}
		if q.MaxDynamicShared > defaultDynamicShared {
			if err := c.d.check("cuFuncSetAttribute", c.d.cuFuncSetAttribute(fn, funcAttrMaxDynamicShared, int32(min(q.MaxDynamicShared, 1<<30)))); err != nil {
				return err
			}
		}
		if q.Kind != abi.OccupancyBlocks {
			nonPortable := int32(0)
			if q.NonPortable {
				nonPortable = 1
			}
			if err := c.d.check("cuFuncSetAttribute", c.d.cuFuncSetAttribute(fn, funcAttrNonPortableCluster, nonPortable)); err != nil {
				return err
			}
		}
		v, err = c.d.occupancy(fn, q)
		return err
	})
	return v, err
}
