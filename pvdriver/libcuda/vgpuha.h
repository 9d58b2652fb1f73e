/* vgpuha's extension to the CUDA driver API, exported by vgpuha's
 * libcuda.so.1 next to NVIDIA's entry points (look them up with dlsym to
 * stay runnable on NVIDIA's driver too).
 *
 * An aperture is device memory mapped into the program: plain CPU stores
 * to *host reach the device allocation at *dptr, and the standby, with no
 * call — as writes to a GPU's BAR would. The node traces them; a store it
 * cannot replicate fails in the program at that store (SIGSEGV, EPERM or
 * EFAULT from the system call), never silently. Reads of *host see what
 * the program wrote, not what kernels wrote to the device since. The
 * session must reach its node over a unix socket (unix:// or shm+unix://).
 *
 * kind: 0 memory (writes may be batched per page), 1 registers (each write
 * replicated, in order). bytes is rounded up to whole pages. Free with
 * vgpuhaMemUnmapAperture, not cuMemFree. Both return a CUresult. */
#ifndef VGPUHA_H
#define VGPUHA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef unsigned long long vgpuhaDevicePtr; /* a CUdeviceptr */

int vgpuhaMemMapAperture(vgpuhaDevicePtr *dptr, void **host, size_t bytes, unsigned int kind);
int vgpuhaMemUnmapAperture(vgpuhaDevicePtr dptr);

#ifdef __cplusplus
}
#endif

#endif
