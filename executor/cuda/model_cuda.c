/*
 * The cuda backend: one model stage on one GPU. This file holds the
 * memory plan and the buffers; the gradient norms and the optimizer step
 * are optimizer_step.c's, the order of the kernels of the forward and
 * backward passes is passes.c's, the kernels are in the .cu files beside
 * it (declared in cuda_ops.h) and the matrix products in gemm.c.
 * cuda_stage.h holds the state they share.
 *
 * Precision: fp32 master parameters, gradients and AdamW moments (the
 * four buffers of model_stage), a bf16 mirror of the parameters that the
 * matrix products read (refreshed by the AdamW kernel), the residual
 * stream in bf16 as Megatron-LM keeps it without
 * --fp32-residual-connection (its adds in fp32, rounded once; the
 * pipeline's messages stay fp32, converted at the stage's edges), its
 * gradient in fp32, every other activation in bf16. Under
 * llm.c's recipe (spec.bf16_grads, model_stage.grads_bf16) the gradient
 * buffer is bf16: every product and kernel that adds into it takes its
 * sum in fp32 and rounds once (cuda_grad), the dp reduction sums bf16,
 * and AdamW and the norms read bf16; host reads and writes convert.
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
 * the gradients: its padding rows add exactly zero (zero rows of
 * d logits) to whatever follows the head tensor, and the gradient buffer
 * has (Vp - V) x C elements of slack at its end for a head stored last.
 * Only a head stored last may have its gradient written (beta = 0) by the
 * step's first product (cuda_side_zero): its padding rows' zeros then
 * land in the slack.
 *
 * Tensor parallelism (spec.tp > 1, Megatron's split): the stage holds
 * its shard of every split tensor (the table of stage_parameter_layout)
 * and its activations are the shard's: A = C / tp attention channels
 * (heads / tp heads of unchanged size), F / tp MLP features, the
 * vocabulary rows of stage_vocab_shard. The group's sums (enqueued on the
 * stage's stream when the comm can, the layers' four in bf16; else
 * through stage_tp_all_reduce_sum / _max in fp32, the stream drained
 * first: passes.c) follow the row-parallel products (attention and MLP
 * projections: bias and residual added after the sum), the
 * column-parallel input gradients (QKV, fc, LM head), the vocab-parallel
 * embedding lookup and the vocab-parallel cross-entropy (row maxima by
 * max, exponential sums and target logits by sum). docs/cuda-backend.md,
 * "Tensor parallelism".
 *
 * Matrix products, row-major model view -> column-major cuBLASLt view: a
 * linear layer out (N x OC) = in (N x IC) W^T (W is OC x IC) is
 *   out^T (OC x N) = op_T(W^T as IC x OC) in^T (IC x N),
 * its input gradient d_in^T (IC x N) = W^T (IC x OC) d_out^T (OC x N),
 * and its weight gradient d_W^T (IC x OC) += in^T (IC x N) op_T(d_out^T).
 */
#include "executor/cuda/cuda_stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"

/* ----------------------------------------------------------- tensor map */

/* The next tensor of the table, or CUDA_NO_TENSOR when the model has
 * none there (`present` false). */
static size_t next_offset(const param_tensor *table, int *index, bool present)
{
    return present ? table[(*index)++].offset : CUDA_NO_TENSOR;
}

/* The layout of stage_parameter_layout, walked in its order: GPT-2's
 * every tensor, another model's those it has (layout.c). */
static void map_offsets(const model_stage *stage, stage_offsets *out)
{
    int index = 0;
    const param_tensor *table = stage->tensors;
    const model_shape *shape = &stage->shape;
    bool norm_bias = shape->norm == MODEL_NORM_LAYERNORM;
    bool bias = shape->bias == MODEL_BIAS_ALL;
    bool qkv_bias = shape->bias != MODEL_BIAS_NONE;
    if (stage->spec.has_embedding) {
        out->token_embedding = table[index++].offset;
        out->position_embedding = next_offset(
            table, &index, shape->positions == MODEL_POSITIONS_LEARNED);
    }
    int layer_count = stage->spec.last_layer - stage->spec.first_layer;
    for (int l = 0; l < layer_count; l++) {
        layer_offsets *layer = &out->layers[l];
        struct {
            size_t *field;
            bool present;
        } fields[] = {
            {&layer->ln1_weight, true},       {&layer->ln1_bias, norm_bias},
            {&layer->qkv_weight, true},       {&layer->qkv_bias, qkv_bias},
            {&layer->attn_proj_weight, true}, {&layer->attn_proj_bias, bias},
            {&layer->ln2_weight, true},       {&layer->ln2_bias, norm_bias},
            {&layer->fc_weight, true},        {&layer->fc_bias, bias},
            {&layer->mlp_proj_weight, true},  {&layer->mlp_proj_bias, bias},
        };
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            *fields[f].field =
                next_offset(table, &index, fields[f].present);
    }
    if (stage->spec.has_head) {
        out->final_norm_weight = table[index++].offset;
        out->final_norm_bias = next_offset(table, &index, norm_bias);
        out->head_weight = index < stage->tensor_count
                               ? table[index++].offset
                               : out->token_embedding;
    }
}

/* ----------------------------------------------------------- allocation */

/* cudaMalloc counted against the rank's memory cap (memory_limit_gib,
 * executor/cuda/device.c) and in device_bytes, which cuda_release gives
 * back to the cap: both happen on the thread that owns the stage. The
 * callers below also tally it by term (buffers.h). */
static int device_malloc(cuda_stage_state *state, void **out, size_t bytes,
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

/* One buffer of one memory term. */
static int device_alloc(cuda_stage_state *state, void **out, size_t bytes,
                        pt_memory_term term, const char *what,
                        pt_error *err)
{
    if (device_malloc(state, out, bytes, what, err) != 0)
        return -1;
    buffer_tally(&state->tally, term, bytes);
    return 0;
}

/* Allocates an arena sized by a dry run of `carve` and carves it. */
#define ALLOCATE_ARENA(state, block, what, carve_call)                       \
    do {                                                                     \
        arena a_ = {.base = NULL, .used = 0};                                \
        arena *a = &a_;                                                      \
        carve_call;                                                          \
        void *block_ = NULL;                                                 \
        if (device_malloc((state), &block_, arena_request_bytes(a), (what),  \
                          err) != 0)                                         \
            return -1;                                                       \
        buffer_tally_arena(&(state)->tally, a);                              \
        (block) = block_;                                                    \
        a_ = (arena){.base = (char *)block_, .used = 0};                     \
        carve_call;                                                          \
    } while (0)

/* Chunks of at most PARAM_CHUNK_ELEMENTS covering the part of every
 * tensor inside [first, first + count), on the host: *out_count chunks,
 * then tensor_count + 1 ints, each tensor's first chunk. */
static param_chunk *host_chunk_table(const model_stage *stage,
                                     const cuda_stage_state *state,
                                     size_t first, size_t count,
                                     int *out_count, size_t *out_bytes)
{
    size_t end = first + count;
    int chunks = buffer_chunks_in_range(stage->tensors, stage->tensor_count,
                                        first, end);
    size_t table_bytes = (size_t)chunks * sizeof(param_chunk);
    size_t bytes = buffer_chunk_table_bytes(chunks, stage->tensor_count);
    param_chunk *host = calloc(1, bytes);
    if (host == NULL)
        return NULL;
    int *starts = (int *)((char *)host + table_bytes);
    int next = 0;
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t lo = 0, hi = 0;
        buffer_tensor_part(t, first, end, &lo, &hi);
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
    if (device_alloc(state, &device, bytes, PT_MEMORY_OPTIMIZER,
                     "the optimizer table", err) != 0) {
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
    if (stage->params_by_unit) /* no mirror of every parameter */
        return build_chunk_table(stage, state, stage->optimizer_first,
                                 stage->optimizer_count,
                                 &state->optimizer_chunks, err);
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

/* The environment's options (cuda_backend.h) and the layout the buffers
 * are sized from. */
static int read_options(model_stage *stage, cuda_stage_state *state,
                        attention_mode *attention, pt_error *err)
{
    const char *fuse = getenv("PARTITA_CUDA_FUSE");
    state->fuse_epilogues = fuse == NULL || strcmp(fuse, "0") != 0;
    const char *in_norm = getenv("PARTITA_CUDA_RESIDUAL_IN_NORM");
    state->residual_in_norm = in_norm == NULL || strcmp(in_norm, "0") != 0;
    const char *graphs = getenv("PARTITA_CUDA_GRAPHS");
    state->graphs.enabled = graphs == NULL || strcmp(graphs, "0") != 0;
    const char *holds = getenv("PARTITA_CUDA_UNIT_HOLDS");
    state->param_units.regather = holds != NULL && strcmp(holds, "0") == 0;
    /* the plan's choice, or PARTITA_CUDA_DETERMINISTIC=1 (tests that
     * compare bits between runs) */
    stage_spec spec = stage->spec;
    const char *deterministic = getenv("PARTITA_CUDA_DETERMINISTIC");
    if (deterministic != NULL && strcmp(deterministic, "1") == 0)
        spec.deterministic = true;
    if (buffer_layout_init(&stage->shape, &spec, stage->tensors,
                           stage->tensor_count, stage->optimizer_first,
                           stage->optimizer_count, stage->mbs_capacity,
                           getenv("PARTITA_CUDA_RECOMPUTE"), &state->layout,
                           err) != 0)
        return -1;
    return attention_mode_from_env(attention, err);
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
    /* the units' stream drained and gone first */
    cuda_grad_units_close(&state->grad_units);
    cuda_param_units_close(&state->param_units);
    stage->unit_stream = NULL;
    cudaFree(state->mirror);
    if (state->optimizer_chunks.chunks != state->all_chunks.chunks)
        cudaFree(state->optimizer_chunks.chunks);
    cudaFree(state->all_chunks.chunks);
    cudaFreeHost(state->host_block);
    cuda_device_step_close(&state->device_step);
    cuda_pass_graphs_close(&state->graphs);
    cuda_side_zero_close(&state->side_zero);
    cuda_tp_overlap_close(&state->tp_overlap);
    free(state->token_counts);
    free(state->offsets.layers);
    attention_runner_destroy(state->attention);
    gemm_context_destroy(state->gemm);
    if (state->stream != NULL)
        cudaStreamDestroy(state->stream);
    stage->stream = NULL;
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
 * gradients (bf16 under llm.c's recipe) and AdamW moments and bf16
 * weight mirror (18 bytes per parameter, 16) alone exceed the device's
 * free memory; activations come on top, and a shortage there is reported
 * by the allocation itself. */
static int check_state_fits(const model_stage *stage, pt_error *err)
{
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return 0; /* the allocations will tell */
    }
    int per_parameter = stage->spec.bf16_grads ? 16 : 18;
    double state_bytes = per_parameter * (double)stage->param_count;
    if (state_bytes <= (double)free_bytes)
        return 0;
    return pt_fail(err, "cuda backend: model %s needs at least %.2f GiB on "
                        "the device for its %zu parameters (fp32 weights "
                        "and AdamW moments, %s gradients and a bf16 copy: "
                        "%d bytes each) before activations; the device has "
                        "%.2f GiB free of %.2f GiB",
                   stage->shape.name, state_bytes / PT_GIB,
                   stage->param_count,
                   stage->spec.bf16_grads ? "bf16" : "fp32", per_parameter,
                   (double)free_bytes / PT_GIB,
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
    int head_size = shape->hidden / shape->heads;
    if (!model_is_gpt(shape) && head_size % 8 != 0)
        return pt_fail(err, "cuda backend: model %s has a head size of %d; "
                            "its Llama layer needs a multiple of 8 (16-byte "
                            "rows of bf16 heads)",
                       shape->name, head_size);
    int device_count = cuda_device_count();
    if (device_count == 0)
        return pt_fail(err, "cuda backend: no CUDA device is visible");
    return check_state_fits(stage, err);
}

/* ZeRO-3's units (param_units.c): the fp32 block, the bf16 one carved
 * from the mirror's allocation, and the conversion tables. */
static int allocate_param_units(model_stage *stage, cuda_stage_state *state,
                                pt_error *err)
{
    cuda_param_units *p = &state->param_units;
    buffer_param_units at;
    buffer_param_units_of(&state->layout, &at);
    void *block = NULL, *tables = NULL;
    size_t bytes = buffer_param_units_bytes(&state->layout);
    if (device_alloc(state, &block, bytes, PT_MEMORY_WEIGHTS,
                     "the parameter units", err) != 0)
        return -1;
    p->block = block;
    CUDA_TRY(cudaMemset(block, 0, bytes));
    if (device_alloc(state, &tables,
                     buffer_unit_tables_bytes(&state->layout),
                     PT_MEMORY_OPTIMIZER, "the units' tables", err) != 0)
        return -1;
    p->tables = tables;
    const size_t floats[] = {at.layer[0], at.layer[1], at.head,
                             at.embedding};
    const size_t halves[] = {at.mirror_layer[0], at.mirror_layer[1],
                             at.mirror_head, at.mirror_embedding};
    for (int b = 0; b < GRAD_UNIT_BUFFERS; b++) {
        p->buffer[b] = p->block + floats[b];
        p->mirror[b] = state->mirror + halves[b];
    }
    return cuda_param_units_open(stage, state, err);
}

/* The four parameter-sized buffers of model_stage (the gradients with
 * the head's slack), zeroed, and the bf16 mirror with its chunk tables. */
static int allocate_parameters(model_stage *stage, cuda_stage_state *state,
                               pt_error *err)
{
    /* ZeRO-2/3: the gradients of the optimizer's range only */
    stage->grads_by_unit = state->layout.grads_by_unit;
    /* the head's backward products run in its forward (plan_head) */
    stage->head_fused = state->layout.head_rows > 0;
    /* llm.c's recipe: bf16 gradients (buffer_parameter_bytes) */
    stage->grads_bf16 = stage->spec.bf16_grads;
    stage->grad_first = stage->grads_by_unit ? stage->optimizer_first : 0;
    stage->grad_count = state->layout.grad_count;
    /* ZeRO-3: the parameters too */
    stage->params_by_unit = state->layout.params_by_unit;
    stage->params_first = stage->params_by_unit ? stage->optimizer_first : 0;
    stage->params_count = state->layout.params_count;
    float **buffers[] = {&stage->params, &stage->grads, &stage->adam_m,
                         &stage->adam_v};
    const char *names[] = {"the parameters", "the gradients",
                           "the AdamW first moments",
                           "the AdamW second moments"};
    const stage_buffer kinds[] = {STAGE_PARAMS, STAGE_GRADS, STAGE_ADAM_M,
                                  STAGE_ADAM_V};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) {
        /* the gradients carry the head's slack (see the head products
           above), the moments the optimizer's range only */
        size_t bytes = buffer_parameter_bytes(&state->layout, kinds[i]);
        void *buffer = NULL;
        if (device_alloc(state, &buffer, bytes,
                         buffer_parameter_term(kinds[i]), names[i],
                         err) != 0)
            return -1;
        *buffers[i] = buffer;
        CUDA_TRY(cudaMemset(buffer, 0, bytes));
    }
    if (stage->grads_by_unit) {
        /* ZeRO-2/3: the units' block beside the shard (grad_units.c) */
        size_t bytes = buffer_grad_units_bytes(&state->layout);
        buffer_grad_units at;
        buffer_grad_units_of(&state->layout, &at);
        cuda_grad_units *g = &state->grad_units;
        void *block = NULL;
        if (device_alloc(state, &block, bytes, PT_MEMORY_GRADIENTS,
                         "the gradient units", err) != 0)
            return -1;
        g->block = block;
        CUDA_TRY(cudaMemset(block, 0, bytes));
        g->buffer[GRAD_UNIT_LAYER_A] = g->block + at.layer[0];
        g->buffer[GRAD_UNIT_LAYER_B] = g->block + at.layer[1];
        g->buffer[GRAD_UNIT_HEAD] = g->block + at.head;
        g->buffer[GRAD_UNIT_EMBEDDING] = g->block + at.embedding;
        if (cuda_grad_units_open(g, err) != 0)
            return -1;
        stage->unit_stream = g->stream;
    }
    size_t mirror_bytes = buffer_mirror_bytes(&state->layout);
    void *mirror = NULL;
    if (device_alloc(state, &mirror, mirror_bytes, PT_MEMORY_WEIGHT_MIRROR,
                     "the bf16 weight mirror", err) != 0)
        return -1;
    state->mirror = mirror;
    CUDA_TRY(cudaMemset(state->mirror, 0, mirror_bytes));
    if (stage->params_by_unit && allocate_param_units(stage, state, err) != 0)
        return -1;
    return build_chunks(stage, state, err);
}

static int allocate_parts(model_stage *stage, cuda_stage_state *state,
                          pt_error *err)
{
    CUDA_TRY(cudaGetDevice(&state->device));
    if (cuda_rank_stream_create(&state->stream, err) != 0)
        return -1;
    stage->stream = state->stream;
    if (cuda_tp_overlap_open(stage, err) != 0)
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
    buffer_tally(&state->tally, PT_MEMORY_WORKSPACE, workspace);
    attention_mode attention = ATTENTION_AUTO;
    if (read_options(stage, state, &attention, err) != 0 ||
        attention_runner_create(&state->attention, attention,
                                state->layout.spec.deterministic, err) != 0)
        return -1;
    stage_dims d = state->layout.dims;
    state->ld_logits = state->layout.ld_logits;
    state->head_pad = state->layout.head_pad;
    if (stage->spec.has_head)
        state->head_offset = state->offsets.head_weight;
    if (allocate_parameters(stage, state, err) != 0)
        return -1;
    for (int s = 0; s < stage->slot_count; s++) {
        activation_slot *slot = &state->slots[s];
        slot->layers = calloc((size_t)state->layer_count + 1,
                              sizeof *slot->layers);
        if (slot->layers == NULL)
            return pt_fail(err, "cuda backend: out of host memory");
        ALLOCATE_ARENA(state, slot->arena, "an activation slot",
                       buffer_carve_slot(slot, a, &state->layout));
    }
    ALLOCATE_ARENA(state, state->scratch.arena, "the backward scratch",
                   buffer_carve_scratch(&state->scratch, &state->recomputed,
                                        a, &state->layout));
    /* the layer-norm backward's completion counters start at zero */
    CUDA_TRY(cudaMemset(state->scratch.norm_partials, 0,
                        cuda_layernorm_backward_scratch(d.N, d.C) *
                            sizeof(float)));
    {
        /* pinned host memory: not in the device tally */
        arena a = {.base = NULL, .used = 0};
        buffer_carve_tokens(&state->host_tokens, &a, (size_t)d.N);
        CUDA_TRY(cudaMallocHost(&state->host_block, arena_request_bytes(&a)));
        a = (arena){.base = state->host_block, .used = 0};
        buffer_carve_tokens(&state->host_tokens, &a, (size_t)d.N);
    }
    if (cuda_device_step_open(&state->device_step, err) != 0)
        return -1;
    /* the attention's path for full micro-batches, cuDNN's plans and
     * workspace included, now rather than in the first step */
    state->logits_bytes = buffer_logits_lendable_bytes(&state->layout);
    if (state->layer_count > 0 &&
        (state->llama_layer
             ? attention_runner_prepare_gqa(state->attention, d.B, d.T, d.NH,
                                            d.KVH, d.hs, state->logits_bytes,
                                            err)
             : attention_runner_prepare(state->attention, d.B, d.T, d.A,
                                        d.NH, state->logits_bytes, err)) !=
            0)
        return -1;
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
    state->llama_layer = !model_is_gpt(&stage->shape);
    state->offsets.layers =
        calloc((size_t)state->layer_count + 1, sizeof(layer_offsets));
    state->slots = calloc((size_t)stage->slot_count, sizeof *state->slots);
    int status = -1;
    if (state->offsets.layers == NULL || state->slots == NULL) {
        pt_fail(err, "cuda backend: out of host memory");
    } else {
        map_offsets(stage, &state->offsets);
        status = allocate_parts(stage, state, err);
        if (status == 0)
            status = cuda_side_zero_plan(
                stage, stage->grads_bf16 ? sizeof(pt_bf16) : sizeof(float),
                err);
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

/* ----------------------------------------------- buffers and optimizer */

/* Whether buffer `which` holds bf16 values (the gradients under llm.c's
 * recipe), and the bytes of one of its elements. */
static bool holds_bf16(const model_stage *stage, stage_buffer which)
{
    return which == STAGE_GRADS && stage->grads_bf16;
}

static size_t element_bytes(const model_stage *stage, stage_buffer which)
{
    return holds_bf16(stage, which) ? sizeof(pt_bf16) : sizeof(float);
}

/* `count` bf16 gradients at `device` to (to_host) or from fp32 host
 * values, through a host copy converted here: the device has no room
 * for an fp32 copy (the memory plan counts none). Waits for the copy. */
static int copy_bf16_grads(cuda_stage_state *state, pt_bf16 *device,
                           float *host, size_t count, bool to_host,
                           pt_error *err)
{
    pt_bf16 *staging = malloc(count * sizeof *staging + 1);
    if (staging == NULL)
        return pt_fail(err, "cuda backend: out of host memory for %zu bf16 "
                            "gradients",
                       count);
    if (!to_host)
        for (size_t i = 0; i < count; i++)
            staging[i] = pt_float_to_bf16(host[i]);
    cudaError_t status = cudaMemcpyAsync(
        to_host ? (void *)staging : (void *)device,
        to_host ? (const void *)device : (const void *)staging,
        count * sizeof *staging,
        to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
        state->stream);
    if (status == cudaSuccess)
        status = cudaStreamSynchronize(state->stream);
    if (status == cudaSuccess && to_host)
        for (size_t i = 0; i < count; i++)
            host[i] = pt_bf16_to_float(staging[i]);
    free(staging);
    if (status != cudaSuccess)
        return pt_fail(err, "cuda backend: copying %zu bf16 gradients %s "
                            "the host: %s",
                       count, to_host ? "to" : "from",
                       cudaGetErrorString(status));
    return 0;
}

/* Elements [at, at + count) of buffer `which` to or from the host, on
 * the stage's stream; bf16 gradients converted. Not waited for unless
 * converted. */
static int copy_part(const model_stage *stage, stage_buffer which,
                     size_t at, size_t count, float *host, bool to_host,
                     pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    /* gradients read or written between a step's start and its first
     * backward: zeroed first where nothing has written them yet, as they
     * would have been */
    if (which == STAGE_GRADS && cuda_side_zero_settle_all(stage, err) != 0)
        return -1;
    char *part = (char *)model_stage_buffer(stage, which) +
                 at * element_bytes(stage, which);
    if (holds_bf16(stage, which))
        return copy_bf16_grads(state, (pt_bf16 *)part, host, count, to_host,
                               err);
    CUDA_TRY(cudaMemcpyAsync(to_host ? (void *)host : (void *)part,
                             to_host ? (const void *)part
                                     : (const void *)host,
                             count * sizeof(float),
                             to_host ? cudaMemcpyDeviceToHost
                                     : cudaMemcpyHostToDevice,
                             state->stream));
    return 0;
}

static int cuda_copy_to_host(const model_stage *stage, stage_buffer which,
                             float *host, pt_error *err)
{
    const cuda_stage_state *state = state_of(stage);
    if (model_stage_buffer(stage, which) == NULL)
        return pt_fail(err, "cuda backend: unknown buffer %d", (int)which);
    CUDA_TRY(cudaSetDevice(state->device));
    if (cuda_grad_units_settle(stage, err) != 0 ||
        copy_part(stage, which, 0, model_stage_buffer_count(stage, which),
                  host, true, err) != 0)
        return -1;
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

/* After a copy or memset queued on the stage's stream: the bf16 mirror
 * the products read refreshed when params were written, then the wait. */
static int finish_write(model_stage *stage, bool params_written,
                        pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    /* ZeRO-3's units make their bf16 copies as they are gathered: those
     * gathered before are stale */
    if (params_written && stage->params_by_unit)
        cuda_param_units_changed(state);
    if (params_written && !stage->params_by_unit)
        CUDA_TRY(cuda_refresh_mirror(state->mirror, stage->params,
                                     state->all_chunks.chunks,
                                     state->all_chunks.count, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static int cuda_copy_from_host(model_stage *stage, stage_buffer which,
                               const float *host, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (model_stage_buffer(stage, which) == NULL)
        return pt_fail(err, "cuda backend: unknown buffer %d", (int)which);
    CUDA_TRY(cudaSetDevice(state->device));
    /* copy_part only reads host when writing to the device */
    if (copy_part(stage, which, 0, model_stage_buffer_count(stage, which),
                  (float *)host, false, err) != 0)
        return -1;
    return finish_write(stage, which == STAGE_PARAMS, err);
}

/* A part of params or grads to or from the host, or zeroed, on the
 * stage's stream (pinned host memory: DMA); params written refresh the
 * bf16 mirror the products read. */
static int cuda_copy_range(model_stage *stage, stage_buffer which,
                           size_t first, size_t count, float *host,
                           bool to_host, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    /* the gradients and parameters may be a shard (ZeRO-2/3) */
    size_t at = first - (which == STAGE_GRADS ? stage->grad_first
                                              : stage->params_first);
    CUDA_TRY(cudaSetDevice(state->device));
    if (cuda_grad_units_settle(stage, err) != 0 ||
        copy_part(stage, which, at, count, host, to_host, err) != 0)
        return -1;
    return finish_write(stage, !to_host && which == STAGE_PARAMS, err);
}

static int cuda_zero_range(model_stage *stage, stage_buffer which,
                           size_t first, size_t count, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    size_t at = first - (which == STAGE_GRADS ? stage->grad_first
                                              : stage->params_first);
    size_t size = element_bytes(stage, which);
    CUDA_TRY(cudaSetDevice(state->device));
    if (cuda_grad_units_settle(stage, err) != 0)
        return -1;
    CUDA_TRY(cudaMemsetAsync((char *)model_stage_buffer(stage, which) +
                                 at * size,
                             0, count * size, state->stream));
    return finish_write(stage, which == STAGE_PARAMS, err);
}

static void *cuda_host_alloc(size_t bytes)
{
    void *memory = NULL;
    return cudaMallocHost(&memory, bytes) == cudaSuccess ? memory : NULL;
}

static void cuda_host_free(void *memory)
{
    cudaFreeHost(memory);
}

static int cuda_zero_grads(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    if (cuda_grad_units_settle(stage, err) != 0)
        return -1;
    /* stream-ordered, not waited for: the host builds the next
     * micro-batch's tokens and embedding plan while the device zeroes
     * (a wait here left the GPU idle for both, 0.4-0.6 ms a step at GPT-2
     * 350M on an H200); whatever reads the gradients is behind it on the
     * stream or waits for the stream first. A step kept on the device
     * leaves the fill to its first forward, beside it (cuda_side_zero). */
    size_t bytes = stage->grad_count * element_bytes(stage, STAGE_GRADS);
    bool deferred = false;
    if (cuda_side_zero_defer(stage, bytes, &deferred, err) != 0)
        return -1;
    if (!deferred)
        CUDA_TRY(cudaMemsetAsync(stage->grads, 0, bytes, state->stream));
    /* a step kept on the device starts its loss sum here */
    if (stage->step.on_device)
        CUDA_TRY(cudaMemsetAsync(state->scratch.step, 0,
                                 sizeof *state->scratch.step,
                                 state->stream));
    return 0;
}

/* After the all-gather brought the other shards' parameters: their bf16
 * copies (the own shard's are fresh from AdamW, refreshed again for
 * simplicity: one read of the parameters). */
static int cuda_params_changed(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (stage->params_by_unit) { /* gathered unit by unit, again */
        cuda_param_units_changed(state);
        return 0;
    }
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cuda_refresh_mirror(state->mirror, stage->params,
                                 state->all_chunks.chunks,
                                 state->all_chunks.count, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static float *cuda_input_buffer(model_stage *stage, int slot)
{
    return state_of(stage)->slots[slot].received;
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

static int cuda_synchronize(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

static const stage_backend cuda_backend_table = {
    .kind = BACKEND_CUDA,
    .name = "cuda",
    .allocate = cuda_allocate,
    .release = cuda_release,
    .forward = cuda_stage_forward,
    .backward = cuda_stage_backward,
    .zero_grads = cuda_zero_grads,
    .grad_square_sum = cuda_grad_square_sum,
    .grad_square_sums = cuda_grad_square_sums,
    .adamw_step = cuda_adamw_step,
    .step_apply = cuda_step_apply,
    .step_totals = cuda_step_totals,
    .step_mark = cuda_step_mark,
    .step_mark_seconds = cuda_step_mark_seconds,
    .params_changed = cuda_params_changed,
    .synchronize = cuda_synchronize,
    .copy_to_host = cuda_copy_to_host,
    .copy_from_host = cuda_copy_from_host,
    .input_buffer = cuda_input_buffer,
    .output = cuda_output,
    .input_grad = cuda_input_grad,
    .output_grad_buffer = cuda_output_grad_buffer,
    .copy_range = cuda_copy_range,
    .zero_range = cuda_zero_range,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .prepare_tokens = cuda_prepare_tokens,
    .packs_sequence_rows = true,
};

const stage_backend *cuda_stage_backend(void)
{
    return &cuda_backend_table;
}

/* ------------------------------------------------------------- helpers */

size_t cuda_stage_device_bytes(const model_stage *stage)
{
    const cuda_stage_state *state = state_of(stage);
    return state != NULL ? state->device_bytes +
                               attention_runner_device_bytes(state->attention)
                         : 0;
}

const char *cuda_stage_attention(const model_stage *stage)
{
    const cuda_stage_state *state = state_of(stage);
    return attention_runner_describe(state != NULL ? state->attention
                                                   : NULL);
}

void cuda_stage_memory_terms(const model_stage *stage, pt_memory_terms *out)
{
    const cuda_stage_state *state = state_of(stage);
    if (state == NULL) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = state->tally;
    /* cuDNN's backward workspace when the logits could not lend it (a
     * stage without the head): the runner's own, not in the plan */
    size_t runner = attention_runner_device_bytes(state->attention);
    if (runner > 0)
        buffer_tally(out, PT_MEMORY_WORKSPACE, runner);
}

cudaStream_t cuda_stage_stream(const model_stage *stage)
{
    const cuda_stage_state *state = stage->backend_state;
    return state != NULL ? state->stream : NULL;
}

void cuda_stage_set_grad_hook(model_stage *stage, cuda_grad_hook hook,
                              void *data)
{
    cuda_stage_state *state = stage->backend_state;
    if (state == NULL)
        return;
    state->grad_hook = hook;
    state->grad_hook_data = hook != NULL ? data : NULL;
}
