/*
 * The asymmetric search's plans (issue 36): the config of a stage of its
 * own degrees, each complete plan's stage terms and exact partition
 * (its surrogate, the score), and the shortlist of the best scores that
 * the tree (search_asym_tree.c) cuts against and the ranking
 * (search_asym.c) simulates.
 */
#include "planner/internal.h"

#include <math.h>
#include <string.h>

/* --------------------------------------------------------- the shortlist */

/* A candidate's stages and nodes, not the room past them: a candidate
 * has room for the most stages and nodes of any plan, and the pages of
 * that room are left untouched. */
static void copy_candidate(asym_candidate *to, const asym_candidate *from)
{
    int pp = from->config.pp;
    to->score = from->score;
    to->config = from->config;
    to->node_count = from->node_count;
    memcpy(to->stages, from->stages, sizeof(stage_degrees) * (size_t)pp);
    memcpy(to->partition, from->partition, sizeof(int) * (size_t)pp);
    memcpy(to->node_order, from->node_order,
           sizeof(int) * (size_t)from->node_count);
}

/* Keeps the `capacity` lowest scores; on a tie the one found first. */
static void offer(asym_walk *w, const asym_candidate *c)
{
    if (w->kept_count == w->capacity &&
        c->score >= w->kept[w->kept_count - 1].score)
        return;
    int at = w->kept_count < w->capacity ? w->kept_count : w->capacity - 1;
    while (at > 0 && w->kept[at - 1].score > c->score) {
        copy_candidate(&w->kept[at], &w->kept[at - 1]);
        at--;
    }
    copy_candidate(&w->kept[at], c);
    w->offered++;
    if (w->kept_count < w->capacity)
        w->kept_count++;
}

/* ------------------------------------------------------- one candidate */

double asym_threshold(const asym_walk *w)
{
    double kept = w->kept_count == w->capacity
                      ? w->kept[w->kept_count - 1].score
                      : INFINITY;
    return kept < w->cutoff ? kept : w->cutoff;
}

parallel_config asym_stage_config(const search_options *o, int pp,
                                  int samples, int tp, int dp)
{
    return (parallel_config){
        .gbs = o->gbs, .mbs = samples / dp, .tp = tp, .dp = dp, .pp = pp,
        .schedule = o->schedule, .precision = o->precision,
        .grad_precision = o->grad_precision,
        .deterministic = o->deterministic};
}

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

void asym_score_plan(asym_walk *w)
{
    if (all_alike(w))
        return;
    const search_options *o = w->options;
    asym_candidate c = {.node_count = w->node_count};
    c.config = asym_stage_config(o, w->pp, w->samples, w->degrees[0].tp,
                                 w->degrees[0].dp);
    memcpy(c.stages, w->degrees, sizeof(stage_degrees) * (size_t)w->pp);
    memcpy(c.node_order, w->order, sizeof(int) * (size_t)w->node_count);
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
    partition_problem problem = {w->pp, w->cm->model.layers,
                                 o->gbs / w->samples, stages};
    int solved = partition_solve_dp(&problem, c.partition, &c.score, w->err);
    if (solved < 0) {
        w->failed = true;
        return;
    }
    w->scored++;
    if (solved == 0)
        return;
    double tail;
    if (costmodel_step_tail_stages(w->cm, &c.config, c.stages, c.node_order,
                                   c.node_count, c.partition, &tail,
                                   w->err) != 0) {
        w->failed = true;
        return;
    }
    c.score += tail;
    if (c.score >= w->cutoff)
        return;
    if (c.score < w->best_score)
        w->best_score = c.score;
    offer(w, &c);
}

