/*
 * The search space: every (tp, dp, pp) that fills the cluster, the
 * micro-batch sizes gbs allows and the memory levers the options allow,
 * within the degrees a user fixed or limited (search_constraints),
 * each combination one task whose node orders the tree search visits
 * (search_tree.c).
 */
#include "planner/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Megatron's tensor parallelism rarely goes past one 8-GPU node: tp goes
 * up to this, or to the largest node when nodes are bigger. */
#define SEARCH_MAX_TP 8

/* The memory levers, in enumeration order: ZeRO stage (0..3), full
 * recompute, optimizer offload. The first four are those of ZeRO-1's
 * time; ZeRO-2/3 and offload follow (docs/planner.md). */
typedef struct lever_set {
    int zero;
    bool recompute, offload;
} lever_set;
static const lever_set levers[SEARCH_LEVER_SETS] = {
    {0, false, false}, {1, false, false}, {0, true, false}, {1, true, false},
    {2, false, false}, {2, true, false},  {3, false, false}, {3, true, false},
    {0, false, true},  {0, true, true},   {2, false, true},  {2, true, true},
    {3, false, true},  {3, true, true}};

bool degree_choice_allows(const degree_choice *choice, int value)
{
    if (choice->count == 0)
        return true;
    for (int i = 0; i < choice->count; i++)
        if (choice->values[i] == value)
            return true;
    return false;
}

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

/* ZeRO shards over dp, so it needs dp >= 2; offload at dp 1 goes without
 * it (ZeRO-Offload's one GPU), at dp >= 2 with ZeRO-2 or 3 (DeepSpeed's
 * pairing: the host then updates a shard). */
static bool lever_allowed(const search_options *options, int lever, int dp)
{
    const lever_set *set = &levers[lever];
    if (set->zero >= 1 &&
        (dp < 2 || !options->allow_distributed_optimizer ||
         set->zero > options->max_zero_stage))
        return false;
    if (set->offload &&
        (!options->allow_offload || (dp >= 2) != (set->zero >= 2)))
        return false;
    return !set->recompute || options->allow_recompute;
}

void planner_lever_text(const parallel_config *config, char *out,
                        size_t size)
{
    const char *parts[3];
    int count = 0;
    int zero = parallel_zero_stage(config);
    static const char *const zero_names[] = {"", "distributed optimizer",
                                             "ZeRO-2", "ZeRO-3"};
    if (zero >= 1 && zero <= 3)
        parts[count++] = zero_names[zero];
    if (config->offload_optimizer)
        parts[count++] = "optimizer offload";
    if (config->recompute)
        parts[count++] = "full recompute";
    int used = 0;
    out[0] = '\0';
    for (int i = 0; i < count && used >= 0 && (size_t)used < size; i++)
        used += snprintf(out + used, size - (size_t)used, "%s%s",
                         i == 0 ? ", " : i == count - 1 ? " and " : ", ",
                         parts[i]);
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

/* The micro-batch sizes tried: those the constraints name, else the
 * powers of two up to max_mbs. Returns how many. */
static int mbs_values(const search_options *options,
                      int values[SEARCH_MAX_MBS_VALUES])
{
    const degree_choice *chosen = &options->constraints.mbs;
    int count = 0;
    if (chosen->count > 0) {
        for (int i = 0; i < chosen->count && count < SEARCH_MAX_MBS_VALUES;
             i++)
            values[count++] = chosen->values[i];
        return count;
    }
    for (int mbs = 1; mbs <= options->max_mbs && count < SEARCH_MAX_MBS_VALUES;
         mbs *= 2)
        values[count++] = mbs;
    return count;
}

/* The tasks of one (tp, dp, pp): every micro-batch size gbs allows, each
 * with every lever set allowed. */
static int add_shape(search_space *space, int *capacity, int tp, int dp,
                     int pp, const search_options *options, int seq,
                     pt_error *err)
{
    int sizes[SEARCH_MAX_MBS_VALUES];
    int size_count = mbs_values(options, sizes);
    for (int size = 0; size < size_count; size++) {
        int mbs = sizes[size];
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
            parallel_config config = {.gbs = options->gbs, .mbs = mbs,
                                      .tp = tp, .dp = dp, .pp = pp,
                                      .schedule = options->schedule,
                                      .precision = options->precision,
                                      .grad_precision =
                                          options->grad_precision,
                                      .deterministic =
                                          options->deterministic,
                                      .recompute = levers[lever].recompute,
                                      .offload_optimizer =
                                          levers[lever].offload};
            parallel_set_zero_stage(&config, levers[lever].zero);
            config.virtual_stages = 1;
            /* the plain tp, and where allowed sequence parallelism beside
             * it: less memory, but in Partita's executor more time */
            if (add_task(space, capacity, &config, err) != 0)
                return -1;
            config.sequence_parallel = true;
            if (search_sequence_parallel_tried(options, &config, seq) &&
                add_task(space, capacity, &config, err) != 0)
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
        /* a tp that cannot split the heads (GQA's key/value heads
           among them) is no plan */
        if (!search_tp_fits(c, tp) || gpus % tp != 0 ||
            model_check_tp(model, tp, NULL) != 0 ||
            !degree_choice_allows(&options->constraints.tp, tp))
            continue;
        int groups = gpus / tp;
        for (int pp = 1; pp <= groups && pp <= layers && pp <= PT_MAX_STAGES;
             pp++) {
            if (groups % pp != 0 ||
                !degree_choice_allows(&options->constraints.pp, pp) ||
                !degree_choice_allows(&options->constraints.dp, groups / pp))
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
