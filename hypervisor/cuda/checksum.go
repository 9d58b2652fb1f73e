package cuda

import (
	"encoding/binary"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// checksumPTX computes the full-word part of gpu.Checksum: every thread sums
// w_i*(2i+1) over a grid-stride range of words and adds its sum to *out
// with one atomic add (integer addition: the order does not matter).
const checksumPTX = `.version 7.0
.target sm_70
.address_size 64

.visible .entry vgpuha_checksum(
	.param .u64 pdata, .param .u64 pwords, .param .u64 pout)
{
	.reg .pred %p<2>;
	.reg .b32 %r<5>;
	.reg .b64 %rd<16>;
	ld.param.u64 %rd1, [pdata];
	ld.param.u64 %rd2, [pwords];
	ld.param.u64 %rd3, [pout];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd3, %rd3;
	mov.u32 %r1, %ctaid.x;
	mov.u32 %r2, %ntid.x;
	mov.u32 %r3, %tid.x;
	mov.u32 %r4, %nctaid.x;
	mul.wide.u32 %rd4, %r1, %r2;
	cvt.u64.u32 %rd5, %r3;
	add.u64 %rd4, %rd4, %rd5;
	mul.wide.u32 %rd6, %r4, %r2;
	mov.u64 %rd7, 0;
LOOP:
	setp.ge.u64 %p1, %rd4, %rd2;
	@%p1 bra DONE;
	shl.b64 %rd8, %rd4, 3;
	add.u64 %rd9, %rd1, %rd8;
	ld.global.u64 %rd10, [%rd9];
	shl.b64 %rd11, %rd4, 1;
	add.u64 %rd11, %rd11, 1;
	mul.lo.u64 %rd12, %rd10, %rd11;
	add.u64 %rd7, %rd7, %rd12;
	add.u64 %rd4, %rd4, %rd6;
	bra LOOP;
DONE:
	atom.global.add.u64 %rd13, [%rd3], %rd7;
	ret;
}
`

// Checksum implements gpu.Checksummer: the full words are summed on the
// GPU, the trailing bytes (fewer than 8) on the host.
func (c *guestContext) Checksum(addr, n uint64) (uint64, error) {
	var sum uint64
	words := n / 8
	tail := make([]byte, n%8)
	err := c.do(func() error {
		d := c.d
		if c.sumFn == 0 {
			ptx := cbytes(checksumPTX)
			if err := d.check("cuModuleLoadData(checksum)", d.cuModuleLoadData(&c.sumMod, &ptx[0])); err != nil {
				return err
			}
			name := cbytes("vgpuha_checksum")
			if err := d.check("cuModuleGetFunction(checksum)", d.cuModuleGetFunction(&c.sumFn, c.sumMod, &name[0])); err != nil {
				return err
			}
			if err := d.check("cuMemAlloc", d.cuMemAlloc(&c.sumOut, 8)); err != nil {
				return err
			}
		}
		if err := d.check("cuMemcpyHtoD", d.memcpyHtoD(c.sumOut, make([]byte, 8))); err != nil {
			return err
		}
		if words > 0 {
			const block = 256
			grid := uint32(min((words+block-1)/block, 4096))
			params := [][]byte{u64(addr), u64(words), u64(c.sumOut)}
			if err := d.check("cuLaunchKernel(checksum)", d.launchKernel(c.sumFn, gpu.LaunchConfig{Grid: abi.Dim3{X: grid, Y: 1, Z: 1}, Block: abi.Dim3{X: block, Y: 1, Z: 1}}, 0, params)); err != nil {
				return err
			}
		}
		var out [8]byte
		if err := d.check("cuMemcpyDtoH", d.memcpyDtoH(out[:], c.sumOut)); err != nil {
			return err
		}
		sum = binary.LittleEndian.Uint64(out[:])
		if len(tail) > 0 {
			return d.check("cuMemcpyDtoH", d.memcpyDtoH(tail, addr+words*8))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return gpu.FinishChecksum(sum, words, tail), nil
}

// u64 is v's bytes in this machine's order: a kernel parameter's value.
func u64(v uint64) []byte { return binary.NativeEndian.AppendUint64(nil, v) }
