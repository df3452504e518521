/*
 * Plans whose stages run their own tp and dp (issue 36; docs/cost-model.md,
 * "Stages of their own degrees"): each stage's config and first GPU, and
 * the re-sharding at a boundary between stages of different degrees,
 * where the activation (forward) and its gradient (backward) are split
 * or merged over the replicas and gathered over the receiving tp group.
 * A boundary between stages of the same degrees is priced as in a
 * symmetric plan (stage.c), so that a plan whose stages all share their
 * degrees estimates exactly what the symmetric plan does.
 */
#include <math.h>
#include <stddef.h>

#include "costmodel/internal.h"

/* "plan: stage 2: " before err's message (asymmetric plans only: a
 * symmetric plan's messages stay as they were). */
static int stage_fail(pt_error *err, bool asymmetric, int stage)
{
    if (asymmetric)
        pt_error_prefix(err, "plan: stage %d", stage);
    return -1;
}

size_t costmodel_stage_configs_bytes(int pp)
{
    size_t align = _Alignof(max_align_t);
    return ((size_t)pp * sizeof(parallel_config) + align - 1) / align * align;
}

int costmodel_stage_configs(const costmodel *cm,
                            const parallel_config *config,
                            const stage_degrees *stages,
                            parallel_config *configs, long long *firsts,
                            pt_error *err)
{
    bool asymmetric = stage_degrees_first_own(config, stages) >= 0;
    long long samples = (long long)config->dp * config->mbs;
    firsts[0] = 0;
    for (int s = 0; s < config->pp; s++) {
        configs[s] = parallel_stage_config(config, stages, s);
        const parallel_config *own = &configs[s];
        if (asymmetric && (own->tp <= 0 || own->dp <= 0 ||
                           samples % own->dp != 0))
            return pt_fail(err, "plan: stage %d: dp %d does not split the "
                           "micro-batch of dp x mbs = %lld samples", s,
                           own->dp, samples);
        if (costmodel_check_degrees(own, err) != 0 ||
            model_check_tp(&cm->model, own->tp, err) != 0)
            return stage_fail(err, asymmetric, s);
        if (asymmetric &&
            parallel_check_schedule_levers(own, cm->model.seq, err) != 0)
            return stage_fail(err, asymmetric, s);
        if (asymmetric && parallel_virtual_stages(config) > 1)
            return pt_fail(err, "plan: stage %d has its own tp or dp, which "
                           "the interleaved 1F1B (virtual_stages %d) does "
                           "not take", s, parallel_virtual_stages(config));
        firsts[s + 1] = firsts[s] + (long long)own->tp * own->dp;
    }
    return 0;
}

double costmodel_reshard_seconds(const costmodel *cm,
                                 const parallel_config *from,
                                 const parallel_config *to, int curve_type,
                                 link_spec link, link_spec gather)
{
    /* the micro-batch's activation: dp x mbs samples, the same from
       either side */
    double whole = activation_message_bytes(&cm->model, from) * from->dp;
    double senders = (double)from->tp * from->dp;
    double receivers = (double)to->tp * to->dp;
    /* every receiving GPU takes 1/tp of its replica's slice (its
       sequence shard under sequence parallelism), every sending GPU
       gives an equal share of the whole; the busier side paces it */
    double piece = whole / receivers;
    double share = whole / senders;
    double bytes = piece > share ? piece : share;
    /* in as many messages as one side outnumbers the other */
    double ratio = senders > receivers ? senders / receivers
                                       : receivers / senders;
    double messages = ceil(ratio);
    double seconds = messages * costmodel_send_seconds(cm, bytes / messages,
                                                       curve_type, link);
    /* the receiving tp group all-gathers its replica's slice (under
       sequence parallelism each rank keeps its shard) */
    if (to->tp > 1 && !to->sequence_parallel)
        seconds += reduce_scatter_time(whole / to->dp, to->tp, gather);
    return seconds;
}
