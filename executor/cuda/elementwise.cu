/*
 * Element-wise kernels of the cuda backend: fp32 <-> bf16 conversion,
 * in-place addition, the bf16 residual stream made from an fp32 or bf16
 * sum (a row-parallel layer's after its tensor-parallel sum, with its
 * bias and skip; the embedding's; a pipeline's received rows), and the
 * GELU pair used when the matrix products cannot fuse it (or the
 * backward recomputes it). All memory-bound: eight
 * elements per thread through 16-byte accesses where the pointers allow.
 */
#include <string.h>

#include "executor/cuda/cuda_common.cuh"

extern "C" pt_bf16 pt_float_to_bf16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
        return (pt_bf16)((bits >> 16) | 0x0040u); /* keep NaN a NaN */
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return (pt_bf16)((bits + rounding) >> 16);
}

extern "C" float pt_bf16_to_float(pt_bf16 value)
{
    uint32_t bits = (uint32_t)value << 16;
    float result;
    memcpy(&result, &bits, sizeof result);
    return result;
}

#define ELEMENTWISE_THREADS 256

static __device__ inline void store_one(float *values, size_t i, float v)
{
    values[i] = v;
}

static __device__ inline void store_one(bf16 *values, size_t i, float v)
{
    values[i] = __float2bfloat16_rn(v);
}

/* fp32 <-> bf16: each thread handles 8 consecutive elements; `vector`
 * says every pointer is 16-byte aligned so the 8 move in one access. */
template <typename Out, typename In>
__global__ void convert_kernel(Out *out, const In *in, size_t count,
                               bool vector)
{
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (start >= count)
        return;
    if (vector && start + 8 <= count) {
        float values[8];
        load8(values, in + start);
        store8(out + start, values);
        return;
    }
    for (size_t i = start; i < count && i < start + 8; i++)
        store_one(out, i, load_one(in, i));
}

template <typename Out, typename In>
static cudaError_t launch_convert(Out *out, const In *in, size_t count,
                                  cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    bool vector = aligned16(out) && aligned16(in);
    convert_kernel<<<blocks_for(count, ELEMENTWISE_THREADS * 8),
                     ELEMENTWISE_THREADS, 0, stream>>>(out, in, count,
                                                       vector);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_convert_to_bf16(pt_bf16 *out_bf16,
                                            const float *in, size_t count,
                                            cudaStream_t stream)
{
    return launch_convert(as_bf16(out_bf16), in, count, stream);
}

__global__ void add_inplace_kernel(float *dst, const float *src,
                                   size_t count)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count)
        dst[i] += src[i];
}

extern "C" cudaError_t cuda_add_inplace(float *dst, const float *src,
                                        size_t count, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    add_inplace_kernel<<<blocks_for(count, ELEMENTWISE_THREADS),
                         ELEMENTWISE_THREADS, 0, stream>>>(dst, src, count);
    return cudaGetLastError();
}

__global__ void add_into_grad_kernel(cuda_grad dst, const float *src,
                                     size_t count)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count)
        grad_add(dst, i, src[i]);
}

extern "C" cudaError_t cuda_add_into_grad(cuda_grad dst, const float *src,
                                          size_t count, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    add_into_grad_kernel<<<blocks_for(count, ELEMENTWISE_THREADS),
                           ELEMENTWISE_THREADS, 0, stream>>>(dst, src, count);
    return cudaGetLastError();
}

__global__ void gelu_forward_kernel(bf16 *out, const bf16 *in, size_t count,
                                    bool vector)
{
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (start >= count)
        return;
    if (vector && start + 8 <= count) {
        float x[8];
        bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(in + start), x);
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = gelu_value(x[i]);
        *reinterpret_cast<bf16x8 *>(out + start) = float_to_bf16x8(x);
        return;
    }
    for (size_t i = start; i < count && i < start + 8; i++)
        out[i] = __float2bfloat16_rn(gelu_value(__bfloat162float(in[i])));
}

extern "C" cudaError_t cuda_gelu_forward(pt_bf16 *out_bf16,
                                         const pt_bf16 *in_bf16, size_t count,
                                         cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    bool vector = aligned16(out_bf16) && aligned16(in_bf16);
    gelu_forward_kernel<<<blocks_for(count, ELEMENTWISE_THREADS * 8),
                          ELEMENTWISE_THREADS, 0, stream>>>(
        as_bf16(out_bf16), as_bf16(in_bf16), count, vector);
    return cudaGetLastError();
}

__global__ void gelu_backward_kernel(bf16 *d_in, const bf16 *d_out,
                                     const bf16 *in, size_t count,
                                     bool vector)
{
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (start >= count)
        return;
    if (vector && start + 8 <= count) {
        float x[8], dy[8];
        bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(in + start), x);
        bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(d_out + start),
                        dy);
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = gelu_derivative(x[i]) * dy[i];
        *reinterpret_cast<bf16x8 *>(d_in + start) = float_to_bf16x8(x);
        return;
    }
    for (size_t i = start; i < count && i < start + 8; i++)
        d_in[i] = __float2bfloat16_rn(gelu_derivative(__bfloat162float(in[i])) *
                                      __bfloat162float(d_out[i]));
}

extern "C" cudaError_t cuda_gelu_backward(pt_bf16 *d_in_bf16,
                                          const pt_bf16 *d_out_bf16,
                                          const pt_bf16 *in_bf16,
                                          size_t count, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    bool vector = aligned16(d_in_bf16) && aligned16(d_out_bf16) &&
                  aligned16(in_bf16);
    gelu_backward_kernel<<<blocks_for(count, ELEMENTWISE_THREADS * 8),
                           ELEMENTWISE_THREADS, 0, stream>>>(
        as_bf16(d_in_bf16), as_bf16(d_out_bf16), as_bf16(in_bf16), count,
        vector);
    return cudaGetLastError();
}

/* One thread per 4 consecutive columns of a row (C % 4 == 0, pointers
 * 16-byte aligned) or per element. */
__global__ void add_broadcast_rows_kernel(float *out, const float *rows,
                                          int period, const float *residual,
                                          int N, int C, bool vector)
{
    int width = vector ? 4 : 1;
    size_t index = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * width;
    if (index >= (size_t)N * C)
        return;
    size_t n = index / (size_t)C;
    const float *row = rows + (n % (size_t)period) * (size_t)C +
                       index % (size_t)C;
    if (vector) {
        float4 value = *reinterpret_cast<float4 *>(out + index);
        float4 add = *reinterpret_cast<const float4 *>(row);
        float4 skip = residual != NULL
                          ? *reinterpret_cast<const float4 *>(residual + index)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        value.x += add.x + skip.x;
        value.y += add.y + skip.y;
        value.z += add.z + skip.z;
        value.w += add.w + skip.w;
        *reinterpret_cast<float4 *>(out + index) = value;
        return;
    }
    out[index] += row[0] + (residual != NULL ? residual[index] : 0.0f);
}

extern "C" cudaError_t cuda_add_broadcast_rows(float *out, const float *rows,
                                               int period,
                                               const float *residual, int N,
                                               int C, cudaStream_t stream)
{
    size_t count = (size_t)N * C;
    if (count == 0)
        return cudaSuccess;
    bool vector = C % 4 == 0 && aligned16(out) && aligned16(rows) &&
                  (residual == NULL || aligned16(residual));
    size_t threads = vector ? count / 4 : count;
    add_broadcast_rows_kernel<<<blocks_for(threads, ELEMENTWISE_THREADS),
                                ELEMENTWISE_THREADS, 0, stream>>>(
        out, rows, period, residual, N, C, vector);
    return cudaGetLastError();
}

/* The bf16 residual stream from a sum of type In (fp32 or bf16): eight
 * consecutive columns of a row per thread (C % 8 == 0, pointers 16-byte
 * aligned) or one element; added in fp32 registers, rounded once. */
template <typename In>
__global__ void stream_from_kernel(bf16 *out, const In *in, const float *rows,
                                   int period, const bf16 *residual, int N,
                                   int C, bool vector)
{
    int width = vector ? 8 : 1;
    size_t index = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * width;
    if (index >= (size_t)N * C)
        return;
    size_t n = index / (size_t)C, column = index % (size_t)C;
    const float *row =
        rows != NULL ? rows + (n % (size_t)period) * (size_t)C + column : NULL;
    if (vector) {
        float value[8], add[8] = {0, 0, 0, 0, 0, 0, 0, 0},
                        skip[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        load8(value, in + index);
        if (row != NULL)
            load8(add, row);
        if (residual != NULL)
            load8(skip, residual + index);
#pragma unroll
        for (int i = 0; i < 8; i++)
            value[i] += add[i] + skip[i];
        store8(out + index, value);
        return;
    }
    float value = load_one(in, index) + (row != NULL ? row[0] : 0.0f) +
                  (residual != NULL ? __bfloat162float(residual[index])
                                    : 0.0f);
    out[index] = __float2bfloat16_rn(value);
}

template <typename In>
static cudaError_t launch_stream_from(bf16 *out, const In *in,
                                      const float *rows, int period,
                                      const bf16 *residual, int N, int C,
                                      cudaStream_t stream)
{
    size_t count = (size_t)N * C;
    if (count == 0)
        return cudaSuccess;
    bool vector = C % 8 == 0 && aligned16(out) && aligned16(in) &&
                  (rows == NULL || aligned16(rows)) &&
                  (residual == NULL || aligned16(residual));
    size_t threads = vector ? count / 8 : count;
    stream_from_kernel<In><<<blocks_for(threads, ELEMENTWISE_THREADS),
                             ELEMENTWISE_THREADS, 0, stream>>>(
        out, in, rows, period > 0 ? period : 1, residual, N, C, vector);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_stream_from_float(pt_bf16 *out_bf16,
                                              const float *in,
                                              const float *rows, int period,
                                              const pt_bf16 *residual_bf16,
                                              int N, int C,
                                              cudaStream_t stream)
{
    return launch_stream_from(as_bf16(out_bf16), in, rows, period,
                              as_bf16(residual_bf16), N, C, stream);
}

extern "C" cudaError_t cuda_stream_from_bf16(pt_bf16 *out_bf16,
                                             const pt_bf16 *in_bf16,
                                             const float *bias,
                                             const pt_bf16 *residual_bf16,
                                             int N, int C,
                                             cudaStream_t stream)
{
    return launch_stream_from(as_bf16(out_bf16), as_bf16(in_bf16), bias, 1,
                              as_bf16(residual_bf16), N, C, stream);
}

extern "C" cudaError_t cuda_convert_to_float(float *out,
                                             const pt_bf16 *in_bf16,
                                             size_t count,
                                             cudaStream_t stream)
{
    return launch_convert(out, as_bf16(in_bf16), count, stream);
}
