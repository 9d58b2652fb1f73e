/* Every call from the program into the library's Go runtime passes here
 * (cgo's crosscall2, wrapped at link time: main.go's -Wl,--wrap): a thread
 * whose alternate signal stack is disabled gets one for the call, and has
 * it disabled again after.
 *
 * Why: Go's runtime takes its signals on the alternate signal stack of the
 * thread (runtime/signal_unix.go, adjustSignalStack). A signal that
 * arrives while the thread runs Go code, on a goroutine's stack, with the
 * alternate stack disabled ends the process: "signal N received on
 * thread with no signal stack", "fatal error: non-Go code disabled
 * sigaltstack" (noSignalStack). Go installs a stack on a C thread when
 * the thread first calls in, and keeps the thread's runtime state from
 * call to call, but cannot know when the program disables the stack
 * between calls (a runtime managing its own stacks, a library restoring
 * the state it saw before Go's first call); the next signal during a call
 * (SIGURG, which Go's scheduler preempts with, SIGPROF, ...) then kills
 * the program: JAX's XLA did, after the driver refused VMM. Here the
 * thread has a valid stack whenever Go code runs on it, and the program
 * sees its own setting again once the call returns.
 *
 * Cost: one sigaltstack(2) per call, two more on a thread whose stack is
 * disabled. The stack is the thread's own (64 KiB, made on its first such
 * call, freed when it exits).
 *
 * With VGPUHA_STATS=1 the wrapper also counts each call and its time
 * (tally.c). */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include "tally.h"

#define VG_SIGSTACK_BYTES (64 << 10)

void __real_crosscall2(void (*fn)(void *), void *a, int c, size_t ctxt);
void __wrap_crosscall2(void (*fn)(void *), void *a, int c, size_t ctxt);

static pthread_key_t vg_sigstack_key;
static pthread_once_t vg_sigstack_once = PTHREAD_ONCE_INIT;
static __thread void *vg_sigstack;

static void vg_sigstack_key_make(void) { pthread_key_create(&vg_sigstack_key, free); }

/* vg_thread_sigstack is the calling thread's signal stack (NULL when none
 * can be made). */
static void *vg_thread_sigstack(void) {
	if (vg_sigstack == NULL && (vg_sigstack = malloc(VG_SIGSTACK_BYTES)) != NULL) {
		pthread_once(&vg_sigstack_once, vg_sigstack_key_make);
		pthread_setspecific(vg_sigstack_key, vg_sigstack);
	}
	return vg_sigstack;
}

void __wrap_crosscall2(void (*fn)(void *), void *a, int c, size_t ctxt) {
	stack_t now, lent = {.ss_size = VG_SIGSTACK_BYTES};
	int installed = 0;
	uint64_t start = vg_tally_on ? vg_tally_now() : 0;
	if (sigaltstack(NULL, &now) == 0 && (now.ss_flags & SS_DISABLE) && (lent.ss_sp = vg_thread_sigstack()) != NULL)
		installed = sigaltstack(&lent, NULL) == 0;
	__real_crosscall2(fn, a, c, ctxt);
	if (installed) {
		lent.ss_flags = SS_DISABLE;
		sigaltstack(&lent, NULL);
	}
	if (vg_tally_on)
		vg_tally_add((uintptr_t)fn, start);
}
