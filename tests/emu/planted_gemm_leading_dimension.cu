// planted_gemm_leading_dimension.cu - C (3x2) = A (3x4) B (4x2) with
// cuBLAS, column-major: element (i, j) of A is A[i + j*lda], and lda is the
// number of ROWS (3). The bug passes the number of columns (4), as if A
// were row-major: cuBLAS accepts it (lda >= rows), reads the wrong numbers
// and runs past the end of A. The emulated cuBLAS checks every matrix's
// extent against its allocation.
#include <cublas_v2.h>

#include "planted.h"

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    const int m = 3, k = 4, n = 2;
    float a[m * k], b[k * n], c[m * n], want[m * n];
    for (int i = 0; i < m * k; i++) a[i] = (float)(i + 1);
    for (int i = 0; i < k * n; i++) b[i] = (float)(i % 3);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            want[i + j * m] = 0;
            for (int p = 0; p < k; p++) want[i + j * m] += a[i + p * m] * b[p + j * k];
        }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, sizeof a));
    CHECK(cudaMalloc(&db, sizeof b));
    CHECK(cudaMalloc(&dc, sizeof c));
    CHECK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    const float one = 1, zero = 0;
    int lda = fixed ? m : k;
    cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, lda, db, k, &zero, dc, m);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasSgemm: %s\n", cublasGetStatusString(st));
        return 1;
    }
    CHECK(cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < m * n; i++) wrong += c[i] != want[i];
    printf("%d of %d elements of C wrong\n", wrong, m * n);
    cublasDestroy(h);
    return wrong ? 1 : 0;
}
