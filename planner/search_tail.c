/*
 * A floor that sees the per-step work grow with a placed stage's layers
 * (docs/planner.md, "Floors, and why the search is exact"). The score is
 * the partition's surrogate plus the largest per-step work W_s(l_s) of
 * any stage (gradient reduction, ZeRO-1's gather, optimizer step, tied
 * embedding), at the layers l_s the partition gives it. The relaxed
 * partition alone floors the surrogate and adds the per-step work of
 * placed stages as if they held no layers; but a stage reducing over a
 * slow ring pays for every layer it holds, and taking its layers away
 * raises the surrogate. Where many placements score within a few tenths
 * of a percent of each other (as on mixed-96 since the cost model's
 * memory became the executor's, heavy on weights and light on
 * activations, so that where a stage sits matters little), the floors
 * must see both at once or the search visits them all.
 *
 * So: for every X, a completion whose per-step work is at most X gives
 * each placed stage at most u_s(X) layers, the most whose work stays at
 * or under X; its surrogate is then at least the relaxed partition's
 * with those caps, S(X), and its score at least S(X) + X. Over every X
 * from the least any completion can have upward, the least of S(X) + X
 * floors every completion. S(X) only changes where some u_s does, so X
 * is walked over those values, in at most TAIL_WALK_INTERVALS intervals:
 * on [a, b) the caps of just below b and the work a floor the interval's
 * every X. Beyond the threshold's reach S(X) + X is above it anyway.
 *
 * W_s is the cost model's own (costmodel_step_work, as the score calls
 * it; the embedding's all-reduce by its floor, its far end unknown), made
 * non-decreasing by taking at each l the least over l and more layers: a
 * measured curve need not grow with its bytes. When every stage sits in
 * one node, the stages to come get caps of the same kind, from the least
 * work of the types they may be of (pure_tail_fill, rank_work).
 *
 * The walk costs relaxed partitions, so it runs only where the other
 * floors do not cut, and not where the relaxed partition's own layers
 * give an S(X) + X under the threshold at their own work X: the
 * interval holding that X then mostly stays under it too (skipping the
 * walk only ever leaves a floor weaker, never wrong).
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The cache of W_s by placement is dropped past this size. */
#define TAIL_MEMO_BYTES ((size_t)8 << 20)
/* Relaxed solves a walk makes at most. */
#define TAIL_WALK_INTERVALS 4

/* The work of a stage placed at `place`, l = 0..layers, made
 * non-decreasing (the least over l and more layers), plus `extra`. */
static void work_row(const bound_tables *t, const stage_placement *place,
                     int stage, double extra, double *row)
{
    costmodel_step_work_sums(t->cm, &t->config, place, stage, t->layers,
                             &t->costs[place->slow_type], row);
    for (int l = 0; l <= t->layers; l++)
        row[l] += extra;
    for (int l = t->layers; l-- > 0;)
        row[l] = search_fmin(row[l], row[l + 1]);
}

/* Grows *values (owned, *allocated doubles) to hold `wanted`. */
static int grow_doubles(double **values, size_t *allocated, size_t wanted,
                        pt_error *err)
{
    if (wanted <= *allocated)
        return 0;
    double *grown = realloc(*values, wanted * sizeof(double));
    if (grown == NULL)
        return pt_fail(err, "search: out of memory for the per-step work "
                            "floors");
    *values = grown;
    *allocated = wanted;
    return 0;
}

/* When every node of every type holds whole stages, a stage to come sits
 * inside one node, of a type whose GPUs are left: its work is that of a
 * stage of that type alone, placed on a lane of that type's nodes. Two
 * rows a type: in the middle of the pipeline (the less of that and the
 * end's, since which stage to come gets the head is open), and at the
 * end (the head's parameters, and the tied embedding's all-reduce at
 * least what the type's links allow). */
static int pure_tail_fill(bound_tables *t, pt_error *err)
{
    const cluster *c = t->cm->cluster;
    t->pure_tail_known = false;
    if (t->pp < 2)
        return 0;
    for (int type = 0; type < c->type_count; type++)
        if (c->types[type].count > 0 &&
            c->types[type].gpus % t->stage_gpus != 0)
            return 0;
    size_t width = (size_t)t->layers + 1;
    size_t wanted = 2 * (size_t)c->type_count * width;
    if (grow_doubles(&t->pure_tail, &t->pure_tail_allocated, wanted, err) !=
        0)
        return -1;
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        long long gpus = t->stage_gpus * t->pp;
        int nodes = (int)((gpus + c->types[type].gpus - 1) /
                          c->types[type].gpus);
        int *types = malloc((size_t)nodes * sizeof(int));
        int *starts = malloc(((size_t)nodes + 1) * sizeof(int));
        if (types == NULL || starts == NULL) {
            free(types);
            free(starts);
            return pt_fail(err, "search: out of memory for the per-step "
                                "work floors");
        }
        for (int i = 0; i <= nodes; i++) {
            if (i < nodes)
                types[i] = type;
            starts[i] = i * c->types[type].gpus;
        }
        node_lane lane = {nodes, types, starts};
        /* a middle stage (the last when there is none) and the last, with
           the embedding's all-reduce at least what its type's links
           allow */
        int stages[2] = {t->pp >= 3 ? 1 : t->pp - 1, t->pp - 1}, rc = 0;
        for (int k = 0; k < 2 && rc == 0; k++) {
            stage_placement place;
            rc = costmodel_place_stage(t->cm, &t->config, &lane, stages[k],
                                       false, &place, err);
            if (rc != 0)
                break;
            double *least = t->pure_tail +
                            ((size_t)k * c->type_count + type) * width;
            work_row(t, &place, stages[k],
                     k == 1 ? t->embedding_floor_s[type][type] : 0.0, least);
        }
        /* a stage to come may be given the head or not: the middle row
           must floor either (a curve need not grow with its bytes) */
        double *middle = t->pure_tail + (size_t)type * width,
               *last = middle + (size_t)c->type_count * width;
        for (size_t l = 0; rc == 0 && l < width; l++)
            middle[l] = search_fmin(middle[l], last[l]);
        free(types);
        free(starts);
        if (rc != 0)
            return -1;
    }
    t->pure_tail_known = true;
    return 0;
}

int tail_tables_fill(bound_tables *t, pt_error *err)
{
    /* the walk's values: every placed row's and every type's two */
    size_t wanted = 2 * (size_t)(t->pp + t->type_count) *
                    (size_t)(t->layers + 1);
    if (grow_doubles(&t->tail_values, &t->tail_allocated, wanted, err) != 0)
        return -1;
    /* the rows are the task's: its config is not in their keys; the
       types' are made when a walk first needs them (most tasks are only
       floored at their root, where no walk runs) */
    memo_clear(t->tail_memo);
    t->pure_tail_known = false;
    t->pure_tail_tried = false;
    return 0;
}

/* The key of a stage's row: its position and every field of its
 * placement (the work reads no other fact of the stage). */
#define TAIL_KEY_INTS 9
#define TAIL_KEY_DOUBLES 10
#define TAIL_KEY_BYTES \
    (TAIL_KEY_INTS * sizeof(int) + TAIL_KEY_DOUBLES * sizeof(double))

static size_t tail_key(const stage_placement *p, int stage,
                       unsigned char *key)
{
    int ints[TAIL_KEY_INTS] = {stage, p->slow_type, p->small_type,
                               p->tp_spans_nodes, p->dp_nodes,
                               p->next_curve_type, p->dp_curve_type,
                               p->slices_of_one_gpu,
                               p->tp_spans_nodes ? p->tp_nodes : 1};
    double doubles[TAIL_KEY_DOUBLES] = {
        p->tp_link.bandwidth_bytes_per_s, p->tp_link.latency_s,
        p->next_link.bandwidth_bytes_per_s, p->next_link.latency_s,
        p->dp_link.bandwidth_bytes_per_s, p->dp_link.latency_s,
        p->dp_intra_link.bandwidth_bytes_per_s, p->dp_intra_link.latency_s,
        p->tp_intra_link.bandwidth_bytes_per_s, p->tp_intra_link.latency_s};
    memcpy(key, ints, sizeof ints);
    memcpy(key + sizeof ints, doubles, sizeof doubles);
    return TAIL_KEY_BYTES;
}

/* The non-decreasing floor of W_s(l), l = 0..layers, of a placed stage,
 * from the cache or computed into it (then *inserted is set: rows found
 * before may have moved). */
static int stage_tail_row(const bound_tables *t, const stage_facts *facts,
                          int stage, const double **out, bool *inserted,
                          pt_error *err)
{
    unsigned char key[TAIL_KEY_BYTES];
    size_t length = tail_key(&facts->place, stage, key);
    uint64_t hash = memo_hash(key, length);
    double *row = memo_find(t->tail_memo, key, length, hash);
    if (row == NULL) {
        *inserted = true;
        if (memo_bytes(t->tail_memo) > TAIL_MEMO_BYTES)
            memo_clear(t->tail_memo);
        row = memo_insert(t->tail_memo, key, length, hash,
                          (size_t)(t->layers + 1) * sizeof(double));
        if (row == NULL)
            return pt_fail(err, "search: out of memory for the per-step "
                                "work floors");
        const stage_placement *place = &facts->place;
        bool end = stage == 0 || stage == t->pp - 1;
        work_row(t, place, stage,
                 end ? t->embedding_floor_s[place->slow_type]
                                           [place->small_type]
                     : 0.0,
                 row);
    }
    *out = row;
    return 0;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Adds the values of a row in (low, window] to values; lowers *above
 * to the least one past window. */
static int add_values(const bound_tables *t, const double *row, int top,
                      double low, double window, int count, double *above)
{
    for (int l = 1; l <= top; l++) {
        if (row[l] <= low)
            continue;
        if (row[l] > window) {
            *above = search_fmin(*above, row[l]);
            break;
        }
        t->tail_values[count++] = row[l];
    }
    return count;
}

/* The work values of the placed stages (and the types left, when their
 * rows are known) in (low, window], sorted and distinct, into values;
 * *above gets the least one past window. */
static int walk_values(const bound_tables *t, int placed,
                       const int *gpus_left, double low, double window,
                       double *above)
{
    int width = t->layers + 1, count = 0;
    *above = INFINITY;
    for (int s = 0; s < placed; s++)
        count = add_values(t, t->tail_rows[s], t->tail_top[s], low, window,
                           count, above);
    for (int k = 0; t->pure_tail_known && k < 2 * t->type_count; k++)
        if (gpus_left[k % t->type_count] > 0)
            count = add_values(t, t->pure_tail + (size_t)k * width,
                               t->layers, low, window, count, above);
    qsort(t->tail_values, (size_t)count, sizeof(double), compare_doubles);
    int distinct = 0;
    for (int i = 0; i < count; i++)
        if (distinct == 0 || t->tail_values[i] > t->tail_values[distinct - 1])
            t->tail_values[distinct++] = t->tail_values[i];
    return distinct;
}

/* The least work a stage to come of pace rank r can have with l layers:
 * a stage of one type, as slow as r's or slower (search_relaxed.c's
 * relaxation pairs the stages with the ranks in the order of their
 * types' paces). */
static double rank_work(const bound_tables *t, const int *gpus_left,
                        const relaxed *r, bool head, int l)
{
    double least = INFINITY;
    size_t width = (size_t)t->layers + 1;
    const double *rows = t->pure_tail +
                         (head ? (size_t)t->type_count * width : 0);
    for (int k = r->first_eligible; k < t->type_count; k++) {
        int type = t->pace_order[k];
        if (gpus_left[type] > 0)
            least = search_fmin(least, rows[(size_t)type * width + l]);
    }
    return least;
}

/* Each placed stage's most layers whose work stays below `below`, and
 * when the types' rows are known each stage to come's (-1: none). */
static void caps_below(const bound_tables *t, const int *gpus_left,
                       int placed, double below)
{
    for (int s = 0; s < placed; s++) {
        const double *row = t->tail_rows[s];
        int cap = t->tail_top[s];
        while (cap > 0 && !(row[cap] < below))
            cap--;
        t->tail_caps[s] = cap;
    }
    if (!t->pure_tail_known)
        return;
    for (int i = 0; i < t->pp - placed; i++) {
        const relaxed *r = &t->ranks[i];
        for (int head = 0; head < 2; head++) {
            int *cap = &t->rank_caps[head * t->pp + i];
            if (i > 0 &&
                r->first_eligible == t->ranks[i - 1].first_eligible) {
                *cap = cap[-1];
                continue;
            }
            *cap = t->layers;
            while (*cap >= 0 &&
                   !(rank_work(t, gpus_left, r, head, *cap) < below))
                (*cap)--;
        }
    }
}

int tail_walk_floor(bound_tables *t, search_memo *memo,
                    const partial_placement *partial, double relaxed_s,
                    double tail_s, double sends, double threshold_s,
                    double *floor_s, pt_error *err)
{
    /* the pending stage's work is known too: it reads the stage's own
       dp group, not the link to the next stage */
    int placed = partial->final_count + (partial->pending ? 1 : 0);
    int width = t->layers + 1;
    *floor_s = relaxed_s + tail_s;
    if (!t->pure_tail_tried) {
        t->pure_tail_tried = true;
        if (pure_tail_fill(t, err) != 0)
            return -1;
    }
    double low = tail_s; /* no completion's work is below it */
    for (int s = 0; s < placed; s++) {
        int top = partial->facts[s].terms.max_layers;
        if (top < 0) { /* nothing fits this stage */
            *floor_s = INFINITY;
            return 0;
        }
        t->tail_top[s] = top < t->layers ? top : t->layers;
    }
    /* the rows, again until none had to be computed (which may move
       the others) */
    for (bool inserted = true; inserted;) {
        inserted = false;
        for (int s = 0; s < placed; s++)
            if (stage_tail_row(t, &partial->facts[s], s, &t->tail_rows[s],
                               &inserted, err) != 0)
                return -1;
    }
    for (int s = 0; s < placed; s++)
        low = search_fmax(low, t->tail_rows[s][0]);
    /* the last stage, when still to come, is of a type left */
    if (t->pure_tail_known && placed < t->pp) {
        double last = INFINITY;
        for (int type = 0; type < t->type_count; type++)
            if (partial->gpus_left[type] > 0)
                last = search_fmin(last, t->pure_tail[((size_t)t->type_count +
                                                type) * width]);
        low = search_fmax(low, last);
    }
    /* a floor at or below `limit` does not cut */
    double limit = threshold_s / (1.0 - 1e-9) - sends;
    *floor_s = relaxed_s + low;
    if (!(*floor_s <= limit))
        return 0;
    /* the relaxed partition's own layers, at their work X, give S(X) + X
       at most relaxed_s + X by its first relaxation: at or under the
       limit, the walk would hardly cut */
    double work = low;
    for (int s = 0; s < placed; s++)
        work = search_fmax(work, t->tail_rows[s][t->relaxed_layers[s]]);
    for (int i = 0; t->pure_tail_known && i < t->pp - placed; i++)
        work = search_fmax(work, rank_work(t, partial->gpus_left, &t->ranks[i],
                                    false, t->relaxed_layers[placed + i]));
    if (relaxed_s + work <= limit)
        return 0;
    double above;
    int count = walk_values(t, placed, partial->gpus_left, low,
                            limit - relaxed_s, &above);
    /* the intervals' ends: low, up to TAIL_WALK_INTERVALS - 1 of the
       values spread evenly, then the first past the threshold's reach */
    double ends[TAIL_WALK_INTERVALS + 1];
    int end_count = 0;
    ends[end_count++] = low;
    int picks = count < TAIL_WALK_INTERVALS - 1 ? count
                                                : TAIL_WALK_INTERVALS - 1;
    for (int i = 1; i <= picks; i++)
        ends[end_count++] = t->tail_values[(long long)i * count / picks - 1];
    ends[end_count++] = above;
    /* the loosest caps first: a walk that cannot cut mostly finds so
       there, at one solve; one that cuts solves every interval anyway */
    double best = INFINITY;
    for (int j = end_count - 2; j >= 0; j--) {
        double from = ends[j], to = ends[j + 1];
        caps_below(t, partial->gpus_left, placed, to);
        double value;
        t->walk_solves++;
        if (bound_relaxed(t, memo, partial, t->tail_caps,
                          t->pure_tail_known ? t->rank_caps : NULL,
                          from + sends, threshold_s, &value, err) != 0)
            return -1;
        best = search_fmin(best, search_fmax(value, relaxed_s) + from);
        if (best <= limit) { /* it cannot cut: stop here */
            *floor_s = search_fmin(best, relaxed_s + low);
            return 0;
        }
    }
    if (above < INFINITY)
        best = search_fmin(best, relaxed_s + above);
    *floor_s = best;
    return 0;
}
