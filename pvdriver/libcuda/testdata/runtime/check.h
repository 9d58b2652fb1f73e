// What the runtime test programs share: CHECK fails the program naming the
// call and its error; checkpoint lets a test verify the standby's replica
// while the program still holds its memory (VGTEST_CHECKPOINT=1): it says
// "checkpoint" and waits for a line on stdin.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static void checkpoint() {
	if (!getenv("VGTEST_CHECKPOINT")) return;
	printf("checkpoint\n");
	fflush(stdout);
	getchar();
}
