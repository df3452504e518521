/*
 * The cuda backend's memory plan, without the GPU: how a stage's device
 * buffers are carved (the activation slots, the backward scratch) and
 * sized (parameters, gradients, AdamW moments, the bf16 mirror, the
 * optimizer's chunk tables), with every byte counted in a named term
 * (pt_memory_terms). model_cuda.c allocates through these functions and
 * tallies what it allocated; cuda_stage_memory_plan runs the same code
 * over no memory, so the tests (and anyone without a GPU) know the exact
 * bytes a stage will take. Plain C: built with or without CUDA.
 */
#ifndef PARTITA_EXECUTOR_CUDA_BUFFERS_H
#define PARTITA_EXECUTOR_CUDA_BUFFERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "executor/cuda/kernel_sizes.h"
#include "executor/stage/stage.h"

#ifndef PARTITA_PT_BF16
#define PARTITA_PT_BF16
/* A bfloat16 value as its 16 bits (the top half of an fp32). */
typedef uint16_t pt_bf16;
#endif

/* Every piece of an arena starts on this boundary (cuBLASLt's best
 * kernels want 256-byte aligned matrices). */
#define ARENA_ALIGNMENT 256
/* The logits' row stride: the vocabulary rounded up, so rows stay
 * aligned for 16-byte accesses and the products' tiles. */
#define VOCAB_ROUNDING 128
/* What the driver hands out per cudaMalloc is taken as the request
 * rounded up to its 2 MiB pages (the tally's assumption; a run's
 * `context` term, device memory in use less the tally, shows what it
 * misses). */
#define CUDA_ALLOCATION_GRANULE (2u * 1024u * 1024u)
/* The fused head (buffer_layout.head_rows) computes its logits in
 * chunks of rows of at most about this many bytes under fp32 gradients
 * (Megatron's recipe). */
#define HEAD_CHUNK_BYTES (256u * 1024u * 1024u)
/* The chunk's buffer, dead outside the head, also takes cuDNN's
 * attention backward, which runs in as few pieces of whole sequences as
 * fit in the chunk or in this many bytes (the chunk then grows to the
 * piece's workspace): half of GPT-2 350M's at micro-batch 16 (256 MiB
 * and its row sums) fits, so it runs in 2 calls, not 4. */
#define ATTENTION_LENT_ROOM (288u * 1024u * 1024u)
/* Rows of a head chunk are a multiple of this. */
#define HEAD_CHUNK_ROW_MULTIPLE 128
/* ... and at least this many (or every row): each chunk's weight-gradient
 * product reads and writes the whole V x C fp32 gradient, so a chunk of
 * few rows pays that traffic often. At Llama's vocabulary (128,256 rows
 * of 256 KiB) 256 MiB holds only 1,024 rows; 4,096 were 1.5 % (Llama-3.2-1B)
 * and 2.7 % (Llama-3-8B, 4 layers) faster a step at sequence 8192 on one
 * H200 (docs/records/gpu-runs.md, ninth session, call 2). GPT-2's 256 MiB
 * chunks hold 2,600 rows or more. */
#define HEAD_CHUNK_MIN_ROWS 4096
/* Room over cuDNN's workspace formula where the head's chunk buffer is
 * sized by the attention rather than by the logits (cuDNN may ask a few
 * hundred bytes more than B x NH x T x T bf16). */
#define ATTENTION_LENT_SLACK (1u << 20)

/* The shapes buffers and products are sized from. With tensor
 * parallelism the shard's: A attention channels and NH heads (C / tp and
 * heads / tp), F MLP features (ffn_hidden / tp), V vocabulary rows from
 * vocab_first. C, the residual stream's width, is never split. Under
 * sequence parallelism (spec.sequence_parallel) the shard holds R of the
 * N rows outside the tensor-parallel products, rows [row0, row0 + R) of
 * the whole (stage_sequence_rows), packed from 0 in its buffers; R = N
 * and row0 = 0 without it. */
typedef struct stage_dims {
    int B, T, C, A, F, V, NH, N;
    /* the shard's key/value heads, the head size, the qkv product's
     * width ((NH + 2 KVH) hs: 3A for GPT-2) and the first MLP product's
     * (SwiGLU's gate and up 2F, else F) */
    int KVH, hs, QW, FW;
    bool rmsnorm;                   /* RMSNorm: the norms keep no mean */
    int vocab_first;
    int tp;
    int R, row0;
    bool sp;
    /* a forward in two halves of the micro-batch (cuda_tp_forward_halves;
     * set by the forward, false elsewhere): B, N and R are a half's in
     * its passes */
    bool tp_halves;
} stage_dims;

static inline stage_dims dims_of_shape(const model_shape *shape,
                                       const stage_spec *spec, int mbs)
{
    stage_shard shard = stage_shard_of(shape, spec);
    stage_dims d = {
        .B = mbs,
        .T = shape->seq,
        .C = shape->hidden,
        .A = shard.attention_channels,
        .F = shard.ffn,
        .V = shard.vocab_count,
        .NH = shard.heads,
        .vocab_first = shard.vocab_first,
        .tp = shard.tp,
        .KVH = model_kv_heads(shape) / shard.tp,
        .hs = shape->hidden / shape->heads,
        .rmsnorm = shape->norm == MODEL_NORM_RMSNORM,
    };
    d.QW = (d.NH + 2 * d.KVH) * d.hs;
    d.FW = shape->mlp == MODEL_MLP_SWIGLU ? 2 * d.F : d.F;
    d.N = d.B * d.T;
    size_t first = 0, rows = 0;
    stage_sequence_rows(spec, (size_t)d.N, &first, &rows);
    d.row0 = (int)first;
    d.R = (int)rows;
    d.sp = d.R != d.N;
    return d;
}

/* What the forward of one layer keeps for its backward (N rows; A and
 * F are the shard's attention channels and MLP features, C and F unsplit;
 * NH its heads; R the rows the shard holds outside the products: N, or
 * its sequence shard). */
typedef struct layer_activations {
    float *ln1_mean, *ln1_rstd;     /* R (no mean: NULL under RMSNorm) */
    pt_bf16 *ln1_out;               /* R x C; NULL when recomputed */
    pt_bf16 *qkv;                   /* N x QW (3A for GPT-2), the heads'
                                       order: queries, keys, values */
    pt_bf16 *att_out;               /* N x A, before the projection */
    float *att_lse;                 /* B x NH x T, in the convention of
                                       the attention's path
                                       (attention_runner.h) */
    pt_bf16 *residual_mid;          /* R x C: input + attention */
    float *ln2_mean, *ln2_rstd;
    pt_bf16 *ln2_out;               /* NULL when recomputed */
    pt_bf16 *fc_pre;                /* N x FW, before the GELU (or
                                       SwiGLU: [gate | up]) */
    pt_bf16 *gelu_out;              /* N x F, the GELU's (or SwiGLU's)
                                       output; NULL when recomputed */
    pt_bf16 *output;                /* R x C: mid + MLP */
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
    pt_bf16 *input;                 /* R x C: the residual stream's
                                       start (embedding or received) */
    /* the pipeline's fp32 boundary (stage.h's interface): what the
     * previous stage sends is received here (without the embedding, else
     * NULL) and rounded into `input`; the last stream, widened, is what
     * this stage sends (without the head, else NULL) */
    float *received;                /* R x C fp32 */
    float *output;                  /* R x C fp32 */
    layer_activations *layers;      /* owned host array */
    pt_bf16 *final_out;             /* N x C (every shard's rows); under
                                       the fused head, from the forward's
                                       end its gradient */
    float *final_mean, *final_rstd; /* N (R used) */
    pt_bf16 *logits;                /* N x ld_logits: logits, then
                                       softmax - onehot; NULL under the
                                       fused head (the scratch's chunk) */
    float *losses;                  /* N */
    const pt_bf16 *stream_out;      /* last layer's output, or input */
    int mbs;
    bool awaiting_backward;
} activation_slot;

/* Gradients of activations and working space, used by one backward at a
 * time (and, for the recomputed tensors, by the forward). */
typedef struct backward_scratch {
    void *arena;                    /* owned device memory */
    float *d_stream_fp32;           /* N x C (R rows used): the stage's
                                       input gradient in fp32, for the
                                       embedding or the previous stage */
    pt_bf16 *d_stream_bf16;         /* N x C: the stream gradient through
                                       the head and the layers (a shard's
                                       rows at row0, then gathered) */
    pt_bf16 *d_norm;                /* N x C: gradient of a norm's output */
    pt_bf16 *d_att;                 /* N x A */
    pt_bf16 *d_qkv;                 /* N x QW */
    pt_bf16 *d_fc;                  /* N x F; also the GELU recompute;
                                       in head_logits when it holds it
                                       (dead there while the head and
                                       the attention's backward run) */
    pt_bf16 *norm_out;              /* N x C: recomputed norm outputs,
                                       gathered ones under sequence
                                       parallelism (else NULL) */
    pt_bf16 *head_logits;           /* the fused head's chunk of logits
                                       (head_rows x ld_logits, or more:
                                       buffer_head_chunk_bytes), lent to
                                       the attention's backward; else
                                       NULL */
    float *norm_partials;           /* layer-norm weight/bias partials */
    float *bias_partials;           /* bias-gradient partials */
    float *bias_grads;              /* F: an epilogue's bias gradient */
    float *attention;               /* B x NH x T */
    double *square_partials;
    double *reduced;                /* one double read back by the host */
    cuda_step_values *step;         /* the one-stage step's values */
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
    float *norm_grads;              /* 4C, sequence parallelism only: a
                                       layer's two norms' weight and bias
                                       gradients from the shard's rows,
                                       summed over the group before they
                                       join the gradients */
    const float *input_grad;
} backward_scratch;

/* Everything the sizes of a stage's device buffers depend on. */
typedef struct buffer_layout {
    stage_dims dims;                /* at the stage's mbs_capacity */
    stage_spec spec;
    int layer_count;
    int ld_logits;                  /* Vp: the vocabulary rounded up */
    size_t head_pad;                /* (Vp - V) x C, 0 without a head */
    /* The fused head (tp 1, gradients in the one buffer): the forward
     * runs the head's logits, loss, softmax - onehot and both products
     * of its backward head_rows rows at a time in one chunk buffer of
     * head_chunk_bytes in the scratch, leaving the gradient of the final
     * norm's output in the slot; 0 (and 0 bytes): the slots keep their
     * whole logits for the backward, as every stage did before. */
    int head_rows;
    size_t head_chunk_bytes;
    /* The backward's stream-wide buffers that the fused head never
     * touches (buffer_head_shared_bytes) are dead while its chunks run: they
     * live in the chunk from this offset, behind the fc gradient and
     * cuDNN's borrowed workspace, where the chunk holds them (0: in the
     * scratch of their own, as without a fused head). */
    size_t head_shared_offset;
    /* cuDNN's attention backward at full micro-batches runs in this many
     * pieces of whole sequences so its workspace fits in the memory the
     * head lends (buffer_logits_lendable_bytes); 0: it does not fit even
     * one sequence at a time (or no head, or not cuDNN's shape), and the
     * runner has a workspace of its own */
    int attention_split;
    bool recompute_gelu;            /* PARTITA_CUDA_RECOMPUTE, see */
    bool recompute_norm;            /* cuda_backend.h */
    size_t param_count;             /* floats of params, grads */
    size_t optimizer_count;         /* floats of each AdamW moment */
    int tensor_count;
    int chunk_count;                /* chunks of every parameter */
    bool optimizer_table;           /* the optimizer's range is not every
                                       parameter (a ZeRO-1 shard), so it
                                       has a chunk table of its own, */
    int optimizer_chunk_count;      /* of this many chunks */
    /* ZeRO-2/3 (buffer_grads_by_unit): the gradients' buffer holds the
     * optimizer's range only (grad_count floats, else param_count) and
     * a backward fills unit buffers of these sizes */
    bool grads_by_unit;
    size_t grad_count;
    stage_units units;
    /* ZeRO-3 (grads_by_unit and spec.shard_parameters): the fp32
     * parameters likewise the optimizer's range (params_count floats,
     * else param_count), no mirror of them; units gathered into blocks
     * of fp32 and bf16 buffers, converted through a chunk table of each
     * unit kind's tensors (unit_chunk_count chunks in all) */
    bool params_by_unit;
    size_t params_count;
    int unit_chunk_count;
} buffer_layout;

/* Whether a cuda stage of this shape and spec keeps its gradients as its
 * ZeRO-2/3 shard (spec.shard_gradients with optimizer shards): all but
 * the first and last stage of a pipeline of tied embeddings, whose tied
 * pair is summed from whole buffers (zero_tied_embedding). */
bool buffer_grads_by_unit(const model_shape *shape, const stage_spec *spec);

/* Whether a cuda stage of this shape and spec runs the fused head
 * (buffer_layout.head_rows > 0; docs/cuda-backend.md, "The fused
 * head"): it holds the head at tp 1 with its gradients in the one
 * buffer (not buffer_grads_by_unit). The cost model's
 * costmodel_head_fused mirrors it (tests/costmodel/test_memory.c). */
bool buffer_head_fused(const model_shape *shape, const stage_spec *spec);

/* Bytes of the backward's buffers that may live in the fused head's
 * chunk (buffer_layout.head_shared_offset), each 256-byte aligned: the
 * bf16 stream gradient, the norm's, the attention's and the qkv
 * product's gradients, and on a stage with the embedding the fp32 input
 * gradient (elsewhere it is sent while the next forward runs). The cost
 * model's head_shared_bytes mirrors it. */
size_t buffer_head_shared_bytes(const buffer_layout *layout);

/* The gradient units' one block (grads_by_unit; 0 bytes without): two
 * layer buffers (the one the backward fills, the one being reduced),
 * the head's, the embeddings' (last: a tied head's padding rows run on
 * past the token embedding), then the head's slack (head_pad floats)
 * and one float. Floats from the block's start to each. */
typedef struct buffer_grad_units {
    size_t layer[2];
    size_t head;
    size_t embedding;
    size_t floats;                  /* the block's */
} buffer_grad_units;

void buffer_grad_units_of(const buffer_layout *layout,
                          buffer_grad_units *out);
size_t buffer_grad_units_bytes(const buffer_layout *layout);

/* ZeRO-3's parameter units (params_by_unit; 0 bytes without): an fp32
 * block carved as the gradients' (two layers, the head, the embeddings,
 * one float), and a bf16 block of the same units, each as the mirror
 * lays its tensors out (the head weight followed by its zero padding:
 * in the head's unit, or a tied one in the embeddings'). Elements from
 * each block's start to each unit. */
typedef struct buffer_param_units {
    size_t layer[2], head, embedding, floats;          /* fp32 */
    size_t mirror_layer[2], mirror_head, mirror_embedding, halves;
} buffer_param_units;

void buffer_param_units_of(const buffer_layout *layout,
                           buffer_param_units *out);
/* The fp32 block's bytes (weights), the bf16 block's (the mirror), the
 * units' conversion tables' (the optimizer's term, as the chunk tables
 * are). */
size_t buffer_param_units_bytes(const buffer_layout *layout);
size_t buffer_param_mirror_bytes(const buffer_layout *layout);
size_t buffer_unit_tables_bytes(const buffer_layout *layout);

/* Fills a layout for a stage of `shape` and `spec` whose tensors are
 * tensors[0..tensor_count) (stage_parameter_layout's), optimizer range
 * [optimizer_first, + optimizer_count), micro-batch capacity mbs;
 * recompute is PARTITA_CUDA_RECOMPUTE's value (NULL: the default, gelu).
 * Fails on a recompute list it does not know. */
int buffer_layout_init(const model_shape *shape, const stage_spec *spec,
                       const param_tensor *tensors, int tensor_count,
                       size_t optimizer_first, size_t optimizer_count,
                       int mbs, const char *recompute, buffer_layout *out,
                       pt_error *err);

/* The part [*lo, *hi) of tensor t inside [first, end); empty when
 * *lo >= *hi. */
void buffer_tensor_part(const param_tensor *t, size_t first, size_t end,
                        size_t *lo, size_t *hi);
/* Chunks of at most PARAM_CHUNK_ELEMENTS covering the part of every
 * tensor inside [first, end). */
int buffer_chunks_in_range(const param_tensor *tensors, int tensor_count,
                           size_t first, size_t end);
/* Bytes of a chunk table of `chunks` chunks: the chunks, then
 * tensor_count + 1 ints (each tensor's first chunk). */
size_t buffer_chunk_table_bytes(int chunks, int tensor_count);

/* Bytes asked of cudaMalloc for each buffer sized by the parameters:
 * STAGE_PARAMS, STAGE_GRADS (with the head's slack), STAGE_ADAM_M,
 * STAGE_ADAM_V (the optimizer's range); mirror: the bf16 copy. */
size_t buffer_parameter_bytes(const buffer_layout *layout,
                              stage_buffer which);
size_t buffer_mirror_bytes(const buffer_layout *layout);
/* The term a parameter-sized buffer counts in. */
pt_memory_term buffer_parameter_term(stage_buffer which);

/* Hands out consecutive aligned pieces of one allocation, counting each
 * piece's bytes in its term. Run once with base NULL to learn the size,
 * then again over the allocated block. */
typedef struct arena {
    char *base;
    size_t used;
    double term_bytes[PT_MEMORY_TERM_COUNT];
} arena;

void *arena_take(arena *a, size_t bytes, pt_memory_term term);

/* The token ids and embedding plan of one micro-batch (the same layout
 * on the device and in pinned host memory). */
void buffer_carve_tokens(token_block *block, arena *a, size_t N);
/* The pieces of one activation slot: token ids, the input, each layer's
 * activations (with full recompute, its output only) and, on the last
 * stage, the head's. slot->layers must hold layer_count entries. */
void buffer_carve_slot(activation_slot *slot, arena *a,
                       const buffer_layout *layout);
/* The pieces of the backward scratch; `recomputed` receives the one set
 * of layer activations of full recompute (left alone without it). */
void buffer_carve_scratch(backward_scratch *s,
                          layer_activations *recomputed, arena *a,
                          const buffer_layout *layout);
/* The bytes an arena of `a.used` bytes asks of cudaMalloc (one byte of
 * slack: never 0). */
size_t arena_request_bytes(const arena *a);

/* Adds one allocation to a tally: its pieces to their terms and what the
 * driver hands out beyond them (CUDA_ALLOCATION_GRANULE pages) to
 * PT_MEMORY_ROUNDING. A single-piece allocation passes term and bytes;
 * an arena its term_bytes. */
void buffer_tally(pt_memory_terms *tally, pt_memory_term term,
                  size_t requested);
void buffer_tally_arena(pt_memory_terms *tally, const arena *a);

/* The bytes the stage's head lends cuDNN's attention backward: the
 * fused head's chunk buffer (up to head_shared_offset where it shares
 * the rest), else a slot's N x Vp bf16 logits; 0 without a head. */
size_t buffer_logits_lendable_bytes(const buffer_layout *layout);
/* The workspace the stage's attention runner allocates for cuDNN's
 * backward: 0 for a stage of no layers, a shape cuDNN does not take, or
 * a backward that fits, in pieces of whole sequences, in what the head
 * lends (attention_split; cuda_cudnn_backward_workspace_bytes). A build
 * without cuDNN, or a cuDNN runtime the runner avoids, allocates none:
 * the plan assumes cuDNN. */
size_t buffer_attention_workspace_bytes(const buffer_layout *layout);

/* The device memory a cuda stage of this shape, spec, micro-batch
 * capacity and slot count allocates, by term: what model_cuda.c tallies
 * (cuda_stage_memory_terms), computed without a GPU. The comm and the
 * context are not the stage's (0 here). */
int cuda_stage_memory_plan(const model_shape *shape, const stage_spec *spec,
                           int mbs_capacity, int slot_count,
                           const char *recompute, pt_memory_terms *out,
                           pt_error *err);
/* The layout a cuda stage of this shape, spec, micro-batch capacity and
 * PARTITA_CUDA_RECOMPUTE (NULL: the default) sizes its buffers from,
 * without a GPU (what cuda_stage_memory_plan tallies). */
int cuda_stage_buffer_layout(const model_shape *shape,
                             const stage_spec *spec, int mbs_capacity,
                             const char *recompute, buffer_layout *out,
                             pt_error *err);

#endif
