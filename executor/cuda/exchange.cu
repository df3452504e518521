/*
 * The kernels of the device exchange (executor/comm/exchange.c), the comm
 * of ranks that share one GPU: a reduction of the members' buffers
 * written to one or all of them (the steps of its collectives, and its
 * copies), and the pacing pair that makes an exchange last as long as the
 * emulated link would take. Memory-bound; eight elements per thread
 * through 16-byte accesses where every pointer allows.
 */
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_common.cuh"

#define EXCHANGE_THREADS 256
/* Enough blocks to fill an H200 several times; the loop strides. */
#define EXCHANGE_MAX_BLOCKS 1024

static __device__ inline float combine(float a, float b, bool max)
{
    return max ? (b > a ? b : a) : a + b;
}

/* Eight values in or out as 16-byte accesses the compiler keeps whole:
 * the values go through float4 / uint4 registers. (cuda_common.cuh's
 * load8 / store8 reinterpret the value array or a struct of bf16 pairs,
 * which here compiled to 4-byte accesses, eight scalar stores a run: the
 * kernel moved 500 GB/s on a 64-SM slice of an H100, measured with ncu
 * on 2026-11-25.) bf16 widens exactly (its bits are fp32's top half) and
 * narrows with the same rounding as __float2bfloat16_rn. */
static __device__ inline void exchange_load8(float *out, const float *p)
{
    float4 a = reinterpret_cast<const float4 *>(p)[0];
    float4 b = reinterpret_cast<const float4 *>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

static __device__ inline void exchange_load8(float *out, const bf16 *p)
{
    uint4 raw = *reinterpret_cast<const uint4 *>(p);
    unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(words[i] << 16);
        out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}

static __device__ inline void exchange_store8(float *p, const float *in)
{
    reinterpret_cast<float4 *>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
    reinterpret_cast<float4 *>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
}

static __device__ inline unsigned int bf16_pair_bits(float low, float high)
{
    return (unsigned int)__bfloat16_as_ushort(__float2bfloat16_rn(low)) |
           (unsigned int)__bfloat16_as_ushort(__float2bfloat16_rn(high))
               << 16;
}

static __device__ inline void exchange_store8(bf16 *p, const float *in)
{
    *reinterpret_cast<uint4 *>(p) =
        make_uint4(bf16_pair_bits(in[0], in[1]), bf16_pair_bits(in[2], in[3]),
                   bf16_pair_bits(in[4], in[5]), bf16_pair_bits(in[6], in[7]));
}

/* Run `at` of every input loaded before any is combined (N known at
 * compile time, so the loads are in flight together and the step's
 * pointer arrays are indexed by constants, staying in parameter space). */
template <typename T, int N>
__device__ void exchange_vector_n(const cuda_exchange_step &s, size_t at)
{
    float value[N][8];
#pragma unroll
    for (int j = 0; j < N; j++)
        exchange_load8(value[j], reinterpret_cast<const T *>(s.inputs[j]) + at);
#pragma unroll
    for (int j = 1; j < N; j++)
#pragma unroll
        for (int i = 0; i < 8; i++)
            value[0][i] = combine(value[0][i], value[j][i], s.max);
#pragma unroll
    for (int j = 0; j < CUDA_EXCHANGE_MAX_MEMBERS; j++)
        if (j < s.output_count)
            exchange_store8(reinterpret_cast<T *>(s.outputs[j]) + at,
                            value[0]);
}

/* The same for any input count, in a loop. */
template <typename T>
__device__ void exchange_vector_any(const cuda_exchange_step &s, size_t at)
{
    float sum[8], value[8];
    exchange_load8(sum, reinterpret_cast<const T *>(s.inputs[0]) + at);
    for (int j = 1; j < s.input_count; j++) {
        exchange_load8(value, reinterpret_cast<const T *>(s.inputs[j]) + at);
#pragma unroll
        for (int i = 0; i < 8; i++)
            sum[i] = combine(sum[i], value[i], s.max);
    }
    for (int j = 0; j < s.output_count; j++)
        exchange_store8(reinterpret_cast<T *>(s.outputs[j]) + at, sum);
}

static __device__ inline float load_one(const void *p, size_t at, bool bf)
{
    return bf ? __bfloat162float(reinterpret_cast<const bf16 *>(p)[at])
              : reinterpret_cast<const float *>(p)[at];
}

static __device__ inline void store_one(void *p, size_t at, float v, bool bf)
{
    if (bf)
        reinterpret_cast<bf16 *>(p)[at] = __float2bfloat16_rn(v);
    else
        reinterpret_cast<float *>(p)[at] = v;
}

/* Each thread takes runs of 8 elements; `vector`: every pointer and
 * `first` allow 16-byte accesses. Inputs are read before any output is
 * written, element by element, so an output may be an input. One kernel
 * per element type and input count (N 1 to 4; 0: any): with every
 * count's path in one kernel the compiler merged their stores into
 * 4-byte ones (seen in its PTX; 500 GB/s on a 64-SM slice of an H100 by
 * ncu, 2026-11-25), each alone keeps its 16-byte stores. */
template <typename T, int N>
__global__ void exchange_kernel(cuda_exchange_step s, bool vector)
{
    size_t runs = (s.count + 7) / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t run = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
         run < runs; run += stride) {
        size_t at = s.first + run * 8;
        size_t end = s.first + s.count;
        if (vector && at + 8 <= end) {
            if constexpr (N > 0)
                exchange_vector_n<T, N>(s, at);
            else
                exchange_vector_any<T>(s, at);
            continue;
        }
        for (size_t k = at; k < end && k < at + 8; k++) {
            float v = load_one(s.inputs[0], k, s.bf16);
            for (int j = 1; j < s.input_count; j++)
                v = combine(v, load_one(s.inputs[j], k, s.bf16), s.max);
            for (int j = 0; j < s.output_count; j++)
                store_one(s.outputs[j], k, v, s.bf16);
        }
    }
}

template <typename T>
static void launch_exchange(const cuda_exchange_step *step, bool vector,
                            unsigned int blocks, cudaStream_t stream)
{
    switch (step->input_count) {
    case 1:
        exchange_kernel<T, 1><<<blocks, EXCHANGE_THREADS, 0, stream>>>(
            *step, vector);
        return;
    case 2:
        exchange_kernel<T, 2><<<blocks, EXCHANGE_THREADS, 0, stream>>>(
            *step, vector);
        return;
    case 3:
        exchange_kernel<T, 3><<<blocks, EXCHANGE_THREADS, 0, stream>>>(
            *step, vector);
        return;
    case 4:
        exchange_kernel<T, 4><<<blocks, EXCHANGE_THREADS, 0, stream>>>(
            *step, vector);
        return;
    default:
        exchange_kernel<T, 0><<<blocks, EXCHANGE_THREADS, 0, stream>>>(
            *step, vector);
    }
}

extern "C" cudaError_t cuda_exchange_reduce(const cuda_exchange_step *step,
                                            cudaStream_t stream)
{
    if (step->count == 0 || step->output_count == 0)
        return cudaSuccess;
    if (step->input_count < 1 ||
        step->input_count > CUDA_EXCHANGE_MAX_MEMBERS ||
        step->output_count > CUDA_EXCHANGE_MAX_MEMBERS)
        return cudaErrorInvalidValue;
    size_t element = step->bf16 ? 2 : 4;
    bool vector = (step->first * element) % 16 == 0;
    for (int j = 0; j < step->input_count; j++)
        vector = vector && aligned16(step->inputs[j]);
    for (int j = 0; j < step->output_count; j++)
        vector = vector && aligned16(step->outputs[j]);
    size_t runs = (step->count + 7) / 8;
    size_t blocks = blocks_for(runs, EXCHANGE_THREADS);
    if (blocks > EXCHANGE_MAX_BLOCKS)
        blocks = EXCHANGE_MAX_BLOCKS;
    if (step->bf16)
        launch_exchange<bf16>(step, vector, (unsigned int)blocks, stream);
    else
        launch_exchange<float>(step, vector, (unsigned int)blocks, stream);
    return cudaGetLastError();
}

static __device__ inline uint64_t global_nanoseconds(void)
{
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

__global__ void exchange_stamp_kernel(uint64_t *stamp)
{
    *stamp = global_nanoseconds();
}

/* One thread sleeps in short naps until the later stamp plus the link's
 * time: it holds one slot of one SM of the rank's slice, as a
 * communication kernel would. (A message's transfer starts when both
 * its ends are ready: the sender's stamp, the receiver's.) */
__global__ void exchange_pace_kernel(const uint64_t *stamp,
                                     const uint64_t *other_stamp,
                                     uint64_t nanoseconds)
{
    uint64_t start = *stamp, other = *other_stamp;
    uint64_t until = (other > start ? other : start) + nanoseconds;
    while (global_nanoseconds() < until)
        __nanosleep(200);
}

extern "C" cudaError_t cuda_exchange_stamp(uint64_t *stamp,
                                           cudaStream_t stream)
{
    exchange_stamp_kernel<<<1, 1, 0, stream>>>(stamp);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_exchange_pace_after(const uint64_t *stamp,
                                                const uint64_t *other_stamp,
                                                uint64_t nanoseconds,
                                                cudaStream_t stream)
{
    exchange_pace_kernel<<<1, 1, 0, stream>>>(
        stamp, other_stamp != NULL ? other_stamp : stamp, nanoseconds);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_exchange_pace(const uint64_t *stamp,
                                          uint64_t nanoseconds,
                                          cudaStream_t stream)
{
    return cuda_exchange_pace_after(stamp, NULL, nanoseconds, stream);
}
