/*
 * The search space: every (tp, dp, pp) that fills the cluster, the
 * micro-batch sizes gbs allows and the memory levers the options allow,
 * each combination one task whose node orders the tree search visits
 * (search_tree.c).
 */
#include "planner/internal.h"

#include <stdlib.h>
#include <string.h>

/* Megatron's tensor parallelism rarely goes past one 8-GPU node: tp goes
 * up to this, or to the largest node when nodes are bigger. */
#define SEARCH_MAX_TP 8

/* The memory levers, in enumeration order. */
static const bool lever_zero1[SEARCH_LEVER_SETS] = {false, true, false, true};
static const bool lever_recompute[SEARCH_LEVER_SETS] = {false, false, true,
                                                        true};

bool search_tp_fits(const cluster *c, int tp)
{
    if (tp < 1 || (tp & (tp - 1)) != 0)
        return false;
    int largest = 0;
    for (int t = 0; t < c->type_count; t++) {
        if (c->types[t].count == 0)
            continue;
        int gpus = c->types[t].gpus;
        if (gpus % tp != 0 && tp % gpus != 0)
            return false;
        largest = gpus > largest ? gpus : largest;
    }
    return tp <= (largest > SEARCH_MAX_TP ? largest : SEARCH_MAX_TP);
}

static int check_cluster(const cluster *c, pt_error *err)
{
    if (c->type_count < 1 || c->type_count > PLANNER_MAX_TYPES)
        return pt_fail(err, "search: cluster %s has %d node types; the "
                       "planner handles 1..%d", c->name, c->type_count,
                       PLANNER_MAX_TYPES);
    if (c->node_count < 1 || c->node_count > PLANNER_MAX_NODES)
        return pt_fail(err, "search: cluster %s has %d nodes; the planner "
                       "handles 1..%d", c->name, c->node_count,
                       PLANNER_MAX_NODES);
    for (int t = 0; t < c->type_count; t++)
        if (c->types[t].count < 0 || c->types[t].gpus < 1)
            return pt_fail(err, "search: cluster %s: node type %s has %d "
                           "nodes of %d GPUs", c->name, c->types[t].name,
                           c->types[t].count, c->types[t].gpus);
    return 0;
}

static bool lever_allowed(const search_options *options, int lever, int dp)
{
    if (lever_zero1[lever] &&
        (!options->allow_distributed_optimizer || dp < 2))
        return false;
    return !lever_recompute[lever] || options->allow_recompute;
}

static int add_task(search_space *space, int *capacity,
                    const parallel_config *config, pt_error *err)
{
    if (space->task_count == *capacity) {
        int grown = *capacity ? 2 * *capacity : 64;
        search_task *tasks = realloc(space->tasks,
                                     (size_t)grown * sizeof *tasks);
        if (tasks == NULL)
            return pt_fail(err, "search: out of memory for the tasks");
        space->tasks = tasks;
        *capacity = grown;
    }
    search_task *task = &space->tasks[space->task_count];
    task->config = *config;
    task->index = space->task_count;
    task->floor_s = 0.0;
    space->task_count++;
    return 0;
}

/* The tasks of one (tp, dp, pp): every micro-batch size gbs allows, each
 * with every lever set allowed. */
static int add_shape(search_space *space, int *capacity, int tp, int dp,
                     int pp, const search_options *options, int seq,
                     pt_error *err)
{
    int sizes = 0;
    for (int mbs = 1; mbs <= options->max_mbs && sizes < SEARCH_MAX_MBS_VALUES;
         mbs *= 2, sizes++) {
        /* beyond what the cost model simulates (costmodel.h) */
        if (options->gbs % (dp * mbs) != 0 ||
            (long)(options->gbs / (dp * mbs)) * pp >
                COSTMODEL_MAX_SCHEDULE_STEPS) {
            space->too_many_steps += options->gbs % (dp * mbs) == 0;
            continue;
        }
        for (int lever = 0; lever < SEARCH_LEVER_SETS; lever++) {
            if (!lever_allowed(options, lever, dp))
                continue;
            parallel_config config = {options->gbs, mbs, tp, dp, pp,
                                      options->schedule, options->precision,
                                      lever_recompute[lever],
                                      lever_zero1[lever], 1, false};
            config.sequence_parallel =
                search_sequence_parallel_tried(options, &config, seq);
            if (add_task(space, capacity, &config, err) != 0)
                return -1;
        }
    }
    return 0;
}

int search_space_build(const cluster *c, const model_shape *model,
                       const search_options *options, search_space *out,
                       pt_error *err)
{
    int layers = model->layers;
    memset(out, 0, sizeof *out);
    if (check_cluster(c, err) != 0)
        return -1;
    out->node_count = c->node_count;
    int gpus = cluster_gpu_count(c), capacity = 0;
    for (int tp = 1; tp <= gpus; tp *= 2) {
        if (!search_tp_fits(c, tp) || gpus % tp != 0)
            continue;
        int groups = gpus / tp;
        for (int pp = 1; pp <= groups && pp <= layers && pp <= PT_MAX_STAGES;
             pp++) {
            if (groups % pp != 0)
                continue;
            if (add_shape(out, &capacity, tp, groups / pp, pp, options,
                          model->seq, err) != 0) {
                search_space_free(out);
                return -1;
            }
        }
    }
    return 0;
}

void search_space_free(search_space *space)
{
    free(space->tasks);
    memset(space, 0, sizeof *space);
}
