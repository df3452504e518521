/*
 * The cost model's context: the profile of every node type of a cluster,
 * and the notes that tell the user how those profiles were stretched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

/* Fails early when a type can be priced neither from its profile nor by
 * its efficiency model, and notes a shape the profile does not hold. */
static int check_profiles(costmodel *cm, pt_error *err)
{
    parallel_config probe = {.gbs = 1, .mbs = 1, .tp = 1, .dp = 1, .pp = 1,
                             .schedule = SCHEDULE_1F1B,
                             .precision = PRECISION_BF16};
    for (int t = 0; t < cm->cluster->type_count; t++) {
        type_costs costs;
        if (costmodel_price_type(cm, t, &probe, NULL, &costs, err) != 0)
            return -1;
    }
    return 0;
}

/* Last step of both ways to open: every type must be priceable; shapes
 * priced by the efficiency model are noted. */
static int finish_open(costmodel *cm, pt_error *err)
{
    if (check_profiles(cm, err) != 0) {
        costmodel_close(cm);
        return -1;
    }
    for (int t = 0; t < cm->cluster->type_count; t++)
        costmodel_note_shape_coverage(cm, t);
    return 0;
}

static int check_inputs(const model_shape *model, const cluster *cluster,
                        pt_error *err)
{
    if (!model || !cluster)
        return pt_fail(err, "costmodel: no model or no cluster given");
    if (cluster->type_count <= 0 || !cluster->types)
        return pt_fail(err, "cluster %s: has no node types", cluster->name);
    if (model->layers <= 0 || model->hidden <= 0 || model->seq <= 0 ||
        model->vocab <= 0 || model->heads <= 0)
        return pt_fail(err, "model %s: layers, hidden, heads, seq and vocab "
                       "must be positive", model->name);
    return 0;
}

/* Everything but the profiles; the model's ffn_hidden gets its default. */
static void init_context(costmodel *cm, const model_shape *model,
                         const cluster *cluster)
{
    memset(cm, 0, sizeof *cm);
    cm->model = *model;
    if (cm->model.ffn_hidden <= 0)
        cm->model.ffn_hidden = 4 * cm->model.hidden;
    cm->cluster = cluster;
    cm->dp_overlap = dp_overlap_defaults();
}

int costmodel_open(costmodel *cm, const model_shape *model,
                   const cluster *cluster, const char *profile_dir,
                   pt_error *err)
{
    memset(cm, 0, sizeof *cm);
    if (check_inputs(model, cluster, err) != 0)
        return -1;
    init_context(cm, model, cluster);
    cm->profiles = calloc((size_t)cluster->type_count, sizeof *cm->profiles);
    if (!cm->profiles)
        return pt_fail(err, "costmodel: out of memory");
    for (int t = 0; t < cluster->type_count; t++) {
        char path[PT_PATH_MAX];
        const char *gpu = cluster->types[t].gpu;
        if (profile_find(gpu, profile_dir, cluster->source_dir, path,
                         sizeof path, err) != 0 ||
            profile_load_for_gpu(path, gpu, &cm->profiles[t], err) != 0) {
            pt_error_prefix(err, "cluster %s: nodes[%d] (gpu %s)",
                            cluster->name, t, gpu);
            costmodel_close(cm);
            return -1;
        }
    }
    return finish_open(cm, err);
}

int costmodel_open_with_profiles(costmodel *cm, const model_shape *model,
                                 const cluster *cluster,
                                 const profile *profiles, pt_error *err)
{
    memset(cm, 0, sizeof *cm);
    if (check_inputs(model, cluster, err) != 0)
        return -1;
    if (!profiles)
        return pt_fail(err, "costmodel: no profiles given");
    init_context(cm, model, cluster);
    cm->profiles = calloc((size_t)cluster->type_count, sizeof *cm->profiles);
    if (!cm->profiles)
        return pt_fail(err, "costmodel: out of memory");
    for (int t = 0; t < cluster->type_count; t++) {
        if (profile_copy(&cm->profiles[t], &profiles[t], err) != 0) {
            costmodel_close(cm);
            return -1;
        }
    }
    return finish_open(cm, err);
}

void costmodel_close(costmodel *cm)
{
    if (!cm)
        return;
    if (cm->profiles && cm->cluster) {
        for (int t = 0; t < cm->cluster->type_count; t++)
            profile_free(&cm->profiles[t]);
    }
    free(cm->profiles);
    cm->profiles = NULL;
    cm->note_count = 0;
}

int costmodel_prepare(costmodel *cm, const parallel_config *config,
                      pt_error *err)
{
    if (costmodel_check_degrees(config, err) != 0)
        return -1;
    for (int t = 0; t < cm->cluster->type_count; t++) {
        type_costs costs;
        if (costmodel_type_costs(cm, t, config, &costs, err) != 0)
            return -1;
    }
    return 0;
}
