/*
 * The pipeline boundary of one rank: the messages it exchanges with a
 * neighbouring stage, one part to its twin when both stages run the same
 * degrees, or re-sharded between stages of their own tp and dp (issue
 * 36): split or merged micro-batches and activations scattered over, or
 * gathered from, tensor-parallel shards. Also the samples each replica's
 * micro-batches hold. docs/executor.md ("Stages of their own degrees").
 */
#include "executor/parallel/internal.h"

#include <stdlib.h>
#include <string.h>

/* The twin's one part: the symmetric plan's message. */
static int open_symmetric(pipeline_boundary *out,
                          const pipeline_layout *layout, int rank,
                          int neighbour, size_t held_offset,
                          size_t held_count, pt_error *err)
{
    out->parts = malloc(sizeof *out->parts);
    if (out->parts == NULL)
        return pt_fail(err, "pipeline runtime: out of memory for a "
                            "boundary");
    out->parts[0] = (boundary_part){
        .peer = pipeline_rank_of(layout, neighbour,
                                 pipeline_rank_replica(layout, rank),
                                 pipeline_rank_tp(layout, rank)),
        .offset = held_offset,
        .count = held_count};
    out->count = 1;
    return 0;
}

/* Every rank of the neighbour whose boundary rows meet this rank's, in
 * rank order, at their place in the rank's buffer (which starts at its
 * replica's first row, or at its own first row when packed). */
static int open_resharded(pipeline_boundary *out,
                          const pipeline_layout *layout, int rank,
                          int neighbour, bool packed, pt_error *err)
{
    int first = layout->first_rank[neighbour];
    int ranks = layout->first_rank[neighbour + 1] - first;
    out->parts = malloc((size_t)ranks * sizeof *out->parts);
    if (out->parts == NULL)
        return pt_fail(err, "pipeline runtime: out of memory for a "
                            "boundary of %d parts",
                       ranks);
    int stage = pipeline_rank_stage(layout, rank);
    size_t hidden = (size_t)layout->shape.hidden;
    size_t mine = 0, mine_count = 0;
    pipeline_boundary_rows(layout, rank, &mine, &mine_count);
    size_t rows = (size_t)layout->stage_mbs[stage] * layout->shape.seq;
    size_t buffer_first =
        packed ? mine
               : (size_t)pipeline_rank_replica(layout, rank) * rows;
    for (int peer = first; peer < first + ranks; peer++) {
        size_t theirs = 0, theirs_count = 0;
        pipeline_boundary_rows(layout, peer, &theirs, &theirs_count);
        size_t lo = mine > theirs ? mine : theirs;
        size_t hi_mine = mine + mine_count, hi_theirs = theirs + theirs_count;
        size_t hi = hi_mine < hi_theirs ? hi_mine : hi_theirs;
        if (hi <= lo)
            continue;
        out->parts[out->count++] = (boundary_part){
            .peer = peer,
            .offset = (lo - buffer_first) * hidden,
            .count = (hi - lo) * hidden};
    }
    int tp = layout->stage_tp[stage];
    out->gather = tp > 1 && !layout->config.sequence_parallel;
    out->tp = tp;
    out->tp_first = rank - pipeline_rank_tp(layout, rank);
    out->rows = rows;
    out->row_floats = hidden;
    return 0;
}

int pipeline_boundary_open(pipeline_boundary *out,
                           const pipeline_layout *layout, int rank,
                           int neighbour, size_t held_offset,
                           size_t held_count, bool packed, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (neighbour < 0 || neighbour >= layout->stage_count)
        return 0;
    int stage = pipeline_rank_stage(layout, rank);
    if (pipeline_same_degrees(layout, stage, neighbour))
        return open_symmetric(out, layout, rank, neighbour, held_offset,
                              held_count, err);
    return open_resharded(out, layout, rank, neighbour, packed, err);
}

void pipeline_boundary_close(pipeline_boundary *boundary)
{
    free(boundary->parts);
    memset(boundary, 0, sizeof *boundary);
}

int pipeline_boundary_send(const comm *c, const pipeline_boundary *boundary,
                           int tag, const float *data, pt_error *err)
{
    for (int i = 0; i < boundary->count; i++) {
        const boundary_part *part = &boundary->parts[i];
        if (comm_send(c, part->peer, tag, data + part->offset, part->count,
                      err) != 0)
            return -1;
    }
    return 0;
}

/* Each shard's rows of its replica to every shard of it, in place. */
static int gather_rows(const comm *c, const pipeline_boundary *boundary,
                       float *data, pt_error *err)
{
    int group[PT_MAX_TP];
    size_t offsets[PT_MAX_TP + 1];
    for (int t = 0; t <= boundary->tp; t++) {
        if (t < boundary->tp)
            group[t] = boundary->tp_first + t;
        offsets[t] = boundary->rows * (size_t)t / (size_t)boundary->tp *
                     boundary->row_floats;
    }
    return comm_all_gather(c, group, boundary->tp, data, offsets, err);
}

int pipeline_boundary_recv(const comm *c, const pipeline_boundary *boundary,
                           int tag, float *data, pt_error *err)
{
    for (int i = 0; i < boundary->count; i++) {
        const boundary_part *part = &boundary->parts[i];
        if (comm_recv(c, part->peer, tag, data + part->offset, part->count,
                      err) != 0)
            return -1;
    }
    return boundary->gather ? gather_rows(c, boundary, data, err) : 0;
}

/* ----------------------------------------------------- a replica's samples */

const uint32_t *pipeline_replica_tokens(const pipeline_layout *layout,
                                        int stage, int replica,
                                        const uint32_t *tokens,
                                        uint32_t **owned, pt_error *err)
{
    const parallel_config *config = &layout->config;
    size_t window = (size_t)layout->shape.seq + 1;
    size_t replica_windows = (size_t)(config->gbs / config->dp);
    *owned = NULL;
    if (layout->stage_dp[stage] == config->dp)
        return tokens + (size_t)replica * replica_windows * window;
    size_t mbs = (size_t)config->mbs, own = (size_t)layout->stage_mbs[stage];
    size_t m = (size_t)layout->micro_batches;
    *owned = malloc(m * own * window * sizeof **owned);
    if (*owned == NULL) {
        pt_fail(err, "pipeline runtime: out of memory for %zu windows",
                m * own);
        return NULL;
    }
    for (size_t j = 0; j < m; j++)
        for (size_t i = 0; i < own; i++) {
            size_t p = (size_t)replica * own + i;
            size_t source = p / mbs * replica_windows + j * mbs + p % mbs;
            memcpy(*owned + (j * own + i) * window, tokens + source * window,
                   window * sizeof **owned);
        }
    return *owned;
}
