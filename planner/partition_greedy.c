/*
 * FASOP's min-max heuristic (reference/anchors.md), kept for comparison:
 * start from the even split, then repeatedly move one layer from the
 * slowest stage to the fastest while the slowest stage time keeps falling.
 * Written from its description; the details that description leaves open
 * follow FASOP's behaviour:
 *   - the even split gives the remainder's extra layers to the last stage
 *     first, then to the first stages in order;
 *   - the slowest and fastest stages are the first ones with the highest
 *     and lowest time;
 *   - a move that raises the slowest time is undone and ends the search; a
 *     move that leaves it equal continues the search unless the partition
 *     was seen before (then it is undone and the search ends);
 *   - the first and last stage keep at least two layers, the others one:
 *     when the slowest stage is at that floor the search ends.
 * It ignores memory while moving layers; a final partition over some
 * stage's cap is reported as no fit (0).
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

/* The greedy's state: the current partition and every one seen. */
typedef struct greedy_walk {
    const partition_problem *problem;
    int *layers;        /* [pp], the caller's output */
    int *history;       /* [history_capacity x pp] */
    int history_count;
    int history_capacity;
} greedy_walk;

static void even_split(const partition_problem *problem, int *layers)
{
    int pp = problem->pp;
    int base = problem->layers / pp;
    int remainder = problem->layers % pp;
    for (int s = 0; s < pp; s++)
        layers[s] = base;
    for (int extra = 0; extra < remainder; extra++)
        layers[extra == 0 ? pp - 1 : extra - 1]++;
}

static double slowest_time(const partition_problem *problem,
                           const int *layers, int *slowest, int *fastest)
{
    double high = -1.0, low = 0.0;
    for (int s = 0; s < problem->pp; s++) {
        double time_s = partition_stage_time(&problem->stages[s], layers[s]);
        if (time_s > high) {
            high = time_s;
            *slowest = s;
        }
        if (s == 0 || time_s < low) {
            low = time_s;
            *fastest = s;
        }
    }
    return high;
}

/* Records the current partition; returns 1 when it had been seen. */
static int remember(greedy_walk *walk)
{
    const int pp = walk->problem->pp;
    size_t bytes = (size_t)pp * sizeof(int);
    for (int h = 0; h < walk->history_count; h++)
        if (memcmp(walk->history + (size_t)h * pp, walk->layers, bytes) == 0)
            return 1;
    if (walk->history_count < walk->history_capacity) {
        memcpy(walk->history + (size_t)walk->history_count * pp,
               walk->layers, bytes);
        walk->history_count++;
    }
    return 0;
}

static void move_layers(int *layers, int from, int to)
{
    layers[from]--;
    layers[to]++;
}

static void run_greedy(greedy_walk *walk)
{
    const partition_problem *problem = walk->problem;
    int slowest = 0, fastest = 0;
    double slowest_s = slowest_time(problem, walk->layers, &slowest, &fastest);
    remember(walk);
    /* every move lowers the slowest time or adds a new partition to the
       history, so the walk ends; the bound is a safety net */
    for (int moves = 0; moves < walk->history_capacity; moves++) {
        int floor = (slowest == 0 || slowest == problem->pp - 1) ? 2 : 1;
        if (slowest == fastest || walk->layers[slowest] <= floor)
            return;
        int from = slowest, to = fastest;
        move_layers(walk->layers, from, to);
        int next_slowest = 0, next_fastest = 0;
        double next_s = slowest_time(problem, walk->layers, &next_slowest,
                                     &next_fastest);
        /* a lower slowest time always gives a partition not seen yet */
        if (next_s > slowest_s || remember(walk)) {
            move_layers(walk->layers, to, from);
            return;
        }
        slowest_s = next_s;
        slowest = next_slowest;
        fastest = next_fastest;
    }
}

int partition_solve_fasop_greedy(const partition_problem *problem,
                                 int *layers_out, double *value_out,
                                 pt_error *err)
{
    if (partition_problem_check(problem, layers_out, err) != 0)
        return -1;
    greedy_walk walk = {problem, layers_out, NULL, 0, 0};
    /* walks take about one move per layer out of place plus one per tied
       stage; past this many moves the walk stops where it is */
    walk.history_capacity = 2 * (problem->layers + problem->pp) + 16;
    walk.history = malloc((size_t)walk.history_capacity *
                          (size_t)problem->pp * sizeof(int));
    if (walk.history == NULL)
        return pt_fail(err, "partition (greedy): out of memory");
    even_split(problem, layers_out);
    run_greedy(&walk);
    free(walk.history);
    for (int s = 0; s < problem->pp; s++)
        if (layers_out[s] > problem->stages[s].max_layers)
            return 0;
    if (value_out != NULL)
        *value_out = partition_surrogate(problem, layers_out);
    return 1;
}
