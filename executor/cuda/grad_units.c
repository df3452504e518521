/*
 * ZeRO-2/3's gradient shard on the cuda backend (cuda_stage.h,
 * "cuda_grad_units"; docs/executor.md, "ZeRO-2 and ZeRO-3"): the rank
 * keeps fp32 gradients for its optimizer shard only, and a backward
 * writes each unit (the head, each layer, the embeddings) into a buffer
 * of that unit's size. As the backward has enqueued a unit, the unit's
 * reduce-scatter over dp (the stage's grad_sink) and the addition of the
 * rank's part into the shard are enqueued on a stream of their own behind
 * an event, so they run while the backward goes on with the unit below
 * (the model is the bucketed overlap of parallel/grad_overlap.c); the
 * layers alternate between two buffers, a buffer reused only once its
 * last reduction is done.
 */
#include "executor/cuda/cuda_stage.h"

#include <string.h>

#include "executor/cuda/cuda_check.h"

int cuda_grad_units_open(cuda_grad_units *units, pt_error *err)
{
    if (cuda_rank_stream_create(&units->stream, err) != 0)
        return -1;
    for (int b = 0; b < GRAD_UNIT_BUFFERS; b++) {
        CUDA_TRY(cudaEventCreateWithFlags(&units->produced[b],
                                          cudaEventDisableTiming));
        CUDA_TRY(cudaEventCreateWithFlags(&units->reduced[b],
                                          cudaEventDisableTiming));
    }
    return 0;
}

void cuda_grad_units_close(cuda_grad_units *units)
{
    if (units->stream != NULL) {
        cudaStreamSynchronize(units->stream);
        cudaStreamDestroy(units->stream);
    }
    for (int b = 0; b < GRAD_UNIT_BUFFERS; b++) {
        if (units->produced[b] != NULL)
            cudaEventDestroy(units->produced[b]);
        if (units->reduced[b] != NULL)
            cudaEventDestroy(units->reduced[b]);
    }
    cudaGetLastError();
    cudaFree(units->block);
    memset(units, 0, sizeof *units);
}

cuda_grad cuda_grad_at(const model_stage *stage, size_t offset)
{
    if (!stage->grads_by_unit) {
        /* llm.c's recipe: the whole buffer in bf16 (never by unit) */
        cuda_grad whole = {stage->grads, stage->grads_bf16};
        return cuda_grad_offset(whole, offset);
    }
    const cuda_stage_state *state = state_of(stage);
    int buffer = 0;
    size_t place = unit_place_of(&state->layout.units, offset, &buffer);
    return cuda_grad_fp32(state->grad_units.buffer[buffer] + place);
}

int cuda_grad_unit_begin(model_stage *stage, stage_unit_kind kind, int layer,
                         pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    size_t count = state->layout.units.count[kind];
    if (!stage->grads_by_unit || count == 0)
        return 0;
    cuda_grad_units *g = &state->grad_units;
    int b = unit_buffer_of(kind, layer);
    if (g->in_flight[b]) {
        CUDA_TRY(cudaStreamWaitEvent(state->stream, g->reduced[b], 0));
        g->in_flight[b] = false;
    }
    CUDA_TRY(cudaMemsetAsync(g->buffer[b], 0, count * sizeof(float),
                             state->stream));
    return 0;
}

/* The rank's part of the unit [first, first + count) added into the
 * shard of grads, on `stream`. */
static int add_part(model_stage *stage, const float *unit, size_t first,
                    size_t count, cudaStream_t stream, pt_error *err)
{
    size_t end = stage->grad_first + stage->grad_count;
    size_t lo = first > stage->grad_first ? first : stage->grad_first;
    size_t hi = first + count < end ? first + count : end;
    if (hi > lo)
        CUDA_TRY(cuda_add_inplace(stage->grads + (lo - stage->grad_first),
                                  unit + (lo - first), hi - lo, stream));
    return 0;
}

int cuda_grad_unit_done(model_stage *stage, stage_unit_kind kind, int layer,
                        pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_units *u = &state->layout.units;
    size_t count = u->count[kind];
    if (!stage->grads_by_unit || count == 0)
        return 0;
    cuda_grad_units *g = &state->grad_units;
    int b = unit_buffer_of(kind, layer);
    size_t first = unit_first_of(u, kind, layer);
    float *unit = g->buffer[b];
    if (!stage->units_on_stream) {
        /* a comm that blocks (or none): the unit's backward first */
        CUDA_TRY(cudaStreamSynchronize(state->stream));
        if (stage->grad_sink != NULL &&
            stage->grad_sink(stage, first, count, unit, NULL,
                             stage->grad_sink_context, err) != 0)
            return -1;
        return add_part(stage, unit, first, count, state->stream, err);
    }
    CUDA_TRY(cudaEventRecord(g->produced[b], state->stream));
    CUDA_TRY(cudaStreamWaitEvent(g->stream, g->produced[b], 0));
    if (stage->grad_sink != NULL &&
        stage->grad_sink(stage, first, count, unit, g->stream,
                         stage->grad_sink_context, err) != 0)
        return -1;
    if (add_part(stage, unit, first, count, g->stream, err) != 0)
        return -1;
    CUDA_TRY(cudaEventRecord(g->reduced[b], g->stream));
    g->in_flight[b] = true;
    return 0;
}

int cuda_grad_units_settle(const model_stage *stage, pt_error *err)
{
    if (!stage->grads_by_unit)
        return 0;
    cuda_stage_state *state = state_of(stage);
    cuda_grad_units *g = &state->grad_units;
    for (int b = 0; b < GRAD_UNIT_BUFFERS; b++)
        if (g->in_flight[b]) {
            CUDA_TRY(cudaStreamWaitEvent(state->stream, g->reduced[b], 0));
            g->in_flight[b] = false;
        }
    return 0;
}
