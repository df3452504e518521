/*
 * ZeRO-2 and ZeRO-3 in one rank's step (parallel/step.c calls these;
 * docs/executor.md, "ZeRO-2 and ZeRO-3"): the gradients reduce-scattered
 * over the dp group after every micro-batch's backward, the rank keeping
 * its shard; the tied embedding's two copies summed from the shards; and
 * under ZeRO-3 the parameters gathered before each forward and backward
 * and released (zeroed outside the rank's shard) after. Any backend,
 * over the comm interface; the buffers stay whole-sized (what is
 * released is zeroed, not freed).
 */
#include "executor/parallel/parallel.h"

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
        if (pipeline_reduce_bucket(c, group, dp, stage->grads,
                                   buckets != NULL ? buckets->buckets[b]
                                                   : whole,
                                   offsets, NULL, err) != 0)
            return -1;
    return zero_outside_shard(stage, STAGE_GRADS, err);
}

/* The tied embedding's gradient on the first stage and its copy's on the
 * last, each held in shards cut from different buffers: each stage's dp
 * group gathers its tensor whole, then each first-stage replica and its
 * last-stage partner sum the two. */
int zero_tied_embedding(const comm *c, const int *group, int dp,
                        const size_t *offsets, const int pair[2],
                        model_stage *stage, const param_tensor *tensor,
                        pt_error *err)
{
    size_t *chunks = malloc(((size_t)dp + 1) * sizeof *chunks);
    if (chunks == NULL)
        return pt_fail(err, "out of memory for a group of %d", dp);
    size_t lo = tensor->offset, hi = lo + tensor->count;
    for (int i = 0; i <= dp; i++) {
        size_t at = offsets[i] < lo ? lo : offsets[i] > hi ? hi : offsets[i];
        chunks[i] = at - lo;
    }
    int status = comm_all_gather(c, group, dp, stage->grads + lo, chunks,
                                 err);
    free(chunks);
    if (status != 0)
        return -1;
    return comm_all_reduce_sum(c, pair, 2, stage->grads + lo, tensor->count,
                               err);
}

int zero_gather_parameters(const comm *c, const int *group, int dp,
                           const size_t *offsets, model_stage *stage,
                           pt_error *err)
{
    if (comm_all_gather(c, group, dp, stage->params, offsets, err) != 0)
        return -1;
    return stage_params_changed(stage, err);
}

int zero_release_parameters(model_stage *stage, pt_error *err)
{
    return zero_outside_shard(stage, STAGE_PARAMS, err);
}
