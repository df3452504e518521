/*
 * Support for the GPU test programs of the cuda backend. These are plain
 * C programs, not cmocka suites (the GPU machines have no cmocka): each
 * check prints one PASS or FAIL line with its error and tolerance, and
 * the program exits 0 when all passed, 1 when one failed, 77 (skip) when
 * no GPU is visible.
 *
 * Errors are measured as the relative L2 error ||got - want|| / ||want||
 * (the METHOD of the lent GPUs: fp32 lands far under 1e-3, bf16 operands
 * between 1e-3 and 1e-2), with the largest absolute error printed beside
 * it; a NaN or infinity anywhere fails.
 */
#ifndef PARTITA_TESTS_GPU_TEST_H
#define PARTITA_TESTS_GPU_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "executor/cuda/buffers.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_ops.h"

#define GPU_TEST_SKIP 77

/* Stops the program on a failed CUDA call, naming it, file and line. */
#define GPU_CHECK(call)                                                      \
    do {                                                                     \
        cudaError_t gpu_status_ = (call);                                    \
        if (gpu_status_ != cudaSuccess) {                                    \
            printf("FAIL %s at %s:%d: %s\n", #call, __FILE__, __LINE__,      \
                   cudaGetErrorString(gpu_status_));                         \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* Stops the program when a Partita call returns non-zero. */
#define PT_CHECK(call, err)                                                  \
    do {                                                                     \
        if ((call) != 0) {                                                   \
            printf("FAIL %s at %s:%d: %s\n", #call, __FILE__, __LINE__,      \
                   (err)->message);                                          \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* Counts the checks of a program. */
typedef struct gpu_test_tally {
    int passed;
    int failed;
} gpu_test_tally;

static inline void gpu_test_require_device(const char *program)
{
    int devices = cuda_device_count();
    if (devices == 0) {
        printf("SKIP %s: no CUDA device is visible\n", program);
        exit(GPU_TEST_SKIP);
    }
    struct cudaDeviceProp properties;
    GPU_CHECK(cudaGetDeviceProperties(&properties, 0));
    printf("# %s on %s (sm_%d%d, %d SMs, %.1f GiB)\n", program,
           properties.name, properties.major, properties.minor,
           properties.multiProcessorCount,
           (double)properties.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

/* Compares got against want; prints the line and counts it. */
static inline bool gpu_test_compare(gpu_test_tally *tally, const char *name,
                                    const float *got, const float *want,
                                    size_t count, double tolerance)
{
    double diff_square = 0.0, want_square = 0.0, max_abs = 0.0;
    bool finite = true;
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i])) {
            finite = false;
            break;
        }
        double diff = (double)got[i] - (double)want[i];
        diff_square += diff * diff;
        want_square += (double)want[i] * want[i];
        if (fabs(diff) > max_abs)
            max_abs = fabs(diff);
    }
    double relative = want_square > 0.0 ? sqrt(diff_square / want_square)
                                        : sqrt(diff_square);
    bool pass = finite && relative <= tolerance;
    if (!finite)
        printf("FAIL %-44s non-finite value (count %zu)\n", name, count);
    else
        printf("%s %-44s rel L2 err %.3e (tolerance %.1e), max abs err "
               "%.3e, count %zu\n",
               pass ? "PASS" : "FAIL", name, relative, tolerance, max_abs,
               count);
    if (pass)
        tally->passed++;
    else
        tally->failed++;
    return pass;
}

/* A plain yes/no check with a message. */
static inline bool gpu_test_expect(gpu_test_tally *tally, bool condition,
                                   const char *what)
{
    printf("%s %s\n", condition ? "PASS" : "FAIL", what);
    if (condition)
        tally->passed++;
    else
        tally->failed++;
    return condition;
}

static inline int gpu_test_finish(const gpu_test_tally *tally,
                                  const char *program)
{
    printf("# %s: %d passed, %d failed\n", program, tally->passed,
           tally->failed);
    printf("%s %s\n", tally->failed == 0 ? "ALL PASS" : "SOME FAILED",
           program);
    return tally->failed == 0 ? 0 : 1;
}

/* ------------------------------------------------------- random data */

/* xorshift64*, enough for test data; the state is the caller's. */
static inline double gpu_test_uniform(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t bits = *state * 0x2545F4914F6CDD1Dull;
    return (double)(bits >> 11) * 0x1.0p-53;
}

/* Uniform in [-scale, scale) + offset. */
static inline void gpu_test_fill(float *values, size_t count, float scale,
                                 float offset, uint64_t *state)
{
    for (size_t i = 0; i < count; i++)
        values[i] = offset +
                    scale * (float)(2.0 * gpu_test_uniform(state) - 1.0);
}

/* Rounds every value to bf16 in place, so the cpu reference sees the
 * same inputs as the GPU. */
static inline void gpu_test_round_bf16(float *values, size_t count)
{
    for (size_t i = 0; i < count; i++)
        values[i] = pt_bf16_to_float(pt_float_to_bf16(values[i]));
}

static inline void *gpu_test_host(size_t bytes);

/* count fresh host values (the caller frees them), uniform in [-scale,
 * scale) + offset; the _bf16 ones rounded to bf16, as a tensor the GPU
 * reads in bf16. */
static inline float *gpu_test_random(size_t count, float scale,
                                     float offset, uint64_t *state)
{
    float *values = (float *)gpu_test_host(count * sizeof *values);
    gpu_test_fill(values, count, scale, offset, state);
    return values;
}

static inline float *gpu_test_random_bf16(size_t count, float scale,
                                          uint64_t *state)
{
    float *values = gpu_test_random(count, scale, 0.0f, state);
    gpu_test_round_bf16(values, count);
    return values;
}

static inline void *gpu_test_host(size_t bytes)
{
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    if (p == NULL) {
        printf("FAIL out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Device memory filled with 0xff bytes: NaN in fp32 and bf16, so an
 * element a kernel fails to write shows up. */
static inline void *gpu_test_device(size_t bytes)
{
    void *p = NULL;
    GPU_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    GPU_CHECK(cudaMemset(p, 0xff, bytes > 0 ? bytes : 1));
    return p;
}

/* Device memory of zero bytes (scratch a kernel wants zeroed once). */
static inline void *gpu_test_device_zeroed(size_t bytes)
{
    void *p = gpu_test_device(bytes);
    GPU_CHECK(cudaMemset(p, 0, bytes > 0 ? bytes : 1));
    return p;
}

static inline float *gpu_test_upload(const float *host, size_t count)
{
    float *device = gpu_test_device(count * sizeof *device);
    GPU_CHECK(cudaMemcpy(device, host, count * sizeof *device,
                         cudaMemcpyHostToDevice));
    return device;
}

/* host floats rounded to bf16 into device memory already there */
static inline void gpu_test_upload_bf16_into(pt_bf16 *device,
                                             const float *host, size_t count)
{
    pt_bf16 *staging = gpu_test_host(count * sizeof *staging);
    for (size_t i = 0; i < count; i++)
        staging[i] = pt_float_to_bf16(host[i]);
    GPU_CHECK(cudaMemcpy(device, staging, count * sizeof *device,
                         cudaMemcpyHostToDevice));
    free(staging);
}

static inline pt_bf16 *gpu_test_upload_bf16(const float *host, size_t count)
{
    pt_bf16 *device = gpu_test_device(count * sizeof *device);
    gpu_test_upload_bf16_into(device, host, count);
    return device;
}

/* A plan of N rows' embedding groups (embedding_plan_build or _range)
 * copied into the device arrays cuda_embedding_backward reads. */
static inline void gpu_test_upload_embedding_plan(const embedding_plan *plan,
                                                  int N, int *d_starts,
                                                  int *d_rows,
                                                  uint32_t *d_group_tokens)
{
    GPU_CHECK(cudaMemcpy(d_starts, plan->starts,
                         (size_t)(N + 1) * sizeof(int),
                         cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(d_rows, plan->rows, (size_t)N * sizeof(int),
                         cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(d_group_tokens, plan->tokens,
                         (size_t)N * sizeof(uint32_t),
                         cudaMemcpyHostToDevice));
}

static inline void gpu_test_download(float *host, const float *device,
                                     size_t count)
{
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(host, device, count * sizeof *host,
                         cudaMemcpyDeviceToHost));
}

static inline void gpu_test_download_bf16(float *host, const pt_bf16 *device,
                                          size_t count)
{
    pt_bf16 *staging = gpu_test_host(count * sizeof *staging);
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(staging, device, count * sizeof *staging,
                         cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++)
        host[i] = pt_bf16_to_float(staging[i]);
    free(staging);
}

/* count token ids drawn uniformly from [0, vocab). */
static inline uint32_t *gpu_test_random_tokens(int count, int vocab,
                                               uint64_t *state)
{
    uint32_t *tokens = gpu_test_host((size_t)count * sizeof *tokens);
    for (int i = 0; i < count; i++)
        tokens[i] = (uint32_t)(gpu_test_uniform(state) * vocab);
    return tokens;
}

/* Llama's layer on `shape`: RMSNorm, SwiGLU, rotary positions (the
 * caller sets heads, kv_heads, biases and the head's tying). */
static inline void gpu_test_llama_layer(model_shape *shape)
{
    shape->norm = MODEL_NORM_RMSNORM;
    shape->norm_eps = 1e-5;
    shape->mlp = MODEL_MLP_SWIGLU;
    shape->positions = MODEL_POSITIONS_ROPE;
    shape->rope_base = 10000.0;
}

/* A stage's buffer `which` in host memory (the caller frees it). */
static inline float *gpu_test_read_buffer(const model_stage *stage,
                                          stage_buffer which)
{
    pt_error err;
    float *host = gpu_test_host((stage->param_count + 1) * sizeof *host);
    PT_CHECK(model_stage_read(stage, which, host, &err), &err);
    return host;
}

/* The stage's device memory as tallied by term against the memory plan
 * computed without the GPU (cuda_stage_memory_plan; recompute: the
 * PARTITA_CUDA_RECOMPUTE the stage was made under): one check. */
static inline void gpu_test_compare_memory(gpu_test_tally *tally,
                                           const char *label,
                                           const model_stage *stage,
                                           const char *recompute)
{
    pt_error err;
    pt_memory_terms tallied, planned;
    cuda_stage_memory_terms(stage, &tallied);
    PT_CHECK(cuda_stage_memory_plan(&stage->shape, &stage->spec,
                                    stage->mbs_capacity, stage->slot_count,
                                    recompute, &planned, &err),
             &err);
    bool same = true;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        same = same && tallied.bytes[t] == planned.bytes[t];
    char line[200];
    snprintf(line, sizeof line,
             "%s: tallied device memory %.0f bytes by term as planned "
             "(%.0f), %zu asked of cudaMalloc",
             label, pt_memory_terms_total(&tallied, true),
             pt_memory_terms_total(&planned, true),
             cuda_stage_device_bytes(stage));
    gpu_test_expect(tally, same, line);
}

/* Whether the stage's backward keeps its stream-wide buffers in the
 * fused head's chunk (buffer_layout.head_shared_offset): one check that
 * a variant meant to run them there does. */
static inline void gpu_test_expect_head_shared(gpu_test_tally *tally,
                                               const char *label,
                                               const model_stage *stage)
{
    pt_error err;
    buffer_layout layout;
    PT_CHECK(cuda_stage_buffer_layout(&stage->shape, &stage->spec,
                                      stage->mbs_capacity, NULL, &layout,
                                      &err),
             &err);
    char line[200];
    snprintf(line, sizeof line,
             "%s: the backward's buffers in the head's chunk of %zu bytes "
             "from byte %zu on",
             label, layout.head_chunk_bytes, layout.head_shared_offset);
    gpu_test_expect(tally, layout.head_shared_offset > 0, line);
}

/* Bits of count bf16 values at a and b (device) agree. */
static inline bool gpu_test_same_bf16(const pt_bf16 *a, const pt_bf16 *b,
                                      size_t count)
{
    pt_bf16 *ha = gpu_test_host(count * sizeof *ha);
    pt_bf16 *hb = gpu_test_host(count * sizeof *hb);
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(ha, a, count * sizeof *ha, cudaMemcpyDeviceToHost));
    GPU_CHECK(cudaMemcpy(hb, b, count * sizeof *hb, cudaMemcpyDeviceToHost));
    bool same = memcmp(ha, hb, count * sizeof *ha) == 0;
    free(ha);
    free(hb);
    return same;
}

/* cuda_norm_backward_and_output against the plain backward and the
 * forward (forward_out: its output from inp): both backwards in place
 * over a stream gradient of zeros; the one that writes the output again
 * must give the plain one's stream, weight and bias gradient bits, and
 * the forward's output bits. Two checks. */
static inline void gpu_test_norm_output_again(
    gpu_test_tally *tally, const char *label, const pt_bf16 *forward_out, const pt_bf16 *d_out, const pt_bf16 *inp,
    const float *weight, const float *bias, const float *mean,
    const float *rstd, bool rms, int N, int C)
{
    size_t NC = (size_t)N * C;
    float *scratch = gpu_test_device_zeroed(
        cuda_layernorm_backward_scratch(N, C) * sizeof(float));
    pt_bf16 *plain = gpu_test_device_zeroed(NC * sizeof(pt_bf16));
    pt_bf16 *fused = gpu_test_device_zeroed(NC * sizeof(pt_bf16));
    pt_bf16 *out = gpu_test_device_zeroed(NC * sizeof(pt_bf16));
    float *dw_plain = gpu_test_device_zeroed((size_t)C * sizeof(float));
    float *dw_fused = gpu_test_device_zeroed((size_t)C * sizeof(float));
    float *db_plain = gpu_test_device_zeroed((size_t)C * sizeof(float));
    float *db_fused = gpu_test_device_zeroed((size_t)C * sizeof(float));
    cuda_grad no = cuda_grad_fp32(NULL);
    if (rms)
        GPU_CHECK(cuda_rmsnorm_backward(NULL, plain, cuda_grad_fp32(dw_plain),
                                        NULL, plain, d_out, inp, weight, rstd,
                                        scratch, N, C, 0));
    else
        GPU_CHECK(cuda_layernorm_backward(
            NULL, plain, cuda_grad_fp32(dw_plain), cuda_grad_fp32(db_plain),
            NULL, plain, d_out, inp, weight, mean, rstd, scratch, N, C, 0));
    GPU_CHECK(cuda_norm_backward_and_output(
        out, fused, cuda_grad_fp32(dw_fused),
        rms ? no : cuda_grad_fp32(db_fused), fused, d_out, inp, weight, bias,
        mean, rstd, rms, scratch, N, C, 0));
    char line[400];
    snprintf(line, sizeof line, "%s: the backward writing the output again: "
             "the plain backward's stream gradient and weight gradient bits",
             label);
    float *a = gpu_test_host((size_t)C * sizeof *a);
    float *b = gpu_test_host((size_t)C * sizeof *b);
    gpu_test_download(a, dw_plain, (size_t)C);
    gpu_test_download(b, dw_fused, (size_t)C);
    bool same_dw = memcmp(a, b, (size_t)C * sizeof *a) == 0;
    gpu_test_download(a, db_plain, (size_t)C);
    gpu_test_download(b, db_fused, (size_t)C);
    same_dw = same_dw && memcmp(a, b, (size_t)C * sizeof *a) == 0;
    gpu_test_expect(tally, gpu_test_same_bf16(plain, fused, NC) && same_dw,
                    line);
    snprintf(line, sizeof line, "%s: the output written again has the "
             "forward's bits", label);
    gpu_test_expect(tally, gpu_test_same_bf16(out, forward_out, NC), line);
    free(a), free(b);
    cudaFree(scratch), cudaFree(plain), cudaFree(fused), cudaFree(out);
    cudaFree(dw_plain), cudaFree(dw_fused), cudaFree(db_plain);
    cudaFree(db_fused);
}

#endif
