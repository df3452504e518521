/*
 * ZeRO-2 and ZeRO-3 in one rank's step (parallel/step.c calls these;
 * docs/executor.md, "ZeRO-2 and ZeRO-3"): the gradients reduce-scattered
 * over the dp group after every micro-batch's backward, the rank keeping
 * its shard; the tied embedding's two copies summed from the shards; and
 * under ZeRO-3 the parameters gathered before each forward and backward
 * and released (zeroed outside the rank's shard) after. Any backend,
 * over the comm interface. A backend that keeps only the shard's
 * gradients (grads_by_unit: the cpu one, and the cuda one on its own
 * stream when the comm has stream-ordered collectives) hands each unit of
 * a backward to zero_reduce_unit; a stage keeping a whole-sized buffer
 * (the cuda backend's tied embedding pair) is reduced after the
 * backward. Likewise under ZeRO-3 a backend keeping the parameters'
 * shard only (params_by_unit) gathers each unit through
 * zero_gather_unit; the others gather the whole stage and release it
 * (zeroed outside the shard, not freed).
 */
#include "executor/parallel/internal.h"

#include <stdlib.h>

/* Zeroes buffer `which` outside the rank's optimizer shard. */
static int zero_outside_shard(model_stage *stage, stage_buffer which,
                              pt_error *err)
{
    size_t end = stage->optimizer_first + stage->optimizer_count;
    return model_stage_zero_range(stage, which, 0, stage->optimizer_first,
                                  err) != 0 ||
                   model_stage_zero_range(stage, which, end,
                                          stage->param_count - end, err) != 0
               ? -1
               : 0;
}

/* Where each of the dp runs `offsets` starts within [lo, hi), counted
 * from lo: the chunks of that range's collective. */
static size_t *chunks_within(const size_t *offsets, int dp, size_t lo,
                             size_t hi, pt_error *err)
{
    size_t *chunks = malloc(((size_t)dp + 1) * sizeof *chunks);
    if (chunks == NULL) {
        pt_fail(err, "out of memory for a group of %d", dp);
        return NULL;
    }
    for (int i = 0; i <= dp; i++) {
        size_t at = offsets[i] < lo ? lo : offsets[i] > hi ? hi : offsets[i];
        chunks[i] = at - lo;
    }
    return chunks;
}

/* One unit over the dp group's runs: reduce-scattered (the gradients)
 * or all-gathered (the weights), in place; enqueued on `stream` when it
 * is given (the comm then has stream-ordered collectives), else done on
 * return. */
static int unit_collective(size_t first, size_t count, float *unit,
                           void *stream, const zero_unit_group *g,
                           bool gather, pt_error *err)
{
    size_t *chunks = chunks_within(g->offsets, g->dp, first, first + count,
                                   err);
    if (chunks == NULL)
        return -1;
    int status;
    if (stream != NULL)
        status = gather ? comm_all_gather_on_stream(g->c, g->group, g->dp,
                                                    unit, chunks,
                                                    COMM_FLOAT32, stream,
                                                    err)
                        : comm_reduce_scatter_on_stream(g->c, g->group,
                                                        g->dp, unit, chunks,
                                                        COMM_FLOAT32, stream,
                                                        err);
    else
        status = gather ? comm_all_gather(g->c, g->group, g->dp, unit,
                                          chunks, err)
                        : comm_reduce_scatter_sum(g->c, g->group, g->dp,
                                                  unit, chunks, err);
    free(chunks);
    return status;
}

int zero_reduce_unit(model_stage *stage, size_t first, size_t count,
                     float *unit, void *stream, void *context, pt_error *err)
{
    (void)stage;
    return unit_collective(first, count, unit, stream, context, false, err);
}

int zero_gather_unit(model_stage *stage, size_t first, size_t count,
                     float *unit, void *stream, void *context, pt_error *err)
{
    (void)stage;
    return unit_collective(first, count, unit, stream, context, true, err);
}

/* The gradients of one micro-batch, added on top of the shard's earlier
 * sums (the rest of the buffer held zeros before this backward), are
 * reduce-scattered bucket by bucket: the shard then holds the sum over
 * the replicas and the micro-batches so far; the rest is zeroed for the
 * next backward to add to. */
int zero_reduce_micro_batch(const comm *c, const int *group, int dp,
                            const size_t *offsets,
                            const pipeline_buckets *buckets,
                            model_stage *stage, pt_error *err)
{
    pipeline_bucket whole = {.offset = 0, .count = stage->param_count};
    int count = buckets != NULL ? buckets->count : 1;
    for (int b = 0; b < count; b++)
        if (pipeline_reduce_bucket(c, group, dp, stage,
                                   buckets != NULL ? buckets->buckets[b]
                                                   : whole,
                                   offsets, NULL, err) != 0)
            return -1;
    return zero_outside_shard(stage, STAGE_GRADS, err);
}

/* The tied embedding's gradient on the first stage and its copy's on the
 * last, each held in shards cut from different buffers: each stage's dp
 * group gathers its tensor whole, then each first-stage replica and its
 * last-stage partner sum the two (or, the two stages running different
 * degrees, pipeline_tied_sum sums them). */
/* The tied tensor whole in `whole` (backend memory; the shard's part of it
 * read from grads when they hold the shard only), gathered over the dp
 * group and summed with the partner's. */
static int tied_gather_and_sum(const comm *c, const int *group, int dp,
                               const size_t *offsets, const int *pair,
                               const pipeline_layout *layout,
                               model_stage *stage,
                               const param_tensor *tensor, float *whole,
                               pt_error *err)
{
    size_t lo = tensor->offset, hi = lo + tensor->count;
    size_t *chunks = chunks_within(offsets, dp, lo, hi, err);
    if (chunks == NULL)
        return -1;
    int status = comm_all_gather(c, group, dp, whole, chunks, err);
    free(chunks);
    if (status != 0)
        return -1;
    if (pair == NULL)
        return pipeline_tied_sum(c, layout, stage, whole, false, err);
    return comm_all_reduce_sum(c, pair, 2, whole, tensor->count, err);
}

int zero_tied_embedding(const comm *c, const int *group, int dp,
                        const size_t *offsets, const int *pair,
                        const pipeline_layout *layout, model_stage *stage,
                        const param_tensor *tensor, pt_error *err)
{
    if (stage->grads_bf16)
        return pt_fail(err, "the tied embedding's sum over sharded "
                            "gradients is fp32 only, not grad_precision "
                            "bf16");
    if (!stage->grads_by_unit)
        return tied_gather_and_sum(c, group, dp, offsets, pair, layout,
                                   stage, tensor,
                                   stage->grads + tensor->offset, err);
    /* the cpu backend's host memory: the tensor whole for the while */
    size_t lo = tensor->offset, hi = lo + tensor->count;
    size_t end = stage->grad_first + stage->grad_count;
    size_t from = lo > stage->grad_first ? lo : stage->grad_first;
    size_t to = hi < end ? hi : end;
    size_t mine = to > from ? to - from : 0;
    if (mine == 0) /* no part of it is this rank's */
        from = lo;
    float *whole = calloc(tensor->count + 1, sizeof *whole);
    if (whole == NULL)
        return pt_fail(err, "out of memory for the tied embedding's %zu "
                            "gradients",
                       tensor->count);
    int status =
        (mine > 0 && model_stage_read_range(stage, STAGE_GRADS, from, mine,
                                            whole + (from - lo), err) != 0) ||
                tied_gather_and_sum(c, group, dp, offsets, pair, layout,
                                    stage, tensor, whole, err) != 0 ||
                (mine > 0 &&
                 model_stage_write_range(stage, STAGE_GRADS, from, mine,
                                         whole + (from - lo), err) != 0)
            ? -1
            : 0;
    free(whole);
    return status;
}

int zero_gather_parameters(const comm *c, const int *group, int dp,
                           const size_t *offsets, model_stage *stage,
                           pt_error *err)
{
    if (stage->params_by_unit) /* gathered unit by unit */
        return 0;
    if (comm_all_gather(c, group, dp, stage->params, offsets, err) != 0)
        return -1;
    return stage_params_changed(stage, err);
}

int zero_release_parameters(model_stage *stage, pt_error *err)
{
    if (stage->params_by_unit)
        return 0;
    return zero_outside_shard(stage, STAGE_PARAMS, err);
}
