/*
 * The kernels of the device exchange (executor/comm/exchange.c), the comm
 * of ranks that share one GPU: a reduction of the members' buffers
 * written to one or all of them (the steps of its collectives, and its
 * copies), and the pacing pair that makes an exchange last as long as the
 * emulated link would take. Memory-bound; eight elements per thread
 * through 16-byte accesses where every pointer allows.
 */
#include "executor/cuda/cuda_common.cuh"

#define EXCHANGE_THREADS 256
/* Enough blocks to fill an H200 several times; the loop strides. */
#define EXCHANGE_MAX_BLOCKS 1024

static __device__ inline float combine(float a, float b, bool max)
{
    return max ? (b > a ? b : a) : a + b;
}

template <typename T>
__device__ void exchange_vector(const cuda_exchange_step &s, size_t at)
{
    float sum[8], value[8];
    load8(sum, reinterpret_cast<const T *>(s.inputs[0]) + at);
    for (int j = 1; j < s.input_count; j++) {
        load8(value, reinterpret_cast<const T *>(s.inputs[j]) + at);
#pragma unroll
        for (int i = 0; i < 8; i++)
            sum[i] = combine(sum[i], value[i], s.max);
    }
    for (int j = 0; j < s.output_count; j++)
        store8(reinterpret_cast<T *>(s.outputs[j]) + at, sum);
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
 * written, element by element, so an output may be an input. */
__global__ void exchange_kernel(cuda_exchange_step s, bool vector)
{
    size_t runs = (s.count + 7) / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t run = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
         run < runs; run += stride) {
        size_t at = s.first + run * 8;
        size_t end = s.first + s.count;
        if (vector && at + 8 <= end) {
            if (s.bf16)
                exchange_vector<bf16>(s, at);
            else
                exchange_vector<float>(s, at);
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
    exchange_kernel<<<(unsigned int)blocks, EXCHANGE_THREADS, 0, stream>>>(
        *step, vector);
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

/* One thread sleeps in short naps until the deadline: it holds one slot
 * of one SM of the rank's slice, as a communication kernel would. */
__global__ void exchange_pace_kernel(const uint64_t *stamp,
                                     uint64_t nanoseconds)
{
    uint64_t until = *stamp + nanoseconds;
    while (global_nanoseconds() < until)
        __nanosleep(200);
}

extern "C" cudaError_t cuda_exchange_stamp(uint64_t *stamp,
                                           cudaStream_t stream)
{
    exchange_stamp_kernel<<<1, 1, 0, stream>>>(stamp);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_exchange_pace(const uint64_t *stamp,
                                          uint64_t nanoseconds,
                                          cudaStream_t stream)
{
    exchange_pace_kernel<<<1, 1, 0, stream>>>(stamp, nanoseconds);
    return cudaGetLastError();
}
