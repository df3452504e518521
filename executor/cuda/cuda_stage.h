/*
 * Private to the cuda backend: the state of a cuda stage, which
 * model_cuda.c (its memory plan, buffers and optimizer) and passes.c (its
 * forward and backward) share. The design of both is described at the
 * top of model_cuda.c.
 */
#ifndef PARTITA_EXECUTOR_CUDA_STAGE_H
#define PARTITA_EXECUTOR_CUDA_STAGE_H

#include "executor/cuda/attention_runner.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_ops.h"
#include "executor/cuda/gemm.h"

/* Every piece of an arena starts on this boundary (cuBLASLt's best
 * kernels want 256-byte aligned matrices). */
#define ARENA_ALIGNMENT 256
/* The logits' row stride: the vocabulary rounded up, so rows stay
 * aligned for 16-byte accesses and the products' tiles. */
#define VOCAB_ROUNDING 128

/* Every piece of an arena starts on this boundary (cuBLASLt's best
 * kernels want 256-byte aligned matrices). */
#define ARENA_ALIGNMENT 256
/* The logits' row stride: the vocabulary rounded up, so rows stay
 * aligned for 16-byte accesses and the products' tiles. */
#define VOCAB_ROUNDING 128

/* Offsets (in floats) of one transformer layer's tensors in the
 * parameter-sized buffers (the bf16 mirror: see mirror_offset). */
typedef struct layer_offsets {
    size_t ln1_weight, ln1_bias;
    size_t qkv_weight, qkv_bias;
    size_t attn_proj_weight, attn_proj_bias;
    size_t ln2_weight, ln2_bias;
    size_t fc_weight, fc_bias;
    size_t mlp_proj_weight, mlp_proj_bias;
} layer_offsets;

/* Offsets of every tensor of the stage; only those the stage holds are
 * meaningful. */
typedef struct stage_offsets {
    size_t token_embedding, position_embedding;
    layer_offsets *layers;          /* owned: one per local layer */
    size_t final_norm_weight, final_norm_bias;
    size_t head_weight;             /* lm_head_weight or token_embedding */
} stage_offsets;

/* What the forward of one layer keeps for its backward (N rows; A and
 * F are the shard's attention channels and MLP features, C and F unsplit;
 * NH its heads). */
typedef struct layer_activations {
    float *ln1_mean, *ln1_rstd;     /* N */
    pt_bf16 *ln1_out;               /* N x C; NULL when recomputed */
    pt_bf16 *qkv;                   /* N x 3A */
    pt_bf16 *att_out;               /* N x A, before the projection */
    float *att_lse;                 /* B x NH x T, in the convention of
                                       the attention's path
                                       (attention_runner.h) */
    float *residual_mid;            /* N x C fp32: input + attention */
    float *ln2_mean, *ln2_rstd;
    pt_bf16 *ln2_out;               /* NULL when recomputed */
    pt_bf16 *fc_pre;                /* N x F, before the GELU */
    pt_bf16 *gelu_out;              /* N x F; NULL when recomputed */
    float *output;                  /* N x C fp32: mid + MLP */
} layer_activations;

/* Token ids and the embedding-gradient plan of a micro-batch, laid out
 * the same in pinned host memory and on the device, so one copy moves
 * them. */
typedef struct token_block {
    uint32_t *inputs;               /* N */
    uint32_t *targets;              /* N */
    int *plan_starts;               /* N + 1 */
    int *plan_rows;                 /* N */
    uint32_t *plan_tokens;          /* N */
} token_block;

/* One micro-batch in flight. */
typedef struct activation_slot {
    void *arena;                    /* owned device memory */
    token_block tokens;             /* device, inside the arena */
    int unique_tokens;              /* groups of the embedding plan */
    float *input;                   /* N x C fp32 */
    layer_activations *layers;      /* owned host array */
    pt_bf16 *final_out;             /* N x C */
    float *final_mean, *final_rstd;
    pt_bf16 *logits;                /* N x ld_logits: logits, then
                                       softmax - onehot */
    float *losses;                  /* N */
    const float *output;            /* last layer's output, or input */
    int mbs;
    bool awaiting_backward;
} activation_slot;

/* Gradients of activations and working space, used by one backward at a
 * time (and, for the recomputed tensors, by the forward). */
typedef struct backward_scratch {
    void *arena;                    /* owned device memory */
    float *d_stream[2];             /* N x C fp32, alternating */
    pt_bf16 *d_stream_bf16;         /* N x C: the same, for the products */
    pt_bf16 *d_norm;                /* N x C: gradient of a norm's output */
    pt_bf16 *d_att;                 /* N x A */
    pt_bf16 *d_qkv;                 /* N x 3A */
    pt_bf16 *d_fc;                  /* N x F; also the GELU recompute */
    pt_bf16 *norm_out;              /* N x C: recomputed norm outputs */
    float *norm_partials;           /* layer-norm weight/bias partials */
    float *bias_partials;           /* bias-gradient partials */
    float *bias_grads;              /* F: an epilogue's bias gradient */
    float *attention;               /* B x NH x T */
    double *square_partials;
    double *reduced;                /* one double read back by the host */
    double *tensor_squares;         /* tensor_count: grad_square_sums */
    double *chunk_squares;          /* a chunk table's count: their
                                       partials */
    float *output_grad;             /* N x C fp32 without the head (else
                                       NULL): where the next stage's
                                       gradient is received */
    /* tensor parallelism only (NULL when tp is 1): */
    float *d_partial;               /* N x C fp32: a column-parallel input
                                       gradient before the group's sum */
    float *row_stats;               /* 4N with the head: the vocab-parallel
                                       softmax's shard maxima, group
                                       maxima, sums and target logits */
    const float *input_grad;
} backward_scratch;

/* A device table of parameter chunks (param_chunk) followed by the index
 * of each tensor's first chunk: tensor t is chunks [tensor_starts[t],
 * tensor_starts[t + 1]). */
typedef struct chunk_table {
    param_chunk *chunks;            /* device; owns the allocation */
    int count;
    int *tensor_starts;             /* device, tensor_count + 1, inside it */
} chunk_table;

/* backend_state of a cuda stage. */
typedef struct cuda_stage_state {
    int device;
    cudaStream_t stream;
    gemm_context *gemm;
    attention_runner *attention;    /* cuDNN's or the own kernels */
    /* A slot's logits (N x ld_logits bf16 at full micro-batches, 0
     * without a head) are dead from the head's backward to the slot's
     * next forward: the attention's backward borrows them for cuDNN's
     * workspace (B x NH x T x T bf16 at most); attention_lent is the
     * slot in backward's, NULL outside a backward. */
    size_t logits_bytes;
    void *attention_lent;
    stage_offsets offsets;
    int layer_count;
    int ld_logits;                  /* Vp: the vocabulary rounded up */
    size_t head_offset;             /* fp32 offset of the head weight */
    size_t head_pad;                /* (Vp - V) x C, 0 without a head */
    bool recompute_gelu;
    bool recompute_norm;
    /* full recompute (spec.recompute_layers): slots keep each layer's
     * output only; every forward, and the forward run again before a
     * layer's backward, write this one set in the scratch arena, its
     * `output` pointed at the slot's */
    layer_activations recomputed;
    bool fuse_epilogues;
    pt_bf16 *mirror;                /* owned: bf16 copy of params */
    chunk_table all_chunks;         /* every parameter: the mirror */
    chunk_table optimizer_chunks;   /* the optimizer's range (AdamW, the
                                       gradient norms): all_chunks' own
                                       memory unless a ZeRO-1 shard */
    activation_slot *slots;         /* owned host array */
    backward_scratch scratch;
    token_block host_tokens;        /* pinned host, one micro-batch */
    void *host_block;               /* owned pinned memory */
    void *token_counts;             /* owned host scratch of the
                                       embedding plan, zeroed */
    size_t device_bytes;
    cuda_grad_hook grad_hook;       /* NULL: none (cuda_backend.h) */
    void *grad_hook_data;
} cuda_stage_state;

/* The shapes buffers and products are sized from. With tensor
 * parallelism the shard's: A attention channels and NH heads (C / tp and
 * heads / tp), F MLP features (ffn_hidden / tp), V vocabulary rows from
 * vocab_first. C, the residual stream's width, is never split. */
typedef struct stage_dims {
    int B, T, C, A, F, V, NH, N;
    int vocab_first;
    int tp;
} stage_dims;

static inline stage_dims dims_of(const model_stage *stage, int mbs)
{
    stage_shard shard = stage_shard_of(&stage->shape, &stage->spec);
    stage_dims d = {
        .B = mbs,
        .T = stage->shape.seq,
        .C = stage->shape.hidden,
        .A = shard.attention_channels,
        .F = shard.ffn,
        .V = shard.vocab_count,
        .NH = shard.heads,
        .vocab_first = shard.vocab_first,
        .tp = shard.tp,
    };
    d.N = d.B * d.T;
    return d;
}

static inline cuda_stage_state *state_of(const model_stage *stage)
{
    return stage->backend_state;
}


/* Where a tensor at fp32 offset `offset` sits in the bf16 mirror: after
 * the head weight, further on by the head's zero padding. */
static inline size_t mirror_offset(const cuda_stage_state *state, size_t offset)
{
    return offset > state->head_offset ? offset + state->head_pad : offset;
}

/* The forward and backward of a cuda stage (passes.c), the entries of
 * the backend's table for stage_backend.forward and .backward. */
int cuda_stage_forward(model_stage *stage, int slot_index,
                       const stage_io *io, float *mean_loss, pt_error *err);
int cuda_stage_backward(model_stage *stage, int slot_index,
                        const stage_io *io, pt_error *err);

#endif
