/* exporttrace: a diagnostic libcuda.so.1 that sits in front of NVIDIA's
 * driver and logs how libraries use the driver's private export tables
 * (cuGetExportTable). Every documented entry point jumps straight to the
 * real driver (trampolines.c, generated from its symbol list by
 * scripts/gpu-exporttrace.sh); cuGetProcAddress hands out this file's
 * cuGetExportTable; each table named in EXPORTTRACE_TABLES (first 8 hex
 * digits of the id, comma separated, or "all") is copied and each of its
 * slots wrapped: the wrapper logs the caller's library, the slot and six
 * arguments, calls the real slot, and logs the result and the first words
 * each pointer argument then points at (read with process_vm_readv, which
 * never faults). EXPORTTRACE_REFUSE names tables to answer NOT_FOUND and
 * EXPORTTRACE_REFUSE_PROC entry-point prefixes (comma separated) for which
 * cuGetProcAddress answers "no such symbol", to see what callers do then.
 * A developer's tool: never shipped, never linked by the product. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

typedef int CUresult;
void *exporttrace_real;
static CUresult (*real_get)(const void **, const void *);
static CUresult (*real_gpa2)(const char *, void **, int, unsigned long long, int *);
static CUresult (*real_gpa1)(const char *, void **, int, unsigned long long);

#define MAXT 8
#define MAXS 128
typedef uintptr_t (*fn8)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);
static struct { unsigned char id[16]; void *real[MAXS]; void *copy[MAXS]; int n; } tabs[MAXT];
static int ntabs;

static void peek(uintptr_t p, char *out, size_t cap) {
	uint64_t w[4];
	struct iovec l = {w, sizeof w}, r = {(void *)p, sizeof w};
	out[0] = 0;
	if (p < 0x10000 || p > 0x7fffffffffffULL) return;
	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof w) return;
	snprintf(out, cap, "[%llx %llx %llx %llx]", (unsigned long long)w[0], (unsigned long long)w[1], (unsigned long long)w[2], (unsigned long long)w[3]);
}

uintptr_t exporttrace_traced(int t, int s, void *ret, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e, uintptr_t f, uintptr_t g, uintptr_t h) {
	Dl_info di;
	char pa[80], pb[80], pc[80], pd[80], pe[80], pf[80];
	const char *who = dladdr(ret, &di) && di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
	uintptr_t r;
	fprintf(stderr, "exporttrace: %02x%02x%02x%02x slot %d from %s (%lx %lx %lx %lx %lx %lx)\n", tabs[t].id[0], tabs[t].id[1], tabs[t].id[2], tabs[t].id[3], s,
		who ? who + 1 : "?", a, b, c, d, e, f);
	r = ((fn8)tabs[t].real[s])(a, b, c, d, e, f, g, h);
	peek(a, pa, sizeof pa), peek(b, pb, sizeof pb), peek(c, pc, sizeof pc), peek(d, pd, sizeof pd), peek(e, pe, sizeof pe), peek(f, pf, sizeof pf);
	fprintf(stderr, "exporttrace: %02x%02x%02x%02x slot %d -> %lx (a%s b%s c%s d%s e%s f%s)\n", tabs[t].id[0], tabs[t].id[1], tabs[t].id[2], tabs[t].id[3], s, r, pa, pb, pc, pd, pe, pf);
	return r;
}

/* w_T_S: the wrapper of table T's slot S, and wrappers[T][S] (gen.sh). */
#include "wrappers.h"

static int listed(const char *env, const unsigned char *id) {
	char hex[9];
	const char *v = getenv(env);
	if (v == NULL) return 0;
	if (strcmp(v, "all") == 0) return 1;
	snprintf(hex, sizeof hex, "%02x%02x%02x%02x", id[0], id[1], id[2], id[3]);
	return strstr(v, hex) != NULL;
}

CUresult cuGetExportTable(const void **table, const void *id) {
	const unsigned char *b = id;
	CUresult r;
	int t, i, n;
	if (listed("EXPORTTRACE_REFUSE", b)) {
		fprintf(stderr, "exporttrace: table %02x%02x%02x%02x refused\n", b[0], b[1], b[2], b[3]);
		return 500;
	}
	r = real_get(table, id);
	fprintf(stderr, "exporttrace: cuGetExportTable %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x -> %d, slot0 %lx\n", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15], r,
		r == 0 && *table ? (unsigned long)((void *const *)*table)[0] : 0UL);
	if (r != 0 || !listed("EXPORTTRACE_TABLES", b)) return r;
	for (t = 0; t < ntabs; t++)
		if (memcmp(tabs[t].id, b, 16) == 0) { *table = tabs[t].copy; return r; }
	if (ntabs == MAXT) return r;
	t = ntabs++;
	memcpy(tabs[t].id, b, 16);
	n = (int)(((uintptr_t *)*table)[0] / sizeof(void *));
	if (n <= 0 || n > MAXS) n = 40; /* no size in slot 0: a guess */
	tabs[t].n = n;
	for (i = 0; i < n; i++) {
		tabs[t].real[i] = ((void **)*table)[i];
		tabs[t].copy[i] = (i == 0 && ((uintptr_t *)*table)[0] < 0x10000) ? tabs[t].real[i] : wrappers[t][i];
	}
	fprintf(stderr, "exporttrace: tracing %d slots\n", n);
	*table = tabs[t].copy;
	return r;
}

static int refused_proc(const char *name) {
	const char *v = getenv("EXPORTTRACE_REFUSE_PROC"), *p;
	if (v == NULL || name == NULL) return 0;
	for (p = v; *p;) {
		size_t n = strcspn(p, ",");
		if (n && strncmp(name, p, n) == 0) return 1;
		p += n + (p[n] == ',');
	}
	return 0;
}

CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags);
/* ours returns the entry points this file defines itself, so that a caller
 * that looks up cuGetProcAddress through cuGetProcAddress stays here. */
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);
static void *ours(const char *sym, int ver) {
	if (sym == NULL) return NULL;
	if (strcmp(sym, "cuGetExportTable") == 0) return (void *)cuGetExportTable;
	if (strcmp(sym, "cuGetProcAddress") == 0) return ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
	return NULL;
}
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
	if (ours(sym, ver)) { *pfn = ours(sym, ver); if (status) *status = 1; return 0; }
	if (refused_proc(sym)) {
		fprintf(stderr, "exporttrace: cuGetProcAddress %s refused\n", sym);
		*pfn = NULL;
		if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
		return 500;
	}
	return real_gpa2(sym, pfn, ver, flags, status);
}
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
	if (ours(sym, ver)) { *pfn = ours(sym, ver); return 0; }
	if (refused_proc(sym)) { *pfn = NULL; return 500; }
	if (ver >= 12000) { int st; return cuGetProcAddress_v2(sym, pfn, ver, flags, &st); }
	return real_gpa1(sym, pfn, ver, flags);
}

void exporttrace_bind(void); /* trampolines.c */
__attribute__((constructor)) static void start(void) {
	const char *path = getenv("EXPORTTRACE_DRIVER");
	exporttrace_real = dlopen(path ? path : "/usr/lib/x86_64-linux-gnu/libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (exporttrace_real == NULL) { fprintf(stderr, "exporttrace: %s\n", dlerror()); _exit(111); }
	real_get = dlsym(exporttrace_real, "cuGetExportTable");
	real_gpa2 = dlsym(exporttrace_real, "cuGetProcAddress_v2");
	real_gpa1 = dlsym(exporttrace_real, "cuGetProcAddress");
	exporttrace_bind();
}
