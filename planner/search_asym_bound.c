/*
 * The asymmetric tree's floors (issue 36; docs/planner.md, "Stages of
 * their own degrees"): a floor under the score of every plan that
 * completes a partial one, from the placed stages' own terms and the
 * relaxation of the stages still to come (search_asym_relax.c).
 *
 * A plan's score is sum T + (m - 1) max T + max W (surrogate and
 * per-step work, the embedding's all-reduce in the first and last
 * stage's W), at least sum T + max C with C = (m - 1) T + W. For the
 * plans whose max C lies in [Z_j, Z_j+1) it is at least Z_j plus the
 * least sum of T with every C below Z_j+1. Both are floored over every
 * completion by combining the placed stages (their least max C and
 * least sum for each count of layers they hold) with the relaxed tables
 * for the layers left; the least over the intervals from the least max
 * C up is the floor.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* A floor must not pass a score by a rounding. */
#define FLOOR_SHADE (1.0 - 1e-9)

/* What the floors keep of the placed stages from one query to the next:
 * the stages from the last on change only at the front of the tree, so
 * the merge of stages [0, p) is kept for every p and redone only from
 * the first stage that changed (asym_bound_forget). Entry p holds the
 * greatest least W of those stages and their merged C (at the work floor
 * and weight it was taken at). */
typedef struct placed_prefix {
    int valid;           /* entries 0..valid are of the stages as now */
    double *least_work;  /* [stages + 1] */
    double *floor_at;    /* [stages + 1] the work floor of the merge */
    double *weight_at;   /* [stages + 1] */
    double *none;        /* [stages + 1] the greatest C of no layers */
    double *merged;      /* [(stages + 1) x (layers + 1)] */
    double *rows;        /* [stages x (layers + 1)] stage i's C of l or more
                            layers, the least (non-decreasing in l) */
    /* each stage's room under an interval's bound (room_within of its
       row), kept until its row is written again: siblings share all
       their placed stages but the last. A row's stamp moves on each
       write; a room is read back only at its row's stamp and bound */
    unsigned *stamp;     /* [stages] */
    struct kept_room {
        unsigned stamp;  /* 0: never taken */
        int room;
        double bound;
    } *rooms;            /* [stages x ROOM_SLOTS], mapped: zero, and only
                            the pages of the stages placed touched */
    size_t rooms_bytes;
} placed_prefix;

/* Rooms kept per stage: one an interval (j modulo it). */
#define ROOM_SLOTS 64

struct asym_bound {
    asym_relax *relax;
    int layers;
    double work_floor;  /* the query's floor of every completion's max W */
    double *bottleneck; /* [layers + 1] the placed stages' least max C */
    double *relaxed;    /* [layers + 1] the stages to come's, with it */
    double *sum;        /* [layers + 1] their least sum T under a bound */
    int *order;         /* scratch */
    placed_prefix kept;
};

/* ------------------------------------------------------ placed stages */

static int most_layers(const asym_placed *p, int layers)
{
    return p->cap < layers ? p->cap : layers;
}

/* A placed stage's C at l layers: (m - 1) T, plus the greater of its
 * own W and the floor of the plan's max W (the score adds the largest W
 * of any stage, so each stage's T is paid beside that). */
static double cost_at(const asym_placed *p, double weight, double work_floor,
                      int l)
{
    return weight * (p->fixed + p->pace * l) +
           asym_max(p->work[l] + p->extra, work_floor);
}

/* A floor of the largest per-step work of any completion: no less than
 * any placed stage's least W at the layers it may hold (the last stage
 * is placed first, and it pays the embedding's all-reduce). Kept by
 * prefix: only the stages from the first changed one are read. */
static double least_max_work(placed_prefix *kept, const asym_placed *placed,
                             int count, int layers)
{
    int from = kept->valid < count ? kept->valid : count;
    for (int i = from; i < count; i++) {
        const asym_placed *p = &placed[i];
        double least = INFINITY;
        for (int l = most_layers(p, layers); l >= 0; l--)
            least = asym_min(least, p->work[l]);
        kept->least_work[i + 1] = asym_max(kept->least_work[i],
                                           least + p->extra);
        /* the merges past i were of other stages: taken again */
        kept->floor_at[i + 1] = NAN;
    }
    if (kept->valid < count)
        kept->valid = count;
    return kept->least_work[count];
}

/* The least max over the placed stages of C_i(l_i) for holding x layers,
 * for every x: the x-th least of every stage's C of one more layer (each
 * made non-decreasing from the right: a lower C at more layers counts
 * for fewer), no lower than any stage's C of none; INFINITY past what
 * they hold. The stages' rows are merged one by one, only the least
 * `layers` kept, each merge kept by prefix (row: scratch of layers + 1);
 * a merge is taken again from the first stage whose kept one was at
 * another work floor or weight. */
static void least_bottleneck(placed_prefix *kept, const asym_placed *placed,
                             int count, int layers, double weight,
                             double work_floor, double *out)
{
    size_t width = (size_t)layers + 1;
    int from = 0;
    while (from < count && kept->floor_at[from + 1] == work_floor &&
           kept->weight_at[from + 1] == weight)
        from++;
    for (int i = from; i < count; i++) {
        const asym_placed *p = &placed[i];
        int most = most_layers(p, layers);
        double right = INFINITY, *row = kept->rows + (size_t)i * width;
        for (int l = layers; l >= 0; l--) {
            if (l <= most)
                right = asym_min(right, cost_at(p, weight, work_floor, l));
            row[l] = right;
        }
        /* merged[1..layers]: the least values so far, in order; a run
           runs out only once `layers` are taken, so no bound is read */
        const double *so_far = kept->merged + (size_t)i * width;
        double *merged = kept->merged + (size_t)(i + 1) * width;
        if (i == 0)
            memcpy(merged + 1, row + 1, sizeof(double) * (size_t)layers);
        for (int n = 1, a = 1, r = 1; i > 0 && n <= layers; n++) {
            double kept_value = so_far[a], new_value = row[r];
            bool take_kept = !(new_value < kept_value);
            merged[n] = take_kept ? kept_value : new_value;
            a += take_kept;
            r += !take_kept;
        }
        if (++kept->stamp[i] == 0) /* 0 is a room never taken */
            kept->stamp[i] = 1;
        kept->none[i + 1] = asym_max(kept->none[i], row[0]);
        kept->floor_at[i + 1] = work_floor;
        kept->weight_at[i + 1] = weight;
    }
    const double *merged = kept->merged + (size_t)count * width;
    double none = kept->none[count];
    int have = count == 0 ? 0 : layers;
    out[0] = none;
    for (int x = 1; x <= layers; x++)
        out[x] = x <= have ? asym_max(none, merged[x]) : INFINITY;
}

/* The placed stages' indices by pace, cheapest first, into order (ties
 * in placing order; an insertion sort: there are few). */
static void sort_by_pace(const asym_placed *placed, int count, int *order)
{
    for (int i = 0; i < count; i++) {
        int j = i;
        for (; j > 0 && placed[order[j - 1]].pace > placed[i].pace; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
}

/* The most layers l with row[l] within `bound` (-1: none): row is
 * non-decreasing, so the most layers a stage holds with its C within
 * the bound. */
static int room_within(const double *row, int layers, double bound)
{
    /* row[l] <= bound for every l < low, above it for every l >= high */
    int low = 0, high = layers + 1;
    while (low < high) {
        int middle = low + (high - low) / 2;
        if (row[middle] <= bound)
            low = middle + 1;
        else
            high = middle;
    }
    return low - 1;
}

/* The least sum of T over the placed stages (order: by pace) holding x
 * layers, each at most the most layers whose C is within `bound` (read
 * from their rows, as least_bottleneck left them): their fixed times and
 * the cheapest layers first. Written for x up to the most they hold
 * together, which it returns (past it every sum is infinite: it is not
 * written); -1 when one of them holds none within the bound. */
static int least_sum(placed_prefix *kept, const asym_placed *placed,
                     const int *order, int count, int layers, int j,
                     double bound, double *out)
{
    out[0] = 0.0;
    for (int i = 0; i < count; i++)
        out[0] += placed[i].fixed;
    int held = 0;
    for (int i = 0; i < count; i++) {
        const asym_placed *p = &placed[order[i]];
        size_t slot = (size_t)order[i] * ROOM_SLOTS + (size_t)j % ROOM_SLOTS;
        struct kept_room *kept_room = &kept->rooms[slot];
        if (kept_room->stamp != kept->stamp[order[i]] ||
            kept_room->bound != bound)
            *kept_room = (struct kept_room){
                kept->stamp[order[i]],
                room_within(kept->rows + (size_t)order[i] * (layers + 1),
                            layers, bound),
                bound};
        int room = kept_room->room;
        if (room < 0)
            return -1;
        for (int l = 0; l < room && held < layers; l++, held++)
            out[held + 1] = out[held] + p->pace;
    }
    return held;
}

/* min over x of max(a[x], b[layers - x]). */
static double meet(const double *a, const double *b, int layers)
{
    double best = INFINITY;
    for (int x = 0; x <= layers; x++)
        best = asym_min(best, asym_max(a[x], b[layers - x]));
    return best;
}

/* ---------------------------------------------------------- the floor */

/* The least sum of T of a completion under interval j's bound. */
static int interval_sum(asym_bound *b, const asym_floor_query *q,
                        const asym_relax_view *view, int j, double *out,
                        pt_error *err)
{
    const double *rest = NULL;
    if (asym_relax_sum(b->relax, view, j, &rest, err) != 0)
        return -1;
    int held = least_sum(&b->kept, q->placed, b->order, q->count, b->layers,
                         j, view->bounds[j + 1], b->sum);
    /* min over x of sum[x] + rest[layers - x]: past `held` every sum is
       infinite */
    double best = INFINITY;
    for (int x = 0; x <= held; x++)
        best = asym_min(best, b->sum[x] + rest[b->layers - x]);
    *out = best;
    return 0;
}

double asym_bound_floor(asym_bound *b, const asym_floor_query *q,
                        double threshold, pt_error *err)
{
    int layers = b->layers;
    double weight = q->microbatches - 1;
    asym_relax_view view;
    if (asym_relax_view_of(b->relax, q, &view, err) != 0)
        return NAN;
    if (view.infeasible)
        return INFINITY;
    b->work_floor = least_max_work(&b->kept, q->placed, q->count, layers);
    least_bottleneck(&b->kept, q->placed, q->count, layers, weight,
                     b->work_floor, b->bottleneck);
    /* the stages to come: max C, and max (m - 1) T plus the work floor */
    for (int y = 0; y <= layers; y++)
        b->relaxed[y] = asym_max(view.bottleneck[y],
                                 view.paced[y] + b->work_floor);
    double low = meet(b->bottleneck, b->relaxed, layers);
    if (low == INFINITY)
        return INFINITY;
    sort_by_pace(q->placed, q->count, b->order);
    /* the last interval is open: its sum floors every interval's */
    int last = view.interval_count - 1;
    double unbounded;
    if (interval_sum(b, q, &view, last, &unbounded, err) != 0)
        return NAN;
    /* the intervals from the top down: a tighter bound never lowers the
       least sum, so the sum of an interval above floors every interval
       below it, and an interval whose lower end plus the last sum found
       reaches the threshold (or, in full, the least found) needs no
       table of its own (where the intervals below the cutoff all cut,
       one or two sums prove it). Once the least is below the threshold
       (no cut; unless the query asks for the floor in full), the lowest
       interval's lower end plus that sum floors the rest. */
    int first = 0;
    while (first < last && view.bounds[first + 1] <= low)
        first++;
    double best = INFINITY, cover = unbounded;
    for (int j = last; j >= first; j--) {
        double from = fmax(view.bounds[j], low);
        double stop = q->full ? fmin(best, threshold) : threshold;
        if (from + cover >= stop) {
            best = fmin(best, from + cover);
            continue;
        }
        if (!q->full && best < threshold) {
            best = fmin(best, fmax(view.bounds[first], low) + cover);
            break;
        }
        if (j < last &&
            interval_sum(b, q, &view, j, &cover, err) != 0)
            return NAN;
        best = fmin(best, from + cover);
    }
    return best * FLOOR_SHADE;
}

/* ------------------------------------------------------------ set-up */

int asym_bound_open(asym_bound **out, asym_relax *relax, int layers,
                    pt_error *err)
{
    asym_bound *b = calloc(1, sizeof *b);
    *out = b;
    if (b == NULL) {
        asym_relax_close(relax);
        return pt_fail(err, "search: out of memory for the floors");
    }
    b->relax = relax;
    b->layers = layers;
    size_t cells = (size_t)layers + 1;
    b->bottleneck = malloc(sizeof(double) * cells);
    b->sum = malloc(sizeof(double) * cells);
    b->relaxed = malloc(sizeof(double) * cells);
    b->order = malloc(sizeof(int) * (size_t)(ASYM_MAX_STAGES + 1));
    placed_prefix *k = &b->kept;
    size_t entries = (size_t)ASYM_MAX_STAGES + 1;
    k->least_work = calloc(entries, sizeof(double));
    k->floor_at = malloc(sizeof(double) * entries);
    k->weight_at = malloc(sizeof(double) * entries);
    k->none = calloc(entries, sizeof(double));
    k->merged = malloc(sizeof(double) * entries * cells);
    k->rows = malloc(sizeof(double) * entries * cells);
    /* stamps from 1, rooms at 0: no room is read before it is taken */
    k->stamp = malloc(sizeof(unsigned) * entries);
    k->rooms_bytes = entries * ROOM_SLOTS * sizeof *k->rooms;
    k->rooms = mmap(NULL, k->rooms_bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (k->rooms == MAP_FAILED)
        k->rooms = NULL;
    if (b->bottleneck == NULL || b->sum == NULL || b->relaxed == NULL ||
        b->order == NULL || k->least_work == NULL || k->rows == NULL ||
        k->floor_at == NULL || k->weight_at == NULL || k->none == NULL ||
        k->merged == NULL || k->stamp == NULL || k->rooms == NULL)
        return pt_fail(err, "search: out of memory for the floors");
    for (size_t i = 0; i < entries; i++) {
        k->floor_at[i] = k->weight_at[i] = NAN;
        k->stamp[i] = 1;
    }
    return 0;
}

void asym_bound_forget(asym_bound *b, int stage)
{
    if (b->kept.valid > stage)
        b->kept.valid = stage;
}

void asym_bound_close(asym_bound *b)
{
    if (b == NULL)
        return;
    asym_relax_close(b->relax);
    free(b->bottleneck);
    free(b->sum);
    free(b->relaxed);
    free(b->order);
    free(b->kept.least_work);
    free(b->kept.floor_at);
    free(b->kept.weight_at);
    free(b->kept.none);
    free(b->kept.merged);
    free(b->kept.rows);
    free(b->kept.stamp);
    if (b->kept.rooms != NULL)
        munmap(b->kept.rooms, b->kept.rooms_bytes);
    free(b);
}
