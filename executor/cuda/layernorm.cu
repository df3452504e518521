/*
 * Layer norm, forward and backward. One warp per row: a row (C <= a few
 * thousand floats) is read up to three times, the later reads from L1.
 * The forward reads the fp32 residual stream and writes bf16, the input
 * of the next matrix product. The backward fuses the residual branch
 * point (d_inp = d_residual + the norm's own term) and writes the bf16
 * copy the next matrix products read; its weight and bias gradients are
 * summed per block of rows and then over blocks, in a fixed order.
 */
#include "executor/cuda/cuda_common.cuh"

#define LAYERNORM_EPS 1e-5f
#define ROWS_PER_FORWARD_BLOCK 8   /* one warp each */
#define BACKWARD_THREADS 256

/* `vector`: C % 8 == 0 and every pointer 16-byte aligned, so a lane moves
 * 8 channels per access. */
__global__ void layernorm_forward_kernel(bf16 *out, float *mean, float *rstd,
                                         const float *inp,
                                         const float *weight,
                                         const float *bias, int N, int C,
                                         bool vector)
{
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ROWS_PER_FORWARD_BLOCK + threadIdx.x / WARP_SIZE;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C;
    bf16 *y = out + (size_t)row * C;
    float sum = 0.0f;
    if (vector) {
        for (int c = lane * 8; c < C; c += WARP_SIZE * 8) {
            float4 a = *reinterpret_cast<const float4 *>(x + c);
            float4 b = *reinterpret_cast<const float4 *>(x + c + 4);
            sum += (a.x + a.y) + (a.z + a.w) + (b.x + b.y) + (b.z + b.w);
        }
    } else {
        for (int c = lane; c < C; c += WARP_SIZE)
            sum += x[c];
    }
    float row_mean = warp_sum(sum) / (float)C;
    float square_sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float centred = x[c] - row_mean;
        square_sum += centred * centred;
    }
    float row_rstd = rsqrtf(warp_sum(square_sum) / (float)C + LAYERNORM_EPS);
    if (vector) {
        for (int c = lane * 8; c < C; c += WARP_SIZE * 8) {
            float values[8];
            float4 a = *reinterpret_cast<const float4 *>(x + c);
            float4 b = *reinterpret_cast<const float4 *>(x + c + 4);
            float4 wa = *reinterpret_cast<const float4 *>(weight + c);
            float4 wb = *reinterpret_cast<const float4 *>(weight + c + 4);
            float4 ba = *reinterpret_cast<const float4 *>(bias + c);
            float4 bb = *reinterpret_cast<const float4 *>(bias + c + 4);
            float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float ws[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
            float bs[8] = {ba.x, ba.y, ba.z, ba.w, bb.x, bb.y, bb.z, bb.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
                values[i] = (xs[i] - row_mean) * row_rstd * ws[i] + bs[i];
            *reinterpret_cast<bf16x8 *>(y + c) = float_to_bf16x8(values);
        }
    } else {
        for (int c = lane; c < C; c += WARP_SIZE)
            y[c] = __float2bfloat16_rn((x[c] - row_mean) * row_rstd *
                                           weight[c] +
                                       bias[c]);
    }
    if (lane == 0) {
        if (mean != NULL)
            mean[row] = row_mean;
        if (rstd != NULL)
            rstd[row] = row_rstd;
    }
}

extern "C" cudaError_t cuda_layernorm_forward(pt_bf16 *out_bf16, float *mean,
                                              float *rstd, const float *inp,
                                              const float *weight,
                                              const float *bias, int N, int C,
                                              cudaStream_t stream)
{
    bool vector = C % 8 == 0 && aligned16(out_bf16) && aligned16(inp) &&
                  aligned16(weight) && aligned16(bias);
    layernorm_forward_kernel<<<blocks_for((size_t)N, ROWS_PER_FORWARD_BLOCK),
                               ROWS_PER_FORWARD_BLOCK * WARP_SIZE, 0,
                               stream>>>(as_bf16(out_bf16), mean, rstd, inp,
                                         weight, bias, N, C, vector);
    return cudaGetLastError();
}

/*
 * A block owns BACKWARD_ROWS rows. Phase 1, row-parallel: one warp per
 * row writes d_inp (fp32 and bf16). Phase 2, column-parallel: each thread
 * sums dy x xhat and dy of 8 columns (VECTOR) over a share of the block's
 * rows (re-read from L2, where phase 1 just left them); the shares are
 * added in order in shared memory and written as the block's partials
 * (partials[block][0..C) weight, [C..2C) bias). One kernel, and so one
 * long function: the two phases share the block's rows through L2 and
 * its shared memory, which a second kernel or a call would not keep.
 */
#define BACKWARD_ROWS CUDA_LAYERNORM_BACKWARD_ROWS /* kernel_sizes.h */
#define PARTIAL_SPACE (BACKWARD_THREADS * 16)

template <int VECTOR>
__global__ void __launch_bounds__(BACKWARD_THREADS)
layernorm_backward_kernel(float *d_inp, bf16 *d_inp_bf16, float *partials,
                          const float *d_residual, const bf16 *d_out,
                          const float *inp, const float *weight,
                          const float *mean, const float *rstd, int N, int C)
{
    __shared__ float shares[PARTIAL_SPACE];
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int warps = blockDim.x / WARP_SIZE;
    int first_row = blockIdx.x * BACKWARD_ROWS;
    int last_row = min(first_row + BACKWARD_ROWS, N);
    for (int row = first_row + warp; row < last_row; row += warps) {
        size_t base = (size_t)row * C;
        float row_mean = mean[row];
        float row_rstd = rstd[row];
        float g_sum = 0.0f;
        float g_xhat_sum = 0.0f;
        for (int c = lane * VECTOR; c < C; c += WARP_SIZE * VECTOR) {
            float dy[VECTOR], x[VECTOR], w[VECTOR];
            if (VECTOR == 8) {
                load8(dy, d_out + base + c);
                load8(x, inp + base + c);
                load8(w, weight + c);
            } else {
                dy[0] = __bfloat162float(d_out[base + c]);
                x[0] = inp[base + c];
                w[0] = weight[c];
            }
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                float g = dy[i] * w[i];
                g_sum += g;
                g_xhat_sum += g * (x[i] - row_mean) * row_rstd;
            }
        }
        float g_mean = warp_sum(g_sum) / (float)C;
        float g_xhat_mean = warp_sum(g_xhat_sum) / (float)C;
        for (int c = lane * VECTOR; c < C; c += WARP_SIZE * VECTOR) {
            float dy[VECTOR], x[VECTOR], w[VECTOR], value[VECTOR];
            if (VECTOR == 8) {
                load8(dy, d_out + base + c);
                load8(x, inp + base + c);
                load8(w, weight + c);
            } else {
                dy[0] = __bfloat162float(d_out[base + c]);
                x[0] = inp[base + c];
                w[0] = weight[c];
            }
            float residual[VECTOR];
#pragma unroll
            for (int i = 0; i < VECTOR; i++)
                residual[i] = 0.0f;
            if (d_residual != NULL) {
                if (VECTOR == 8)
                    load8(residual, d_residual + base + c);
                else
                    residual[0] = d_residual[base + c];
            }
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                float xhat = (x[i] - row_mean) * row_rstd;
                value[i] = residual[i] + row_rstd * (dy[i] * w[i] - g_mean -
                                                     xhat * g_xhat_mean);
            }
            if (VECTOR == 8) {
                store8(d_inp + base + c, value);
                if (d_inp_bf16 != NULL)
                    store8(d_inp_bf16 + base + c, value);
            } else {
                d_inp[base + c] = value[0];
                if (d_inp_bf16 != NULL)
                    d_inp_bf16[base + c] = __float2bfloat16_rn(value[0]);
            }
        }
    }

    /* phase 2: `lanes` threads share each group of VECTOR columns */
    int groups = C / VECTOR;
    int lanes = max(1, (int)blockDim.x / groups);
    float *weight_partial = partials + (size_t)blockIdx.x * 2 * C;
    float *bias_partial = weight_partial + C;
    for (int item = threadIdx.x; item < groups * lanes; item += blockDim.x) {
        int group = item % groups;
        int share = item / groups;
        int c = group * VECTOR;
        float dw[VECTOR], db[VECTOR];
#pragma unroll
        for (int i = 0; i < VECTOR; i++)
            dw[i] = db[i] = 0.0f;
        for (int row = first_row + share; row < last_row; row += lanes) {
            size_t base = (size_t)row * C + c;
            float dy[VECTOR], x[VECTOR];
            if (VECTOR == 8) {
                load8(dy, d_out + base);
                load8(x, inp + base);
            } else {
                dy[0] = __bfloat162float(d_out[base]);
                x[0] = inp[base];
            }
            float row_mean = mean[row];
            float row_rstd = rstd[row];
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                dw[i] += dy[i] * (x[i] - row_mean) * row_rstd;
                db[i] += dy[i];
            }
        }
        if (lanes == 1) {
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                weight_partial[c + i] = dw[i];
                bias_partial[c + i] = db[i];
            }
        } else {
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                shares[share * 2 * C + c + i] = dw[i];
                shares[share * 2 * C + C + c + i] = db[i];
            }
        }
    }
    if (lanes == 1)
        return;
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * C; j += blockDim.x) {
        float total = 0.0f;
        for (int share = 0; share < lanes; share++)
            total += shares[share * 2 * C + j];
        weight_partial[j] = total; /* bias_partial follows weight_partial */
    }
}

/* Sums the blocks' partials of each of the 2C columns in block order
 * (8 threads down the blocks, then in shared memory) and adds them to the
 * gradients. */
__global__ void layernorm_partials_kernel(float *d_weight, float *d_bias,
                                          const float *partials, int blocks,
                                          int C)
{
    __shared__ float sums[8][WARP_SIZE + 1];
    int j = blockIdx.x * WARP_SIZE + threadIdx.x;
    float total = 0.0f;
    if (j < 2 * C)
        for (int b = threadIdx.y; b < blocks; b += 8)
            total += partials[(size_t)b * 2 * C + j];
    sums[threadIdx.y][threadIdx.x] = total;
    __syncthreads();
    if (threadIdx.y != 0 || j >= 2 * C)
        return;
    for (int y = 1; y < 8; y++)
        total += sums[y][threadIdx.x];
    if (j < C) {
        if (d_weight != NULL)
            d_weight[j] += total;
    } else if (d_bias != NULL) {
        d_bias[j - C] += total;
    }
}

extern "C" cudaError_t cuda_layernorm_backward(
    float *d_inp, pt_bf16 *d_inp_bf16, float *d_weight, float *d_bias,
    const float *d_residual, const pt_bf16 *d_out_bf16, const float *inp,
    const float *weight, const float *mean, const float *rstd,
    float *scratch, int N, int C, cudaStream_t stream)
{
    int blocks = (int)blocks_for((size_t)N, BACKWARD_ROWS);
    bool vector = C % 8 == 0 && aligned16(d_inp) && aligned16(d_out_bf16) &&
                  aligned16(inp) && aligned16(weight) &&
                  (d_inp_bf16 == NULL || aligned16(d_inp_bf16)) &&
                  (d_residual == NULL || aligned16(d_residual));
    /* the shared shares hold lanes x 2C floats: lanes x C <= 8 x threads
     * for the vector path, 1 x threads for the scalar one */
    if (vector)
        layernorm_backward_kernel<8><<<blocks, BACKWARD_THREADS, 0, stream>>>(
            d_inp, as_bf16(d_inp_bf16), scratch, d_residual,
            as_bf16(d_out_bf16), inp, weight, mean, rstd, N, C);
    else
        layernorm_backward_kernel<1><<<blocks, BACKWARD_THREADS, 0, stream>>>(
            d_inp, as_bf16(d_inp_bf16), scratch, d_residual,
            as_bf16(d_out_bf16), inp, weight, mean, rstd, N, C);
    dim3 threads(WARP_SIZE, 8);
    layernorm_partials_kernel<<<blocks_for((size_t)2 * C, WARP_SIZE), threads,
                                0, stream>>>(d_weight, d_bias, scratch,
                                             blocks, C);
    return cudaGetLastError();
}
