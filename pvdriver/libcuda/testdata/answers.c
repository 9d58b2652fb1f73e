/* Answers the library keeps (answers.c: a context's device and liveness,
 * the primary context's state, a function's attributes and name) follow
 * every change: a set attribute reads back on this thread and another, an
 * unloaded function and a destroyed context stop answering, the primary
 * context's state follows retain, flags and release. */
#include <pthread.h>
#include "cudaapi.h"

#define MAX_DYNAMIC_SHARED 8 /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */

static CUfunction fn;
static CUcontext ctx;

/* attr_on_thread reads fn's dynamic shared memory limit on a new thread. */
static void *attr_thread(void *out) {
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuFuncGetAttribute((int *)out, MAX_DYNAMIC_SHARED, fn));
	return NULL;
}

static int attr_on_thread(void) {
	pthread_t t;
	int v = -1;
	if (pthread_create(&t, NULL, attr_thread, &v) != 0 || pthread_join(t, NULL) != 0) FAIL("pthread");
	return v;
}

static void expect_attr(int want) {
	int v = -1;
	CHECK(cuFuncGetAttribute(&v, MAX_DYNAMIC_SHARED, fn));
	if (v != want) FAIL("dynamic shared limit %d, want %d", v, want);
	if ((v = attr_on_thread()) != want) FAIL("dynamic shared limit on another thread %d, want %d", v, want);
}

int main(int argc, char **argv) {
	CUdevice dev;
	CUcontext other, primary;
	CUmodule mod;
	const char *name;
	int initial;
	unsigned flags;
	unsigned long long id;
	int active;
	if (argc < 2) FAIL("usage: answers KERNELDIR");
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
	if (active) FAIL("the primary context is active before any retain");
	CHECK(cuCtxCreate(&ctx, 0, dev));
	CHECK(cuModuleLoadData(&mod, load_image(argv[1], "vadd")));
	CHECK(cuModuleGetFunction(&fn, mod, "vadd"));
	CHECK(cuFuncGetAttribute(&initial, MAX_DYNAMIC_SHARED, fn));
	for (int i = 0; i < 3; i++) { /* asked again and again, as frameworks do */
		CHECK(cuFuncGetName(&name, fn));
		if (strcmp(name, "vadd") != 0) FAIL("name %s", name);
		expect_attr(initial);
	}
	CHECK(cuFuncSetAttribute(fn, MAX_DYNAMIC_SHARED, 1024));
	expect_attr(1024);
	CHECK(cuFuncSetAttribute(fn, MAX_DYNAMIC_SHARED, 1024)); /* the value it has */
	expect_attr(1024);
	EXPECT(CUDA_ERROR_INVALID_VALUE, cuFuncSetAttribute(fn, MAX_DYNAMIC_SHARED, -5));
	expect_attr(1024);
	CHECK(cuFuncSetAttribute(fn, MAX_DYNAMIC_SHARED, initial));
	expect_attr(initial);
	checkpoint();
	CHECK(cuModuleUnload(mod));
	if (!native()) { /* a function of an unloaded module is undefined there */
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuFuncGetName(&name, fn));
		int v;
		EXPECT(CUDA_ERROR_INVALID_HANDLE, cuFuncGetAttribute(&v, MAX_DYNAMIC_SHARED, fn));
	}
	/* Contexts: the device and the id answer while the context lives. */
	CHECK(cuCtxCreate(&other, 0, dev));
	for (int i = 0; i < 3; i++) {
		CUdevice d = -1;
		CHECK(cuCtxGetDevice(&d));
		if (d != dev) FAIL("device %d, want %d", d, dev);
		CHECK(cuCtxGetId(other, &id));
	}
	CHECK(cuCtxDestroy(other));
	if (cuCtxGetId(other, &id) == CUDA_SUCCESS) FAIL("a destroyed context has an id");
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuCtxGetId(NULL, &id));
	/* The primary context's state follows retain, flags and release. */
	CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
	CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
	if (!active || flags != 0) FAIL("retained primary: active %d flags %u", active, flags);
	CHECK(cuDevicePrimaryCtxSetFlags_v2(dev, 4)); /* CU_CTX_SCHED_BLOCKING_SYNC */
	CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
	if (!active || flags != 4) FAIL("flags set: active %d flags %u", active, flags);
	CHECK(cuDevicePrimaryCtxRelease(dev));
	CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
	if (active) FAIL("the primary context is active after its last release");
	CHECK(cuCtxDestroy(ctx));
	printf("answers ok\n");
	return 0;
}
