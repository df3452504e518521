/*
 * AdamW over the stage's fp32 buffers, fused with the refresh of the bf16
 * weight mirror the matrix products read: one pass reads parameter,
 * gradient and both moments and writes parameter, moments and the bf16
 * copy (30 bytes per parameter: 16 read, 14 written; 28 with llm.c's
 * bf16 gradients; the cost model takes the measured step over these as
 * the GPU's streaming rate). Work
 * comes as chunks of one tensor each (param_chunk), so the decay flag and
 * the mirror's offset are per block. The clipping coefficient comes from
 * the host or, in a one-stage step kept on the device, from device
 * memory (adamw_args.step).
 */
#include "executor/cuda/cuda_common.cuh"

#define OPTIMIZER_THREADS 256

static __device__ inline float adamw_update(float p, float g, float *m,
                                            float *v, const adamw_args &a,
                                            float decay)
{
    g *= a.grad_scale;
    *m = a.beta1 * *m + (1.0f - a.beta1) * g;
    *v = a.beta2 * *v + (1.0f - a.beta2) * g * g;
    float m_hat = *m / a.first_correction;
    float v_hat = *v / a.second_correction;
    return p - a.learning_rate * (m_hat / (sqrtf(v_hat) + a.eps) + decay * p);
}

/* G: the gradients' element type, float or bf16 (cuda_grad); the
 * moments and the master weights are fp32 either way. */
template <typename G>
__global__ void __launch_bounds__(OPTIMIZER_THREADS)
adamw_kernel(float *params, const G *grads, float *adam_m, float *adam_v,
             bf16 *mirror, const param_chunk *chunks, adamw_args args)
{
    /* the one-stage step's clipping, computed on the device: no update
     * from a loss or norm that is not finite */
    if (args.step != NULL) {
        if (args.step->non_finite)
            return;
        args.grad_scale = args.step->clip_scale;
    }
    param_chunk chunk = chunks[blockIdx.x];
    float decay = chunk.decay ? args.weight_decay : 0.0f;
    float *p = params + chunk.offset;
    const G *g = grads + chunk.offset;
    float *m = adam_m + chunk.moment_offset;
    float *v = adam_v + chunk.moment_offset;
    /* no mirror: ZeRO-3's units make their bf16 copies when gathered */
    bf16 *w = mirror != NULL ? mirror + chunk.mirror_offset : NULL;
    bool vector = chunk.offset % 4 == 0 && chunk.mirror_offset % 4 == 0 &&
                  chunk.moment_offset % 4 == 0;
    int quads = vector ? (int)chunk.count / 4 : 0;
    /* unrolled so that several iterations' loads are in flight */
#pragma unroll 4
    for (int q = threadIdx.x; q < quads; q += blockDim.x) {
        float4 p4 = reinterpret_cast<float4 *>(p)[q];
        float4 g4 = load_quad(g, (size_t)q);
        float4 m4 = reinterpret_cast<float4 *>(m)[q];
        float4 v4 = reinterpret_cast<float4 *>(v)[q];
        p4.x = adamw_update(p4.x, g4.x, &m4.x, &v4.x, args, decay);
        p4.y = adamw_update(p4.y, g4.y, &m4.y, &v4.y, args, decay);
        p4.z = adamw_update(p4.z, g4.z, &m4.z, &v4.z, args, decay);
        p4.w = adamw_update(p4.w, g4.w, &m4.w, &v4.w, args, decay);
        reinterpret_cast<float4 *>(p)[q] = p4;
        reinterpret_cast<float4 *>(m)[q] = m4;
        reinterpret_cast<float4 *>(v)[q] = v4;
        if (w == NULL)
            continue;
        bf16x2 low = __floats2bfloat162_rn(p4.x, p4.y);
        bf16x2 high = __floats2bfloat162_rn(p4.z, p4.w);
        reinterpret_cast<bf16x2 *>(w)[2 * q] = low;
        reinterpret_cast<bf16x2 *>(w)[2 * q + 1] = high;
    }
    for (int i = quads * 4 + threadIdx.x; i < (int)chunk.count;
         i += blockDim.x) {
        p[i] = adamw_update(p[i], load_one(g, (size_t)i), &m[i], &v[i], args,
                            decay);
        if (w != NULL)
            w[i] = __float2bfloat16_rn(p[i]);
    }
}

extern "C" cudaError_t cuda_adamw(float *params, cuda_grad grads,
                                  float *adam_m, float *adam_v,
                                  pt_bf16 *mirror_bf16,
                                  const param_chunk *chunks, int chunk_count,
                                  const adamw_args *args, cudaStream_t stream)
{
    if (chunk_count == 0)
        return cudaSuccess;
    if (grads.bf16)
        adamw_kernel<bf16><<<chunk_count, OPTIMIZER_THREADS, 0, stream>>>(
            params, static_cast<const bf16 *>(grads.data), adam_m, adam_v,
            as_bf16(mirror_bf16), chunks, *args);
    else
        adamw_kernel<float><<<chunk_count, OPTIMIZER_THREADS, 0, stream>>>(
            params, static_cast<const float *>(grads.data), adam_m, adam_v,
            as_bf16(mirror_bf16), chunks, *args);
    return cudaGetLastError();
}

__global__ void refresh_mirror_kernel(bf16 *mirror, const float *params,
                                      const param_chunk *chunks)
{
    param_chunk chunk = chunks[blockIdx.x];
    const float *p = params + chunk.offset;
    bf16 *w = mirror + chunk.mirror_offset;
    for (int i = threadIdx.x; i < (int)chunk.count; i += blockDim.x)
        w[i] = __float2bfloat16_rn(p[i]);
}

extern "C" cudaError_t cuda_refresh_mirror(pt_bf16 *mirror_bf16,
                                           const float *params,
                                           const param_chunk *chunks,
                                           int chunk_count,
                                           cudaStream_t stream)
{
    if (chunk_count == 0)
        return cudaSuccess;
    refresh_mirror_kernel<<<chunk_count, OPTIMIZER_THREADS, 0, stream>>>(
        as_bf16(mirror_bf16), params, chunks);
    return cudaGetLastError();
}
