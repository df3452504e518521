/*
 * The asymmetric search's tree (issue 36; docs/planner.md, "Stages of
 * their own degrees"): for every distinct node order, micro-batch and
 * pp, the plan is built stage by stage, each stage's GPU count and (tp,
 * dp) a choice at its node. A node's floor: the stages placed at their
 * own terms less their sends (a send, re-sharded or not, costs at least
 * 0 s), the stages to come at the most layers a second the GPUs left can
 * run (the best split of them into the stages left, from a table per
 * node order and micro-batch). Tasks (order, micro-batch, pp) are taken
 * by their root floor, children by theirs, and a subtree is cut when its
 * floor reaches the worst plan of a full shortlist, so the shortlist is
 * the one the enumeration of every plan keeps, up to ties.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below 1 by a hair: a floor's arithmetic differs from the partition's,
 * and a floor must not exceed the score by a rounding. */
#define FLOOR_MARGIN (1.0 - 1e-12)
/* Bisection steps of a floor's bottleneck: its lower end is kept, so
 * fewer steps only lower the floor (to 2^-24 of the bracket). */
#define BISECTIONS 24

/* A stage's shape: its GPUs as tp x dp. */
typedef struct asym_shape {
    int gpus, tp, dp;
} asym_shape;

/* The stages a micro-batch of `samples` samples allows. */
typedef struct asym_shapes {
    int samples, count;
    asym_shape *shape;
} asym_shapes;

/* One node order at one micro-batch: every stage's per-layer time and
 * the most layers a second the GPUs from each first one can run. */
typedef struct asym_table {
    int order, batch;     /* indices into the tree's orders and batches */
    double *pace;         /* [first * shape count + shape], INFINITY: none */
    double *throughput;   /* [first * (most + 1) + stages]; -1: no split */
    double *least_pace;   /* [first]: of any stage from first on */
} asym_table;

/* A (table, pp) to walk and its root floor. */
typedef struct asym_task {
    int table, pp;
    double floor;
} asym_task;

/* A stage placed: its terms without sends. */
typedef struct placed_stage {
    double fixed, pace;
    int cap;
} placed_stage;

typedef struct asym_tree {
    asym_walk *w;
    int *orders; /* [order_count * node_count] */
    int order_count;
    asym_shapes *batches;
    int batch_count, most_stages;
    asym_table *tables;
    int table_count;
    /* the walk at hand */
    const asym_table *table;
    const asym_shapes *shapes;
    node_lane lane;
    int lane_types[PLANNER_MAX_NODES], lane_starts[PLANNER_MAX_NODES + 1];
    int microbatches;
    placed_stage placed[ASYM_MAX_STAGES];
    parallel_config configs[ASYM_MAX_STAGES]; /* of the stages placed */
    long long firsts[ASYM_MAX_STAGES + 1];
    /* the stages' terms without sends in the task at hand, by (stage,
       first GPU, shape): valid where stamp is the task's number */
    stage_terms *memo;
    unsigned *stamp;
    unsigned task_number;
    int most_shapes;
} asym_tree;

/* Entries of the terms memo at most (else the tree goes without). */
#define MEMO_MOST_ENTRIES (1 << 21)

/* ---------------------------------------------------------- node orders */

/* Every distinct node order (nodes of one type are interchangeable: the
 * k-th node of a type placed is its k-th instance). */
static int collect_orders(asym_tree *t, int *order, int position,
                          int *left, int *used)
{
    const cluster *c = t->w->cm->cluster;
    int nodes = t->w->node_count;
    if (position == nodes) {
        memcpy(t->orders + (size_t)t->order_count * nodes, order,
               sizeof(int) * (size_t)nodes);
        t->order_count++;
        return 0;
    }
    int node_base = 0;
    for (int type = 0; type < c->type_count; type++) {
        if (left[type] > 0) {
            order[position] = node_base + used[type];
            left[type]--;
            used[type]++;
            collect_orders(t, order, position + 1, left, used);
            left[type]++;
            used[type]--;
        }
        node_base += c->types[type].count;
    }
    return 0;
}

static void open_lane(asym_tree *t, const int *order)
{
    const cluster *c = t->w->cm->cluster;
    t->lane_starts[0] = 0;
    for (int i = 0; i < t->w->node_count; i++) {
        t->lane_types[i] = cluster_node_type(c, order[i]);
        t->lane_starts[i + 1] = t->lane_starts[i] +
                                cluster_node_gpus(c, order[i]);
    }
    t->lane = (node_lane){t->w->node_count, t->lane_types, t->lane_starts};
}

/* ---------------------------------------------------------- the shapes */

/* Every micro-batch of B samples dividing gbs and the stages it allows:
 * tp a power of two up to 8 splitting the model's attention, dp dividing
 * B with B / dp at most max_mbs. */
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
        asym_shapes *b = &t->batches[t->batch_count];
        b->samples = samples;
        b->shape = calloc(4 * (size_t)t->w->gpus, sizeof *b->shape);
        if (b->shape == NULL)
            return pt_fail(err, "search: out of memory for the shapes");
        t->batch_count++;
        for (int tp = 1; tp <= 8; tp *= 2) {
            if (model_check_tp(&t->w->cm->model, tp, NULL) != 0)
                continue;
            for (int dp = 1; dp * tp <= t->w->gpus; dp++)
                if (samples % dp == 0 && samples / dp <= o->max_mbs)
                    b->shape[b->count++] = (asym_shape){dp * tp, tp, dp};
        }
    }
    return 0;
}

/* ---------------------------------------------------------- the tables */

static int stage_terms_at(asym_tree *t, int pp, int stage, int first,
                          const asym_shape *shape, stage_terms *out)
{
    parallel_config own = asym_stage_config(t->w->options, pp,
                                            t->shapes->samples, shape->tp,
                                            shape->dp);
    return costmodel_stage_terms_unsent(t->w->cm, &own, &t->lane, stage,
                                        first, out, t->w->err);
}

/* The table's paces, from stage 0 of two (a stage's per-layer time does
 * not depend on where in the pipeline it is: asserted as the tree
 * prices the stages it places). */
static int fill_paces(asym_tree *t, asym_table *tab)
{
    int gpus = t->w->gpus, count = t->shapes->count;
    for (int first = 0; first < gpus; first++)
        for (int k = 0; k < count; k++) {
            const asym_shape *shape = &t->shapes->shape[k];
            double *pace = &tab->pace[first * count + k];
            *pace = INFINITY;
            stage_terms terms;
            if (first + shape->gpus > gpus)
                continue;
            if (stage_terms_at(t, 2, 0, first, shape, &terms) != 0)
                return -1;
            *pace = terms.per_layer_s;
        }
    return 0;
}

/* throughput[first][stages]: the most sum of 1 / pace over splits of the
 * GPUs first.. into `stages` stages; least_pace[first]. */
static void fill_throughput(asym_tree *t, asym_table *tab)
{
    int gpus = t->w->gpus, count = t->shapes->count, most = t->most_stages;
    int stride = most + 1;
    for (int first = gpus; first >= 0; first--) {
        double *row = &tab->throughput[first * stride];
        tab->least_pace[first] = INFINITY;
        for (int stages = 0; stages <= most; stages++)
            row[stages] = stages == 0 && first == gpus ? 0.0 : -1.0;
        for (int k = 0; first < gpus && k < count; k++) {
            double pace = tab->pace[first * count + k];
            if (pace == INFINITY)
                continue;
            if (pace < tab->least_pace[first])
                tab->least_pace[first] = pace;
            const double *after =
                &tab->throughput[(first + t->shapes->shape[k].gpus) * stride];
            for (int stages = 1; stages <= most; stages++)
                if (after[stages - 1] >= 0.0 &&
                    after[stages - 1] + 1.0 / pace > row[stages])
                    row[stages] = after[stages - 1] + 1.0 / pace;
        }
        if (first < gpus && tab->least_pace[first + 1] < tab->least_pace[first])
            tab->least_pace[first] = tab->least_pace[first + 1];
    }
}

/* Bytes the tables may take at most (they are all built before the walk,
 * to order its tasks). */
#define TABLES_MOST_BYTES (1024.0 * 1024.0 * 1024.0)

static int build_tables(asym_tree *t, pt_error *err)
{
    int gpus = t->w->gpus, stride = t->most_stages + 1;
    double bytes = 0.0;
    for (int b = 0; b < t->batch_count; b++)
        bytes += sizeof(double) * (double)t->order_count *
                 ((double)gpus * (t->batches[b].count + 1) +
                  (double)(gpus + 1) * (stride + 1));
    if (bytes > TABLES_MOST_BYTES)
        return pt_fail(err, "--asymmetric: cluster %s would need %.1f GiB of "
                       "tables (%d node orders x %d micro-batches); the "
                       "asymmetric search holds at most %.0f GiB yet",
                       t->w->cm->cluster->name, bytes / PT_GIB,
                       t->order_count, t->batch_count,
                       TABLES_MOST_BYTES / PT_GIB);
    t->tables = calloc((size_t)t->order_count * (size_t)t->batch_count + 1,
                       sizeof *t->tables);
    if (t->tables == NULL)
        return pt_fail(err, "search: out of memory for the tables");
    for (int o = 0; o < t->order_count; o++) {
        open_lane(t, t->orders + (size_t)o * t->w->node_count);
        for (int b = 0; b < t->batch_count; b++) {
            asym_table *tab = &t->tables[t->table_count++];
            t->shapes = &t->batches[b];
            *tab = (asym_table){.order = o, .batch = b};
            tab->pace = malloc(sizeof(double) * (size_t)gpus *
                               (size_t)(t->shapes->count + 1));
            tab->throughput = malloc(sizeof(double) * (size_t)(gpus + 1) *
                                     (size_t)stride);
            tab->least_pace = malloc(sizeof(double) * (size_t)(gpus + 1));
            if (tab->pace == NULL || tab->throughput == NULL ||
                tab->least_pace == NULL)
                return pt_fail(err, "search: out of memory for the tables");
            if (fill_paces(t, tab) != 0)
                return -1;
            fill_throughput(t, tab);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ the floor */

/* The most layers the placed stages (whole layers) and the stages to
 * come (as a fluid) hold with no stage slower than `bound`. */
static double layers_under(const asym_tree *t, int placed, double rest,
                           double bound)
{
    double layers = bound * rest;
    for (int s = 0; s < placed; s++) {
        const placed_stage *p = &t->placed[s];
        /* whole layers: a placed stage's are integral */
        double fit = p->pace > 0.0 ? floor((bound - p->fixed) / p->pace)
                                   : (bound >= p->fixed ? p->cap : 0.0);
        fit = fit < 0.0 ? 0.0 : fit;
        layers += fit < p->cap ? fit : p->cap;
    }
    return layers;
}

/* A floor of every plan that completes the `placed` stages over GPUs
 * first.. with pp - placed stages more: the least bottleneck M that
 * holds every layer (each stage l_s <= min(cap, (M - fixed) / pace), the
 * stages to come sum(l) <= M x their best throughput), the score at
 * least (m - 1) M plus the sum of stage times, itself at least M and at
 * least the placed fixed times plus every layer at the least pace. */
static double floor_of(const asym_tree *t, int pp, int placed, int first)
{
    int left = pp - placed, layers = t->w->cm->model.layers;
    double rest = t->table->throughput[first * (t->most_stages + 1) + left];
    if (rest < 0.0)
        return INFINITY;
    double fixed_sum = 0.0, lo = 0.0, hi = 0.0, room = 0.0;
    double least_pace = left > 0 ? t->table->least_pace[first] : INFINITY;
    for (int s = 0; s < placed; s++) {
        const placed_stage *p = &t->placed[s];
        if (p->cap < 0)
            return INFINITY;
        fixed_sum += p->fixed;
        lo = p->fixed > lo ? p->fixed : lo;
        double full = p->fixed + p->cap * p->pace;
        hi = full > hi ? full : hi;
        room += p->cap;
        least_pace = p->pace < least_pace ? p->pace : least_pace;
    }
    if (left == 0 && room < layers)
        return INFINITY;
    double bottleneck = lo;
    if (layers_under(t, placed, rest, lo) < layers) {
        if (left > 0)
            hi = lo + layers / rest;
        for (int i = 0; i < BISECTIONS; i++) {
            double mid = 0.5 * (lo + hi);
            if (layers_under(t, placed, rest, mid) < layers)
                lo = mid;
            else
                hi = mid;
        }
        bottleneck = lo;
    }
    double sum = fixed_sum + layers * least_pace;
    sum = sum > bottleneck ? sum : bottleneck;
    return ((t->microbatches - 1) * bottleneck + sum) * FLOOR_MARGIN;
}

/* ------------------------------------------------------------- the walk */

/* A child: its stage, and the stage before it, whose terms are exact
 * once the child's stage is known. */
typedef struct asym_child {
    double floor;
    int shape;
    placed_stage stage, previous;
} asym_child;

static int compare_children(const void *a, const void *b)
{
    double x = ((const asym_child *)a)->floor,
           y = ((const asym_child *)b)->floor;
    return (x > y) - (x < y);
}

static placed_stage placed_of(const stage_terms *terms)
{
    return (placed_stage){terms->fixed_s, terms->per_layer_s,
                          terms->max_layers};
}

/* stage_terms_at through the task's memo. */
static int unsent_terms(asym_tree *t, int stage, int first, int k,
                        stage_terms *out)
{
    const asym_shape *shape = &t->shapes->shape[k];
    if (t->memo == NULL)
        return stage_terms_at(t, t->w->pp, stage, first, shape, out);
    size_t at = ((size_t)stage * (size_t)t->w->gpus + (size_t)first) *
                    (size_t)t->most_shapes + (size_t)k;
    if (t->stamp[at] != t->task_number) {
        if (stage_terms_at(t, t->w->pp, stage, first, shape, &t->memo[at]) !=
            0)
            return -1;
        t->stamp[at] = t->task_number;
    }
    *out = t->memo[at];
    return 0;
}

/* Stage `stage` of shape k over GPUs first.., without its sends, into
 * t->placed (and its config and first GPU into t->configs, t->firsts). */
static int price_unsent(asym_tree *t, int stage, int first, int k)
{
    asym_walk *w = t->w;
    const asym_shape *shape = &t->shapes->shape[k];
    t->configs[stage] = asym_stage_config(w->options, w->pp,
                                          t->shapes->samples, shape->tp,
                                          shape->dp);
    t->firsts[stage] = first;
    stage_terms own;
    if (unsent_terms(t, stage, first, k, &own) != 0)
        return -1;
    double pace = t->table->pace[first * t->shapes->count + k];
    if (own.per_layer_s != pace)
        return pt_fail(w->err, "search: stage %d's per-layer time %.17g s "
                       "is not its table's %.17g s (the asymmetric floors "
                       "assume it does not depend on the stage's position)",
                       stage, own.per_layer_s, pace);
    t->placed[stage] = placed_of(&own);
    return 0;
}

/* Once stage `stage` is priced: the stage before it exact (its
 * neighbours known), and the stage itself when it is the last. */
static int price_exact(asym_tree *t, int stage)
{
    asym_walk *w = t->w;
    stage_terms terms;
    if (stage == w->pp - 1) {
        if (costmodel_stage_terms_inner(w->cm, t->configs, t->firsts,
                                        &t->lane, stage, &terms,
                                        w->err) != 0)
            return -1;
        t->placed[stage] = placed_of(&terms);
    }
    if (stage > 0) {
        if (costmodel_stage_terms_inner(w->cm, t->configs, t->firsts,
                                        &t->lane, stage - 1, &terms,
                                        w->err) != 0)
            return -1;
        t->placed[stage - 1] = placed_of(&terms);
    }
    return 0;
}

/* Stage `stage`'s children over GPUs first..: every shape that leaves a
 * split of the rest, with its floor; their count, -1 on error. A child
 * is first floored with the terms memoised (the stage before it without
 * its sends, as its parent was), and priced exactly only if that floor
 * does not cut it already. */
static int children_of(asym_tree *t, int stage, int first, asym_child *out)
{
    asym_walk *w = t->w;
    int pp = w->pp, count = 0, stride = t->most_stages + 1;
    placed_stage before = stage > 0 ? t->placed[stage - 1]
                                    : (placed_stage){0};
    for (int k = 0; k < t->shapes->count; k++) {
        int next = first + t->shapes->shape[k].gpus;
        double pace = t->table->pace[first * t->shapes->count + k];
        if (pace == INFINITY ||
            t->table->throughput[next * stride + pp - stage - 1] < 0.0)
            continue;
        if (stage > 0)
            t->placed[stage - 1] = before;
        if (price_unsent(t, stage, first, k) != 0)
            return -1;
        if (floor_of(t, pp, stage + 1, next) >= asym_threshold(w)) {
            w->pruned++;
            continue;
        }
        if (price_exact(t, stage) != 0)
            return -1;
        double floor = floor_of(t, pp, stage + 1, next);
        if (floor >= asym_threshold(w)) {
            w->pruned++;
            continue;
        }
        out[count++] = (asym_child){floor, k, t->placed[stage],
                                    stage > 0 ? t->placed[stage - 1]
                                              : t->placed[stage]};
    }
    qsort(out, (size_t)count, sizeof *out, compare_children);
    return count;
}

static int descend(asym_tree *t, int stage, int first)
{
    asym_walk *w = t->w;
    if (stage == w->pp) {
        asym_score_plan(w);
        return w->failed ? -1 : 0;
    }
    asym_child *children = malloc(sizeof *children *
                                  (size_t)(t->shapes->count + 1));
    if (children == NULL)
        return pt_fail(w->err, "search: out of memory for the tree");
    int count = children_of(t, stage, first, children), rc = count < 0;
    for (int i = 0; i < count && rc == 0; i++) {
        if (children[i].floor >= asym_threshold(w)) {
            w->pruned += count - i;
            break;
        }
        const asym_shape *shape = &t->shapes->shape[children[i].shape];
        w->degrees[stage] = (stage_degrees){shape->tp, shape->dp};
        t->configs[stage] = asym_stage_config(w->options, w->pp,
                                              t->shapes->samples, shape->tp,
                                              shape->dp);
        t->firsts[stage] = first;
        t->placed[stage] = children[i].stage;
        if (stage > 0)
            t->placed[stage - 1] = children[i].previous;
        rc = descend(t, stage + 1, first + shape->gpus);
    }
    free(children);
    return rc == 0 ? 0 : -1;
}

static int compare_tasks(const void *a, const void *b)
{
    double x = ((const asym_task *)a)->floor,
           y = ((const asym_task *)b)->floor;
    return (x > y) - (x < y);
}

/* Points the tree at a table (its order, lane and micro-batch) and pp. */
static void take_task(asym_tree *t, const asym_table *tab, int pp)
{
    asym_walk *w = t->w;
    t->table = tab;
    t->shapes = &t->batches[tab->batch];
    memcpy(w->order, t->orders + (size_t)tab->order * w->node_count,
           sizeof(int) * (size_t)w->node_count);
    open_lane(t, w->order);
    w->pp = pp;
    w->samples = t->shapes->samples;
    t->microbatches = w->options->gbs / w->samples;
}

/* Every (table, pp) with its root floor, lowest first. */
static asym_task *collect_tasks(asym_tree *t, int *count)
{
    asym_task *tasks = malloc(sizeof *tasks * ((size_t)t->table_count *
                                               (size_t)t->most_stages + 1));
    *count = 0;
    for (int i = 0; tasks != NULL && i < t->table_count; i++)
        for (int pp = 2; pp <= t->most_stages; pp++) {
            take_task(t, &t->tables[i], pp);
            if ((long)t->microbatches * pp > COSTMODEL_MAX_SCHEDULE_STEPS)
                continue;
            double floor = floor_of(t, pp, 0, 0);
            if (floor < INFINITY)
                tasks[(*count)++] = (asym_task){i, pp, floor};
        }
    if (tasks != NULL)
        qsort(tasks, (size_t)*count, sizeof *tasks, compare_tasks);
    return tasks;
}

static int walk_tasks(asym_tree *t)
{
    int count = 0, rc = 0;
    asym_task *tasks = collect_tasks(t, &count);
    if (tasks == NULL)
        return pt_fail(t->w->err, "search: out of memory for the tasks");
    for (int i = 0; i < count && rc == 0; i++) {
        if (tasks[i].floor >= asym_threshold(t->w)) {
            t->w->pruned += count - i;
            break;
        }
        take_task(t, &t->tables[tasks[i].table], tasks[i].pp);
        t->task_number++;
        rc = descend(t, 0, 0);
    }
    free(tasks);
    return rc;
}

static void close_tree(asym_tree *t)
{
    for (int i = 0; i < t->table_count; i++) {
        free(t->tables[i].pace);
        free(t->tables[i].throughput);
        free(t->tables[i].least_pace);
    }
    free(t->tables);
    free(t->memo);
    free(t->stamp);
    for (int b = 0; t->batches != NULL && b < t->batch_count; b++)
        free(t->batches[b].shape);
    free(t->batches);
    free(t->orders);
}

/* The terms memo, when it is small enough (stamps start at 0, tasks are
 * numbered from 1). */
static void open_memo(asym_tree *t)
{
    for (int b = 0; b < t->batch_count; b++)
        if (t->batches[b].count > t->most_shapes)
            t->most_shapes = t->batches[b].count;
    size_t entries = (size_t)t->most_stages * (size_t)t->w->gpus *
                     (size_t)t->most_shapes;
    if (entries == 0 || entries > MEMO_MOST_ENTRIES)
        return;
    t->memo = malloc(entries * sizeof *t->memo);
    t->stamp = calloc(entries, sizeof *t->stamp);
    if (t->memo == NULL || t->stamp == NULL) {
        free(t->memo);
        free(t->stamp);
        t->memo = NULL;
        t->stamp = NULL;
    }
}

long long asym_distinct_orders(const cluster *c)
{
    /* the multinomial n! / prod(count_t!), one factor at a time */
    double orders = 1.0;
    int placed = 0;
    for (int type = 0; type < c->type_count; type++)
        for (int k = 1; k <= c->types[type].count; k++)
            orders = orders * ++placed / k;
    return orders > 1e18 ? (long long)1e18 : llround(orders);
}

int asym_walk_tree(asym_walk *w)
{
    const cluster *c = w->cm->cluster;
    asym_tree t = {.w = w};
    t.most_stages = w->gpus < w->cm->model.layers ? w->gpus
                                                  : w->cm->model.layers;
    long long orders = asym_distinct_orders(c);
    t.orders = malloc(sizeof(int) * (size_t)(orders * w->node_count + 1));
    int order[PLANNER_MAX_NODES];
    int left[PLANNER_MAX_TYPES] = {0}, used[PLANNER_MAX_TYPES] = {0};
    for (int type = 0; type < c->type_count; type++)
        left[type] = c->types[type].count;
    int rc = t.orders == NULL
                 ? pt_fail(w->err, "search: out of memory for the orders")
                 : 0;
    if (rc == 0)
        rc = collect_orders(&t, order, 0, left, used);
    if (rc == 0)
        rc = collect_batches(&t, w->err) != 0 || build_tables(&t, w->err) != 0
                 ? -1
                 : 0;
    if (rc == 0) {
        open_memo(&t);
        rc = walk_tasks(&t);
    }
    close_tree(&t);
    return rc;
}
