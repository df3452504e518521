/*
 * The cuda backend: one model stage on one GPU. This file holds the
 * memory plan and the order of the kernels; the kernels are in the .cu
 * files beside it (declared in cuda_ops.h) and the matrix products in
 * gemm.c.
 *
 * Precision: fp32 master parameters, gradients and AdamW moments (the
 * four buffers of model_stage), a bf16 mirror of the parameters that the
 * matrix products read (refreshed by the AdamW kernel), the residual
 * stream and its gradient in fp32, every other activation in bf16.
 *
 * Memory: per activation slot one device arena holding what the backward
 * of its micro-batch needs (see slot_layout); per stage one arena of
 * backward scratch shared by the slots (one backward runs at a time) and
 * one pinned host block for the token upload.
 *
 * The vocabulary: products with a dimension of V = 50257 fall onto slow
 * generic cuBLASLt kernels, so every head product runs over V rounded up
 * to 128 (Vp): the bf16 mirror holds the head weight with Vp - V zero rows
 * after it (later tensors sit that much further on in the mirror), the
 * logits have Vp columns whose padding the classifier zeroes, and the
 * head's weight gradient is a Vp x C product accumulated (beta = 1) into
 * the fp32 gradients: its padding rows add exactly zero (zero rows of
 * d logits) to whatever follows the head tensor, and the gradient buffer
 * has (Vp - V) x C floats of slack at its end for a head stored last.
 *
 * Tensor parallelism (spec.tp > 1, Megatron's split): the stage holds
 * its shard of every split tensor (the table of stage_parameter_layout)
 * and its activations are the shard's: A = C / tp attention channels
 * (heads / tp heads of unchanged size), F / tp MLP features, the
 * vocabulary rows of stage_vocab_shard. The group's sums (through
 * stage_tp_all_reduce_sum / _max on device pointers, the stream drained
 * first: tp_reduce) follow the row-parallel products (attention and MLP
 * projections: bias and residual added after the sum), the
 * column-parallel input gradients (QKV, fc, LM head: computed in fp32,
 * summed, then rounded to bf16), the vocab-parallel embedding lookup and
 * the vocab-parallel cross-entropy (row maxima by max, exponential sums
 * and target logits by sum). docs/cuda-backend.md, "Tensor parallelism".
 *
 * Matrix products, row-major model view -> column-major cuBLASLt view: a
 * linear layer out (N x OC) = in (N x IC) W^T (W is OC x IC) is
 *   out^T (OC x N) = op_T(W^T as IC x OC) in^T (IC x N),
 * its input gradient d_in^T (IC x N) = W^T (IC x OC) d_out^T (OC x N),
 * and its weight gradient d_W^T (IC x OC) += in^T (IC x N) op_T(d_out^T).
 */
#include "executor/comm/comm.h"
#include "executor/cuda/cuda_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/cuda_ops.h"
#include "executor/cuda/gemm.h"

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
    float *att_lse;                 /* B x NH x T */
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
} cuda_stage_state;

/* --------------------------------------------------------------- arenas */

/* Hands out consecutive aligned pieces of one allocation. Run once with
 * base NULL to learn the size, then again over the allocated block. */
typedef struct arena {
    char *base;
    size_t used;
} arena;

static void *arena_take(arena *a, size_t bytes)
{
    a->used = (a->used + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT *
              ARENA_ALIGNMENT;
    void *piece = a->base != NULL ? a->base + a->used : NULL;
    a->used += bytes;
    return piece;
}

static float *take_floats(arena *a, size_t count)
{
    return arena_take(a, count * sizeof(float));
}

static pt_bf16 *take_bf16(arena *a, size_t count)
{
    return arena_take(a, count * sizeof(pt_bf16));
}

/* ------------------------------------------------------------ dimensions */

/* The shapes buffers and products are sized from. With tensor
 * parallelism the shard's: A attention channels and NH heads (C / tp and
 * heads / tp), F MLP features (ffn_hidden / tp), V vocabulary rows from
 * vocab_first. C, the residual stream's width, is never split. */
typedef struct stage_dims {
    int B, T, C, A, F, V, NH, N;
    int vocab_first;
    int tp;
} stage_dims;

static stage_dims dims_of(const model_stage *stage, int mbs)
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

static cuda_stage_state *state_of(const model_stage *stage)
{
    return stage->backend_state;
}

/* ----------------------------------------------------------- tensor map */

/* The layout of stage_parameter_layout, walked in its order. */
static void map_offsets(const model_stage *stage, stage_offsets *out)
{
    int index = 0;
    const param_tensor *table = stage->tensors;
    if (stage->spec.has_embedding) {
        out->token_embedding = table[index++].offset;
        out->position_embedding = table[index++].offset;
    }
    int layer_count = stage->spec.last_layer - stage->spec.first_layer;
    for (int l = 0; l < layer_count; l++) {
        layer_offsets *layer = &out->layers[l];
        size_t *fields[] = {
            &layer->ln1_weight,       &layer->ln1_bias,
            &layer->qkv_weight,       &layer->qkv_bias,
            &layer->attn_proj_weight, &layer->attn_proj_bias,
            &layer->ln2_weight,       &layer->ln2_bias,
            &layer->fc_weight,        &layer->fc_bias,
            &layer->mlp_proj_weight,  &layer->mlp_proj_bias,
        };
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            *fields[f] = table[index++].offset;
    }
    if (stage->spec.has_head) {
        out->final_norm_weight = table[index++].offset;
        out->final_norm_bias = table[index++].offset;
        out->head_weight = index < stage->tensor_count
                               ? table[index++].offset
                               : out->token_embedding;
    }
}

/* ----------------------------------------------------------- allocation */

static void carve_tokens(token_block *block, arena *a, size_t N)
{
    block->inputs = arena_take(a, N * sizeof(uint32_t));
    block->targets = arena_take(a, N * sizeof(uint32_t));
    block->plan_starts = arena_take(a, (N + 1) * sizeof(int));
    block->plan_rows = arena_take(a, N * sizeof(int));
    block->plan_tokens = arena_take(a, N * sizeof(uint32_t));
}

/* Everything a layer's backward reads but its output (the selective
 * recompute options leave out the norms' or the GELU's outputs). */
static void carve_layer(layer_activations *act, arena *a, const stage_dims *d,
                        const cuda_stage_state *state)
{
    size_t N = (size_t)d->N, C = (size_t)d->C, A = (size_t)d->A,
           F = (size_t)d->F;
    act->ln1_mean = take_floats(a, N);
    act->ln1_rstd = take_floats(a, N);
    act->ln1_out = state->recompute_norm ? NULL : take_bf16(a, N * C);
    act->qkv = take_bf16(a, N * 3 * A);
    act->att_out = take_bf16(a, N * A);
    act->att_lse = take_floats(a, (size_t)d->B * d->NH * d->T);
    act->residual_mid = take_floats(a, N * C);
    act->ln2_mean = take_floats(a, N);
    act->ln2_rstd = take_floats(a, N);
    act->ln2_out = state->recompute_norm ? NULL : take_bf16(a, N * C);
    act->fc_pre = take_bf16(a, N * F);
    act->gelu_out = state->recompute_gelu ? NULL : take_bf16(a, N * F);
}

static void carve_slot(activation_slot *slot, arena *a, const stage_dims *d,
                       const cuda_stage_state *state,
                       const stage_spec *spec)
{
    size_t N = (size_t)d->N, C = (size_t)d->C;
    carve_tokens(&slot->tokens, a, N);
    slot->input = take_floats(a, N * C);
    for (int l = 0; l < state->layer_count; l++) {
        layer_activations *act = &slot->layers[l];
        if (!spec->recompute_layers)
            carve_layer(act, a, d, state);
        act->output = take_floats(a, N * C);
    }
    bool has_head = spec->has_head;
    if (has_head) {
        slot->final_out = take_bf16(a, N * C);
        slot->final_mean = take_floats(a, N);
        slot->final_rstd = take_floats(a, N);
        slot->logits = take_bf16(a, N * (size_t)state->ld_logits);
        slot->losses = take_floats(a, N);
    }
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

static void carve_scratch(backward_scratch *s, arena *a, const stage_dims *d,
                          const model_stage *stage, cuda_stage_state *state)
{
    size_t N = (size_t)d->N, C = (size_t)d->C, A = (size_t)d->A,
           F = (size_t)d->F;
    if (stage->spec.recompute_layers && state->layer_count > 0)
        carve_layer(&state->recomputed, a, d, state);
    s->d_stream[0] = take_floats(a, N * C);
    s->d_stream[1] = take_floats(a, N * C);
    s->d_stream_bf16 = take_bf16(a, N * C);
    s->d_norm = take_bf16(a, N * C);
    s->d_att = take_bf16(a, N * A);
    s->d_qkv = take_bf16(a, N * 3 * A);
    s->d_fc = take_bf16(a, N * F);
    s->norm_out = take_bf16(a, N * C);
    s->norm_partials =
        take_floats(a, cuda_layernorm_backward_scratch(d->N, d->C));
    size_t widest = max_size(max_size(3 * A, F), C);
    s->bias_partials =
        take_floats(a, cuda_bias_grad_scratch(d->N, (int)widest));
    s->bias_grads = take_floats(a, F);
    s->attention = take_floats(
        a, cuda_attention_backward_scratch(d->B, d->T, d->NH));
    s->square_partials =
        arena_take(a, cuda_square_sum_scratch() * sizeof(double));
    s->reduced = arena_take(a, sizeof(double));
    s->tensor_squares =
        arena_take(a, (size_t)stage->tensor_count * sizeof(double));
    s->chunk_squares =
        arena_take(a, (size_t)state->all_chunks.count * sizeof(double));
    s->d_partial = d->tp > 1 ? take_floats(a, N * C) : NULL;
    s->row_stats =
        d->tp > 1 && stage->spec.has_head ? take_floats(a, 4 * N) : NULL;
    s->output_grad = stage->spec.has_head ? NULL : take_floats(a, N * C);
}

/* cudaMalloc counted against the rank's memory cap (memory_limit_gib,
 * executor/cuda/device.c) and in device_bytes, which cuda_release gives
 * back to the cap: both happen on the thread that owns the stage. */
static int device_alloc(cuda_stage_state *state, void **out, size_t bytes,
                        const char *what, pt_error *err)
{
    *out = NULL;
    if (cuda_rank_memory_reserve(bytes, what, err) != 0)
        return -1;
    cudaError_t status = cudaMalloc(out, bytes);
    if (status != cudaSuccess) {
        cuda_rank_memory_release(bytes);
        *out = NULL;
        cudaGetLastError(); /* clear it: the stage is released after */
        return pt_fail(err, "cuda backend: cudaMalloc of %.3f GiB for %s "
                            "failed at %s:%d: %s",
                       (double)bytes / PT_GIB, what, __FILE__, __LINE__,
                       cudaGetErrorString(status));
    }
    state->device_bytes += bytes;
    return 0;
}

/* Allocates an arena sized by a dry run of `carve` and carves it. */
#define ALLOCATE_ARENA(state, block, what, carve_call)                       \
    do {                                                                     \
        arena a_ = {.base = NULL, .used = 0};                                \
        arena *a = &a_;                                                      \
        carve_call;                                                          \
        void *block_ = NULL;                                                 \
        if (device_alloc((state), &block_, a_.used + 1, (what), err) != 0)   \
            return -1;                                                       \
        (block) = block_;                                                    \
        a_.base = (char *)block_;                                            \
        a_.used = 0;                                                         \
        carve_call;                                                          \
    } while (0)

/* Where a tensor at fp32 offset `offset` sits in the bf16 mirror: after
 * the head weight, further on by the head's zero padding. */
static size_t mirror_offset(const cuda_stage_state *state, size_t offset)
{
    return offset > state->head_offset ? offset + state->head_pad : offset;
}

/* The part [*lo, *hi) of tensor t inside [first, end); empty when
 * *lo >= *hi. */
static void tensor_part(const param_tensor *t, size_t first, size_t end,
                        size_t *lo, size_t *hi)
{
    *lo = t->offset > first ? t->offset : first;
    *hi = t->offset + t->count < end ? t->offset + t->count : end;
}

static int chunks_in_range(const model_stage *stage, size_t first,
                           size_t end)
{
    int chunks = 0;
    for (int i = 0; i < stage->tensor_count; i++) {
        size_t lo = 0, hi = 0;
        tensor_part(&stage->tensors[i], first, end, &lo, &hi);
        if (hi > lo)
            chunks += (int)((hi - lo + PARAM_CHUNK_ELEMENTS - 1) /
                            PARAM_CHUNK_ELEMENTS);
    }
    return chunks;
}

/* Chunks of at most PARAM_CHUNK_ELEMENTS covering the part of every
 * tensor inside [first, first + count), on the host: *out_count chunks,
 * then tensor_count + 1 ints, each tensor's first chunk. */
static param_chunk *host_chunk_table(const model_stage *stage,
                                     const cuda_stage_state *state,
                                     size_t first, size_t count,
                                     int *out_count, size_t *out_bytes)
{
    size_t end = first + count;
    int chunks = chunks_in_range(stage, first, end);
    size_t table_bytes = (size_t)chunks * sizeof(param_chunk);
    size_t bytes =
        table_bytes + ((size_t)stage->tensor_count + 1) * sizeof(int);
    param_chunk *host = calloc(1, bytes);
    if (host == NULL)
        return NULL;
    int *starts = (int *)((char *)host + table_bytes);
    int next = 0;
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t lo = 0, hi = 0;
        tensor_part(t, first, end, &lo, &hi);
        starts[i] = next;
        for (size_t at = lo; at < hi; at += PARAM_CHUNK_ELEMENTS) {
            param_chunk *chunk = &host[next++];
            size_t left = hi - at;
            chunk->offset = at;
            chunk->mirror_offset =
                mirror_offset(state, t->offset) + (at - t->offset);
            chunk->moment_offset = at - first;
            chunk->count = (uint32_t)(left < PARAM_CHUNK_ELEMENTS
                                          ? left
                                          : PARAM_CHUNK_ELEMENTS);
            chunk->decay = t->weight_decay;
        }
    }
    starts[stage->tensor_count] = next;
    *out_count = chunks;
    *out_bytes = bytes;
    return host;
}

/* A chunk table of the range on the device. */
static int build_chunk_table(const model_stage *stage,
                             cuda_stage_state *state, size_t first,
                             size_t count, chunk_table *out, pt_error *err)
{
    int chunks = 0;
    size_t bytes = 0;
    param_chunk *host =
        host_chunk_table(stage, state, first, count, &chunks, &bytes);
    if (host == NULL)
        return pt_fail(err, "cuda backend: out of host memory for the "
                            "optimizer's chunk table");
    void *device = NULL;
    if (device_alloc(state, &device, bytes, "the optimizer table", err) !=
        0) {
        free(host);
        return -1;
    }
    out->chunks = device;
    out->count = chunks;
    out->tensor_starts =
        (int *)((char *)device + (size_t)chunks * sizeof(param_chunk));
    cudaError_t status = cudaMemcpy(device, host, bytes,
                                    cudaMemcpyHostToDevice);
    free(host);
    if (status != cudaSuccess)
        return pt_fail(err, "cuda backend: optimizer table of %d chunks: "
                            "%s (%s:%d)",
                       chunks, cudaGetErrorString(status), __FILE__,
                       __LINE__);
    return 0;
}

/* The work tables: every parameter (the bf16 mirror's refresh) and the
 * optimizer's range (AdamW and the gradient norms), one table when they
 * are the same. */
static int build_chunks(model_stage *stage, cuda_stage_state *state,
                        pt_error *err)
{
    if (build_chunk_table(stage, state, 0, stage->param_count,
                          &state->all_chunks, err) != 0)
        return -1;
    if (stage->optimizer_count == stage->param_count) {
        state->optimizer_chunks = state->all_chunks;
        return 0;
    }
    return build_chunk_table(stage, state, stage->optimizer_first,
                             stage->optimizer_count,
                             &state->optimizer_chunks, err);
}

static bool list_has(const char *list, const char *word)
{
    size_t length = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += length) {
        bool starts = p == list || p[-1] == ',';
        bool ends = p[length] == '\0' || p[length] == ',';
        if (starts && ends)
            return true;
    }
    return false;
}

static int read_options(cuda_stage_state *state, pt_error *err)
{
    const char *recompute = getenv("PARTITA_CUDA_RECOMPUTE");
    if (recompute == NULL)
        recompute = "gelu";
    bool all = list_has(recompute, "all");
    state->recompute_gelu = all || list_has(recompute, "gelu");
    state->recompute_norm = all || list_has(recompute, "norm");
    if (!all && !state->recompute_gelu && !state->recompute_norm &&
        !list_has(recompute, "none") && recompute[0] != '\0')
        return pt_fail(err, "cuda backend: PARTITA_CUDA_RECOMPUTE=\"%s\": "
                            "expected a comma list of gelu, norm, all, none",
                       recompute);
    const char *fuse = getenv("PARTITA_CUDA_FUSE");
    state->fuse_epilogues = fuse == NULL || strcmp(fuse, "0") != 0;
    return 0;
}

static void cuda_release(model_stage *stage)
{
    cuda_stage_state *state = stage->backend_state;
    if (state != NULL)
        cudaSetDevice(state->device);
    cudaFree(stage->params);
    cudaFree(stage->grads);
    cudaFree(stage->adam_m);
    cudaFree(stage->adam_v);
    stage->params = stage->grads = stage->adam_m = stage->adam_v = NULL;
    if (state == NULL)
        return;
    if (state->slots != NULL) {
        for (int s = 0; s < stage->slot_count; s++) {
            cudaFree(state->slots[s].arena);
            free(state->slots[s].layers);
        }
    }
    free(state->slots);
    cudaFree(state->scratch.arena);
    cudaFree(state->mirror);
    if (state->optimizer_chunks.chunks != state->all_chunks.chunks)
        cudaFree(state->optimizer_chunks.chunks);
    cudaFree(state->all_chunks.chunks);
    cudaFreeHost(state->host_block);
    free(state->token_counts);
    free(state->offsets.layers);
    gemm_context_destroy(state->gemm);
    if (state->stream != NULL)
        cudaStreamDestroy(state->stream);
    cuda_rank_memory_release(state->device_bytes);
    free(state);
    stage->backend_state = NULL;
}

/* After a failed allocation, says how far it got and what the device
 * has, so the user can size the micro-batch or the plan. */
static void append_memory_report(pt_error *err, double allocated_gib)
{
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    size_t length = strlen(err->message);
    snprintf(err->message + length, sizeof err->message - length,
             " (%.2f GiB were allocated before it failed; the device has "
             "%.2f GiB free of %.2f GiB)",
             allocated_gib, (double)free_bytes / PT_GIB,
             (double)total_bytes / PT_GIB);
}

/* Refuses, before any allocation, a stage whose fp32 parameters,
 * gradients and AdamW moments and bf16 weight mirror (18 bytes per
 * parameter) alone exceed the device's free memory; activations come on
 * top, and a shortage there is reported by the allocation itself. */
static int check_state_fits(const model_stage *stage, pt_error *err)
{
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return 0; /* the allocations will tell */
    }
    double state_bytes = 18.0 * (double)stage->param_count;
    if (state_bytes <= (double)free_bytes)
        return 0;
    return pt_fail(err, "cuda backend: model %s needs at least %.2f GiB on "
                        "the device for its %zu parameters (fp32 weights, "
                        "gradients and AdamW moments and a bf16 copy: 18 "
                        "bytes each) before activations; the device has "
                        "%.2f GiB free of %.2f GiB",
                   stage->shape.name, state_bytes / PT_GIB,
                   stage->param_count, (double)free_bytes / PT_GIB,
                   (double)total_bytes / PT_GIB);
}

static int check_shape(const model_stage *stage, pt_error *err)
{
    const model_shape *shape = &stage->shape;
    int tp = stage_spec_tp(&stage->spec);
    if (shape->hidden % (8 * tp) != 0 || shape->ffn_hidden % (8 * tp) != 0)
        return pt_fail(err, "cuda backend: model %s has hidden %d and "
                            "ffn_hidden %d; with tensor parallelism %d "
                            "both must be divisible by %d (16-byte rows of "
                            "bf16 in every shard)",
                       shape->name, shape->hidden, shape->ffn_hidden, tp,
                       8 * tp);
    int device_count = cuda_device_count();
    if (device_count == 0)
        return pt_fail(err, "cuda backend: no CUDA device is visible");
    return check_state_fits(stage, err);
}

static int allocate_parts(model_stage *stage, cuda_stage_state *state,
                          pt_error *err)
{
    CUDA_TRY(cudaGetDevice(&state->device));
    if (cuda_rank_stream_create(&state->stream, err) != 0)
        return -1;
    size_t workspace = gemm_workspace_bytes();
    if (cuda_rank_memory_reserve(workspace, "the cuBLASLt workspace",
                                 err) != 0)
        return -1;
    if (gemm_context_create(&state->gemm, err) != 0) {
        cuda_rank_memory_release(workspace);
        return -1;
    }
    state->device_bytes += workspace;
    if (read_options(state, err) != 0)
        return -1;
    stage_dims d = dims_of(stage, stage->mbs_capacity);
    state->ld_logits =
        (d.V + VOCAB_ROUNDING - 1) / VOCAB_ROUNDING * VOCAB_ROUNDING;
    if (stage->spec.has_head) {
        state->head_offset = state->offsets.head_weight;
        state->head_pad = (size_t)(state->ld_logits - d.V) * (size_t)d.C;
    }
    float **buffers[] = {&stage->params, &stage->grads, &stage->adam_m,
                         &stage->adam_v};
    const char *names[] = {"the parameters", "the gradients",
                           "the AdamW first moments",
                           "the AdamW second moments"};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) {
        /* the gradients' slack: see the head products above */
        size_t slack = buffers[i] == &stage->grads ? state->head_pad : 0;
        bool moments = buffers[i] == &stage->adam_m ||
                       buffers[i] == &stage->adam_v;
        size_t floats =
            moments ? stage->optimizer_count : stage->param_count;
        size_t bytes = (floats + slack + 1) * sizeof(float);
        void *buffer = NULL;
        if (device_alloc(state, &buffer, bytes, names[i], err) != 0)
            return -1;
        *buffers[i] = buffer;
        CUDA_TRY(cudaMemset(buffer, 0, bytes));
    }
    size_t mirror_bytes =
        (stage->param_count + state->head_pad + 1) * sizeof(pt_bf16);
    void *mirror = NULL;
    if (device_alloc(state, &mirror, mirror_bytes, "the bf16 weight mirror",
                     err) != 0)
        return -1;
    state->mirror = mirror;
    CUDA_TRY(cudaMemset(state->mirror, 0, mirror_bytes));
    if (build_chunks(stage, state, err) != 0)
        return -1;

    for (int s = 0; s < stage->slot_count; s++) {
        activation_slot *slot = &state->slots[s];
        slot->layers = calloc((size_t)state->layer_count + 1,
                              sizeof *slot->layers);
        if (slot->layers == NULL)
            return pt_fail(err, "cuda backend: out of host memory");
        ALLOCATE_ARENA(state, slot->arena, "an activation slot",
                       carve_slot(slot, a, &d, state, &stage->spec));
    }
    ALLOCATE_ARENA(state, state->scratch.arena, "the backward scratch",
                   carve_scratch(&state->scratch, a, &d, stage, state));
    {
        arena a = {.base = NULL, .used = 0};
        carve_tokens(&state->host_tokens, &a, (size_t)d.N);
        CUDA_TRY(cudaMallocHost(&state->host_block, a.used + 1));
        a.base = state->host_block;
        a.used = 0;
        carve_tokens(&state->host_tokens, &a, (size_t)d.N);
    }
    if (stage->spec.has_embedding) {
        /* the shard's vocabulary: embedding_plan_build_range */
        state->token_counts = calloc(1, embedding_plan_scratch_bytes(d.V));
        if (state->token_counts == NULL)
            return pt_fail(err, "cuda backend: out of host memory");
    }
    return 0;
}

static int cuda_allocate(model_stage *stage, pt_error *err)
{
    if (check_shape(stage, err) != 0)
        return -1;
    cuda_stage_state *state = calloc(1, sizeof *state);
    if (state == NULL)
        return pt_fail(err, "cuda backend: out of host memory");
    stage->backend_state = state;
    state->layer_count = stage->spec.last_layer - stage->spec.first_layer;
    state->offsets.layers =
        calloc((size_t)state->layer_count + 1, sizeof(layer_offsets));
    state->slots = calloc((size_t)stage->slot_count, sizeof *state->slots);
    int status = -1;
    if (state->offsets.layers == NULL || state->slots == NULL) {
        pt_fail(err, "cuda backend: out of host memory");
    } else {
        map_offsets(stage, &state->offsets);
        status = allocate_parts(stage, state, err);
    }
    if (status != 0) {
        double allocated_gib = (double)state->device_bytes / PT_GIB;
        pt_error_prefix(err, "cuda backend: a stage of %zu parameters, "
                             "micro-batch %d, %d activation slots",
                        stage->param_count, stage->mbs_capacity,
                        stage->slot_count);
        cuda_release(stage);
        append_memory_report(err, allocated_gib);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------- product helpers */

/* out (N x OC, row-major) = in (N x IC) W^T [+ bias] [+ residual]. */
typedef struct linear_forward {
    const pt_bf16 *weight;          /* OC x IC, bf16 mirror */
    const pt_bf16 *input;           /* N x IC */
    void *out;                      /* N x OC */
    bool out_fp32;
    const void *bias;               /* of out's type */
    const float *residual;          /* fp32 out only; NULL: none */
    int N, IC, OC;
    int ld_out;
} linear_forward;

static gemm_call forward_call(const linear_forward *f)
{
    gemm_call call = {
        .transpose_a = true,
        .transpose_b = false,
        .m = f->OC,
        .n = f->N,
        .k = f->IC,
        .a = f->weight,
        .lda = f->IC,
        .b = f->input,
        .ldb = f->IC,
        .d = f->out,
        .ldd = f->ld_out,
        .d_fp32 = f->out_fp32,
        .c = f->residual,
        .alpha = 1.0f,
        .beta = f->residual != NULL ? 1.0f : 0.0f,
        .epilogue = f->bias != NULL ? GEMM_BIAS : GEMM_PLAIN,
        .bias = (void *)f->bias,
    };
    return call;
}

/* d_in (N x IC, bf16) = alpha d_out (N x OC) W. */
static gemm_call input_grad_call(pt_bf16 *d_in, const pt_bf16 *d_out,
                                 int ld_d_out, const pt_bf16 *weight, int N,
                                 int IC, int OC, float alpha)
{
    gemm_call call = {
        .transpose_a = false,
        .transpose_b = false,
        .m = IC,
        .n = N,
        .k = OC,
        .a = weight,
        .lda = IC,
        .b = d_out,
        .ldb = ld_d_out,
        .d = d_in,
        .ldd = IC,
        .d_fp32 = false,
        .alpha = alpha,
        .beta = 0.0f,
        .epilogue = GEMM_PLAIN,
    };
    return call;
}

/* d_W (OC x IC, fp32) += alpha d_out^T (OC x N) in (N x IC). */
static gemm_call weight_grad_call(float *d_weight, const pt_bf16 *input,
                                  const pt_bf16 *d_out, int ld_d_out, int N,
                                  int IC, int OC, float alpha)
{
    gemm_call call = {
        .transpose_a = false,
        .transpose_b = true,
        .m = IC,
        .n = OC,
        .k = N,
        .a = input,
        .lda = IC,
        .b = d_out,
        .ldb = ld_d_out,
        .d = d_weight,
        .ldd = IC,
        .d_fp32 = true,
        .alpha = alpha,
        .beta = 1.0f,
        .epilogue = GEMM_PLAIN,
    };
    return call;
}

/* The weight gradient of a linear layer, then its bias gradient (column
 * sums of d_out) by cuda_bias_grad. cuBLASLt's BGRADB epilogue is no
 * fusion on Hopper: it runs as a kernel of its own after the product, and
 * measured slower than ours (24 us against 9 us for 16384 x 768 on an
 * H100), so it is not used. */
static int weight_and_bias_grad(cuda_stage_state *state, const gemm_call *call,
                                float *d_bias, const stage_dims *d,
                                pt_error *err)
{
    if (gemm_run(state->gemm, call, state->stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_bias_grad(d_bias, call->b, state->scratch.bias_partials,
                            d->N, call->n, state->stream));
    return 0;
}

/* ------------------------------------------------ tensor-parallel sums */

/* Reduces `count` floats of device memory over the stage's tensor-parallel
 * group (sum or max). The comm is blocking and reads the buffer when it is
 * called, so the stage's stream is drained first; the kernels after the
 * call find the result in place. Nothing on an unsplit or compute-only
 * stage (which then does a shard's arithmetic without the sums). */
static int tp_reduce(const model_stage *stage, float *data, size_t count,
                     comm_reduce_op op, pt_error *err)
{
    if (stage_spec_tp(&stage->spec) == 1 || stage->tp_compute_only)
        return 0;
    CUDA_TRY(cudaStreamSynchronize(state_of(stage)->stream));
    if (op == COMM_MAX)
        return stage_tp_all_reduce_max(stage, data, count, err);
    return stage_tp_all_reduce_sum(stage, data, count, err);
}

/* -------------------------------------------------------------- forward */

static pt_bf16 *mirror_at(const cuda_stage_state *state, size_t offset)
{
    return state->mirror + mirror_offset(state, offset);
}

/* A row-parallel product into the fp32 stream: out = in W^T + bias +
 * residual. Unsplit, bias and residual ride in the epilogue. Split, each
 * shard holds some input features of W, so its product is partial: it
 * runs plain, the group sums it, and bias and residual are added once
 * after the sum. */
static int row_parallel_forward(model_stage *stage, linear_forward f,
                                const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (d->tp == 1) {
        gemm_call call = forward_call(&f);
        return gemm_run(state->gemm, &call, state->stream, err);
    }
    const float *bias = f.bias;
    const float *residual = f.residual;
    f.bias = NULL;
    f.residual = NULL;
    gemm_call call = forward_call(&f);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    float *out = f.out;
    if (tp_reduce(stage, out, (size_t)f.N * (size_t)f.OC, COMM_SUM, err) !=
        0)
        return -1;
    CUDA_TRY(cuda_add_broadcast_rows(out, bias, 1, residual, f.N, f.OC,
                                     state->stream));
    return 0;
}

/* One pre-norm transformer block:
 *   mid = x + proj(attention(qkv(ln1(x))));  out = mid + mlp(ln2(mid)).
 * The residual additions ride in the projections' epilogues (beta = 1
 * with the skip as C). */
/* Where layer l of the slot's micro-batch has its activations: its own,
 * or with full recompute the stage's one set, writing its output into the
 * slot's kept one. */
static layer_activations *layer_kept(model_stage *stage,
                                     activation_slot *slot, int l)
{
    cuda_stage_state *state = state_of(stage);
    if (!stage->spec.recompute_layers)
        return &slot->layers[l];
    state->recomputed.output = slot->layers[l].output;
    return &state->recomputed;
}

static int layer_forward(model_stage *stage, layer_activations *act,
                         const layer_offsets *o, const float *input,
                         const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    const float *P = stage->params;
    int N = d->N, C = d->C, A = d->A, F = d->F;

    pt_bf16 *ln1_out = act->ln1_out != NULL ? act->ln1_out : s->norm_out;
    CUDA_TRY(cuda_layernorm_forward(ln1_out, act->ln1_mean, act->ln1_rstd,
                                    input, P + o->ln1_weight, P + o->ln1_bias,
                                    N, C, stream));
    linear_forward qkv = {
        .weight = mirror_at(state, o->qkv_weight), .input = ln1_out,
        .out = act->qkv, .out_fp32 = false,
        .bias = mirror_at(state, o->qkv_bias),
        .N = N, .IC = C, .OC = 3 * A, .ld_out = 3 * A,
    };
    gemm_call call = forward_call(&qkv);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_attention_forward(act->att_out, act->att_lse, act->qkv,
                                    d->B, d->T, A, d->NH, stream));
    linear_forward proj = {
        .weight = mirror_at(state, o->attn_proj_weight),
        .input = act->att_out, .out = act->residual_mid, .out_fp32 = true,
        .bias = P + o->attn_proj_bias, .residual = input,
        .N = N, .IC = A, .OC = C, .ld_out = C,
    };
    if (row_parallel_forward(stage, proj, d, err) != 0)
        return -1;

    pt_bf16 *ln2_out = act->ln2_out != NULL ? act->ln2_out : s->norm_out;
    CUDA_TRY(cuda_layernorm_forward(ln2_out, act->ln2_mean, act->ln2_rstd,
                                    act->residual_mid, P + o->ln2_weight,
                                    P + o->ln2_bias, N, C, stream));
    pt_bf16 *gelu_out = act->gelu_out != NULL ? act->gelu_out : s->d_fc;
    linear_forward fc = {
        .weight = mirror_at(state, o->fc_weight), .input = ln2_out,
        .out = gelu_out, .out_fp32 = false,
        .bias = mirror_at(state, o->fc_bias),
        .N = N, .IC = C, .OC = F, .ld_out = F,
    };
    call = forward_call(&fc);
    call.epilogue = GEMM_GELU_AUX_BIAS;
    call.aux = act->fc_pre;
    call.ld_aux = F;
    if (state->fuse_epilogues && gemm_supported(state->gemm, &call)) {
        if (gemm_run(state->gemm, &call, stream, err) != 0)
            return -1;
    } else {
        /* bias in the product, GELU as its own pass */
        fc.out = act->fc_pre;
        call = forward_call(&fc);
        if (gemm_run(state->gemm, &call, stream, err) != 0)
            return -1;
        CUDA_TRY(cuda_gelu_forward(gelu_out, act->fc_pre, (size_t)N * F,
                                   stream));
    }
    linear_forward mlp_proj = {
        .weight = mirror_at(state, o->mlp_proj_weight), .input = gelu_out,
        .out = act->output, .out_fp32 = true,
        .bias = P + o->mlp_proj_bias, .residual = act->residual_mid,
        .N = N, .IC = F, .OC = C, .ld_out = C,
    };
    return row_parallel_forward(stage, mlp_proj, d, err);
}

/* Copies the micro-batch's tokens (and, for the embedding, the plan of
 * its gradient) to the slot with one transfer. */
static int upload_tokens(model_stage *stage, activation_slot *slot,
                         const uint32_t *tokens, const stage_dims *d,
                         pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    token_block *host = &state->host_tokens;
    int T = d->T;
    for (int b = 0; b < d->B; b++) {
        const uint32_t *window = tokens + (size_t)b * (T + 1);
        memcpy(host->inputs + (size_t)b * T, window, T * sizeof *window);
        memcpy(host->targets + (size_t)b * T, window + 1,
               T * sizeof *window);
    }
    slot->unique_tokens = 0;
    if (stage->spec.has_embedding) {
        embedding_plan plan = {
            .starts = host->plan_starts,
            .rows = host->plan_rows,
            .tokens = host->plan_tokens,
        };
        embedding_plan_build_range(&plan, host->inputs, d->N,
                                   d->vocab_first, d->V,
                                   state->token_counts);
        slot->unique_tokens = plan.unique_tokens;
    }
    /* host and device blocks share one layout: copy up to the plan's
     * end (the capacity's layout, so offsets match) */
    size_t bytes = (size_t)((char *)(host->plan_tokens + d->N) -
                            (char *)host->inputs);
    CUDA_TRY(cudaMemcpyAsync(slot->tokens.inputs, host->inputs, bytes,
                             cudaMemcpyHostToDevice, state->stream));
    return 0;
}

/* The vocab-parallel classifier over the shard's logits (cuda_ops.h): the
 * shard's row maxima and exponential sums, the group's maxima, the sums
 * rescaled to them, then sums and target logits summed side by side in
 * one reduction. The logits become softmax - onehot as on one GPU. */
static int vocab_parallel_loss(model_stage *stage, activation_slot *slot,
                               const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cudaStream_t stream = state->stream;
    size_t N = (size_t)d->N;
    float *shard_max = state->scratch.row_stats;
    float *group_max = shard_max + N, *sums = shard_max + 2 * N,
          *target_logit = shard_max + 3 * N;
    CUDA_TRY(cuda_vocab_parallel_partials(
        slot->logits, shard_max, sums, target_logit, slot->tokens.targets,
        d->vocab_first, d->N, d->V, state->ld_logits, stream));
    CUDA_TRY(cudaMemcpyAsync(group_max, shard_max, N * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream));
    if (tp_reduce(stage, group_max, N, COMM_MAX, err) != 0)
        return -1;
    CUDA_TRY(cuda_vocab_parallel_rescale(sums, shard_max, group_max, d->N,
                                         stream));
    if (tp_reduce(stage, sums, 2 * N, COMM_SUM, err) != 0)
        return -1;
    CUDA_TRY(cuda_vocab_parallel_finish(
        slot->logits, slot->losses, slot->tokens.targets, group_max, sums,
        target_logit, d->vocab_first, d->N, d->V, state->ld_logits, stream));
    return 0;
}

static int head_forward(model_stage *stage, activation_slot *slot,
                        const float *stream_in, const stage_dims *d,
                        float *mean_loss, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_offsets *o = &state->offsets;
    const float *P = stage->params;
    int N = d->N, C = d->C, V = d->V;
    CUDA_TRY(cuda_layernorm_forward(slot->final_out, slot->final_mean,
                                    slot->final_rstd, stream_in,
                                    P + o->final_norm_weight,
                                    P + o->final_norm_bias, N, C,
                                    state->stream));
    linear_forward head = {
        .weight = mirror_at(state, o->head_weight), .input = slot->final_out,
        .out = slot->logits, .out_fp32 = false,
        .N = N, .IC = C, .OC = state->ld_logits, .ld_out = state->ld_logits,
    };
    gemm_call call = forward_call(&head);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    if (d->tp == 1)
        CUDA_TRY(cuda_classifier_forward(slot->logits, slot->losses,
                                         slot->tokens.targets, N, V,
                                         state->ld_logits, state->stream));
    else if (vocab_parallel_loss(stage, slot, d, err) != 0)
        return -1;
    CUDA_TRY(cuda_mean(state->scratch.reduced, slot->losses, N,
                       state->stream));
    double loss = 0.0;
    CUDA_TRY(cudaMemcpyAsync(&loss, state->scratch.reduced, sizeof loss,
                             cudaMemcpyDeviceToHost, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    *mean_loss = (float)loss;
    return 0;
}

/* Token + position embedding into the slot's input. Vocab-parallel: each
 * shard looks up the tokens of its rows (zero for the others), the group
 * sums, then the positions are added. */
static int embedding_forward(model_stage *stage, activation_slot *slot,
                             const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_offsets *o = &state->offsets;
    const float *token = stage->params + o->token_embedding;
    const float *position = stage->params + o->position_embedding;
    if (d->tp == 1) {
        CUDA_TRY(cuda_embedding_forward(slot->input, slot->tokens.inputs,
                                        token, position, d->B, d->T, d->C,
                                        state->stream));
        return 0;
    }
    CUDA_TRY(cuda_embedding_shard_forward(slot->input, slot->tokens.inputs,
                                          token, d->vocab_first, d->V, d->N,
                                          d->C, state->stream));
    if (tp_reduce(stage, slot->input, (size_t)d->N * d->C, COMM_SUM, err) !=
        0)
        return -1;
    CUDA_TRY(cuda_add_broadcast_rows(slot->input, position, d->T, NULL,
                                     d->N, d->C, state->stream));
    return 0;
}

static int cuda_forward(model_stage *stage, int slot_index,
                        const stage_io *io, float *mean_loss, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    activation_slot *slot = &state->slots[slot_index];
    stage_dims d = dims_of(stage, io->mbs);
    slot->awaiting_backward = false;
    if (io->tokens != NULL &&
        upload_tokens(stage, slot, io->tokens, &d, err) != 0)
        return -1;
    size_t NC = (size_t)d.N * d.C;
    if (stage->spec.has_embedding) {
        if (embedding_forward(stage, slot, &d, err) != 0)
            return -1;
    } else if (io->input != slot->input) {
        CUDA_TRY(cudaMemcpyAsync(slot->input, io->input, NC * sizeof(float),
                                 cudaMemcpyDeviceToDevice, state->stream));
    }
    const float *stream_in = slot->input;
    for (int l = 0; l < state->layer_count; l++) {
        if (layer_forward(stage, layer_kept(stage, slot, l),
                          &state->offsets.layers[l], stream_in, &d,
                          err) != 0)
            return -1;
        stream_in = slot->layers[l].output;
    }
    slot->output = stream_in;
    *mean_loss = 0.0f;
    if (stage->spec.has_head) {
        if (head_forward(stage, slot, stream_in, &d, mean_loss, err) != 0)
            return -1;
    } else {
        CUDA_TRY(cudaStreamSynchronize(state->stream));
    }
    slot->mbs = io->mbs;
    slot->awaiting_backward = true;
    return 0;
}

/* ------------------------------------------------------------- backward */

/* The input gradient of a column-parallel layer (QKV, fc, LM head):
 * call writes d_in (bf16, N x C). Split, each shard saw some output
 * features, so its result is partial: the product writes fp32 into
 * scratch.d_partial, the group sums it there and one pass rounds it to
 * bf16 for the layer-norm backward, so the sum itself loses nothing. */
static int column_parallel_input_grad(model_stage *stage, gemm_call call,
                                      const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (d->tp == 1)
        return gemm_run(state->gemm, &call, state->stream, err);
    pt_bf16 *d_in = call.d;
    float *partial = state->scratch.d_partial;
    size_t count = (size_t)d->N * (size_t)d->C;
    call.d = partial;
    call.d_fp32 = true;
    if (gemm_run(state->gemm, &call, state->stream, err) != 0 ||
        tp_reduce(stage, partial, count, COMM_SUM, err) != 0)
        return -1;
    CUDA_TRY(cuda_convert_to_bf16(d_in, partial, count, state->stream));
    return 0;
}

/* The block's backward in reverse order of its forward. d_out (fp32) and
 * its bf16 copy in scratch.d_stream_bf16 are the gradient of the block's
 * output; d_input (fp32) and scratch.d_stream_bf16 receive the gradient
 * of its input. d_out may be caller memory: it is only read. */
static int layer_backward(model_stage *stage, float *d_input,
                          const float *d_out, const layer_offsets *o,
                          const layer_activations *act, const float *input,
                          const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    const float *P = stage->params;
    float *G = stage->grads;
    int N = d->N, C = d->C, A = d->A, F = d->F;
    /* the fc bias gradient, when the DGELU_BGRAD epilogue makes it */
    float *bias_fc = s->bias_grads;
    bool fc_bias_pending = false;

    /* out = mid + mlp_proj(gelu(fc(ln2(mid)))) */
    const pt_bf16 *gelu_out = act->gelu_out;
    if (gelu_out == NULL) {
        CUDA_TRY(cuda_gelu_forward(s->d_fc, act->fc_pre, (size_t)N * F,
                                   stream));
        gelu_out = s->d_fc;
    }
    gemm_call call = weight_grad_call(G + o->mlp_proj_weight, gelu_out,
                                      s->d_stream_bf16, C, N, F, C, 1.0f);
    if (weight_and_bias_grad(state, &call, G + o->mlp_proj_bias, d, err) != 0)
        return -1;
    call = input_grad_call(s->d_fc, s->d_stream_bf16, C,
                           mirror_at(state, o->mlp_proj_weight), N, F, C,
                           1.0f);
    call.epilogue = GEMM_DGELU_BGRAD;
    call.aux = act->fc_pre;
    call.ld_aux = F;
    call.bias = bias_fc;
    bool dgelu_done = false;
    if (state->fuse_epilogues && gemm_supported(state->gemm, &call)) {
        if (gemm_run(state->gemm, &call, stream, err) != 0)
            return -1;
        fc_bias_pending = true;
        dgelu_done = true;
    } else if (state->fuse_epilogues) {
        /* the GELU gradient alone in the epilogue, the bias by a kernel */
        call.epilogue = GEMM_DGELU;
        call.bias = NULL;
        if (gemm_supported(state->gemm, &call)) {
            if (gemm_run(state->gemm, &call, stream, err) != 0)
                return -1;
            CUDA_TRY(cuda_bias_grad(G + o->fc_bias, s->d_fc,
                                    s->bias_partials, N, F, stream));
            dgelu_done = true;
        }
    }
    if (!dgelu_done) {
        call.epilogue = GEMM_PLAIN;
        call.aux = NULL;
        call.bias = NULL;
        if (gemm_run(state->gemm, &call, stream, err) != 0)
            return -1;
        CUDA_TRY(cuda_gelu_backward(s->d_fc, s->d_fc, act->fc_pre,
                                    (size_t)N * F, stream));
        CUDA_TRY(cuda_bias_grad(G + o->fc_bias, s->d_fc, s->bias_partials, N,
                                F, stream));
    }
    const pt_bf16 *ln2_out = act->ln2_out;
    if (ln2_out == NULL) {
        CUDA_TRY(cuda_layernorm_forward(s->norm_out, NULL, NULL,
                                        act->residual_mid, P + o->ln2_weight,
                                        P + o->ln2_bias, N, C, stream));
        ln2_out = s->norm_out;
    }
    call = weight_grad_call(G + o->fc_weight, ln2_out, s->d_fc, F, N, C, F,
                            1.0f);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    call = input_grad_call(s->d_norm, s->d_fc, F,
                           mirror_at(state, o->fc_weight), N, C, F, 1.0f);
    if (column_parallel_input_grad(stage, call, d, err) != 0)
        return -1;
    /* d_mid = d_out + ln2's term, into d_input (and its bf16 copy) */
    CUDA_TRY(cuda_layernorm_backward(
        d_input, s->d_stream_bf16, G + o->ln2_weight, G + o->ln2_bias, d_out,
        s->d_norm, act->residual_mid, P + o->ln2_weight, act->ln2_mean,
        act->ln2_rstd, s->norm_partials, N, C, stream));

    /* mid = input + attn_proj(attention(qkv(ln1(input)))) */
    call = weight_grad_call(G + o->attn_proj_weight, act->att_out,
                            s->d_stream_bf16, C, N, A, C, 1.0f);
    if (weight_and_bias_grad(state, &call, G + o->attn_proj_bias, d, err) !=
        0)
        return -1;
    call = input_grad_call(s->d_att, s->d_stream_bf16, C,
                           mirror_at(state, o->attn_proj_weight), N, A, C,
                           1.0f);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_attention_backward(s->d_qkv, s->d_att, act->qkv,
                                     act->att_out, act->att_lse,
                                     s->attention, d->B, d->T, A, d->NH,
                                     stream));
    const pt_bf16 *ln1_out = act->ln1_out;
    if (ln1_out == NULL) {
        CUDA_TRY(cuda_layernorm_forward(s->norm_out, NULL, NULL, input,
                                        P + o->ln1_weight, P + o->ln1_bias,
                                        N, C, stream));
        ln1_out = s->norm_out;
    }
    call = weight_grad_call(G + o->qkv_weight, ln1_out, s->d_qkv, 3 * A, N,
                            C, 3 * A, 1.0f);
    if (weight_and_bias_grad(state, &call, G + o->qkv_bias, d, err) != 0)
        return -1;
    call = input_grad_call(s->d_norm, s->d_qkv, 3 * A,
                           mirror_at(state, o->qkv_weight), N, C, 3 * A,
                           1.0f);
    if (column_parallel_input_grad(stage, call, d, err) != 0)
        return -1;
    CUDA_TRY(cuda_layernorm_backward(
        d_input, s->d_stream_bf16, G + o->ln1_weight, G + o->ln1_bias,
        d_input, s->d_norm, input, P + o->ln1_weight, act->ln1_mean,
        act->ln1_rstd, s->norm_partials, N, C, stream));
    if (fc_bias_pending)
        CUDA_TRY(cuda_add_inplace(G + o->fc_bias, bias_fc, (size_t)F, stream));
    return 0;
}

/* Loss -> logits -> final norm: leaves d loss / d (last stream) in
 * d_stream (fp32) and scratch.d_stream_bf16. The loss is loss_scale x
 * the mean over N positions; the logits' buffer holds softmax - onehot,
 * so the products take alpha = loss_scale / N. */
static int head_backward(model_stage *stage, activation_slot *slot,
                         float loss_scale, float *d_stream,
                         const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    const stage_offsets *o = &state->offsets;
    int N = d->N, C = d->C, Vp = state->ld_logits;
    float alpha = loss_scale / (float)N;
    gemm_call call = input_grad_call(s->d_norm, slot->logits,
                                     state->ld_logits,
                                     mirror_at(state, o->head_weight), N, C,
                                     Vp, alpha);
    if (column_parallel_input_grad(stage, call, d, err) != 0)
        return -1;
    call = weight_grad_call(stage->grads + o->head_weight, slot->final_out,
                            slot->logits, state->ld_logits, N, C, Vp, alpha);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_layernorm_backward(
        d_stream, s->d_stream_bf16, stage->grads + o->final_norm_weight,
        stage->grads + o->final_norm_bias, NULL, s->d_norm, slot->output,
        stage->params + o->final_norm_weight, slot->final_mean,
        slot->final_rstd, s->norm_partials, N, C, state->stream));
    return 0;
}

static int cuda_backward(model_stage *stage, int slot_index,
                         const stage_io *io, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    activation_slot *slot = &state->slots[slot_index];
    if (!slot->awaiting_backward || slot->mbs != io->mbs)
        return pt_fail(err, "cuda backend: backward of slot %d without a "
                            "forward of %d sequences before it",
                       slot_index, io->mbs);
    backward_scratch *s = &state->scratch;
    stage_dims d = dims_of(stage, io->mbs);
    size_t NC = (size_t)d.N * d.C;
    const float *d_out = io->output_grad;
    int free_stream = 0;
    if (stage->spec.has_head) {
        if (head_backward(stage, slot, io->loss_scale, s->d_stream[0], &d,
                          err) != 0)
            return -1;
        d_out = s->d_stream[0];
        free_stream = 1;
    } else if (state->layer_count > 0) {
        CUDA_TRY(cuda_convert_to_bf16(s->d_stream_bf16, d_out, NC,
                                      state->stream));
    }
    for (int l = state->layer_count - 1; l >= 0; l--) {
        const float *layer_input =
            l > 0 ? slot->layers[l - 1].output : slot->input;
        float *d_input = s->d_stream[free_stream];
        layer_activations *act = layer_kept(stage, slot, l);
        /* full recompute: the layer's forward again from its kept input
         * (rewriting its output with the same values) */
        if (stage->spec.recompute_layers &&
            layer_forward(stage, act, &state->offsets.layers[l], layer_input,
                          &d, err) != 0)
            return -1;
        if (layer_backward(stage, d_input, d_out, &state->offsets.layers[l],
                           act, layer_input, &d, err) != 0)
            return -1;
        d_out = d_input;
        free_stream = 1 - free_stream;
    }
    if (stage->spec.has_embedding) {
        const stage_offsets *o = &state->offsets;
        const token_block *t = &slot->tokens;
        CUDA_TRY(cuda_embedding_backward(
            stage->grads + o->token_embedding,
            stage->grads + o->position_embedding, d_out, t->plan_starts,
            t->plan_rows, t->plan_tokens, slot->unique_tokens, d.B, d.T, d.C,
            state->stream));
        s->input_grad = NULL;
    } else {
        /* a stage with no layers and no head passes the gradient through;
         * copy it so the result does not point into the caller's memory */
        if (d_out != s->d_stream[0] && d_out != s->d_stream[1]) {
            CUDA_TRY(cudaMemcpyAsync(s->d_stream[0], d_out,
                                     NC * sizeof(float),
                                     cudaMemcpyDeviceToDevice,
                                     state->stream));
            d_out = s->d_stream[0];
        }
        s->input_grad = d_out;
    }
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    slot->awaiting_backward = false;
    return 0;
}

/* ----------------------------------------------- buffers and optimizer */

static int cuda_copy_to_host(const model_stage *stage, stage_buffer which,
                             float *host, pt_error *err)
{
    const cuda_stage_state *state = state_of(stage);
    const float *buffer = model_stage_buffer(stage, which);
    if (buffer == NULL)
        return pt_fail(err, "cuda backend: unknown buffer %d", (int)which);
    CUDA_TRY(cudaSetDevice(state->device));
    size_t bytes = model_stage_buffer_count(stage, which) * sizeof(float);
    CUDA_TRY(cudaMemcpyAsync(host, buffer, bytes, cudaMemcpyDeviceToHost,
                             state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static int cuda_copy_from_host(model_stage *stage, stage_buffer which,
                               const float *host, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    float *buffer = model_stage_buffer(stage, which);
    if (buffer == NULL)
        return pt_fail(err, "cuda backend: unknown buffer %d", (int)which);
    CUDA_TRY(cudaSetDevice(state->device));
    size_t bytes = model_stage_buffer_count(stage, which) * sizeof(float);
    CUDA_TRY(cudaMemcpyAsync(buffer, host, bytes, cudaMemcpyHostToDevice,
                             state->stream));
    if (which == STAGE_PARAMS)
        CUDA_TRY(cuda_refresh_mirror(state->mirror, stage->params,
                                     state->all_chunks.chunks,
                                     state->all_chunks.count, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static int cuda_zero_grads(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cudaMemsetAsync(stage->grads, 0,
                             stage->param_count * sizeof(float),
                             state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static int cuda_grad_square_sum(const model_stage *stage, double *out,
                                pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cuda_square_sum(s->reduced,
                             stage->grads + stage->optimizer_first,
                             stage->optimizer_count, s->square_partials,
                             state->stream));
    CUDA_TRY(cudaMemcpyAsync(out, s->reduced, sizeof *out,
                             cudaMemcpyDeviceToHost, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static int cuda_grad_square_sums(const model_stage *stage,
                                 double *per_tensor, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    if (stage->tensor_count == 0)
        return 0;
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cuda_square_sums_per_tensor(
        s->tensor_squares, stage->grads, state->optimizer_chunks.chunks,
        state->optimizer_chunks.count, state->optimizer_chunks.tensor_starts,
        stage->tensor_count, s->chunk_squares, state->stream));
    CUDA_TRY(cudaMemcpyAsync(per_tensor, s->tensor_squares,
                             (size_t)stage->tensor_count * sizeof(double),
                             cudaMemcpyDeviceToHost, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static int cuda_adamw_step(model_stage *stage, const adamw_config *config,
                           float learning_rate, float grad_scale,
                           pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    double step = (double)stage->optimizer_steps;
    adamw_args args = {
        .learning_rate = learning_rate,
        .beta1 = config->beta1,
        .beta2 = config->beta2,
        .eps = config->eps,
        .weight_decay = config->weight_decay,
        .grad_scale = grad_scale,
        .first_correction = (float)(1.0 - pow(config->beta1, step)),
        .second_correction = (float)(1.0 - pow(config->beta2, step)),
    };
    CUDA_TRY(cuda_adamw(stage->params, stage->grads, stage->adam_m,
                        stage->adam_v, state->mirror,
                        state->optimizer_chunks.chunks,
                        state->optimizer_chunks.count, &args, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

/* After the all-gather brought the other shards' parameters: their bf16
 * copies (the own shard's are fresh from AdamW, refreshed again for
 * simplicity: one read of the parameters). */
static int cuda_params_changed(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cuda_refresh_mirror(state->mirror, stage->params,
                                 state->all_chunks.chunks,
                                 state->all_chunks.count, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static float *cuda_input_buffer(model_stage *stage, int slot)
{
    return state_of(stage)->slots[slot].input;
}

static const float *cuda_output(const model_stage *stage, int slot)
{
    return state_of(stage)->slots[slot].output;
}

static const float *cuda_input_grad(const model_stage *stage)
{
    return state_of(stage)->scratch.input_grad;
}

static float *cuda_output_grad_buffer(model_stage *stage)
{
    return state_of(stage)->scratch.output_grad;
}

static const stage_backend cuda_backend_table = {
    .kind = BACKEND_CUDA,
    .name = "cuda",
    .allocate = cuda_allocate,
    .release = cuda_release,
    .forward = cuda_forward,
    .backward = cuda_backward,
    .zero_grads = cuda_zero_grads,
    .grad_square_sum = cuda_grad_square_sum,
    .grad_square_sums = cuda_grad_square_sums,
    .adamw_step = cuda_adamw_step,
    .params_changed = cuda_params_changed,
    .copy_to_host = cuda_copy_to_host,
    .copy_from_host = cuda_copy_from_host,
    .input_buffer = cuda_input_buffer,
    .output = cuda_output,
    .input_grad = cuda_input_grad,
    .output_grad_buffer = cuda_output_grad_buffer,
};

const stage_backend *cuda_stage_backend(void)
{
    return &cuda_backend_table;
}

/* ------------------------------------------------------------- helpers */

size_t cuda_stage_device_bytes(const model_stage *stage)
{
    const cuda_stage_state *state = state_of(stage);
    return state != NULL ? state->device_bytes : 0;
}

cudaStream_t cuda_stage_stream(const model_stage *stage)
{
    const cuda_stage_state *state = stage->backend_state;
    return state != NULL ? state->stream : NULL;
}
