/*
 * The cuda backend's memory plan (buffers.h): the carving of its arenas,
 * the sizes of its parameter-sized buffers and chunk tables, the scratch
 * its kernels ask for, and the tally of all of it by term. model_cuda.c
 * allocates through these; cuda_stage_memory_plan runs them over no
 * memory. No CUDA here, so builds without it have the plan too.
 */
#include "executor/cuda/buffers.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------ the kernels' scratch */

/* Partial rows of the backward's kernels: the generic one's blocks of 32
 * rows (rows wider than 8192, or not in 8-channel vectors), the team
 * kernel's about one wave of blocks of 8 rows or more, at most 256
 * (one_wave_rows_per_block, layernorm_backward.cu). */
static size_t layernorm_blocks(int N)
{
    size_t fused = ((size_t)N + CUDA_LAYERNORM_BACKWARD_ROWS - 1) /
                   CUDA_LAYERNORM_BACKWARD_ROWS;
    size_t rows = ((size_t)N + CUDA_LAYERNORM_ROW_KERNEL_MIN_ROWS - 1) /
                  CUDA_LAYERNORM_ROW_KERNEL_MIN_ROWS;
    if (rows > CUDA_LAYERNORM_ROW_KERNEL_MAX_BLOCKS)
        rows = CUDA_LAYERNORM_ROW_KERNEL_MAX_BLOCKS;
    return fused > rows ? fused : rows;
}

static size_t layernorm_groups(int N)
{
    return (layernorm_blocks(N) + CUDA_LAYERNORM_GROUP_BLOCKS - 1) /
           CUDA_LAYERNORM_GROUP_BLOCKS;
}

/* The counters come first, so a call of fewer rows finds them zeroed too;
 * one per group and one for the groups' sum. */
size_t cuda_layernorm_counter_floats(int N)
{
    size_t alignment = CUDA_LAYERNORM_COUNTER_ALIGNMENT;
    return (layernorm_groups(N) + 1 + alignment - 1) / alignment * alignment;
}

size_t cuda_layernorm_backward_scratch(int N, int C)
{
    return cuda_layernorm_counter_floats(N) +
           (layernorm_blocks(N) + layernorm_groups(N)) * 2 * (size_t)C;
}

size_t cuda_bias_grad_scratch(int N, int OC)
{
    size_t chunks = ((size_t)N + CUDA_BIAS_GRAD_ROWS - 1) /
                    CUDA_BIAS_GRAD_ROWS;
    return chunks * (size_t)OC;
}

size_t cuda_attention_backward_scratch(int B, int T, int NH)
{
    return (size_t)B * NH * T;
}

bool cuda_cudnn_attention_shape(int T, int C, int NH)
{
    if (NH < 1 || C % NH != 0)
        return false;
    int D = C / NH;
    return D % 8 == 0 && D <= 128 && T % 128 == 0;
}

static size_t round_up_256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

size_t cuda_cudnn_backward_workspace_bytes(int B, int T, int NH, int KVH,
                                           int D, bool deterministic)
{
    size_t rows = (size_t)B * (size_t)NH * (size_t)T;
    size_t per_head = round_up_256(rows * (size_t)D * sizeof(float));
    size_t products = deterministic
                          ? round_up_256(rows * (size_t)T * sizeof(pt_bf16))
                          : per_head;
    return round_up_256(rows * sizeof(float)) + products +
           (KVH < NH ? per_head : 0);
}

int cuda_cudnn_backward_split(int B, int T, int NH, int KVH, int D,
                              bool deterministic, size_t lendable)
{
    for (int pieces = 1; pieces <= B; pieces++)
        if (B % pieces == 0 &&
            cuda_cudnn_backward_workspace_bytes(B / pieces, T, NH, KVH, D,
                                                deterministic) <= lendable)
            return pieces;
    return 0;
}

/* Bytes of a slot's whole logits (N x Vp bf16; 0 without a head). */
static size_t whole_logits_bytes(const buffer_layout *layout)
{
    return layout->spec.has_head ? (size_t)layout->dims.N *
                                       (size_t)layout->ld_logits *
                                       sizeof(pt_bf16)
                                 : 0;
}

size_t buffer_logits_lendable_bytes(const buffer_layout *layout)
{
    if (layout->head_rows == 0)
        return whole_logits_bytes(layout);
    return layout->head_shared_offset > 0 ? layout->head_shared_offset
                                          : layout->head_chunk_bytes;
}

/* Whether the stage's layers run cuDNN's attention (the plan assumes a
 * build with cuDNN). */
static bool cudnn_layers(const buffer_layout *layout)
{
    const stage_dims *d = &layout->dims;
    return layout->layer_count > 0 &&
           cuda_cudnn_attention_shape(d->T, d->A, d->NH);
}

size_t buffer_attention_workspace_bytes(const buffer_layout *layout)
{
    const stage_dims *d = &layout->dims;
    if (!cudnn_layers(layout) || layout->attention_split > 0)
        return 0;
    return cuda_cudnn_backward_workspace_bytes(d->B, d->T, d->NH, d->KVH,
                                               d->hs,
                                               layout->spec.deterministic);
}

size_t cuda_square_sum_scratch(void)
{
    return CUDA_SQUARE_SUM_BLOCKS;
}

/* ---------------------------------------------------------------- arena */

void *arena_take(arena *a, size_t bytes, pt_memory_term term)
{
    a->used = (a->used + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT *
              ARENA_ALIGNMENT;
    void *piece = a->base != NULL ? a->base + a->used : NULL;
    a->used += bytes;
    a->term_bytes[term] += (double)bytes;
    return piece;
}

static float *take_floats(arena *a, size_t count, pt_memory_term term)
{
    return arena_take(a, count * sizeof(float), term);
}

static pt_bf16 *take_bf16(arena *a, size_t count, pt_memory_term term)
{
    return arena_take(a, count * sizeof(pt_bf16), term);
}

size_t arena_request_bytes(const arena *a)
{
    return a->used + 1;
}

/* ------------------------------------------------------------- carving */

void buffer_carve_tokens(token_block *block, arena *a, size_t N)
{
    pt_memory_term term = PT_MEMORY_ACTIVATIONS;
    block->inputs = arena_take(a, N * sizeof(uint32_t), term);
    block->targets = arena_take(a, N * sizeof(uint32_t), term);
    block->plan_starts = arena_take(a, (N + 1) * sizeof(int), term);
    block->plan_rows = arena_take(a, N * sizeof(int), term);
    block->plan_tokens = arena_take(a, N * sizeof(uint32_t), term);
}

/* Everything a layer's backward reads but its output (the selective
 * recompute options leave out the norms' or the GELU's outputs). */
static void carve_layer(layer_activations *act, arena *a,
                        const buffer_layout *layout, pt_memory_term term)
{
    const stage_dims *d = &layout->dims;
    size_t N = (size_t)d->N, C = (size_t)d->C, A = (size_t)d->A,
           F = (size_t)d->F, R = (size_t)d->R;
    /* the norms and the residual stream: the shard's rows (RMSNorm keeps
     * no mean) */
    act->ln1_mean = d->rmsnorm ? NULL : take_floats(a, R, term);
    act->ln1_rstd = take_floats(a, R, term);
    act->ln1_out = layout->recompute_norm ? NULL : take_bf16(a, R * C, term);
    act->qkv = take_bf16(a, N * (size_t)d->QW, term);
    act->att_out = take_bf16(a, N * A, term);
    act->att_lse = take_floats(a, (size_t)d->B * d->NH * d->T, term);
    act->residual_mid = take_bf16(a, R * C, term);
    act->ln2_mean = d->rmsnorm ? NULL : take_floats(a, R, term);
    act->ln2_rstd = take_floats(a, R, term);
    act->ln2_out = layout->recompute_norm ? NULL : take_bf16(a, R * C, term);
    act->fc_pre = take_bf16(a, N * (size_t)d->FW, term);
    act->gelu_out = layout->recompute_gelu ? NULL
                                           : take_bf16(a, N * F, term);
}

void buffer_carve_slot(activation_slot *slot, arena *a,
                       const buffer_layout *layout)
{
    const stage_dims *d = &layout->dims;
    size_t N = (size_t)d->N, C = (size_t)d->C, R = (size_t)d->R;
    buffer_carve_tokens(&slot->tokens, a, N);
    slot->input = take_bf16(a, R * C, PT_MEMORY_ACTIVATIONS);
    /* the stream is bf16, the pipeline's messages fp32 */
    slot->received = layout->spec.has_embedding
                         ? NULL
                         : take_floats(a, R * C, PT_MEMORY_ACTIVATIONS);
    slot->output = layout->spec.has_head
                       ? NULL
                       : take_floats(a, R * C, PT_MEMORY_ACTIVATIONS);
    for (int l = 0; l < layout->layer_count; l++) {
        layer_activations *act = &slot->layers[l];
        if (!layout->spec.recompute_layers)
            carve_layer(act, a, layout, PT_MEMORY_ACTIVATIONS);
        act->output = take_bf16(a, R * C, PT_MEMORY_ACTIVATIONS);
    }
    if (layout->spec.has_head) {
        pt_memory_term term = PT_MEMORY_LOGITS;
        slot->final_out = take_bf16(a, N * C, term);
        slot->final_mean = take_floats(a, N, term);
        slot->final_rstd = take_floats(a, N, term);
        slot->logits = layout->head_rows > 0
                           ? NULL
                           : take_bf16(a, N * (size_t)layout->ld_logits,
                                       term);
        slot->losses = take_floats(a, N, term);
    }
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* Whether the fused head's chunk also holds the MLP's fc gradient
 * (N x F bf16): it does where it is that large (buffer_carve_scratch). */
static bool fc_gradient_in_head(const buffer_layout *layout)
{
    return layout->head_rows > 0 &&
           layout->head_chunk_bytes >= (size_t)layout->dims.N *
                                           (size_t)layout->dims.F *
                                           sizeof(pt_bf16);
}

/* buffer_head_shared_bytes' buffers, in its order, the fp32 input
 * gradient with_fp32. */
static void carve_head_shared(backward_scratch *s, arena *a,
                              const buffer_layout *layout, bool with_fp32,
                              pt_memory_term term)
{
    const stage_dims *d = &layout->dims;
    size_t N = (size_t)d->N, C = (size_t)d->C;
    if (with_fp32)
        s->d_stream_fp32 = take_floats(a, N * C, term);
    s->d_stream_bf16 = take_bf16(a, N * C, term);
    s->d_norm = take_bf16(a, N * C, term);
    s->d_att = take_bf16(a, N * (size_t)d->A, term);
    s->d_qkv = take_bf16(a, N * (size_t)d->QW, term);
}

size_t buffer_head_shared_bytes(const buffer_layout *layout)
{
    backward_scratch s;
    arena a = {0};
    carve_head_shared(&s, &a, layout, layout->spec.has_embedding,
                      PT_MEMORY_SCRATCH);
    return round_up_256(a.used);
}

void buffer_carve_scratch(backward_scratch *s,
                          layer_activations *recomputed, arena *a,
                          const buffer_layout *layout)
{
    const stage_dims *d = &layout->dims;
    pt_memory_term term = PT_MEMORY_SCRATCH;
    size_t N = (size_t)d->N, C = (size_t)d->C, F = (size_t)d->F,
           QW = (size_t)d->QW, FW = (size_t)d->FW;
    if (layout->spec.recompute_layers && layout->layer_count > 0)
        carve_layer(recomputed, a, layout, term);
    /* buffer_head_shared_bytes' buffers, here or in the head's chunk
     * (carved after it, below) */
    bool shared = layout->head_shared_offset > 0;
    if (!shared || !layout->spec.has_embedding)
        s->d_stream_fp32 = take_floats(a, N * C, term);
    if (!shared)
        carve_head_shared(s, a, layout, false, term);
    /* the fc gradient in the fused head's chunk when it holds it: the
     * head's forward uses the chunk after every layer's forward, the
     * attention's backward after the MLP's in each layer's backward,
     * where d_fc is dead */
    bool fc_in_head = fc_gradient_in_head(layout);
    s->d_fc = fc_in_head ? NULL : take_bf16(a, N * F, term);
    /* the norm outputs made again, or gathered from the shards */
    s->norm_out = layout->recompute_norm || d->sp ? take_bf16(a, N * C, term)
                                                  : NULL;
    s->norm_partials =
        take_floats(a, cuda_layernorm_backward_scratch(d->N, d->C), term);
    size_t widest = max_size(max_size(QW, FW), C);
    s->bias_partials =
        take_floats(a, cuda_bias_grad_scratch(d->N, (int)widest), term);
    s->bias_grads = take_floats(a, F, term);
    s->attention = take_floats(
        a, cuda_attention_backward_scratch(d->B, d->T, d->NH), term);
    s->square_partials =
        arena_take(a, cuda_square_sum_scratch() * sizeof(double), term);
    s->reduced = arena_take(a, sizeof(double), term);
    s->step = arena_take(a, sizeof(cuda_step_values), term);
    s->tensor_squares =
        arena_take(a, (size_t)layout->tensor_count * sizeof(double), term);
    s->chunk_squares =
        arena_take(a, (size_t)layout->chunk_count * sizeof(double), term);
    s->d_partial = d->tp > 1 ? take_floats(a, N * C, term) : NULL;
    s->row_stats = d->tp > 1 && layout->spec.has_head
                       ? take_floats(a, 4 * N, term)
                       : NULL;
    s->norm_grads = d->sp ? take_floats(a, 4 * C, term) : NULL;
    s->output_grad =
        layout->spec.has_head ? NULL : take_floats(a, N * C, term);
    s->head_logits = layout->head_rows > 0
                         ? arena_take(a, layout->head_chunk_bytes,
                                      PT_MEMORY_LOGITS)
                         : NULL;
    if (fc_in_head)
        s->d_fc = s->head_logits;
    if (shared) {
        /* over the chunk's bytes, counted once, as the chunk's */
        arena chunk = {
            .base = s->head_logits != NULL
                        ? (char *)s->head_logits + layout->head_shared_offset
                        : NULL,
        };
        carve_head_shared(s, &chunk, layout, layout->spec.has_embedding,
                          term);
    }
}

/* -------------------------------------------------- parameter buffers */

void buffer_tensor_part(const param_tensor *t, size_t first, size_t end,
                        size_t *lo, size_t *hi)
{
    *lo = t->offset > first ? t->offset : first;
    *hi = t->offset + t->count < end ? t->offset + t->count : end;
}

int buffer_chunks_in_range(const param_tensor *tensors, int tensor_count,
                           size_t first, size_t end)
{
    int chunks = 0;
    for (int i = 0; i < tensor_count; i++) {
        size_t lo = 0, hi = 0;
        buffer_tensor_part(&tensors[i], first, end, &lo, &hi);
        if (hi > lo)
            chunks += (int)((hi - lo + PARAM_CHUNK_ELEMENTS - 1) /
                            PARAM_CHUNK_ELEMENTS);
    }
    return chunks;
}

size_t buffer_chunk_table_bytes(int chunks, int tensor_count)
{
    return (size_t)chunks * sizeof(param_chunk) +
           ((size_t)tensor_count + 1) * sizeof(int);
}

size_t buffer_parameter_bytes(const buffer_layout *layout,
                              stage_buffer which)
{
    /* the gradients' slack: see the head products in model_cuda.c (the
     * unit block's under ZeRO-2/3) */
    size_t slack =
        which == STAGE_GRADS && !layout->grads_by_unit ? layout->head_pad
                                                        : 0;
    bool moments = which == STAGE_ADAM_M || which == STAGE_ADAM_V;
    /* offload keeps the moments in host memory (stage/offload.c) */
    size_t floats = moments ? (layout->spec.offload_optimizer
                                   ? 0
                                   : layout->optimizer_count)
                    : which == STAGE_GRADS ? layout->grad_count
                                           : layout->params_count;
    /* llm.c's recipe keeps the gradients in bf16 */
    size_t element = which == STAGE_GRADS && layout->spec.bf16_grads
                         ? sizeof(pt_bf16)
                         : sizeof(float);
    return (floats + slack + 1) * element;
}

size_t buffer_mirror_bytes(const buffer_layout *layout)
{
    /* ZeRO-3: the units' bf16 block instead */
    if (layout->params_by_unit)
        return buffer_param_mirror_bytes(layout);
    return (layout->param_count + layout->head_pad + 1) * sizeof(pt_bf16);
}

pt_memory_term buffer_parameter_term(stage_buffer which)
{
    switch (which) {
    case STAGE_PARAMS:
        return PT_MEMORY_WEIGHTS;
    case STAGE_GRADS:
        return PT_MEMORY_GRADIENTS;
    default:
        return PT_MEMORY_OPTIMIZER;
    }
}

/* ---------------------------------------------------------------- tally */

static size_t granted_bytes(size_t requested)
{
    return (requested + CUDA_ALLOCATION_GRANULE - 1) /
           CUDA_ALLOCATION_GRANULE * CUDA_ALLOCATION_GRANULE;
}

void buffer_tally(pt_memory_terms *tally, pt_memory_term term,
                  size_t requested)
{
    tally->bytes[term] += (double)requested;
    tally->bytes[PT_MEMORY_ROUNDING] +=
        (double)(granted_bytes(requested) - requested);
}

void buffer_tally_arena(pt_memory_terms *tally, const arena *a)
{
    double pieces = 0.0;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++) {
        tally->bytes[t] += a->term_bytes[t];
        pieces += a->term_bytes[t];
    }
    tally->bytes[PT_MEMORY_ROUNDING] +=
        (double)granted_bytes(arena_request_bytes(a)) - pieces;
}

/* ---------------------------------------------------------------- plan */

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

static int read_recompute(const char *recompute, buffer_layout *out,
                          pt_error *err)
{
    if (recompute == NULL)
        recompute = "gelu";
    bool all = list_has(recompute, "all");
    out->recompute_gelu = all || list_has(recompute, "gelu");
    out->recompute_norm = all || list_has(recompute, "norm");
    if (!all && !out->recompute_gelu && !out->recompute_norm &&
        !list_has(recompute, "none") && recompute[0] != '\0')
        return pt_fail(err, "cuda backend: PARTITA_CUDA_RECOMPUTE=\"%s\": "
                            "expected a comma list of gelu, norm, all, none",
                       recompute);
    return 0;
}

/* llm.c's recipe where the backend keeps fp32 gradients outside the one
 * buffer or the step moves them as fp32: ZeRO-2/3 (units reduced and
 * added unit by unit in fp32; a tied embedding's pair, whose whole
 * buffers the step reduce-scatters and zeroes by fp32 ranges); and the
 * offload, not checked with them. */
static int check_bf16_grads(const stage_spec *spec, pt_error *err)
{
    if (!spec->bf16_grads)
        return 0;
    if (spec->shard_gradients && spec->optimizer_shards > 1)
        return pt_fail(err, "cuda backend: grad_precision bf16 with zero %s "
                            "is not supported: ZeRO-2/3's gradient units "
                            "are fp32 (use zero 0 or 1, or grad_precision "
                            "fp32)",
                       spec->shard_parameters ? "3" : "2");
    if (spec->offload_optimizer)
        return pt_fail(err, "cuda backend: grad_precision bf16 with "
                            "offload_optimizer is not supported: the "
                            "offload's host step is not checked against "
                            "bf16 gradients (llm.c's recipe keeps AdamW on "
                            "the GPU; use grad_precision fp32)");
    return 0;
}

/* Rows of the fused head's chunk: fixed_rows when positive
 * (PARTITA_CUDA_HEAD_ROWS; the plan then follows it too, the cost model not),
 * every row under bf16 gradients (llm.c's recipe: one product adds the
 * head's weight gradient, rounded once), else the fewest chunks of at
 * most HEAD_CHUNK_BYTES, rows rounded up to HEAD_CHUNK_ROW_MULTIPLE and
 * at least HEAD_CHUNK_MIN_ROWS. */
static int head_chunk_rows(const buffer_layout *layout, long fixed_rows)
{
    size_t N = (size_t)layout->dims.N;
    size_t row_bytes = (size_t)layout->ld_logits * sizeof(pt_bf16);
    size_t chosen = N;
    if (fixed_rows > 0) {
        chosen = (size_t)fixed_rows;
    } else if (!layout->spec.bf16_grads) {
        size_t chunks = (N * row_bytes + HEAD_CHUNK_BYTES - 1) /
                        HEAD_CHUNK_BYTES;
        size_t multiple = HEAD_CHUNK_ROW_MULTIPLE;
        chosen = (N + chunks - 1) / chunks;
        chosen = (chosen + multiple - 1) / multiple * multiple;
        if (chosen < HEAD_CHUNK_MIN_ROWS)
            chosen = HEAD_CHUNK_MIN_ROWS;
    }
    return (int)(chosen < N ? chosen : N);
}

/* cuDNN's attention-backward workspace of one of attention_split
 * pieces (formula, without its slack). */
static size_t attention_piece_bytes(const buffer_layout *layout)
{
    const stage_dims *d = &layout->dims;
    return cuda_cudnn_backward_workspace_bytes(
        d->B / layout->attention_split, d->T, d->NH, d->KVH, d->hs,
        layout->spec.deterministic);
}

/* Where the backward's buffers that the head does not touch go in its
 * chunk (buffer_layout.head_shared_offset): behind what the chunk holds
 * while they are alive, the fc gradient (where it is there,
 * buffer_carve_scratch) and cuDNN's borrowed workspace, if the rest
 * holds them. The chunk is the head's only while its chunks run, after
 * every layer's forward and before any backward; they are the
 * backward's, the fp32 input gradient only until the embedding's
 * backward on the same stage. */
static void plan_head_shared(buffer_layout *out)
{
    const stage_dims *d = &out->dims;
    size_t front = fc_gradient_in_head(out)
                       ? (size_t)d->N * (size_t)d->F * sizeof(pt_bf16)
                       : 0;
    /* cuDNN's plan may ask a little more than the formula (its slack:
     * less would split a backward that fits, as the chunk's growth
     * allows) */
    if (out->attention_split > 0)
        front = max_size(front,
                         attention_piece_bytes(out) + ATTENTION_LENT_SLACK);
    front = round_up_256(front);
    if (front > 0 &&
        front + buffer_head_shared_bytes(out) <= out->head_chunk_bytes)
        out->head_shared_offset = front;
}

/* The fused head's chunk and the attention's pieces (buffer_layout's
 * head_rows, head_chunk_bytes, attention_split). The fused head needs
 * tp 1 (the vocab-parallel softmax sums whole rows over the group) and
 * gradients in the one buffer (ZeRO-2/3's head unit opens in the
 * backward). */
static void plan_head(buffer_layout *out, const model_shape *shape,
                      long fixed_rows)
{
    const stage_dims *d = &out->dims;
    bool fused = buffer_head_fused(shape, &out->spec);
    size_t lendable = whole_logits_bytes(out);
    size_t row_bytes = (size_t)out->ld_logits * sizeof(pt_bf16);
    if (fused) {
        out->head_rows = head_chunk_rows(out, fixed_rows);
        size_t chunk = (size_t)out->head_rows * row_bytes;
        out->head_chunk_bytes = chunk;
        /* the chunk may grow to lend cuDNN what the whole logits would
         * have: splitting the attention's backward into pieces costs
         * 1-3 % of a GPT-2 step on an H200, the chunks themselves
         * nothing (docs/cuda-backend.md, "The fused head") */
        if (lendable < ATTENTION_LENT_ROOM)
            lendable = ATTENTION_LENT_ROOM;
        if (lendable < chunk)
            lendable = chunk;
    }
    if (cudnn_layers(out))
        out->attention_split =
            cuda_cudnn_backward_split(d->B, d->T, d->NH, d->KVH, d->hs,
                                      out->spec.deterministic, lendable);
    if (fused && out->attention_split > 0) {
        size_t piece = attention_piece_bytes(out);
        if (piece > out->head_chunk_bytes)
            out->head_chunk_bytes = piece + ATTENTION_LENT_SLACK;
        /* rows the grown buffer holds: fewer chunks in the same bytes
         * (unless PARTITA_CUDA_HEAD_ROWS fixed them) */
        size_t fit = out->head_chunk_bytes / row_bytes /
                     HEAD_CHUNK_ROW_MULTIPLE * HEAD_CHUNK_ROW_MULTIPLE;
        if (fixed_rows <= 0 && fit > (size_t)out->head_rows)
            out->head_rows = fit < (size_t)d->N ? (int)fit : d->N;
    }
    if (fused)
        plan_head_shared(out);
}

int buffer_layout_init(const model_shape *shape, const stage_spec *spec,
                       const param_tensor *tensors, int tensor_count,
                       size_t optimizer_first, size_t optimizer_count,
                       int mbs, const char *recompute, buffer_layout *out,
                       pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (read_recompute(recompute, out, err) != 0)
        return -1;
    out->dims = dims_of_shape(shape, spec, mbs);
    out->spec = *spec;
    out->layer_count = spec->last_layer - spec->first_layer;
    out->ld_logits = (out->dims.V + VOCAB_ROUNDING - 1) / VOCAB_ROUNDING *
                     VOCAB_ROUNDING;
    if (spec->has_head)
        out->head_pad = (size_t)(out->ld_logits - out->dims.V) *
                        (size_t)out->dims.C;
    size_t params = 0;
    for (int i = 0; i < tensor_count; i++)
        params += tensors[i].count;
    out->param_count = params;
    out->optimizer_count = optimizer_count;
    out->tensor_count = tensor_count;
    out->chunk_count = buffer_chunks_in_range(tensors, tensor_count, 0,
                                              params);
    out->optimizer_table = optimizer_count != params;
    if (out->optimizer_table)
        out->optimizer_chunk_count = buffer_chunks_in_range(
            tensors, tensor_count, optimizer_first,
            optimizer_first + optimizer_count);
    out->grads_by_unit = buffer_grads_by_unit(shape, spec);
    if (check_bf16_grads(spec, err) != 0)
        return -1;
    out->grad_count = out->grads_by_unit ? optimizer_count : params;
    const char *head_rows = getenv("PARTITA_CUDA_HEAD_ROWS");
    plan_head(out, shape, head_rows != NULL ? atol(head_rows) : 0);
    stage_units_of(spec, tensors, tensor_count, params, &out->units);
    out->params_by_unit = out->grads_by_unit && spec->shard_parameters;
    out->params_count = out->params_by_unit ? optimizer_count : params;
    if (out->params_by_unit && !out->optimizer_table) {
        /* no table of every parameter: the optimizer's is its own */
        out->optimizer_table = true;
        out->optimizer_chunk_count = out->chunk_count;
    }
    if (out->params_by_unit) {
        /* the units' tables: every tensor of the embeddings, of layer 0
         * and of the head */
        const stage_units *u = &out->units;
        for (int k = 0; k < STAGE_UNIT_KINDS; k++)
            out->unit_chunk_count += buffer_chunks_in_range(
                tensors, tensor_count, u->first[k],
                u->first[k] + u->count[k]);
    }
    return 0;
}

/* Whether the head's unit holds the LM head matrix (else a head's weight
 * is the tied token embedding, in the embeddings' unit): more than the
 * final norm's two vectors. */
static bool head_unit_has_matrix(const buffer_layout *layout)
{
    return layout->units.count[STAGE_UNIT_HEAD] >
           2 * (size_t)layout->dims.C;
}

void buffer_param_units_of(const buffer_layout *layout,
                           buffer_param_units *out)
{
    memset(out, 0, sizeof *out);
    if (!layout->params_by_unit)
        return;
    const stage_units *u = &layout->units;
    size_t layer = u->count[STAGE_UNIT_LAYER];
    size_t head = u->count[STAGE_UNIT_HEAD];
    size_t embedding = u->count[STAGE_UNIT_EMBEDDING];
    out->layer[1] = layer;
    out->head = 2 * layer;
    out->embedding = out->head + head;
    out->floats = out->embedding + embedding + 1;
    bool matrix = head_unit_has_matrix(layout);
    out->mirror_layer[1] = layer;
    out->mirror_head = 2 * layer;
    out->mirror_embedding =
        out->mirror_head + head + (matrix ? layout->head_pad : 0);
    out->halves = out->mirror_embedding + embedding +
                  (matrix ? 0 : layout->head_pad) + 1;
}

size_t buffer_param_units_bytes(const buffer_layout *layout)
{
    buffer_param_units p;
    buffer_param_units_of(layout, &p);
    return p.floats * sizeof(float);
}

size_t buffer_param_mirror_bytes(const buffer_layout *layout)
{
    buffer_param_units p;
    buffer_param_units_of(layout, &p);
    return p.halves * sizeof(pt_bf16);
}

size_t buffer_unit_tables_bytes(const buffer_layout *layout)
{
    return layout->params_by_unit
               ? ((size_t)layout->unit_chunk_count + 1) * sizeof(param_chunk)
               : 0;
}

bool buffer_grads_by_unit(const model_shape *shape, const stage_spec *spec)
{
    bool tied_pair = shape->tied_embeddings &&
                     spec->has_embedding != spec->has_head;
    return spec->shard_gradients && spec->optimizer_shards > 1 && !tied_pair;
}

bool buffer_head_fused(const model_shape *shape, const stage_spec *spec)
{
    return spec->has_head && stage_shard_of(shape, spec).tp == 1 &&
           !buffer_grads_by_unit(shape, spec);
}

void buffer_grad_units_of(const buffer_layout *layout,
                          buffer_grad_units *out)
{
    memset(out, 0, sizeof *out);
    if (!layout->grads_by_unit)
        return;
    const stage_units *u = &layout->units;
    size_t layer = u->count[STAGE_UNIT_LAYER];
    out->layer[0] = 0;
    out->layer[1] = layer;
    out->head = 2 * layer;
    out->embedding = out->head + u->count[STAGE_UNIT_HEAD];
    out->floats = out->embedding + u->count[STAGE_UNIT_EMBEDDING] +
                  layout->head_pad + 1;
}

size_t buffer_grad_units_bytes(const buffer_layout *layout)
{
    buffer_grad_units g;
    buffer_grad_units_of(layout, &g);
    return g.floats * sizeof(float);
}

/* The allocations of model_cuda.c's allocate_parts, in its order, over
 * no memory. */
static void tally_stage(const buffer_layout *layout, int slot_count,
                        layer_activations *layers, pt_memory_terms *out)
{
    buffer_tally(out, PT_MEMORY_WORKSPACE, CUDA_GEMM_WORKSPACE_BYTES);
    const stage_buffer buffers[] = {STAGE_PARAMS, STAGE_GRADS, STAGE_ADAM_M,
                                    STAGE_ADAM_V};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        buffer_tally(out, buffer_parameter_term(buffers[i]),
                     buffer_parameter_bytes(layout, buffers[i]));
    if (layout->grads_by_unit)
        buffer_tally(out, PT_MEMORY_GRADIENTS,
                     buffer_grad_units_bytes(layout));
    if (layout->params_by_unit)
        buffer_tally(out, PT_MEMORY_WEIGHTS,
                     buffer_param_units_bytes(layout));
    buffer_tally(out, PT_MEMORY_WEIGHT_MIRROR, buffer_mirror_bytes(layout));
    /* the table of every parameter, or ZeRO-3's units' tables */
    buffer_tally(out, PT_MEMORY_OPTIMIZER,
                 layout->params_by_unit
                     ? buffer_unit_tables_bytes(layout)
                     : buffer_chunk_table_bytes(layout->chunk_count,
                                                layout->tensor_count));
    if (layout->optimizer_table)
        buffer_tally(out, PT_MEMORY_OPTIMIZER,
                     buffer_chunk_table_bytes(layout->optimizer_chunk_count,
                                              layout->tensor_count));
    for (int s = 0; s < slot_count; s++) {
        activation_slot slot = {.layers = layers};
        arena a = {0};
        buffer_carve_slot(&slot, &a, layout);
        buffer_tally_arena(out, &a);
    }
    backward_scratch scratch = {0};
    layer_activations recomputed = {0};
    arena a = {0};
    buffer_carve_scratch(&scratch, &recomputed, &a, layout);
    buffer_tally_arena(out, &a);
    /* the attention runner's own allocation (model_cuda.c prepares it) */
    size_t attention = buffer_attention_workspace_bytes(layout);
    if (attention > 0)
        buffer_tally(out, PT_MEMORY_WORKSPACE, attention);
}

int cuda_stage_buffer_layout(const model_shape *shape,
                             const stage_spec *spec, int mbs_capacity,
                             const char *recompute, buffer_layout *out,
                             pt_error *err)
{
    if (mbs_capacity < 1)
        return pt_fail(err, "memory plan: micro-batch capacity (%d) must be "
                            ">= 1",
                       mbs_capacity);
    size_t params = 0;
    int count = stage_parameter_layout(shape, spec, NULL, &params, err);
    if (count < 0)
        return -1;
    param_tensor *tensors = calloc((size_t)count + 1, sizeof *tensors);
    if (tensors == NULL)
        return pt_fail(err, "memory plan: out of memory");
    int status = -1;
    if (stage_parameter_layout(shape, spec, tensors, NULL, err) >= 0) {
        size_t first = 0, moments = 0;
        stage_optimizer_range(params, spec->optimizer_shards,
                              spec->optimizer_shard, &first, &moments);
        status = buffer_layout_init(shape, spec, tensors, count, first,
                                    moments, mbs_capacity, recompute, out,
                                    err);
    }
    free(tensors);
    return status;
}

int cuda_stage_memory_plan(const model_shape *shape, const stage_spec *spec,
                           int mbs_capacity, int slot_count,
                           const char *recompute, pt_memory_terms *out,
                           pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (mbs_capacity < 1 || slot_count < 1)
        return pt_fail(err, "memory plan: micro-batch capacity (%d) and "
                            "activation slots (%d) must be >= 1",
                       mbs_capacity, slot_count);
    buffer_layout layout;
    if (cuda_stage_buffer_layout(shape, spec, mbs_capacity, recompute,
                                 &layout, err) != 0)
        return -1;
    layer_activations *acts =
        calloc((size_t)layout.layer_count + 1, sizeof *acts);
    if (acts == NULL)
        return pt_fail(err, "memory plan: out of memory");
    tally_stage(&layout, slot_count, acts, out);
    free(acts);
    return 0;
}
