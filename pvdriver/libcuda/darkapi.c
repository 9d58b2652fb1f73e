/* The driver's private export tables (cuGetExportTable): what the CUDA
 * runtime (cudart, static or shared) and the libraries over it ask of the
 * driver beside its documented API. Each table is an array of function
 * pointers found by a 16-byte id; slot 0 holds the table's size in bytes
 * where the runtime expects one. The ids, the slots the runtime calls and
 * what each means are those ZLUDA documents publicly (its dark_api crate);
 * see pvdriver/cuapi/integrity.go for the integrity table's hash.
 *
 * Everything here is data: vg_tables lists each table with its served
 * slots; every other slot of a served table holds a refusal that names
 * the table and slot (with VGPUHA_DEBUG=1) and returns
 * CUDA_ERROR_NOT_SUPPORTED, so no slot is ever a null pointer and none
 * succeeds without doing its work. An id no row names is answered
 * CUDA_ERROR_NOT_FOUND, as NVIDIA's driver answers ids it does not know. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "vgcuda.h"
#include "_cgo_export.h"
#include "runtime.h"

#define VG_MAX_SLOTS 96

/* vg_debug_enabled is VGPUHA_DEBUG's level: 1 names refused calls, 2 also
 * every cuGetProcAddress lookup. */
int vg_debug_enabled(void) {
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("VGPUHA_DEBUG");
		v = e != NULL && (e[0] == '1' || e[0] == '2') && e[1] == 0 ? e[0] - '0' : 0;
	}
	return v;
}

CUresult vg_traced(const char *fn, CUresult r) {
	if (r != CUDA_SUCCESS && vg_debug_enabled() > 1) fprintf(stderr, "vgpuha libcuda: %s: error %d\n", fn, r);
	return r;
}

/* ---- Runtime interface {6bd5fb6c-5bf4-e74a-8987-d93912fd9df9}. ---- */

/* __fatBinC_Wrapper_t (fatbinary_section.h): the runtime hands modules
 * over as these; data points at the fatbin. */
struct vg_fatbin_wrapper { int magic; int version; const void *data; const void *filename_or_fatbins; };
enum { VG_FATBIN_WRAPPER_MAGIC = 0x466243b1 };

static CUresult vg_module_from_wrapper(CUmodule *m, const struct vg_fatbin_wrapper *w) {
	if (m == NULL || w == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (w->magic != VG_FATBIN_WRAPPER_MAGIC || w->data == NULL) return CUDA_ERROR_INVALID_IMAGE;
	return vgModuleLoadData((uintptr_t *)m, (void *)w->data);
}
static CUresult rt_module_from_wrapper(CUmodule *m, const struct vg_fatbin_wrapper *w) { return vg_module_from_wrapper(m, w); }
static CUresult rt_primary_context(CUcontext *pctx, CUdevice dev) { return vgPrimaryCtxRetain((uintptr_t *)pctx, dev); }
/* The extended forms carry two pointers and a word the runtime sets for
 * modules it links itself; they are not read here. */
static CUresult rt_module_from_wrapper_ext(CUmodule *m, const struct vg_fatbin_wrapper *w, void *a3, void *a4, unsigned a5) {
	(void)a3, (void)a4, (void)a5;
	return vg_module_from_wrapper(m, w);
}
static CUresult rt_module_from_fatbin_ext(const void *fatbin, CUmodule *m, void *a3, void *a4, unsigned a5) {
	(void)a3, (void)a4, (void)a5;
	if (m == NULL || fatbin == NULL) return CUDA_ERROR_INVALID_VALUE;
	return vgModuleLoadData((uintptr_t *)m, (void *)fatbin);
}
static CUresult rt_slot7(size_t arg) { (void)arg; return CUDA_SUCCESS; }

/* ---- Tools runtime callback hooks {a094798c-2e74-2e74-93f2-0800200c0a66}:
 * two buffers the runtime owns for its tools; this driver calls no tools,
 * so they stay as the runtime writes them. ---- */
static uintptr_t vg_hooks_buffer1[1024];
static uintptr_t vg_hooks_buffer2[16];
static void hooks_buffer1(void **p, size_t *n) { if (p) *p = vg_hooks_buffer1; if (n) *n = 1024; }
static void hooks_buffer2(void **p, size_t *n) { if (p) *p = vg_hooks_buffer2; if (n) *n = 14; }

/* ---- Tools thread-local state {42d85a81-23f6-cb47-8298-f6e78a3aecdc}:
 * slot 2 hands out the calling thread's record of an attached tool
 * (a profiler); no tool attaches to this driver, so there is none. ---- */
static CUresult tools_tls_record(void **record) {
	if (record == NULL) return CUDA_ERROR_INVALID_VALUE;
	*record = NULL;
	return CUDA_SUCCESS;
}

/* ---- Context-local storage {c693336e-1121-df11-a8c3-68f355d89593}: a
 * value per (context, key) with a destructor run when the context goes
 * (vg_cls_drop, from cuCtxDestroy and the primary context's reset). ---- */
struct vg_cls { uintptr_t ctx; void *key, *value; void (*dtor)(CUcontext, void *, void *); };
static struct vg_cls *vg_cls;
static size_t vg_cls_n, vg_cls_cap;
static pthread_mutex_t vg_cls_mu = PTHREAD_MUTEX_INITIALIZER;

/* vg_cls_find returns the entry of (ctx, key), or NULL. Precondition: vg_cls_mu locked. */
static struct vg_cls *vg_cls_find(uintptr_t ctx, void *key) {
	size_t i;
	for (i = 0; i < vg_cls_n; i++)
		if (vg_cls[i].ctx == ctx && vg_cls[i].key == key) return &vg_cls[i];
	return NULL;
}

static CUresult cls_put(CUcontext c, void *key, void *value, void (*dtor)(CUcontext, void *, void *)) {
	uintptr_t ctx;
	struct vg_cls *e;
	CUresult r = vg_ans_ctx_live((uintptr_t)c, &ctx);
	if (r != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&vg_cls_mu);
	if ((e = vg_cls_find(ctx, key)) == NULL) {
		if (vg_cls_n == vg_cls_cap) {
			size_t cap = vg_cls_cap ? 2 * vg_cls_cap : 16;
			struct vg_cls *grown = realloc(vg_cls, cap * sizeof *grown);
			if (grown == NULL) { pthread_mutex_unlock(&vg_cls_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
			vg_cls = grown;
			vg_cls_cap = cap;
		}
		e = &vg_cls[vg_cls_n++];
	}
	e->ctx = ctx, e->key = key, e->value = value, e->dtor = dtor;
	pthread_mutex_unlock(&vg_cls_mu);
	return CUDA_SUCCESS;
}

static CUresult cls_delete(CUcontext c, void *key) {
	uintptr_t ctx;
	struct vg_cls *e;
	CUresult r = vg_ans_ctx_live((uintptr_t)c, &ctx);
	if (r != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&vg_cls_mu);
	if ((e = vg_cls_find(ctx, key)) != NULL) *e = vg_cls[--vg_cls_n];
	pthread_mutex_unlock(&vg_cls_mu);
	return CUDA_SUCCESS;
}

static CUresult cls_get(void **value, CUcontext c, void *key) {
	uintptr_t ctx;
	struct vg_cls *e;
	CUresult r;
	if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
	if ((r = vg_ans_ctx_live((uintptr_t)c, &ctx)) != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&vg_cls_mu);
	e = vg_cls_find(ctx, key);
	if (e != NULL) *value = e->value;
	pthread_mutex_unlock(&vg_cls_mu);
	return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* vg_cls_drop runs and forgets the destructors of ctx's values, outside
 * the lock (a destructor may call back into the driver). */
void vg_cls_drop(uintptr_t ctx) {
	for (;;) {
		struct vg_cls e;
		size_t i;
		int found = 0;
		pthread_mutex_lock(&vg_cls_mu);
		for (i = 0; i < vg_cls_n && !found; i++)
			if (vg_cls[i].ctx == ctx) e = vg_cls[i], vg_cls[i] = vg_cls[--vg_cls_n], found = 1;
		pthread_mutex_unlock(&vg_cls_mu);
		if (!found) return;
		if (e.dtor) e.dtor((CUcontext)e.ctx, e.key, e.value);
	}
}

/* ---- Context checks {263e8860-7cd2-6143-92f6-bbd5006dfa7e}: flags the
 * runtime tests on a context; NVIDIA's driver sets none of them for an
 * ordinary context. ---- */
static CUresult checks_context(CUcontext c, unsigned *flags, const void **extra) {
	(void)c, (void)extra;
	if (flags) *flags = 0;
	return CUDA_SUCCESS;
}
static unsigned checks_slot3(void) { return 0; }

/* ---- Context creation bypass {0ca50b8c-1004-929a-89a7-d0df10e77286}. ---- */
static CUresult bypass_ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev) { return vgCtxCreate((uintptr_t *)pctx, flags, dev, 0); }

/* ---- Tools' view of contexts {21318c60-9714-3248-8ca6-41ff7324c8f2}. ---- */
static CUresult tools_ctx_device(CUcontext c, CUdevice *dev) {
	uintptr_t ctx;
	CUresult r = dev ? vg_ans_ctx_live((uintptr_t)c, &ctx) : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) *dev = 0; /* one device per session */
	return r;
}
/* Slot 51 takes (context, handle, out) and writes a pointer to a record
 * about the context; cuBLASLt asks it for the current context (both
 * NULL) before it launches a GEMM. What the record holds is not public:
 * a zeroed one (as SCUDA serves it) lets cuBLASLt go on, and its GEMMs
 * then print what they print natively (scripts/gpu-runtime.sh). */
static uint64_t vg_tools_ctx_record[64];
static CUresult tools_ctx_record(CUcontext c, void *handle, void **record) {
	uintptr_t ctx;
	CUresult r = record ? vg_ans_ctx_live((uintptr_t)c, &ctx) : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && handle == (void *)UINTPTR_MAX) r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS) *record = vg_tools_ctx_record;
	return r;
}
/* Slot 39 takes (context, handle, out) and writes a word that is 0 for an
 * ordinary context, as SCUDA observed; no tool state exists here. */
static CUresult tools_ctx_word(CUcontext c, void *handle, unsigned long long *word) {
	uintptr_t ctx;
	CUresult r = handle && word ? vg_ans_ctx_live((uintptr_t)c, &ctx) : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) *word = 0;
	return r;
}
static CUresult tools_ctx_number(CUcontext c, unsigned long long *n) {
	uintptr_t ctx;
	CUresult r = n ? vg_ans_ctx_live((uintptr_t)c, &ctx) : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) *n = ctx;
	return r;
}

/* ---- Integrity {d4082055-bde6-704b-8d34-ba123c66e1f2}. ---- */
static CUresult integrity_answer(unsigned version, unsigned long long unix_seconds, unsigned char *answer);

/* ---- The tables. ---- */
struct vg_slot { int index; void *fn; };
struct vg_table {
	const char *name;
	unsigned char id[16];
	int len;                    /* slots */
	int sized;                  /* slot 0 holds the table's size in bytes */
	struct vg_slot served[8];   /* slots served: functions, or sizes the caller reads; the first empty entry ends the list */
	void *slots[VG_MAX_SLOTS];  /* built at first use */
};

static struct vg_table vg_tables[] = {
	{"runtime-interface", {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}, 10, 1,
	 {{1, (void *)rt_module_from_wrapper}, {2, (void *)rt_primary_context}, {6, (void *)rt_module_from_wrapper_ext},
	  {7, (void *)rt_slot7}, {8, (void *)rt_module_from_fatbin_ext}}},
	{"tools-tls", {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}, 4, 1,
	 {{2, (void *)tools_tls_record}}},
	{"tools-callback-hooks", {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}, 7, 1,
	 {{2, (void *)hooks_buffer1}, {6, (void *)hooks_buffer2}}},
	{"context-local-storage", {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}, 4, 0,
	 {{0, (void *)cls_put}, {1, (void *)cls_delete}, {2, (void *)cls_get}}},
	{"context-checks", {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}, 4, 1,
	 {{2, (void *)checks_context}, {3, (void *)checks_slot3}}},
	{"context-create-bypass", {0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7, 0x72, 0x86}, 2, 1,
	 {{1, (void *)bypass_ctx_create}}},
	{"integrity", {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}, 3, 1,
	 {{1, (void *)integrity_answer}}},
	/* Opened by cuBLAS, which fails to initialise without it; no slot of it
	 * is known to be called. Its 16 slots hold sizes at 0, 4, 6, 10 and 14,
	 * as NVIDIA's driver 580 lays it out; every other slot is a refusal. */
	{"cublas-support", {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9}, 16, 0,
	 {{0, (void *)0x18}, {4, (void *)0x10}, {6, (void *)0x20}, {10, (void *)0x10}, {14, (void *)0x38}}},
	/* The tools' view of contexts, asked by cuBLASLt when it picks a GEMM
	 * kernel: 95 slots as NVIDIA's driver 595 serves it; slots 3 and 4 give
	 * a context's device and its number (cuCtxGetId's), 51 a record about
	 * a context (below), the rest refuse. */
	{"tools-context", {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}, 95, 1,
	 {{3, (void *)tools_ctx_device}, {4, (void *)tools_ctx_number}, {39, (void *)tools_ctx_word}, {51, (void *)tools_ctx_record}}},
	/* Asked by cuBLASLt's matmul heuristics (cublasLtMatmulAlgoGetHeuristic)
	 * for bf16/fp16 GEMMs; refused outright, cuBLASLt crashes. NVIDIA's
	 * driver 580 serves 17 slots (slot 0: 0x88 bytes). Traced there
	 * (scripts/exporttrace), cuBLASLt calls two: slot 4 (two out-pointers,
	 * then the table itself or 1, a count, a pointer) fills two objects,
	 * and slot 13 (those objects, a length, a round count, a pointer)
	 * transforms them; what they compute is not public. Every slot here
	 * refuses, which cuBLASLt is expected to treat as "this help is not
	 * available" (scripts/gpu-frameworks.sh shows whether it does). */
	{"cublaslt-heuristics", {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca}, 17, 1, {{0, 0}}},
};
enum { VG_NTABLES = sizeof vg_tables / sizeof vg_tables[0] };

/* A refusal per (table, slot): the slot's number is in its name. */
static CUresult vg_refuse(int table, int slot) {
	if (vg_debug_enabled())
		fprintf(stderr, "vgpuha libcuda: export table %s slot %d is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", vg_tables[table].name, slot);
	return CUDA_ERROR_NOT_SUPPORTED;
}
#define SLOTS(t) \
	R(t, 0) R(t, 1) R(t, 2) R(t, 3) R(t, 4) R(t, 5) R(t, 6) R(t, 7) R(t, 8) R(t, 9) R(t, 10) R(t, 11) \
	R(t, 12) R(t, 13) R(t, 14) R(t, 15) R(t, 16) R(t, 17) R(t, 18) R(t, 19) R(t, 20) R(t, 21) R(t, 22) R(t, 23) \
	R(t, 24) R(t, 25) R(t, 26) R(t, 27) R(t, 28) R(t, 29) R(t, 30) R(t, 31) R(t, 32) R(t, 33) R(t, 34) R(t, 35) \
	R(t, 36) R(t, 37) R(t, 38) R(t, 39) R(t, 40) R(t, 41) R(t, 42) R(t, 43) R(t, 44) R(t, 45) R(t, 46) R(t, 47) \
	R(t, 48) R(t, 49) R(t, 50) R(t, 51) R(t, 52) R(t, 53) R(t, 54) R(t, 55) R(t, 56) R(t, 57) R(t, 58) R(t, 59) \
	R(t, 60) R(t, 61) R(t, 62) R(t, 63) R(t, 64) R(t, 65) R(t, 66) R(t, 67) R(t, 68) R(t, 69) R(t, 70) R(t, 71) \
	R(t, 72) R(t, 73) R(t, 74) R(t, 75) R(t, 76) R(t, 77) R(t, 78) R(t, 79) R(t, 80) R(t, 81) R(t, 82) R(t, 83) \
	R(t, 84) R(t, 85) R(t, 86) R(t, 87) R(t, 88) R(t, 89) R(t, 90) R(t, 91) R(t, 92) R(t, 93) R(t, 94) R(t, 95)
#define R(t, s) static CUresult vg_refuse_##t##_##s(void) { return vg_refuse(t, s); }
SLOTS(0) SLOTS(1) SLOTS(2) SLOTS(3) SLOTS(4) SLOTS(5) SLOTS(6) SLOTS(7) SLOTS(8) SLOTS(9)
#undef R
#define R(t, s) (void *)vg_refuse_##t##_##s,
static void *const vg_refusals[][VG_MAX_SLOTS] = {{SLOTS(0)}, {SLOTS(1)}, {SLOTS(2)}, {SLOTS(3)}, {SLOTS(4)}, {SLOTS(5)}, {SLOTS(6)}, {SLOTS(7)}, {SLOTS(8)}, {SLOTS(9)}};
#undef R
#undef SLOTS
_Static_assert(sizeof vg_refusals / sizeof vg_refusals[0] == VG_NTABLES, "a refusal row per table");

static pthread_once_t vg_tables_once = PTHREAD_ONCE_INIT;
static void vg_build_tables(void) {
	int t, i;
	for (t = 0; t < VG_NTABLES; t++) {
		struct vg_table *tab = &vg_tables[t];
		for (i = 0; i < tab->len; i++) tab->slots[i] = vg_refusals[t][i];
		if (tab->sized) tab->slots[0] = (void *)(uintptr_t)(tab->len * sizeof(void *));
		for (i = 0; i < 8 && (tab->served[i].fn != NULL); i++) tab->slots[tab->served[i].index] = tab->served[i].fn;
	}
}

static struct vg_table *vg_table_named(const char *name) {
	int t;
	for (t = 0; t < VG_NTABLES; t++)
		if (strcmp(vg_tables[t].name, name) == 0) return &vg_tables[t];
	return NULL;
}

CUresult cuGetExportTable(const void **table, const CUuuid *id) {
	int t;
	if (table == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&vg_tables_once, vg_build_tables);
	for (t = 0; t < VG_NTABLES; t++) {
		if (memcmp(vg_tables[t].id, id->bytes, 16) == 0) {
			if (vg_debug_enabled() > 1) fprintf(stderr, "vgpuha libcuda: cuGetExportTable: %s\n", vg_tables[t].name);
			*table = vg_tables[t].slots;
			return CUDA_SUCCESS;
		}
	}
	if (vg_debug_enabled()) {
		const unsigned char *b = (const unsigned char *)id->bytes;
		fprintf(stderr, "vgpuha libcuda: cuGetExportTable: no table %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x (CUDA_ERROR_NOT_FOUND)\n",
			b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	}
	*table = NULL;
	return CUDA_ERROR_NOT_FOUND;
}

/* integrity_answer writes the 16 bytes the runtime checks (integrity.go):
 * they cover this process and thread and where the tables and this very
 * function lie. */
static CUresult integrity_answer(unsigned version, unsigned long long unix_seconds, unsigned char *answer) {
	struct vg_table *rt = vg_table_named("runtime-interface"), *it = vg_table_named("integrity");
	CUresult r = vgIntegrityAnswer(version, unix_seconds, (unsigned)getpid(), (unsigned)(uintptr_t)pthread_self(),
		(uintptr_t)rt->slots, (uintptr_t)it->slots, (uintptr_t)it->slots[1], answer);
	if (vg_debug_enabled() > 1) fprintf(stderr, "vgpuha libcuda: integrity check for runtime %u: %d\n", version, r);
	return r;
}
