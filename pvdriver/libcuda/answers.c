/* Answers kept in C: the queries a framework asks thousands of times a
 * training step (PyTorch asks cuCtxGetDevice before nearly every
 * operation, cuDNN a function's attributes before each launch), answered
 * here without a call into Go, which costs about a microsecond: per step
 * of a ResNet-18, 3,300 cuCtxGetDevice, 1,700 cuFuncGetAttribute, 1,000
 * cuDevicePrimaryCtxGetState and 500 context checks were 6.8 ms of a
 * 24 ms step.
 *
 * Each thread keeps the answers it got from Go in small tables of its
 * own (no locks), tagged with the generation they were asked in. The Go
 * driver calls vg_answers_forget whenever any of them may have changed
 * (cuapi.Driver.OnChange: a context destroyed, the primary context made or
 * its flags set, a function's attribute set or its module unloaded, the
 * driver shut down), which makes every kept answer stale at once. A
 * thread reads the generation before it asks Go, so an answer that raced
 * a change is kept as already stale. Only successes are kept: an error is
 * asked of Go every time. Handles are never reused, so a kept answer
 * cannot name another object. */
#include "vgcuda.h"
#include "_cgo_export.h"

/* Settable function attributes (cuda.h, CUfunction_attribute). */
enum {
	VG_FUNC_MAX_DYNAMIC_SHARED = 8,
	VG_FUNC_CARVEOUT = 9,
	VG_FUNC_NON_PORTABLE_CLUSTER = 14,
	VG_FUNC_CLUSTER_POLICY = 15,
};

#define VG_ANS_FUNCS 256 /* per thread, direct-mapped; a power of two */
#define VG_ANS_CTXS 8

static unsigned vg_answers_gen = 1;

void vg_answers_forget(void) { __atomic_add_fetch(&vg_answers_gen, 1, __ATOMIC_RELEASE); }

static unsigned vg_gen(void) { return __atomic_load_n(&vg_answers_gen, __ATOMIC_ACQUIRE); }

static __thread struct { uintptr_t f; int attr; unsigned gen; int v; } vg_fattr[VG_ANS_FUNCS];
static __thread struct { uintptr_t f; unsigned gen; char *name; } vg_fname[VG_ANS_FUNCS];
static __thread struct { uintptr_t ctx; unsigned gen; } vg_live[VG_ANS_CTXS];
static __thread struct { uintptr_t ctx; unsigned gen; CUdevice dev; } vg_cdev;
static __thread struct { CUdevice dev; unsigned gen; unsigned flags; int active; } vg_pstate;

static unsigned vg_slot(uintptr_t h, int attr, unsigned n) { return (unsigned)((h >> 4) * 31u + (unsigned)attr) & (n - 1); }

CUresult vg_ans_func_attr(int *v, CUfunction_attribute attr, uintptr_t f) {
	unsigned g = vg_gen(), i = vg_slot(f, attr, VG_ANS_FUNCS);
	if (v != NULL && vg_fattr[i].gen == g && vg_fattr[i].f == f && vg_fattr[i].attr == attr) {
		*v = vg_fattr[i].v;
		return CUDA_SUCCESS;
	}
	CUresult r = vgFuncGetAttribute(v, attr, f);
	if (r == CUDA_SUCCESS && v != NULL) {
		vg_fattr[i].f = f, vg_fattr[i].attr = attr, vg_fattr[i].v = *v, vg_fattr[i].gen = g;
	}
	return r;
}

/* vg_ans_func_set_attr sets a function's attribute; setting the value a
 * settable attribute already has (cuDNN does before each launch) changes
 * nothing and is answered here. */
CUresult vg_ans_func_set_attr(uintptr_t f, CUfunction_attribute attr, int v) {
	int settable = attr == VG_FUNC_MAX_DYNAMIC_SHARED || attr == VG_FUNC_CARVEOUT ||
		       attr == VG_FUNC_NON_PORTABLE_CLUSTER || attr == VG_FUNC_CLUSTER_POLICY;
	int now;
	if (settable && vg_ans_func_attr(&now, attr, f) == CUDA_SUCCESS && now == v)
		return CUDA_SUCCESS;
	return vgFuncSetAttribute(f, attr, v);
}

CUresult vg_ans_func_name(char **name, uintptr_t f) {
	unsigned g = vg_gen(), i = vg_slot(f, 0, VG_ANS_FUNCS);
	if (name != NULL && vg_fname[i].gen == g && vg_fname[i].f == f) {
		*name = vg_fname[i].name;
		return CUDA_SUCCESS;
	}
	CUresult r = vgFuncGetName(name, f);
	if (r == CUDA_SUCCESS && name != NULL) {
		vg_fname[i].f = f, vg_fname[i].name = *name, vg_fname[i].gen = g;
	}
	return r;
}

/* vg_ans_ctx_live checks ctx is a live context (zero: the calling thread's
 * current one) and returns it. */
CUresult vg_ans_ctx_live(uintptr_t ctx, uintptr_t *out) {
	uintptr_t c = ctx ? ctx : vg_ctx_top();
	unsigned g = vg_gen(), i = vg_slot(c, 0, VG_ANS_CTXS);
	if (c != 0 && vg_live[i].gen == g && vg_live[i].ctx == c) {
		*out = c;
		return CUDA_SUCCESS;
	}
	CUresult r = vgCtxLive(ctx, out);
	if (r == CUDA_SUCCESS && *out == c) {
		vg_live[i].ctx = c, vg_live[i].gen = g;
	}
	return r;
}

CUresult vg_ans_ctx_device(CUdevice *dev) {
	uintptr_t c = vg_ctx_top();
	unsigned g = vg_gen();
	if (dev != NULL && c != 0 && vg_cdev.gen == g && vg_cdev.ctx == c) {
		*dev = vg_cdev.dev;
		return CUDA_SUCCESS;
	}
	CUresult r = vgCtxGetDevice(dev);
	if (r == CUDA_SUCCESS && c != 0) {
		vg_cdev.ctx = c, vg_cdev.dev = *dev, vg_cdev.gen = g;
	}
	return r;
}

CUresult vg_ans_primary_state(CUdevice dev, unsigned int *flags, int *active) {
	unsigned g = vg_gen();
	if (flags != NULL && active != NULL && vg_pstate.gen == g && vg_pstate.dev == dev) {
		*flags = vg_pstate.flags, *active = vg_pstate.active;
		return CUDA_SUCCESS;
	}
	CUresult r = vgPrimaryCtxGetState(dev, flags, active);
	if (r == CUDA_SUCCESS) {
		vg_pstate.dev = dev, vg_pstate.flags = *flags, vg_pstate.active = *active, vg_pstate.gen = g;
	}
	return r;
}
