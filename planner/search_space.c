/*
 * The search space: every (tp, dp, pp) that fills the cluster, the
 * micro-batch sizes gbs allows, and the distinct node orders.
 *
 * Nodes of one type are interchangeable, so an order is a sequence of
 * node types (a permutation of a multiset). Two sequences cost the same
 * when they differ only by how the nodes lying wholly inside one stage
 * are arranged: such a stage holds the same GPU types either way, and
 * every link the cost model reads there (the slowest link of the dp ring,
 * of the replica-to-replica sends to the neighbouring stages and of the
 * embedding all-reduce) is the slowest over a set of nodes that the
 * rearrangement does not change (docs/planner.md). So only the canonical
 * sequence is kept: inside each stage, the run of whole nodes goes in
 * non-decreasing type order. A depth-first walk that enforces this as it
 * places nodes visits each distinct order exactly once, without
 * generating the duplicates first.
 */
#include "planner/internal.h"

#include <stdlib.h>
#include <string.h>

/* Past this many orders a search would take hours: refuse it. */
#define SEARCH_MAX_ORDERS 2000000

/* The depth-first walk over one shape's canonical orders. */
typedef struct order_walk {
    const cluster *c;
    int stage_gpus;                    /* dp x tp */
    int remaining[PLANNER_MAX_TYPES];  /* nodes of each type not placed */
    int first_node[PLANNER_MAX_TYPES]; /* instance number of each type's
                                          first node */
    int types[PLANNER_MAX_NODES];      /* type at each placed position */
    int depth;
    search_space *space;
    int shape_index;
    int order_capacity;
    pt_error *err;
    bool failed;
} order_walk;

static int grow_orders(order_walk *walk)
{
    search_space *space = walk->space;
    if (space->order_count < walk->order_capacity)
        return 0;
    if (space->order_count >= SEARCH_MAX_ORDERS)
        return pt_fail(walk->err, "search: cluster %s has more than %d "
                       "distinct node orders; search a smaller cluster",
                       walk->c->name, SEARCH_MAX_ORDERS);
    int capacity = walk->order_capacity ? 2 * walk->order_capacity : 256;
    int *orders = realloc(space->orders, (size_t)capacity *
                                             (size_t)space->node_count *
                                             sizeof(int));
    if (orders == NULL)
        return pt_fail(walk->err, "search: out of memory for node orders");
    space->orders = orders;
    int *shape_of = realloc(space->order_shape,
                            (size_t)capacity * sizeof(int));
    if (shape_of == NULL)
        return pt_fail(walk->err, "search: out of memory for node orders");
    space->order_shape = shape_of;
    walk->order_capacity = capacity;
    return 0;
}

/* Turns the type sequence into node instances (each type's nodes in
 * their own order) and appends it. */
static void append_order(order_walk *walk)
{
    if (grow_orders(walk) != 0) {
        walk->failed = true;
        return;
    }
    search_space *space = walk->space;
    int *order = space->orders + (size_t)space->order_count *
                                     (size_t)space->node_count;
    int used[PLANNER_MAX_TYPES] = {0};
    for (int i = 0; i < space->node_count; i++) {
        int type = walk->types[i];
        order[i] = walk->first_node[type] + used[type]++;
    }
    space->order_shape[space->order_count] = walk->shape_index;
    space->order_count++;
}

/* Places a node at GPU offset `position`; previous_whole_type is the
 * type of the node before when it lay wholly inside stage
 * previous_whole_stage (else -1). */
static void extend(order_walk *walk, int position, int previous_whole_type,
                   int previous_whole_stage)
{
    if (walk->failed)
        return;
    if (walk->depth == walk->space->node_count) {
        append_order(walk);
        return;
    }
    for (int type = 0; type < walk->c->type_count; type++) {
        if (walk->remaining[type] == 0)
            continue;
        int gpus = walk->c->types[type].gpus;
        int stage = position / walk->stage_gpus;
        bool whole = (position + gpus - 1) / walk->stage_gpus == stage;
        if (whole && previous_whole_stage == stage &&
            type < previous_whole_type)
            continue; /* a rearranged duplicate of a sequence kept */
        walk->remaining[type]--;
        walk->types[walk->depth++] = type;
        extend(walk, position + gpus, whole ? type : -1, whole ? stage : -1);
        walk->depth--;
        walk->remaining[type]++;
        if (walk->failed)
            return;
    }
}

static int enumerate_orders(const cluster *c, search_space *space,
                            int shape_index, int *order_capacity,
                            pt_error *err)
{
    search_shape *shape = &space->shapes[shape_index];
    order_walk walk;
    memset(&walk, 0, sizeof walk);
    walk.c = c;
    walk.stage_gpus = shape->dp * shape->tp;
    walk.space = space;
    walk.shape_index = shape_index;
    walk.order_capacity = *order_capacity;
    walk.err = err;
    int first = 0;
    for (int t = 0; t < c->type_count; t++) {
        walk.remaining[t] = c->types[t].count;
        walk.first_node[t] = first;
        first += c->types[t].count;
    }
    shape->first_order = space->order_count;
    extend(&walk, 0, -1, -1);
    *order_capacity = walk.order_capacity;
    shape->order_count = space->order_count - shape->first_order;
    return walk.failed ? -1 : 0;
}

/* tp candidates: powers of two dividing the GPUs of every node type that
 * has nodes. */
static bool tp_divides_nodes(const cluster *c, int tp)
{
    for (int t = 0; t < c->type_count; t++)
        if (c->types[t].count > 0 && c->types[t].gpus % tp != 0)
            return false;
    return true;
}

static int add_shape(search_space *space, int *shape_capacity, int tp,
                     int dp, int pp, const search_options *options,
                     pt_error *err)
{
    search_shape shape = {tp, dp, pp, 0, {0}, 0, 0, {0}};
    for (int mbs = 1; mbs <= options->max_mbs &&
                      shape.mbs_count < SEARCH_MAX_MBS_VALUES;
         mbs *= 2)
        if (options->gbs % (dp * mbs) == 0)
            shape.mbs[shape.mbs_count++] = mbs;
    if (shape.mbs_count == 0)
        return 0;
    if (space->shape_count == *shape_capacity) {
        int capacity = *shape_capacity ? 2 * *shape_capacity : 16;
        search_shape *shapes = realloc(space->shapes,
                                       (size_t)capacity * sizeof *shapes);
        if (shapes == NULL)
            return pt_fail(err, "search: out of memory for shapes");
        space->shapes = shapes;
        *shape_capacity = capacity;
    }
    space->shapes[space->shape_count++] = shape;
    return 0;
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

int search_space_build(const cluster *c, int layers,
                       const search_options *options, search_space *out,
                       pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (check_cluster(c, err) != 0)
        return -1;
    out->node_count = c->node_count;
    int gpus = cluster_gpu_count(c);
    int shape_capacity = 0, order_capacity = 0;
    for (int tp = 1; tp <= gpus && tp_divides_nodes(c, tp); tp *= 2) {
        int groups = gpus / tp;
        for (int pp = 1; pp <= groups && pp <= layers && pp <= PT_MAX_STAGES;
             pp++) {
            if (groups % pp != 0)
                continue;
            if (add_shape(out, &shape_capacity, tp, groups / pp, pp,
                          options, err) != 0)
                goto failed;
        }
    }
    for (int s = 0; s < out->shape_count; s++)
        if (enumerate_orders(c, out, s, &order_capacity, err) != 0)
            goto failed;
    return 0;
failed:
    search_space_free(out);
    return -1;
}

void search_space_free(search_space *space)
{
    free(space->shapes);
    free(space->orders);
    free(space->order_shape);
    memset(space, 0, sizeof *space);
}
