/*
 * Device-side helpers shared by the kernel files of the cuda backend:
 * bf16 conversions, 16-byte vectors, warp and block reductions, the
 * norms' row teams, and a launch's ask for dynamic shared memory past
 * the default. CUDA C++
 * (nvcc needs it), kept C-like: no classes beyond plain structs.
 */
#ifndef PARTITA_EXECUTOR_CUDA_COMMON_CUH
#define PARTITA_EXECUTOR_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_ops.h"

typedef __nv_bfloat16 bf16;
typedef __nv_bfloat162 bf16x2;

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

/* Reinterprets the opaque pt_bf16 storage of the C side. */
static __host__ __device__ inline bf16 *as_bf16(pt_bf16 *p)
{
    return reinterpret_cast<bf16 *>(p);
}
static __host__ __device__ inline const bf16 *as_bf16(const pt_bf16 *p)
{
    return reinterpret_cast<const bf16 *>(p);
}

/* Eight bf16 in one 16-byte load or store. */
struct __align__(16) bf16x8 {
    bf16x2 pair[4];
};

static __device__ inline void bf16x8_to_float(const bf16x8 &v, float *out)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(v.pair[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

static __device__ inline bf16x8 float_to_bf16x8(const float *in)
{
    bf16x8 v;
#pragma unroll
    for (int i = 0; i < 4; i++)
        v.pair[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    return v;
}

/* Eight consecutive values in or out, 16 or 32 bytes at a time (the
 * pointers must be 16-byte aligned). */
static __device__ inline void load8(float *out, const bf16 *p)
{
    bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(p), out);
}

static __device__ inline void load8(float *out, const float *p)
{
    *reinterpret_cast<float4 *>(out) = *reinterpret_cast<const float4 *>(p);
    *reinterpret_cast<float4 *>(out + 4) =
        *reinterpret_cast<const float4 *>(p + 4);
}

static __device__ inline void store8(float *p, const float *in)
{
    *reinterpret_cast<float4 *>(p) = *reinterpret_cast<const float4 *>(in);
    *reinterpret_cast<float4 *>(p + 4) =
        *reinterpret_cast<const float4 *>(in + 4);
}

static __device__ inline void store8(bf16 *p, const float *in)
{
    *reinterpret_cast<bf16x8 *>(p) = float_to_bf16x8(in);
}

/* A gradient (cuda_grad) read or added to, element i: a bf16 one's sum
 * is taken in fp32 and rounded once, as llm.c's recipe keeps it. */
static __device__ inline float grad_load(const cuda_grad &g, size_t i)
{
    return g.bf16 ? __bfloat162float(static_cast<const bf16 *>(g.data)[i])
                  : static_cast<const float *>(g.data)[i];
}

static __device__ inline void grad_add(const cuda_grad &g, size_t i,
                                       float value)
{
    if (g.bf16) {
        bf16 *p = static_cast<bf16 *>(g.data) + i;
        *p = __float2bfloat16_rn(__bfloat162float(*p) + value);
    } else {
        static_cast<float *>(g.data)[i] += value;
    }
}

/* Waits for the TEAM warps of team `team` of a block (named barrier 1 +
 * team, so teams 0-14; barrier 0 is __syncthreads'), and orders their
 * shared-memory accesses: a row's sums over the warps that share it
 * (the norms' team kernels). Every thread of the team must arrive. */
template <int TEAM>
static __device__ __forceinline__ void team_barrier(int team)
{
    asm volatile("bar.sync %0, %1;" : : "r"(1 + team), "r"(TEAM * WARP_SIZE)
                 : "memory");
}

/* The N of `variable`=teamN (PARTITA_LAYERNORM_FORWARD, _BACKWARD: a
 * norm kernel's team forced, for benchmarks that time the sizes side by
 * side, bench/norms/run.sh); 0 where unset or not of that form. */
static inline int env_norm_team(const char *variable)
{
    const char *choice = getenv(variable);
    if (choice == NULL || strncmp(choice, "team", 4) != 0)
        return 0;
    return atoi(choice + 4);
}

/* Warps of a block of the norms' team kernels (layernorm.cu,
 * layernorm_backward.cu): its teams are of 1, 2, 4 or 8 of them. */
#define NORM_BLOCK_WARPS 8

/* The warps of a norm's row team (of a block of NORM_BLOCK_WARPS) at
 * `groups` 8-channel groups a row: `forced` (1, 2, 4 or 8) where its
 * lanes then hold at most forced_groups each, else the fewest warps whose
 * lanes hold at most max_groups (the twenty-fifth session's fastest at
 * every width it timed: layernorm_backward.cu); 0 where no team of the
 * whole block holds the row. */
static inline int norm_row_team(int groups, int forced, int max_groups,
                                int forced_groups)
{
    if ((forced == 1 || forced == 2 || forced == 4 || forced == 8) &&
        groups <= forced * WARP_SIZE * forced_groups)
        return forced;
    for (int team = 1; team <= NORM_BLOCK_WARPS; team *= 2)
        if (groups <= team * WARP_SIZE * max_groups)
            return team;
    return 0;
}

/* Four consecutive gradient values from a 16-byte (fp32) or 8-byte
 * (bf16) aligned quad q of `values`. */
static __device__ inline float4 load_quad(const float *values, size_t q)
{
    return reinterpret_cast<const float4 *>(values)[q];
}

static __device__ inline float4 load_quad(const bf16 *values, size_t q)
{
    const bf16x2 *pairs = reinterpret_cast<const bf16x2 *>(values) + 2 * q;
    float2 low = __bfloat1622float2(pairs[0]);
    float2 high = __bfloat1622float2(pairs[1]);
    return make_float4(low.x, low.y, high.x, high.y);
}

static __device__ inline float load_one(const float *values, size_t i)
{
    return values[i];
}

static __device__ inline float load_one(const bf16 *values, size_t i)
{
    return __bfloat162float(values[i]);
}

static __device__ inline float warp_sum(float value)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(FULL_MASK, value, offset);
    return value;
}

static __device__ inline double warp_sum_double(double value)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(FULL_MASK, value, offset);
    return value;
}

static __device__ inline float warp_max(float value)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        value = fmaxf(value, __shfl_xor_sync(FULL_MASK, value, offset));
    return value;
}

/* log2(e): the attention keeps its scores in base 2. */
#define LOG2E_F 1.4426950408889634f

/* 2^x in one MUFU instruction (flushing denormals, which a softmax
 * weight below 2^-126 may well become); exp2f adds range handling. */
static __device__ inline float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the result. `shared` holds 32 floats. */
static __device__ inline float block_sum(float value, float *shared)
{
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int warps = blockDim.x / WARP_SIZE;
    value = warp_sum(value);
    __syncthreads(); /* `shared` may still be read by a previous call */
    if (lane == 0)
        shared[warp] = value;
    __syncthreads();
    value = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(value);
}

static __device__ inline float block_max(float value, float *shared)
{
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int warps = blockDim.x / WARP_SIZE;
    value = warp_max(value);
    __syncthreads();
    if (lane == 0)
        shared[warp] = value;
    __syncthreads();
    value = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(value);
}

static inline unsigned int blocks_for(size_t count, unsigned int per_block)
{
    return (unsigned int)((count + per_block - 1) / per_block);
}

static inline __host__ __device__ bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* Shared memory a block has without asking, static and dynamic
 * together. */
#define DEFAULT_BLOCK_SHARED_BYTES (48 * 1024)

/* Lets `kernel` launch with `dynamic` bytes of dynamic shared memory a
 * block, in the current context: where they and the kernel's static
 * shared memory pass the 48 KiB a block has without asking, through the
 * kernel's attribute, up to the device's opt-in limit (227 KiB on
 * Hopper). A dynamic part of exactly 48 KiB beside a few static bytes
 * does not launch without asking (cudaErrorInvalidValue: layer norm's
 * one-warp-row backward at 1,288-1,536 channels until the twenty-second
 * session). Not a stream operation: a launch being captured into a graph
 * may ask. */
template <typename Kernel>
static cudaError_t allow_dynamic_shared(Kernel kernel, size_t dynamic)
{
    cudaFuncAttributes attributes;
    cudaError_t status = cudaFuncGetAttributes(&attributes, kernel);
    if (status != cudaSuccess)
        return status;
    if (dynamic + attributes.sharedSizeBytes <= DEFAULT_BLOCK_SHARED_BYTES)
        return cudaSuccess;
    int device = 0, optin = 0;
    status = cudaGetDevice(&device);
    if (status == cudaSuccess)
        status = cudaDeviceGetAttribute(
            &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (status != cudaSuccess)
        return status;
    if (dynamic + attributes.sharedSizeBytes > (size_t)optin)
        return cudaErrorInvalidValue;
    return cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic);
}

/* GELU with the tanh approximation (GPT-2's), and its derivative. */
#define GELU_SCALE_F 0.7978845608028654f
#define GELU_CUBIC_F 0.044715f

static __device__ inline float gelu_value(float x)
{
    float inner = GELU_SCALE_F * (x + GELU_CUBIC_F * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

static __device__ inline float gelu_derivative(float x)
{
    float inner = GELU_SCALE_F * (x + GELU_CUBIC_F * x * x * x);
    float tanh_inner = tanhf(inner);
    float d_inner = GELU_SCALE_F * (1.0f + 3.0f * GELU_CUBIC_F * x * x);
    float sech_squared = 1.0f - tanh_inner * tanh_inner;
    return 0.5f * (1.0f + tanh_inner) + 0.5f * x * sech_squared * d_inner;
}

#endif
