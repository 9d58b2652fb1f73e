package cuda

import (
	"fmt"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Global implements gpu.GlobalAccessor (cuModuleGetGlobal_v2 on each CUDA
// module the guest module was loaded as).
func (c *guestContext) Global(m gpu.Module, name string) (addr, size uint64, err error) {
	err = c.do(func() error {
		lm, ok := c.modules[m]
		if !ok {
			return fmt.Errorf("%w: no module %d", abi.StatusInvalidHandle, m)
		}
		cname := cbytes(name)
		for _, cm := range lm.cuModules {
			r := c.d.cuModuleGetGlobal(&addr, &size, cm, &cname[0])
			if r == cudaErrorNotFound {
				continue
			}
			return c.d.check("cuModuleGetGlobal", r)
		}
		return fmt.Errorf("%w: module %d has no variable %q", abi.StatusInvalidValue, m, name)
	})
	return addr, size, err
}

// WriteGlobal implements gpu.GlobalAccessor: a copy on the null stream,
// after every earlier launch and copy of the context's streams (they are
// blocking streams, which the legacy null stream waits for).
func (c *guestContext) WriteGlobal(addr uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.do(func() error { return c.d.check("cuMemcpyHtoD(module variable)", c.d.memcpyHtoD(addr, src)) })
}

// ReadGlobal implements gpu.GlobalAccessor, as WriteGlobal.
func (c *guestContext) ReadGlobal(dst []byte, addr uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return c.do(func() error { return c.d.check("cuMemcpyDtoH(module variable)", c.d.memcpyDtoH(dst, addr)) })
}
