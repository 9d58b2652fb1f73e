package worker

import "github.com/vgpuha/vgpuha/hypervisor/gpu"

// SetInline makes c send copies of up to n bytes in the frame (the rest
// through the shared memory), for a benchmark of the other choice.
func SetInline(c gpu.Context, n int) {
	switch p := c.(type) {
	case *proxy:
		p.inline = n
	case pipelined:
		p.inline = n
	}
}
