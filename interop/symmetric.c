/*
 * Plans whose stages run their own tp or dp (issue 36) cannot be handed
 * to Megatron-LM or DeepSpeed, which run one tp and one dp for every
 * pipeline stage: the export refuses them naming the stage, or, when
 * asked, exports the nearest symmetric plan (docs/interop.md, "Stages of
 * their own degrees").
 */
#include "interop/interop.h"

#include <stdio.h>
#include <stdlib.h>

int interop_check_symmetric(const plan *p, interop_target target,
                            pt_error *err)
{
    int own = plan_first_asymmetric_stage(p);
    if (own < 0)
        return 0;
    parallel_config stage = parallel_stage_config(&p->config, p->stages, own);
    return pt_fail(err, "stages[%d]: tp %d x dp %d is its own (the plan's: "
                   "tp %d x dp %d): %s runs one tp and one dp for every "
                   "stage; export --symmetric writes the nearest symmetric "
                   "plan",
                   own, stage.tp, stage.dp, p->config.tp, p->config.dp,
                   interop_target_title(target));
}

/* How far the symmetric tp x dp is from the stages' own: stages whose tp
 * would change, then those whose dp would (lower is nearer). */
static void distance(const plan *p, int tp, int dp, int *tp_changes,
                     int *dp_changes)
{
    *tp_changes = 0;
    *dp_changes = 0;
    for (int s = 0; s < p->config.pp; s++) {
        parallel_config own = parallel_stage_config(&p->config, p->stages, s);
        *tp_changes += own.tp != tp;
        *dp_changes += own.dp != dp;
    }
}

/* The nearest (tp, dp): tp x dp x pp the plan's GPUs, tp splitting the
 * model's attention heads, dp splitting the global batch; the fewest stages
 * changing their tp, then their dp, then the smaller tp. 0 when none. */
static int nearest_degrees(const plan *p, int gpus, int *tp_out, int *dp_out)
{
    int per_stage = gpus / p->config.pp;
    int best_tp_changes = 0, best_dp_changes = 0;
    *tp_out = 0;
    for (int tp = 1; tp <= per_stage; tp++) {
        /* both trainers split the attention heads over tp, GPT-2's too */
        if (per_stage % tp != 0 || p->model.heads % tp != 0 ||
            model_check_tp(&p->model, tp, NULL) != 0 ||
            p->config.gbs % (per_stage / tp) != 0)
            continue;
        int tp_changes, dp_changes;
        distance(p, tp, per_stage / tp, &tp_changes, &dp_changes);
        if (*tp_out == 0 || tp_changes < best_tp_changes ||
            (tp_changes == best_tp_changes && dp_changes < best_dp_changes)) {
            *tp_out = tp;
            *dp_out = per_stage / tp;
            best_tp_changes = tp_changes;
            best_dp_changes = dp_changes;
        }
    }
    return *tp_out;
}

/* The micro-batch of the symmetric plan: the plan's samples a micro-batch
 * (dp x mbs) over dp when dp divides them, so that every micro-batch
 * stays as it was; else 1. */
static int nearest_mbs(const plan *p, int dp)
{
    long long samples = (long long)p->config.dp * p->config.mbs;
    return samples % dp == 0 ? (int)(samples / dp) : 1;
}

int interop_nearest_symmetric(const plan *p, const char *plan_file,
                              plan *out, char *said, size_t said_size,
                              pt_error *err)
{
    int gpus = plan_gpu_count(p);
    int tp = 0, dp = 0;
    if (gpus % p->config.pp != 0 || nearest_degrees(p, gpus, &tp, &dp) == 0)
        return pt_fail(err, "stages: no symmetric plan keeps the %d stages "
                       "on the %d GPUs of node_order (tp x dp x pp must "
                       "fill them, tp split the model's heads and dp the "
                       "global batch of %d)", p->config.pp, gpus,
                       p->config.gbs);
    int mbs = nearest_mbs(p, dp);
    json_t *root = plan_to_json(p, NULL, err);
    if (root == NULL)
        return -1;
    int failures = json_object_del(root, "stages") != 0;
    json_put(root, "tp", json_integer(tp), &failures);
    json_put(root, "dp", json_integer(dp), &failures);
    json_put(root, "mbs", json_integer(mbs), &failures);
    int status = failures == 0
                     ? plan_from_json(root, plan_file, out, err)
                     : pt_fail(err, "out of memory building the symmetric "
                                    "plan");
    json_decref(root);
    if (status != 0)
        return -1;
    int tp_changes, dp_changes;
    distance(p, tp, dp, &tp_changes, &dp_changes);
    snprintf(said, said_size,
             "the nearest symmetric plan: tp %d x dp %d at every stage (%d "
             "of %d stages change their tp, %d their dp), mbs %d, %d "
             "micro-batches; layers per stage and node order kept",
             tp, dp, tp_changes, p->config.pp, dp_changes, mbs,
             parallel_microbatches(&out->config));
    return 0;
}
