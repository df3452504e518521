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

/* The smallest memory cap (memory_limit_gib) the cluster file puts on
 * a device of node type t, 0 when none has one. */
static double smallest_device_cap_gib(const node_type *type)
{
    double smallest = 0.0;
    for (int d = 0; d < type->device_count; d++) {
        double cap = type->devices[d].memory_limit_gib;
        if (cap > 0.0 && (smallest == 0.0 || cap < smallest))
            smallest = cap;
    }
    return smallest;
}

/* A device the cluster file caps (a GPU posing as a smaller type, as exec
 * runs it) holds no more than its cap, whatever its profile measured:
 * every rank of the type is priced with the smallest cap among the
 * type's devices, so that a plan the planner fits is one exec fits.
 * Applied to the type's profile when the model opens, to its profile at
 * rest whenever one is loaded or set. */
static void cap_memory(const node_type *type, profile *prof)
{
    double cap = smallest_device_cap_gib(type);
    if (cap > 0.0 && cap < prof->memory_gib)
        prof->memory_gib = cap;
}

static void apply_device_caps(costmodel *cm)
{
    for (int t = 0; t < cm->cluster->type_count; t++) {
        const node_type *type = &cm->cluster->types[t];
        double measured = cm->profiles[t].memory_gib;
        cap_memory(type, &cm->profiles[t]);
        if (cm->profiles[t].memory_gib < measured)
            costmodel_add_note(cm,
                               "%s (%s): %.4g GiB a GPU, the smallest "
                               "memory_limit_gib of its devices, not the "
                               "profile's %.4g GiB",
                               type->name, type->gpu,
                               cm->profiles[t].memory_gib, measured);
        if (cm->rest_loaded && cm->rest_loaded[t])
            cap_memory(type, &cm->rest_profiles[t]);
    }
}

/* Last step of both ways to open: device caps applied; every type must be
 * priceable; shapes priced by the efficiency model are noted. */
static int finish_open(costmodel *cm, pt_error *err)
{
    apply_device_caps(cm);
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

static int allocate_rest(costmodel *cm, pt_error *err)
{
    if (cm->rest_profiles)
        return 0;
    int types = cm->cluster->type_count;
    cm->rest_profiles = calloc((size_t)types, sizeof *cm->rest_profiles);
    cm->rest_loaded = calloc((size_t)types, sizeof *cm->rest_loaded);
    if (!cm->rest_profiles || !cm->rest_loaded)
        return pt_fail(err, "costmodel: out of memory");
    return 0;
}

/* The profiles the node types name as gpu_at_rest. */
static int load_rest_profiles(costmodel *cm, const char *profile_dir,
                              pt_error *err)
{
    const cluster *cluster = cm->cluster;
    for (int t = 0; t < cluster->type_count; t++) {
        const char *gpu = cluster->types[t].gpu_at_rest;
        if (gpu[0] == '\0')
            continue;
        char path[PT_PATH_MAX];
        if (allocate_rest(cm, err) != 0)
            return -1;
        if (profile_find(gpu, profile_dir, cluster->source_dir, path,
                         sizeof path, err) != 0 ||
            profile_load_for_gpu(path, gpu, &cm->rest_profiles[t], err) != 0) {
            pt_error_prefix(err, "cluster %s: nodes[%d] (gpu_at_rest %s)",
                            cluster->name, t, gpu);
            return -1;
        }
        cm->rest_loaded[t] = true;
        costmodel_add_note(cm, COSTMODEL_REST_NOTE);
    }
    return 0;
}

int costmodel_set_rest_profile(costmodel *cm, int type_index,
                               const profile *rest, pt_error *err)
{
    if (type_index < 0 || type_index >= cm->cluster->type_count)
        return pt_fail(err, "costmodel: node type %d does not exist",
                       type_index);
    if (allocate_rest(cm, err) != 0)
        return -1;
    if (cm->rest_loaded[type_index])
        profile_free(&cm->rest_profiles[type_index]);
    cm->rest_loaded[type_index] = false;
    if (profile_copy(&cm->rest_profiles[type_index], rest, err) != 0)
        return -1;
    cap_memory(&cm->cluster->types[type_index],
               &cm->rest_profiles[type_index]);
    cm->rest_loaded[type_index] = true;
    costmodel_add_note(cm, COSTMODEL_REST_NOTE);
    return 0;
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
    if (load_rest_profiles(cm, profile_dir, err) != 0) {
        costmodel_close(cm);
        return -1;
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
    if (cm->rest_loaded && cm->cluster) {
        for (int t = 0; t < cm->cluster->type_count; t++)
            if (cm->rest_loaded[t])
                profile_free(&cm->rest_profiles[t]);
    }
    free(cm->profiles);
    free(cm->rest_profiles);
    free(cm->rest_loaded);
    cm->profiles = NULL;
    cm->rest_profiles = NULL;
    cm->rest_loaded = NULL;
    cm->note_count = 0;
    costmodel_price_memo_detach(cm);
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
