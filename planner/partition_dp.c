/*
 * Exact partition by dynamic programming.
 *
 * The surrogate sum_s T_s + (m-1) max_s T_s couples every stage through
 * the maximum. Fixing the bottleneck M removes the coupling: the best
 * partition whose stages all satisfy T_s <= M costs (m-1) M + minsum(M),
 * where minsum(M) is the smallest sum of stage times under per-stage caps
 * u_s(M). The optimum's own bottleneck is one of the values T_s(l), so
 * walking those values upward from the min-max bottleneck and keeping the
 * best (m-1) M + minsum(M) finds it. minsum(M) never drops below the
 * uncapped minimum S0, so once (m-1) M + S0 reaches the best value found
 * no later M can win and the walk stops.
 *
 * minsum(M) is a DP over stages: g_s(n) = min over l in [0, u_s] of
 * T_s(l) + g_{s-1}(n - l). With T_s linear in l this is
 *     g_s(n) = fixed_s + per_layer_s n + min_{k in [n-u_s, n]}
 *              (g_{s-1}(k) - per_layer_s k),
 * a minimum over a window sliding with n, kept in a monotone deque: each
 * pass costs O(pp x layers), and less: only prefix counts the caps allow
 * both before and after a stage are computed, so near the min-max
 * bottleneck, where the caps leave little slack, a pass is short.
 *
 * The walk visits few bottlenecks. It starts from a floor (the largest
 * fixed time, or the cheapest fixed time plus the layers spread over all
 * stages at their per-layer speeds) rather than from zero. After a pass
 * it jumps to the next bottleneck that can lower minsum: one that lets a
 * stage filled to its cap take a layer from a stage with dearer layers.
 * Raising any other cap leaves the pass's partition optimal (no exchange
 * of one layer improves it), so those bottlenecks only add (m-1) M.
 * S0 for the stopping test comes from the closed form of the uncapped
 * problem (fill the stages with the cheapest layers first).
 *
 * Ties (docs/planner.md): between bottlenecks, a later M replaces the
 * best only when it is lower by more than a relative 1e-12, so the
 * smallest bottleneck wins near-ties (with m = 1 too, where it weighs
 * nothing in the surrogate). Inside a pass an exact tie goes to
 * the partition that puts the most layers on the last stage, then on the
 * one before it, and so on: early stages hold the most in-flight
 * activations under 1F1B, so pushing layers late keeps memory low.
 */
#include "planner/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A later bottleneck must beat the best by this relative margin. */
#define DP_IMPROVEMENT_MARGIN 1e-12

/* Scratch memory of one solve, one allocation. */
typedef struct dp_workspace {
    double *block;          /* the allocation; the rows below swap */
    double *previous_row;   /* [layers+1] g_{s-1}(n) */
    double *current_row;    /* [layers+1] g_s(n) */
    double *window_value;   /* [layers+1] deque values g_{s-1}(k) - b k */
    int *window_index;      /* [layers+1] deque prefix counts k */
    int *choice;            /* [pp x (layers+1)] layers of stage s at n */
    int *cap;               /* [pp] min(max_layers, layers) */
    int *allowed;           /* [pp] layers within the current bottleneck */
    int *trial;             /* [pp] the current bottleneck's partition */
} dp_workspace;

static int workspace_open(dp_workspace *ws, int pp, int layers,
                          pt_error *err)
{
    size_t row = (size_t)layers + 1;
    size_t doubles = 3 * row;
    size_t ints = row + (size_t)pp * row + 3 * (size_t)pp;
    double *block = malloc(doubles * sizeof(double) + ints * sizeof(int));
    if (block == NULL)
        return pt_fail(err, "partition: out of memory for %d stages x %d "
                       "layers", pp, layers);
    ws->block = block;
    ws->previous_row = block;
    ws->current_row = block + row;
    ws->window_value = block + 2 * row;
    ws->window_index = (int *)(block + doubles);
    ws->choice = ws->window_index + row;
    ws->cap = ws->choice + (size_t)pp * row;
    ws->allowed = ws->cap + pp;
    ws->trial = ws->allowed + pp;
    return 0;
}

static void workspace_close(dp_workspace *ws)
{
    free(ws->block);
}

/* Prefix counts worth computing after a stage: no more than the stages
 * so far can hold, no fewer than the later stages leave for them. */
typedef struct prefix_range {
    int low, high;
} prefix_range;

/* g_s on `range` from g_{s-1} (in previous_row, defined on `previous`),
 * by the sliding-window minimum. */
static void relax_stage(const partition_stage *stage, int allowed,
                        prefix_range previous, prefix_range range,
                        dp_workspace *ws, int *choice_row)
{
    const double *before = ws->previous_row;
    double *current = ws->current_row;
    int head = 0, tail = 0;
    int next_prefix = previous.low;
    for (int n = range.low; n <= range.high; n++) {
        for (; next_prefix <= n && next_prefix <= previous.high;
             next_prefix++) {
            double value = before[next_prefix] -
                           stage->per_layer_s * (double)next_prefix;
            /* strict: an equal older entry stays in front, so ties keep
               the smallest prefix, i.e. the most layers on this stage */
            while (tail > head && ws->window_value[tail - 1] > value)
                tail--;
            ws->window_value[tail] = value;
            ws->window_index[tail] = next_prefix;
            tail++;
        }
        while (ws->window_index[head] < n - allowed)
            head++;
        int prefix = ws->window_index[head];
        current[n] = partition_stage_time(stage, n - prefix) + before[prefix];
        choice_row[n] = n - prefix;
    }
}

static int at_most(int value, int limit)
{
    return value < limit ? value : limit;
}

/* minsum under the caps in `allowed` (whose sum reaches the layers);
 * leaves the per-cell choices in ws->choice for reconstruction. Near the
 * min-max bottleneck the caps leave little slack, so the prefix ranges,
 * and the pass, are short. */
static double min_sum_pass(const partition_problem *problem,
                           const int *allowed, dp_workspace *ws)
{
    const int layers = problem->layers;
    const size_t row = (size_t)layers + 1;
    long long later = 0;
    for (int s = 1; s < problem->pp; s++)
        later += allowed[s];
    prefix_range range = {layers - later > 0 ? (int)(layers - later) : 0,
                          at_most(allowed[0], layers)};
    for (int n = range.low; n <= range.high; n++) {
        ws->previous_row[n] = partition_stage_time(&problem->stages[0], n);
        ws->choice[n] = n;
    }
    for (int s = 1; s < problem->pp; s++) {
        later -= allowed[s];
        prefix_range next = {layers - later > 0 ? (int)(layers - later) : 0,
                             at_most(range.high + allowed[s], layers)};
        relax_stage(&problem->stages[s], allowed[s], range, next, ws,
                    ws->choice + (size_t)s * row);
        double *swap = ws->previous_row;
        ws->previous_row = ws->current_row;
        ws->current_row = swap;
        range = next;
    }
    return ws->previous_row[layers];
}

static void reconstruct(const partition_problem *problem,
                        const dp_workspace *ws, int *layers_out)
{
    const size_t row = (size_t)problem->layers + 1;
    int remaining = problem->layers;
    for (int s = problem->pp - 1; s >= 0; s--) {
        int stage_layers = ws->choice[(size_t)s * row + remaining];
        layers_out[s] = stage_layers;
        remaining -= stage_layers;
    }
}

/* Raises every stage's allowance to the layers whose time stays within
 * bound; returns the new total allowance. */
static int absorb_bound(const partition_problem *problem, dp_workspace *ws,
                        double bound)
{
    int total = 0;
    for (int s = 0; s < problem->pp; s++) {
        const partition_stage *stage = &problem->stages[s];
        while (ws->allowed[s] < ws->cap[s] &&
               partition_stage_time(stage, ws->allowed[s] + 1) <= bound)
            ws->allowed[s]++;
        total += ws->allowed[s];
    }
    return total;
}

/* The next bottleneck that can lower minsum, given the current one's
 * partition: only a stage filled to its allowance, below its cap, whose
 * layers cost less than those of some stage in use can take a layer that
 * saves time. Allowances of the other stages may grow without changing
 * minsum (no exchange of a layer improves the partition), so the walk
 * skips those bottlenecks: there (m - 1) M only grows. INFINITY when no
 * stage can take such a layer: minsum has reached its floor. */
static double next_useful_bottleneck(const partition_problem *problem,
                                     const dp_workspace *ws)
{
    double dearest_used = -1.0;
    for (int s = 0; s < problem->pp; s++)
        if (ws->trial[s] > 0 && problem->stages[s].per_layer_s > dearest_used)
            dearest_used = problem->stages[s].per_layer_s;
    double next = INFINITY;
    for (int s = 0; s < problem->pp; s++) {
        const partition_stage *stage = &problem->stages[s];
        if (ws->trial[s] < ws->allowed[s] || ws->allowed[s] >= ws->cap[s] ||
            stage->per_layer_s >= dearest_used)
            continue;
        double time_s = partition_stage_time(stage, ws->allowed[s] + 1);
        if (time_s < next)
            next = time_s;
    }
    return next;
}

/* The smallest stage time above the current allowances; used to reach
 * the min-max bottleneck. */
static double next_bottleneck(const partition_problem *problem,
                              const dp_workspace *ws)
{
    double next = INFINITY;
    for (int s = 0; s < problem->pp; s++) {
        if (ws->allowed[s] >= ws->cap[s])
            continue;
        double time_s = partition_stage_time(&problem->stages[s],
                                             ws->allowed[s] + 1);
        if (time_s < next)
            next = time_s;
    }
    return next;
}

/* Caps from memory; 0 when some stage fits nothing or the caps cannot
 * hold every layer. */
static int set_caps(const partition_problem *problem, dp_workspace *ws)
{
    long long capacity = 0;
    for (int s = 0; s < problem->pp; s++) {
        int max_layers = problem->stages[s].max_layers;
        if (max_layers < 0)
            return 0;
        ws->cap[s] = max_layers < problem->layers ? max_layers
                                                  : problem->layers;
        ws->allowed[s] = 0;
        capacity += ws->cap[s];
    }
    return capacity >= problem->layers;
}

/* The smallest sum of stage times under the memory caps alone: a
 * separable linear problem, solved exactly by filling the stages whose
 * layers cost least first. The walk only uses it as the floor of minsum
 * in its stopping test, so it is shaded down a hair against rounding. */
static double uncapped_minimum_sum(const partition_problem *problem,
                                   dp_workspace *ws)
{
    int *by_cost = ws->trial;
    double sum = 0.0;
    for (int s = 0; s < problem->pp; s++) {
        double cost = problem->stages[s].per_layer_s;
        int position = s;
        while (position > 0 &&
               problem->stages[by_cost[position - 1]].per_layer_s > cost) {
            by_cost[position] = by_cost[position - 1];
            position--;
        }
        by_cost[position] = s;
        sum += problem->stages[s].fixed_s;
    }
    int remaining = problem->layers;
    for (int i = 0; i < problem->pp && remaining > 0; i++) {
        int s = by_cost[i];
        int taken = ws->cap[s] < remaining ? ws->cap[s] : remaining;
        sum += problem->stages[s].per_layer_s * taken;
        remaining -= taken;
    }
    return sum * (1.0 - 1e-13);
}

/* A bottleneck no higher than the min-max one: every stage holds at
 * most (M - cheapest fixed) / per_layer layers, and they hold them all. */
static double bottleneck_floor(const partition_problem *problem)
{
    double highest_fixed = 0.0, lowest_fixed = INFINITY, capacity = 0.0;
    for (int s = 0; s < problem->pp; s++) {
        const partition_stage *stage = &problem->stages[s];
        if (stage->fixed_s > highest_fixed)
            highest_fixed = stage->fixed_s;
        if (stage->fixed_s < lowest_fixed)
            lowest_fixed = stage->fixed_s;
        capacity += stage->per_layer_s > 0.0 ? 1.0 / stage->per_layer_s
                                             : INFINITY;
    }
    double balanced = lowest_fixed + problem->layers / capacity;
    /* shaded down so rounding never lifts it above a candidate */
    balanced *= 1.0 - 1e-12;
    return balanced > highest_fixed ? balanced : highest_fixed;
}

/* Whether value beats best by the margin (any finite value beats none). */
static bool beats(double value, double best)
{
    if (isinf(best))
        return isfinite(value);
    return value < best - DP_IMPROVEMENT_MARGIN * best;
}

/* The walk over bottlenecks described at the top of the file. */
static void walk_bottlenecks(const partition_problem *problem,
                             dp_workspace *ws, double uncapped_sum,
                             int *layers_out)
{
    const double bottleneck_weight = (double)(problem->microbatches - 1);
    double bound = bottleneck_floor(problem);
    while (absorb_bound(problem, ws, bound) < problem->layers)
        bound = next_bottleneck(problem, ws);

    double best = INFINITY;
    while (isfinite(bound)) {
        if (!beats(bottleneck_weight * bound + uncapped_sum, best))
            break;
        double value = bottleneck_weight * bound +
                       min_sum_pass(problem, ws->allowed, ws);
        reconstruct(problem, ws, ws->trial);
        if (beats(value, best)) {
            best = value;
            memcpy(layers_out, ws->trial, (size_t)problem->pp * sizeof(int));
        }
        bound = next_useful_bottleneck(problem, ws);
        if (isfinite(bound))
            absorb_bound(problem, ws, bound);
    }
}

int partition_solve_dp(const partition_problem *problem, int *layers_out,
                       double *value_out, pt_error *err)
{
    if (partition_problem_check(problem, layers_out, err) != 0)
        return -1;
    dp_workspace ws = {0};
    if (workspace_open(&ws, problem->pp, problem->layers, err) != 0)
        return -1;
    if (!set_caps(problem, &ws)) {
        workspace_close(&ws);
        return 0;
    }
    /* with one micro-batch the bottleneck weighs nothing, but the walk
       still runs: of the partitions with the smallest sum it returns the
       one with the lowest bottleneck, which balances the per-step work
       the surrogate leaves out */
    walk_bottlenecks(problem, &ws, uncapped_minimum_sum(problem, &ws),
                     layers_out);
    workspace_close(&ws);
    if (value_out != NULL)
        *value_out = partition_surrogate(problem, layers_out);
    return 1;
}
