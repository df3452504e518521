/*
 * The tree search of one task (docs/planner.md, "The search"): node
 * orders are built depth first, one node at a time, along the pipeline.
 *
 * Nodes of one type are interchangeable, so an order is a sequence of
 * node types. Two sequences cost exactly the same when they differ only
 * by swapping neighbouring nodes that lie wholly inside one stage and
 * either both hold whole tp groups or both lie inside one tp group: every
 * fact the cost model reads of that stage (its types, its tp groups, the
 * slowest link of its dp rings, of its sends and of the embedding's
 * all-reduce) stays the same. So only the sequence whose such runs are in
 * non-decreasing type order is visited.
 *
 * As soon as a stage and the nodes around it are placed its facts are
 * final (search_stage_facts). Each time a stage's GPUs are all placed,
 * a floor under every completion (search_bound.c) is compared with the
 * scores kept: a subtree that cannot reach them is cut. A complete order
 * is partitioned exactly and scored: the partition's step-time surrogate
 * plus the largest per-step work of any stage (gradient reduction,
 * tied-embedding all-reduce, optimizer), as if every stage began it when
 * the pipeline ends. The score only chooses what the simulator ranks
 * (search.c).
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of a task's capacity tables at most, and how
 * much lower the threshold's bottleneck must fall before the table is
 * built again for it. */
#define CAPACITY_TABLE_BYTES ((size_t)48 << 20)
#define CAPACITY_REBUILD_BELOW 0.98
/* The grid spans bottlenecks from this share of the threshold's up to it:
 * a placement that fits under less is promising and visited anyway. */
#define CAPACITY_GRID_LOW 0.8

/* A child of a node of the tree: the nodes it places and its floor. */
typedef struct tree_child {
    double floor_s;
    int generation;        /* of the capacity tables it was floored by */
    int first_type;        /* into the worker's child_types */
    int type_count;
} tree_child;

struct tree_worker {
    costmodel model;            /* shallow copy: notes it adds stay here */
    partition_solver solver;    /* of the complete orders' partitions */
    search_memo memo;
    bound_tables *bounds;
    int max_pp, max_nodes, type_count;
    /* the order being built: node types and GPU starts along it */
    int *types;                 /* [max_nodes] */
    int *starts;                /* [max_nodes + 1] */
    int remaining[PLANNER_MAX_TYPES];
    int gpus_left[PLANNER_MAX_TYPES];
    stage_facts *facts;         /* [max_pp + 1]: final stages, then one
                                   pending */
    int final_count;
    /* the children found and not yet visited, of every level of the
       path: a stack */
    tree_child *children;
    int child_count, child_capacity;
    int *child_types;
    int child_type_count, child_type_capacity;
    /* the task being searched */
    const search_task *task;
    const tree_limits *limits;
    shortlist *best;
    tree_outcome *outcome;
    int child_order[PLANNER_MAX_TYPES];
    long long stage_gpus, gpus;
    bool stop, failed;
    pt_error *err;
    double capacity_high_s;     /* the bottleneck the tables reach */
    long long placements;       /* nodes placed, for trimming the memos */
    int capacity_generation;    /* counts the builds */
    /* scoring scratch */
    partition_stage *stages;    /* [max_pp] */
    int *layers;                /* [max_pp] */
    unsigned char *key;
    unsigned char *node_types;  /* [max_nodes] */
    type_costs prices[PLANNER_MAX_TYPES];
};

int tree_worker_open(tree_worker **out, costmodel *cm, int max_pp,
                     const search_options *options, pt_error *err)
{
    tree_worker *w = calloc(1, sizeof *w);
    if (w == NULL)
        return pt_fail(err, "search: out of memory for a worker");
    *out = w;
    w->model = *cm;
    w->solver = options->solver;
    w->max_pp = max_pp;
    w->max_nodes = cm->cluster->node_count;
    w->type_count = cm->cluster->type_count;
    size_t nodes = (size_t)w->max_nodes, pp = (size_t)max_pp;
    w->types = malloc(nodes * sizeof(int));
    w->starts = malloc((nodes + 1) * sizeof(int));
    w->facts = malloc((pp + 1) * sizeof *w->facts);
    w->stages = malloc(pp * sizeof *w->stages);
    w->layers = malloc(pp * sizeof(int));
    w->key = malloc((size_t)shortlist_key_bytes(max_pp));
    w->node_types = malloc(nodes);

    if (!w->types || !w->starts || !w->facts ||
        !w->stages || !w->layers || !w->key || !w->node_types) {
        tree_worker_close(w);
        *out = NULL;
        return pt_fail(err, "search: out of memory for a worker");
    }
    if (search_memo_open(&w->memo, max_pp, w->max_nodes, err) != 0 ||
        bound_tables_open(&w->bounds, max_pp, w->type_count, err) != 0) {
        tree_worker_close(w);
        *out = NULL;
        return -1;
    }
    return 0;
}

void tree_worker_close(tree_worker *w)
{
    if (w == NULL)
        return;
    search_memo_close(&w->memo);
    bound_tables_close(w->bounds);
    free(w->types);
    free(w->starts);
    free(w->facts);
    free(w->children);
    free(w->child_types);
    free(w->stages);
    free(w->layers);
    free(w->key);
    free(w->node_types);
    free(w);
}

search_memo *tree_worker_memo(tree_worker *w)
{
    return &w->memo;
}

costmodel *tree_worker_costmodel(tree_worker *w)
{
    return &w->model;
}

/* ------------------------------------------------------------- scoring */

/* The per-step work the score adds: the largest of any stage. */
static int step_tail_s(tree_worker *w, const parallel_config *config,
                       const node_lane *lane, double *out, pt_error *err)
{
    link_spec embedding_link;
    int embedding_curve;
    costmodel_embedding_link(&w->model, config, lane, &embedding_link,
                             &embedding_curve);
    double embedding_s = costmodel_embedding_allreduce_s(
        &w->model, config, embedding_link, embedding_curve);
    double worst = 0.0;
    for (int s = 0; s < config->pp; s++) {
        const stage_placement *place = &w->facts[s].place;
        step_work work;
        costmodel_step_work(&w->model, config, place, s, w->layers[s],
                            &w->prices[place->slow_type], &work);
        double tail = work.reduce_s + work.gather_s + work.optimizer_s;
        if (s == 0 || s == config->pp - 1)
            tail += embedding_s;
        worst = fmax(worst, tail);
    }
    *out = worst;
    (void)err;
    return 0;
}

/* Partitions and scores the complete order in w->types. */
static int score_order(tree_worker *w)
{
    const parallel_config *config = &w->task->config;
    if (w->limits->on_order != NULL)
        w->limits->on_order(w->limits->on_order_context, w->types,
                            w->model.cluster->node_count);
    int pp = config->pp;
    for (int s = 0; s < pp; s++)
        w->stages[s] = (partition_stage){w->facts[s].terms.fixed_s,
                                         w->facts[s].terms.per_layer_s,
                                         w->facts[s].terms.max_layers};
    partition_problem problem = {pp, w->model.model.layers,
                                 parallel_microbatches(config), w->stages};
    double surrogate_s = 0.0;
    int status = search_solve_partition(&w->memo, w->solver, &problem,
                                        w->layers, &surrogate_s, w->err);
    w->outcome->scored++;
    if (status <= 0)
        return status;
    w->outcome->feasible++;
    int node_count = w->model.cluster->node_count;
    node_lane lane = {node_count, w->types, w->starts};
    double tail_s = 0.0;
    if (step_tail_s(w, config, &lane, &tail_s, w->err) != 0)
        return -1;
    link_spec embedding_link;
    int embedding_curve;
    costmodel_embedding_link(&w->model, config, &lane, &embedding_link,
                             &embedding_curve);
    for (int i = 0; i < node_count; i++)
        w->node_types[i] = (unsigned char)w->types[i];
    candidate offered = {surrogate_s + tail_s, w->task->index, node_count,
                         pp, 0, w->node_types, w->layers, w->key};
    offered.key_length = shortlist_key_write(w->facts, pp, config->dp == 1,
                                             embedding_link,
                                             embedding_curve, w->key);
    shortlist_offer(w->best, &offered);
    return 1;
}

/* --------------------------------------------------------- the walk */

/* Makes stages [final_count, count) final now that the nodes reach GPU
 * `placed`, and the stage after them pending when its GPUs are all
 * placed. */
static int settle_stages(tree_worker *w, long long placed, bool *pending)
{
    const parallel_config *config = &w->task->config;
    int count = placed == w->gpus ? config->pp
                                  : (int)(placed / w->stage_gpus) - 1;
    node_lane lane = {0, w->types, w->starts};
    while (lane.count < w->max_nodes && w->starts[lane.count] < placed)
        lane.count++;
    for (int s = w->final_count; s < count; s++)
        if (search_stage_facts(&w->model, &w->memo, config, &lane, s, true,
                               &w->facts[s], w->err) != 0)
            return -1;
    if (count > w->final_count)
        w->final_count = count;
    int complete = placed == w->gpus ? config->pp
                                     : (int)(placed / w->stage_gpus);
    *pending = complete > w->final_count;
    if (*pending &&
        search_stage_facts(&w->model, &w->memo, config, &lane,
                           w->final_count, false, &w->facts[w->final_count],
                           w->err) != 0)
        return -1;
    return 0;
}

/* The GPUs of each type at or after GPU `from`: the nodes left, and the
 * part of the last placed node past it. */
static void count_gpus_left(tree_worker *w, int depth, long long from)
{
    const cluster *c = w->model.cluster;
    for (int t = 0; t < w->type_count; t++)
        w->gpus_left[t] = w->remaining[t] * c->types[t].gpus;
    for (int i = depth - 1; i >= 0 && w->starts[i + 1] > from; i--) {
        long long start = w->starts[i] > from ? w->starts[i] : from;
        w->gpus_left[w->types[i]] += (int)(w->starts[i + 1] - start);
    }
}

/* Whether the node at `depth` may follow the one before it, or whether
 * the swapped pair, costing the same, is the one visited. */
static bool canonical(const tree_worker *w, int depth)
{
    if (depth == 0)
        return true;
    long long s = w->stage_gpus, tp = w->task->config.tp;
    long long a = w->starts[depth - 1], b = w->starts[depth],
              end = w->starts[depth + 1];
    bool both_inside = a / s == (b - 1) / s && b / s == (end - 1) / s &&
                       a / s == b / s;
    if (!both_inside || w->types[depth] >= w->types[depth - 1])
        return true;
    bool whole_groups = a % tp == 0 && b % tp == 0 && end % tp == 0;
    bool one_group = a / tp == (end - 1) / tp;
    return !(whole_groups || one_group);
}


/* The capacity grid of the task for a threshold: from the bottleneck the
 * task's floor implies up to the one the threshold allows. */
static int build_capacity(tree_worker *w, double threshold, double low_share)
{
    const bound_tables *b = w->bounds;
    double high = capacity_bottleneck_for(b, threshold);
    double low = high * low_share;
    w->capacity_high_s = high;
    w->capacity_generation++;
    return capacity_build(w->bounds, low, high, CAPACITY_TABLE_BYTES,
                          w->err);
}

/* Builds the capacity tables again when the threshold has fallen enough
 * since they were built. */
static int refresh_capacity(tree_worker *w, double threshold)
{
    double wanted = capacity_bottleneck_for(w->bounds, threshold);
    if (!(wanted < w->capacity_high_s * CAPACITY_REBUILD_BELOW))
        return 0;
    return build_capacity(w, threshold, CAPACITY_GRID_LOW);
}

/* The floor of a partial placement: the capacity tables' and, when they
 * do not already cut it, the relaxed partition's (search_bound.c). */
static int node_floor(tree_worker *w, const partial_placement *partial,
                      double threshold, double *floor_s)
{
    double by_capacity = capacity_floor(w->bounds, partial);
    if (by_capacity > threshold) {
        *floor_s = by_capacity;
        return 0;
    }
    if (bound_floor(w->bounds, &w->memo, partial, threshold, floor_s,
                    w->err) != 0)
        return -1;
    *floor_s = fmax(*floor_s, by_capacity);
    return 0;
}

/* ------------------------------------------------ stage-level children */

/* The children of a node of the tree are the ways to place nodes until
 * one more stage has all its GPUs (or the pipeline is full). They are
 * found first, each with its floor, then visited lowest floor first, so
 * that good placements come early and make the threshold that cuts the
 * rest; once a child's floor is above the threshold, so are the rest. */

/* Room for one more child's record on the worker's child stack. */
static bool push_child(tree_worker *w, double floor_s, const int *types,
                       int count)
{
    if (w->child_count + 1 > w->child_capacity ||
        w->child_type_count + count > w->child_type_capacity) {
        int capacity = w->child_capacity ? 2 * w->child_capacity : 1024;
        int type_capacity = w->child_type_capacity
                                ? 2 * w->child_type_capacity
                                : 8192;
        while (type_capacity < w->child_type_count + count)
            type_capacity *= 2;
        tree_child *children = realloc(w->children,
                                       (size_t)capacity * sizeof *children);
        int *store = realloc(w->child_types,
                             (size_t)type_capacity * sizeof(int));
        if (children != NULL)
            w->children = children;
        if (store != NULL)
            w->child_types = store;
        if (children == NULL || store == NULL) {
            pt_fail(w->err, "search: out of memory for the tree");
            w->failed = true;
            return false;
        }
        w->child_capacity = capacity;
        w->child_type_capacity = type_capacity;
    }
    tree_child *child = &w->children[w->child_count++];
    child->floor_s = floor_s;
    child->generation = w->capacity_generation;
    child->first_type = w->child_type_count;
    child->type_count = count;
    for (int i = 0; i < count; i++)
        w->child_types[w->child_type_count++] = types[i];
    return true;
}

static double current_threshold(const tree_worker *w)
{
    return fmin(w->limits->threshold_s, shortlist_threshold(w->best));
}

/* The floor of the node just completed by placing up to `depth`. */
static int child_floor(tree_worker *w, int depth, bool pending,
                       double *floor_s)
{
    *floor_s = -INFINITY;
    if (w->limits->exhaustive)
        return 0;
    long long placed = w->starts[depth];
    double threshold = current_threshold(w);
    count_gpus_left(w, depth, (placed / w->stage_gpus) * w->stage_gpus);
    partial_placement partial = {w->facts, w->final_count, pending,
                                 w->gpus_left};
    if (refresh_capacity(w, threshold) != 0)
        return -1;
    /* a floor solves partition problems of pp stages: it counts as that
       many nodes towards the budget, which so stays a measure of time;
       each relaxed partition of the per-step work's walk as two floors
       (its caps are new to the partition memo: measured on mixed-1024,
       it costs about that much) */
    long long walks = w->bounds->walk_solves;
    int rc = node_floor(w, &partial, threshold, floor_s);
    w->outcome->nodes +=
        w->task->config.pp * (1 + 2 * (w->bounds->walk_solves - walks));
    return rc;
}

static void find_children(tree_worker *w, int start, int depth);

/* Places a node of `type` at `depth` while looking for children of the
 * node at `start`. */
static void try_node(tree_worker *w, int start, int depth, int type)
{
    const cluster *c = w->model.cluster;
    w->types[depth] = type;
    w->starts[depth + 1] = w->starts[depth] + c->types[type].gpus;
    if (!canonical(w, depth))
        return;
    tree_outcome *o = w->outcome;
    o->nodes++;
    if (++w->placements % 4096 == 0)
        search_memo_trim(&w->memo, SEARCH_MEMO_BYTES);
    if (w->limits->node_budget > 0 && o->nodes > w->limits->node_budget)
        w->stop = true;
    w->remaining[type]--;
    int saved_final = w->final_count;
    long long placed = w->starts[depth + 1];
    bool stage_done = w->starts[start] / w->stage_gpus <
                      placed / w->stage_gpus;
    bool pending = false;
    if (!stage_done && placed < w->gpus) {
        find_children(w, start, depth + 1);
    } else if (settle_stages(w, placed, &pending) != 0) {
        w->failed = true;
    } else if (placed == w->gpus) {
        if (score_order(w) < 0)
            w->failed = true;
    } else {
        double floor_s;
        if (child_floor(w, depth + 1, pending, &floor_s) != 0)
            w->failed = true;
        else if (floor_s > current_threshold(w) || floor_s == INFINITY)
            o->pruned++; /* INFINITY: no completion fits memory */
        else
            push_child(w, floor_s, w->types + start, depth + 1 - start);
    }
    w->final_count = saved_final;
    w->remaining[type]++;
}

static void find_children(tree_worker *w, int start, int depth)
{
    for (int k = 0; k < w->type_count && !w->stop && !w->failed; k++) {
        int type = w->child_order[k];
        if (w->remaining[type] > 0)
            try_node(w, start, depth, type);
    }
}

static int compare_children(const void *a, const void *b)
{
    const tree_child *x = a, *y = b;
    if (x->floor_s != y->floor_s)
        return x->floor_s < y->floor_s ? -1 : 1;
    return (x->first_type > y->first_type) - (x->first_type < y->first_type);
}

/* Places a found child's nodes from `depth` on; returns the new depth. */
static int apply_child(tree_worker *w, int depth, const tree_child *child,
                       bool *pending)
{
    const cluster *c = w->model.cluster;
    for (int i = 0; i < child->type_count; i++) {
        int type = w->child_types[child->first_type + i];
        w->types[depth + i] = type;
        w->starts[depth + i + 1] = w->starts[depth + i] + c->types[type].gpus;
        w->remaining[type]--;
    }
    if (settle_stages(w, w->starts[depth + child->type_count], pending) != 0)
        w->failed = true;
    return depth + child->type_count;
}

static void undo_child(tree_worker *w, const tree_child *child)
{
    for (int i = 0; i < child->type_count; i++)
        w->remaining[w->child_types[child->first_type + i]]++;
}

/* When the budget stops the search: every placement not visited lies
 * under a child not yet visited, at some level of the path. */
static void note_open_floor(tree_worker *w, int depth, int first, int end)
{
    int saved_final = w->final_count;
    for (int i = first; i < end && !w->failed; i++) {
        tree_child child = w->children[i];
        double floor_s = child.floor_s;
        if (child.generation != w->capacity_generation) {
            /* floored before the tables it would meet now: again */
            bool pending = false;
            int next = apply_child(w, depth, &child, &pending);
            double again;
            if (!w->failed && w->starts[next] < w->gpus &&
                child_floor(w, next, pending, &again) == 0)
                floor_s = fmax(floor_s, again);
            undo_child(w, &child);
            w->final_count = saved_final;
        }
        w->outcome->open_floor_s = fmin(w->outcome->open_floor_s, floor_s);
    }
}

/* Visits the node whose first `depth` nodes are placed. */
static void expand(tree_worker *w, int depth)
{
    int first = w->child_count, first_type = w->child_type_count;
    find_children(w, depth, depth);
    int end = w->child_count;
    if (!w->limits->exhaustive && end - first > 1)
        qsort(w->children + first, (size_t)(end - first),
              sizeof *w->children, compare_children);
    int saved_final = w->final_count;
    for (int i = first; i < end && !w->failed; i++) {
        if (w->stop) {
            note_open_floor(w, depth, i, end);
            break;
        }
        tree_child child = w->children[i];
        if (child.floor_s > current_threshold(w)) {
            w->outcome->pruned += end - i; /* the rest are no lower */
            break;
        }
        bool pending = false;
        int next = apply_child(w, depth, &child, &pending);
        /* tables built since the child was floored may cut it now */
        if (!w->failed && child.generation != w->capacity_generation &&
            w->starts[next] < w->gpus) {
            double floor_s;
            if (child_floor(w, next, pending, &floor_s) != 0)
                w->failed = true;
            else if (floor_s > current_threshold(w)) {
                w->outcome->pruned++;
                next = -1;
            }
        }
        if (!w->failed && next >= 0)
            expand(w, next);
        undo_child(w, &child);
        w->final_count = saved_final;
    }
    w->child_count = first;
    w->child_type_count = first_type;
}

/* ---------------------------------------------------------- the task */

static int prepare_task(tree_worker *w, const search_task *task,
                        pt_error *err)
{
    const cluster *c = w->model.cluster;
    const parallel_config *config = &task->config;
    w->task = task;
    w->err = err;
    w->stage_gpus = (long long)config->dp * config->tp;
    w->gpus = w->stage_gpus * config->pp;
    w->final_count = 0;
    w->stop = false;
    w->failed = false;
    w->starts[0] = 0;
    for (int t = 0; t < w->type_count; t++) {
        w->remaining[t] = c->types[t].count;
        if (c->types[t].count > 0 &&
            costmodel_type_costs(&w->model, t, config, &w->prices[t],
                                 err) != 0)
            return -1;
    }
    if (bound_tables_fill(w->bounds, &w->model, config, err) != 0)
        return -1;
    /* fastest types first: a good order is found early and cuts more;
       types without nodes last */
    int used = 0;
    for (int type = 0; type < w->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        double pace = w->prices[type].layer_forward_s +
                      w->prices[type].layer_backward_s;
        int position = used++;
        while (position > 0) {
            const type_costs *before = &w->prices[w->child_order[position - 1]];
            if (before->layer_forward_s + before->layer_backward_s <= pace)
                break;
            w->child_order[position] = w->child_order[position - 1];
            position--;
        }
        w->child_order[position] = type;
    }
    for (int type = 0; type < w->type_count; type++)
        if (c->types[type].count == 0)
            w->child_order[used++] = type;
    return 0;
}

int search_task_floor(tree_worker *w, const search_task *task,
                      double threshold_s, double *floor_s, pt_error *err)
{
    if (prepare_task(w, task, err) != 0)
        return -1;
    const cluster *c = w->model.cluster;
    for (int t = 0; t < w->type_count; t++)
        w->gpus_left[t] = c->types[t].count * c->types[t].gpus;
    partial_placement empty = {w->facts, 0, false, w->gpus_left};
    if (bound_floor(w->bounds, &w->memo, &empty, INFINITY, floor_s, err) != 0)
        return -1;
    if (threshold_s == INFINITY)
        return 0;
    /* the whole task: the bottleneck it needs, found by bisection */
    if (capacity_bisect(w->bounds, &empty,
                        capacity_bottleneck_for(w->bounds, threshold_s),
                        CAPACITY_TABLE_BYTES, err) != 0)
        return -1;
    *floor_s = fmax(*floor_s, capacity_floor(w->bounds, &empty));
    return 0;
}

int search_tree_run(tree_worker *w, const search_task *task,
                    const tree_limits *limits, shortlist *best,
                    tree_outcome *outcome, pt_error *err)
{
    memset(outcome, 0, sizeof *outcome);
    outcome->open_floor_s = INFINITY;
    if (prepare_task(w, task, err) != 0)
        return -1;
    w->limits = limits;
    w->best = best;
    w->outcome = outcome;
    w->child_count = 0;
    w->child_type_count = 0;
    if (!limits->exhaustive) {
        if (build_capacity(w, limits->threshold_s, CAPACITY_GRID_LOW) != 0)
            return -1;
        /* the root again, now with the capacity tables */
        const cluster *c = w->model.cluster;
        for (int t = 0; t < w->type_count; t++)
            w->gpus_left[t] = c->types[t].count * c->types[t].gpus;
        partial_placement empty = {w->facts, 0, false, w->gpus_left};
        double floor_s = capacity_floor(w->bounds, &empty);
        if (floor_s > limits->threshold_s || floor_s == INFINITY) {
            outcome->pruned++;
            return 0;
        }
    }
    expand(w, 0);
    if (w->stop && outcome->nodes > limits->node_budget)
        outcome->stopped = true;
    return w->failed ? -1 : 0;
}
