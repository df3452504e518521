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
 */
#include "executor/cuda/cuda_common.cuh"

#define ROPE_THREADS 256

/* sign +1 turns forward, -1 back (the transpose: the backward). */
__global__ void rope_kernel(bf16 *x, double base, int N, int T, int width,
                            int heads, int head_size, float sign)
{
    int half = head_size / 2;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * half)
        return;
    size_t row = index / half;
    int i = (int)(index % half);
    int t = (int)(row % T);
    double frequency = pow(base, -2.0 * i / head_size);
    double sine, cosine;
    sincos((double)t * frequency, &sine, &cosine);
    float c = (float)cosine, s = (float)sine * sign;
    bf16 *p = x + row * width + i;
    for (int h = 0; h < heads; h++, p += head_size) {
        float x1 = __bfloat162float(p[0]);
        float x2 = __bfloat162float(p[half]);
        p[0] = __float2bfloat16_rn(x1 * c - x2 * s);
        p[half] = __float2bfloat16_rn(x2 * c + x1 * s);
    }
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
