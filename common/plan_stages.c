/* plan.json's "stages": each pipeline stage's own tensor- and
 * data-parallel degrees (issue 36), read, checked and written here for
 * common/plan.c, the format's owner, the per-stage configs every
 * layer derives from them, and whether each stage's tp splits the model
 * as exec needs.
 *
 * The plan-wide tp and dp stay the default, so a plan without the key
 * means what it always meant. Every stage runs the plan's micro-batches
 * (gbs / (dp x mbs), with the plan-wide dp and mbs); a stage with its own
 * dp splits each micro-batch of dp x mbs samples over its replicas. */
#include "common/common.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *const stage_keys[] = {"tp", "dp", NULL};

static stage_degrees resolved(const parallel_config *config,
                              const stage_degrees *stages, int stage)
{
    stage_degrees own = stages != NULL ? stages[stage]
                                       : (stage_degrees){0, 0};
    return (stage_degrees){own.tp > 0 ? own.tp : config->tp,
                           own.dp > 0 ? own.dp : config->dp};
}

parallel_config parallel_stage_config(const parallel_config *config,
                                      const stage_degrees *stages, int stage)
{
    parallel_config out = *config;
    stage_degrees degrees = resolved(config, stages, stage);
    if (degrees.tp == config->tp && degrees.dp == config->dp)
        return out;
    out.tp = degrees.tp;
    out.dp = degrees.dp;
    /* the pipeline micro-batch of dp x mbs samples, split over the
       stage's replicas */
    long long samples = (long long)config->dp * config->mbs;
    out.mbs = degrees.dp > 0 ? (int)(samples / degrees.dp) : config->mbs;
    return out;
}

int stage_degrees_first_own(const parallel_config *config,
                            const stage_degrees *stages)
{
    for (int s = 0; stages != NULL && s < config->pp; s++) {
        stage_degrees degrees = resolved(config, stages, s);
        if (degrees.tp != config->tp || degrees.dp != config->dp)
            return s;
    }
    return -1;
}

int stage_degrees_ranks(const parallel_config *config,
                        const stage_degrees *stages, int stage)
{
    stage_degrees degrees = resolved(config, stages, stage);
    return degrees.tp * degrees.dp;
}

int stage_degrees_first_rank(const parallel_config *config,
                             const stage_degrees *stages, int stage)
{
    if (stage_degrees_first_own(config, stages) < 0)
        return parallel_stage_first_rank(config, stage);
    int first = 0;
    for (int s = 0; s < stage; s++)
        first += stage_degrees_ranks(config, stages, s);
    return first;
}

int plan_first_asymmetric_stage(const plan *p)
{
    return stage_degrees_first_own(&p->config, p->stages);
}

/* exec cuts each stage's heads, MLP columns and vocabulary over tp, and
 * grouped-query attention's key/value heads whole groups to a shard:
 * Megatron-LM copies them when there are fewer than tp, exec does not
 * (issue 35). The cost model prices any tp of a GPT-2 model, as FASOP
 * prices GPT-2 XL's 25 heads. */
int plan_check_tp_split(const plan *p, pt_error *err)
{
    const model_shape *m = &p->model;
    int kv = model_kv_heads(m);
    for (int s = 0; s < p->config.pp; s++) {
        int tp = parallel_stage_config(&p->config, p->stages, s).tp;
        bool whole = m->heads % tp == 0 && m->ffn_hidden % tp == 0 &&
                     m->vocab >= tp;
        if (whole && (kv == m->heads || kv % tp == 0))
            continue;
        /* the message opens "stages[s]: model NAME (FILE): " */
        char where[PT_PATH_MAX + PT_NAME_MAX + 48];
        char stage[32] = "";
        if (plan_first_asymmetric_stage(p) >= 0)
            snprintf(stage, sizeof stage, "stages[%d]: ", s);
        snprintf(where, sizeof where, "%smodel %s%s%s%s", stage, m->name,
                 p->model_origin[0] ? " (" : "", p->model_origin,
                 p->model_origin[0] ? ")" : "");
        if (!whole)
            return pt_fail(err, "%s: tp %d must divide the %d heads and "
                           "ffn_hidden %d, and leave every shard some of "
                           "the vocabulary of %d (exec, as Megatron-LM, "
                           "splits whole heads and MLP columns)",
                           where, tp, m->heads, m->ffn_hidden, m->vocab);
        return pt_fail(err, "%s: kv_heads %d: tp %d does not divide them, "
                       "and exec does not replicate key/value heads across "
                       "tensor-parallel ranks; use a tp that divides %d",
                       where, kv, tp, kv);
    }
    return 0;
}

int plan_rank_count(const plan *p)
{
    return stage_degrees_first_rank(&p->config, p->stages, p->config.pp);
}

int plan_stage_ranks(const plan *p, int stage)
{
    return stage_degrees_ranks(&p->config, p->stages, stage);
}

int plan_stage_first_rank(const plan *p, int stage)
{
    return stage_degrees_first_rank(&p->config, p->stages, stage);
}

int plan_stage_of_rank(const plan *p, int rank)
{
    int stage = 0;
    while (stage + 1 < p->config.pp &&
           plan_stage_first_rank(p, stage + 1) <= rank)
        stage++;
    return stage;
}

/* ------------------------------------------------------------- reader */

/* One entry: {"tp": t, "dp": d}, either optional. */
static int stage_entry(const json_t *entry, const json_place *where,
                       stage_degrees *out, pt_error *err)
{
    long long tp = 0, dp = 0;
    if (json_expect_object(entry, where, err) != 0 ||
        json_check_keys(entry, where, stage_keys, err) != 0 ||
        json_get_int(entry, where, "tp", false, 1, 65536, &tp, err) != 0 ||
        json_get_int(entry, where, "dp", false, 1, 1 << 20, &dp, err) != 0)
        return -1;
    out->tp = (int)tp;
    out->dp = (int)dp;
    return 0;
}

/* What one stage's degrees must satisfy on their own: its tp splits the
 * model's attention, its dp splits the micro-batch, its tp the sequence
 * under sequence parallelism. */
static int check_stage(const plan *p, int stage, const json_place *where,
                       pt_error *err)
{
    const parallel_config *config = &p->config;
    stage_degrees degrees = resolved(config, p->stages, stage);
    long long samples = (long long)config->dp * config->mbs;
    if (model_check_tp(&p->model, degrees.tp, err) != 0) {
        char reason[sizeof err->message];
        pt_copy_string(reason, sizeof reason, err->message);
        json_place tp_place = json_place_key(where, "tp");
        return json_place_fail(&tp_place, err, "%s", reason);
    }
    if (samples % degrees.dp != 0) {
        json_place dp_place = json_place_key(where, "dp");
        return json_place_fail(
            &dp_place, err,
            "%d replicas cannot share a micro-batch of dp x mbs = %d x %d "
            "= %lld samples (every stage runs gbs / (dp x mbs) = %d "
            "micro-batches; a stage's dp must divide %lld)",
            degrees.dp, config->dp, config->mbs, samples,
            parallel_microbatches(config), samples);
    }
    parallel_config own = parallel_stage_config(config, p->stages, stage);
    if (config->sequence_parallel &&
        parallel_check_schedule_levers(&own, p->model.seq, err) != 0) {
        char reason[sizeof err->message];
        pt_copy_string(reason, sizeof reason, err->message);
        return json_place_fail(where, err, "%s", reason);
    }
    return 0;
}

/* The stages take consecutive ranks: each must find its tp x dp GPUs
 * among those node_order holds, and together they must take them all. */
static int check_gpus(const plan *p, long long held,
                      const json_place *where, pt_error *err)
{
    const parallel_config *config = &p->config;
    long long taken = 0;
    for (int s = 0; s < config->pp; s++) {
        stage_degrees degrees = resolved(config, p->stages, s);
        long long own = (long long)degrees.tp * degrees.dp;
        if (taken + own > held) {
            json_place stage_place = json_place_index(where, (size_t)s);
            return json_place_fail(
                &stage_place, err,
                "tp x dp = %d x %d = %lld GPUs from rank %lld, but the %d "
                "nodes of node_order hold %lld GPUs",
                degrees.tp, degrees.dp, own, taken, p->node_order_count,
                held);
        }
        taken += own;
    }
    if (taken != held)
        return json_place_fail(where, err,
                               "the %d stages take %lld GPUs (tp x dp of "
                               "each), but the %d nodes of node_order hold "
                               "%lld",
                               config->pp, taken, p->node_order_count, held);
    return 0;
}

int plan_stages_part(const json_t *obj, const json_place *place,
                     long long held_gpus, plan *out, pt_error *err)
{
    json_place where = json_place_key(place, "stages");
    const json_t *value = json_object_get(obj, "stages");
    if (value == NULL)
        return 0;
    const parallel_config *config = &out->config;
    if (!json_is_array(value))
        return json_place_fail(&where, err,
                               "must be an array of one {\"tp\", \"dp\"} "
                               "object a stage");
    if (json_array_size(value) != (size_t)config->pp)
        return json_place_fail(&where, err, "has %zu entries, but pp is %d",
                               json_array_size(value), config->pp);
    for (int s = 0; s < config->pp; s++) {
        json_place entry_place = json_place_index(&where, (size_t)s);
        if (stage_entry(json_array_get(value, (size_t)s), &entry_place,
                        &out->stages[s], err) != 0 ||
            check_stage(out, s, &entry_place, err) != 0)
            return -1;
    }
    int own = plan_first_asymmetric_stage(out);
    if (own >= 0 && parallel_virtual_stages(config) > 1) {
        json_place entry_place = json_place_index(&where, (size_t)own);
        return json_place_fail(&entry_place, err,
                               "has its own tp or dp, which the interleaved "
                               "1F1B (virtual_stages %d) does not take: "
                               "every rank's chunks span the pipeline",
                               parallel_virtual_stages(config));
    }
    return check_gpus(out, held_gpus, &where, err);
}

/* ------------------------------------------------------------- writer */

json_t *stage_degrees_to_json(const parallel_config *config,
                              const stage_degrees *stages, bool *failed)
{
    *failed = false;
    if (stage_degrees_first_own(config, stages) < 0)
        return NULL;
    json_t *out = json_array();
    int failures = out == NULL;
    for (int s = 0; failures == 0 && s < config->pp; s++) {
        stage_degrees degrees = resolved(config, stages, s);
        json_t *entry = json_object();
        json_put(entry, "tp", json_integer(degrees.tp), &failures);
        json_put(entry, "dp", json_integer(degrees.dp), &failures);
        json_push(out, entry, &failures);
    }
    if (failures > 0) {
        json_decref(out);
        *failed = true;
        return NULL;
    }
    return out;
}
