/* A program that disables its threads' alternate signal stacks (as a new
 * thread's is, and as runtimes that manage their own may leave it) and
 * calls the driver from them while signals arrive: every call must work,
 * and no signal the library's runtime takes on such a thread may end the
 * process ("non-Go code disabled sigaltstack"). The thread's signal stack
 * must read as the program left it after every call. */
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include "cudaapi.h"

#define CALLS 400
#define BYTES (64 << 10)

static CUcontext ctx;
static CUdeviceptr buf;
static volatile int running;

/* calls makes CALLS copies through the library with the calling thread's
 * alternate signal stack disabled, and checks the last one's data. */
static void calls(const char *who, unsigned char seed) {
	static __thread unsigned char out[BYTES], in[BYTES];
	stack_t off = {.ss_flags = SS_DISABLE}, now;
	CHECK(cuCtxSetCurrent(ctx));
	if (sigaltstack(&off, NULL) != 0) FAIL("%s: sigaltstack", who);
	for (int i = 0; i < CALLS; i++) {
		memset(out, seed + i, sizeof out);
		CHECK(cuMemcpyHtoD(buf, out, sizeof out));
		CHECK(cuMemcpyDtoH(in, buf, sizeof in));
		if (memcmp(in, out, sizeof in) != 0) FAIL("%s: copy %d read back different bytes", who, i);
		if (sigaltstack(NULL, &now) != 0 || !(now.ss_flags & SS_DISABLE))
			FAIL("%s: call %d left the thread's signal stack changed (flags %d)", who, i, now.ss_flags);
	}
}

static void *worker(void *arg) {
	calls("worker", 7);
	running = 0;
	return arg;
}

/* storm runs a worker thread and sends it SIGURG (the signal Go's runtime
 * preempts with, so the library's runtime handles it) until it is done. */
static void storm(void) {
	pthread_t t;
	running = 1;
	if (pthread_create(&t, NULL, worker, NULL) != 0) FAIL("pthread_create");
	while (running) {
		pthread_kill(t, SIGURG);
		usleep(20);
	}
	pthread_join(t, NULL);
}

int main(void) {
	CUdevice dev;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuMemAlloc(&buf, BYTES));
	storm();
	calls("main", 3);
	checkpoint();
	storm();
	CHECK(cuMemFree(buf));
	CHECK(cuDevicePrimaryCtxRelease(dev));
	printf("sigstack ok: %d calls on threads without a signal stack, under SIGURG\n", 3 * CALLS);
	return 0;
}
