/*
 * The plain fallback of the attention (attention.cu) for head sizes
 * without tensor-core kernels, and the own path of grouped-query
 * attention (GQA: KVH key/value heads shared by groups of NH / KVH query
 * heads, the Llama family's): one block per query row (forward, dQ) or
 * key row (dK, dV), scores in shared memory, no tensor cores. Correct but
 * slow; the same math as the fast kernels, base-2 scores and the saved
 * log-sum-exp included.
 *
 * Layout: rows of W = (NH + 2 KVH) D, the NH query heads, then the KVH
 * key heads, then the KVH value heads; query head h reads key and value
 * head h / (NH / KVH). With KVH == NH this is the multi-head qkv of
 * 3C, and every sum runs in the order it did before GQA came.
 */
#include "executor/cuda/cuda_common.cuh"

/* A block of scores holds a row of the sequence in fp32 (dK and dV
 * two, and two head rows): 66 KiB at 8,192 positions, past the 48 KiB a
 * block has without asking (Llama-3.2-1B at sequence 8192, micro-batch
 * 4, whose cuDNN plan had not fit: twelfth session), so each launch asks
 * (allow_dynamic_shared, cuda_common.cuh). */

/* delta[bh, t] = dO . O of each query row and head (fp32). */
__global__ void attention_delta_kernel(float *delta, const bf16 *d_out,
                                       const bf16 *out, int N, int T, int NH,
                                       int HD)
{
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * NH)
        return;
    int row = (int)(index / NH);
    int h = (int)(index % NH);
    size_t offset = (size_t)row * NH * HD + (size_t)h * HD;
    float sum = 0.0f;
    if (HD % 8 == 0) {
        for (int d = 0; d < HD; d += 8) {
            float a[8], b[8];
            load8(a, d_out + offset + d);
            load8(b, out + offset + d);
#pragma unroll
            for (int i = 0; i < 8; i++)
                sum += a[i] * b[i];
        }
    } else {
        for (int d = 0; d < HD; d++)
            sum += __bfloat162float(d_out[offset + d]) *
                   __bfloat162float(out[offset + d]);
    }
    int b = row / T;
    int t = row % T;
    delta[((size_t)b * NH + h) * T + t] = sum;
}

/* Where the heads of a GQA row are: the row stride, and the channel of
 * query head h, its key head and its value head. */
struct gqa_heads {
    size_t stride;
    int query, key, value;
};

static __device__ inline gqa_heads heads_of(int h, int NH, int KVH, int HD)
{
    int kv = h / (NH / KVH);
    gqa_heads at = {(size_t)(NH + 2 * KVH) * HD, h * HD, (NH + kv) * HD,
                    (NH + KVH + kv) * HD};
    return at;
}

/* One block per (query, sequence x head); scores of the row in shared
 * memory (T floats). */
__global__ void attention_forward_plain_kernel(bf16 *out, float *lse,
                                               const bf16 *qkv, int T, int NH,
                                               int KVH, int HD,
                                               float scale_log2)
{
    extern __shared__ float scores[];
    __shared__ float reduce_space[WARP_SIZE];
    int query = blockIdx.x;
    int bh = blockIdx.y;
    int b = bh / NH;
    int h = bh % NH;
    int C = NH * HD;
    gqa_heads at = heads_of(h, NH, KVH, HD);
    size_t stride = at.stride;
    const bf16 *q = qkv + ((size_t)b * T + query) * stride + at.query;
    float local_max = -INFINITY;
    for (int key = threadIdx.x; key <= query; key += blockDim.x) {
        const bf16 *k = qkv + ((size_t)b * T + key) * stride + at.key;
        float dot = 0.0f;
        for (int d = 0; d < HD; d++)
            dot += __bfloat162float(q[d]) * __bfloat162float(k[d]);
        scores[key] = dot * scale_log2;
        local_max = fmaxf(local_max, scores[key]);
    }
    float row_max = block_max(local_max, reduce_space);
    float local_sum = 0.0f;
    for (int key = threadIdx.x; key <= query; key += blockDim.x) {
        scores[key] = fast_exp2(scores[key] - row_max);
        local_sum += scores[key];
    }
    float row_sum = block_sum(local_sum, reduce_space); /* syncs */
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float acc = 0.0f;
        for (int key = 0; key <= query; key++)
            acc += scores[key] *
                   __bfloat162float(qkv[((size_t)b * T + key) * stride +
                                        at.value + d]);
        out[((size_t)b * T + query) * C + h * HD + d] =
            __float2bfloat16_rn(acc / row_sum);
    }
    if (threadIdx.x == 0)
        lse[(size_t)bh * T + query] = row_max + log2f(row_sum);
}

static __device__ float plain_dot(const bf16 *a, const bf16 *b, int n)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += __bfloat162float(a[i]) * __bfloat162float(b[i]);
    return sum;
}

/* dQ of one query row: shared holds dS over the keys (T floats). */
__global__ void attention_backward_dq_plain_kernel(
    bf16 *d_qkv, const bf16 *d_out, const bf16 *qkv, const float *lse,
    const float *delta, int T, int NH, int KVH, int HD, float scale_log2,
    float scale)
{
    extern __shared__ float d_scores[];
    int query = blockIdx.x;
    int bh = blockIdx.y;
    int b = bh / NH;
    int h = bh % NH;
    int C = NH * HD;
    gqa_heads at = heads_of(h, NH, KVH, HD);
    size_t stride = at.stride;
    const bf16 *q = qkv + ((size_t)b * T + query) * stride + at.query;
    const bf16 *dy = d_out + ((size_t)b * T + query) * C + h * HD;
    float row_lse = lse[(size_t)bh * T + query];
    float row_delta = delta[(size_t)bh * T + query];
    for (int key = threadIdx.x; key <= query; key += blockDim.x) {
        const bf16 *k = qkv + ((size_t)b * T + key) * stride + at.key;
        const bf16 *v = qkv + ((size_t)b * T + key) * stride + at.value;
        float p = fast_exp2(plain_dot(q, k, HD) * scale_log2 - row_lse);
        d_scores[key] = p * (plain_dot(dy, v, HD) - row_delta);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float acc = 0.0f;
        for (int key = 0; key <= query; key++)
            acc += d_scores[key] *
                   __bfloat162float(qkv[((size_t)b * T + key) * stride +
                                        at.key + d]);
        d_qkv[((size_t)b * T + query) * stride + at.query + d] =
            __float2bfloat16_rn(acc * scale);
    }
}

/* dK, dV of one key row of one key/value head: for each query head of
 * its group in turn, shared holds P and dS over the queries (T floats
 * each), and the head's sums over the queries are added to the group's
 * in shared memory (2 D floats), rounded to bf16 once at the end. */
__global__ void attention_backward_dkdv_plain_kernel(
    bf16 *d_qkv, const bf16 *d_out, const bf16 *qkv, const float *lse,
    const float *delta, int T, int NH, int KVH, int HD, float scale_log2,
    float scale)
{
    extern __shared__ float shared_rows[];
    float *probs = shared_rows;
    float *d_scores = shared_rows + T;
    float *d_key = shared_rows + 2 * T;
    float *d_value = d_key + HD;
    int key = blockIdx.x;
    int b = blockIdx.y / KVH;
    int group = NH / KVH;
    int first_head = blockIdx.y % KVH * group;
    int C = NH * HD;
    for (int d = threadIdx.x; d < HD; d += blockDim.x)
        d_key[d] = d_value[d] = 0.0f;
    gqa_heads at = heads_of(first_head, NH, KVH, HD);
    size_t stride = at.stride;
    const bf16 *k = qkv + ((size_t)b * T + key) * stride + at.key;
    const bf16 *v = qkv + ((size_t)b * T + key) * stride + at.value;
    for (int h = first_head; h < first_head + group; h++) {
        size_t bh = (size_t)b * NH + h;
        int q_at = h * HD;
        __syncthreads(); /* the previous head's rows are read */
        for (int query = key + threadIdx.x; query < T;
             query += blockDim.x) {
            const bf16 *q = qkv + ((size_t)b * T + query) * stride + q_at;
            const bf16 *dy = d_out + ((size_t)b * T + query) * C + q_at;
            float p = fast_exp2(plain_dot(q, k, HD) * scale_log2 -
                                lse[bh * T + query]);
            probs[query] = p;
            d_scores[query] =
                p * (plain_dot(dy, v, HD) - delta[bh * T + query]);
        }
        __syncthreads();
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float dk = 0.0f;
            float dv = 0.0f;
            for (int query = key; query < T; query++) {
                size_t row = (size_t)b * T + query;
                dk += d_scores[query] *
                      __bfloat162float(qkv[row * stride + q_at + d]);
                dv += probs[query] *
                      __bfloat162float(d_out[row * C + q_at + d]);
            }
            d_key[d] += dk;
            d_value[d] += dv;
        }
    }
    size_t key_row = ((size_t)b * T + key) * stride;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        d_qkv[key_row + at.key + d] = __float2bfloat16_rn(d_key[d] * scale);
        d_qkv[key_row + at.value + d] = __float2bfloat16_rn(d_value[d]);
    }
}

static bool gqa_shape_valid(int NH, int KVH, int D)
{
    return NH > 0 && KVH > 0 && NH % KVH == 0 && D > 0;
}

extern "C" cudaError_t cuda_gqa_attention_forward_plain(
    pt_bf16 *out_bf16, float *lse, const pt_bf16 *qkv_bf16, int B, int T,
    int NH, int KVH, int D, cudaStream_t stream)
{
    float scale_log2 = LOG2E_F / sqrtf((float)D);
    size_t shared = (size_t)T * sizeof(float);
    if (!gqa_shape_valid(NH, KVH, D))
        return cudaErrorInvalidValue;
    cudaError_t allowed =
        allow_dynamic_shared(attention_forward_plain_kernel, shared);
    if (allowed != cudaSuccess)
        return allowed;
    dim3 grid((unsigned)T, (unsigned)(B * NH));
    attention_forward_plain_kernel<<<grid, 128, shared, stream>>>(
        as_bf16(out_bf16), lse, as_bf16(qkv_bf16), T, NH, KVH, D,
        scale_log2);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_gqa_attention_backward_plain(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int NH, int KVH, int D, cudaStream_t stream)
{
    float scale = 1.0f / sqrtf((float)D);
    float scale_log2 = LOG2E_F * scale;
    bf16 *d_qkv = as_bf16(d_qkv_bf16);
    const bf16 *d_out = as_bf16(d_out_bf16);
    const bf16 *qkv = as_bf16(qkv_bf16);
    float *delta = scratch;
    size_t dq_shared = (size_t)T * sizeof(float);
    size_t dkdv_shared = (2 * (size_t)T + 2 * (size_t)D) * sizeof(float);
    if (!gqa_shape_valid(NH, KVH, D))
        return cudaErrorInvalidValue;
    cudaError_t allowed =
        allow_dynamic_shared(attention_backward_dq_plain_kernel, dq_shared);
    if (allowed == cudaSuccess)
        allowed =
            allow_dynamic_shared(attention_backward_dkdv_plain_kernel,
                                 dkdv_shared);
    if (allowed != cudaSuccess)
        return allowed;
    size_t rows = (size_t)B * T * NH;
    attention_delta_kernel<<<blocks_for(rows, 256), 256, 0, stream>>>(
        delta, d_out, as_bf16(out_bf16), B * T, T, NH, D);
    dim3 dq_grid((unsigned)T, (unsigned)(B * NH));
    attention_backward_dq_plain_kernel<<<dq_grid, 128, dq_shared, stream>>>(
        d_qkv, d_out, qkv, lse, delta, T, NH, KVH, D, scale_log2, scale);
    dim3 dkdv_grid((unsigned)T, (unsigned)(B * KVH));
    attention_backward_dkdv_plain_kernel<<<dkdv_grid, 128, dkdv_shared,
                                           stream>>>(
        d_qkv, d_out, qkv, lse, delta, T, NH, KVH, D, scale_log2, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_forward_plain(
    pt_bf16 *out_bf16, float *lse, const pt_bf16 *qkv_bf16, int B, int T,
    int C, int NH, cudaStream_t stream)
{
    return cuda_gqa_attention_forward_plain(out_bf16, lse, qkv_bf16, B, T,
                                            NH, NH, C / NH, stream);
}

extern "C" cudaError_t cuda_attention_backward_plain(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int C, int NH, cudaStream_t stream)
{
    return cuda_gqa_attention_backward_plain(d_qkv_bf16, d_out_bf16,
                                             qkv_bf16, out_bf16, lse, scratch,
                                             B, T, NH, NH, C / NH, stream);
}

extern "C" cudaError_t cuda_gqa_attention_forward(
    pt_bf16 *out_bf16, float *lse, const pt_bf16 *qkv_bf16, int B, int T,
    int NH, int KVH, int D, cudaStream_t stream)
{
    if (KVH == NH)
        return cuda_attention_forward(out_bf16, lse, qkv_bf16, B, T, NH * D,
                                      NH, stream);
    return cuda_gqa_attention_forward_plain(out_bf16, lse, qkv_bf16, B, T,
                                            NH, KVH, D, stream);
}

extern "C" cudaError_t cuda_gqa_attention_backward(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int NH, int KVH, int D, cudaStream_t stream)
{
    if (KVH == NH)
        return cuda_attention_backward(d_qkv_bf16, d_out_bf16, qkv_bf16,
                                       out_bf16, lse, scratch, B, T, NH * D,
                                       NH, stream);
    return cuda_gqa_attention_backward_plain(d_qkv_bf16, d_out_bf16,
                                             qkv_bf16, out_bf16, lse, scratch,
                                             B, T, NH, KVH, D, stream);
}
