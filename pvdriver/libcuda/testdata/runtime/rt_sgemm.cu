// cuBLAS SGEMM (and a cuBLASLt matmul) as an ordinary program calls them.
// Prints a checksum and a few entries of each product; the output must be
// the same natively and through vgpuha's libcuda.so.1.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "check.h"
#include <cublas_v2.h>
#include <cublasLt.h>

#define BLAS(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
	fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

static void report(const char *what, const std::vector<float> &c, int n) {
	double sum = 0;
	for (float v : c) sum += v;
	printf("%s: n=%d sum=%.6e c[0]=%.6e c[mid]=%.6e c[last]=%.6e\n", what, n, sum, c[0], c[c.size() / 2], c.back());
}

int main() {
	const int n = 512;
	std::vector<float> ha(n * n), hb(n * n), hc(n * n);
	for (int i = 0; i < n * n; i++) ha[i] = (float)((i * 7) % 13) / 13.0f - 0.5f, hb[i] = (float)((i * 11) % 17) / 17.0f - 0.5f;
	float *a, *b, *c;
	CHECK(cudaMalloc(&a, n * n * sizeof(float)));
	CHECK(cudaMalloc(&b, n * n * sizeof(float)));
	CHECK(cudaMalloc(&c, n * n * sizeof(float)));
	CHECK(cudaMemcpy(a, ha.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(b, hb.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
	cublasHandle_t h;
	BLAS(cublasCreate(&h));
	const float one = 1.0f, zero = 0.0f;
	BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n));
	CHECK(cudaMemcpy(hc.data(), c, n * n * sizeof(float), cudaMemcpyDeviceToHost));
	report("sgemm", hc, n);
	BLAS(cublasDestroy(h));

	cublasLtHandle_t lt;
	BLAS(cublasLtCreate(&lt));
	cublasLtMatmulDesc_t op;
	BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	cublasLtMatrixLayout_t la, lb, lc;
	BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, n, n));
	BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, n, n, n));
	BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, n, n));
	size_t wsBytes = 4 << 20;
	void *ws;
	CHECK(cudaMalloc(&ws, wsBytes));
	cublasLtMatmulPreference_t pref;
	BLAS(cublasLtMatmulPreferenceCreate(&pref));
	BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
	cublasLtMatmulHeuristicResult_t algo;
	int found = 0;
	BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &algo, &found));
	if (!found) { fprintf(stderr, "cublasLt: no algorithm\n"); return 1; }
	BLAS(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, c, lc, c, lc, &algo.algo, ws, wsBytes, 0));
	CHECK(cudaMemcpy(hc.data(), c, n * n * sizeof(float), cudaMemcpyDeviceToHost));
	report("cublasLt", hc, n);
	checkpoint();
	cublasLtMatmulPreferenceDestroy(pref);
	cublasLtMatrixLayoutDestroy(la);
	cublasLtMatrixLayoutDestroy(lb);
	cublasLtMatrixLayoutDestroy(lc);
	cublasLtMatmulDescDestroy(op);
	cublasLtDestroy(lt);
	CHECK(cudaFree(a));
	CHECK(cudaFree(b));
	CHECK(cudaFree(c));
	CHECK(cudaFree(ws));
	printf("rt_sgemm ok\n");
	return 0;
}
