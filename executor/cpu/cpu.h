/*
 * executor/cpu: the cpu backend, plain fp32 C on host memory, the
 * reference every other backend is held to (executor/cuda is checked
 * against it), and its ops, public so that tests and the cuda backend's
 * tests can compare with them.
 */
#ifndef PARTITA_EXECUTOR_CPU_H
#define PARTITA_EXECUTOR_CPU_H

#include "executor/stage/stage.h"

/* ---------------------------------------------------- cpu reference ops */

/*
 * The layers of the model as plain fp32 C on host memory, forward and
 * backward of each as separate functions, each checked against finite
 * differences (tests/executor/model/test_ops.c).
 *
 * Shapes: B sequences, T positions, C channels, N = B x T rows, OC output
 * channels, NH heads, V vocabulary. Row-major throughout.
 *
 * Gradient convention: every backward ADDS into its gradient outputs,
 * parameters and inputs alike (callers zero them first), so a buffer can
 * gather the contributions of several consumers; the one exception is
 * cpu_softmax_crossentropy_backward, the start of the chain, which writes.
 * A NULL gradient output is skipped.
 */

/* out[b,t,:] = token_embedding[tokens[b,t],:] + position_embedding[t,:]
 * (no position term when position_embedding is NULL: rotary positions).
 * tokens: B x T ids below the embedding's rows (the caller checks). */
void cpu_embedding_forward(float *out, const uint32_t *tokens,
                           const float *token_embedding,
                           const float *position_embedding, int B, int T,
                           int C);
void cpu_embedding_backward(float *d_token_embedding,
                            float *d_position_embedding, const float *d_out,
                            const uint32_t *tokens, int B, int T, int C);

/* Layer norm over the last axis with eps 1e-5: out = (x - mean) * rstd *
 * weight + bias; keeps mean and rstd (N each) for the backward. */
void cpu_layernorm_forward(float *out, float *mean, float *rstd,
                           const float *inp, const float *weight,
                           const float *bias, int N, int C);
void cpu_layernorm_backward(float *d_inp, float *d_weight, float *d_bias,
                            const float *d_out, const float *inp,
                            const float *weight, const float *mean,
                            const float *rstd, int N, int C);

/* out (N x OC) = inp (N x C) weight^T + bias, weight OC x C (one row per
 * output channel); bias may be NULL (the LM head has none). */
void cpu_matmul_forward(float *out, const float *inp, const float *weight,
                        const float *bias, int N, int C, int OC);
void cpu_matmul_backward(float *d_inp, float *d_weight, float *d_bias,
                         const float *d_out, const float *inp,
                         const float *weight, int N, int C, int OC);

/* Causal multi-head self-attention. qkv: B x T x 3C, the query, key and
 * value of a position side by side, head h at channels [h C/NH, (h+1)
 * C/NH) of each. out: B x T x C, heads side by side. probs: B x NH x T x T
 * softmax weights (zero above the diagonal), kept for the backward. */
void cpu_attention_forward(float *out, float *probs, const float *qkv,
                           int B, int T, int C, int NH);
/* scratch: T floats of working space. */
void cpu_attention_backward(float *d_qkv, const float *d_out,
                            const float *qkv, const float *probs,
                            float *scratch, int B, int T, int C, int NH);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))), as GPT-2. */
void cpu_gelu_forward(float *out, const float *inp, size_t count);
void cpu_gelu_backward(float *d_inp, const float *d_out, const float *inp,
                       size_t count);

/* out = a + b (the skip connection around each sub-block). */
void cpu_residual_forward(float *out, const float *a, const float *b,
                          size_t count);
void cpu_residual_backward(float *d_a, float *d_b, const float *d_out,
                           size_t count);

/* Each value rounded to the nearest bfloat16 (ties to even), kept as
 * fp32: how the reference emulates a tensor the cuda backend stores in
 * bf16. NaN and infinities pass unchanged. */
void cpu_round_to_bf16(float *values, size_t count);

/* Softmax over each row of logits (N x V) into probs (may be the same
 * buffer) and the cross-entropy of each row against its target into
 * losses (N). Returns the mean loss (accumulated in double). */
float cpu_softmax_crossentropy_forward(float *probs, float *losses,
                                       const float *logits,
                                       const uint32_t *targets, int N, int V);
/* WRITES d_logits = (probs - onehot(target)) x d_loss for every row, where
 * d_loss is d (objective) / d (each row's loss); d_logits may be probs. */
void cpu_softmax_crossentropy_backward(float *d_logits, const float *probs,
                                       const uint32_t *targets, float d_loss,
                                       int N, int V);

/* ------------------------------------------- cpu reference Llama ops */

/*
 * The Llama family's layers (cpu/ops_llama_cpu.c), by the conventions
 * above, each backward checked against finite differences
 * (tests/executor/model/test_llama_ops.c). F: the MLP's hidden width,
 * KVH key/value heads (NH a multiple of it), hs the head size (even).
 */

/* RMSNorm over the last axis: out = x rstd weight, rstd = 1 /
 * sqrt(mean(x^2) + eps); no mean is subtracted and there is no bias.
 * Keeps rstd (N) for the backward. */
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp,
                         const float *weight, float eps, int N, int C);
void cpu_rmsnorm_backward(float *d_inp, float *d_weight, const float *d_out,
                          const float *inp, const float *weight,
                          const float *rstd, int N, int C);

/* SwiGLU: out (N x F) = silu(gate) * up, silu(x) = x sigmoid(x). inp is
 * one product of 2F columns per row, the gate in columns [0, F) and up
 * in [F, 2F): the order of Megatron's fused fc1 with --swiglu (its glu
 * splits the output in two halves along the last axis, the first through
 * silu), so its fc1 weight's first F rows are the gate projection. */
void cpu_swiglu_forward(float *out, const float *inp, int N, int F);
void cpu_swiglu_backward(float *d_inp, const float *d_out, const float *inp,
                         int N, int F);

/* Rotary positions, rotate-half (Llama's and Megatron's default, not the
 * interleaved pairs of GPT-J): in each head, channel i and i + hs/2
 * (i < hs/2) turn by the angle t base^(-2i/hs) at position t (0 .. T-1
 * in each sequence): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
 * Rows are `width` floats; the first `heads` heads of each are rotated,
 * the rest copied (so one call turns the queries and keys of a fused
 * projection and passes its values). out may be inp. */
void cpu_rope_forward(float *out, const float *inp, double base, int B,
                      int T, int width, int heads, int head_size);
/* Adds the inverse rotation of d_out (the rest passed through). */
void cpu_rope_backward(float *d_inp, const float *d_out, double base, int B,
                       int T, int width, int heads, int head_size);

/* The fused qkv product's rows (N of them, (NH + 2 KVH) head_size wide)
 * between the weight's grouped order (Megatron-LM's: per key/value group
 * its G = NH / KVH query heads, its key head, its value head) and the
 * order cpu_gqa_attention reads (all query heads, all key heads, all
 * value heads). to_heads: grouped -> heads; else back. out != inp. */
void cpu_qkv_regroup(float *out, const float *inp, size_t N, int NH,
                     int KVH, int head_size, bool to_heads);

/* Causal grouped-query self-attention. qkv: B x T x (NH + 2 KVH) hs, each
 * row the NH query heads, then the KVH key heads, then the KVH value
 * heads (the layout of separate q, k and v projections side by side;
 * Megatron's fused projection orders rows per group instead, q.. k v, a
 * permutation of the weight's rows only). Query head h reads key and
 * value head h / (NH / KVH). out: B x T x NH hs. probs: B x NH x T x T
 * as cpu_attention_forward's; with KVH == NH the two ops are the same,
 * to the bit. */
void cpu_gqa_attention_forward(float *out, float *probs, const float *qkv,
                               int B, int T, int NH, int KVH, int head_size);
/* scratch: T floats. The key and value gradients of a group sum on the
 * head it shares. */
void cpu_gqa_attention_backward(float *d_qkv, const float *d_out,
                                const float *qkv, const float *probs,
                                float *scratch, int B, int T, int NH, int KVH,
                                int head_size);

/* ------------------------------------------ cpu reference Llama layer */

/*
 * One whole Llama layer from the ops above (cpu/layer_llama_cpu.c):
 * h = x + Wo GQA(RoPE(Wqkv RMSNorm(x))), out = h + W2 SwiGLU(W1
 * RMSNorm(h)), no biases. x and out: N = B x T rows of C.
 */
typedef struct cpu_llama_dims {
    int B, T, C;
    int heads, kv_heads, head_size; /* heads a multiple of kv_heads */
    int F;                          /* the MLP's hidden width */
    double rope_base;
    float eps;                      /* RMSNorm's */
} cpu_llama_dims;

/* The layer's parameters, each matrix OC x C as cpu_matmul takes it:
 * qkv (heads + 2 kv_heads) head_size x C in cpu_gqa_attention's order,
 * attn_out C x heads head_size, fc1 2F x C (gate rows, then up rows:
 * cpu_swiglu's order), fc2 C x F, the norms' weights C each. */
typedef struct cpu_llama_weights {
    const float *attn_norm, *qkv, *attn_out, *mlp_norm, *fc1, *fc2;
} cpu_llama_weights;
/* Their gradients, the same shapes; the backward adds into them. */
typedef struct cpu_llama_grads {
    float *attn_norm, *qkv, *attn_out, *mlp_norm, *fc1, *fc2;
} cpu_llama_grads;

/* What the forward keeps for the backward, and the output (out). qkv
 * holds the queries and keys after the rotation, as attention read
 * them. */
typedef struct cpu_llama_activations {
    float *attn_norm, *attn_rstd, *qkv, *attention, *probs;
    float *residual, *mlp_norm, *mlp_rstd, *fc1, *swiglu, *out;
} cpu_llama_activations;

/* The floats of one layer's activations, and their places in a buffer
 * of that many. */
size_t cpu_llama_activation_floats(const cpu_llama_dims *d);
void cpu_llama_activations_carve(cpu_llama_activations *act, float *floats,
                                 const cpu_llama_dims *d);
void cpu_llama_layer_forward(cpu_llama_activations *act, const float *inp,
                             const cpu_llama_weights *weights,
                             const cpu_llama_dims *d);
/* The backward's working space, in floats. */
size_t cpu_llama_scratch_floats(const cpu_llama_dims *d);
/* Adds into d_inp (may be NULL) and grads; scratch of
 * cpu_llama_scratch_floats. */
void cpu_llama_layer_backward(float *d_inp, cpu_llama_grads *grads,
                              const float *d_out, const float *inp,
                              const cpu_llama_activations *act,
                              const cpu_llama_weights *weights,
                              float *scratch, const cpu_llama_dims *d);

/* One AdamW update of `count` parameters, step >= 1 (bias correction):
 * g = grads x grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr (m_hat / (sqrt(v_hat) + eps) + decay p), decay = weight_decay
 * when `decay` else 0 (decoupled weight decay). */
void cpu_adamw_update(float *params, const float *grads, float *m, float *v,
                      size_t count, const adamw_config *config,
                      float learning_rate, float grad_scale, long step,
                      bool decay);


/* The cpu backend's optimizer ops (cpu/optimizer_cpu.c; its table's
 * grad_square_sum, grad_square_sums and adamw_step). */
int cpu_backend_grad_square_sum(const model_stage *stage, double *out,
                                pt_error *err);
int cpu_backend_grad_square_sums(const model_stage *stage,
                                 double *per_tensor, pt_error *err);
int cpu_backend_adamw_step(model_stage *stage, const adamw_config *config,
                           float learning_rate, float grad_scale,
                           pt_error *err);

/* The cpu backend's table (cpu/model_cpu.c), which backend_find hands
 * out for BACKEND_CPU. */
extern const stage_backend cpu_stage_backend;

/* ZeRO-2/3's shards on the cpu backend (cpu/units.c): buffers of one
 * unit's size, one per kind (the embeddings, a layer: all layers take
 * turns in one, the head). Gradients (spec.shard_gradients): a backward
 * writes each unit's into its buffer, and as each unit completes it is
 * handed to the stage's grad_sink, its part in the grads range (the
 * optimizer's) added there, and the buffer zeroed for the next.
 * Parameters (spec.shard_parameters): before a unit's forward or
 * backward its buffer gets the rank's part from params and the rest
 * from the stage's param_source. */
typedef enum cpu_unit_kind {
    CPU_UNIT_EMBEDDING = STAGE_UNIT_EMBEDDING,
    CPU_UNIT_LAYER = STAGE_UNIT_LAYER,
    CPU_UNIT_HEAD = STAGE_UNIT_HEAD,
    CPU_UNIT_KINDS = STAGE_UNIT_KINDS
} cpu_unit_kind;

/* The unit buffers of one stage. first and count per kind: where the unit
 * starts in the parameter buffer and its floats (for the layer, layer 0's
 * start and one layer's floats; count 0 for a kind the stage lacks). */
typedef struct cpu_units {
    float *buffer[CPU_UNIT_KINDS];   /* owned, zeroed between units */
    size_t first[CPU_UNIT_KINDS];
    size_t count[CPU_UNIT_KINDS];
} cpu_units;

/* Where the units of a stage of that spec and tensor table lie (no
 * buffers); returns their bytes. exec's memory check sizes them so. */
size_t cpu_units_layout(const stage_spec *spec,
                             const param_tensor *table, int tensor_count,
                             size_t param_count, cpu_units *out);
/* Sizes and allocates the buffers from the stage's tensor table; -1 when
 * out of memory (nothing left allocated). */
int cpu_units_open(const model_stage *stage, cpu_units *out);
void cpu_units_close(cpu_units *units);
/* Where parameter `offset` (or its gradient) lies during a pass. */
float *cpu_units_place(const cpu_units *units, size_t offset);
/* Unit `kind` (layer `layer` for CPU_UNIT_LAYER) is complete: the sink,
 * then its part in the grads range added there, then the buffer zeroed.
 * Nothing for a kind the stage lacks. */
int cpu_grad_units_done(model_stage *stage, cpu_units *units,
                        cpu_unit_kind kind, int layer, pt_error *err);
/* Unit `kind` (layer `layer`) gathered before its forward or backward:
 * the rank's part copied from params, zeros elsewhere, then the source. */
int cpu_param_units_fetch(model_stage *stage, cpu_units *units,
                          cpu_unit_kind kind, int layer, pt_error *err);
void cpu_units_zero(cpu_units *units);
/* The bytes of the unit buffers. */
size_t cpu_units_bytes(const cpu_units *units);

/* Host bytes a cpu-backend stage allocated for activations: its slots'
 * arenas and token ids and its backward scratch (what *activation_bytes
 * above predicts); 0 for a stage of another backend. */
size_t cpu_stage_activation_bytes(const model_stage *stage);
/* What cpu_stage_activation_bytes will report for a stage of that
 * shape and spec at micro-batch capacity mbs with slot_count slots,
 * before any is allocated (exec's memory check); 0 when out of memory. */
size_t cpu_stage_activation_bytes_of(const model_shape *shape,
                                     const stage_spec *spec, int mbs,
                                     int slot_count);
/* The bytes of a cpu-backend stage's ZeRO-2/3 unit buffers of `which`
 * (STAGE_GRADS beside its grads of grad_count floats, STAGE_PARAMS
 * beside its params of params_count); 0 without them or on another
 * backend. */
size_t cpu_stage_unit_bytes(const model_stage *stage, stage_buffer which);

#endif
