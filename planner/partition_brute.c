/*
 * Every composition of the layers into pp capped parts, for tests on small
 * instances: the slowest possible truth to hold the fast solvers against.
 * Compositions are visited in lexicographic order and the first one with
 * the lowest surrogate is kept.
 */
#include "planner/planner.h"

#include <math.h>
#include <stdlib.h>

/* The enumeration's state: the composition being built and the best. */
typedef struct brute_search {
    const partition_problem *problem;
    int *current;      /* [pp] */
    int *best;         /* [pp] */
    double best_value;
} brute_search;

static void enumerate_from(brute_search *search, int stage, int remaining)
{
    const partition_problem *problem = search->problem;
    if (stage == problem->pp - 1) {
        if (remaining > problem->stages[stage].max_layers)
            return;
        search->current[stage] = remaining;
        double value = partition_surrogate(problem, search->current);
        if (value < search->best_value) {
            search->best_value = value;
            for (int s = 0; s < problem->pp; s++)
                search->best[s] = search->current[s];
        }
        return;
    }
    int most = problem->stages[stage].max_layers;
    if (most > remaining)
        most = remaining;
    for (int count = 0; count <= most; count++) {
        search->current[stage] = count;
        enumerate_from(search, stage + 1, remaining - count);
    }
}

int partition_solve_brute_force(const partition_problem *problem,
                                int *layers_out, double *value_out,
                                pt_error *err)
{
    if (partition_problem_check(problem, layers_out, err) != 0)
        return -1;
    for (int s = 0; s < problem->pp; s++)
        if (problem->stages[s].max_layers < 0)
            return 0;
    int *current = malloc((size_t)problem->pp * sizeof(int));
    if (current == NULL)
        return pt_fail(err, "partition: out of memory");
    brute_search search = {problem, current, layers_out, INFINITY};
    enumerate_from(&search, 0, problem->layers);
    free(current);
    if (isinf(search.best_value))
        return 0;
    if (value_out != NULL)
        *value_out = search.best_value;
    return 1;
}
