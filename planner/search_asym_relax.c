/*
 * The asymmetric tree's relaxation of the stages still to come (issue
 * 36; docs/planner.md, "Stages of their own degrees").
 *
 * The GPUs left are relaxed to the first n GPUs of a list of the types
 * left, fastest type first, with every GPU of each type or (a floor
 * asked by_gpu, and for types of at most LIST_NODES_MOST nodes) the GPUs
 * left of it, and every GPU of the slowest type: sort any completion's
 * stages by their latest GPU in that order;
 * the j-th holds a GPU no earlier than the list's (g_1 + .. + g_j)-th
 * (the list holds, position by position, GPUs no slower than the GPUs
 * left), so it costs no less than a block of the list of its size
 * ending there, whose costs are the least of a stage holding a GPU of
 * any type at or after that one (search_asym_stages.c).
 * The blocks' order in the pipeline is free, so one of them is the first
 * stage (and at the root one the last), the others in the middle, at the
 * fewest micro-batches in flight the stages to come may hold.
 *
 * With C = (m - 1) T + W of each stage, tables over (GPUs of the list,
 * layers): the least max C, and the least sum of T with every C below a
 * bound, for the bounds of intervals of max C per micro-batch, each
 * built when first asked.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Intervals of max C from a micro-batch's least up, each a quarter
 * wider than the one before, the first 1/1024 of it wide, up to the
 * cutoff; the last open. */
#define INTERVALS 48
#define FIRST_WIDTH (1.0 / 1024.0)
#define WIDTH_GROWTH 1.25
/* Types of at most this many nodes are listed by the GPUs left when a
 * floor asks (by_gpu); a type of more nodes by all its GPUs, as the
 * tables of its counts left would be too many to build (mixed-1024's 32
 * nodes a type: 11 s of tables where 3.4 s before, and no gap closed). */
#define LIST_NODES_MOST 4
/* run_table's mark of a row whose last finite entry is not known yet. */
#define FINITE_UNKNOWN (-2)
/* The tables are a cache: dropped past this size. */
#define TABLE_BYTES ((size_t)512 << 20)
/* The address space their arrays are taken from (past it they are
 * malloc'd): the tables' bytes up to where they are dropped; the
 * blocks and a view's worth more go to malloc at worst. */
#define TABLE_REGION_BYTES TABLE_BYTES

enum { FLAG_FIRST = 1, FLAG_LAST = 2 };

/* A relaxed block: shape k ending at rank position i of a mask. */
typedef struct block {
    double fixed[ASYM_ROLES], pace;
    int cap[ASYM_ROLES];
    double *work[ASYM_ROLES];    /* [layers + 1], non-decreasing */
    /* [paced][role]: another block of as many GPUs costs no more at any
       layers and holds as many (mark_dominated): the max joins skip it */
    bool dominated[2][ASYM_ROLES];
    /* [paced][role][layers + 1]: its C, or (paced) its (m - 1) T, at
       every layer count, taken once (fill_costs): the joins read each
       many times */
    const double *cost[2][ASYM_ROLES];
} block;

/* The tables of one (micro-batch, mask, level, root). */
typedef struct relax_table {
    int gpus, flags;
    double *bottleneck;                /* [(gpus + 1) x flags x (L + 1)] */
    double *paced;                     /* the same of (m - 1) T alone */
    double *sums[INTERVALS + 1];       /* per interval */
    /* the rows (GPUs of the list) built so far, from 0: the tables are
       filled row by row as far as a view asks */
    int rows, sum_rows[INTERVALS + 1];
    block *blocks;                     /* [shapes x ranks] */
    double *block_work, *block_cost;
    int ranks;
    int rank_type[PLANNER_MAX_TYPES];  /* the mask's types, fastest first */
    int rank_end[PLANNER_MAX_TYPES];   /* GPUs up to and with rank i */
} relax_table;

/* Per micro-batch: its intervals of max C. */
typedef struct batch_state {
    bool intervals_known;
    int interval_count;
    double bounds[INTERVALS + 2];
} batch_state;

/* A window minimum's scratch: the z kept and their prev[z] - pace z. */
typedef struct window {
    int *at;
    double *value;
} window;

/* tables_of's last question (level 0: the root's) and its answer. */
typedef struct tables_asked {
    bool valid;
    int batch, mask, level;
    int list[PLANNER_MAX_TYPES];
    relax_table *bottleneck, *sums;
} tables_asked;

struct asym_relax {
    costmodel *cm;
    asym_stages *stages;
    const asym_batch *batches;
    int batch_count, type_count, layers;
    double cutoff;
    int rank[PLANNER_MAX_TYPES];       /* types fastest first */
    batch_state *states;
    memo_table tables;                 /* relax_table * by key */
    memo_table levels;                 /* table_level's, by its question */
    size_t table_bytes;
    window deque;                      /* [layers + 1] each */
    int *finite;       /* [(GPUs + 1) x 4]: run_table's rows' last_finite */
    region room;       /* the tables' arrays */
    double *none;      /* [layers + 1]: no stage to come (0, then INF) */
    tables_asked last; /* forgotten when the tables are dropped */
};

/* ---------------------------------------------------------- the blocks */

/* The blocks of a table: for shape k and rank position i, the least of
 * the mask's types from position i on, and its sends on them. */
static int fill_blocks(asym_relax *r, int batch, int mask, int level,
                       relax_table *t, pt_error *err)
{
    const asym_batch *mb = &r->batches[batch];
    int layers = r->layers, ranks = t->ranks;
    for (int k = 0; k < mb->count; k++) {
        int caps[PLANNER_MAX_TYPES][ASYM_ROLES];
        const asym_pure *pure[PLANNER_MAX_TYPES];
        for (int i = 0; i < ranks; i++) {
            pure[i] = asym_stages_pure(r->stages, batch, k, t->rank_type[i],
                                       err);
            if (pure[i] == NULL ||
                asym_stages_caps(r->stages, batch, k, t->rank_type[i], level,
                                 caps[i], err) != 0)
                return -1;
        }
        /* its sends: two in the middle, one at either end */
        double send = asym_stages_send_floor(r->stages, batch, k, mask);
        double sends[ASYM_ROLES] = {[ASYM_MIDDLE] = 2.0 * send,
                                    [ASYM_FIRST] = send, [ASYM_LAST] = send};
        for (int i = ranks - 1; i >= 0; i--) {
            block *b = &t->blocks[k * ranks + i];
            const asym_pure *p = pure[i];
            const block *after = i + 1 < ranks ? b + 1 : NULL;
            b->pace = after ? fmin(after->pace, p->pace) : p->pace;
            for (int role = 0; role < ASYM_ROLES; role++) {
                double fixed = p->fixed[role] + sends[role];
                b->fixed[role] = after ? fmin(after->fixed[role], fixed)
                                       : fixed;
                b->cap[role] = after && after->cap[role] > caps[i][role]
                                   ? after->cap[role]
                                   : caps[i][role];
                b->work[role] = t->block_work +
                                ((size_t)(k * ranks + i) * ASYM_ROLES + role) *
                                    (size_t)(layers + 1);
                for (int l = 0; l <= layers; l++)
                    b->work[role][l] = after ? fmin(after->work[role][l],
                                                    p->work[role][l])
                                             : p->work[role][l];
            }
        }
    }
    /* each block's work made non-decreasing (a floor may take the least
       at more layers) */
    for (int i = 0; i < mb->count * ranks * ASYM_ROLES; i++) {
        double *work = t->block_work + (size_t)i * (size_t)(layers + 1);
        for (int l = layers - 1; l >= 0; l--)
            work[l] = fmin(work[l], work[l + 1]);
    }
    return 0;
}

/* -------------------------------------------------------------- tables */

/* The rank position of the list's n-th GPU (from 0). */
static int position_of(const relax_table *t, int n)
{
    int i = 0;
    while (t->rank_end[i] <= n)
        i++;
    return i;
}

/* What a table holds. */
typedef enum table_kind {
    TABLE_MAX,   /* the least max C */
    TABLE_PACED, /* the least max (m - 1) T */
    TABLE_SUM    /* the least sum of T with every C under a bound */
} table_kind;

/* A block's C at x layers: (m - 1) T + W, or (paced) (m - 1) T alone. */
static double block_cost_at(const block *b, int role, int x, double weight,
                            bool paced)
{
    double t = weight * (b->fixed[role] + b->pace * x);
    return paced ? t : t + b->work[role][x];
}

/* The blocks' costs at every layer count, into the table's block_cost. */
static void fill_costs(const asym_relax *r, int batch, relax_table *t)
{
    const asym_batch *mb = &r->batches[batch];
    double weight = mb->microbatches - 1;
    size_t width = (size_t)r->layers + 1;
    double *row = t->block_cost;
    for (int i = 0; i < mb->count * t->ranks; i++)
        for (int paced = 0; paced < 2; paced++)
            for (int role = 0; role < ASYM_ROLES; role++, row += width) {
                block *b = &t->blocks[i];
                for (int x = 0; x <= r->layers; x++)
                    row[x] = block_cost_at(b, role, x, weight, paced);
                b->cost[paced][role] = row;
            }
}

/* A block's C (or paced, (m - 1) T) at x layers, as fill_costs took it;
 * inline, for join_max's loop. */
static inline double block_cost_of(const block *b, int role, int x,
                                   bool paced)
{
    return b->cost[paced][role][x];
}

static double block_cost(const block *b, int role, int x)
{
    return block_cost_of(b, role, x, false);
}

/* Whether block a costs no more than block b at every layers b holds, a
 * holding as many (caps of -1: none; the joins skip those). */
static bool costs_no_more(const block *a, const block *b, int role, int layers,
                          bool paced)
{
    int cap_a = a->cap[role] < layers ? a->cap[role] : layers;
    int cap_b = b->cap[role] < layers ? b->cap[role] : layers;
    if (cap_b < 0 || cap_a < cap_b)
        return false;
    for (int x = 0; x <= cap_b; x++)
        if (block_cost_of(a, role, x, paced) >
            block_cost_of(b, role, x, paced))
            return false;
    return true;
}

/* Marks the blocks another block of as many GPUs at the same rank
 * position dominates: its C no higher at any layers and as many held,
 * so a max join through it never gives less than through the other
 * (every value the same: the joins take the least of maxima). Of blocks
 * that dominate each other the first is kept, so every block marked has
 * one not marked that dominates it. */
static void mark_dominated(const asym_relax *r, int batch, relax_table *t)
{
    const asym_batch *mb = &r->batches[batch];
    for (int i = 0; i < t->ranks; i++)
        for (int k = 0; k < mb->count; k++)
            for (int paced = 0; paced < 2; paced++)
                for (int role = 0; role < ASYM_ROLES; role++) {
                    block *b = &t->blocks[k * t->ranks + i];
                    b->dominated[paced][role] = false;
                    for (int j = 0; j < mb->count && !b->dominated[paced][role];
                         j++) {
                        const block *a = &t->blocks[j * t->ranks + i];
                        if (j == k || mb->shape[j].gpus != mb->shape[k].gpus ||
                            !costs_no_more(a, b, role, r->layers, paced))
                            continue;
                        b->dominated[paced][role] =
                            j < k ||
                            !costs_no_more(b, a, role, r->layers, paced);
                    }
                }
}

/* out[y] = min(out[y], min over x of max(prev[y - x], C(x))), both
 * non-decreasing: the crossing moves right with y. */
static void join_max(const double *prev, const block *b, int role, int cap,
                     bool paced, int layers, double *out)
{
    const double *cost = b->cost[paced][role];
    int x = 0;
    for (int y = 0; y <= layers; y++) {
        int most = cap < y ? cap : y;
        if (x > most)
            x = most;
        while (x < most && cost[x] < prev[y - x])
            x++;
        double best = asym_max(prev[y - x], cost[x]);
        if (x > 0)
            best = asym_min(best, asym_max(prev[y - x + 1], cost[x - 1]));
        if (best < out[y])
            out[y] = best;
    }
}

/* The last layer count at which a row is finite (-1: none). */
static int last_finite(const double *row, int layers)
{
    int finite = layers;
    while (finite >= 0 && !(row[finite] < INFINITY))
        finite--;
    return finite;
}

/* join_sum where no z leaves the window (room reaches every y): the
 * least prev[z] - pace z so far, the latest z on a tie, as the window's
 * deque keeps it. */
static void join_sum_open(const double *prev, double fixed, double pace,
                          int finite, int last, double *out)
{
    double least = INFINITY;
    int z = 0;
    for (int y = 0; y <= last; y++) {
        if (y <= finite) {
            double value = prev[y] - pace * y;
            if (value <= least) {
                least = value;
                z = y;
            }
        }
        double best = prev[z] + fixed + pace * (y - z);
        if (best < out[y])
            out[y] = best;
    }
}

/* out[y] = min(out[y], min over x <= room of prev[y - x] + fixed +
 * pace x): a window minimum of prev[z] - pace z, over the z where prev
 * is finite (from 0 up to `finite`, its last finite one; past it every
 * y further than room stays as it is). */
static void join_sum(const double *prev, int finite, double fixed,
                     double pace, int room, int layers, window *deque,
                     double *out)
{
    int last = finite + room < layers ? finite + room : layers;
    if (room >= last) {
        join_sum_open(prev, fixed, pace, finite, last, out);
        return;
    }
    int head = 0, tail = 0;
    for (int y = 0; y <= last; y++) {
        if (y <= finite) {
            double value = prev[y] - pace * y;
            while (tail > head && deque->value[tail - 1] >= value)
                tail--;
            deque->at[tail] = y;
            deque->value[tail++] = value;
        }
        while (deque->at[head] < y - room)
            head++;
        int z = deque->at[head];
        double best = prev[z] + fixed + pace * (y - z);
        if (best < out[y])
            out[y] = best;
    }
}

/* The flags a role moves a state to (-1: not from this one). */
static int next_flags(int flags, int role, int flag_count)
{
    if (role == ASYM_MIDDLE)
        return flags;
    int bit = role == ASYM_FIRST ? FLAG_FIRST : FLAG_LAST;
    if ((flags & bit) || bit >= flag_count)
        return -1;
    return flags | bit;
}

/* The most layers a block holds with its C at most `bound` (C does not
 * fall with layers). */
static int room_under(const block *b, int role, int cap, double bound)
{
    if (!(block_cost(b, role, 0) <= bound))
        return -1;
    int lo = 0, hi = cap;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (block_cost(b, role, mid) <= bound)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Rows `from` to `to` of the table of a kind (TABLE_SUM: every C at
 * most `bound`); a row reads only the rows before it. */
static void run_table(asym_relax *r, const relax_table *t, int batch,
                      table_kind kind, double bound, double *table, int from,
                      int to)
{
    const asym_batch *mb = &r->batches[batch];
    int layers = r->layers, width = layers + 1, flags = t->flags;
    for (size_t i = (size_t)from * flags * width;
         i < (size_t)(to + 1) * flags * width; i++)
        table[i] = INFINITY;
    if (from == 0)
        table[0] = 0.0;
    if (kind == TABLE_SUM)
        for (int i = 0; i < (to + 1) * flags; i++)
            r->finite[i] = FINITE_UNKNOWN;
    for (int n = from > 1 ? from : 1; n <= to; n++) {
        int i = position_of(t, n - 1);
        for (int k = 0; k < mb->count; k++) {
            int g = mb->shape[k].gpus;
            if (g > n)
                continue;
            const block *b = &t->blocks[k * t->ranks + i];
            for (int f = 0; f < flags; f++) {
                const double *prev = &table[((n - g) * flags + f) * width];
                /* a row is finite at no layers where it is anywhere
                   (every block may hold none): none, nothing to join */
                if (!(prev[0] < INFINITY))
                    continue;
                for (int role = 0; role < ASYM_ROLES; role++) {
                    int to = next_flags(f, role, flags);
                    int cap = b->cap[role] < layers ? b->cap[role] : layers;
                    if (to < 0 || cap < 0)
                        continue;
                    double *out = &table[(n * flags + to) * width];
                    if (kind != TABLE_SUM) {
                        if (!b->dominated[kind == TABLE_PACED][role])
                            join_max(prev, b, role, cap, kind == TABLE_PACED,
                                     layers, out);
                        continue;
                    }
                    int room = room_under(b, role, cap, bound);
                    if (room < 0)
                        continue;
                    int *finite = &r->finite[(n - g) * flags + f];
                    if (*finite == FINITE_UNKNOWN)
                        *finite = last_finite(prev, layers);
                    join_sum(prev, *finite, b->fixed[role], b->pace, room,
                             layers, &r->deque, out);
                }
            }
        }
    }
}

/* Room for a table's array: from the tables' region (malloc when it has
 * none left). */
static void *table_array(asym_relax *r, size_t bytes)
{
    void *room = region_take(&r->room, bytes);
    return room != NULL ? room : malloc(bytes);
}

static void free_table(asym_relax *r, relax_table *t)
{
    if (t == NULL)
        return;
    region_release(&r->room, t->bottleneck);
    region_release(&r->room, t->paced);
    for (int j = 0; j <= INTERVALS; j++)
        region_release(&r->room, t->sums[j]);
    region_release(&r->room, t->blocks);
    region_release(&r->room, t->block_work);
    region_release(&r->room, t->block_cost);
    free(t);
}

static size_t table_cells(const relax_table *t, int layers)
{
    return (size_t)(t->gpus + 1) * (size_t)t->flags * (size_t)(layers + 1);
}

/* A table for the list of `list[type]` GPUs of each type in `mask`,
 * fastest type first, at `level`, with the last stage among its blocks
 * when `root`. */
static relax_table *build_table(asym_relax *r, int batch, int mask,
                                const int *list, int level, bool root,
                                pt_error *err)
{
    relax_table *t = calloc(1, sizeof *t);
    if (t == NULL) {
        pt_fail(err, "search: out of memory for the floors");
        return NULL;
    }
    for (int i = 0; i < r->type_count; i++) {
        int type = r->rank[i];
        if (!(mask >> type & 1))
            continue;
        t->gpus += list[type];
        t->rank_type[t->ranks] = type;
        t->rank_end[t->ranks++] = t->gpus;
    }
    t->flags = root ? 4 : 2;
    int shapes = r->batches[batch].count;
    size_t cells = table_cells(t, r->layers);
    /* every block is written whole (fill_blocks) */
    t->blocks = table_array(r, ((size_t)shapes * (size_t)t->ranks + 1) *
                                   sizeof *t->blocks);
    t->block_work = table_array(
        r, sizeof(double) *
               ((size_t)shapes * t->ranks * ASYM_ROLES * (r->layers + 1) + 1));
    t->block_cost = table_array(
        r, sizeof(double) * ((size_t)shapes * t->ranks * 2 * ASYM_ROLES *
                                 (r->layers + 1) +
                             1));
    t->bottleneck = table_array(r, sizeof(double) * cells);
    /* a floor at the root has no work floor to add (asym_bound_floor) */
    t->paced = root ? NULL : table_array(r, sizeof(double) * cells);
    if (t->blocks == NULL || t->block_work == NULL || t->block_cost == NULL ||
        t->bottleneck == NULL || (!root && t->paced == NULL)) {
        free_table(r, t);
        pt_fail(err, "search: out of memory for the floors");
        return NULL;
    }
    if (fill_blocks(r, batch, mask, level, t, err) != 0) {
        free_table(r, t);
        return NULL;
    }
    fill_costs(r, batch, t);
    mark_dominated(r, batch, t);
    /* the root table's last row gives the intervals; the others are
       filled as far as asked (ensure_rows) */
    t->rows = root ? t->gpus : 0;
    run_table(r, t, batch, TABLE_MAX, INFINITY, t->bottleneck, 0, t->rows);
    if (!root)
        run_table(r, t, batch, TABLE_PACED, INFINITY, t->paced, 0, 0);
    r->table_bytes += (root ? 1 : 2) * cells * sizeof(double);
    return t;
}

/* -------------------------------------------------------------- views */

static void drop_tables(asym_relax *r)
{
    for (size_t i = 0; i < r->tables.slot_count; i++) {
        const memo_entry *e = &r->tables.slots[i];
        if (e->key_length == 0)
            continue;
        relax_table *t;
        memcpy(&t, r->tables.arena + e->value_offset, sizeof t);
        free_table(r, t);
    }
    memo_clear(&r->tables);
    region_reset(&r->room);
    r->table_bytes = 0;
    r->last.valid = false;
}

/* The table of (batch, mask, list, level, root), built when first
 * asked. */
static relax_table *table_of(asym_relax *r, int batch, int mask,
                             const int *list, int level, bool root,
                             pt_error *err)
{
    int key[4 + PLANNER_MAX_TYPES] = {batch, mask, level, root};
    memcpy(key + 4, list, sizeof(int) * (size_t)r->type_count);
    size_t length = sizeof(int) * (size_t)(4 + r->type_count);
    uint64_t hash = memo_hash(key, length);
    void *found = memo_find(&r->tables, key, length, hash);
    relax_table *t;
    if (found != NULL) {
        memcpy(&t, found, sizeof t);
        return t;
    }
    t = build_table(r, batch, mask, list, level, root, err);
    if (t == NULL)
        return NULL;
    void *room = memo_insert(&r->tables, key, length, hash, sizeof t);
    if (room == NULL) {
        free_table(r, t);
        pt_fail(err, "search: out of memory for the floors");
        return NULL;
    }
    memcpy(room, &t, sizeof t);
    return t;
}

/* The level whose tables are the same as level's: lowered while no cap
 * of the mask's types changes (tables are built once per level). */
static int lowest_alike(asym_relax *r, int batch, int mask, int level,
                        pt_error *err)
{
    const asym_batch *mb = &r->batches[batch];
    while (level > 2) {
        int below = asym_level_below(level);
        for (int k = 0; k < mb->count; k++)
            for (int t = 0; t < r->type_count; t++) {
                int at[ASYM_ROLES], under[ASYM_ROLES];
                if (!(mask >> t & 1))
                    continue;
                if (asym_stages_caps(r->stages, batch, k, t, level, at,
                                     err) != 0 ||
                    asym_stages_caps(r->stages, batch, k, t, below, under,
                                     err) != 0)
                    return -1;
                if (memcmp(at, under, sizeof at) != 0)
                    return level;
            }
        level = below;
    }
    return level;
}

/* lowest_alike's, remembered: every floor asks it. */
static int table_level(asym_relax *r, int batch, int mask, int level,
                       pt_error *err)
{
    int key[3] = {batch, mask, level};
    uint64_t hash = memo_hash(key, sizeof key);
    const int *found = memo_find(&r->levels, key, sizeof key, hash);
    if (found != NULL)
        return *found;
    int alike = lowest_alike(r, batch, mask, level, err);
    int *room = alike < 0 ? NULL
                          : memo_insert(&r->levels, key, sizeof key, hash,
                                        sizeof alike);
    if (alike >= 0 && room == NULL)
        return pt_fail(err, "search: out of memory for the floors");
    if (room != NULL)
        memcpy(room, &alike, sizeof alike);
    return alike;
}

/* A micro-batch's intervals of max C: from the least of any plan up,
 * each wider than the one before, up to the cutoff (no plan whose
 * max C reaches it scores below it), and one open above. */
static void fill_intervals(asym_relax *r, int batch, const relax_table *root)
{
    batch_state *s = &r->states[batch];
    int width = r->layers + 1;
    double least = root->bottleneck[((size_t)root->gpus * root->flags +
                                     (FLAG_FIRST | FLAG_LAST)) *
                                        width +
                                    r->layers];
    double top = r->cutoff;
    s->bounds[0] = least < INFINITY ? least : 0.0;
    int count = 0;
    double step = FIRST_WIDTH, offset = 0.0;
    while (count + 1 < INTERVALS && least > 0.0 && least < INFINITY) {
        offset += step;
        double next = least * (1.0 + offset);
        if (!(next < top)) {
            if (top > s->bounds[count])
                s->bounds[++count] = top;
            break;
        }
        s->bounds[++count] = next;
        step *= WIDTH_GROWTH;
    }
    s->bounds[++count] = INFINITY;
    s->interval_count = count;
    s->intervals_known = true;
}

/* The batch's intervals, from its root table (every type, the last
 * stage among the blocks) when first asked. */
static int ensure_intervals(asym_relax *r, int batch, pt_error *err)
{
    if (r->states[batch].intervals_known)
        return 0;
    int all = 0, list[PLANNER_MAX_TYPES];
    for (int type = 0; type < r->type_count; type++) {
        const node_type *of = &r->cm->cluster->types[type];
        all |= of->count > 0 ? 1 << type : 0;
        list[type] = of->count * of->gpus;
    }
    relax_table *root = table_of(r, batch, all, list, 2, true, err);
    if (root == NULL)
        return -1;
    fill_intervals(r, batch, root);
    return 0;
}

/* The tables of a query: its bottleneck's at its level, its sums' at
 * the largest power of two at most that level (looser caps, fewer
 * tables: each has as many as intervals), both over `list`. */
static int tables_of(asym_relax *r, const asym_floor_query *q, int mask,
                     const int *list, relax_table **bottleneck,
                     relax_table **sums, pt_error *err)
{
    int m = r->batches[q->batch].microbatches;
    int asked = q->root ? 0 : asym_level(q->inflight < m ? q->inflight : m);
    size_t list_bytes = sizeof(int) * (size_t)r->type_count;
    /* the last query's answer: a node's children mostly ask the same */
    tables_asked *last = &r->last;
    if (last->valid && last->batch == q->batch && last->mask == mask &&
        last->level == asked && memcmp(last->list, list, list_bytes) == 0) {
        *bottleneck = last->bottleneck;
        *sums = last->sums;
        return 0;
    }
    int level = q->root ? 2 : table_level(r, q->batch, mask, asked, err);
    int sum_level = 1;
    while (sum_level * 2 <= level)
        sum_level *= 2;
    if (level < 0 ||
        (sum_level != level &&
         (sum_level = table_level(r, q->batch, mask, sum_level, err)) < 0))
        return -1;
    *bottleneck = table_of(r, q->batch, mask, list, level, q->root, err);
    *sums = *bottleneck == NULL || sum_level == level
                ? *bottleneck
                : table_of(r, q->batch, mask, list, sum_level, q->root, err);
    if (*sums == NULL)
        return -1;
    *last = (tables_asked){true, q->batch, mask, asked, {0}, *bottleneck,
                           *sums};
    memcpy(last->list, list, list_bytes);
    return 0;
}

/* The bottleneck tables of t filled up to row n. */
static void ensure_rows(asym_relax *r, relax_table *t, int batch, int n)
{
    if (t->rows >= n)
        return;
    run_table(r, t, batch, TABLE_MAX, INFINITY, t->bottleneck, t->rows + 1,
              n);
    if (t->paced != NULL)
        run_table(r, t, batch, TABLE_PACED, INFINITY, t->paced, t->rows + 1,
                  n);
    t->rows = n;
}

int asym_relax_view_of(asym_relax *r, const asym_floor_query *q,
                       asym_relax_view *out, pt_error *err)
{
    /* the list: of each type every GPU (a list of more GPUs of the
       faster types is no slower position by position, and makes one
       table per set of types left), or (by_gpu, a type of few nodes)
       the GPUs left (one per count left); and of the slowest type
       every GPU: the GPUs left are a prefix of it, so queries that
       differ only in that type's share a table (rows, by GPUs of the
       list) */
    int mask = 0, n = 0, list[PLANNER_MAX_TYPES], slowest = -1;
    for (int i = 0; i < r->type_count; i++) {
        int t = r->rank[i];
        const node_type *of = &r->cm->cluster->types[t];
        list[t] = q->by_gpu && of->count <= LIST_NODES_MOST
                      ? q->gpus_left[t]
                      : of->count * of->gpus;
        if (q->gpus_left[t] > 0) {
            mask |= 1 << t;
            n += q->gpus_left[t];
            slowest = t;
        } else {
            list[t] = 0;
        }
    }
    if (slowest >= 0)
        list[slowest] = r->cm->cluster->types[slowest].count *
                        r->cm->cluster->types[slowest].gpus;
    /* the tables are a cache, dropped here only: no view in use then */
    if (r->table_bytes > TABLE_BYTES)
        drop_tables(r);
    if (ensure_intervals(r, q->batch, err) != 0)
        return -1;
    const batch_state *s = &r->states[q->batch];
    *out = (asym_relax_view){.batch = q->batch, .bounds = s->bounds,
                             .interval_count = s->interval_count,
                             .bottleneck = r->none, .paced = r->none};
    if (n == 0)
        return 0; /* no GPU left: the stages placed are the plan */
    relax_table *t, *sums;
    if (tables_of(r, q, mask, list, &t, &sums, err) != 0)
        return -1;
    ensure_rows(r, t, q->batch, n);
    int flags = q->root ? (FLAG_FIRST | FLAG_LAST) : FLAG_FIRST;
    out->row = ((size_t)n * t->flags + flags) * (size_t)(r->layers + 1);
    out->table = sums;
    out->gpus = n;
    out->bottleneck = t->bottleneck + out->row;
    out->paced = (t->paced != NULL ? t->paced : t->bottleneck) + out->row;
    out->infeasible = !(out->bottleneck[0] < INFINITY);
    return 0;
}

int asym_relax_sum(asym_relax *r, const asym_relax_view *view, int j,
                   const double **out, pt_error *err)
{
    relax_table *t = view->table;
    if (t == NULL) {
        *out = r->none;
        return 0;
    }
    if (t->sums[j] == NULL) {
        size_t cells = table_cells(t, r->layers);
        t->sums[j] = table_array(r, sizeof(double) * cells);
        if (t->sums[j] == NULL)
            return pt_fail(err, "search: out of memory for the floors");
        t->sum_rows[j] = -1;
        r->table_bytes += cells * sizeof(double);
    }
    if (t->sum_rows[j] < view->gpus) {
        run_table(r, t, view->batch, TABLE_SUM, view->bounds[j + 1],
                  t->sums[j], t->sum_rows[j] + 1, view->gpus);
        t->sum_rows[j] = view->gpus;
    }
    *out = t->sums[j] + view->row;
    return 0;
}

/* ------------------------------------------------------------ set-up */

/* A type's layer pace at tp 1 and one sample: the list's order. */
static double pace_of_type(costmodel *cm, const search_options *options,
                           int type)
{
    parallel_config one = asym_stage_config(options, 2, 1, 1, 1);
    type_costs costs;
    if (costmodel_type_costs(cm, type, &one, &costs, NULL) != 0)
        return INFINITY;
    return costs.layer_forward_s + costs.layer_backward_s;
}

int asym_relax_open(asym_relax **out, costmodel *cm,
                    const search_options *options, const asym_batch *batches,
                    int batch_count, double cutoff, asym_stages *stages,
                    pt_error *err)
{
    const cluster *c = cm->cluster;
    asym_relax *r = calloc(1, sizeof *r);
    *out = r;
    if (r == NULL)
        return pt_fail(err, "search: out of memory for the floors");
    *r = (asym_relax){.cm = cm, .stages = stages, .batches = batches,
                      .batch_count = batch_count,
                      .type_count = c->type_count,
                      .layers = cm->model.layers, .cutoff = cutoff};
    double pace[PLANNER_MAX_TYPES];
    for (int t = 0; t < c->type_count; t++) {
        pace[t] = pace_of_type(cm, options, t);
        r->rank[t] = t;
    }
    for (int i = 1; i < c->type_count; i++)
        for (int j = i; j > 0 && pace[r->rank[j]] < pace[r->rank[j - 1]];
             j--) {
            int swap = r->rank[j];
            r->rank[j] = r->rank[j - 1];
            r->rank[j - 1] = swap;
        }
    r->states = calloc((size_t)batch_count + 1, sizeof *r->states);
    r->deque.at = malloc(sizeof(int) * (size_t)(r->layers + 1));
    r->deque.value = malloc(sizeof(double) * (size_t)(r->layers + 1));
    r->none = malloc(sizeof(double) * (size_t)(r->layers + 1));
    r->finite = malloc(sizeof(int) * 4 * ((size_t)cluster_gpu_count(c) + 1));
    region_open(&r->room, TABLE_REGION_BYTES);
    if (r->states == NULL || r->deque.at == NULL || r->deque.value == NULL ||
        r->none == NULL || r->finite == NULL)
        return pt_fail(err, "search: out of memory for the floors");
    r->none[0] = 0.0;
    for (int l = 1; l <= r->layers; l++)
        r->none[l] = INFINITY;
    return 0;
}

void asym_relax_close(asym_relax *r)
{
    if (r == NULL)
        return;
    drop_tables(r);
    memo_free(&r->tables);
    memo_free(&r->levels);
    free(r->states);
    free(r->deque.at);
    free(r->deque.value);
    free(r->none);
    free(r->finite);
    region_close(&r->room);
    free(r);
}
