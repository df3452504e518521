/*
 * The tied embedding between a first and a last stage of different
 * degrees (issue 36): the token embedding's gradient on the first stage
 * and its tied copy's on the last are one tensor, but their shards cut
 * the vocabulary differently (each stage's tp) and their replicas may
 * differ in number (each stage's dp). Replica d of each stage, for d
 * below the smaller dp, sums pairwise with replica d of the other the
 * rows it shares with each shard of it; the stage of more replicas then
 * hands replica 0's rows to the others. docs/executor.md ("Stages of
 * their own degrees").
 */
#include "executor/parallel/internal.h"

#include <stdlib.h>

/* Sums count elements over the pair, in place: fp32 through the blocking
 * collective, bf16 on the stage's stream (as grad_sync.c's). */
static int sum_pair(const comm *c, const int pair[2], void *data,
                    size_t count, model_stage *stage, bool bf16,
                    pt_error *err)
{
    if (!bf16)
        return comm_all_reduce_sum(c, pair, 2, data, count, err);
    return comm_all_reduce_on_stream(c, pair, 2, data, count,
                                     COMM_BFLOAT16, COMM_SUM, stage->stream,
                                     err) != 0 ||
                   comm_wait_stream(c, stage->stream,
                                    "the tied embedding's bf16 sum",
                                    err) != 0
               ? -1
               : 0;
}

/* Member 0's count elements to every member of the group, in place: an
 * all-gather whose chunks are all member 0's. */
static int give_from_first(const comm *c, const int *group, int size,
                           void *data, size_t count, model_stage *stage,
                           bool bf16, pt_error *err)
{
    size_t *chunks = malloc(((size_t)size + 1) * sizeof *chunks);
    if (chunks == NULL)
        return pt_fail(err, "out of memory for a group of %d", size);
    chunks[0] = 0;
    for (int i = 1; i <= size; i++)
        chunks[i] = count;
    int status =
        !bf16 ? comm_all_gather(c, group, size, data, chunks, err)
        : comm_all_gather_on_stream(c, group, size, data, chunks,
                                    COMM_BFLOAT16, stage->stream,
                                    err) != 0 ||
                comm_wait_stream(c, stage->stream,
                                 "the tied embedding's bf16 rows", err) != 0
            ? -1
            : 0;
    free(chunks);
    return status;
}

int pipeline_tied_sum(const comm *c, const pipeline_layout *layout,
                      model_stage *stage, void *data, bool bf16,
                      pt_error *err)
{
    int rank = c->rank, last = layout->stage_count - 1;
    int s = pipeline_rank_stage(layout, rank);
    int other = s == 0 ? last : 0;
    int t = pipeline_rank_tp(layout, rank);
    size_t hidden = (size_t)layout->shape.hidden;
    size_t element = bf16 ? 2 : sizeof(float);
    int mine = 0, mine_count = 0;
    stage_vocab_shard(layout->shape.vocab, layout->stage_tp[s], t, &mine,
                      &mine_count);
    /* the replicas with a twin: every segment, in row order (both ends
     * of a segment reach it after the same earlier ones: no two wait on
     * each other) */
    int replica = pipeline_rank_replica(layout, rank);
    int twins = layout->stage_dp[0] < layout->stage_dp[last]
                    ? layout->stage_dp[0]
                    : layout->stage_dp[last];
    for (int u = 0; replica < twins && u < layout->stage_tp[other]; u++) {
        int first = 0, count = 0;
        int first_tp = s == 0 ? t : u, last_tp = s == 0 ? u : t;
        pipeline_tied_segment(layout, first_tp, last_tp, &first, &count);
        if (count == 0)
            continue;
        int pair[2] = {pipeline_rank_of(layout, 0, replica, first_tp),
                       pipeline_rank_of(layout, last, replica, last_tp)};
        char *rows = (char *)data + (size_t)(first - mine) * hidden * element;
        if (sum_pair(c, pair, rows, (size_t)count * hidden, stage, bf16,
                     err) != 0)
            return -1;
    }
    int dp = layout->stage_dp[s];
    if (dp == twins)
        return 0;
    int *group = malloc((size_t)dp * sizeof *group);
    if (group == NULL)
        return pt_fail(err, "out of memory for a group of %d", dp);
    for (int d = 0; d < dp; d++)
        group[d] = pipeline_rank_of(layout, s, d, t);
    int status = give_from_first(c, group, dp, data,
                                 (size_t)mine_count * hidden, stage, bf16,
                                 err);
    free(group);
    return status;
}
