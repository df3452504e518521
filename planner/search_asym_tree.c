/*
 * The asymmetric search's tree (issue 36; docs/planner.md, "Stages of
 * their own degrees"). A task is a micro-batch of B samples; its tree
 * places the stages from the last one back, each a shape (tp x dp) over
 * the GPUs just in front of those placed, and the node order with them:
 * a stage that reaches past the nodes placed so far puts nodes in front,
 * by type (nodes of one type are interchangeable, so an order is a
 * sequence of types, each visited once, its tails shared). A stage that
 * reaches GPU 0 is the first: pp is the tree's depth there, so one tree
 * holds every pp. Children are floored (search_asym_bound.c) and visited
 * lowest floor first; a child or task whose floor reaches the threshold
 * (never above the symmetric search's best score, the shortlist's worst
 * once full) is cut with all after it. A budget of tree nodes stops the
 * walk with a proved floor under every plan not visited.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A child of a tree node: its stage's shape and the node types it puts
 * in front (at types_at in its level's arena, nearest first). */
typedef struct asym_child {
    double floor;
    int shape, added, types_at;
    int kin; /* its class of alike children (kin_of), -1: none */
} asym_child;

/* What the walk knows of a class of alike children: none visited yet,
 * one visited that kept no plan, or one that kept some. */
enum { KIN_UNVISITED, KIN_BARREN, KIN_FRUITFUL };

/* The children of one depth, room for their node types, and the state
 * of their classes of alike children. */
typedef struct asym_tier {
    asym_child *children;
    int count, capacity;
    int *types;
    int type_count, type_capacity;
    unsigned char *kin_state;
    int kin_count, kin_capacity;
} asym_tier;

/* Symmetric tree nodes (max_tree_nodes) a partial plan counts as: about
 * the time of one floored and priced. */
#define ASYM_NODE_WEIGHT 200

/* The task and children this shallow are floored in full when a walk
 * asks (refine_inherited): a floor holds for every plan under the node,
 * so under a child the greater of its own and its ancestors' holds
 * (which makes the gap a stopped walk proves that much smaller). */
#define ASYM_REFINED_DEPTH 3

/* A task: a micro-batch, with its root floor. */
typedef struct asym_task {
    int batch;
    double floor;
} asym_task;

typedef struct asym_tree {
    asym_walk *w;
    const cluster *c;
    int type_count, layers, node_count, most_stages;
    long long gpus;
    int node_base[PLANNER_MAX_TYPES];
    asym_batch *batches;
    int batch_count;
    asym_stages *stages;
    asym_bound *bound;
    int batch, most_here;  /* the task at hand and its most stages */
    /* the nodes placed, the last of the order at node_count - 1 and the
       front at `front`; the nodes of each type left */
    int front;
    int types[PLANNER_MAX_NODES];
    int starts[PLANNER_MAX_NODES + 1];
    int left[PLANNER_MAX_TYPES];
    /* the stages placed, by depth (0: the last stage) */
    parallel_config configs[ASYM_MAX_STAGES];
    long long firsts[ASYM_MAX_STAGES + 1];
    asym_placed placed[ASYM_MAX_STAGES];
    asym_placed unsent[ASYM_MAX_STAGES]; /* placed's, before their sends */
    double *work;          /* [stages x (layers + 1)] their work */
    asym_tier *levels;    /* [most stages] */
    /* the floors in full of the task and the shallowest stages visited
       (refine_inherited), each taken when first needed: the GPUs each
       depth left, and whether its floor is known yet */
    double task_full, depth_full[ASYM_REFINED_DEPTH];
    bool task_known, depth_known[ASYM_REFINED_DEPTH];
    int depth_left[ASYM_REFINED_DEPTH][PLANNER_MAX_TYPES];
    long long budget;      /* tree nodes at most; 0: none */
    /* the tasks, lowest floor first, the one at hand, and whether the
       floor of those after it was noted (stop_later_tasks) */
    const asym_task *tasks;
    int task_count, task_at;
    bool tasks_noted;
    /* alike children (kin_of): whether the cluster allows them, and the
       classes of the children being collected, by key: their floor */
    bool kin_allowed;
    memo_table kin;
} asym_tree;

/* ------------------------------------------------------------ the lane */

static node_lane lane_of(const asym_tree *t)
{
    return (node_lane){t->node_count - t->front, t->types + t->front,
                       t->starts + t->front};
}

static void lane_push(asym_tree *t, int type)
{
    t->front--;
    t->types[t->front] = type;
    t->starts[t->front] = t->starts[t->front + 1] - t->c->types[type].gpus;
    t->left[type]--;
}

static void lane_pop(asym_tree *t)
{
    t->left[t->types[t->front]]++;
    t->front++;
}

/* The GPUs of each type in front of GPU `end`. */
static void gpus_left(const asym_tree *t, long long end, int *out)
{
    for (int type = 0; type < t->type_count; type++)
        out[type] = t->left[type] * t->c->types[type].gpus;
    if (t->front < t->node_count && t->starts[t->front] < end)
        out[t->types[t->front]] += (int)(end - t->starts[t->front]);
}

/* The walk's node order: the k-th node of a type is that type's k-th. */
static void write_order(asym_tree *t)
{
    int used[PLANNER_MAX_TYPES] = {0};
    for (int i = 0; i < t->node_count; i++) {
        int type = t->types[i];
        t->w->order[i] = t->node_base[type] + used[type]++;
    }
}

/* ---------------------------------------------------------- the stages */

static const asym_shape *shape_of(const asym_tree *t, int k)
{
    return &t->batches[t->batch].shape[k];
}

/* Where the stage at `depth` sits for the cost model (asym_role): the
 * first of depth + 1 stages, or the second of depth + 2. */
static asym_role role_at(const asym_tree *t, int depth)
{
    if (t->firsts[depth] == 0)
        return (asym_role){depth + 1, 0};
    return (asym_role){depth + 2, 1};
}

/* The stage at `depth` made exact: its neighbours (the stage in front,
 * unless it is the first, and the one behind, unless it is the last)
 * are placed. */
static int place_exact(asym_tree *t, int depth)
{
    asym_role role = role_at(t, depth);
    parallel_config configs[3];
    long long firsts[4];
    int own = role.stage, count = 0;
    if (own == 1) {
        configs[count] = t->configs[depth + 1];
        firsts[count++] = t->firsts[depth + 1];
    }
    configs[count] = t->configs[depth];
    firsts[count++] = t->firsts[depth];
    if (depth > 0) {
        configs[count] = t->configs[depth - 1];
        firsts[count++] = t->firsts[depth - 1];
    }
    firsts[count] = depth > 0 ? t->firsts[depth - 1] +
                                    (long long)t->configs[depth - 1].tp *
                                        t->configs[depth - 1].dp
                              : t->gpus;
    for (int i = 0; i < count; i++)
        configs[i].pp = role.pp;
    stage_terms terms;
    node_lane lane = lane_of(t);
    if (costmodel_stage_terms_inner(t->w->cm, configs, firsts, &lane, own,
                                    &terms, t->w->err) != 0)
        return -1;
    t->placed[depth].fixed = terms.fixed_s;
    t->placed[depth].pace = terms.per_layer_s;
    t->placed[depth].cap = terms.max_layers;
    asym_bound_forget(t->bound, depth);
    return 0;
}

/* The stage at `depth` of shape k ending at GPU `end`, on the nodes
 * placed: priced without its sends (a copy kept in unsent[depth]). */
static int place_unsent(asym_tree *t, int depth, int k, long long end)
{
    const asym_shape *shape = shape_of(t, k);
    long long first = end - shape->gpus;
    t->firsts[depth] = first;
    asym_role role = role_at(t, depth);
    t->configs[depth] = asym_stage_config(
        t->w->options, role.pp, t->batches[t->batch].samples, shape->tp,
        shape->dp);
    node_lane lane = lane_of(t);
    asym_placed *placed = &t->placed[depth];
    asym_bound_forget(t->bound, depth);
    if (asym_stages_price(t->stages, t->batch, k, &role, &lane, first,
                          placed, t->w->err) != 0)
        return -1;
    /* the last stage and the first pay the embedding's all-reduce */
    if (depth == 0 || first == 0)
        placed->extra = asym_stages_embedding_floor(t->stages, shape->tp);
    t->unsent[depth] = *placed;
    return 0;
}

/* The stage at `depth` back to its terms without its sends. */
static void restore_unsent(asym_tree *t, int depth)
{
    t->placed[depth] = t->unsent[depth];
    asym_bound_forget(t->bound, depth);
}

/* With the stage at `depth` priced: the stage behind it made exact, and
 * the stage itself when it is the first. */
static int settle(asym_tree *t, int depth)
{
    if ((depth > 0 && place_exact(t, depth - 1) != 0) ||
        (t->firsts[depth] == 0 && place_exact(t, depth) != 0))
        return -1;
    return 0;
}

/* ------------------------------------------------------------ children */

static int grow(void **items, int *capacity, int needed, size_t size,
                pt_error *err)
{
    if (needed <= *capacity)
        return 0;
    int capacity_now = needed * 2 + 16;
    void *grown = realloc(*items, size * (size_t)capacity_now);
    if (grown == NULL)
        return pt_fail(err, "search: out of memory for the tree");
    *items = grown;
    *capacity = capacity_now;
    return 0;
}

static int add_child(asym_tree *t, asym_tier *level, int k, int front,
                     double floor)
{
    int added = front - t->front;
    if (grow((void **)&level->children, &level->capacity, level->count + 1,
             sizeof *level->children, t->w->err) != 0 ||
        grow((void **)&level->types, &level->type_capacity,
             level->type_count + added, sizeof *level->types,
             t->w->err) != 0)
        return -1;
    /* nearest the stages placed first, as visit puts them back */
    for (int i = 0; i < added; i++)
        level->types[level->type_count + i] = t->types[front - 1 - i];
    level->children[level->count++] =
        (asym_child){floor, k, added, level->type_count, -1};
    level->type_count += added;
    return 0;
}

/* The floor of the tree node with `depth` + 1 stages placed (in full:
 * refined up to the threshold). */
static double floor_of(asym_tree *t, int depth, int *left, bool full,
                       bool by_gpu)
{
    const asym_batch *mb = &t->batches[t->batch];
    int inflight = depth + 2 < mb->microbatches ? depth + 2
                                                : mb->microbatches;
    asym_floor_query q = {t->batch, mb->microbatches, t->placed, depth + 1,
                          left, inflight, false, full, by_gpu};
    return asym_bound_floor(t->bound, &q, asym_threshold(t->w), t->w->err);
}

/* The floor in full of the tree node with `depth` + 1 stages placed on
 * the GPUs `left`, and where it is below `below` (where a higher floor
 * would matter) the greater of it and the floor in full over the
 * relaxation's list of the GPUs left (tighter, and dearer: a table per
 * count left). NAN on error. */
static double full_floor_of(asym_tree *t, int depth, int *left,
                            double below)
{
    double coarse = floor_of(t, depth, left, true, false);
    if (isnan(coarse) || !(coarse < below))
        return coarse;
    double fine = floor_of(t, depth, left, true, true);
    return isnan(fine) ? fine : asym_max(coarse, fine);
}

static double floor_here(asym_tree *t, int depth, bool full)
{
    int left[PLANNER_MAX_TYPES];
    gpus_left(t, t->firsts[depth], left);
    return floor_of(t, depth, left, full, false);
}

static double full_floor_here(asym_tree *t, int depth, double below)
{
    int left[PLANNER_MAX_TYPES];
    gpus_left(t, t->firsts[depth], left);
    return full_floor_of(t, depth, left, below);
}

/* A class of alike children: what a child's floor and every plan under
 * it cost do not change when the nodes its stage puts in front wholly
 * inside it are put in another order, where those nodes hold whole tp
 * groups of the stage and the cluster's links between nodes are the
 * slower of the two nodes' own (kin_allowed): every fact the cost model
 * reads of a stage, of its neighbours' sends to it and of the embedding
 * is then the same (a tp group in one node is priced by its type, ties
 * going to the lower type; its dp ring, its sends and the embedding's
 * all-reduce cross the slowest link of a set of node pairs that meets
 * every node it meets in any order, and the slowest of those links is
 * the slowest of those nodes' own; its memory is its smallest type's).
 * The key: the shape, the type of the front node when it is shared with
 * the stages to come, and how many of each type the others hold; into
 * key, its length in ints, or 0 when the child has no class. */
static int kin_of(const asym_tree *t, int k, long long first, int front,
                  int *key)
{
    int tp = shape_of(t, k)->tp;
    bool shared = t->starts[t->front] < first;
    int from = t->front + shared;
    if (!t->kin_allowed || front - from < 2 ||
        (t->starts[from] - first) % tp != 0)
        return 0;
    int n = 0;
    key[n++] = k;
    key[n++] = shared ? t->types[t->front] : -1;
    for (int type = 0; type < t->type_count; type++)
        key[n + type] = 0;
    for (int i = from; i < front; i++) {
        if (t->c->types[t->types[i]].gpus % tp != 0)
            return 0;
        key[n + t->types[i]]++;
    }
    return n + t->type_count;
}

/* What the first child of a class was given while a node's children
 * are collected (the memo `kin`, by kin_of's key): its floor, and its
 * class in the level's kin_state (-1: it was cut). */
typedef struct kin_floor {
    double floor;
    int kin;
} kin_floor;

static int new_kin(asym_tree *t, asym_tier *level)
{
    if (grow((void **)&level->kin_state, &level->kin_capacity,
             level->kin_count + 1, 1, t->w->err) != 0)
        return -1;
    level->kin_state[level->kin_count] = KIN_UNVISITED;
    return level->kin_count++;
}

static int price_and_floor(asym_tree *t, int depth, int k, long long end,
                           double *floor);

/* Prices the stage at `depth` of shape k on the nodes as extended,
 * floors it and keeps it when the floor is below the threshold; a child
 * alike to one floored before takes its floor and class. */
static int consider(asym_tree *t, int depth, int k, long long end, int front)
{
    asym_walk *w = t->w;
    asym_tier *level = &t->levels[depth];
    int key[2 + PLANNER_MAX_TYPES];
    int length = kin_of(t, k, end - shape_of(t, k)->gpus, front, key);
    size_t bytes = sizeof(int) * (size_t)length;
    uint64_t hash = length > 0 ? memo_hash(key, bytes) : 0;
    const kin_floor *known =
        length > 0 ? memo_find(&t->kin, key, bytes, hash) : NULL;
    if (known != NULL) {
        /* counted as floored: the budget bounds the listing of children
           too (a stage over many nodes has thousands of node orders) */
        w->nodes++;
        w->alike++;
        if (known->floor >= asym_threshold(w)) {
            w->pruned++;
            return 0;
        }
        if (add_child(t, level, k, front, known->floor) != 0)
            return -1;
        level->children[level->count - 1].kin = known->kin;
        return 0;
    }
    double floor;
    if (price_and_floor(t, depth, k, end, &floor) != 0)
        return -1;
    kin_floor noted = {floor, -1};
    if (length > 0 && floor < asym_threshold(w) &&
        (noted.kin = new_kin(t, level)) < 0)
        return -1;
    if (length > 0) {
        kin_floor *room = memo_insert(&t->kin, key, bytes, hash,
                                      sizeof noted);
        if (room == NULL)
            return pt_fail(w->err, "search: out of memory for the tree");
        *room = noted;
    }
    if (floor >= asym_threshold(w)) {
        w->pruned++;
        return 0;
    }
    if (add_child(t, level, k, front, floor) != 0)
        return -1;
    level->children[level->count - 1].kin = noted.kin;
    return 0;
}

/* The floor of the stage at `depth` of shape k on the nodes as
 * extended, priced. */
static int price_and_floor(asym_tree *t, int depth, int k, long long end,
                           double *out)
{
    asym_walk *w = t->w;
    w->nodes++;
    /* floored first with the stage behind it without its sends (a send
       only adds), then, unless that cuts it, exact */
    if (depth > 0)
        restore_unsent(t, depth - 1);
    if (place_unsent(t, depth, k, end) != 0)
        return -1;
    double floor = floor_here(t, depth, false);
    if (!isnan(floor) && floor < asym_threshold(w)) {
        if (settle(t, depth) != 0)
            return -1;
        floor = floor_here(t, depth, false);
    }
    if (isnan(floor))
        return -1;
    *out = floor;
    return 0;
}

/* Puts nodes in front, every type in turn, until they reach GPU `first`,
 * and considers the stage there. */
static int extend(asym_tree *t, int depth, int k, long long end,
                  long long first, int front)
{
    if (t->starts[t->front] <= first)
        return consider(t, depth, k, end, front);
    for (int type = 0; type < t->type_count; type++) {
        if (t->left[type] == 0)
            continue;
        lane_push(t, type);
        int rc = extend(t, depth, k, end, first, front);
        lane_pop(t);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int compare_children(const void *a, const void *b)
{
    double x = ((const asym_child *)a)->floor,
           y = ((const asym_child *)b)->floor;
    return (x > y) - (x < y);
}

/* The children of the node that places the stage at `depth`, ending at
 * GPU `end`: floored and sorted, into levels[depth]. */
static int collect_children(asym_tree *t, int depth, long long end)
{
    asym_tier *level = &t->levels[depth];
    level->count = 0;
    level->type_count = 0;
    level->kin_count = 0;
    memo_clear(&t->kin);
    const asym_batch *mb = &t->batches[t->batch];
    for (int k = 0; k < mb->count; k++) {
        long long first = end - mb->shape[k].gpus;
        /* the first stage ends the plan: pp >= 2; else a stage more must
           fit */
        if (first < 0 || (first == 0 && depth == 0) ||
            (first > 0 && depth + 2 > t->most_here))
            continue;
        if (extend(t, depth, k, end, first, t->front) != 0)
            return -1;
    }
    if (level->count > 1) /* children is NULL while a level has none */
        qsort(level->children, (size_t)level->count,
              sizeof *level->children, compare_children);
    return 0;
}

/* -------------------------------------------------------------- descent */

/* Records that the walk stops here: no plan under a child not visited
 * scores below its floor. */
static void stop_at(asym_walk *w, double floor)
{
    w->stopped = true;
    if (floor < w->open_floor)
        w->open_floor = floor;
}

/* The plan the stages placed make, scored. */
static int score_here(asym_tree *t, int depth)
{
    asym_walk *w = t->w;
    w->pp = depth + 1;
    for (int d = 0; d <= depth; d++)
        w->degrees[depth - d] =
            (stage_degrees){t->configs[d].tp, t->configs[d].dp};
    write_order(t);
    asym_score_plan(w);
    return w->failed ? -1 : 0;
}

static int descend(asym_tree *t, int depth, long long end, double inherited);

/* Places child i of levels[depth]: its nodes put in front, its stage
 * and the one behind it exact. */
static int enter(asym_tree *t, int depth, long long end, int i)
{
    asym_tier *level = &t->levels[depth];
    asym_child child = level->children[i];
    for (int j = 0; j < child.added; j++)
        lane_push(t, level->types[child.types_at + j]);
    if (depth > 0)
        restore_unsent(t, depth - 1);
    return place_unsent(t, depth, child.shape, end) != 0 ||
                   settle(t, depth) != 0
               ? -1
               : 0;
}

/* Visits child i of levels[depth], whose ancestors' floors are at least
 * `inherited`. */
static int visit(asym_tree *t, int depth, long long end, int i,
                 double inherited)
{
    const asym_tier *level = &t->levels[depth];
    int front = t->front;
    int rc = enter(t, depth, end, i);
    if (rc == 0 && t->firsts[depth] > 0 && depth < ASYM_REFINED_DEPTH) {
        gpus_left(t, t->firsts[depth], t->depth_left[depth]);
        t->depth_known[depth] = false;
    }
    inherited = asym_max(inherited, level->children[i].floor);
    if (rc == 0)
        rc = t->firsts[depth] == 0
                 ? score_here(t, depth)
                 : descend(t, depth + 1, t->firsts[depth], inherited);
    while (t->front < front)
        lane_pop(t);
    return rc;
}

/* When the budget stops the walk at child i of levels[depth]: the least
 * floor of the children from i on, refined in full (a child's floor was
 * refined only until it was known not to cut). Children are sorted by
 * their floors as kept, which are no higher than the refined ones: once
 * the next kept floor reaches the least refined one, none after it is
 * lower. NAN on error. */
static double open_children_floor(asym_tree *t, int depth, long long end,
                                  int i)
{
    asym_tier *level = &t->levels[depth];
    double least = INFINITY;
    /* below the floor noted already (the tasks after this one's, and
       the deeper levels'), no child need be refined further: the least
       floor noted is the one told */
    double noted = t->w->open_floor;
    for (; i < level->count &&
           level->children[i].floor < asym_min(least, noted);
         i++) {
        int front = t->front;
        double floor = enter(t, depth, end, i) != 0
                           ? NAN
                           : full_floor_here(t, depth,
                                             asym_min(least, noted));
        while (t->front < front)
            lane_pop(t);
        if (isnan(floor))
            return NAN;
        least = asym_min(least, floor);
    }
    return least;
}

static double task_floor(asym_tree *t, int b, bool full);
static int stop_later_tasks(asym_tree *t);

/* The floor in full of the stages placed down to `depth` when visited:
 * the stage at `depth` as then (without its sends), on the GPUs it left
 * then; the stages behind it have not changed since. */
static double depth_floor(asym_tree *t, int depth)
{
    asym_placed now = t->placed[depth];
    restore_unsent(t, depth);
    double floor = full_floor_of(t, depth, t->depth_left[depth],
                                 asym_min(asym_threshold(t->w),
                                          t->w->open_floor));
    t->placed[depth] = now;
    asym_bound_forget(t->bound, depth);
    return floor;
}

/* The greatest floor in full of the task and the ancestors (up to
 * ASYM_REFINED_DEPTH) of the children at `depth`, each taken once per
 * visit when first asked. NAN on error. */
static double refine_inherited(asym_tree *t, int depth)
{
    if (!t->task_known) {
        t->task_full = task_floor(t, t->batch, true);
        t->task_known = !isnan(t->task_full);
    }
    double most = t->task_full;
    for (int d = 0; d < depth && d < ASYM_REFINED_DEPTH && !isnan(most);
         d++) {
        if (!t->depth_known[d]) {
            t->depth_full[d] = depth_floor(t, d);
            t->depth_known[d] = !isnan(t->depth_full[d]);
        }
        most = isnan(t->depth_full[d]) ? NAN
                                       : asym_max(most, t->depth_full[d]);
    }
    return most;
}

static int descend(asym_tree *t, int depth, long long end, double inherited)
{
    asym_walk *w = t->w;
    if (collect_children(t, depth, end) != 0)
        return -1;
    asym_tier *level = &t->levels[depth];
    for (int i = 0; i < level->count; i++) {
        double floor = asym_max(level->children[i].floor, inherited);
        bool stopping = t->budget > 0 && w->nodes >= t->budget;
        /* the ancestors' floors in full cut more only below the cutoff
           (the shortlist full) and prove more only where the walk stops */
        if (floor < asym_threshold(w) &&
            (stopping || asym_threshold(w) < w->cutoff)) {
            double full = refine_inherited(t, depth);
            if (isnan(full))
                return -1;
            inherited = asym_max(inherited, full);
            floor = asym_max(floor, inherited);
        }
        if (floor >= asym_threshold(w)) {
            w->pruned += level->count - i;
            break;
        }
        if (stopping) {
            if (stop_later_tasks(t) != 0)
                return -1;
            floor = open_children_floor(t, depth, end, i);
            if (isnan(floor))
                return -1;
            stop_at(w, asym_max(floor, inherited));
            break;
        }
        /* a child alike to one visited that kept no plan keeps none:
           its plans cost what that one's did, and the threshold has
           only fallen since */
        int kin = level->children[i].kin;
        if (kin >= 0 && level->kin_state[kin] == KIN_BARREN)
            continue;
        long long offered = w->offered;
        if (visit(t, depth, end, i, inherited) != 0)
            return -1;
        if (kin >= 0 && level->kin_state[kin] == KIN_UNVISITED)
            level->kin_state[kin] = w->offered == offered ? KIN_BARREN
                                                          : KIN_FRUITFUL;
    }
    return 0;
}

/* ---------------------------------------------------------------- tasks */

static int compare_tasks(const void *a, const void *b)
{
    double x = ((const asym_task *)a)->floor,
           y = ((const asym_task *)b)->floor;
    return (x > y) - (x < y);
}

static void start_task(asym_tree *t, int batch)
{
    const asym_batch *mb = &t->batches[batch];
    t->batch = batch;
    t->w->samples = mb->samples;
    t->most_here = t->most_stages;
    while ((long)t->most_here * mb->microbatches >
           COSTMODEL_MAX_SCHEDULE_STEPS)
        t->most_here--;
    t->front = t->node_count;
    for (int type = 0; type < t->type_count; type++)
        t->left[type] = t->c->types[type].count;
    t->task_known = false;
}

/* The root floor of micro-batch b's task (in full: refined up to the
 * threshold). */
static double task_floor(asym_tree *t, int b, bool full)
{
    int left[PLANNER_MAX_TYPES];
    for (int type = 0; type < t->type_count; type++)
        left[type] = t->c->types[type].count * t->c->types[type].gpus;
    const asym_batch *mb = &t->batches[b];
    /* every GPU left: the list by GPUs is the list by types */
    asym_floor_query q = {b, mb->microbatches, NULL, 0, left, 1,
                          true, full, false};
    return asym_bound_floor(t->bound, &q, asym_threshold(t->w), t->w->err);
}

/* Every micro-batch with its root floor, lowest first. */
static asym_task *collect_tasks(asym_tree *t, int *count)
{
    asym_task *tasks = malloc(sizeof *tasks * ((size_t)t->batch_count + 1));
    *count = 0;
    for (int b = 0; tasks != NULL && b < t->batch_count; b++) {
        start_task(t, b);
        if (t->most_here < 2)
            continue;
        double floor = task_floor(t, b, false);
        if (isnan(floor)) {
            free(tasks);
            return NULL;
        }
        if (floor < INFINITY)
            tasks[(*count)++] = (asym_task){b, floor};
    }
    if (tasks != NULL)
        qsort(tasks, (size_t)*count, sizeof *tasks, compare_tasks);
    return tasks;
}

/* Where the walk stops: the least floor in full of the tasks after the
 * one at hand (as open_children_floor: those lowest first, until the
 * next is no lower), noted once and first, so that the open children's
 * floors are refined only below it. */
static int stop_later_tasks(asym_tree *t)
{
    if (t->tasks_noted)
        return 0;
    t->tasks_noted = true;
    double least = INFINITY;
    for (int j = t->task_at + 1;
         j < t->task_count && t->tasks[j].floor < least; j++)
        least = asym_min(least, task_floor(t, t->tasks[j].batch, true));
    if (isnan(least))
        return -1;
    stop_at(t->w, least);
    return 0;
}

static int walk_tasks(asym_tree *t)
{
    asym_walk *w = t->w;
    int count = 0, rc = 0;
    asym_task *tasks = collect_tasks(t, &count);
    if (tasks == NULL)
        return w->err->message[0] ? -1
                                  : pt_fail(w->err, "search: out of memory "
                                                    "for the tasks");
    t->tasks = tasks;
    t->task_count = count;
    for (int i = 0; i < count && rc == 0; i++) {
        if (tasks[i].floor >= asym_threshold(w)) {
            w->pruned += count - i;
            break;
        }
        if (t->budget > 0 && w->nodes >= t->budget) {
            t->task_at = i - 1;
            rc = stop_later_tasks(t);
            break;
        }
        t->task_at = i;
        start_task(t, tasks[i].batch);
        rc = descend(t, 0, t->gpus, tasks[i].floor);
    }
    free(tasks);
    return rc;
}

/* ---------------------------------------------------------- the shapes */

/* Every micro-batch of B samples dividing gbs and the stages it allows:
 * tp a power of two up to 8 splitting the model's attention, dp dividing
 * B with B / dp at most max_mbs, at most the cluster's GPUs. */
static int collect_batches(asym_tree *t, pt_error *err)
{
    const search_options *o = t->w->options;
    t->batches = calloc((size_t)o->gbs + 1, sizeof *t->batches);
    if (t->batches == NULL)
        return pt_fail(err, "search: out of memory for the micro-batches");
    for (int samples = 1; samples <= o->gbs; samples++) {
        if (o->gbs % samples != 0 ||
            (long)(o->gbs / samples) * 2 > COSTMODEL_MAX_SCHEDULE_STEPS)
            continue;
        asym_batch *b = &t->batches[t->batch_count];
        b->samples = samples;
        b->microbatches = o->gbs / samples;
        b->shape = calloc(4 * (size_t)t->gpus, sizeof *b->shape);
        if (b->shape == NULL)
            return pt_fail(err, "search: out of memory for the shapes");
        t->batch_count++;
        for (int tp = 1; tp <= 8; tp *= 2) {
            if (model_check_tp(&t->w->cm->model, tp, NULL) != 0)
                continue;
            for (int dp = 1; dp * tp <= t->gpus; dp++)
                if (samples % dp == 0 && samples / dp <= o->max_mbs)
                    b->shape[b->count++] = (asym_shape){dp * tp, tp, dp};
        }
    }
    return 0;
}

/* ------------------------------------------------------------ set-up */

/* Whether alike children (kin_of) may share a class: no link named for
 * a pair of types, each link between nodes the slower of the two nodes'
 * own (of two types the one of less bandwidth has no less latency), and
 * no GPUs that are slices of one device. */
static bool kin_allowed(const cluster *c)
{
    if (c->link_count > 0)
        return false;
    for (int a = 0; a < c->type_count; a++) {
        const link_spec *x = &c->types[a].inter_node;
        if (c->types[a].device_count > 0)
            return false;
        for (int b = 0; b < c->type_count; b++) {
            const link_spec *y = &c->types[b].inter_node;
            if (x->bandwidth_bytes_per_s < y->bandwidth_bytes_per_s &&
                x->latency_s < y->latency_s)
                return false;
            if (x->bandwidth_bytes_per_s == y->bandwidth_bytes_per_s &&
                x->latency_s != y->latency_s)
                return false;
        }
    }
    return true;
}

static int open_tree(asym_tree *t, asym_walk *w)
{
    const cluster *c = w->cm->cluster;
    *t = (asym_tree){.w = w, .c = c, .type_count = c->type_count,
                     .layers = w->cm->model.layers,
                     .node_count = c->node_count, .gpus = w->gpus};
    /* a partial plan floored costs the worth of many symmetric tree
       nodes: the budget is max_tree_nodes' share */
    long long most = w->options->max_tree_nodes;
    t->budget = most > 0 ? (most + ASYM_NODE_WEIGHT - 1) / ASYM_NODE_WEIGHT
                         : 0;
    t->kin_allowed = kin_allowed(c);
    t->most_stages = w->gpus < t->layers ? w->gpus : t->layers;
    if (t->most_stages > ASYM_MAX_STAGES)
        t->most_stages = ASYM_MAX_STAGES;
    for (int type = 1; type < c->type_count; type++)
        t->node_base[type] = t->node_base[type - 1] + c->types[type - 1].count;
    t->starts[t->node_count] = (int)t->gpus;
    t->work = malloc(sizeof(double) * (size_t)(t->most_stages + 1) *
                     (size_t)(t->layers + 1));
    t->levels = calloc((size_t)t->most_stages + 1, sizeof *t->levels);
    if (t->work == NULL || t->levels == NULL)
        return pt_fail(w->err, "search: out of memory for the tree");
    for (int s = 0; s < t->most_stages; s++)
        t->placed[s].work = t->work + (size_t)s * (size_t)(t->layers + 1);
    if (collect_batches(t, w->err) != 0)
        return -1;
    asym_relax *relax = NULL;
    if (asym_stages_open(&t->stages, w->cm, w->options, t->batches,
                         t->batch_count, w->cutoff, w->err) != 0)
        return -1;
    if (asym_relax_open(&relax, w->cm, w->options, t->batches,
                        t->batch_count, w->cutoff, t->stages, w->err) != 0) {
        asym_relax_close(relax);
        return -1;
    }
    return asym_bound_open(&t->bound, relax, t->layers, w->err);
}

static void close_tree(asym_tree *t)
{
    asym_bound_close(t->bound);
    asym_stages_close(t->stages);
    for (int s = 0; t->levels != NULL && s < t->most_stages; s++) {
        free(t->levels[s].children);
        free(t->levels[s].types);
        free(t->levels[s].kin_state);
    }
    memo_free(&t->kin);
    free(t->levels);
    free(t->work);
    for (int b = 0; t->batches != NULL && b < t->batch_count; b++)
        free(t->batches[b].shape);
    free(t->batches);
}

int asym_walk_tree(asym_walk *w)
{
    asym_tree *t = malloc(sizeof *t);
    if (t == NULL)
        return pt_fail(w->err, "search: out of memory for the tree");
    int rc = open_tree(t, w);
    if (rc == 0)
        rc = walk_tasks(t);
    close_tree(t);
    free(t);
    return rc;
}
