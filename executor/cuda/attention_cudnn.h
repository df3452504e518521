/*
 * Private to the cuda backend: cuDNN's fused flash attention (causal,
 * bf16, fp32 statistics), built from cuDNN's backend graph API in
 * attention_cudnn.c, which is compiled only when meson found cuDNN
 * (option `cudnn`; PARTITA_HAVE_CUDNN). attention_runner.c is its one
 * caller: it decides per shape between these graphs and the own kernels
 * of attention.cu.
 *
 * Layouts are those of cuda_ops.h's attention: qkv B x T x 3C (query,
 * key, value of a position side by side, head h at channels [h D,
 * (h + 1) D) of each), out B x T x C, C = H x D; with grouped-query
 * attention (KVH < H key/value heads) qkv rows are (H + 2 KVH) D, the H
 * query heads, the KVH key heads, the KVH value heads, and query head h
 * reads key/value head h / (H / KVH). The statistics are
 * cuDNN's, B x H x T floats: the NATURAL log-sum-exp of each query's
 * scaled scores (the own kernels keep base 2: theirs = these x log2 e);
 * only this file's backward reads them.
 */
#ifndef PARTITA_EXECUTOR_CUDA_ATTENTION_CUDNN_H
#define PARTITA_EXECUTOR_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "common/common.h"
#include "executor/cuda/cuda_ops.h"

/* A cuDNN handle on the current device, the forward and backward
 * execution plans of each shape prepared, and one device workspace
 * sized by cuDNN for the largest of them (counted against the rank's
 * memory cap). Used by one thread (the stage's). */
typedef struct cudnn_attention cudnn_attention;

/* cuDNN as loaded at run time (cudnnGetVersion: 91900 for 9.19.0) and
 * as compiled against (CUDNN_VERSION). */
size_t cudnn_attention_runtime_version(void);
size_t cudnn_attention_build_version(void);

/* Creates the handle on the current device. Fails with cuDNN's message
 * (its libraries missing, no device, ...). `deterministic`: every
 * backward writes dQ by its own product (the same bits on every run);
 * otherwise, on cuDNN 9.6 or later, dQ is summed in an fp32
 * accumulator with atomics (faster, less workspace; the default of
 * Megatron-LM and cudnn-frontend). */
int cudnn_attention_create(cudnn_attention **out, bool deterministic,
                           pt_error *err);
void cudnn_attention_destroy(cudnn_attention *attention);

/* Builds the forward and backward plans of B sequences of T positions,
 * H query heads and KVH key/value heads (H a multiple of KVH; KVH = H:
 * multi-head) of D channels (once: later calls find them) and grows the
 * workspace to what they need. When the backward needs at most
 * `lendable` bytes (its fused kernels may want B x H x T x T bf16: 384
 * MiB at GPT-2 124M, mbs 16), it runs in memory its caller lends at each
 * call instead, and the own workspace covers the forward alone; where
 * the whole backward's is more, in the fewest pieces of whole sequences
 * whose workspace fits, one call of a plan built for the piece each
 * (none fits: the own workspace holds the whole one). Fails,
 * with the cuDNN call and cuDNN's own message, when cuDNN cannot run the
 * shape; then nothing of it is kept. */
int cudnn_attention_prepare(cudnn_attention *attention, int B, int T, int H,
                            int KVH, int D, size_t lendable, pt_error *err);

/* Forward: out and stats (B x H x T floats) from qkv. Backward: WRITES
 * d_qkv from d_out, qkv, out and the forward's stats, in `lent` (device
 * memory free until the backward's work on stream is done, 256-byte
 * aligned) when the shape was prepared to borrow, else in the own
 * workspace (lent may be NULL then). The shape must have been prepared;
 * both enqueue on stream. */
int cudnn_attention_forward(cudnn_attention *attention, pt_bf16 *out,
                            float *stats, const pt_bf16 *qkv, int B, int T,
                            int H, int KVH, int D, cudaStream_t stream,
                            pt_error *err);
int cudnn_attention_backward(cudnn_attention *attention, pt_bf16 *d_qkv,
                             const pt_bf16 *d_out, const pt_bf16 *qkv,
                             const pt_bf16 *out, const float *stats, int B,
                             int T, int H, int KVH, int D, void *lent,
                             size_t lent_bytes, cudaStream_t stream,
                             pt_error *err);

/* Device bytes held (the workspace). */
size_t cudnn_attention_device_bytes(const cudnn_attention *attention);

/* One line on the plans of a prepared shape: cuDNN's versions, the
 * engines chosen and their workspaces; "" for a shape not prepared. */
const char *cudnn_attention_describe(cudnn_attention *attention, int B,
                                     int T, int H, int KVH, int D);

#endif
