/*
 * SwiGLU, the Llama family's MLP activation, forward and backward, one
 * kernel each way (cuda_ops.h). The fc1 product holds both halves of a
 * row side by side, gate in [0, F) and up in [F, 2F) (Megatron's fused
 * fc1 with --swiglu, the cpu reference's order), so a thread reads its
 * gate and up channels from one row, computes in fp32 and writes once:
 *
 *   forward   out = silu(gate) x up,            silu(x) = x s(x)
 *   backward  d_gate = d_out x up x s (1 + gate (1 - s)),
 *             d_up = d_out x silu(gate),        s = sigmoid(gate)
 *
 * Eight channels a thread (16-byte accesses) when F % 8 == 0 and the
 * tensors are 16-byte aligned, else one. The backward reads every input
 * of an element before it writes that element's gradients, so it may
 * write over the fc1 output it reads (d_inp == inp). A third kernel does
 * the backward and the forward at once, for a layer that recomputes the
 * activation in its backward (passes_llama.c).
 */
#include "executor/cuda/cuda_common.cuh"

#define SWIGLU_THREADS 256

static __device__ inline float sigmoid_of(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* VECTOR consecutive values (8: one 16-byte access; 1: one element). */
template <int VECTOR>
static __device__ inline void load_run(float *out, const bf16 *p)
{
    if (VECTOR == 8)
        load8(out, p);
    else
        out[0] = __bfloat162float(p[0]);
}

template <int VECTOR>
static __device__ inline void store_run(bf16 *p, const float *in)
{
    if (VECTOR == 8)
        store8(p, in);
    else
        p[0] = __float2bfloat16_rn(in[0]);
}

/* Thread `index` owns channels [f, f + VECTOR) of row n: the offsets of
 * its gate in the 2F-wide rows and of its output in the F-wide ones;
 * false past the end. */
template <int VECTOR>
static __device__ inline bool swiglu_place(size_t index, int N, int F,
                                           size_t *gate_at, size_t *out_at)
{
    size_t runs = (size_t)F / VECTOR;
    if (index >= (size_t)N * runs)
        return false;
    size_t n = index / runs;
    size_t f = index % runs * VECTOR;
    *gate_at = n * 2 * (size_t)F + f;
    *out_at = n * (size_t)F + f;
    return true;
}

template <int VECTOR>
__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *inp, int N,
                                      int F)
{
    size_t gate_at, out_at;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (!swiglu_place<VECTOR>(index, N, F, &gate_at, &out_at))
        return;
    float gate[VECTOR], up[VECTOR], y[VECTOR];
    load_run<VECTOR>(gate, inp + gate_at);
    load_run<VECTOR>(up, inp + gate_at + F);
#pragma unroll
    for (int i = 0; i < VECTOR; i++)
        y[i] = gate[i] * sigmoid_of(gate[i]) * up[i];
    store_run<VECTOR>(out + out_at, y);
}

/* Thread `index`'s share of the backward: the gate's and the
 * up-projection's gradients from d_out; with OUTPUT, also the forward's
 * output by swiglu_forward_kernel's expression (the same bits), written
 * to `out` (it may be d_out: each element is read before its one thread
 * writes it). */
template <int VECTOR, bool OUTPUT>
static __device__ __forceinline__ void
swiglu_backward_at(size_t index, bf16 *d_inp, bf16 *out, const bf16 *d_out,
                   const bf16 *inp, int N, int F)
{
    size_t gate_at, out_at;
    if (!swiglu_place<VECTOR>(index, N, F, &gate_at, &out_at))
        return;
    float gate[VECTOR], up[VECTOR], dy[VECTOR], y[VECTOR];
    float d_gate[VECTOR], d_up[VECTOR];
    load_run<VECTOR>(gate, inp + gate_at);
    load_run<VECTOR>(up, inp + gate_at + F);
    load_run<VECTOR>(dy, d_out + out_at);
#pragma unroll
    for (int i = 0; i < VECTOR; i++) {
        float s = sigmoid_of(gate[i]);
        d_gate[i] = dy[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
        d_up[i] = dy[i] * gate[i] * s;
        y[i] = gate[i] * sigmoid_of(gate[i]) * up[i];
    }
    store_run<VECTOR>(d_inp + gate_at, d_gate);
    store_run<VECTOR>(d_inp + gate_at + F, d_up);
    if (OUTPUT)
        store_run<VECTOR>(out + out_at, y);
}

template <int VECTOR>
__global__ void swiglu_backward_kernel(bf16 *d_inp, const bf16 *d_out,
                                       const bf16 *inp, int N, int F)
{
    swiglu_backward_at<VECTOR, false>(
        (size_t)blockIdx.x * blockDim.x + threadIdx.x, d_inp, NULL, d_out,
        inp, N, F);
}

/* The backward, and the forward's output written over the d_out it read
 * (cuda_swiglu_backward_and_forward). */
template <int VECTOR>
__global__ void swiglu_backward_forward_kernel(bf16 *d_inp,
                                               bf16 *d_out_then_out,
                                               const bf16 *inp, int N, int F)
{
    swiglu_backward_at<VECTOR, true>(
        (size_t)blockIdx.x * blockDim.x + threadIdx.x, d_inp, d_out_then_out,
        d_out_then_out, inp, N, F);
}

/* Whether the eight-channel kernels may run on these tensors. */
static bool swiglu_vector(int F, const void *a, const void *b, const void *c)
{
    return F % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

/* One of the kernels above over `count` elements: its eight-channel
 * instance where `vector` says it may run, else its one-channel one. */
#define SWIGLU_LAUNCH(kernel, vector, count, stream, ...)                  \
    do {                                                                   \
        if (vector)                                                        \
            kernel<8><<<blocks_for((count) / 8, SWIGLU_THREADS),           \
                        SWIGLU_THREADS, 0, stream>>>(__VA_ARGS__);         \
        else                                                               \
            kernel<1><<<blocks_for(count, SWIGLU_THREADS), SWIGLU_THREADS, \
                        0, stream>>>(__VA_ARGS__);                         \
    } while (0)

extern "C" cudaError_t cuda_swiglu_forward(pt_bf16 *out_bf16,
                                           const pt_bf16 *inp_bf16, int N,
                                           int F, cudaStream_t stream)
{
    if (N <= 0 || F <= 0)
        return cudaSuccess;
    bf16 *out = as_bf16(out_bf16);
    const bf16 *inp = as_bf16(inp_bf16);
    size_t count = (size_t)N * F;
    bool vector = swiglu_vector(F, out, inp, inp);
    SWIGLU_LAUNCH(swiglu_forward_kernel, vector, count, stream, out, inp, N,
                  F);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_swiglu_backward(pt_bf16 *d_inp_bf16,
                                            const pt_bf16 *d_out_bf16,
                                            const pt_bf16 *inp_bf16, int N,
                                            int F, cudaStream_t stream)
{
    if (N <= 0 || F <= 0)
        return cudaSuccess;
    bf16 *d_inp = as_bf16(d_inp_bf16);
    const bf16 *d_out = as_bf16(d_out_bf16);
    const bf16 *inp = as_bf16(inp_bf16);
    size_t count = (size_t)N * F;
    bool vector = swiglu_vector(F, d_inp, d_out, inp);
    SWIGLU_LAUNCH(swiglu_backward_kernel, vector, count, stream, d_inp, d_out,
                  inp, N, F);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_swiglu_backward_and_forward(
    pt_bf16 *d_inp_bf16, pt_bf16 *d_out_then_out_bf16,
    const pt_bf16 *inp_bf16, int N, int F, cudaStream_t stream)
{
    if (N <= 0 || F <= 0)
        return cudaSuccess;
    bf16 *d_inp = as_bf16(d_inp_bf16);
    bf16 *d_out = as_bf16(d_out_then_out_bf16);
    const bf16 *inp = as_bf16(inp_bf16);
    size_t count = (size_t)N * F;
    bool vector = swiglu_vector(F, d_inp, d_out, inp);
    SWIGLU_LAUNCH(swiglu_backward_forward_kernel, vector, count, stream,
                  d_inp, d_out, inp, N, F);
    return cudaGetLastError();
}
