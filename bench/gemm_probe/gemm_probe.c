/*
 * gemm_probe: every algorithm cuBLASLt's heuristic offers for one product
 * shape, each timed on the GPU, so a slow product (a head's 128k-column
 * logits, say) can be told apart as a poor first choice of the heuristic
 * or as the best this library does. The cuda backend (executor/cuda/
 * gemm.c) launches the heuristic's first algorithm; this tool says what
 * the others would give. Benchmark only: run by hand on a GPU machine.
 *
 * Usage: gemm_probe M N K OPA OPB D [BETA]
 *   column-major D (M x N) = op(A) op(B) (+ BETA D), A and B bf16, fp32
 *   accumulation; OPA, OPB: N or T; D: bf16 or fp32; BETA 0 (default)
 *   or 1. Prints one row per algorithm: its rank in the heuristic's list,
 *   the median of 20 timed launches (ms) and TFLOP/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define CANDIDATES 16
#define TIMED 20

#define CHECK(what, ok)                                                   \
    do {                                                                  \
        if (!(ok)) {                                                      \
            fprintf(stderr, "gemm_probe: %s failed (%s:%d)\n", what,     \
                    __FILE__, __LINE__);                                  \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Random bf16 values in [-1, 1) scaled down, written on the device as the
 * raw 16-bit patterns (the upper half of an fp32). */
static void *random_bf16(size_t count, unsigned seed)
{
    unsigned short *host = malloc(count * sizeof *host);
    CHECK("host allocation", host != NULL);
    for (size_t i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        float value = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 0.1f;
        unsigned bits;
        memcpy(&bits, &value, sizeof bits);
        host[i] = (unsigned short)(bits >> 16);
    }
    void *device = NULL;
    CHECK("cudaMalloc", cudaMalloc(&device, count * 2) == cudaSuccess);
    CHECK("upload", cudaMemcpy(device, host, count * 2,
                               cudaMemcpyHostToDevice) == cudaSuccess);
    free(host);
    return device;
}

static cublasOperation_t parse_op(const char *text)
{
    return text[0] == 'T' || text[0] == 't' ? CUBLAS_OP_T : CUBLAS_OP_N;
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: gemm_probe M N K OPA OPB bf16|fp32 [BETA]\n");
        return 2;
    }
    long m = atol(argv[1]), n = atol(argv[2]), k = atol(argv[3]);
    cublasOperation_t op_a = parse_op(argv[4]), op_b = parse_op(argv[5]);
    int d_fp32 = strcmp(argv[6], "fp32") == 0;
    float alpha = 1.0f, beta = argc > 7 ? (float)atof(argv[7]) : 0.0f;
    cudaDataType_t d_type = d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    long a_rows = op_a == CUBLAS_OP_N ? m : k, a_cols = op_a == CUBLAS_OP_N ? k : m;
    long b_rows = op_b == CUBLAS_OP_N ? k : n, b_cols = op_b == CUBLAS_OP_N ? n : k;
    void *a = random_bf16((size_t)a_rows * a_cols, 1);
    void *b = random_bf16((size_t)b_rows * b_cols, 2);
    void *d = NULL, *workspace = NULL;
    size_t workspace_bytes = (size_t)32 << 20;
    CHECK("cudaMalloc D", cudaMalloc(&d, (size_t)m * n * (d_fp32 ? 4 : 2)) == cudaSuccess);
    CHECK("cudaMemset D", cudaMemset(d, 0, (size_t)m * n * (d_fp32 ? 4 : 2)) == cudaSuccess);
    CHECK("cudaMalloc workspace", cudaMalloc(&workspace, workspace_bytes) == cudaSuccess);

    cublasLtHandle_t handle;
    CHECK("cublasLtCreate", cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t desc;
    CHECK("desc", cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, (uint64_t)a_rows, (uint64_t)a_cols, a_rows);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, (uint64_t)b_rows, (uint64_t)b_cols, b_rows);
    cublasLtMatrixLayoutCreate(&ld, d_type, (uint64_t)m, (uint64_t)n, m);
    cublasLtMatmulPreference_t preference;
    cublasLtMatmulPreferenceCreate(&preference);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof workspace_bytes);
    cublasLtMatmulHeuristicResult_t results[CANDIDATES];
    int found = 0;
    CHECK("heuristic", cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, preference,
                                                      CANDIDATES, results, &found) == CUBLAS_STATUS_SUCCESS);
    double flops = 2.0 * (double)m * (double)n * (double)k;
    printf("# D (%ld x %ld) = op%s(A) op%s(B), K %ld, D %s, beta %g: %d algorithms\n", m, n,
           argv[4], argv[5], k, argv[6], beta, found);
    printf("# rank  median ms  TFLOP/s\n");
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < found; i++) {
        float times[TIMED];
        int failed = 0;
        for (int r = -3; r < TIMED && !failed; r++) {
            cudaEventRecord(start, 0);
            failed = cublasLtMatmul(handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                                    &results[i].algo, workspace, workspace_bytes, 0) !=
                     CUBLAS_STATUS_SUCCESS;
            cudaEventRecord(stop, 0);
            cudaEventSynchronize(stop);
            if (r >= 0)
                cudaEventElapsedTime(&times[r], start, stop);
        }
        if (failed) {
            printf("%6d  failed\n", i);
            continue;
        }
        qsort(times, TIMED, sizeof times[0], compare_floats);
        float median = times[TIMED / 2];
        printf("%6d  %9.3f  %7.1f\n", i, median, flops / (median * 1e-3) / 1e12);
    }
    return 0;
}
