/*
 * planner_search_asymmetric: plans whose stages run their own tp and dp
 * (issue 36), beside the symmetric search's. A first, exhaustive search
 * for small clusters: every distinct node order, every split of its
 * GPUs into consecutive stages, every (tp, dp) of each stage and every
 * micro-batch, each partition solved exactly for the surrogate; the best
 * by surrogate simulated and ranked with the symmetric search's plans
 * (docs/planner.md, "Stages of their own degrees"). It is the reference
 * an exact search with floors, as the symmetric one has, will be held
 * to; until then it refuses clusters above ASYMMETRIC_MAX_GPUS.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ASYM_MAX_STAGES ASYMMETRIC_MAX_GPUS
#define ASYM_SHORTLIST_MINIMUM 32

/* An asymmetric plan whose partition was solved, kept by its surrogate. */
typedef struct asym_candidate {
    double score;
    parallel_config config;
    stage_degrees stages[ASYM_MAX_STAGES];
    int partition[ASYM_MAX_STAGES];
    int node_order[ASYMMETRIC_MAX_NODES];
    int node_count;
} asym_candidate;

/* The walk over the space, and what it keeps. */
typedef struct asym_walk {
    costmodel *cm;
    const search_options *options;
    int gpus;
    int order[ASYMMETRIC_MAX_NODES];
    int node_count;
    int order_gpus[ASYMMETRIC_MAX_NODES + 1]; /* GPUs before each node */
    int pp;
    int sizes[ASYM_MAX_STAGES];
    stage_degrees degrees[ASYM_MAX_STAGES];
    asym_candidate *kept;
    int kept_count, capacity;
    long long scored;
    double best_score;
    pt_error *err;
    bool failed;
} asym_walk;

/* --------------------------------------------------------- the shortlist */

/* Keeps the `capacity` lowest scores; on a tie the one found first. */
static void offer(asym_walk *w, const asym_candidate *c)
{
    if (w->kept_count == w->capacity &&
        c->score >= w->kept[w->kept_count - 1].score)
        return;
    int at = w->kept_count < w->capacity ? w->kept_count : w->capacity - 1;
    while (at > 0 && w->kept[at - 1].score > c->score) {
        w->kept[at] = w->kept[at - 1];
        at--;
    }
    w->kept[at] = *c;
    if (w->kept_count < w->capacity)
        w->kept_count++;
}

/* ------------------------------------------------------- one candidate */

/* Whether every stage runs the same degrees: a symmetric plan, which the
 * symmetric search covers. */
static bool all_alike(const asym_walk *w)
{
    for (int s = 1; s < w->pp; s++)
        if (w->degrees[s].tp != w->degrees[0].tp ||
            w->degrees[s].dp != w->degrees[0].dp)
            return false;
    return true;
}

/* Solves the partition of the walk's stages at `samples` a micro-batch
 * and keeps the plan when it fits. */
static void score_candidate(asym_walk *w, int samples)
{
    const search_options *o = w->options;
    asym_candidate c = {.node_count = w->node_count};
    c.config = (parallel_config){
        .gbs = o->gbs, .mbs = samples / w->degrees[0].dp,
        .tp = w->degrees[0].tp, .dp = w->degrees[0].dp, .pp = w->pp,
        .schedule = o->schedule, .precision = o->precision,
        .grad_precision = o->grad_precision};
    memcpy(c.stages, w->degrees, sizeof(stage_degrees) * (size_t)w->pp);
    memcpy(c.node_order, w->order, sizeof(int) * (size_t)w->node_count);
    int microbatches = o->gbs / samples;
    if ((long)microbatches * w->pp > COSTMODEL_MAX_SCHEDULE_STEPS)
        return;
    stage_terms terms[ASYM_MAX_STAGES];
    if (costmodel_stage_terms_stages(w->cm, &c.config, c.stages, c.node_order,
                                     c.node_count, terms, w->err) != 0) {
        w->failed = true;
        return;
    }
    partition_stage stages[ASYM_MAX_STAGES];
    for (int s = 0; s < w->pp; s++)
        stages[s] = (partition_stage){terms[s].fixed_s, terms[s].per_layer_s,
                                      terms[s].max_layers};
    partition_problem problem = {w->pp, w->cm->model.layers, microbatches,
                                 stages};
    int solved = partition_solve_dp(&problem, c.partition, &c.score, w->err);
    if (solved < 0) {
        w->failed = true;
        return;
    }
    w->scored++;
    if (solved == 0)
        return;
    if (c.score < w->best_score)
        w->best_score = c.score;
    offer(w, &c);
}

static int gcd(int a, int b)
{
    while (b != 0) {
        int r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Every micro-batch of B samples: each stage's dp divides B, B divides
 * gbs, and no replica's share, B / dp, exceeds max_mbs. */
static void each_microbatch(asym_walk *w)
{
    if (all_alike(w))
        return;
    int least = 1, smallest_dp = w->degrees[0].dp;
    for (int s = 0; s < w->pp; s++) {
        int dp = w->degrees[s].dp;
        least = least / gcd(least, dp) * dp;
        smallest_dp = dp < smallest_dp ? dp : smallest_dp;
    }
    for (int samples = least; samples <= w->options->gbs && !w->failed;
         samples += least)
        if (w->options->gbs % samples == 0 &&
            samples / smallest_dp <= w->options->max_mbs)
            score_candidate(w, samples);
}

/* Every (tp, dp) of stages stage.. pp - 1: tp a power of two up to 8
 * dividing the stage's GPUs and splitting the model's attention. */
static void each_degrees(asym_walk *w, int stage)
{
    if (stage == w->pp) {
        each_microbatch(w);
        return;
    }
    for (int tp = 1; tp <= 8 && !w->failed; tp *= 2) {
        if (w->sizes[stage] % tp != 0 ||
            model_check_tp(&w->cm->model, tp, NULL) != 0)
            continue;
        w->degrees[stage] = (stage_degrees){tp, w->sizes[stage] / tp};
        each_degrees(w, stage + 1);
    }
}

/* Every split of GPUs first.. into stages stage.. pp - 1, each at least
 * one GPU. */
static void each_split(asym_walk *w, int stage, int first)
{
    int left = w->gpus - first, stages_after = w->pp - stage - 1;
    if (stage == w->pp - 1) {
        w->sizes[stage] = left;
        each_degrees(w, 0);
        return;
    }
    for (int g = 1; g <= left - stages_after && !w->failed; g++) {
        w->sizes[stage] = g;
        each_split(w, stage + 1, first + g);
    }
}

/* Every distinct node order (nodes of one type are interchangeable: the
 * k-th node of a type placed is its k-th instance), then every pp and
 * split of it. */
static void each_order(asym_walk *w, int position, int *left, int *used)
{
    const cluster *c = w->cm->cluster;
    if (position == w->node_count) {
        int most_stages = w->gpus < w->cm->model.layers ? w->gpus
                                                        : w->cm->model.layers;
        for (w->pp = 2; w->pp <= most_stages && !w->failed; w->pp++)
            each_split(w, 0, 0);
        return;
    }
    int node_base = 0;
    for (int t = 0; t < c->type_count && !w->failed; t++) {
        if (left[t] > 0) {
            w->order[position] = node_base + used[t];
            left[t]--;
            used[t]++;
            each_order(w, position + 1, left, used);
            left[t]++;
            used[t]--;
        }
        node_base += c->types[t].count;
    }
}

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
    if (gpus > ASYMMETRIC_MAX_GPUS || c->node_count > ASYMMETRIC_MAX_NODES)
        return pt_fail(err, "--asymmetric: cluster %s has %d GPUs on %d "
                       "nodes; the asymmetric search enumerates at most %d "
                       "GPUs on %d nodes yet (its exact search with floors "
                       "is not written: issue 36, item 2)",
                       c->name, gpus, c->node_count, ASYMMETRIC_MAX_GPUS,
                       ASYMMETRIC_MAX_NODES);
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
    int left[PLANNER_MAX_TYPES] = {0}, used[PLANNER_MAX_TYPES] = {0};
    for (int t = 0; t < c->type_count && t < PLANNER_MAX_TYPES; t++)
        left[t] = c->types[t].count;
    int rc = w.kept == NULL ? pt_fail(err, "search: out of memory") : 0;
    if (rc == 0) {
        each_order(&w, 0, left, used);
        rc = w.failed ? -1 : rank_kept(&w, out, err);
    }
    out->asymmetric_scored = w.scored;
    out->asymmetric_best_score_s = w.best_score;
    free(w.kept);
    if (rc != 0)
        search_result_free(out);
    return rc;
}
