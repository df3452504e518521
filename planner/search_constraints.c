/*
 * Whether the degrees a user fixed or limited (`partita plan --tp 8 --pp
 * 4`, search_constraints) leave a cluster anything to plan, and if not,
 * which of them is at fault and why: a constraint that alone rules out
 * every (tp, dp, pp, mbs) is named alone, else all of them together. The
 * search itself only filters its tasks (search_space.c); this check runs
 * before it, so a constraint nothing satisfies is refused at once rather
 * than reported as a plan that does not fit.
 */
#include "planner/internal.h"

#include <stdio.h>
#include <string.h>

enum { DEGREE_TP, DEGREE_PP, DEGREE_DP, DEGREE_MBS, DEGREE_COUNT };

static const char *const degree_names[DEGREE_COUNT] = {"tp", "pp", "dp",
                                                       "mbs"};

static degree_choice *degree_of(search_constraints *constraints, int degree)
{
    degree_choice *all[DEGREE_COUNT] = {&constraints->tp, &constraints->pp,
                                        &constraints->dp, &constraints->mbs};
    return all[degree];
}

/* Appends "--tp 2,4" (the option as given) to out, a space before it
 * when out holds one already. */
static void append_option(char *out, size_t size, const degree_choice *choice,
                          const char *name)
{
    size_t used = strlen(out);
    used += (size_t)snprintf(out + used, used < size ? size - used : 0,
                             "%s--%s ", used > 0 ? " " : "", name);
    for (int i = 0; i < choice->count && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%d",
                                 i > 0 ? "," : "", choice->values[i]);
}

/* Tasks of cluster c under options (-1 on error). */
static long long task_count(const cluster *c, const model_shape *model,
                            const search_options *options, pt_error *err)
{
    search_space space;
    if (search_space_build(c, model, options, &space, err) != 0)
        return -1;
    long long count = space.task_count;
    search_space_free(&space);
    return count;
}

/* The refusal: the options at fault and what every plan must be. */
static int refuse(const cluster *c, const model_shape *model,
                  const search_options *options, const char *named,
                  bool together, pt_error *err)
{
    return pt_fail(err, "%s: no plan %s fills cluster %s's %d GPUs: a plan "
                   "uses them all as tp x dp x pp, tp a power of two that "
                   "fits its nodes (each node type's GPUs a multiple of tp, "
                   "or tp of theirs; at most 8 or the largest node) and the "
                   "model's heads, pp at most its %d layers, gbs %d a "
                   "multiple of dp x mbs", named,
                   together ? "with these together" : "with that",
                   c->name, cluster_gpu_count(c), model->layers,
                   options->gbs);
}

int planner_check_constraints(const cluster *c, const model_shape *model,
                              const search_options *options, pt_error *err)
{
    search_constraints given = options->constraints;
    search_options open = *options;
    memset(&open.constraints, 0, sizeof open.constraints);
    char named[256] = "";
    int constrained = 0;
    for (int d = 0; d < DEGREE_COUNT; d++)
        if (degree_of(&given, d)->count > 0) {
            append_option(named, sizeof named, degree_of(&given, d),
                          degree_names[d]);
            constrained++;
        }
    if (constrained == 0)
        return 0;
    long long within = task_count(c, model, options, err);
    if (within != 0)
        return within < 0 ? -1 : 0;
    /* nothing to plan even without them: planner_search says why */
    long long without = task_count(c, model, &open, err);
    if (without <= 0)
        return without < 0 ? -1 : 0;
    /* one constraint alone at fault: name it alone */
    for (int d = 0; constrained > 1 && d < DEGREE_COUNT; d++) {
        if (degree_of(&given, d)->count == 0)
            continue;
        search_options alone = open;
        *degree_of(&alone.constraints, d) = *degree_of(&given, d);
        long long count = task_count(c, model, &alone, err);
        if (count < 0)
            return -1;
        if (count == 0) {
            char one[128] = "";
            append_option(one, sizeof one, degree_of(&given, d),
                          degree_names[d]);
            return refuse(c, model, options, one, false, err);
        }
    }
    return refuse(c, model, options, named, constrained > 1, err);
}
