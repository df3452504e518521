/*
 * Rotary position embeddings (RoPE), rotate-half as Llama and Megatron
 * apply them, forward and backward, in place on the attention's bf16
 * qkv product (cuda_ops.h): in each turned head, channels i and
 * i + hs/2 of position t rotate by t base^(-2i/hs).
 *
 * Why in place and on its own: the attention (attention_cudnn.c and the
 * own kernels) reads queries, keys and values straight out of the qkv
 * product through strides, so there is no layout pass to fuse with (the
 * cuBLASLt epilogue cannot rotate); this one pass reads and writes only
 * the query and key heads, (NH + KVH) / (NH + 2 KVH) of the product, and
 * the forward's result is what the attention's backward reads again.
 *
 * One thread per (row, pair i): it takes the pair's angle in double (the
 * cpu reference's, so late positions keep their digits), one sincos,
 * then turns that pair in every head of the row; neighbouring threads
 * hold neighbouring pairs, so each head's halves move in whole lines.
 * The regrouping pass of the Llama-family models (below) has a second
 * kernel for the head sizes those models have, a block's rows at a time.
 */
#include "executor/cuda/cuda_common.cuh"

#define ROPE_THREADS 256

/* Pair i's cosine and sine at position t (sign +1 turns forward, -1
 * back: the transpose, the backward), the angle in double. */
__device__ static void pair_angle(double base, int t, int i, int head_size,
                                  float sign, float *c, float *s)
{
    double sine, cosine;
    sincos((double)t * pow(base, -2.0 * i / head_size), &sine, &cosine);
    *c = (float)cosine;
    *s = (float)sine * sign;
}

/* A pair's two values turned by (c, s), each product rounded apart (no
 * fused multiply-add): both kernels below then give the same bits
 * whatever the compiler contracts, and the cpu reference's (C17, which
 * does not contract). */
__device__ static void turn_values(float x1, float x2, float c, float s,
                                   float *y1, float *y2)
{
    *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

/* One pair of a head from p into q (may be p), turned. */
__device__ static void turn_pair(bf16 *q, const bf16 *p, int half, float c,
                                 float s)
{
    float y1, y2;
    turn_values(__bfloat162float(p[0]), __bfloat162float(p[half]), c, s,
                &y1, &y2);
    q[0] = __float2bfloat16_rn(y1);
    q[half] = __float2bfloat16_rn(y2);
}

__global__ void rope_kernel(bf16 *x, double base, int N, int T, int width,
                            int heads, int head_size, float sign)
{
    int half = head_size / 2;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * half)
        return;
    size_t row = index / half;
    int i = (int)(index % half);
    float c, s;
    pair_angle(base, (int)(row % T), i, head_size, sign, &c, &s);
    bf16 *p = x + row * width + i;
    for (int h = 0; h < heads; h++, p += head_size)
        turn_pair(p, p, half, c, s);
}

static cudaError_t rope_launch(pt_bf16 *x_bf16, double base, int B, int T,
                               int width, int heads, int head_size,
                               float sign, cudaStream_t stream)
{
    if (head_size <= 0 || head_size % 2 != 0 || heads < 0 ||
        (size_t)heads * head_size > (size_t)width)
        return cudaErrorInvalidValue;
    int N = B * T;
    size_t pairs = (size_t)N * (head_size / 2);
    if (pairs == 0 || heads == 0)
        return cudaSuccess;
    rope_kernel<<<blocks_for(pairs, ROPE_THREADS), ROPE_THREADS, 0,
                  stream>>>(as_bf16(x_bf16), base, N, T, width, heads,
                            head_size, sign);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_rope_forward(pt_bf16 *x_bf16, double base,
                                         int B, int T, int width, int heads,
                                         int head_size, cudaStream_t stream)
{
    return rope_launch(x_bf16, base, B, T, width, heads, head_size, 1.0f,
                       stream);
}

extern "C" cudaError_t cuda_rope_backward(pt_bf16 *d_x_bf16, double base,
                                          int B, int T, int width, int heads,
                                          int head_size, cudaStream_t stream)
{
    return rope_launch(d_x_bf16, base, B, T, width, heads, head_size, -1.0f,
                       stream);
}

/* ------------------------------------------------- regrouped and turned */

/*
 * The fused qkv weight of every model but GPT-2's is in Megatron-LM's
 * grouped order (per key/value group: its G = NH / KVH query heads, its
 * key head, its value head), so tp cuts whole groups; the attention reads
 * the heads' order (all query heads, all key heads, all value heads).
 * One pass moves the product between the two and turns the queries and
 * keys on the way (turn: the model's positions are rotary), so the
 * regrouping costs no pass of its own beside RoPE's. One thread per
 * (row, pair i) as rope_kernel, over every head of the row; to_heads:
 * grouped -> heads and forward rotation, else heads -> grouped and the
 * inverse rotation (the backward's).
 */
__device__ static int grouped_column(int h, int NH, int KVH, int hs)
{
    int G = NH / KVH;
    if (h < NH)
        return ((h / G) * (G + 2) + h % G) * hs;
    if (h < NH + KVH)
        return ((h - NH) * (G + 2) + G) * hs;
    return ((h - NH - KVH) * (G + 2) + G + 1) * hs;
}

__global__ void regroup_rope_kernel(bf16 *out, const bf16 *in, double base,
                                    bool turn, bool to_heads, int N, int T,
                                    int NH, int KVH, int hs)
{
    int half = hs / 2;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * half)
        return;
    size_t row = index / half;
    int i = (int)(index % half);
    float c = 1.0f, s = 0.0f;
    if (turn)
        pair_angle(base, (int)(row % T), i, hs, to_heads ? 1.0f : -1.0f, &c,
                   &s);
    size_t width = (size_t)(NH + 2 * KVH) * hs;
    const bf16 *from_row = in + row * width;
    bf16 *to_row = out + row * width;
    for (int h = 0; h < NH + 2 * KVH; h++) {
        size_t heads_at = (size_t)h * hs + i;
        size_t grouped_at = (size_t)grouped_column(h, NH, KVH, hs) + i;
        const bf16 *p = from_row + (to_heads ? grouped_at : heads_at);
        bf16 *q = to_row + (to_heads ? heads_at : grouped_at);
        if (!turn || h >= NH + KVH) { /* values pass unturned */
            q[0] = p[0];
            q[half] = p[half];
        } else {
            turn_pair(q, p, half, c, s);
        }
    }
}

/*
 * The same pass, a block's rows at a time, for head sizes that are
 * multiples of 16 with 16-byte aligned tensors (every bundled Llama-family
 * model): the block first takes its rows' angles once each into shared
 * memory (double, as pair_angle), then each thread turns 8 pairs of one
 * head of one row with 16-byte loads and stores. Why: the one-thread-per-
 * pair kernel above moves 2 bytes an access and walks its row's heads one
 * after the other; it ran at about 1.4 TB/s on an H200 (71 us for
 * Llama-3.2-1B's 8,192 rows of 32 + 8 + 8 heads of 64), this one at 3.2
 * (31.5 us; a plain copy of the same bytes 26.8), with the same bits
 * (eighteenth session, docs/benchmarks.md). Taking a (row, pair)'s
 * angle again in the thread of every head cost three times the old
 * kernel's time: the double sines are the dear part, so each is made
 * once a call.
 */
#define REGROUP_ROWS_ITEMS 1024 /* (row, head, 8 pairs) items a block */

__global__ void regroup_rope_rows_kernel(bf16 *__restrict__ out,
                                         const bf16 *__restrict__ in,
                                         double base, bool turn,
                                         bool to_heads, int N, int T, int NH,
                                         int KVH, int hs, int rows_per_block)
{
    extern __shared__ float2 angles[]; /* [rows_per_block][hs / 2] */
    int half = hs / 2, heads = NH + 2 * KVH, runs = half / 8;
    int turned = turn ? NH + KVH : 0; /* values pass unturned */
    int first = blockIdx.x * rows_per_block;
    int rows = min(rows_per_block, N - first);
    for (int k = threadIdx.x; turned > 0 && k < rows * half;
         k += blockDim.x) {
        float c, s;
        pair_angle(base, (first + k / half) % T, k % half, hs,
                   to_heads ? 1.0f : -1.0f, &c, &s);
        angles[k] = make_float2(c, s);
    }
    __syncthreads();
    size_t width = (size_t)heads * hs;
    for (int k = threadIdx.x; k < rows * heads * runs; k += blockDim.x) {
        int run = k % runs, h = k / runs % heads, r = k / runs / heads;
        size_t row_at = (size_t)(first + r) * width;
        size_t heads_at = row_at + (size_t)h * hs + run * 8;
        size_t grouped_at = row_at + grouped_column(h, NH, KVH, hs) + run * 8;
        const bf16 *p = in + (to_heads ? grouped_at : heads_at);
        bf16 *q = out + (to_heads ? heads_at : grouped_at);
        uint4 low = *reinterpret_cast<const uint4 *>(p);
        uint4 high = *reinterpret_cast<const uint4 *>(p + half);
        if (h < turned) {
            bf16 *x1 = reinterpret_cast<bf16 *>(&low);
            bf16 *x2 = reinterpret_cast<bf16 *>(&high);
            const float2 *angle = angles + r * half + run * 8;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float y1, y2;
                turn_values(__bfloat162float(x1[j]), __bfloat162float(x2[j]),
                            angle[j].x, angle[j].y, &y1, &y2);
                x1[j] = __float2bfloat16_rn(y1);
                x2[j] = __float2bfloat16_rn(y2);
            }
        }
        *reinterpret_cast<uint4 *>(q) = low;
        *reinterpret_cast<uint4 *>(q + half) = high;
    }
}

static cudaError_t regroup_launch(pt_bf16 *out, const pt_bf16 *in,
                                  double base, bool turn, bool to_heads,
                                  int B, int T, int NH, int KVH, int hs,
                                  cudaStream_t stream)
{
    if (hs <= 0 || hs % 2 != 0 || KVH <= 0 || NH % KVH != 0 || out == in)
        return cudaErrorInvalidValue;
    size_t pairs = (size_t)B * T * (hs / 2);
    if (pairs == 0)
        return cudaSuccess;
    int N = B * T, heads = NH + 2 * KVH;
    if (hs % 16 == 0 && aligned16(out) && aligned16(in)) {
        int rows_per_block = max(1, REGROUP_ROWS_ITEMS / (heads * hs / 16));
        size_t shared = (size_t)rows_per_block * (hs / 2) * sizeof(float2);
        regroup_rope_rows_kernel<<<(N + rows_per_block - 1) / rows_per_block,
                                   ROPE_THREADS, shared, stream>>>(
            as_bf16(out), as_bf16(in), base, turn, to_heads, N, T, NH, KVH,
            hs, rows_per_block);
        return cudaGetLastError();
    }
    regroup_rope_kernel<<<blocks_for(pairs, ROPE_THREADS), ROPE_THREADS, 0,
                          stream>>>(as_bf16(out), as_bf16(in), base, turn,
                                    to_heads, N, T, NH, KVH, hs);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_qkv_to_heads(pt_bf16 *heads_bf16,
                                         const pt_bf16 *grouped_bf16,
                                         double base, bool turn, int B,
                                         int T, int NH, int KVH, int hs,
                                         cudaStream_t stream)
{
    return regroup_launch(heads_bf16, grouped_bf16, base, turn, true, B, T,
                          NH, KVH, hs, stream);
}

extern "C" cudaError_t cuda_qkv_to_grouped(pt_bf16 *d_grouped_bf16,
                                           const pt_bf16 *d_heads_bf16,
                                           double base, bool turn, int B,
                                           int T, int NH, int KVH, int hs,
                                           cudaStream_t stream)
{
    return regroup_launch(d_grouped_bf16, d_heads_bf16, base, turn, false,
                          B, T, NH, KVH, hs, stream);
}
