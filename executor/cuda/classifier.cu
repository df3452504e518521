/*
 * The classifier: softmax + cross-entropy of the LM head's logits fused
 * with the start of the backward. One block per row: one pass finds the
 * row's maximum and sum of exponentials together (online softmax), a
 * second overwrites the row with softmax - onehot(target). The logits
 * are bf16 and exist once; no fp32 logits or probabilities are ever
 * written to memory.
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

__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_forward_kernel(bf16 *logits, float *losses,
                          const uint32_t *targets, int V, int ld, bool vector)
{
    __shared__ float shared_max[WARP_SIZE];
    __shared__ float shared_sum[WARP_SIZE];
    int row = blockIdx.x;
    bf16 *z = logits + (size_t)row * ld;
    uint32_t target = targets[row];
    float target_logit = __bfloat162float(z[target]);
    int vector_end = vector ? V / 8 * 8 : 0;

    float max_value = -INFINITY;
    float sum = 0.0f;
    for (int c = threadIdx.x * 8; c < vector_end; c += blockDim.x * 8) {
        float x[8];
        bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(z + c), x);
        float local_max = x[0];
#pragma unroll
        for (int i = 1; i < 8; i++)
            local_max = fmaxf(local_max, x[i]);
        float local_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            local_sum += expf(x[i] - local_max);
        softmax_merge(max_value, sum, local_max, local_sum);
    }
    for (int c = vector_end + threadIdx.x; c < V; c += blockDim.x)
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
    __syncthreads(); /* also orders the target read before the writes */
    int warps = blockDim.x / WARP_SIZE;
    max_value = lane < warps ? shared_max[lane] : -INFINITY;
    sum = lane < warps ? shared_sum[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other_max = __shfl_xor_sync(FULL_MASK, max_value, offset);
        float other_sum = __shfl_xor_sync(FULL_MASK, sum, offset);
        softmax_merge(max_value, sum, other_max, other_sum);
    }
    if (threadIdx.x == 0)
        losses[row] = logf(sum) + max_value - target_logit;

    float inverse = 1.0f / sum;
    for (int c = threadIdx.x * 8; c < vector_end; c += blockDim.x * 8) {
        float x[8];
        bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(z + c), x);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            x[i] = expf(x[i] - max_value) * inverse;
            if ((uint32_t)(c + i) == target)
                x[i] -= 1.0f;
        }
        *reinterpret_cast<bf16x8 *>(z + c) = float_to_bf16x8(x);
    }
    for (int c = vector_end + threadIdx.x; c < V; c += blockDim.x) {
        float p = expf(__bfloat162float(z[c]) - max_value) * inverse;
        if ((uint32_t)c == target)
            p -= 1.0f;
        z[c] = __float2bfloat16_rn(p);
    }
    /* the padding columns take part in the backward's products over the
     * rounded-up vocabulary: they must add nothing */
    for (int c = V + threadIdx.x; c < ld; c += blockDim.x)
        z[c] = __float2bfloat16_rn(0.0f);
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
