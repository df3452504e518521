/*
 * Matrix products of the cuda backend through cuBLASLt: bf16 inputs,
 * fp32 accumulation, bf16 or fp32 outputs, with the bias, GELU and
 * bias-gradient epilogues that save separate passes over the outputs.
 * Private to executor/cuda and its GPU tests.
 *
 * Everything here is column-major, as cuBLASLt sees it: a row-major
 * R x C matrix of the model is a column-major C x R one with leading
 * dimension C. model_cuda.c does that translation once per product.
 */
#ifndef PARTITA_EXECUTOR_CUDA_GEMM_H
#define PARTITA_EXECUTOR_CUDA_GEMM_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "common/common.h"
#include "executor/cuda/cuda_ops.h"

/* What the product does to its result besides alpha A B + beta C. */
typedef enum gemm_epilogue {
    GEMM_PLAIN,
    GEMM_BIAS,            /* + bias[row] (bias of d's type) */
    GEMM_GELU_AUX_BIAS,   /* gelu(. + bias), pre-activation to aux (bf16) */
    GEMM_DGELU,           /* . x gelu'(aux) */
    GEMM_DGELU_BGRAD,     /* . x gelu'(aux); bias = row sums (fp32, WRITES) */
    GEMM_BGRADB           /* bias = sums of op(B) over k (fp32, WRITES) */
} gemm_epilogue;

/* One product D (m x n) = alpha op(A) op(B) + beta C, column-major. A and
 * B are bf16; C (when beta != 0) has D's type and layout. */
typedef struct gemm_call {
    bool transpose_a;
    bool transpose_b;
    int m, n, k;
    const pt_bf16 *a;
    int lda;
    const pt_bf16 *b;
    int ldb;
    void *d;
    int ldd;
    bool d_fp32;          /* D (and C) fp32, else bf16 */
    const void *c;        /* NULL: C is D itself */
    float alpha;
    float beta;
    gemm_epilogue epilogue;
    void *bias;           /* see gemm_epilogue */
    pt_bf16 *aux;         /* GELU epilogues: m x n pre-activations */
    int ld_aux;
    int sm_count;         /* SMs the product may take (cuBLASLt's
                             target: the rest left to a collective
                             beside it); 0: every SM */
} gemm_call;

/* A cuBLASLt handle, its workspace and the algorithms already chosen
 * (looked up once per distinct product shape, then reused). */
typedef struct gemm_context gemm_context;

int gemm_context_create(gemm_context **out, pt_error *err);
void gemm_context_destroy(gemm_context *context);
/* Device bytes the context holds (its workspace). */
size_t gemm_context_bytes(const gemm_context *context);
/* The same before a context exists: what gemm_context_create will
 * cudaMalloc (callers count it against a memory cap first). */
size_t gemm_workspace_bytes(void);

/* Whether cuBLASLt has an algorithm for this product (same shapes,
 * epilogue and pointer alignment); the answer is cached. */
bool gemm_supported(gemm_context *context, const gemm_call *call);
int gemm_run(gemm_context *context, const gemm_call *call,
             cudaStream_t stream, pt_error *err);

#endif
