/*
 * The kernels of the cuda backend, as C launchers. Private to the
 * executor's cuda folder and its GPU tests (tests/executor/gpu), which
 * hold each of them against the cpu reference op of executor/cpu/cpu.h.
 *
 * Conventions (the same as the cpu ops): B sequences, T positions, C
 * channels, N = B x T rows, NH heads, V vocabulary; row-major. Tensors
 * named *_bf16 hold bfloat16 bit patterns (pt_bf16); the rest are fp32.
 * All pointers are device memory except where a comment says host. Every
 * launcher enqueues on `stream` and returns cudaSuccess or the launch
 * error (cudaGetLastError); none synchronises.
 *
 * The cuda backend keeps the residual stream in bf16 (its adds in fp32
 * registers, rounded once), its gradient in fp32, and the parameter
 * gradients in fp32 or, under llm.c's recipe, bf16 (cuda_grad); the
 * inputs of the matrix products (activations and a bf16 mirror of the
 * weights) are bf16.
 */
#ifndef PARTITA_EXECUTOR_CUDA_OPS_H
#define PARTITA_EXECUTOR_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "executor/cuda/kernel_sizes.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef PARTITA_PT_BF16
#define PARTITA_PT_BF16
/* A bfloat16 value as its 16 bits (the top half of an fp32). */
typedef uint16_t pt_bf16;
#endif

/* Host-side conversions, round to nearest even (tests and set-up). */
pt_bf16 pt_float_to_bf16(float value);
float pt_bf16_to_float(pt_bf16 value);

/* A parameter gradient as the kernels that add into it see it: fp32 (the
 * default recipe's main gradients) or bf16 (llm.c's recipe, a plan's
 * grad_precision bf16), where each kernel takes its addition in fp32 and
 * rounds the sum once to bf16, as the products' beta = 1 epilogue does.
 * data NULL: no gradient. */
typedef struct cuda_grad {
    void *data;
    bool bf16;
} cuda_grad;

static inline cuda_grad cuda_grad_fp32(float *data)
{
    cuda_grad grad = {data, false};
    return grad;
}

/* The gradient `elements` further on (elements of its own type). */
static inline cuda_grad cuda_grad_offset(cuda_grad grad, size_t elements)
{
    size_t size = grad.bf16 ? sizeof(pt_bf16) : sizeof(float);
    if (grad.data != NULL)
        grad.data = (char *)grad.data + elements * size;
    return grad;
}

/* ------------------------------------------------------------ elementwise */

/* out_bf16[i] = bf16(in[i]). */
cudaError_t cuda_convert_to_bf16(pt_bf16 *out_bf16, const float *in,
                                 size_t count, cudaStream_t stream);
/* dst[i] += src[i] (fp32). */
cudaError_t cuda_add_inplace(float *dst, const float *src, size_t count,
                             cudaStream_t stream);
/* The same into a gradient of either precision (cuda_grad). */
cudaError_t cuda_add_into_grad(cuda_grad dst, const float *src, size_t count,
                               cudaStream_t stream);
/* out[n, c] += rows[n % period, c] + residual[n, c] (fp32, N x C; rows
 * holds period rows of C; residual may be NULL). period 1 adds a bias
 * (the row-parallel layers' bias after the tensor-parallel sum), period T
 * the position embedding. */
cudaError_t cuda_add_broadcast_rows(float *out, const float *rows,
                                    int period, const float *residual, int N,
                                    int C, cudaStream_t stream);
/* out_bf16[i] widened: out[i] = float(in_bf16[i]) (exact). */
cudaError_t cuda_convert_to_float(float *out, const pt_bf16 *in_bf16,
                                  size_t count, cudaStream_t stream);
/* The bf16 residual stream from an fp32 sum (N x C):
 *   out_bf16[n, c] = bf16(in[n, c] + rows[n % period, c]
 *                         + residual_bf16[n, c]),
 * added in fp32 and rounded once; rows (period rows of C, fp32) and
 * residual_bf16 may be NULL. A row-parallel layer's output after an fp32
 * tensor-parallel sum (rows: its bias, period 1), the embedding after a
 * vocab-parallel sum (rows: the positions, period T), a pipeline's
 * received fp32 rows (neither). out must not overlap in. */
cudaError_t cuda_stream_from_float(pt_bf16 *out_bf16, const float *in,
                                   const float *rows, int period,
                                   const pt_bf16 *residual_bf16, int N,
                                   int C, cudaStream_t stream);
/* The same from a bf16 sum: out_bf16 = bf16(in_bf16 + bias + residual_
 * bf16) (bias fp32 C, may be NULL; residual may be NULL): a row-parallel
 * layer's output after a bf16 tensor-parallel sum. */
cudaError_t cuda_stream_from_bf16(pt_bf16 *out_bf16, const pt_bf16 *in_bf16,
                                  const float *bias,
                                  const pt_bf16 *residual_bf16, int N, int C,
                                  cudaStream_t stream);
/* GELU (tanh approximation) of a bf16 tensor: out = gelu(in). */
cudaError_t cuda_gelu_forward(pt_bf16 *out_bf16, const pt_bf16 *in_bf16,
                              size_t count, cudaStream_t stream);
/* d_in = gelu'(in) x d_out, all bf16 (WRITES, unlike the cpu op: the
 * backend never needs to add here). */
cudaError_t cuda_gelu_backward(pt_bf16 *d_in_bf16, const pt_bf16 *d_out_bf16,
                               const pt_bf16 *in_bf16, size_t count,
                               cudaStream_t stream);

/* -------------------------------------------------------------- embedding */

/* out[b,t,:] = token_embedding[tokens[b,t],:] + position_embedding[t,:]
 * (bf16 out: the residual stream's start, added in fp32 and rounded
 * once; fp32 tables; tokens device memory); position_embedding NULL:
 * none (rotary positions). */
cudaError_t cuda_embedding_forward(pt_bf16 *out_bf16, const uint32_t *tokens,
                                   const float *token_embedding,
                                   const float *position_embedding, int B,
                                   int T, int C, cudaStream_t stream);

/*
 * The token-embedding gradient without atomics: rows that share a token
 * are summed in a fixed order, so results do not change between runs.
 * The host groups the N rows by token (embedding_plan_build) and the
 * device reads that plan.
 */
typedef struct embedding_plan {
    int unique_tokens;       /* distinct tokens among the N rows */
    /* host arrays, N + 1 and N entries: group g holds rows
     * rows[starts[g] .. starts[g+1]) and its token is tokens[g] */
    int *starts;
    int *rows;
    uint32_t *tokens;
} embedding_plan;

/* Host scratch of embedding_plan_build(_range) for a vocabulary (or
 * shard) of vocab_count tokens: allocate it zeroed (calloc); the builds
 * leave it zeroed. */
size_t embedding_plan_scratch_bytes(int vocab_count);
/* Groups the N = B x T input tokens (host) by value, in ascending token
 * order. scratch: embedding_plan_scratch_bytes(V), zeroed. plan arrays
 * must have room for N + 1 / N entries. */
void embedding_plan_build(embedding_plan *plan, const uint32_t *tokens,
                          int N, int V, void *scratch);
/* The same for a vocab-parallel shard holding the rows [vocab_first,
 * vocab_first + vocab_count): rows of other tokens are left out and the
 * group tokens are shard-local (token - vocab_first). scratch:
 * embedding_plan_scratch_bytes(vocab_count), zeroed. */
void embedding_plan_build_range(embedding_plan *plan, const uint32_t *tokens,
                                int N, int vocab_first, int vocab_count,
                                void *scratch);

/* The vocab-parallel lookup (tensor parallelism): out[n,:] =
 * token_embedding[tokens[n] - vocab_first,:] when the shard holds that
 * token, else 0; no position. The group's sum then assembles the whole
 * lookup, and cuda_stream_from_float adds the positions. */
cudaError_t cuda_embedding_shard_forward(float *out, const uint32_t *tokens,
                                         const float *token_embedding,
                                         int vocab_first, int vocab_count,
                                         int N, int C, cudaStream_t stream);

/* d_token_embedding[token] += sum of its rows of d_out; d_position[t] +=
 * sum over b of d_out[b,t,:]. plan arrays (device copies): starts (N+1),
 * rows (N), tokens (N); unique_tokens groups. Either gradient may be
 * NULL. */
cudaError_t cuda_embedding_backward(cuda_grad d_token_embedding,
                                    cuda_grad d_position_embedding,
                                    const float *d_out, const int *starts,
                                    const int *rows,
                                    const uint32_t *group_tokens,
                                    int unique_tokens, int B, int T, int C,
                                    cudaStream_t stream);

/* ------------------------------------------------------------- layer norm */

/* out_bf16 = layernorm(inp_bf16) (eps 1e-5; the bf16 residual stream,
 * statistics in fp32) with fp32 weight and bias; mean and rstd (N each,
 * fp32) are kept for the backward. Either may be NULL when the caller
 * recomputes nothing later. */
cudaError_t cuda_layernorm_forward(pt_bf16 *out_bf16, float *mean,
                                   float *rstd, const pt_bf16 *inp_bf16,
                                   const float *weight, const float *bias,
                                   int N, int C, cudaStream_t stream);

/*
 * Layer-norm backward fused with the residual branch point:
 *   d_inp = d_residual + rstd (g - mean(g) - xhat mean(g xhat)),
 *   g = d_out x weight,
 * written to d_inp (fp32) and, when d_inp_bf16 is not NULL, to a bf16
 * copy for the matrix products that follow; d_inp may be NULL when
 * d_inp_bf16 is not (the stream gradient kept in bf16 alone, as
 * Megatron-LM's bf16 recipe and llm.c keep it). The residual gradient is
 * d_residual (fp32) or, when that is NULL, d_residual_bf16; both NULL:
 * taken as 0. d_residual may equal d_inp and d_residual_bf16 may equal
 * d_inp_bf16 (in place). inp_bf16 is the forward's input (the bf16
 * residual stream). d_weight and d_bias (C, of one precision) are ADDED
 * to (either's data may be NULL). One kernel when C % 8 == 0, C <= 8192
 * and the tensors are 16-byte aligned, else two. scratch:
 * cuda_layernorm_backward_scratch(N_max, C) floats for calls of up to
 * N_max rows, ZEROED once before the first call (it holds the kernel's
 * completion counters, which every call leaves at zero again); one call
 * at a time may use it.
 */
cudaError_t cuda_layernorm_backward(float *d_inp, pt_bf16 *d_inp_bf16,
                                    cuda_grad d_weight, cuda_grad d_bias,
                                    const float *d_residual,
                                    const pt_bf16 *d_residual_bf16,
                                    const pt_bf16 *d_out_bf16,
                                    const pt_bf16 *inp_bf16,
                                    const float *weight,
                                    const float *mean, const float *rstd,
                                    float *scratch, int N, int C,
                                    cudaStream_t stream);

/* ---------------------------------------------------------------- rmsnorm */

/* out_bf16 = inp x rstd x weight, rstd = 1 / sqrt(mean(inp^2) + eps)
 * (RMSNorm, the Llama family's: no mean subtracted, no bias; the bf16
 * residual stream in, statistics in fp32; layernorm.cu's kernels with
 * the mean and bias terms compiled out). rstd (N floats) is kept for the
 * backward; it may be NULL. */
cudaError_t cuda_rmsnorm_forward(pt_bf16 *out_bf16, float *rstd,
                                 const pt_bf16 *inp_bf16, const float *weight,
                                 float eps, int N, int C,
                                 cudaStream_t stream);
/* A norm of a residual sum: sum_bf16 = inp_bf16 + skip_bf16 (added in
 * fp32, rounded once: the stream's next value; sum_bf16 may be inp_bf16,
 * in place), then out_bf16 = the norm of sum_bf16, as
 * cuda_layernorm_forward (rms false; eps its fixed 1e-5) or
 * cuda_rmsnorm_forward (rms true: mean and bias unused), in one pass
 * over the rows; skip_bf16 NULL: the norm of inp_bf16 alone (sum_bf16
 * unused). */
cudaError_t cuda_norm_forward_after_add(pt_bf16 *out_bf16, float *mean,
                                        float *rstd, pt_bf16 *sum_bf16,
                                        const pt_bf16 *inp_bf16,
                                        const pt_bf16 *skip_bf16,
                                        const float *weight,
                                        const float *bias, bool rms,
                                        float eps, int N, int C,
                                        cudaStream_t stream);

/*
 * RMSNorm backward fused with the residual branch point, as
 * cuda_layernorm_backward (the same rules for its outputs and residual):
 *   d_inp = d_residual + rstd (g - xhat mean(g xhat)),
 *   g = d_out x weight, xhat = inp x rstd,
 * written to d_inp (fp32, may be NULL) and/or d_inp_bf16; the residual
 * gradient d_residual (fp32) or, when NULL, d_residual_bf16 (either may
 * be the output it is read into: in place). d_weight (C) is ADDED to in
 * a fixed order. scratch: cuda_layernorm_backward_scratch(N_max, C)
 * floats, zeroed once, under the layer norm's rules (the two norms may
 * share one scratch, one call at a time).
 */
cudaError_t cuda_rmsnorm_backward(float *d_inp, pt_bf16 *d_inp_bf16,
                                  cuda_grad d_weight,
                                  const float *d_residual,
                                  const pt_bf16 *d_residual_bf16,
                                  const pt_bf16 *d_out_bf16,
                                  const pt_bf16 *inp_bf16,
                                  const float *weight, const float *rstd,
                                  float *scratch, int N, int C,
                                  cudaStream_t stream);

/*
 * Either norm's backward (rms: RMSNorm, mean and bias unused) with the
 * stream gradient in bf16 alone, as cuda_layernorm_backward /
 * cuda_rmsnorm_backward with d_inp NULL, that also writes the forward's
 * output again: out_bf16 = the norm of inp_bf16 (from the forward's mean
 * and rstd), the same bits the forward wrote (one write of the rows, in
 * the kernel that reads them anyway): for a backward that did not keep
 * the output and needs it after the norm's backward (a product's weight
 * gradient). bias: layer norm's (not NULL when rms is false). The
 * scratch under the same rules.
 */
cudaError_t cuda_norm_backward_and_output(
    pt_bf16 *out_bf16, pt_bf16 *d_inp_bf16, cuda_grad d_weight,
    cuda_grad d_bias, const pt_bf16 *d_residual_bf16,
    const pt_bf16 *d_out_bf16, const pt_bf16 *inp_bf16, const float *weight,
    const float *bias, const float *mean, const float *rstd, bool rms,
    float *scratch, int N, int C, cudaStream_t stream);

/* ----------------------------------------------------------------- swiglu */

/* SwiGLU (swiglu.cu), one kernel each way. inp_bf16: N rows of 2F, the
 * gate in columns [0, F) and up in [F, 2F) (Megatron's fused fc1 with
 * --swiglu, cpu_swiglu_forward's order); out_bf16: N x F,
 * out = silu(gate) x up, computed in fp32 and rounded once. */
cudaError_t cuda_swiglu_forward(pt_bf16 *out_bf16, const pt_bf16 *inp_bf16,
                                int N, int F, cudaStream_t stream);
/* d_gate = d_out x up x silu'(gate), d_up = d_out x silu(gate), into
 * d_inp_bf16 (N x 2F, the layout of inp), WRITTEN (the backend never adds
 * here, unlike the cpu op); d_inp may be inp (each element is read and
 * written by one thread), so the fc1 output can take its own gradient. */
cudaError_t cuda_swiglu_backward(pt_bf16 *d_inp_bf16,
                                 const pt_bf16 *d_out_bf16,
                                 const pt_bf16 *inp_bf16, int N, int F,
                                 cudaStream_t stream);
/* The backward and the forward again in one pass, for a layer that
 * recomputes SwiGLU's output in its backward: reads d_out from
 * d_out_then_out (N x F) and writes out = silu(gate) x up over it (the
 * forward's bits), and d_gate, d_up into d_inp_bf16 as
 * cuda_swiglu_backward; d_inp may be inp. One pass where the forward
 * then the backward read the gate and up twice. */
cudaError_t cuda_swiglu_backward_and_forward(pt_bf16 *d_inp_bf16,
                                             pt_bf16 *d_out_then_out_bf16,
                                             const pt_bf16 *inp_bf16, int N,
                                             int F, cudaStream_t stream);

/* ------------------------------------------------------------------- rope */

/*
 * Rotary positions, rotate-half (cpu_rope_forward's convention), IN
 * PLACE on the bf16 product that holds them (rope.cu): rows of `width`
 * elements, B x T of them (position t = row % T), whose first `heads`
 * heads of head_size (even) are turned, the rest left alone: with the
 * attention's qkv layout (query heads, then key heads, then value
 * heads), heads = NH + KVH turns queries and keys and passes the values.
 * The angles are taken in double (as the cpu's), one sine and cosine
 * per position and pair, shared by every head of the row.
 */
cudaError_t cuda_rope_forward(pt_bf16 *x_bf16, double base, int B, int T,
                              int width, int heads, int head_size,
                              cudaStream_t stream);
/* The inverse rotation, in place on the gradient (d_qkv as the
 * attention's backward WROTE it): d_x = R^T d_x. */
cudaError_t cuda_rope_backward(pt_bf16 *d_x_bf16, double base, int B, int T,
                               int width, int heads, int head_size,
                               cudaStream_t stream);

/*
 * The qkv product between the weight's grouped order (Megatron-LM's: per
 * key/value group its NH / KVH query heads, its key head, its value head;
 * every model but GPT-2) and the heads' order the attention reads (NH
 * query heads, KVH key heads, KVH value heads), rows of (NH + 2 KVH) hs,
 * B x T of them, out of place. With turn, the query and key heads are
 * turned on the way as cuda_rope_forward turns them (to_heads) or turned
 * back as cuda_rope_backward (to_grouped, the gradient's way): one pass
 * for regrouping and RoPE (rope.cu).
 */
cudaError_t cuda_qkv_to_heads(pt_bf16 *heads_bf16, const pt_bf16 *grouped_bf16,
                              double base, bool turn, int B, int T, int NH,
                              int KVH, int hs, cudaStream_t stream);
cudaError_t cuda_qkv_to_grouped(pt_bf16 *d_grouped_bf16,
                                const pt_bf16 *d_heads_bf16, double base,
                                bool turn, int B, int T, int NH, int KVH,
                                int hs, cudaStream_t stream);

/* ------------------------------------------------------------ bias grads */

/* d_bias[j] += sum over the N rows of d_out_bf16[n, j] (OC columns), with
 * a fixed summation order. scratch: cuda_bias_grad_scratch(N, OC)
 * floats. */
cudaError_t cuda_bias_grad(cuda_grad d_bias, const pt_bf16 *d_out_bf16,
                           float *scratch, int N, int OC,
                           cudaStream_t stream);

/* -------------------------------------------------------------- attention */

/*
 * Causal multi-head attention, flash-attention style: the T x T scores
 * never reach device memory. qkv_bf16: B x T x 3C (query, key, value of a
 * position side by side, head h at channels [h D, (h+1) D), D = C / NH).
 * out_bf16: B x T x C. lse: B x NH x T floats, the log-sum-exp of each
 * query's scores (base 2, of the scaled scores), kept for the backward.
 * Head sizes 64 and 128 run on the tensor cores (mma.sync); others take
 * a plain fallback that is correct but slow.
 */
cudaError_t cuda_attention_forward(pt_bf16 *out_bf16, float *lse,
                                   const pt_bf16 *qkv_bf16, int B, int T,
                                   int C, int NH, cudaStream_t stream);
/* WRITES d_qkv_bf16 (B x T x 3C). scratch: cuda_attention_backward_scratch
 * floats (B x NH x T). */
cudaError_t cuda_attention_backward(pt_bf16 *d_qkv_bf16,
                                    const pt_bf16 *d_out_bf16,
                                    const pt_bf16 *qkv_bf16,
                                    const pt_bf16 *out_bf16, const float *lse,
                                    float *scratch, int B, int T, int C,
                                    int NH, cudaStream_t stream);

/* The same for head sizes without tensor-core kernels (attention_plain.cu;
 * cuda_attention_forward and _backward hand such heads here): one block
 * per row, T x 4 (forward) or T x 8 bytes (backward) of shared memory at
 * most 48 KiB, else cudaErrorInvalidValue. */
cudaError_t cuda_attention_forward_plain(pt_bf16 *out_bf16, float *lse,
                                         const pt_bf16 *qkv_bf16, int B,
                                         int T, int C, int NH,
                                         cudaStream_t stream);
cudaError_t cuda_attention_backward_plain(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int C, int NH, cudaStream_t stream);

/*
 * Causal grouped-query attention on the plain kernels (attention_plain.cu),
 * the path of GQA shapes when cuDNN is absent or declines: qkv_bf16 B x T
 * x (NH + 2 KVH) D, each row the NH query heads, the KVH key heads, then
 * the KVH value heads (cpu_gqa_attention_forward's layout); query head h
 * reads key and value head h / (NH / KVH). out_bf16: B x T x NH D; lse:
 * B x NH x T, base 2 (as the own kernels'). With KVH == NH these are
 * cuda_attention_forward_plain / _backward_plain, to the bit. The
 * backward WRITES d_qkv_bf16 (a key or value head's gradient summed over
 * its group's query heads in fp32, rounded once); scratch:
 * cuda_attention_backward_scratch(B, T, NH) floats. Shared memory as the
 * plain kernels' (T x 4 bytes forward, T x 8 + D x 8 backward, at most
 * 48 KiB, else cudaErrorInvalidValue).
 */
cudaError_t cuda_gqa_attention_forward_plain(pt_bf16 *out_bf16, float *lse,
                                             const pt_bf16 *qkv_bf16, int B,
                                             int T, int NH, int KVH, int D,
                                             cudaStream_t stream);
cudaError_t cuda_gqa_attention_backward_plain(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int NH, int KVH, int D, cudaStream_t stream);
/* The own path of any GQA shape: the tensor-core kernels of attention.cu
 * when KVH == NH (cuda_attention_forward / _backward), else the plain
 * ones above. */
cudaError_t cuda_gqa_attention_forward(pt_bf16 *out_bf16, float *lse,
                                       const pt_bf16 *qkv_bf16, int B, int T,
                                       int NH, int KVH, int D,
                                       cudaStream_t stream);
cudaError_t cuda_gqa_attention_backward(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int NH, int KVH, int D, cudaStream_t stream);

/* ------------------------------------------------------------- classifier */

/*
 * Softmax + cross-entropy of N rows of logits (bf16, V valid columns,
 * row stride ld >= V), fused with the start of the backward: each row's
 * loss goes to losses[n] (fp32) and the row is overwritten IN PLACE with
 * softmax - onehot(target), unscaled (the backward scales it by
 * loss_scale / N inside the matrix products); columns V..ld are set to
 * zero. targets: device, N ids.
 */
cudaError_t cuda_classifier_forward(pt_bf16 *logits_bf16, float *losses,
                                    const uint32_t *targets, int N, int V,
                                    int ld, cudaStream_t stream);
/*
 * The same for a vocab-parallel shard (tensor parallelism: V of the
 * vocabulary's columns, from vocab_first; targets are whole-vocabulary
 * ids), as Megatron splits it:
 *   1. cuda_vocab_parallel_partials: each row's max and sum of exp(x -
 *      max) over the shard's V columns, and the target's logit when the
 *      shard holds it (else 0);
 *   2. the caller reduces the maxima over the group by max (into
 *      global_max, a copy: the shard's own maxima are still needed);
 *   3. cuda_vocab_parallel_rescale: row_sum *= exp(row_max - global_max);
 *   4. the caller sums row_sum and target_logit over the group;
 *   5. cuda_vocab_parallel_finish: losses[n] = log(sum) + max - target
 *      logit, and the row becomes softmax - onehot as above, padding
 *      columns V..ld zeroed.
 */
cudaError_t cuda_vocab_parallel_partials(const pt_bf16 *logits_bf16,
                                         float *row_max, float *row_sum,
                                         float *target_logit,
                                         const uint32_t *targets,
                                         int vocab_first, int N, int V,
                                         int ld, cudaStream_t stream);
cudaError_t cuda_vocab_parallel_rescale(float *row_sum, const float *row_max,
                                        const float *global_max, int N,
                                        cudaStream_t stream);
cudaError_t cuda_vocab_parallel_finish(pt_bf16 *logits_bf16, float *losses,
                                       const uint32_t *targets,
                                       const float *global_max,
                                       const float *row_sum,
                                       const float *target_logit,
                                       int vocab_first, int N, int V, int ld,
                                       cudaStream_t stream);
/* out[0] = sum of values[0..count) / count, summed in double (device). */
cudaError_t cuda_mean(double *out, const float *values, int count,
                      cudaStream_t stream);
/* The same mean rounded to float (as a forward returns it) and added to
 * sum[0] (device): the one-stage step's loss sum. */
cudaError_t cuda_mean_add(double *sum, const float *values, int count,
                          cudaStream_t stream);
/* From step->square_sum and step->loss_sum: grad_norm = its square root,
 * non_finite when the norm or the loss sum is not finite, clip_scale the
 * clipping coefficient for max_norm (clip_coefficient's arithmetic, in
 * double: the same float). One thread. */
cudaError_t cuda_step_clip(cuda_step_values *step, float max_norm,
                           cudaStream_t stream);

/* -------------------------------------------------------------- optimizer */

/* The optimizer kernels work on param_chunk tables (kernel_sizes.h): a
 * chunk is `count` (<= PARAM_CHUNK_ELEMENTS) floats at fp32 offset
 * `offset` of the parameter buffers and at `mirror_offset` of the bf16
 * weight mirror; `decay` when AdamW decays it. */

/* AdamW over every chunk (see cpu_adamw_update), then the bf16 mirror of
 * the updated parameters; the gradients fp32 or bf16 (read at the chunks'
 * offsets in elements of their type). first_correction /
 * second_correction: 1 - beta^step. step (device; NULL: grad_scale
 * applies): the one-stage step's values, whose clip_scale replaces
 * grad_scale and whose non_finite leaves every buffer untouched. */
typedef struct adamw_args {
    float learning_rate;
    float beta1, beta2, eps, weight_decay;
    float grad_scale;
    float first_correction, second_correction;
    const cuda_step_values *step;
} adamw_args;

cudaError_t cuda_adamw(float *params, cuda_grad grads, float *adam_m,
                       float *adam_v, pt_bf16 *mirror_bf16,
                       const param_chunk *chunks, int chunk_count,
                       const adamw_args *args, cudaStream_t stream);
/* The bf16 mirror of params, chunk by chunk (after a host write). */
cudaError_t cuda_refresh_mirror(pt_bf16 *mirror_bf16, const float *params,
                                const param_chunk *chunks, int chunk_count,
                                cudaStream_t stream);
/* out[0] = sum of values[i]^2 (double, device; values fp32 or bf16).
 * scratch: cuda_square_sum_scratch() doubles. */
cudaError_t cuda_square_sum(double *out, cuda_grad values, size_t count,
                            double *scratch, cudaStream_t stream);
/* out[t] = sum of squares of tensor t (double, device), t < tensor_count,
 * where tensor t is chunks [tensor_chunk_starts[t], tensor_chunk_starts[t
 * + 1]) of the optimizer table (device). chunk_sums: chunk_count doubles
 * of scratch. Two launches, fixed summation order. */
cudaError_t cuda_square_sums_per_tensor(double *out, cuda_grad values,
                                        const param_chunk *chunks,
                                        int chunk_count,
                                        const int *tensor_chunk_starts,
                                        int tensor_count, double *chunk_sums,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
