/*
 * planner_pareto: searches every sub-cluster of a pool (0..count nodes of
 * each type, at least one node) for its fastest plan and keeps the front
 * of step time against $ per step.
 *
 * The pool's profiles are loaded once: a sub-cluster keeps the pool's
 * node types in the same order (a type it does not use has count 0), so
 * the cost model of the pool, pointed at the sub-cluster, prices it with
 * the same profile per type index.
 */
#include "planner/internal.h"

#include <stdlib.h>
#include <string.h>

/* The sub-cluster being searched: the pool's types with other counts. */
typedef struct subcluster {
    cluster shape;                         /* types point at `types` */
    node_type types[PLANNER_MAX_TYPES];
    int counts[PLANNER_MAX_TYPES];
} subcluster;

static void subcluster_set(subcluster *sub, const cluster *pool)
{
    sub->shape = *pool;
    sub->shape.types = sub->types;
    sub->shape.node_count = 0;
    for (int t = 0; t < pool->type_count; t++) {
        sub->types[t] = pool->types[t];
        sub->types[t].count = sub->counts[t];
        sub->shape.node_count += sub->counts[t];
    }
}

/* Next count vector in odometer order (last type fastest); false after
 * the last one. */
static bool next_counts(int *counts, const cluster *pool)
{
    for (int t = pool->type_count - 1; t >= 0; t--) {
        if (counts[t] < pool->types[t].count) {
            counts[t]++;
            return true;
        }
        counts[t] = 0;
    }
    return false;
}

static int subcluster_total(const cluster *pool)
{
    int total = 1;
    for (int t = 0; t < pool->type_count; t++)
        total *= pool->types[t].count + 1;
    return total - 1; /* without the empty one */
}

static int append_point(pareto_result *out, int *capacity,
                        const subcluster *sub, const ranked_plan *plan,
                        int type_count, pt_error *err)
{
    if (out->point_count == *capacity) {
        int grown = *capacity ? 2 * *capacity : 16;
        pareto_point *points = realloc(out->points,
                                       (size_t)grown * sizeof *points);
        if (points == NULL)
            return pt_fail(err, "pareto: out of memory");
        out->points = points;
        *capacity = grown;
    }
    pareto_point *point = &out->points[out->point_count++];
    memset(point, 0, sizeof *point);
    memcpy(point->type_counts, sub->counts, (size_t)type_count * sizeof(int));
    point->plan = *plan;
    return 0;
}

static int compare_points(const void *a, const void *b)
{
    const pareto_point *x = a, *y = b;
    if (x->plan.step_time_s != y->plan.step_time_s)
        return x->plan.step_time_s < y->plan.step_time_s ? -1 : 1;
    if (x->plan.cost_per_step_usd != y->plan.cost_per_step_usd)
        return x->plan.cost_per_step_usd < y->plan.cost_per_step_usd ? -1 : 1;
    return 0;
}

/* Keeps the points no other point beats on both time and cost. Points
 * come in search order; a stable order of equal points keeps the first. */
static void keep_front(pareto_result *out)
{
    /* insertion sort: stable, and the points are few */
    for (int i = 1; i < out->point_count; i++) {
        pareto_point moving = out->points[i];
        int j = i;
        while (j > 0 && compare_points(&moving, &out->points[j - 1]) < 0) {
            out->points[j] = out->points[j - 1];
            j--;
        }
        out->points[j] = moving;
    }
    int kept = 0;
    for (int i = 0; i < out->point_count; i++) {
        if (kept > 0 && out->points[i].plan.cost_per_step_usd >=
                            out->points[kept - 1].plan.cost_per_step_usd)
            continue;
        out->points[kept++] = out->points[i];
    }
    out->point_count = kept;
}

static int search_subclusters(costmodel *pool_model, const cluster *pool,
                              const search_options *options,
                              pareto_result *out, pt_error *err)
{
    subcluster sub;
    memset(&sub, 0, sizeof sub);
    costmodel model = *pool_model;
    model.cluster = &sub.shape;
    search_options per_cluster = *options;
    per_cluster.keep = 1;
    per_cluster.objective = OBJECTIVE_TIME; /* one cluster: cost ~ time */
    per_cluster.progress = NULL;
    int capacity = 0, total = subcluster_total(pool);
    while (next_counts(sub.counts, pool)) {
        subcluster_set(&sub, pool);
        search_result found;
        if (planner_search(&model, &per_cluster, &found, err) != 0)
            return -1;
        out->configurations_scored += found.configurations_scored;
        out->configurations_pruned += found.configurations_pruned;
        out->subclusters_searched++;
        int status = found.plan_count > 0
                         ? append_point(out, &capacity, &sub, &found.plans[0],
                                        pool->type_count, err)
                         : 0;
        search_result_free(&found);
        if (status != 0)
            return -1;
        if (options->progress)
            options->progress(options->progress_context,
                              out->subclusters_searched, total,
                              out->configurations_scored);
    }
    return 0;
}

int planner_pareto(const model_shape *model, const cluster *pool,
                   const char *profile_dir, const search_options *options,
                   pareto_result *out, pt_error *err)
{
    if (out == NULL || model == NULL || pool == NULL || options == NULL)
        return pt_fail(err, "pareto: no model, pool, options or result");
    memset(out, 0, sizeof *out);
    if (pool->type_count < 1 || pool->type_count > PLANNER_MAX_TYPES)
        return pt_fail(err, "pareto: pool %s has %d node types; the planner "
                       "handles 1..%d", pool->name, pool->type_count,
                       PLANNER_MAX_TYPES);
    costmodel cm;
    if (costmodel_open(&cm, model, pool, profile_dir, err) != 0)
        return -1;
    int status = search_subclusters(&cm, pool, options, out, err);
    costmodel_close(&cm);
    if (status != 0) {
        pareto_result_free(out);
        return -1;
    }
    keep_front(out);
    return 0;
}

void pareto_result_free(pareto_result *r)
{
    if (r == NULL)
        return;
    free(r->points);
    r->points = NULL;
    r->point_count = 0;
}
