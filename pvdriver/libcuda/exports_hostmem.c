/* Host memory the program registers (cuMemHostRegister and
 * cuMemHostUnregister; CUDA Driver API reference, Memory Management):
 * NVIDIA's names and C signatures, each handing its arguments to the Go
 * entries in glue_hostmem_cgo.go. What "registered" means across the link
 * is said in pvdriver/cuapi/hostmem.go. */
#include "vgcuda.h"
#include "_cgo_export.h"
#include "runtime.h"

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) { return vg_traced(__func__, vgMemHostRegister(p, n, flags)); }
/* The first version (CUDA 4.0) took the same arguments. */
CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags) { return cuMemHostRegister_v2(p, n, flags); }
CUresult cuMemHostUnregister(void *p) { return vg_traced(__func__, vgMemHostUnregister(p)); }
/* The device address of host memory (its mirror on the device: mapped.go). */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags) { return vg_traced(__func__, vgMemHostGetDevicePointer((uintptr_t *)dptr, p, flags)); }
