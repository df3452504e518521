/*
 * A stage's gradient reduction over its dp group: priced as NCCL runs it
 * over the group's nodes (collectives.c) or from the profile's measured
 * curve, and, when dp overlap is on, how much of it the backward of the
 * last micro-batch hides, bucket by bucket (docs/cost-model.md, 7.1).
 */
#include <math.h>

#include "costmodel/internal.h"

dp_overlap_options dp_overlap_defaults(void)
{
    return (dp_overlap_options){.enabled = false,
                                .bucket_bytes = 25.0 * 1024 * 1024,
                                .hidden_fraction = 1.0};
}

static double clamped_fraction(double fraction)
{
    return fraction < 0.0 ? 0.0 : fraction > 1.0 ? 1.0 : fraction;
}

double costmodel_dp_overlap_floor_share(const costmodel *cm)
{
    if (!cm->dp_overlap.enabled)
        return 0.0;
    return 1.0 - clamped_fraction(cm->dp_overlap.hidden_fraction);
}

/* The stage's dp group as collectives.c reads it. */
static comm_group dp_group(const parallel_config *config,
                           const stage_placement *place)
{
    if (place->dp_nodes == 1)
        return (comm_group){config->dp, 1, place->dp_intra_link,
                            place->dp_link};
    if (place->dp_nodes >= 2)
        return (comm_group){config->dp, place->dp_nodes,
                            place->dp_intra_link, place->dp_link};
    /* spread unevenly: every member on a node of its own, over the
       slowest link */
    return (comm_group){config->dp, config->dp, place->dp_link,
                        place->dp_link};
}

double costmodel_dp_reduce_seconds(const costmodel *cm,
                                   const parallel_config *config,
                                   const stage_placement *place,
                                   double bytes, bool scatter)
{
    if (config->dp <= 1 || bytes <= 0.0)
        return 0.0;
    /* a measured curve prices a group inside one node of its type */
    if (place->dp_curve_type >= 0) {
        return scatter ? costmodel_reduce_scatter_seconds(
                             cm, bytes, config->dp, place->dp_curve_type,
                             place->dp_link)
                       : costmodel_allreduce_seconds(cm, bytes, config->dp,
                                                     place->dp_curve_type,
                                                     place->dp_link);
    }
    comm_group group = dp_group(config, place);
    return scatter ? nccl_reduce_scatter(bytes, &group)
                   : nccl_allreduce(bytes, &group).seconds;
}

double costmodel_dp_gather_seconds(const costmodel *cm,
                                   const parallel_config *config,
                                   const stage_placement *place,
                                   double bytes)
{
    if (config->dp <= 1 || bytes <= 0.0)
        return 0.0;
    if (place->dp_curve_type >= 0)
        return costmodel_all_gather_seconds(cm, bytes, config->dp,
                                            place->dp_curve_type,
                                            place->dp_link);
    /* a ring all-gather moves what the ring reduce-scatter moves */
    comm_group group = dp_group(config, place);
    return nccl_reduce_scatter(bytes, &group);
}

/* The buckets' reductions on one stream, in the order their gradients
 * are ready during the last backward: a bucket closes when it holds
 * bucket_bytes, or at the end. Returns the seconds after the backward's
 * end that the last one finishes (0 when all are hidden); *total gets
 * the sum of the buckets' times. */
static double bucketed_tail(const costmodel *cm,
                            const parallel_config *config,
                            const stage_placement *place,
                            const dp_backward *backward, double *total)
{
    double bucket_bytes = cm->dp_overlap.bucket_bytes > 0.0
                              ? cm->dp_overlap.bucket_bytes
                              : HUGE_VAL;
    bool scatter = config->distributed_optimizer;
    double stream_free = 0.0, filled = 0.0, now = 0.0;
    *total = 0.0;
    /* head's gradients first (last stage), then the layers from the
       last, then what the embedding holds: the fixed parameters */
    int parts = backward->layers + 1;
    for (int i = 0; i <= parts; i++) {
        double bytes = 0.0;
        if (i == 0) {
            now = backward->head_s;
            bytes = backward->first ? 0.0 : backward->fixed_bytes;
        } else if (i <= backward->layers) {
            now += backward->layer_s;
            bytes = backward->layer_bytes;
        } else {
            now += backward->embedding_s;
            bytes = backward->first ? backward->fixed_bytes : 0.0;
        }
        filled += bytes;
        bool last = i == parts;
        if (filled <= 0.0 || (!last && filled < bucket_bytes))
            continue;
        double seconds = costmodel_dp_reduce_seconds(cm, config, place,
                                                     filled, scatter);
        stream_free = fmax(stream_free, now) + seconds;
        *total += seconds;
        filled = 0.0;
    }
    return fmax(0.0, stream_free - now);
}

double costmodel_dp_exposed_seconds(const costmodel *cm,
                                    const parallel_config *config,
                                    const stage_placement *place,
                                    const dp_backward *backward,
                                    double reduce_s)
{
    if (!cm->dp_overlap.enabled || config->dp <= 1 || reduce_s <= 0.0)
        return reduce_s;
    double total;
    double tail = bucketed_tail(cm, config, place, backward, &total);
    double hidden = total - tail;
    return total - clamped_fraction(cm->dp_overlap.hidden_fraction) * hidden;
}
