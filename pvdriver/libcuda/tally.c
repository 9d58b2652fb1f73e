/* The library's entry tally (VGPUHA_STATS=1): how many times the program
 * called each Go entry of the library and the wall time it spent inside,
 * counted in sigstack.c's crosscall2 wrapper, which every call into Go
 * passes. Calls the library answers itself (most queries) never show in
 * the request counts; this shows them, and a call that blocks (a wait for
 * a reply, a lock) shows its whole time. Keyed by the cgo entry's address,
 * which tally.go names; off, it costs one load and branch a call. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tally.h"

#define VG_TALLY_SLOTS 512 /* a power of two, far above the library's entries */

static struct {
	uintptr_t fn;
	uint64_t calls, nanos;
} vg_tally[VG_TALLY_SLOTS];

int vg_tally_on;

__attribute__((constructor)) static void vg_tally_init(void) {
	const char *s = getenv("VGPUHA_STATS"), *d = getenv("VGPUHA_DEBUG");
	vg_tally_on = (s != NULL && strcmp(s, "1") == 0) || (d != NULL && d[0] != 0);
}

uint64_t vg_tally_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* vg_tally_add counts one call of fn that began at start (vg_tally_now). */
void vg_tally_add(uintptr_t fn, uint64_t start) {
	uint64_t took = vg_tally_now() - start;
	unsigned i = (unsigned)(fn >> 4) & (VG_TALLY_SLOTS - 1);
	for (int n = 0; n < VG_TALLY_SLOTS; n++, i = (i + 1) & (VG_TALLY_SLOTS - 1)) {
		uintptr_t k = __atomic_load_n(&vg_tally[i].fn, __ATOMIC_ACQUIRE);
		if (k == 0) {
			uintptr_t zero = 0;
			if (!__atomic_compare_exchange_n(&vg_tally[i].fn, &zero, fn, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
				k = zero;
			else
				k = fn;
		}
		if (k == fn) {
			__atomic_add_fetch(&vg_tally[i].calls, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&vg_tally[i].nanos, took, __ATOMIC_RELAXED);
			return;
		}
	}
}

/* vg_tally_slot reads slot i: 0 when it is empty. */
int vg_tally_slot(int i, uintptr_t *fn, uint64_t *calls, uint64_t *nanos) {
	if (i < 0 || i >= VG_TALLY_SLOTS || (*fn = __atomic_load_n(&vg_tally[i].fn, __ATOMIC_ACQUIRE)) == 0)
		return 0;
	*calls = __atomic_load_n(&vg_tally[i].calls, __ATOMIC_RELAXED);
	*nanos = __atomic_load_n(&vg_tally[i].nanos, __ATOMIC_RELAXED);
	return 1;
}

int vg_tally_slots(void) { return VG_TALLY_SLOTS; }
