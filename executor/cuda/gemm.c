/*
 * cuBLASLt products for the cuda backend. A stage runs the same dozen
 * product shapes every micro-batch, so the descriptors and the algorithm
 * cuBLASLt's heuristic picks are made once per shape and kept in a small
 * table; a call then only sets its pointers and launches.
 */
#include "executor/cuda/gemm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "executor/cuda/cuda_check.h"

/* kernel_sizes.h: 32 MiB, what cuBLAS asks for on Hopper. */
#define GEMM_WORKSPACE_BYTES CUDA_GEMM_WORKSPACE_BYTES

/* Everything an algorithm choice depends on. Compared with memcmp, so
 * built with memset first. */
typedef struct gemm_key {
    int transpose_a, transpose_b;
    int m, n, k;
    int lda, ldb, ldd, ld_aux;
    int d_fp32, epilogue;
    int align_a, align_b, align_c, align_d;
    int sm_count;
} gemm_key;

/* Algorithms asked of the heuristic per shape: the first is used; the
 * others stand by for a launch that fails (below). */
#define GEMM_CANDIDATES 8

/* A product shape seen before: its descriptors and the heuristic's
 * algorithms, best first. */
typedef struct gemm_plan {
    gemm_key key;
    bool supported;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c;
    cublasLtMatmulAlgo_t algos[GEMM_CANDIDATES];
    int algo_count;
    int chosen;          /* the first algorithm that launched */
} gemm_plan;

struct gemm_context {
    cublasLtHandle_t handle;
    void *workspace;
    gemm_plan *plans;     /* owned */
    int plan_count;
    int plan_capacity;
};

int gemm_context_create(gemm_context **out, pt_error *err)
{
    *out = NULL;
    gemm_context *context = calloc(1, sizeof *context);
    if (context == NULL)
        return pt_fail(err, "cuda backend: out of host memory for the "
                            "cuBLASLt context");
    cublasStatus_t status = cublasLtCreate(&context->handle);
    if (status != CUBLAS_STATUS_SUCCESS) {
        free(context);
        return pt_fail(err, "cuda backend: cublasLtCreate failed at %s:%d: "
                            "%s",
                       __FILE__, __LINE__, cublasLtGetStatusString(status));
    }
    cudaError_t cuda_status =
        cudaMalloc(&context->workspace, GEMM_WORKSPACE_BYTES);
    if (cuda_status != cudaSuccess) {
        cublasLtDestroy(context->handle);
        free(context);
        return pt_fail(err, "cuda backend: cudaMalloc of the %u MiB cuBLASLt "
                            "workspace failed at %s:%d: %s",
                       GEMM_WORKSPACE_BYTES >> 20, __FILE__, __LINE__,
                       cudaGetErrorString(cuda_status));
    }
    *out = context;
    return 0;
}

static void plan_release(gemm_plan *plan)
{
    if (plan->layout_a != NULL)
        cublasLtMatrixLayoutDestroy(plan->layout_a);
    if (plan->layout_b != NULL)
        cublasLtMatrixLayoutDestroy(plan->layout_b);
    if (plan->layout_c != NULL)
        cublasLtMatrixLayoutDestroy(plan->layout_c);
    if (plan->desc != NULL)
        cublasLtMatmulDescDestroy(plan->desc);
}

void gemm_context_destroy(gemm_context *context)
{
    if (context == NULL)
        return;
    for (int i = 0; i < context->plan_count; i++)
        plan_release(&context->plans[i]);
    free(context->plans);
    cudaFree(context->workspace);
    cublasLtDestroy(context->handle);
    free(context);
}

size_t gemm_context_bytes(const gemm_context *context)
{
    (void)context;
    return GEMM_WORKSPACE_BYTES;
}

size_t gemm_workspace_bytes(void)
{
    return GEMM_WORKSPACE_BYTES;
}

/* The largest power of two up to 256 that divides the address. */
static int alignment_of(const void *pointer)
{
    uintptr_t address = (uintptr_t)pointer;
    int alignment = 256;
    while (alignment > 1 && address % (uintptr_t)alignment != 0)
        alignment /= 2;
    return alignment;
}

static gemm_key key_of(const gemm_call *call)
{
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.transpose_a = call->transpose_a;
    key.transpose_b = call->transpose_b;
    key.m = call->m;
    key.n = call->n;
    key.k = call->k;
    key.lda = call->lda;
    key.ldb = call->ldb;
    key.ldd = call->ldd;
    key.ld_aux = call->ld_aux;
    key.d_fp32 = call->d_fp32;
    key.epilogue = (int)call->epilogue;
    key.align_a = alignment_of(call->a);
    key.align_b = alignment_of(call->b);
    key.align_c = alignment_of(call->c != NULL ? call->c : call->d);
    key.align_d = alignment_of(call->d);
    key.sm_count = call->sm_count;
    return key;
}

static cublasLtEpilogue_t epilogue_of(gemm_epilogue epilogue)
{
    switch (epilogue) {
    case GEMM_PLAIN:
        return CUBLASLT_EPILOGUE_DEFAULT;
    case GEMM_BIAS:
        return CUBLASLT_EPILOGUE_BIAS;
    case GEMM_GELU_AUX_BIAS:
        return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GEMM_DGELU:
        return CUBLASLT_EPILOGUE_DGELU;
    case GEMM_DGELU_BGRAD:
        return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GEMM_BGRADB:
        return CUBLASLT_EPILOGUE_BGRADB;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

/* The descriptors of a new shape: the operation (transposes, epilogue
 * and its bias and aux types) and the three matrix layouts. */
static int plan_describe(gemm_plan *plan, const gemm_key *key, pt_error *err)
{
    cudaDataType_t d_type = key->d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasOperation_t op_a = key->transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = key->transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_TRY(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F,
                                        CUDA_R_32F));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    if (key->sm_count > 0) {
        int32_t sm_count = key->sm_count;
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_count,
            sizeof sm_count));
    }
    cublasLtEpilogue_t epilogue = epilogue_of((gemm_epilogue)key->epilogue);
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
        sizeof epilogue));
    if (key->epilogue == GEMM_DGELU_BGRAD || key->epilogue == GEMM_BGRADB) {
        cudaDataType_t bias_type = CUDA_R_32F;
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
            sizeof bias_type));
    }
    if (key->epilogue == GEMM_GELU_AUX_BIAS || key->epilogue == GEMM_DGELU ||
        key->epilogue == GEMM_DGELU_BGRAD) {
        int64_t ld_aux = key->ld_aux;
        cudaDataType_t aux_type = CUDA_R_16BF;
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux,
            sizeof ld_aux));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
            &aux_type, sizeof aux_type));
    }
    int a_rows = key->transpose_a ? key->k : key->m;
    int a_cols = key->transpose_a ? key->m : key->k;
    int b_rows = key->transpose_b ? key->n : key->k;
    int b_cols = key->transpose_b ? key->k : key->n;
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&plan->layout_a, CUDA_R_16BF,
                                          (uint64_t)a_rows, (uint64_t)a_cols,
                                          key->lda));
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&plan->layout_b, CUDA_R_16BF,
                                          (uint64_t)b_rows, (uint64_t)b_cols,
                                          key->ldb));
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&plan->layout_c, d_type,
                                          (uint64_t)key->m, (uint64_t)key->n,
                                          key->ldd));
    return 0;
}

/* Asks the heuristic for algorithms of a described plan (within the
 * workspace and the operands' alignments); plan->supported says whether
 * any came back. */
static int plan_choose_algorithms(gemm_context *context, gemm_plan *plan,
                                  pt_error *err)
{
    const gemm_key *key = &plan->key;
    cublasLtMatmulPreference_t preference = NULL;
    CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace = GEMM_WORKSPACE_BYTES;
    uint32_t alignments[4] = {(uint32_t)key->align_a, (uint32_t)key->align_b,
                              (uint32_t)key->align_c, (uint32_t)key->align_d};
    cublasLtMatmulPreferenceAttributes_t alignment_attributes[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    };
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
        sizeof workspace);
    for (int i = 0; i < 4 && status == CUBLAS_STATUS_SUCCESS; i++)
        status = cublasLtMatmulPreferenceSetAttribute(
            preference, alignment_attributes[i], &alignments[i],
            sizeof alignments[i]);
    cublasLtMatmulHeuristicResult_t results[GEMM_CANDIDATES];
    memset(results, 0, sizeof results);
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS) {
        cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
            context->handle, plan->desc, plan->layout_a, plan->layout_b,
            plan->layout_c, plan->layout_c, preference, GEMM_CANDIDATES,
            results, &found);
        /* "no algorithm" is an answer, not an error */
        if (heuristic != CUBLAS_STATUS_SUCCESS)
            found = 0;
    }
    cublasLtMatmulPreferenceDestroy(preference);
    CUBLAS_TRY(status);
    for (int i = 0; i < found; i++)
        if (results[i].state == CUBLAS_STATUS_SUCCESS)
            plan->algos[plan->algo_count++] = results[i].algo;
    plan->supported = plan->algo_count > 0;
    return 0;
}

/* Makes the descriptors of a new shape and asks the heuristic for an
 * algorithm; plan->supported says whether one came back. */
static int plan_build(gemm_context *context, gemm_plan *plan,
                      const gemm_key *key, pt_error *err)
{
    memset(plan, 0, sizeof *plan);
    plan->key = *key;
    if (plan_describe(plan, key, err) != 0)
        return -1;
    return plan_choose_algorithms(context, plan, err);
}

/* The plan of this call's shape, built on first sight; NULL on error. */
static gemm_plan *plan_for(gemm_context *context, const gemm_call *call,
                           pt_error *err)
{
    gemm_key key = key_of(call);
    for (int i = 0; i < context->plan_count; i++)
        if (memcmp(&context->plans[i].key, &key, sizeof key) == 0)
            return &context->plans[i];
    if (context->plan_count == context->plan_capacity) {
        int capacity = context->plan_capacity ? 2 * context->plan_capacity
                                              : 32;
        gemm_plan *plans =
            realloc(context->plans, (size_t)capacity * sizeof *plans);
        if (plans == NULL) {
            pt_fail(err, "cuda backend: out of host memory for %d cuBLASLt "
                         "plans",
                    capacity);
            return NULL;
        }
        context->plans = plans;
        context->plan_capacity = capacity;
    }
    gemm_plan *plan = &context->plans[context->plan_count];
    if (plan_build(context, plan, &key, err) != 0) {
        plan_release(plan);
        return NULL;
    }
    context->plan_count++;
    return plan;
}

bool gemm_supported(gemm_context *context, const gemm_call *call)
{
    pt_error ignored;
    gemm_plan *plan = plan_for(context, call, &ignored);
    return plan != NULL && plan->supported;
}

/* Launches the plan's chosen algorithm. In a CUDA green context of few
 * SMs the heuristic's best pick (made for the whole device) can fail to
 * launch (cuBLASLt says "the function failed to launch on the GPU"; seen
 * for tensor-parallel shards of GPT-2 1.5B on 24 SMs of an H200): then
 * the next algorithm of the heuristic's list is tried, and the first
 * that launches stays the plan's. A launch that failed did nothing. */
static int launch_first_that_runs(gemm_context *context, gemm_plan *plan,
                                  const gemm_call *call, cudaStream_t stream,
                                  pt_error *err)
{
    const void *c = call->c != NULL ? call->c : call->d;
    cublasStatus_t status = CUBLAS_STATUS_EXECUTION_FAILED;
    int tried = 0;
    for (; plan->chosen < plan->algo_count; plan->chosen++) {
        tried++;
        status = cublasLtMatmul(context->handle, plan->desc, &call->alpha,
                                call->a, plan->layout_a, call->b,
                                plan->layout_b, &call->beta, c,
                                plan->layout_c, call->d, plan->layout_c,
                                &plan->algos[plan->chosen], context->workspace,
                                GEMM_WORKSPACE_BYTES, stream);
        if (status != CUBLAS_STATUS_EXECUTION_FAILED)
            break;
        cudaGetLastError(); /* the failed launch's error, not sticky */
    }
    if (status == CUBLAS_STATUS_SUCCESS)
        return 0;
    if (plan->chosen >= plan->algo_count)
        plan->chosen = 0; /* a later call starts over */
    return pt_fail(err, "cuda backend: cublasLtMatmul of a %d x %d x %d "
                        "product failed at %s:%d: %s (%d algorithm%s of "
                        "cuBLASLt's heuristic tried)",
                   call->m, call->n, call->k, __FILE__, __LINE__,
                   cublasLtGetStatusString(status), tried,
                   tried == 1 ? "" : "s");
}

int gemm_run(gemm_context *context, const gemm_call *call,
             cudaStream_t stream, pt_error *err)
{
    gemm_plan *plan = plan_for(context, call, err);
    if (plan == NULL)
        return -1;
    if (!plan->supported)
        return pt_fail(err, "cuda backend: cuBLASLt has no algorithm for a "
                            "%d x %d x %d product (op %c%c, epilogue %d, "
                            "%s output)",
                       call->m, call->n, call->k,
                       call->transpose_a ? 'T' : 'N',
                       call->transpose_b ? 'T' : 'N', (int)call->epilogue,
                       call->d_fp32 ? "fp32" : "bf16");
    if (call->epilogue != GEMM_PLAIN && call->epilogue != GEMM_DGELU)
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call->bias,
            sizeof call->bias));
    if (call->epilogue == GEMM_GELU_AUX_BIAS ||
        call->epilogue == GEMM_DGELU || call->epilogue == GEMM_DGELU_BGRAD)
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
            &call->aux, sizeof call->aux));
    return launch_first_that_runs(context, plan, call, stream, err);
}
