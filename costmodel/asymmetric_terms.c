/*
 * The stage terms (time and memory linear in the layers) of a plan whose
 * stages run their own tp and dp (issue 36): what the asymmetric search
 * solves each partition on. Each stage at its own config
 * (asymmetric.c), its sends across boundaries of either kind (stage.c).
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
    size_t configs = (size_t)pp * sizeof(parallel_config);
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
    if (costmodel_type_costs(cm, place->slow_type, own, &slow, err) != 0 ||
        costmodel_type_costs(cm, place->small_type, own, &small, err) != 0)
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
