/* Virtual memory management (CUDA Driver API reference, "Virtual Memory
 * Management"): NVIDIA's names and C signatures, each handing its
 * arguments to the Go entries in glue_vmm_cgo.go. What is served, and
 * what differs from CUDA, is said in pvdriver/cuapi/vmm.go. Exporting and
 * importing shareable handles stay refusals (stubs.h). */
#include "vgcuda.h"
#include "_cgo_export.h"
#include "runtime.h"

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) { return vg_traced(__func__, vgMemGetAllocationGranularity(g, (CUmemAllocationProp *)prop, option)); }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) { return vg_traced(__func__, vgMemAddressReserve(p, size, align, addr, flags)); }
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { return vg_traced(__func__, vgMemAddressFree(p, size)); }
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) { return vg_traced(__func__, vgMemCreate(h, size, (CUmemAllocationProp *)prop, flags)); }
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return vg_traced(__func__, vgMemRelease(h)); }
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) { return vg_traced(__func__, vgMemMap(p, size, offset, h, flags)); }
CUresult cuMemUnmap(CUdeviceptr p, size_t size) { return vg_traced(__func__, vgMemUnmap(p, size)); }
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) { return vg_traced(__func__, vgMemSetAccess(p, size, (CUmemAccessDesc *)desc, count)); }
CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr p) { return vg_traced(__func__, vgMemGetAccess(flags, (CUmemLocation *)loc, p)); }
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) { return vg_traced(__func__, vgMemRetainAllocationHandle(h, addr)); }
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) { return vg_traced(__func__, vgMemGetAllocationPropertiesFromHandle(prop, h)); }
