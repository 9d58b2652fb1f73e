/* Tensor maps (CUDA Driver API reference, "Tensor Map Object Management"):
 * NVIDIA's name and C signature, handing its arguments to the Go entry in
 * glue_tensormap_cgo.go; pvdriver/cuapi/tensormap.go says how a map is
 * made. The im2col form and cuTensorMapReplaceAddress stay refusals
 * (stubs.h). */
#include "vgcuda.h"
#include "_cgo_export.h"
#include "runtime.h"

CUresult cuTensorMapEncodeTiled(void *map, int dataType, cuuint32_t rank, void *global, const cuuint64_t *dims,
	const cuuint64_t *strides, const cuuint32_t *box, const cuuint32_t *elementStrides, int interleave, int swizzle,
	int l2Promotion, int oobFill) {
	return vg_traced(__func__, vgTensorMapEncodeTiled(map, dataType, rank, global, (cuuint64_t *)dims, (cuuint64_t *)strides,
		(cuuint32_t *)box, (cuuint32_t *)elementStrides, interleave, swizzle, l2Promotion, oobFill));
}
