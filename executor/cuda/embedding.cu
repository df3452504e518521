/*
 * Token + position embedding, forward and backward, and the lookup of a
 * vocab-parallel shard (tensor parallelism). The forward reads the
 * fp32 master tables (it is a gather, a few MB at most) and writes the
 * bf16 residual stream (the shard's lookup stays fp32 for its sum).
 * The backward of the token table sums the rows that share a token in a
 * fixed order (grouped on the host by embedding_plan_build), so
 * gradients come out the same on every run, which atomics would not
 * give.
 */
#include <string.h>

#include "executor/cuda/cuda_common.cuh"

/* Eight consecutive channels of a row per thread (C % 8 == 0, pointers
 * 16-byte aligned): the sum in fp32, rounded once into the bf16 stream. */
__global__ void embedding_forward_kernel(bf16 *out, const uint32_t *tokens,
                                         const float *token_embedding,
                                         const float *position_embedding,
                                         int N, int T, int C)
{
    int groups = C / 8;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * groups)
        return;
    int row = (int)(index / groups);
    int c = (int)(index % groups) * 8;
    float a[8], b[8];
    load8(a, token_embedding + (size_t)tokens[row] * C + c);
    if (position_embedding != NULL) { /* NULL: rotary positions */
        load8(b, position_embedding + (size_t)(row % T) * C + c);
#pragma unroll
        for (int i = 0; i < 8; i++)
            a[i] += b[i];
    }
    store8(out + (size_t)row * C + c, a);
}

__global__ void embedding_forward_scalar_kernel(
    bf16 *out, const uint32_t *tokens, const float *token_embedding,
    const float *position_embedding, int N, int T, int C)
{
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * C)
        return;
    int row = (int)(index / C);
    int c = (int)(index % C);
    float position = position_embedding != NULL
                         ? position_embedding[(size_t)(row % T) * C + c]
                         : 0.0f;
    out[index] = __float2bfloat16_rn(
        token_embedding[(size_t)tokens[row] * C + c] + position);
}

extern "C" cudaError_t cuda_embedding_forward(
    pt_bf16 *out_bf16, const uint32_t *tokens, const float *token_embedding,
    const float *position_embedding, int B, int T, int C,
    cudaStream_t stream)
{
    int N = B * T;
    bf16 *out = as_bf16(out_bf16);
    if (C % 8 == 0 && aligned16(out) && aligned16(token_embedding) &&
        aligned16(position_embedding)) {
        size_t work = (size_t)N * (C / 8);
        embedding_forward_kernel<<<blocks_for(work, 256), 256, 0, stream>>>(
            out, tokens, token_embedding, position_embedding, N, T, C);
    } else {
        size_t work = (size_t)N * C;
        embedding_forward_scalar_kernel<<<blocks_for(work, 256), 256, 0,
                                          stream>>>(
            out, tokens, token_embedding, position_embedding, N, T, C);
    }
    return cudaGetLastError();
}

extern "C" size_t embedding_plan_scratch_bytes(int vocab_count)
{
    size_t words = ((size_t)vocab_count + 63) / 64;
    return words * sizeof(uint64_t) + (size_t)vocab_count * sizeof(int);
}

/* Counting sort of the rows by token: rows of one token stay in row
 * order, so the sums below have a fixed order. Rows whose token lies
 * outside [vocab_first, vocab_first + vocab_count) are left out (a
 * vocab-parallel shard's embedding holds only those rows); group tokens
 * are shard-local row indices. The scratch (a bitmap of the tokens seen,
 * then a count per token) is zero on entry and left zero, and only the
 * tokens seen are visited: the work is O(N + vocab / 64), not
 * O(vocab), so the host part of a small embedding's forward stays short
 * (a full scan of GPT-2's 50,257 counts took tens of microseconds and
 * varied from one process to the next). */
extern "C" void embedding_plan_build_range(embedding_plan *plan,
                                           const uint32_t *tokens, int N,
                                           int vocab_first, int vocab_count,
                                           void *scratch)
{
    size_t words = ((size_t)vocab_count + 63) / 64;
    uint64_t *seen = (uint64_t *)scratch;
    int *counts = (int *)(seen + words);
    for (int n = 0; n < N; n++) {
        long local = (long)tokens[n] - vocab_first;
        if (local < 0 || local >= vocab_count)
            continue;
        counts[local]++;
        seen[local >> 6] |= (uint64_t)1 << (local & 63);
    }
    int groups = 0;
    int offset = 0;
    for (size_t w = 0; w < words; w++) {
        uint64_t bits = seen[w];
        seen[w] = 0;
        while (bits != 0) {
            int v = (int)(w * 64 + (size_t)__builtin_ctzll(bits));
            bits &= bits - 1;
            plan->starts[groups] = offset;
            plan->tokens[groups] = (uint32_t)v;
            int rows = counts[v];
            counts[v] = offset; /* from now on: next free place of token v */
            offset += rows;
            groups++;
        }
    }
    plan->starts[groups] = offset;
    plan->unique_tokens = groups;
    for (int n = 0; n < N; n++) {
        long local = (long)tokens[n] - vocab_first;
        if (local >= 0 && local < vocab_count)
            plan->rows[counts[local]++] = n;
    }
    for (int g = 0; g < groups; g++)
        counts[plan->tokens[g]] = 0;
}

extern "C" void embedding_plan_build(embedding_plan *plan,
                                     const uint32_t *tokens, int N, int V,
                                     void *scratch)
{
    embedding_plan_build_range(plan, tokens, N, 0, V, scratch);
}

/* The vocab-parallel lookup: a row whose token the shard holds gets its
 * embedding row, any other row zeros (another shard fills it, and the
 * group's sum assembles the whole lookup). One thread per 4 columns. */
__global__ void embedding_shard_forward_kernel(float *out,
                                               const uint32_t *tokens,
                                               const float *token_embedding,
                                               int vocab_first,
                                               int vocab_count, int N, int C)
{
    int quads = C / 4;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * quads)
        return;
    int row = (int)(index / quads);
    int quad = (int)(index % quads);
    long local = (long)tokens[row] - vocab_first;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (local >= 0 && local < vocab_count)
        value = reinterpret_cast<const float4 *>(
            token_embedding + (size_t)local * C)[quad];
    reinterpret_cast<float4 *>(out + (size_t)row * C)[quad] = value;
}

__global__ void embedding_shard_forward_scalar_kernel(
    float *out, const uint32_t *tokens, const float *token_embedding,
    int vocab_first, int vocab_count, int N, int C)
{
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * C)
        return;
    int row = (int)(index / C);
    long local = (long)tokens[row] - vocab_first;
    out[index] = local >= 0 && local < vocab_count
                     ? token_embedding[(size_t)local * C + index % C]
                     : 0.0f;
}

extern "C" cudaError_t cuda_embedding_shard_forward(
    float *out, const uint32_t *tokens, const float *token_embedding,
    int vocab_first, int vocab_count, int N, int C, cudaStream_t stream)
{
    if (C % 4 == 0 && aligned16(out) && aligned16(token_embedding)) {
        size_t work = (size_t)N * (C / 4);
        embedding_shard_forward_kernel<<<blocks_for(work, 256), 256, 0,
                                         stream>>>(
            out, tokens, token_embedding, vocab_first, vocab_count, N, C);
    } else {
        size_t work = (size_t)N * C;
        embedding_shard_forward_scalar_kernel<<<blocks_for(work, 256), 256,
                                                0, stream>>>(
            out, tokens, token_embedding, vocab_first, vocab_count, N, C);
    }
    return cudaGetLastError();
}

/* One block per token group (blockIdx.x) and column range (blockIdx.y). */
__global__ void embedding_backward_token_kernel(
    cuda_grad d_token_embedding, const float *d_out, const int *starts,
    const int *rows, const uint32_t *group_tokens, int C)
{
    int group = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float sum = 0.0f;
    for (int i = starts[group]; i < starts[group + 1]; i++)
        sum += d_out[(size_t)rows[i] * C + c];
    grad_add(d_token_embedding, (size_t)group_tokens[group] * C + c, sum);
}

__global__ void embedding_backward_position_kernel(
    cuda_grad d_position_embedding, const float *d_out, int B, int T, int C)
{
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)T * C)
        return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++)
        sum += d_out[(size_t)b * T * C + index];
    grad_add(d_position_embedding, index, sum);
}

extern "C" cudaError_t cuda_embedding_backward(
    cuda_grad d_token_embedding, cuda_grad d_position_embedding,
    const float *d_out, const int *starts, const int *rows,
    const uint32_t *group_tokens, int unique_tokens, int B, int T, int C,
    cudaStream_t stream)
{
    const int threads = 256;
    if (d_token_embedding.data != NULL && unique_tokens > 0) {
        dim3 grid((unsigned)unique_tokens, blocks_for((size_t)C, threads));
        embedding_backward_token_kernel<<<grid, threads, 0, stream>>>(
            d_token_embedding, d_out, starts, rows, group_tokens, C);
    }
    if (d_position_embedding.data != NULL) {
        size_t work = (size_t)T * C;
        embedding_backward_position_kernel<<<blocks_for(work, threads),
                                             threads, 0, stream>>>(
            d_position_embedding, d_out, B, T, C);
    }
    return cudaGetLastError();
}
