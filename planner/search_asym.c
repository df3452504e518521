/*
 * planner_search_asymmetric: plans whose stages run their own tp and dp
 * (issue 36), beside the symmetric search's: the tree of such plans
 * (search_asym_tree.c) keeps the best by surrogate, exactly, and they
 * are simulated here and ranked with the symmetric search's plans
 * (docs/planner.md, "Stages of their own degrees"). Only plans that
 * score below the symmetric search's best are kept: its result is where
 * the asymmetric search starts from.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ASYM_SHORTLIST_MINIMUM 32

/* ------------------------------------------------------------ ranking */

/* What the simulation of a kept candidate gives (a ranked_plan is
 * written only for the few that can be ranked: each holds room for the
 * most stages and nodes of any plan). */
typedef struct simulated {
    int kept; /* the candidate's index */
    simulated_figures figures;
} simulated;

/* Peak memory per node type: the highest stage peak among the stages
 * that type's GPUs serve. */
static void peak_by_type(const cluster *c, const asym_candidate *cand,
                         const estimate *est, simulated_figures *out)
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
                    simulated *out, pt_error *err)
{
    estimate est;
    if (costmodel_estimate_stages(cm, &cand->config, cand->stages,
                                  cand->node_order, cand->node_count,
                                  cand->partition, false, &est, err) != 0)
        return -1;
    memset(out, 0, sizeof *out);
    int fits = est.fits;
    simulated_figures *f = &out->figures;
    f->step_time_s = est.step_time_s;
    f->tokens_per_s = est.tokens_per_s;
    f->tflops_per_gpu = est.tflops_per_gpu;
    double per_hour = 0.0;
    for (int i = 0; i < cand->node_count; i++)
        per_hour += cm->cluster->types[cluster_node_type(
                                           cm->cluster, cand->node_order[i])]
                        .price_per_hour;
    f->cost_per_step_usd = est.step_time_s / 3600.0 * per_hour;
    peak_by_type(cm->cluster, cand, &est, f);
    estimate_free(&est);
    return fits;
}

/* The ranked plan of a simulated candidate. */
static void ranked_of(const asym_candidate *cand, const simulated *sim,
                      ranked_plan *out)
{
    memset(out, 0, sizeof *out);
    out->config = cand->config;
    out->node_count = cand->node_count;
    int pp = cand->config.pp;
    memcpy(out->node_order, cand->node_order,
           sizeof(int) * (size_t)cand->node_count);
    memcpy(out->partition, cand->partition, sizeof(int) * (size_t)pp);
    memcpy(out->stages, cand->stages, sizeof(stage_degrees) * (size_t)pp);
    ranked_take_figures(out, &sim->figures);
}

static double objective_of(const search_options *o, double step_time_s,
                           double cost_per_step_usd)
{
    return o->objective == OBJECTIVE_COST ? cost_per_step_usd : step_time_s;
}

static double ranked_objective(const search_options *o, const ranked_plan *p)
{
    return objective_of(o, p->step_time_s, p->cost_per_step_usd);
}

/* Whether the i-th plan of the merge is a symmetric one: the symmetric
 * plans and the simulated asymmetric ones (sims, by the objective)
 * merged by the objective, the symmetric first on a tie; into
 * symmetric[kept]. */
static void merge_order(const asym_walk *w, const search_result *out,
                        const simulated *sims, int count, int kept,
                        bool *symmetric)
{
    const search_options *o = w->options;
    int a = 0, b = 0;
    for (int i = 0; i < kept; i++) {
        symmetric[i] =
            a < out->plan_count &&
            (b == count ||
             ranked_objective(o, &out->plans[a]) <=
                 objective_of(o, sims[b].figures.step_time_s,
                              sims[b].figures.cost_per_step_usd));
        a += symmetric[i];
        b += !symmetric[i];
    }
}

/* The merge, `keep` of them; a ranked plan written only for those kept.
 * Where they fit in the symmetric plans' array the merge is made there,
 * from the back (each symmetric plan moves to its place or stays): a
 * ranked plan is tens of kilobytes, and a new array is pages touched
 * anew. */
static int merge(const asym_walk *w, search_result *out,
                 const simulated *sims, int count, pt_error *err)
{
    const search_options *o = w->options;
    int total = out->plan_count + count;
    int kept = total < o->keep ? total : o->keep;
    bool *symmetric = malloc(sizeof(bool) * ((size_t)kept + 1));
    if (symmetric == NULL)
        return pt_fail(err, "search: out of memory for the plans");
    merge_order(w, out, sims, count, kept, symmetric);
    int a = 0, b = 0;
    for (int i = 0; i < kept; i++) {
        a += symmetric[i];
        b += !symmetric[i];
    }
    bool in_place = kept <= out->plan_count;
    ranked_plan *merged = in_place ? out->plans
                                   : calloc((size_t)kept + 1, sizeof *merged);
    if (!in_place && merged == NULL) {
        free(symmetric);
        return pt_fail(err, "search: out of memory for the plans");
    }
    for (int i = kept - 1; i >= 0; i--) {
        if (symmetric[i]) {
            a--;
            if (!in_place || a != i)
                merged[i] = out->plans[a];
        } else {
            b--;
            ranked_of(&w->kept[sims[b].kept], &sims[b], &merged[i]);
        }
    }
    free(symmetric);
    if (!in_place)
        free(out->plans);
    out->plans = merged;
    out->plan_count = kept;
    return 0;
}

/* By the objective; on a tie in the order kept (by score). */
static int compare_simulated(const void *x, const void *y, void *context)
{
    const search_options *o = context;
    const simulated *p = x, *q = y;
    double a = objective_of(o, p->figures.step_time_s,
                            p->figures.cost_per_step_usd),
           b = objective_of(o, q->figures.step_time_s,
                            q->figures.cost_per_step_usd);
    if (a != b)
        return (a > b) - (a < b);
    return (p->kept > q->kept) - (p->kept < q->kept);
}

/* Simulates the kept candidates and merges those that fit. */
static int rank_kept(asym_walk *w, search_result *out, pt_error *err)
{
    simulated *sims = calloc((size_t)w->kept_count + 1, sizeof *sims);
    int count = 0,
        rc = sims == NULL
                 ? pt_fail(err, "search: out of memory for the ranking")
                 : 0;
    for (int i = 0; i < w->kept_count && rc == 0; i++) {
        int fits = simulate(w->cm, &w->kept[i], &sims[count], err);
        rc = fits < 0 ? -1 : 0;
        sims[count].kept = i;
        count += fits > 0;
    }
    if (rc == 0) {
        qsort_r(sims, (size_t)count, sizeof *sims, compare_simulated,
                (void *)w->options);
        rc = merge(w, out, sims, count, err);
    }
    free(sims);
    return rc;
}

/* ------------------------------------------------------------- search */

int planner_search_asymmetric(costmodel *cm, const search_options *options,
                              search_result *out, pt_error *err)
{
    const cluster *c = cm->cluster;
    memset(out, 0, sizeof *out);
    if (planner_search(cm, options, out, err) != 0)
        return -1;
    asym_walk w = {.cm = cm, .options = options, .gpus = cluster_gpu_count(c),
                   .node_count = c->node_count, .best_score = INFINITY,
                   .cutoff = out->best_score_s, .open_floor = INFINITY,
                   .err = err};
    w.capacity = 2 * options->keep > ASYM_SHORTLIST_MINIMUM
                     ? 2 * options->keep
                     : ASYM_SHORTLIST_MINIMUM;
    /* not zeroed: a kept candidate is written as far as its stages and
       nodes reach (search_asym_score.c), and only that far read */
    w.kept = malloc((size_t)w.capacity * sizeof *w.kept);
    int rc = w.kept == NULL ? pt_fail(err, "search: out of memory") : 0;
    /* the tree prices the same node types at the same configs again and
       again, on this thread alone */
    if (rc == 0)
        rc = costmodel_price_memo_attach(cm, err);
    if (rc == 0)
        rc = asym_walk_tree(&w) != 0 ? -1 : rank_kept(&w, out, err);
    costmodel_price_memo_detach(cm);
    out->asymmetric_scored = w.scored;
    out->asymmetric_pruned = w.pruned;
    out->asymmetric_nodes = w.nodes;
    out->asymmetric_alike = w.alike;
    out->asymmetric_best_score_s = w.best_score;
    out->asymmetric_cutoff_s = w.cutoff;
    out->asymmetric_exact = !w.stopped;
    out->asymmetric_floor_s = fmin(fmin(w.open_floor, w.cutoff),
                                   w.best_score);
    free(w.kept);
    if (rc != 0)
        search_result_free(out);
    return rc;
}
