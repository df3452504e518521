/*
 * Layer norm and RMSNorm forward on the bf16 residual stream (read into
 * fp32 registers; statistics in fp32); the backward is
 * layernorm_backward.cu. RMSNorm (Llama's) is layer norm without the
 * mean and the bias: every kernel takes RMS as a template flag that
 * drops those terms at compile time, so the two norms share one set of
 * kernels (and layer norm's instantiations are the code they were before
 * RMSNorm came).
 *
 * Forward: one warp per row; the row (C <= 2048 channels, C % 8 == 0)
 * is read once into registers and written as bf16, the input of the next
 * matrix product (larger or odd rows take a generic kernel that reads the
 * row three times, the later reads from L1). The residual add that
 * precedes a norm may come in with it (`skip`): the row's sum is rounded
 * to bf16, written back (the stream's next value) and normalised, one
 * pass over the row where a product's epilogue with beta = 1 took about
 * 30 us more than with beta = 0 (GPT-2 774M, docs/cuda-backend.md).
 */
#include "executor/cuda/cuda_common.cuh"

#define LAYERNORM_EPS 1e-5f
#define ROWS_PER_FORWARD_BLOCK 8   /* one warp each */
#define FORWARD_MAX_GROUPS 8       /* 8-channel groups per lane: C <= 2048 */

/* s = x + k over a row, rounded to bf16, 8 channels a lane per access
 * (C % 8 == 0, 16-byte aligned) where a scalar loop moves 2 bytes; s may
 * be k (in place), so each thread issues the loads of ADD_GROUPS groups
 * before storing their sums. */
#define ADD_GROUPS 4
static __device__ inline void add_rows_vector(bf16 *s, const bf16 *x,
                                              const bf16 *k, int C, int lane)
{
    for (int first = lane * 8; first < C;
         first += ADD_GROUPS * WARP_SIZE * 8) {
        bf16x8 a[ADD_GROUPS], b[ADD_GROUPS];
#pragma unroll
        for (int g = 0; g < ADD_GROUPS; g++) {
            int c = first + g * WARP_SIZE * 8;
            if (c < C) {
                a[g] = *reinterpret_cast<const bf16x8 *>(x + c);
                b[g] = *reinterpret_cast<const bf16x8 *>(k + c);
            }
        }
#pragma unroll
        for (int g = 0; g < ADD_GROUPS; g++) {
            int c = first + g * WARP_SIZE * 8;
            if (c >= C)
                continue;
            float xs[8], ks[8];
            bf16x8_to_float(a[g], xs);
            bf16x8_to_float(b[g], ks);
#pragma unroll
            for (int i = 0; i < 8; i++)
                xs[i] = xs[i] + ks[i];
            store8(s + c, xs);
        }
    }
}

/* The generic forward (any C; `vector`: C % 8 == 0 and every pointer
 * 16-byte aligned, so a lane moves 8 channels per access): the row is
 * read three times, the later reads from L1. */
template <bool RMS>
__global__ void layernorm_forward_generic(bf16 *out, float *mean,
                                          float *rstd, const bf16 *inp,
                                          const bf16 *skip, bf16 *sum_out,
                                          const float *weight,
                                          const float *bias, int N, int C,
                                          float eps, bool vector)
{
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ROWS_PER_FORWARD_BLOCK + threadIdx.x / WARP_SIZE;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C;
    if (skip != NULL) {
        /* the residual sum first, rounded as the stream keeps it; the
         * passes below read it back (written by other lanes: the warp
         * synchronises its memory first) */
        const bf16 *k = skip + (size_t)row * C;
        bf16 *s = sum_out + (size_t)row * C;
        if (vector)
            add_rows_vector(s, x, k, C, lane);
        else
            for (int c = lane; c < C; c += WARP_SIZE)
                s[c] = __float2bfloat16_rn(__bfloat162float(x[c]) +
                                           __bfloat162float(k[c]));
        __syncwarp();
        x = s;
    }
    bf16 *y = out + (size_t)row * C;
    float sum = 0.0f;
    if (RMS) {
        /* no mean: the squares below are taken about zero */
    } else if (vector) {
        for (int c = lane * 8; c < C; c += WARP_SIZE * 8) {
            float xs[8];
            load8(xs, x + c);
            sum += (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) +
                   (xs[6] + xs[7]);
        }
    } else {
        for (int c = lane; c < C; c += WARP_SIZE)
            sum += __bfloat162float(x[c]);
    }
    float row_mean = RMS ? 0.0f : warp_sum(sum) / (float)C;
    float square_sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float centred = __bfloat162float(x[c]) - row_mean;
        square_sum += centred * centred;
    }
    float row_rstd = rsqrtf(warp_sum(square_sum) / (float)C + eps);
    if (vector) {
        for (int c = lane * 8; c < C; c += WARP_SIZE * 8) {
            float values[8], xs[8];
            load8(xs, x + c);
            float4 wa = *reinterpret_cast<const float4 *>(weight + c);
            float4 wb = *reinterpret_cast<const float4 *>(weight + c + 4);
            float ws[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
            float bs[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (!RMS) {
                float4 ba = *reinterpret_cast<const float4 *>(bias + c);
                float4 bb = *reinterpret_cast<const float4 *>(bias + c + 4);
                bs[0] = ba.x, bs[1] = ba.y, bs[2] = ba.z, bs[3] = ba.w;
                bs[4] = bb.x, bs[5] = bb.y, bs[6] = bb.z, bs[7] = bb.w;
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
                values[i] = RMS ? xs[i] * row_rstd * ws[i]
                                : (xs[i] - row_mean) * row_rstd * ws[i] +
                                      bs[i];
            *reinterpret_cast<bf16x8 *>(y + c) = float_to_bf16x8(values);
        }
    } else {
        for (int c = lane; c < C; c += WARP_SIZE) {
            float xc = __bfloat162float(x[c]);
            y[c] = __float2bfloat16_rn(
                RMS ? xc * row_rstd * weight[c]
                    : (xc - row_mean) * row_rstd * weight[c] + bias[c]);
        }
    }
    if (lane == 0) {
        if (!RMS && mean != NULL)
            mean[row] = row_mean;
        if (rstd != NULL)
            rstd[row] = row_rstd;
    }
}


/*
 * The forward of a row held in registers: lane l holds the 8-channel
 * groups l, l + 32, ... (G of them, C % 8 == 0, pointers 16-byte
 * aligned), so the row is read from memory once; the variance is taken
 * about the mean, two passes over the registers, as the cpu reference
 * does.
 */
template <int G, bool RMS>
__global__ void __launch_bounds__(ROWS_PER_FORWARD_BLOCK *WARP_SIZE)
layernorm_forward_cached(bf16 *out, float *mean, float *rstd,
                         const bf16 *inp, const bf16 *skip, bf16 *sum_out,
                         const float *weight, const float *bias, int N,
                         int C, float eps)
{
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ROWS_PER_FORWARD_BLOCK + threadIdx.x / WARP_SIZE;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C;
    float values[G][8];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++) {
        int c = (lane + k * WARP_SIZE) * 8;
        if (c < C) {
            load8(values[k], x + c);
            if (skip != NULL) {
                /* the residual sum, rounded as the stream keeps it */
                float added[8];
                load8(added, skip + (size_t)row * C + c);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    values[k][i] = __bfloat162float(
                        __float2bfloat16_rn(values[k][i] + added[i]));
                store8(sum_out + (size_t)row * C + c, values[k]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                values[k][i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            sum += values[k][i];
    }
    float row_mean = RMS ? 0.0f : warp_sum(sum) / (float)C;
    float square_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++) {
        if ((lane + k * WARP_SIZE) * 8 >= C)
            continue;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float centred = values[k][i] - row_mean;
            square_sum += centred * centred;
        }
    }
    float row_rstd = rsqrtf(warp_sum(square_sum) / (float)C + eps);
    bf16 *y = out + (size_t)row * C;
#pragma unroll
    for (int k = 0; k < G; k++) {
        int c = (lane + k * WARP_SIZE) * 8;
        if (c >= C)
            continue;
        float w[8], b[8], normed[8];
        load8(w, weight + c);
        if (!RMS)
            load8(b, bias + c);
#pragma unroll
        for (int i = 0; i < 8; i++)
            normed[i] = RMS ? values[k][i] * row_rstd * w[i]
                            : (values[k][i] - row_mean) * row_rstd * w[i] +
                                  b[i];
        store8(y + c, normed);
    }
    if (lane == 0) {
        if (!RMS && mean != NULL)
            mean[row] = row_mean;
        if (rstd != NULL)
            rstd[row] = row_rstd;
    }
}

/* The forward of either norm: the register-cached kernel where the row
 * fits (C <= 2048, vectorisable), else the generic one. */
template <bool RMS>
static cudaError_t launch_forward(pt_bf16 *out_bf16, float *mean,
                                  float *rstd, const pt_bf16 *inp_bf16,
                                  const pt_bf16 *skip_bf16,
                                  pt_bf16 *sum_bf16, const float *weight,
                                  const float *bias, int N, int C, float eps,
                                  cudaStream_t stream)
{
    if (N <= 0)
        return cudaSuccess;
    const bf16 *inp = as_bf16(inp_bf16);
    const bf16 *skip = skip_bf16 != NULL ? as_bf16(skip_bf16) : NULL;
    bf16 *sum = sum_bf16 != NULL ? as_bf16(sum_bf16) : NULL;
    bool vector = C % 8 == 0 && aligned16(out_bf16) && aligned16(inp) &&
                  aligned16(weight) && aligned16(bias) && aligned16(skip) &&
                  aligned16(sum);
    unsigned int blocks = blocks_for((size_t)N, ROWS_PER_FORWARD_BLOCK);
    unsigned int threads = ROWS_PER_FORWARD_BLOCK * WARP_SIZE;
    int groups = (C / 8 + WARP_SIZE - 1) / WARP_SIZE;
    bf16 *out = as_bf16(out_bf16);
    if (!vector || groups > FORWARD_MAX_GROUPS) {
        layernorm_forward_generic<RMS><<<blocks, threads, 0, stream>>>(
            out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps,
            vector);
        return cudaGetLastError();
    }
#define FORWARD_CASE(G)                                                      \
    case G:                                                                  \
        layernorm_forward_cached<G, RMS><<<blocks, threads, 0, stream>>>(    \
            out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps);      \
        break
    switch (groups) {
        FORWARD_CASE(1);
        FORWARD_CASE(2);
        FORWARD_CASE(3);
        FORWARD_CASE(4);
        FORWARD_CASE(5);
        FORWARD_CASE(6);
        FORWARD_CASE(7);
        default:
        FORWARD_CASE(8);
    }
#undef FORWARD_CASE
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_layernorm_forward(pt_bf16 *out_bf16, float *mean,
                                              float *rstd,
                                              const pt_bf16 *inp_bf16,
                                              const float *weight,
                                              const float *bias, int N, int C,
                                              cudaStream_t stream)
{
    return launch_forward<false>(out_bf16, mean, rstd, inp_bf16, NULL, NULL,
                                 weight, bias, N, C, LAYERNORM_EPS, stream);
}

extern "C" cudaError_t cuda_rmsnorm_forward(pt_bf16 *out_bf16, float *rstd,
                                            const pt_bf16 *inp_bf16,
                                            const float *weight, float eps,
                                            int N, int C, cudaStream_t stream)
{
    return launch_forward<true>(out_bf16, NULL, rstd, inp_bf16, NULL, NULL,
                                weight, NULL, N, C, eps, stream);
}

extern "C" cudaError_t cuda_norm_forward_after_add(
    pt_bf16 *out_bf16, float *mean, float *rstd, pt_bf16 *sum_bf16,
    const pt_bf16 *inp_bf16, const pt_bf16 *skip_bf16, const float *weight,
    const float *bias, bool rms, float eps, int N, int C,
    cudaStream_t stream)
{
    if (rms)
        return launch_forward<true>(out_bf16, NULL, rstd, inp_bf16,
                                    skip_bf16, sum_bf16, weight, NULL, N, C,
                                    eps, stream);
    /* layer norm's eps is its fixed one, as cuda_layernorm_forward's */
    return launch_forward<false>(out_bf16, mean, rstd, inp_bf16, skip_bf16,
                                 sum_bf16, weight, bias, N, C, LAYERNORM_EPS,
                                 stream);
}
