// first-touch-d2h: how long a 4 MiB device-to-host copy into ordinary
// (pageable) host memory takes when the buffer's pages were never written
// ("fresh") against one whose pages were ("touched"), at a page-aligned
// address and 40 bytes in (where a record's header puts the contents).
// Each buffer is read into twice: the second round finds every page there.
//
//   nvcc -O2 -o /tmp/first-touch-d2h scripts/first-touch-d2h.cu -lcuda && /tmp/first-touch-d2h
//
// Why the resync's read-ahead buffers are made and written when a sender
// is created (replicate/sender.go, newReadAheadBufs).
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define CHECK(call)                                                     \
	do {                                                                \
		CUresult r_ = (call);                                           \
		if (r_ != CUDA_SUCCESS) {                                       \
			fprintf(stderr, "%s failed: %d\n", #call, (int)r_);         \
			exit(1);                                                    \
		}                                                               \
	} while (0)

static double now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

enum { BUFS = 8, PAGE = 4096 };
static const size_t size = 4 << 20;

int main(void) {
	CUdevice dev;
	CUcontext ctx;
	CUstream stream;
	CUdeviceptr src;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
	CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
	CHECK(cuMemAlloc(&src, 2 * BUFS * size));
	CHECK(cuMemsetD8(src, 7, 2 * BUFS * size));
	CHECK(cuCtxSynchronize());
	const char *names[] = {"fresh", "touched", "fresh+40", "touched+40"};
	for (int mode = 0; mode < 4; mode++) {
		int touch = mode == 1 || mode == 3, off = mode >= 2 ? 40 : 0;
		char *bufs[BUFS];
		for (int i = 0; i < BUFS; i++) {
			// mmap: never-used pages (malloc may hand back freed ones).
			bufs[i] = (char *)mmap(NULL, size + 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (bufs[i] == MAP_FAILED) {
				perror("mmap");
				return 1;
			}
			for (size_t p = 0; touch && p < size + 64; p += PAGE)
				bufs[i][p] = 1;
		}
		printf("%-10s ms:", names[mode]);
		for (int round = 0; round < 2; round++) {
			for (int i = 0; i < BUFS; i++) {
				double t = now_ms();
				CHECK(cuMemcpyDtoHAsync(bufs[i] + off, src + (size_t)(round * BUFS + i) * size, size, stream));
				CHECK(cuStreamSynchronize(stream));
				printf(" %5.2f", now_ms() - t);
			}
			printf(round == 0 ? "  | again:" : "\n");
		}
		for (int i = 0; i < BUFS; i++)
			munmap(bufs[i], size + 64);
	}
	double t = now_ms();
	char *big = (char *)mmap(NULL, 64 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (big == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	for (size_t p = 0; p < (64 << 20); p += PAGE)
		big[p] = 1;
	printf("writing one byte a page of 64 MiB on the CPU: %.2f ms\n", now_ms() - t);
	munmap(big, 64 << 20);
	return 0;
}
