/*
 * The classifier: softmax + cross-entropy of the LM head's logits fused
 * with the start of the backward. One block per row, the last rows first
 * (the head's product wrote them last): one pass finds the row's maximum
 * and sum of exponentials together (online softmax, from the row's end
 * backwards), a second overwrites the row with softmax - onehot(target),
 * reading and writing it as streaming (evict-first) data so that L2
 * keeps the rows still to be read again. The logits are bf16 and exist
 * once; no fp32 logits or probabilities are ever written to memory.
 *
 * A vocab-parallel shard (tensor parallelism) holds some of the
 * vocabulary's columns: the same two passes run as three launches with
 * the group's reductions between them (see cuda_ops.h).
 */
#include "executor/cuda/cuda_common.cuh"

#define CLASSIFIER_THREADS 1024

/* Merges (max, sum of exp(x - max)) pairs. */
static __device__ inline void softmax_merge(float &max_value, float &sum,
                                            float other_max, float other_sum)
{
    float merged = fmaxf(max_value, other_max);
    if (merged == -INFINITY)
        return; /* both empty */
    sum = sum * expf(max_value - merged) + other_sum * expf(other_max - merged);
    max_value = merged;
}

/* The row's (max, sum) of one 8-column chunk merged into a thread's:
 * exponentials as ex2.approx of x log2 e - max log2 e (one FFMA and one
 * MUFU op a column; the kernel is bound by its instructions, not by
 * memory: GPU runs of 2026-11-25, docs/benchmarks.md). */
static __device__ inline void chunk_merge(const bf16x8 &packed,
                                          float &max_value, float &sum)
{
    float x[8];
    bf16x8_to_float(packed, x);
    float merged = max_value;
#pragma unroll
    for (int i = 0; i < 8; i++)
        merged = fmaxf(merged, x[i]);
    if (merged == -INFINITY)
        return; /* nothing to add (and no -inf - -inf) */
    /* max_value is -inf before the first chunk: 2^-inf = 0 x sum 0 */
    float shift = -merged * LOG2E_F;
    float chunk_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        chunk_sum += fast_exp2(fmaf(x[i], LOG2E_F, shift));
    sum = fmaf(sum, fast_exp2((max_value - merged) * LOG2E_F), chunk_sum);
    max_value = merged;
}

/* The (max, sum of exp(x - max)) of the row's V valid columns, merged over
 * the whole block; every thread gets it. The chunks are read from the
 * row's end backwards, two at a time, so that the start of the row,
 * which row_write_gradient reads first, is the most recently read (and
 * likely still in L2). Its __syncthreads also orders reads of the row
 * made before the call before any writes after it. */
static __device__ void row_softmax_stats(const bf16 *z, int V, bool vector,
                                         float *row_max, float *row_sum)
{
    __shared__ float shared_max[WARP_SIZE];
    __shared__ float shared_sum[WARP_SIZE];
    int chunks = vector ? V / 8 : 0;
    int stride = (int)blockDim.x;
    float max_value = -INFINITY;
    float sum = 0.0f;
    int k = chunks - 1 - (int)threadIdx.x;
    for (; k - stride >= 0; k -= 2 * stride) {
        bf16x8 first = *reinterpret_cast<const bf16x8 *>(z + (size_t)k * 8);
        bf16x8 second =
            *reinterpret_cast<const bf16x8 *>(z + (size_t)(k - stride) * 8);
        chunk_merge(first, max_value, sum);
        chunk_merge(second, max_value, sum);
    }
    if (k >= 0)
        chunk_merge(*reinterpret_cast<const bf16x8 *>(z + (size_t)k * 8),
                    max_value, sum);
    for (int c = chunks * 8 + threadIdx.x; c < V; c += blockDim.x)
        softmax_merge(max_value, sum, __bfloat162float(z[c]), 1.0f);

    /* block-wide merge: warps by shuffles, then across warps */
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other_max = __shfl_xor_sync(FULL_MASK, max_value, offset);
        float other_sum = __shfl_xor_sync(FULL_MASK, sum, offset);
        softmax_merge(max_value, sum, other_max, other_sum);
    }
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) {
        shared_max[warp] = max_value;
        shared_sum[warp] = sum;
    }
    __syncthreads();
    int warps = blockDim.x / WARP_SIZE;
    max_value = lane < warps ? shared_max[lane] : -INFINITY;
    sum = lane < warps ? shared_sum[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other_max = __shfl_xor_sync(FULL_MASK, max_value, offset);
        float other_sum = __shfl_xor_sync(FULL_MASK, sum, offset);
        softmax_merge(max_value, sum, other_max, other_sum);
    }
    *row_max = max_value;
    *row_sum = sum;
}

/* Overwrites the row with exp(x - max) x inverse - onehot(target), target
 * a column index (out of [0, V) for none), and zeroes the padding
 * columns V..ld: they take part in the backward's products over the
 * rounded-up vocabulary and must add nothing. */
static __device__ void row_write_gradient(bf16 *z, int V, int ld, bool vector,
                                          float max_value, float inverse,
                                          long target)
{
    int vector_end = vector ? V / 8 * 8 : 0;
    float shift = -max_value * LOG2E_F;
    for (int c = threadIdx.x * 8; c < vector_end; c += blockDim.x * 8) {
        /* the row's last use and its gradient, both marked streaming
         * (evict first): what L2 keeps is then the rows whose first pass
         * is under way, which their second pass reads again */
        int4 packed = __ldcs(reinterpret_cast<const int4 *>(z + c));
        float x[8];
        bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(&packed), x);
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = fast_exp2(fmaf(x[i], LOG2E_F, shift)) * inverse;
        long offset = target - c; /* the target's place in the chunk */
        if (offset >= 0 && offset < 8) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (i == offset)
                    x[i] -= 1.0f;
        }
        bf16x8 gradient = float_to_bf16x8(x);
        __stcs(reinterpret_cast<int4 *>(z + c),
               *reinterpret_cast<const int4 *>(&gradient));
    }
    for (int c = vector_end + threadIdx.x; c < V; c += blockDim.x) {
        float p = expf(__bfloat162float(z[c]) - max_value) * inverse;
        if ((long)c == target)
            p -= 1.0f;
        z[c] = __float2bfloat16_rn(p);
    }
    for (int c = V + threadIdx.x; c < ld; c += blockDim.x)
        z[c] = __float2bfloat16_rn(0.0f);
}

__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_forward_kernel(bf16 *logits, float *losses,
                          const uint32_t *targets, int V, int ld, bool vector)
{
    /* the last rows first: the head's product wrote them last, so they
     * are the likeliest still in L2 */
    int row = (int)(gridDim.x - 1 - blockIdx.x);
    bf16 *z = logits + (size_t)row * ld;
    uint32_t target = targets[row];
    float target_logit = __bfloat162float(z[target]);
    float max_value, sum;
    row_softmax_stats(z, V, vector, &max_value, &sum);
    if (threadIdx.x == 0)
        losses[row] = logf(sum) + max_value - target_logit;
    row_write_gradient(z, V, ld, vector, max_value, 1.0f / sum,
                       (long)target);
}

extern "C" cudaError_t cuda_classifier_forward(pt_bf16 *logits_bf16,
                                               float *losses,
                                               const uint32_t *targets, int N,
                                               int V, int ld,
                                               cudaStream_t stream)
{
    bool vector = ld % 8 == 0 && aligned16(logits_bf16);
    classifier_forward_kernel<<<N, CLASSIFIER_THREADS, 0, stream>>>(
        as_bf16(logits_bf16), losses, targets, V, ld, vector);
    return cudaGetLastError();
}

/* ------------------------------------------------------ vocab-parallel */

__global__ void __launch_bounds__(CLASSIFIER_THREADS)
vocab_parallel_partials_kernel(const bf16 *logits, float *row_max,
                               float *row_sum, float *target_logit,
                               const uint32_t *targets, int vocab_first,
                               int V, int ld, bool vector)
{
    int row = blockIdx.x;
    const bf16 *z = logits + (size_t)row * ld;
    float max_value, sum;
    row_softmax_stats(z, V, vector, &max_value, &sum);
    if (threadIdx.x != 0)
        return;
    long local = (long)targets[row] - vocab_first;
    row_max[row] = max_value;
    row_sum[row] = sum;
    target_logit[row] =
        local >= 0 && local < V ? __bfloat162float(z[local]) : 0.0f;
}

extern "C" cudaError_t cuda_vocab_parallel_partials(
    const pt_bf16 *logits_bf16, float *row_max, float *row_sum,
    float *target_logit, const uint32_t *targets, int vocab_first, int N,
    int V, int ld, cudaStream_t stream)
{
    bool vector = ld % 8 == 0 && aligned16(logits_bf16);
    vocab_parallel_partials_kernel<<<N, CLASSIFIER_THREADS, 0, stream>>>(
        as_bf16(logits_bf16), row_max, row_sum, target_logit, targets,
        vocab_first, V, ld, vector);
    return cudaGetLastError();
}

__global__ void vocab_parallel_rescale_kernel(float *row_sum,
                                              const float *row_max,
                                              const float *global_max, int N)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        row_sum[n] *= expf(row_max[n] - global_max[n]);
}

extern "C" cudaError_t cuda_vocab_parallel_rescale(float *row_sum,
                                                   const float *row_max,
                                                   const float *global_max,
                                                   int N, cudaStream_t stream)
{
    vocab_parallel_rescale_kernel<<<blocks_for((size_t)N, 256), 256, 0,
                                    stream>>>(row_sum, row_max, global_max,
                                              N);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(CLASSIFIER_THREADS)
vocab_parallel_finish_kernel(bf16 *logits, float *losses,
                             const uint32_t *targets, const float *global_max,
                             const float *row_sum, const float *target_logit,
                             int vocab_first, int V, int ld, bool vector)
{
    int row = blockIdx.x;
    float max_value = global_max[row], sum = row_sum[row];
    if (threadIdx.x == 0)
        losses[row] = logf(sum) + max_value - target_logit[row];
    row_write_gradient(logits + (size_t)row * ld, V, ld, vector, max_value,
                       1.0f / sum, (long)targets[row] - vocab_first);
}

extern "C" cudaError_t cuda_vocab_parallel_finish(
    pt_bf16 *logits_bf16, float *losses, const uint32_t *targets,
    const float *global_max, const float *row_sum, const float *target_logit,
    int vocab_first, int N, int V, int ld, cudaStream_t stream)
{
    bool vector = ld % 8 == 0 && aligned16(logits_bf16);
    vocab_parallel_finish_kernel<<<N, CLASSIFIER_THREADS, 0, stream>>>(
        as_bf16(logits_bf16), losses, targets, global_max, row_sum,
        target_logit, vocab_first, V, ld, vector);
    return cudaGetLastError();
}
