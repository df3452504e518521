/*
 * Private to the cuda backend and its GPU tests: which attention kernels
 * a cuda stage runs, decided once per shape. cuDNN's fused flash
 * attention (attention_cudnn.c, in builds that found cuDNN) where cuDNN
 * plans the shape, else the own kernels of attention.cu (cuda_ops.h).
 * PARTITA_CUDA_ATTENTION forces one for tests and measurements.
 *
 * A shape's forward and backward always take the same path: the
 * log-sum-exp the forward keeps (lse, B x NH x T floats) is in that
 * path's convention (the own kernels' base 2, cuDNN's natural log) and
 * only the same path's backward reads it.
 */
#ifndef PARTITA_EXECUTOR_CUDA_ATTENTION_RUNNER_H
#define PARTITA_EXECUTOR_CUDA_ATTENTION_RUNNER_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "common/common.h"
#include "executor/cuda/cuda_ops.h"

/* auto: cuDNN where it plans the shape, else the own kernels; own:
 * always the own kernels; cudnn: cuDNN or an error naming why not. */
typedef enum attention_mode {
    ATTENTION_AUTO,
    ATTENTION_OWN,
    ATTENTION_CUDNN,
} attention_mode;

/* The mode PARTITA_CUDA_ATTENTION asks for ("auto" when unset or
 * empty); an unknown value fails naming the variable. */
int attention_mode_from_env(attention_mode *out, pt_error *err);

/* Whether this build has cuDNN's attention (meson option `cudnn`). */
bool attention_cudnn_built(void);

typedef struct attention_runner attention_runner;

/* A runner on the current device (cuDNN is set up at the first shape
 * that may use it). `deterministic` (a plan's "deterministic"): cuDNN's
 * backward that gives the same bits on every run; otherwise the one
 * that sums dQ in an fp32 accumulator with atomics where cuDNN has it
 * (9.6 or later; attention_cudnn.h). The own kernels are deterministic
 * either way. */
int attention_runner_create(attention_runner **out, attention_mode mode,
                            bool deterministic, pt_error *err);
void attention_runner_destroy(attention_runner *runner);

/* Decides the path of B sequences of T positions, C channels in NH
 * heads, building cuDNN's plans and workspace when it may take cuDNN;
 * at most 8 shapes. `lendable`: the bytes every backward call will lend
 * (attention_runner_backward), for this and later shapes; cuDNN's
 * backward workspace goes there when it fits. Forward and backward
 * decide on their own when not prepared. In auto mode a shape cuDNN
 * declines goes to the own kernels (attention_runner_describe says
 * why); in cudnn mode it fails with cuDNN's message. */
int attention_runner_prepare(attention_runner *runner, int B, int T, int C,
                             int NH, size_t lendable, pt_error *err);
/* Whether the shape runs on cuDNN (preparing it first). */
int attention_runner_uses_cudnn(attention_runner *runner, int B, int T,
                                int C, int NH, bool *out, pt_error *err);

/* cuda_attention_forward / _backward of cuda_ops.h on the shape's path
 * (scratch: cuda_attention_backward_scratch floats, used by the own
 * kernels only; lent: lent_bytes of device memory, 256-byte aligned,
 * that nothing else uses until the backward's work on stream is done,
 * at least the lendable bytes of attention_runner_prepare, or NULL when
 * that was 0). */
int attention_runner_forward(attention_runner *runner, pt_bf16 *out,
                             float *lse, const pt_bf16 *qkv, int B, int T,
                             int C, int NH, cudaStream_t stream,
                             pt_error *err);
int attention_runner_backward(attention_runner *runner, pt_bf16 *d_qkv,
                              const pt_bf16 *d_out, const pt_bf16 *qkv,
                              const pt_bf16 *out, const float *lse,
                              float *scratch, int B, int T, int C, int NH,
                              void *lent, size_t lent_bytes,
                              cudaStream_t stream, pt_error *err);

/*
 * The same for grouped-query attention (the Llama family's): NH query
 * heads and KVH key/value heads (NH a multiple of KVH) of D channels, qkv
 * rows of (NH + 2 KVH) D (query heads, key heads, value heads; cuda_ops.h
 * cuda_gqa_attention_forward), out rows of NH D. cuDNN where it plans the
 * shape (K and V with their own head count), else the own path:
 * attention.cu's kernels when KVH == NH, attention_plain.cu's grouped
 * ones otherwise. With KVH == NH each is the multi-head call of C = NH D,
 * the same shape to the runner.
 */
int attention_runner_prepare_gqa(attention_runner *runner, int B, int T,
                                 int NH, int KVH, int D, size_t lendable,
                                 pt_error *err);
int attention_runner_forward_gqa(attention_runner *runner, pt_bf16 *out,
                                 float *lse, const pt_bf16 *qkv, int B, int T,
                                 int NH, int KVH, int D, cudaStream_t stream,
                                 pt_error *err);
int attention_runner_backward_gqa(attention_runner *runner, pt_bf16 *d_qkv,
                                  const pt_bf16 *d_out, const pt_bf16 *qkv,
                                  const pt_bf16 *out, const float *lse,
                                  float *scratch, int B, int T, int NH,
                                  int KVH, int D, void *lent,
                                  size_t lent_bytes, cudaStream_t stream,
                                  pt_error *err);

/* One line on the path of the last shape prepared: cuDNN's version and
 * engines, or the own kernels and why. */
const char *attention_runner_describe(const attention_runner *runner);

/* Device bytes the runner holds (cuDNN's workspace), on top of the
 * stage's own. */
size_t attention_runner_device_bytes(const attention_runner *runner);

#endif
