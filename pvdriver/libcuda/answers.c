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
#include <pthread.h>
#include <stdlib.h>
#include "vgcuda.h"
#include "_cgo_export.h"

/* Settable function attributes (cuda.h, CUfunction_attribute). */
enum {
	VG_FUNC_MAX_DYNAMIC_SHARED = 8,
	VG_FUNC_CARVEOUT = 9,
	VG_FUNC_NON_PORTABLE_CLUSTER = 14,
	VG_FUNC_CLUSTER_POLICY = 15,
};

/* Slots per thread, direct-mapped, powers of two: cuDNN asks several
 * attributes of each of a few hundred functions. */
#define VG_ANS_FUNCS 2048
#define VG_ANS_CTXS 8

/* 64 bits: a generation never comes round again (slots start at 0). */
static uint64_t vg_answers_gen = 1;

void vg_answers_forget(void) { __atomic_add_fetch(&vg_answers_gen, 1, __ATOMIC_RELEASE); }

static uint64_t vg_gen(void) { return __atomic_load_n(&vg_answers_gen, __ATOMIC_ACQUIRE); }

/* A thread's kept answers, on the heap: a library that is dlopen'ed must
 * keep its thread-local storage to a few words (glibc's static TLS
 * surplus), so the thread holds only the pointer. */
struct vg_kept {
	struct { uintptr_t f; uint64_t gen; int attr, v; } fattr[VG_ANS_FUNCS];
	struct { uintptr_t f; uint64_t gen; char *name; } fname[VG_ANS_FUNCS];
	struct { uintptr_t ctx; uint64_t gen; } live[VG_ANS_CTXS];
	struct { uintptr_t ctx; uint64_t gen; CUdevice dev; } cdev;
	struct { uint64_t gen; CUdevice dev; unsigned flags; int active; } pstate;
};

static __thread struct vg_kept *vg_kept_mine;
static pthread_key_t vg_kept_key;
static pthread_once_t vg_kept_once = PTHREAD_ONCE_INIT;

static void vg_kept_key_make(void) { pthread_key_create(&vg_kept_key, free); }

/* vg_kept is the calling thread's answers, made on its first query
 * (generation 0 marks every slot empty); NULL when memory is short, and
 * then every query goes to Go. */
static struct vg_kept *vg_kept(void) {
	if (vg_kept_mine == NULL && (vg_kept_mine = calloc(1, sizeof *vg_kept_mine)) != NULL) {
		pthread_once(&vg_kept_once, vg_kept_key_make);
		pthread_setspecific(vg_kept_key, vg_kept_mine);
	}
	return vg_kept_mine;
}

/* vg_slot spreads handles (minted in steps of 16) and attributes over n
 * slots (Fibonacci hashing). */
static unsigned vg_slot(uintptr_t h, int attr, unsigned n) {
	return (unsigned)((((uint64_t)h >> 4) * 0x9E3779B97F4A7C15ull + (uint64_t)attr * 0xC2B2AE3D27D4EB4Full) >> 40) & (n - 1);
}

CUresult vg_ans_func_attr(int *v, CUfunction_attribute attr, uintptr_t f) {
	struct vg_kept *k = vg_kept();
	uint64_t g = vg_gen();
	unsigned i = vg_slot(f, attr, VG_ANS_FUNCS);
	if (k == NULL || v == NULL)
		return vgFuncGetAttribute(v, attr, f);
	if (k->fattr[i].gen == g && k->fattr[i].f == f && k->fattr[i].attr == attr) {
		*v = k->fattr[i].v;
		return CUDA_SUCCESS;
	}
	CUresult r = vgFuncGetAttribute(v, attr, f);
	if (r == CUDA_SUCCESS)
		k->fattr[i].f = f, k->fattr[i].attr = attr, k->fattr[i].v = *v, k->fattr[i].gen = g;
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
	struct vg_kept *k = vg_kept();
	uint64_t g = vg_gen();
	unsigned i = vg_slot(f, 0, VG_ANS_FUNCS);
	if (k == NULL || name == NULL)
		return vgFuncGetName(name, f);
	if (k->fname[i].gen == g && k->fname[i].f == f) {
		*name = k->fname[i].name;
		return CUDA_SUCCESS;
	}
	CUresult r = vgFuncGetName(name, f);
	if (r == CUDA_SUCCESS)
		k->fname[i].f = f, k->fname[i].name = *name, k->fname[i].gen = g;
	return r;
}

/* vg_ans_ctx_live checks ctx is a live context (zero: the calling thread's
 * current one) and returns it. */
CUresult vg_ans_ctx_live(uintptr_t ctx, uintptr_t *out) {
	struct vg_kept *k = vg_kept();
	uintptr_t c = ctx ? ctx : vg_ctx_top();
	uint64_t g = vg_gen();
	unsigned i = vg_slot(c, 0, VG_ANS_CTXS);
	if (k == NULL)
		return vgCtxLive(ctx, out);
	if (c != 0 && k->live[i].gen == g && k->live[i].ctx == c) {
		*out = c;
		return CUDA_SUCCESS;
	}
	CUresult r = vgCtxLive(ctx, out);
	if (r == CUDA_SUCCESS && *out == c)
		k->live[i].ctx = c, k->live[i].gen = g;
	return r;
}

CUresult vg_ans_ctx_device(CUdevice *dev) {
	struct vg_kept *k = vg_kept();
	uintptr_t c = vg_ctx_top();
	uint64_t g = vg_gen();
	if (k == NULL || dev == NULL || c == 0)
		return vgCtxGetDevice(dev);
	if (k->cdev.gen == g && k->cdev.ctx == c) {
		*dev = k->cdev.dev;
		return CUDA_SUCCESS;
	}
	CUresult r = vgCtxGetDevice(dev);
	if (r == CUDA_SUCCESS)
		k->cdev.ctx = c, k->cdev.dev = *dev, k->cdev.gen = g;
	return r;
}

CUresult vg_ans_primary_state(CUdevice dev, unsigned int *flags, int *active) {
	struct vg_kept *k = vg_kept();
	uint64_t g = vg_gen();
	if (k == NULL || flags == NULL || active == NULL)
		return vgPrimaryCtxGetState(dev, flags, active);
	if (k->pstate.gen == g && k->pstate.dev == dev) {
		*flags = k->pstate.flags, *active = k->pstate.active;
		return CUDA_SUCCESS;
	}
	CUresult r = vgPrimaryCtxGetState(dev, flags, active);
	if (r == CUDA_SUCCESS)
		k->pstate.dev = dev, k->pstate.flags = *flags, k->pstate.active = *active, k->pstate.gen = g;
	return r;
}
