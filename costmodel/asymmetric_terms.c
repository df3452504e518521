/*
 * The stage terms (time and memory linear in the layers) of a plan whose
 * stages run their own tp and dp (issue 36): what the asymmetric search
 * solves each partition on. Each stage at its own config
 * (asymmetric.c), its sends across boundaries of either kind (stage.c);
 * and one stage's terms without its sends, the floor the search's tree
 * prices a stage by before it knows the stages around it.
 */
#include <stdlib.h>

#include "costmodel/internal.h"

/* Scratch of costmodel_stage_terms_stages, one allocation. */
typedef struct terms_scratch {
    parallel_config *configs;
    long long *firsts;
    stage_placement *placement;
    void *block;
} terms_scratch;

static int terms_scratch_open(terms_scratch *t, int pp, pt_error *err)
{
    size_t configs = costmodel_stage_configs_bytes(pp);
    size_t placement = (size_t)pp * sizeof(stage_placement);
    char *block = malloc(configs + placement +
                         (size_t)(pp + 1) * sizeof(long long));
    if (block == NULL)
        return pt_fail(err, "costmodel: out of memory");
    t->block = block;
    t->configs = (parallel_config *)block;
    t->placement = (stage_placement *)(block + configs);
    t->firsts = (long long *)(block + configs + placement);
    return 0;
}

/* Stage s's terms, its sends across boundaries of either kind. */
static int one_stage_terms(costmodel *cm, const terms_scratch *t, int pp,
                           int s, stage_terms *out, pt_error *err)
{
    const parallel_config *own = &t->configs[s];
    const stage_placement *place = &t->placement[s];
    type_costs slow, small;
    if (costmodel_slow_and_small_costs(cm, place, own, &slow, &small,
                                       err) != 0)
        return -1;
    stage_neighbours around = {s > 0 ? own - 1 : own, own,
                               s < pp - 1 ? own + 1 : own,
                               s > 0 ? place - 1 : NULL, place,
                               s < pp - 1 ? place + 1 : NULL};
    double forward, backward;
    costmodel_boundary_sends(cm, &around, s, &forward, &backward);
    costmodel_terms_with_sends(cm, own, place, s, &slow, &small,
                               forward + backward, out);
    return 0;
}

int costmodel_stage_terms_stages(costmodel *cm, const parallel_config *config,
                                 const stage_degrees *stages,
                                 const int *node_order, int node_count,
                                 stage_terms *terms, pt_error *err)
{
    terms_scratch t = {0};
    if (costmodel_check_degrees(config, err) != 0 ||
        terms_scratch_open(&t, config->pp, err) != 0)
        return -1;
    node_lane lane;
    int *storage = NULL;
    stage_layout layout = {config->pp, t.configs, t.firsts};
    int rc = costmodel_stage_configs(cm, config, stages, t.configs, t.firsts,
                                     err) != 0 ||
                     costmodel_microbatch_count(config, err) < 0 ||
                     costmodel_place_order_stages(cm, &layout, node_order,
                                                  node_count, t.placement,
                                                  &lane, &storage, err) != 0
                 ? -1
                 : 0;
    for (int s = 0; rc == 0 && s < config->pp; s++)
        rc = one_stage_terms(cm, &t, config->pp, s, &terms[s], err);
    free(storage);
    free(t.block);
    return rc;
}

int costmodel_stage_terms_unsent(costmodel *cm, const parallel_config *own,
                                 const node_lane *lane, int stage,
                                 long long first, stage_terms *out,
                                 pt_error *err)
{
    stage_placement place;
    type_costs slow, small;
    if (costmodel_place_stage_at(cm, own, NULL, lane, stage, first, &place,
                                 err) != 0 ||
        costmodel_slow_and_small_costs(cm, &place, own, &slow, &small,
                                       err) != 0)
        return -1;
    costmodel_terms_with_sends(cm, own, &place, stage, &slow, &small, 0.0,
                               out);
    return 0;
}

int costmodel_stage_terms_inner(costmodel *cm, const parallel_config *configs,
                                const long long *firsts, const node_lane *lane,
                                int stage, stage_terms *out, pt_error *err)
{
    const parallel_config *own = &configs[stage];
    bool has_before = stage > 0, has_after = stage < own->pp - 1;
    stage_placement place[3];
    for (int j = has_before ? -1 : 0; j <= (has_after ? 1 : 0); j++) {
        int at = stage + j;
        const parallel_config *next =
            j < 1 && at < own->pp - 1 ? &configs[at + 1] : NULL;
        if (costmodel_place_stage_at(cm, &configs[at], next, lane, at,
                                     firsts[at], &place[j + 1], err) != 0)
            return -1;
    }
    type_costs slow, small;
    if (costmodel_slow_and_small_costs(cm, &place[1], own, &slow, &small,
                                       err) != 0)
        return -1;
    stage_neighbours around = {has_before ? own - 1 : own, own,
                               has_after ? own + 1 : own,
                               has_before ? &place[0] : NULL, &place[1],
                               has_after ? &place[2] : NULL};
    double forward, backward;
    costmodel_boundary_sends(cm, &around, stage, &forward, &backward);
    costmodel_terms_with_sends(cm, own, &place[1], stage, &slow, &small,
                               forward + backward, out);
    return 0;
}

/* ------------------------------------------------------ per-step work */

/* reduce + gather + optimizer of a placed stage, as the score counts. */
static int placed_work(costmodel *cm, const parallel_config *own,
                       const stage_placement *place, int stage, int layers,
                       double *work_s, pt_error *err)
{
    type_costs slow;
    if (costmodel_type_costs(cm, place->slow_type, own, &slow, err) != 0)
        return -1;
    step_work work;
    costmodel_step_work(cm, own, place, stage, layers, &slow, &work);
    *work_s = work.reduce_s + work.gather_s + work.optimizer_s;
    return 0;
}

int costmodel_stage_work_at(costmodel *cm, const parallel_config *own,
                            const node_lane *lane, int stage,
                            long long first, int most_layers, double *work_s,
                            pt_error *err)
{
    stage_placement place;
    type_costs slow;
    if (costmodel_place_stage_at(cm, own, NULL, lane, stage, first, &place,
                                 err) != 0 ||
        costmodel_type_costs(cm, place.slow_type, own, &slow, err) != 0)
        return -1;
    costmodel_step_work_sums(cm, own, &place, stage, most_layers, &slow,
                             work_s);
    return 0;
}

double costmodel_embedding_pair_s(const costmodel *cm,
                                  const parallel_config *first_stage,
                                  const parallel_config *last_stage,
                                  long long last_first, const node_lane *lane)
{
    if (!cm->model.tied_embeddings || first_stage->pp < 2)
        return 0.0;
    link_spec link;
    int curve;
    costmodel_embedding_link_at(cm, first_stage, last_stage, last_first,
                                lane, &link, &curve);
    parallel_config pair = *first_stage;
    if (last_stage->tp < pair.tp)
        pair.tp = last_stage->tp;
    return costmodel_embedding_allreduce_s(cm, &pair, link, curve);
}

int costmodel_step_tail_stages(costmodel *cm, const parallel_config *config,
                               const stage_degrees *stages,
                               const int *node_order, int node_count,
                               const int *layers, double *tail_s,
                               pt_error *err)
{
    terms_scratch t = {0};
    if (costmodel_check_degrees(config, err) != 0 ||
        terms_scratch_open(&t, config->pp, err) != 0)
        return -1;
    int pp = config->pp, *storage = NULL;
    node_lane lane;
    stage_layout layout = {pp, t.configs, t.firsts};
    int rc = costmodel_stage_configs(cm, config, stages, t.configs, t.firsts,
                                     err) != 0 ||
                     costmodel_place_order_stages(cm, &layout, node_order,
                                                  node_count, t.placement,
                                                  &lane, &storage, err) != 0
                 ? -1
                 : 0;
    double embedding = rc == 0 ? costmodel_embedding_pair_s(
                                     cm, &t.configs[0], &t.configs[pp - 1],
                                     t.firsts[pp - 1], &lane)
                               : 0.0;
    *tail_s = 0.0;
    for (int s = 0; rc == 0 && s < pp; s++) {
        double work;
        rc = placed_work(cm, &t.configs[s], &t.placement[s], s, layers[s],
                         &work, err);
        if (s == 0 || s == pp - 1)
            work += embedding;
        *tail_s = rc == 0 && work > *tail_s ? work : *tail_s;
    }
    free(storage);
    free(t.block);
    return rc;
}
