/*
 * Reductions with a fixed summation order (results do not change between
 * runs): bias gradients (column sums of a bf16 matrix), the sum of
 * squares of the gradients (for the global norm), whole or per tensor,
 * the mean loss, and the one-stage step's clipping coefficient.
 */
#include "executor/cuda/cuda_common.cuh"

/* Bias gradient: a block covers BIAS_COLUMNS columns (32 threads across,
 * VECTOR columns each) and BIAS_ROWS rows (8 threads down, each summing
 * every 8th row); the 8 partial sums are then added in order. */
#define BIAS_ROWS CUDA_BIAS_GRAD_ROWS /* kernel_sizes.h */
#define BIAS_LANES_DOWN 8

template <int VECTOR>
__global__ void bias_grad_partial_kernel(float *partials, const bf16 *d_out,
                                         int N, int OC)
{
    __shared__ float sums[BIAS_LANES_DOWN][WARP_SIZE * VECTOR];
    int column = (blockIdx.x * WARP_SIZE + threadIdx.x) * VECTOR;
    int first_row = blockIdx.y * BIAS_ROWS;
    int last_row = min(first_row + BIAS_ROWS, N);
    float acc[VECTOR];
#pragma unroll
    for (int i = 0; i < VECTOR; i++)
        acc[i] = 0.0f;
    if (column < OC) {
        for (int row = first_row + threadIdx.y; row < last_row;
             row += BIAS_LANES_DOWN) {
            const bf16 *p = d_out + (size_t)row * OC + column;
            if (VECTOR == 8) {
                float values[8];
                bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(p), values);
#pragma unroll
                for (int i = 0; i < VECTOR; i++)
                    acc[i] += values[i];
            } else {
                acc[0] += __bfloat162float(p[0]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < VECTOR; i++)
        sums[threadIdx.y][threadIdx.x * VECTOR + i] = acc[i];
    __syncthreads();
    if (threadIdx.y != 0 || column >= OC)
        return;
#pragma unroll
    for (int i = 0; i < VECTOR; i++) {
        float total = 0.0f;
        for (int y = 0; y < BIAS_LANES_DOWN; y++)
            total += sums[y][threadIdx.x * VECTOR + i];
        partials[(size_t)blockIdx.y * OC + column + i] = total;
    }
}

__global__ void bias_grad_finish_kernel(cuda_grad d_bias,
                                        const float *partials, int chunks,
                                        int OC)
{
    int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= OC)
        return;
    float total = 0.0f;
    for (int chunk = 0; chunk < chunks; chunk++)
        total += partials[(size_t)chunk * OC + column];
    grad_add(d_bias, (size_t)column, total);
}

extern "C" cudaError_t cuda_bias_grad(cuda_grad d_bias,
                                      const pt_bf16 *d_out_bf16,
                                      float *scratch, int N, int OC,
                                      cudaStream_t stream)
{
    int chunks = (int)blocks_for((size_t)N, BIAS_ROWS);
    dim3 threads(WARP_SIZE, BIAS_LANES_DOWN);
    if (OC % 8 == 0 && aligned16(d_out_bf16)) {
        dim3 grid(blocks_for((size_t)OC, WARP_SIZE * 8), (unsigned)chunks);
        bias_grad_partial_kernel<8><<<grid, threads, 0, stream>>>(
            scratch, as_bf16(d_out_bf16), N, OC);
    } else {
        dim3 grid(blocks_for((size_t)OC, WARP_SIZE), (unsigned)chunks);
        bias_grad_partial_kernel<1><<<grid, threads, 0, stream>>>(
            scratch, as_bf16(d_out_bf16), N, OC);
    }
    bias_grad_finish_kernel<<<blocks_for((size_t)OC, 256), 256, 0, stream>>>(
        d_bias, scratch, chunks, OC);
    return cudaGetLastError();
}

/* ------------------------------------------------------- sum of squares */

#define SQUARE_BLOCKS CUDA_SQUARE_SUM_BLOCKS /* kernel_sizes.h */
#define SQUARE_THREADS 256

static __device__ double block_sum_double(double value)
{
    __shared__ double warp_sums[WARP_SIZE];
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    value = warp_sum_double(value);
    if (lane == 0)
        warp_sums[warp] = value;
    __syncthreads();
    int warps = blockDim.x / WARP_SIZE;
    value = lane < warps ? warp_sums[lane] : 0.0;
    return warp_sum_double(value);
}

/* G: the gradients' element type, float or bf16 (cuda_grad). */
template <typename G>
__global__ void square_sum_partial_kernel(double *partials, const G *values,
                                          size_t count, bool vector)
{
    double sum = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vector) {
        size_t quads = count / 4;
#pragma unroll 4
        for (size_t i = first; i < quads; i += stride) {
            float4 v = load_quad(values, i);
            sum += (double)(v.x * v.x + v.y * v.y) +
                   (double)(v.z * v.z + v.w * v.w);
        }
        for (size_t i = quads * 4 + first; i < count; i += stride) {
            float value = load_one(values, i);
            sum += (double)value * value;
        }
    } else {
        for (size_t i = first; i < count; i += stride) {
            float value = load_one(values, i);
            sum += (double)value * value;
        }
    }
    sum = block_sum_double(sum);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = sum;
}

__global__ void sum_doubles_kernel(double *out, const double *values,
                                   int count)
{
    double sum = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x)
        sum += values[i];
    sum = block_sum_double(sum);
    if (threadIdx.x == 0)
        out[0] = sum;
}

extern "C" cudaError_t cuda_square_sum(double *out, cuda_grad values,
                                       size_t count, double *scratch,
                                       cudaStream_t stream)
{
    /* quads of bf16 are 8 bytes: 16-byte alignment covers both */
    bool vector = aligned16(values.data);
    if (values.bf16)
        square_sum_partial_kernel<bf16>
            <<<SQUARE_BLOCKS, SQUARE_THREADS, 0, stream>>>(
                scratch, static_cast<const bf16 *>(values.data), count,
                vector);
    else
        square_sum_partial_kernel<float>
            <<<SQUARE_BLOCKS, SQUARE_THREADS, 0, stream>>>(
                scratch, static_cast<const float *>(values.data), count,
                vector);
    sum_doubles_kernel<<<1, 1024, 0, stream>>>(out, scratch, SQUARE_BLOCKS);
    return cudaGetLastError();
}

/* Per tensor: one block per optimizer chunk sums its squares, then one
 * block per tensor adds its chunks' sums in chunk order. Two launches
 * whatever the number of tensors, and a fixed summation order. A chunk
 * that starts on 16 bytes is read in float4s, as the whole-buffer sum
 * reads: with one scalar load per thread and step the kernel ran 2.4-3 x
 * slower than the bytes it reads at the GPU's streaming rate
 * (docs/cost-model.md, section 7, step 3). */
template <typename G>
__global__ void square_sum_chunks_kernel(double *chunk_sums, const G *values,
                                         const param_chunk *chunks)
{
    param_chunk chunk = chunks[blockIdx.x];
    const G *v = values + chunk.offset;
    double sum = 0.0;
    uint32_t scalar_first = 0;
    /* a quad: 16 bytes of fp32, 8 of bf16 */
    if (((uintptr_t)v & (4 * sizeof(G) - 1)) == 0) {
        uint32_t quads = chunk.count / 4;
#pragma unroll 4
        for (uint32_t i = threadIdx.x; i < quads; i += blockDim.x) {
            float4 q = load_quad(v, i);
            /* squared in double, as the scalar loop does: the per-tensor
             * sums are held to the host's within 1e-9 */
            sum += (double)q.x * q.x + (double)q.y * q.y +
                   (double)q.z * q.z + (double)q.w * q.w;
        }
        scalar_first = quads * 4;
    }
    for (uint32_t i = scalar_first + threadIdx.x; i < chunk.count;
         i += blockDim.x) {
        float value = load_one(v, i);
        sum += (double)value * value;
    }
    sum = block_sum_double(sum);
    if (threadIdx.x == 0)
        chunk_sums[blockIdx.x] = sum;
}

__global__ void sum_chunk_ranges_kernel(double *out, const double *chunk_sums,
                                        const int *tensor_chunk_starts)
{
    int tensor = blockIdx.x;
    double sum = 0.0;
    for (int i = tensor_chunk_starts[tensor] + (int)threadIdx.x;
         i < tensor_chunk_starts[tensor + 1]; i += blockDim.x)
        sum += chunk_sums[i];
    sum = block_sum_double(sum);
    if (threadIdx.x == 0)
        out[tensor] = sum;
}

extern "C" cudaError_t cuda_square_sums_per_tensor(
    double *out, cuda_grad values, const param_chunk *chunks,
    int chunk_count, const int *tensor_chunk_starts, int tensor_count,
    double *chunk_sums, cudaStream_t stream)
{
    if (chunk_count == 0 || tensor_count == 0)
        return cudaSuccess;
    if (values.bf16)
        square_sum_chunks_kernel<bf16>
            <<<chunk_count, SQUARE_THREADS, 0, stream>>>(
                chunk_sums, static_cast<const bf16 *>(values.data), chunks);
    else
        square_sum_chunks_kernel<float>
            <<<chunk_count, SQUARE_THREADS, 0, stream>>>(
                chunk_sums, static_cast<const float *>(values.data), chunks);
    sum_chunk_ranges_kernel<<<tensor_count, SQUARE_THREADS, 0, stream>>>(
        out, chunk_sums, tensor_chunk_starts);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ mean */

/* The mean of values[0..count) in double, on thread 0 of the block. */
static __device__ double block_mean(const float *values, int count)
{
    double sum = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x)
        sum += values[i];
    return block_sum_double(sum) / count;
}

__global__ void mean_kernel(double *out, const float *values, int count)
{
    double mean = block_mean(values, count);
    if (threadIdx.x == 0)
        out[0] = mean;
}

extern "C" cudaError_t cuda_mean(double *out, const float *values, int count,
                                 cudaStream_t stream)
{
    mean_kernel<<<1, 1024, 0, stream>>>(out, values, count);
    return cudaGetLastError();
}

/* the float the host read back before the step stayed on the device,
 * widened again, so the sum is the host's to the bit */
__global__ void mean_add_kernel(double *sum, const float *values, int count)
{
    double mean = block_mean(values, count);
    if (threadIdx.x == 0)
        sum[0] += (double)(float)mean;
}

extern "C" cudaError_t cuda_mean_add(double *sum, const float *values,
                                     int count, cudaStream_t stream)
{
    mean_add_kernel<<<1, 1024, 0, stream>>>(sum, values, count);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- clipping */

/* clip_coefficient (executor/stage/optimizer.c) on the device: sqrt and
 * the division in double are correctly rounded on both sides, so the
 * norm and the coefficient are the host's. */
__global__ void step_clip_kernel(cuda_step_values *step, float max_norm)
{
    double norm = sqrt(step->square_sum);
    step->grad_norm = norm;
    step->non_finite = !isfinite(step->loss_sum) || !isfinite(norm);
    float scale = 1.0f;
    if (max_norm > 0.0f && norm > max_norm)
        scale = (float)(max_norm / (norm + 1e-6));
    step->clip_scale = scale;
}

extern "C" cudaError_t cuda_step_clip(cuda_step_values *step, float max_norm,
                                      cudaStream_t stream)
{
    step_clip_kernel<<<1, 1, 0, stream>>>(step, max_norm);
    return cudaGetLastError();
}
