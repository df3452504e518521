/*
 * ZeRO-3's parameter shard on the cuda backend (cuda_stage.h,
 * "cuda_param_units"; docs/executor.md, "ZeRO-2 and ZeRO-3"): the rank
 * keeps fp32 parameters for its optimizer shard only. Before a unit (the
 * embeddings, a layer, the head) is computed, its weights are gathered
 * into a buffer of that unit's size: the rank's part copied from the
 * shard, the rest all-gathered over dp (the stage's param_source), then
 * converted to the bf16 copy the matrix products read. The gathers run on
 * the units' stream (grad_units.c's), one unit ahead of the one the pass
 * computes, so each overlaps the compute before it; the pass waits for a
 * unit's event only when it reaches it. A unit its buffer still holds,
 * gathered since the parameters last changed, is not gathered again
 * (unit_holds.h's rule): a forward after a backward finds the
 * embeddings, the head and the first two layers there, a backward the
 * embeddings, the head and the last two; the optimizer step and every
 * write of the parameters forget them all (cuda_param_units_changed).
 */
#include "executor/cuda/cuda_stage.h"

#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"

/* One unit's conversion chunks on the host, offsets from the unit's start
 * (its fp32 buffer's and, through mirror_offset, its bf16 buffer's). */
static int fill_table(const model_stage *stage,
                      const cuda_stage_state *state, size_t first,
                      size_t count, param_chunk *out)
{
    int next = 0;
    size_t end = first + count;
    size_t mirror_first = mirror_offset(state, first);
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t lo = 0, hi = 0;
        buffer_tensor_part(t, first, end, &lo, &hi);
        for (size_t at = lo; at < hi; at += PARAM_CHUNK_ELEMENTS) {
            param_chunk *chunk = &out[next++];
            size_t left = hi - at;
            chunk->offset = at - first;
            chunk->mirror_offset = mirror_offset(state, t->offset) +
                                   (at - t->offset) - mirror_first;
            chunk->moment_offset = 0;
            chunk->count = (uint32_t)(left < PARAM_CHUNK_ELEMENTS
                                          ? left
                                          : PARAM_CHUNK_ELEMENTS);
            chunk->decay = t->weight_decay;
        }
    }
    return next;
}

int cuda_param_units_open(model_stage *stage, cuda_stage_state *state,
                          pt_error *err)
{
    cuda_param_units *p = &state->param_units;
    for (int b = 0; b < GRAD_UNIT_BUFFERS; b++) {
        CUDA_TRY(cudaEventCreateWithFlags(&p->issued[b],
                                          cudaEventDisableTiming));
        CUDA_TRY(cudaEventCreateWithFlags(&p->ready[b],
                                          cudaEventDisableTiming));
    }
    size_t bytes = buffer_unit_tables_bytes(&state->layout);
    param_chunk *host = calloc(1, bytes);
    if (host == NULL)
        return pt_fail(err, "cuda backend: out of host memory for the "
                            "units' tables");
    const stage_units *u = &state->layout.units;
    int next = 0;
    for (int k = 0; k < STAGE_UNIT_KINDS; k++) {
        p->table[k] = p->tables + next;
        p->table_count[k] =
            fill_table(stage, state, u->first[k], u->count[k], host + next);
        next += p->table_count[k];
    }
    cudaError_t status =
        cudaMemcpy(p->tables, host, bytes, cudaMemcpyHostToDevice);
    free(host);
    if (status != cudaSuccess)
        return pt_fail(err, "cuda backend: the units' tables: %s",
                       cudaGetErrorString(status));
    p->active = true;
    return 0;
}

void cuda_param_units_close(cuda_param_units *units)
{
    for (int b = 0; b < GRAD_UNIT_BUFFERS; b++) {
        if (units->issued[b] != NULL)
            cudaEventDestroy(units->issued[b]);
        if (units->ready[b] != NULL)
            cudaEventDestroy(units->ready[b]);
    }
    cudaFree(units->block);
    cudaFree(units->tables);
    cudaGetLastError();
    memset(units, 0, sizeof *units);
}

void cuda_param_units_changed(cuda_stage_state *state)
{
    unit_holds_forget(&state->param_units.holds);
}

/* Gathers unit (kind, layer) into its buffers behind the stage's work so
 * far (which includes the last use of those buffers); its buffer is
 * already marked as holding it. */
static int fetch(model_stage *stage, stage_unit_kind kind, int layer,
                 pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_param_units *p = &state->param_units;
    const stage_units *u = &state->layout.units;
    int b = unit_buffer_of(kind, layer);
    size_t first = unit_first_of(u, kind, layer), count = u->count[kind];
    cudaStream_t units = state->grad_units.stream;
    CUDA_TRY(cudaEventRecord(p->issued[b], state->stream));
    CUDA_TRY(cudaStreamWaitEvent(units, p->issued[b], 0));
    size_t end = stage->params_first + stage->params_count;
    size_t lo = first > stage->params_first ? first : stage->params_first;
    size_t hi = first + count < end ? first + count : end;
    if (hi > lo)
        CUDA_TRY(cudaMemcpyAsync(p->buffer[b] + (lo - first),
                                 stage->params + (lo - stage->params_first),
                                 (hi - lo) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, units));
    if (stage->param_source != NULL) {
        void *stream = NULL;
        if (stage->units_on_stream)
            stream = units;
        else /* a comm that blocks: the rank's part first */
            CUDA_TRY(cudaStreamSynchronize(units));
        if (stage->param_source(stage, first, count, p->buffer[b], stream,
                                stage->param_source_context, err) != 0)
            return -1;
    }
    CUDA_TRY(cuda_refresh_mirror(p->mirror[b], p->buffer[b], p->table[kind],
                                 p->table_count[kind], units));
    CUDA_TRY(cudaEventRecord(p->ready[b], units));
    return 0;
}

/* The stage's stream (when `wait`) waits for the unit's gather, fetched
 * where its buffer does not hold it still. */
static int ensure(model_stage *stage, stage_unit_kind kind, int layer,
                  bool wait, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_param_units *p = &state->param_units;
    int b = unit_buffer_of(kind, layer);
    if (unit_holds_claim(&p->holds, kind, layer) &&
        fetch(stage, kind, layer, err) != 0) {
        /* what the buffer holds is unknown now */
        unit_holds_forget(&p->holds);
        return -1;
    }
    if (wait)
        CUDA_TRY(cudaStreamWaitEvent(state->stream, p->ready[b], 0));
    return 0;
}

/* The order of the stage's passes over its units: a tied head multiplies
 * by the token embedding, which then sits in the embeddings' unit. */
static unit_pass_shape pass_shape_of(const model_stage *stage)
{
    const cuda_stage_state *state = state_of(stage);
    bool both = stage->spec.has_head && stage->spec.has_embedding;
    return (unit_pass_shape){
        .has_embedding = stage->spec.has_embedding,
        .has_head = stage->spec.has_head,
        .tied_head = both && state->offsets.head_weight ==
                                 state->offsets.token_embedding,
        .layers = state->layer_count};
}

int cuda_param_pass_begin(model_stage *stage, bool backward, pt_error *err)
{
    if (!stage->params_by_unit)
        return 0;
    if (state_of(stage)->param_units.regather)
        cuda_param_units_changed(state_of(stage));
    unit_pass_shape shape = pass_shape_of(stage);
    /* a backward's tied head reads the embeddings' unit first */
    if (backward && shape.tied_head &&
        ensure(stage, STAGE_UNIT_EMBEDDING, 0, true, err) != 0)
        return -1;
    stage_unit_kind kind;
    int layer;
    if (unit_pass_at(&shape, backward, 0, &kind, &layer))
        return ensure(stage, kind, layer, false, err);
    return 0;
}

int cuda_param_unit_use(model_stage *stage, stage_unit_kind kind, int layer,
                        bool backward, pt_error *err)
{
    if (!stage->params_by_unit)
        return 0;
    if (ensure(stage, kind, layer, true, err) != 0)
        return -1;
    unit_pass_shape shape = pass_shape_of(stage);
    stage_unit_kind next_kind;
    int next_layer;
    int next = unit_pass_index(&shape, backward, kind, layer) + 1;
    if (unit_pass_at(&shape, backward, next, &next_kind, &next_layer))
        return ensure(stage, next_kind, next_layer, false, err);
    return 0;
}

long cuda_stage_param_gathers(const model_stage *stage)
{
    return stage->params_by_unit
               ? state_of(stage)->param_units.holds.gathers
               : 0;
}

const float *cuda_param_at(const model_stage *stage, size_t offset)
{
    if (!stage->params_by_unit)
        return stage->params + offset;
    const cuda_stage_state *state = state_of(stage);
    int buffer = 0;
    size_t place = unit_place_of(&state->layout.units, offset, &buffer);
    return state->param_units.buffer[buffer] + place;
}

pt_bf16 *cuda_mirror_at(const cuda_stage_state *state, size_t offset)
{
    if (!state->param_units.active)
        return state->mirror + mirror_offset(state, offset);
    const stage_units *u = &state->layout.units;
    int layer = 0;
    stage_unit_kind kind = stage_unit_at(u, offset, &layer);
    size_t first = unit_first_of(u, kind, layer);
    return state->param_units.mirror[unit_buffer_of(kind, layer)] +
           (mirror_offset(state, offset) - mirror_offset(state, first));
}
