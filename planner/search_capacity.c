/*
 * Capacity tables: floors that see memory and positions (docs/planner.md,
 * "Why the search is exact").
 *
 * The score is at least (m - 1) x the slowest stage time M_c plus the sum
 * of all stage times. With every stage time at most M, a stage at
 * position s whose pace rank (search_relaxed.c) is k holds at most
 *     u = min(room of its type there, (M - its fixed time) / its pace)
 * layers, over the types such a stage may be paced by. The stages to come
 * are so many of each pace kind, and their best assignment to the
 * positions left is a small dynamic program over (position, stages of
 * each kind left), tabled once per task for a grid of M:
 *  - the most layers they hold: if the placed stages and the best rest
 *    cannot hold every layer under M, then M_c > M;
 *  - a floor under their sum of stage times, by Lagrange: for any price
 *    lambda of a layer, the least sum is at least
 *    lambda L + the sum over stages of f + min(0, (p - lambda) u), a sum
 *    of one term per stage the same program minimises.
 * With M_c between two grid points M_j <= M_c <= M_j+1, the score is at
 * least (m - 1) M_j + the least sum under M_j+1; the floor is the least
 * of these over the intervals the layers fit in.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>

/* Table entries x kinds x prices one grid of tables may take to build. */
#define CAPACITY_BUILD_WORK ((size_t)8 << 20)

/* Layers a stage of fixed time f, pace p and room `room` holds under M. */
static int layers_under(double bottleneck_s, double fixed_s, double pace_s,
                        int room, int layers)
{
    if (room < 0)
        return -1;
    if (bottleneck_s == INFINITY)
        return room;
    if (fixed_s > bottleneck_s)
        return -1;
    if (pace_s <= 0.0)
        return room;
    double fit = floor((bottleneck_s - fixed_s) / pace_s);
    int held = fit >= layers ? layers : (int)fit;
    return held < room ? held : room;
}

/* How many sends a stage at position s makes per micro-batch. */
static int sends_at(const bound_tables *t, int stage)
{
    if (t->pp == 1)
        return 0;
    return stage == 0 || stage == t->pp - 1 ? 1 : 2;
}

/* What a stage of pace kind k at a position is at best under M: the most
 * layers it holds, and for each layer price lambda[q] the least of
 * f + (p - lambda) l over the layers it may hold (INFINITY: none). */
typedef struct kind_bound {
    int held;
    double lagrange[PLANNER_MAX_TYPES];
} kind_bound;

static void bound_kind(const bound_tables *t, int kind, int stage,
                       double bottleneck_s, const double *lambda,
                       int prices, kind_bound *out)
{
    const cluster *c = t->cm->cluster;
    double rank_pace = t->pace[t->pace_order[kind]];
    int first = 0;
    if (t->head_by_pace) {
        first = kind;
        while (first > 0 && t->pace[t->pace_order[first - 1]] >= rank_pace)
            first--;
    }
    int roomiest = -1;
    for (int k = 0; k < t->type_count; k++) {
        int type = t->pace_order[k];
        if (c->types[type].count > 0 &&
            bound_pure_cap(t, type, stage) > roomiest)
            roomiest = bound_pure_cap(t, type, stage);
    }
    out->held = -1;
    for (int q = 0; q < prices; q++)
        out->lagrange[q] = INFINITY;
    /* the stage is paced by one of these types: the best of them bounds
       what it holds, the least of them what it costs */
    for (int k = first; k < t->type_count; k++) {
        int type = t->pace_order[k];
        if (c->types[type].count == 0)
            continue;
        double fixed = sends_at(t, stage) * t->send[type] +
                       (stage == 0 ? t->embedding[type] : 0.0) +
                       (stage == t->pp - 1 ? t->head[type] : 0.0);
        double pace = search_fmax(rank_pace, t->pace[type]);
        int room = t->caps_by_pace ? bound_pure_cap(t, type, stage)
                                   : roomiest;
        int held = layers_under(bottleneck_s, fixed, pace, room, t->layers);
        if (held < 0)
            continue;
        out->held = held > out->held ? held : out->held;
        for (int q = 0; q < prices; q++)
            out->lagrange[q] = search_fmin(
                out->lagrange[q],
                fixed + search_fmin(0.0, pace - lambda[q]) * held);
    }
}

int capacity_of_kind(const bound_tables *t, int kind, int stage,
                     double bottleneck_s)
{
    kind_bound bound;
    bound_kind(t, kind, stage, bottleneck_s, NULL, 0, &bound);
    return bound.held;
}

double capacity_bottleneck_for(const bound_tables *t, double threshold_s)
{
    if (t->microbatches < 2 || threshold_s == INFINITY)
        return INFINITY;
    /* a little above, so rounding never cuts a score at the threshold */
    return (threshold_s - t->sum_floor_s) / (t->microbatches - 1) *
               (1.0 + 1e-9) + 1e-12;
}

/* Stages of each kind among the n stages the GPUs left make: the i-th
 * fastest stage is no faster than the (i S)-th fastest GPU. */
static void kinds_of(const bound_tables *t, const int *gpus_left, int n,
                     int *counts)
{
    for (int k = 0; k < t->capacity.kinds; k++)
        counts[k] = 0;
    int k = 0;
    long long seen = 0;
    for (int i = 0; i < n; i++) {
        long long wanted = (long long)(i + 1) * t->stage_gpus;
        while (k + 1 < t->capacity.kinds &&
               seen + gpus_left[t->pace_order[k]] < wanted) {
            seen += gpus_left[t->pace_order[k]];
            k++;
        }
        counts[k]++;
    }
}

/* ------------------------------------------------------------ the tables */

/* Table entries of one grid point: the layers held, then one sum per
 * layer price. */
static size_t point_entries(const capacity_table *table, int pp)
{
    return (size_t)(pp + 1) * (size_t)table->states;
}

static int *held_table(const capacity_table *table, int point, int pp)
{
    return table->held + (size_t)point * point_entries(table, pp);
}

static double *sum_table(const capacity_table *table, int point, int price,
                         int pp)
{
    size_t per_point = point_entries(table, pp) * (size_t)table->kinds;
    return table->sums + (size_t)point * per_point +
           (size_t)price * point_entries(table, pp);
}

/* One position of one grid point's tables from the next position's. */
static void fill_position(const bound_tables *t, int point, int stage,
                          const kind_bound *kinds)
{
    const capacity_table *table = &t->capacity;
    size_t here = (size_t)stage * table->states;
    size_t next = here + table->states;
    int *held = held_table(table, point, t->pp);
    int counts[PLANNER_MAX_TYPES];
    for (long long v = 0; v < table->states; v++) {
        long long rest = v;
        int total = 0;
        for (int k = 0; k < table->kinds; k++) {
            counts[k] = (int)(rest % table->radix[k]);
            rest /= table->radix[k];
            total += counts[k];
        }
        int best = -1;
        double sums[PLANNER_MAX_TYPES];
        for (int q = 0; q < table->kinds; q++)
            sums[q] = INFINITY;
        if (total == t->pp - stage) {
            long long stride = 1;
            for (int k = 0; k < table->kinds; k++, stride *= table->radix[k - 1]) {
                if (counts[k] == 0 || kinds[k].held < 0 ||
                    held[next + v - stride] < 0)
                    continue;
                int sum = kinds[k].held + held[next + v - stride];
                sum = sum > t->layers ? t->layers : sum;
                best = sum > best ? sum : best;
                for (int q = 0; q < table->kinds; q++) {
                    const double *after = sum_table(table, point, q, t->pp);
                    sums[q] = search_fmin(sums[q], kinds[k].lagrange[q] +
                                                after[next + v - stride]);
                }
            }
        }
        held[here + v] = best;
        for (int q = 0; q < table->kinds; q++)
            sum_table(table, point, q, t->pp)[here + v] = sums[q];
    }
}

/* The kinds and the layer prices (one per kind: its pace). */
static void prepare_kinds(bound_tables *t)
{
    capacity_table *table = &t->capacity;
    const cluster *c = t->cm->cluster;
    table->kinds = 0;
    for (int k = 0; k < t->type_count; k++)
        if (c->types[t->pace_order[k]].count > 0)
            table->kinds++;
    for (int q = 0; q < table->kinds; q++)
        table->price[q] = t->pace[t->pace_order[q]];
}

/* States per position, or 0 when one grid point would pass max_bytes. */
static long long count_states(bound_tables *t, size_t max_bytes)
{
    capacity_table *table = &t->capacity;
    const cluster *c = t->cm->cluster;
    size_t entry = sizeof(int) + (size_t)table->kinds * sizeof(double);
    long long states = 1;
    for (int k = 0; k < table->kinds; k++) {
        const node_type *type = &c->types[t->pace_order[k]];
        long long gpus = (long long)type->count * type->gpus;
        table->radix[k] = (int)(gpus / t->stage_gpus + 2);
        states *= table->radix[k];
        if ((size_t)(states * (t->pp + 1)) * entry * 2 > max_bytes)
            return 0;
    }
    return states;
}

static int reserve(capacity_table *table, int points, int pp, pt_error *err)
{
    size_t held = point_entries(table, pp) * (size_t)points;
    size_t sums = held * (size_t)table->kinds;
    if (held > table->held_allocated) {
        int *grown = realloc(table->held, held * sizeof(int));
        if (grown == NULL)
            return pt_fail(err, "search: out of memory for a capacity table");
        table->held = grown;
        table->held_allocated = held;
    }
    if (sums > table->sums_allocated) {
        double *grown = realloc(table->sums, sums * sizeof(double));
        if (grown == NULL)
            return pt_fail(err, "search: out of memory for a capacity table");
        table->sums = grown;
        table->sums_allocated = sums;
    }
    return 0;
}

/* Builds the tables for the given increasing bottlenecks (the last one
 * INFINITY), as many as fit max_bytes. */
static int build_points(bound_tables *t, const double *grid, int count,
                        size_t max_bytes, pt_error *err)
{
    capacity_table *table = &t->capacity;
    table->grid_count = 0;
    prepare_kinds(t);
    table->states = count_states(t, max_bytes);
    if (table->states == 0)
        return 0;
    if (reserve(table, count, t->pp, err) != 0)
        return -1;
    kind_bound kinds[PLANNER_MAX_TYPES];
    for (int g = 0; g < count; g++) {
        table->grid_s[g] = grid[g];
        size_t last = (size_t)t->pp * table->states;
        for (long long v = 0; v < table->states; v++) {
            held_table(table, g, t->pp)[last + v] = v == 0 ? 0 : -1;
            for (int q = 0; q < table->kinds; q++)
                sum_table(table, g, q, t->pp)[last + v] = v == 0 ? 0.0
                                                                 : INFINITY;
        }
        for (int s = t->pp - 1; s >= 0; s--) {
            for (int k = 0; k < table->kinds; k++)
                bound_kind(t, k, s, table->grid_s[g], table->price,
                           table->kinds, &kinds[k]);
            fill_position(t, g, s, kinds);
        }
    }
    table->grid_count = count;
    return 0;
}

int capacity_build(bound_tables *t, double low_s, double high_s,
                   size_t max_bytes, pt_error *err)
{
    capacity_table *table = &t->capacity;
    table->grid_count = 0;
    prepare_kinds(t);
    table->states = count_states(t, max_bytes);
    if (table->states == 0)
        return 0;
    size_t entry = sizeof(int) + (size_t)table->kinds * sizeof(double);
    int points = (int)(max_bytes / (point_entries(table, t->pp) * entry));
    /* and as many as CAPACITY_BUILD_WORK table entries x kinds allow:
       a build must stay cheap beside the search it serves */
    size_t work = point_entries(table, t->pp) * (size_t)table->kinds *
                  (size_t)table->kinds;
    int affordable = (int)(CAPACITY_BUILD_WORK / (work > 0 ? work : 1));
    points = points < affordable ? points : affordable;
    points = points < 2 ? 2 : points;
    points = points > CAPACITY_GRID_MAX ? CAPACITY_GRID_MAX : points;
    if (!(low_s > 0.0) || !(high_s > low_s) || high_s == INFINITY)
        points = 1; /* no range to cover: memory alone */
    double grid[CAPACITY_GRID_MAX];
    double ratio = points > 2 ? pow(high_s / low_s, 1.0 / (points - 2)) : 1.0;
    for (int g = 0; g < points; g++)
        grid[g] = g == points - 1 ? INFINITY : low_s * pow(ratio, g);
    return build_points(t, grid, points, max_bytes, err);
}

static bool fits_at(const bound_tables *t, const partial_placement *partial,
                    int point);

int capacity_bisect(bound_tables *t, const partial_placement *partial,
                    double high_s, size_t max_bytes, pt_error *err)
{
    double points[3] = {high_s, INFINITY, INFINITY};
    if (build_points(t, points, 2, max_bytes, err) != 0)
        return -1;
    if (t->capacity.grid_count == 0 || !fits_at(t, partial, 0))
        return 0; /* nothing to sharpen below the threshold's bottleneck */
    double fits = high_s, short_of = 0.0;
    for (int halving = 0; halving < 20 && short_of == 0.0; halving++) {
        points[0] = 0.5 * fits;
        if (build_points(t, points, 2, max_bytes, err) != 0)
            return -1;
        if (fits_at(t, partial, 0))
            fits = points[0];
        else
            short_of = points[0];
    }
    while (short_of > 0.0 && fits - short_of > 1e-3 * fits) {
        points[0] = 0.5 * (short_of + fits);
        if (build_points(t, points, 2, max_bytes, err) != 0)
            return -1;
        if (fits_at(t, partial, 0))
            fits = points[0];
        else
            short_of = points[0];
    }
    double grid[3] = {short_of, fits, INFINITY};
    if (short_of > 0.0)
        return build_points(t, grid, 3, max_bytes, err);
    return build_points(t, grid + 1, 2, max_bytes, err);
}

/* ------------------------------------------------------------ the floor */

/* Under M: the layers the placed stages hold (-1 when one cannot be that
 * fast), and for each price the sum of f + min(0, p - lambda) u. */
static long long placed_bound(const bound_tables *t,
                              const partial_placement *partial,
                              double bottleneck_s, double *lagrange)
{
    const capacity_table *table = &t->capacity;
    int complete = partial->final_count + (partial->pending ? 1 : 0);
    long long held = 0;
    for (int q = 0; q < table->kinds; q++)
        lagrange[q] = 0.0;
    for (int s = 0; s < complete; s++) {
        const stage_terms *terms = &partial->facts[s].terms;
        double fixed = terms->fixed_s;
        if (partial->pending && s == complete - 1) {
            const stage_placement *place = &partial->facts[s].place;
            fixed += search_fmax(t->send[place->slow_type],
                          t->send[place->small_type]);
        }
        int layers = layers_under(bottleneck_s, fixed, terms->per_layer_s,
                                  terms->max_layers, t->layers);
        if (layers < 0)
            return -1;
        held += layers;
        for (int q = 0; q < table->kinds; q++)
            lagrange[q] += fixed + search_fmin(0.0, terms->per_layer_s -
                                                 table->price[q]) *
                                       layers;
    }
    return held;
}

/* A floor under the sum of the stage times of every completion: the
 * placed stages' fixed times, the sends, embedding and head still to
 * come, and every layer at the fastest pace there is. */
static double sum_floor(const bound_tables *t,
                        const partial_placement *partial, int complete)
{
    double sum = 0.0, pace = INFINITY, send = INFINITY, head = INFINITY,
           embedding = INFINITY;
    for (int s = 0; s < complete; s++) {
        sum += partial->facts[s].terms.fixed_s;
        pace = search_fmin(pace, partial->facts[s].terms.per_layer_s);
    }
    for (int type = 0; type < t->type_count; type++) {
        if (partial->gpus_left[type] == 0)
            continue;
        pace = search_fmin(pace, t->pace[type]);
        send = search_fmin(send, t->send[type]);
        head = search_fmin(head, t->head[type]);
        embedding = search_fmin(embedding, t->embedding[type]);
    }
    int left = t->pp - complete;
    if (left > 0) {
        sum += head + (complete == 0 ? embedding : 0.0);
        /* sends at the boundaries not yet in a placed stage's time */
        int sends = 2 * (left - 1) + (complete > 0 ? 1 : 0);
        if (t->pp > 1 && sends > 0)
            sum += sends * send;
    }
    return sum + t->layers * pace;
}

/* What grid point g says of the completions: do the layers fit under its
 * M, and a floor under their sum of stage times when they do. */
static bool point_fits(const bound_tables *t, const partial_placement *partial,
                       int point, int complete, long long index,
                       double *sum_floor_s)
{
    const capacity_table *table = &t->capacity;
    double lagrange[PLANNER_MAX_TYPES];
    long long held = placed_bound(t, partial, table->grid_s[point], lagrange);
    size_t at = (size_t)complete * table->states + (size_t)index;
    int rest = held_table(table, point, t->pp)[at];
    if (held < 0 || rest < 0 || held + rest < t->layers)
        return false;
    *sum_floor_s = -INFINITY;
    for (int q = 0; q < table->kinds; q++)
        *sum_floor_s = search_fmax(*sum_floor_s,
                            lagrange[q] +
                                sum_table(table, point, q, t->pp)[at] +
                                table->price[q] * t->layers);
    return true;
}

static long long kinds_index(const bound_tables *t,
                             const partial_placement *partial, int complete)
{
    const capacity_table *table = &t->capacity;
    int counts[PLANNER_MAX_TYPES];
    kinds_of(t, partial->gpus_left, t->pp - complete, counts);
    long long index = 0;
    for (int k = table->kinds - 1; k >= 0; k--) {
        if (counts[k] >= table->radix[k])
            return -1;
        index = index * table->radix[k] + counts[k];
    }
    return index;
}

static bool fits_at(const bound_tables *t, const partial_placement *partial,
                    int point)
{
    int complete = partial->final_count + (partial->pending ? 1 : 0);
    long long index = kinds_index(t, partial, complete);
    double sums;
    return index < 0 || point_fits(t, partial, point, complete, index, &sums);
}

double capacity_floor(const bound_tables *t, const partial_placement *partial)
{
    const capacity_table *table = &t->capacity;
    if (table->grid_count == 0 || t->microbatches < 1)
        return -INFINITY;
    int complete = partial->final_count + (partial->pending ? 1 : 0);
    long long index = kinds_index(t, partial, complete);
    if (index < 0)
        return -INFINITY;
    double weight = t->microbatches - 1;
    /* M_c lies in some interval [M_g, M_g+1] where the layers fit under
       M_g+1: the score is at least (m - 1) M_g + the least sum there */
    int last = table->grid_count - 1;
    double sums;
    if (!point_fits(t, partial, last, complete, index, &sums))
        return INFINITY;
    /* the layers fit under every grid point from `first` on (more room
       under a larger bottleneck): find it by bisection */
    int first = 0, fits_from = last;
    while (first < fits_from) {
        int middle = (first + fits_from) / 2;
        double unused;
        if (point_fits(t, partial, middle, complete, index, &unused))
            fits_from = middle;
        else
            first = middle + 1;
    }
    double floor_s = INFINITY;
    double below = fits_from > 0 ? table->grid_s[fits_from - 1] : 0.0;
    for (int g = fits_from; g < last && weight * below < floor_s; g++) {
        double at;
        point_fits(t, partial, g, complete, index, &at);
        /* a sum of stage times is never negative */
        floor_s = search_fmin(floor_s, weight * below + search_fmax(at, 0.0));
        below = table->grid_s[g];
    }
    if (weight * below < floor_s)
        floor_s = search_fmin(floor_s, weight * below +
                                    search_fmax(sums, sum_floor(t, partial,
                                                         complete)));
    if (floor_s == INFINITY)
        return INFINITY;
    return (floor_s + bound_tail_floor(t, partial->facts,
                                       partial->final_count)) *
           (1.0 - 1e-9);
}
