/*
 * executor/cpu's private half of the cpu backend's stage: the shapes and
 * buffers that its model (model_cpu.c: embedding, head, loss, the
 * backend table) and its transformer layer (layer_cpu.c, with the
 * tensor- and sequence-parallel steps around the reference ops) share.
 */
#ifndef PARTITA_EXECUTOR_CPU_STAGE_CPU_H
#define PARTITA_EXECUTOR_CPU_STAGE_CPU_H

#include "executor/cpu/cpu.h"

/* Pointers to one transformer layer's tensors inside a parameter-sized
 * buffer (the parameters, or the gradients at the same offsets); NULL for
 * those the model has not (RMSNorm's bias, the biases a model goes
 * without). */
typedef struct layer_tensors {
    float *ln1_weight, *ln1_bias;
    float *qkv_weight, *qkv_bias;
    float *attn_proj_weight, *attn_proj_bias;
    float *ln2_weight, *ln2_bias;
    float *fc_weight, *fc_bias;
    float *mlp_proj_weight, *mlp_proj_bias;
} layer_tensors;

/* What the forward of one layer keeps for its backward (N = B x T rows;
 * with tensor parallelism the shard's widths of stage_dims: A attention
 * channels, QW of the qkv product, F MLP features and FW of the MLP's
 * first product). */
typedef struct layer_activations {
    float *ln1_out, *ln1_mean, *ln1_rstd;  /* N x C, N (LayerNorm), N */
    float *qkv;                            /* N x QW: queries, keys and
                                              values as attention read
                                              them (cpu_gqa_attention's
                                              order, rotated with rope) */
    float *att_probs;                      /* B x NH/tp x T x T */
    float *att_out;                        /* N x A, before the projection */
    float *residual_mid;                   /* N x C, input + attention */
    float *ln2_out, *ln2_mean, *ln2_rstd;
    float *fc_out;                         /* N x FW, before the GELU or
                                              SwiGLU */
    float *fc_act;                         /* N x F, after it */
    float *output;                         /* N x C, mid + MLP */
} layer_activations;

/* Gradients of activations, needed only while one backward runs. */
typedef struct backward_scratch {
    float *arena;                    /* owned */
    float *d_stream[2];              /* N x C: residual stream, alternating
                                        between a layer's output and input */
    float *d_mid;                    /* N x C */
    float *d_norm;                   /* N x C: gradient of a norm's output */
    float *d_att;                    /* N x A */
    float *d_qkv;                    /* N x QW; also the forward's qkv
                                        product in the grouped order,
                                        before it is regrouped into the
                                        layer's qkv (no backward runs
                                        then) */
    float *d_qkv_raw;                /* N x QW, grouped layouts only: the
                                        gradient before the rotation or
                                        the regrouping */
    float *d_fc;                     /* N x FW */
    float *d_fc_act;                 /* N x F */
    float *attention_row;            /* T */
    float *row_stats;                /* 3N: the vocab-parallel softmax's
                                        row maxima, sums and target logits */
    float *output_grad;              /* N x C: received d loss / d output */
    const float *input_grad;         /* points into d_stream after backward */
    float *norm_partial;             /* owned, 2C: sequence parallelism, a
                                        norm's weight and bias gradients
                                        from the shard's rows */
} backward_scratch;

/* Hands out consecutive pieces of one allocation. Run once with base NULL
 * to learn the size, then again over the allocated block. */
typedef struct arena {
    float *base;
    size_t used;
} arena;

static inline float *arena_take(arena *a, size_t count)
{
    float *piece = a->base != NULL ? a->base + a->used : NULL;
    a->used += count;
    return piece;
}

/* Shapes every buffer is sized from, and the layer's architecture; B is
 * the micro-batch capacity. With tensor parallelism the shard's: NH
 * query and KVH key/value heads of hs channels (heads / tp, kv_heads /
 * tp), A = NH hs attention channels, QW = (NH + 2 KVH) hs columns of the
 * qkv product, F MLP features and FW columns of the first MLP product (F,
 * or SwiGLU's gate and up 2F), V vocabulary rows from vocab_first. */
typedef struct stage_dims {
    size_t B, T, C, A, F, V, NH, N;
    size_t KVH, hs, QW, FW;
    int vocab_first;
    int tp;
    /* the rows the norms and residual adds run on: all N, or under
     * sequence parallelism the shard's rows [row0, row0 + rows) */
    size_t row0, rows;
    bool sp;
    bool rmsnorm;       /* else LayerNorm */
    float norm_eps;     /* RMSNorm's */
    bool swiglu;        /* else GELU */
    bool rope;          /* rotary positions, else learned ones */
    double rope_base;
    /* the qkv weight's rows in Megatron-LM's grouped order (each group's
     * query heads, key head, value head: every model but GPT-2's),
     * else GPT-2's query, key and value thirds */
    bool grouped_qkv;
} stage_dims;

/* The dims of a stage of that shape and spec at micro-batch mbs. */
stage_dims cpu_stage_dims(const model_shape *shape, const stage_spec *spec,
                          int mbs);

/* ------------------------------------------------------ the layer */

/* Everything one layer's backward reads but its output, from arena a. */
void cpu_carve_layer(layer_activations *act, arena *a, const stage_dims *d);

/* One pre-norm transformer block's forward into act (act->output: the
 * block's output) from input; with tensor parallelism the shard's. s:
 * the stage's scratch, whose d_qkv it borrows. */
int cpu_layer_forward(const model_stage *stage, layer_activations *act,
                      const layer_tensors *p, const float *input,
                      backward_scratch *s, const stage_dims *d,
                      pt_error *err);
/* Its backward: d_input receives (is overwritten with) the gradient of
 * the block's input; the parameters' gradients are added into g. */
int cpu_layer_backward(const model_stage *stage, float *d_input,
                       const float *d_out, layer_tensors *g,
                       const layer_tensors *p, const layer_activations *act,
                       const float *input, backward_scratch *s,
                       const stage_dims *d, pt_error *err);

/* ------------------------------ steps the layer and the head share */

void cpu_zero(float *buffer, size_t count);
/* A norm (LayerNorm, or RMSNorm: no mean, no bias) over the rows the
 * shard holds (all of them without sequence parallelism), its output
 * then gathered from every shard. */
int cpu_norm_forward(const model_stage *stage, float *out, float *mean,
                     float *rstd, const float *inp, const float *weight,
                     const float *bias, const stage_dims *d, pt_error *err);
/* Its backward over the shard's rows; the weight and bias gradients
 * summed over the shards under sequence parallelism. */
int cpu_norm_backward(const model_stage *stage, float *d_inp,
                      float *d_weight, float *d_bias, const float *d_out,
                      const float *inp, const float *weight,
                      const float *mean, const float *rstd,
                      backward_scratch *s, const stage_dims *d,
                      pt_error *err);
/* Under spec.bf16_residual, the shard's rows of a residual-stream
 * buffer rounded to bf16. */
void cpu_round_stream(const model_stage *stage, float *stream,
                      const stage_dims *d);
/* The partial gradient of a column-parallel layer's input summed over
 * the tp group (reduce-scattered by rows under sequence parallelism). */
int cpu_sum_partial_input_grad(const model_stage *stage, float *d_input,
                               const stage_dims *d, pt_error *err);
/* Under sequence parallelism the whole of a gradient whose shard rows
 * are in `rows`, gathered into `whole`; else `rows`. NULL on failure. */
const float *cpu_gathered_rows(const model_stage *stage, const float *rows,
                               float *whole, const stage_dims *d,
                               pt_error *err);

#endif
