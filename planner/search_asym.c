/*
 * planner_search_asymmetric: plans whose stages run their own tp and dp
 * (issue 36), beside the symmetric search's: the tree of such plans
 * (search_asym_tree.c) keeps the best by surrogate, exactly, and they
 * are simulated here and ranked with the symmetric search's plans
 * (docs/planner.md, "Stages of their own degrees"). Clusters above
 * ASYMMETRIC_MAX_GPUS GPUs or ASYMMETRIC_MAX_ORDERS node orders are
 * refused (the tree walks the node orders one by one).
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ASYM_SHORTLIST_MINIMUM 32

/* ------------------------------------------------------------ ranking */

/* Peak memory per node type: the highest stage peak among the stages
 * that type's GPUs serve. */
static void peak_by_type(const cluster *c, const asym_candidate *cand,
                         const estimate *est, ranked_plan *out)
{
    long long position = 0;
    for (int i = 0; i < cand->node_count; i++) {
        int type = cluster_node_type(c, cand->node_order[i]);
        long long end = position + c->types[type].gpus;
        for (int s = 0; s < est->stage_count; s++) {
            long long first = est->stages[s].first_rank;
            long long last = first + est->stages[s].ranks - 1;
            double gib = est->stages[s].peak_memory_bytes / PT_GIB;
            if (first < end && last >= position &&
                gib > out->peak_memory_gib_by_type[type])
                out->peak_memory_gib_by_type[type] = gib;
        }
        position = end;
    }
}

/* Simulates a kept candidate; 1 when it fits (out filled), 0 when not. */
static int simulate(costmodel *cm, const asym_candidate *cand,
                    ranked_plan *out, pt_error *err)
{
    estimate est;
    if (costmodel_estimate_stages(cm, &cand->config, cand->stages,
                                  cand->node_order, cand->node_count,
                                  cand->partition, false, &est, err) != 0)
        return -1;
    memset(out, 0, sizeof *out);
    int fits = est.fits;
    out->config = cand->config;
    out->node_count = cand->node_count;
    int pp = cand->config.pp;
    memcpy(out->node_order, cand->node_order,
           sizeof(int) * (size_t)cand->node_count);
    memcpy(out->partition, cand->partition, sizeof(int) * (size_t)pp);
    memcpy(out->stages, cand->stages, sizeof(stage_degrees) * (size_t)pp);
    out->step_time_s = est.step_time_s;
    out->tokens_per_s = est.tokens_per_s;
    out->tflops_per_gpu = est.tflops_per_gpu;
    double per_hour = 0.0;
    for (int i = 0; i < cand->node_count; i++)
        per_hour += cm->cluster->types[cluster_node_type(
                                           cm->cluster, cand->node_order[i])]
                        .price_per_hour;
    out->cost_per_step_usd = est.step_time_s / 3600.0 * per_hour;
    peak_by_type(cm->cluster, cand, &est, out);
    estimate_free(&est);
    return fits;
}

static double objective_of(const search_options *o, const ranked_plan *p)
{
    return o->objective == OBJECTIVE_COST ? p->cost_per_step_usd
                                          : p->step_time_s;
}

/* The symmetric plans and the simulated asymmetric ones that fit, merged
 * by the objective (the symmetric first on a tie), `keep` of them. */
static int merge(const search_options *o, search_result *out,
                 const ranked_plan *extra, int extra_count, pt_error *err)
{
    int total = out->plan_count + extra_count;
    int kept = total < o->keep ? total : o->keep;
    ranked_plan *merged = calloc((size_t)kept + 1, sizeof *merged);
    if (merged == NULL)
        return pt_fail(err, "search: out of memory for the plans");
    int a = 0, b = 0;
    for (int i = 0; i < kept; i++) {
        bool take_symmetric =
            a < out->plan_count &&
            (b == extra_count || objective_of(o, &out->plans[a]) <=
                                     objective_of(o, &extra[b]));
        merged[i] = take_symmetric ? out->plans[a++] : extra[b++];
    }
    free(out->plans);
    out->plans = merged;
    out->plan_count = kept;
    return 0;
}

static int compare_ranked(const void *x, const void *y, void *context)
{
    const search_options *o = context;
    double a = objective_of(o, x), b = objective_of(o, y);
    return (a > b) - (a < b);
}

/* Simulates the kept candidates and merges those that fit. */
static int rank_kept(asym_walk *w, search_result *out, pt_error *err)
{
    ranked_plan *plans = calloc((size_t)w->kept_count + 1, sizeof *plans);
    if (plans == NULL)
        return pt_fail(err, "search: out of memory for the ranking");
    int count = 0, rc = 0;
    for (int i = 0; i < w->kept_count && rc == 0; i++) {
        int fits = simulate(w->cm, &w->kept[i], &plans[count], err);
        rc = fits < 0 ? -1 : 0;
        count += fits > 0;
    }
    if (rc == 0) {
        qsort_r(plans, (size_t)count, sizeof *plans, compare_ranked,
                (void *)w->options);
        rc = merge(w->options, out, plans, count, err);
    }
    free(plans);
    return rc;
}

/* ------------------------------------------------------------- search */

static int check_size(const cluster *c, pt_error *err)
{
    int gpus = cluster_gpu_count(c);
    long long orders = asym_distinct_orders(c);
    if (gpus > ASYMMETRIC_MAX_GPUS || c->node_count > PLANNER_MAX_NODES ||
        orders > ASYMMETRIC_MAX_ORDERS)
        return pt_fail(err, "--asymmetric: cluster %s has %d GPUs on %d "
                       "nodes in %lld distinct orders; the asymmetric "
                       "search takes at most %d GPUs and %d node orders yet "
                       "(it walks the orders one by one: issue 36, item 2)",
                       c->name, gpus, c->node_count, orders,
                       ASYMMETRIC_MAX_GPUS, ASYMMETRIC_MAX_ORDERS);
    return 0;
}

int planner_search_asymmetric(costmodel *cm, const search_options *options,
                              search_result *out, pt_error *err)
{
    const cluster *c = cm->cluster;
    memset(out, 0, sizeof *out);
    if (check_size(c, err) != 0 || planner_search(cm, options, out, err) != 0)
        return -1;
    asym_walk w = {.cm = cm, .options = options, .gpus = cluster_gpu_count(c),
                   .node_count = c->node_count, .best_score = INFINITY,
                   .err = err};
    w.capacity = 2 * options->keep > ASYM_SHORTLIST_MINIMUM
                     ? 2 * options->keep
                     : ASYM_SHORTLIST_MINIMUM;
    w.kept = calloc((size_t)w.capacity, sizeof *w.kept);
    int rc = w.kept == NULL ? pt_fail(err, "search: out of memory") : 0;
    if (rc == 0)
        rc = asym_walk_tree(&w) != 0 ? -1 : rank_kept(&w, out, err);
    out->asymmetric_scored = w.scored;
    out->asymmetric_pruned = w.pruned;
    out->asymmetric_best_score_s = w.best_score;
    free(w.kept);
    if (rc != 0)
        search_result_free(out);
    return rc;
}
