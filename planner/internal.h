/*
 * planner's private declarations, shared between its source files. Not
 * part of the public interface (planner.h).
 */
#ifndef PARTITA_PLANNER_INTERNAL_H
#define PARTITA_PLANNER_INTERNAL_H

#include "planner/planner.h"

#include <math.h>

#define SEARCH_MAX_MBS_VALUES 16
#define SEARCH_LEVER_SETS 14

/* ------------------------------------------------------------ the tasks */

/* One unit of search work: a (tp, dp, pp) that fills the cluster, one
 * micro-batch size and one set of memory levers. Its placements (node
 * orders) are searched by search_tree_run. */
typedef struct search_task {
    parallel_config config;
    int index;             /* place in the enumeration: breaks ties */
    double floor_s;        /* no placement of the task scores below it */
} search_task;

/* Everything a search visits, in enumeration order: for tp, pp and mbs
 * ascending, then the lever sets (search_space.c's levers). */
typedef struct search_space {
    int node_count;
    int task_count;
    search_task *tasks;    /* owned */
    int too_many_steps;    /* (tp, dp, pp, mbs) left out: more schedule
                              steps than COSTMODEL_MAX_SCHEDULE_STEPS */
} search_space;

/* The tasks of a cluster for a model and the options (gbs, max_mbs,
 * levers allowed; sequence parallelism on where
 * search_sequence_parallel_tried says so). Fails when the cluster has too many types or nodes. */
int search_space_build(const cluster *c, const model_shape *model,
                       const search_options *options, search_space *out,
                       pt_error *err);
void search_space_free(search_space *space);

/* The most chunks a rank the planner tries (Megatron's runs use 2 to 8). */
#define SEARCH_MAX_VIRTUAL_STAGES 8

/* search_levers.c: Megatron's schedule levers. Whether config's tasks
 * use sequence parallelism: allowed, tp > 1 and seq a multiple of tp. The
 * cost model never prices it slower or larger than the plain tp (its
 * collectives cost the all-reduces', its sends and activations are
 * smaller), so it replaces the plain task rather than doubling them. */
bool search_sequence_parallel_tried(const search_options *options,
                                    const parallel_config *config, int seq);
/* The interleaved 1F1B tried on a simulated plan, on its node order:
 * virtual_stages v from 2 up to SEARCH_MAX_VIRTUAL_STAGES that Megatron
 * allows (pp >= 2, micro-batches a multiple of pp, layers a multiple of
 * v), each with the partition in multiples of v that the interleaved
 * schedule's surrogate ranks best, until one that fits is no faster than
 * the v before it (or fits not); when one fits and is faster, *est, *config and partition[pp]
 * become its. est holds the plain plan's estimate on entry. */
int search_try_interleave(costmodel *cm, const search_options *options,
                          parallel_config *config, const int *order,
                          int node_count, int *partition, estimate *est,
                          pt_error *err);

/* Whether tp suits the cluster: a power of two with every node type's
 * GPU count a multiple of it, or a multiple of every node type's GPU
 * count (tp groups of whole nodes), among the types that have nodes. */
bool search_tp_fits(const cluster *c, int tp);

/* ------------------------------------------------------ fmin, fmax */

/* libm's fmin and fmax inlined where the symmetric floors call them
 * millions of times (calls, without -ffinite-math-only): the same value
 * for every pair, x86-64's minsd and maxsd on two numbers (the second
 * on a tie, so of two zeros the second), the number when one is NAN. */
static inline double search_fmin(double a, double b)
{
    return isnan(b) ? a : (a < b ? a : b);
}

static inline double search_fmax(double a, double b)
{
    return isnan(b) ? a : (a > b ? a : b);
}

/* ------------------------------------------------------------ region */

/* A bump allocator over a reservation of address space advised for huge
 * pages (region.c): few page faults for tables filled piece by piece.
 * Its memory is not zeroed; it is all given back at once. */
typedef struct region {
    unsigned char *base; /* NULL: no reservation (region_take: NULL) */
    size_t reserved, used;
} region;

void region_open(region *r, size_t reserve);
/* `bytes` of the region, 64-byte aligned; NULL when it has no room (the
 * caller then mallocs, and region_release frees what it did not take). */
void *region_take(region *r, size_t bytes);
bool region_holds(const region *r, const void *p);
/* Frees p unless the region holds it (NULL: nothing). */
void region_release(region *r, void *p);
/* Everything taken given back (the pages stay, as they are). */
void region_reset(region *r);
void region_close(region *r);

/* ------------------------------------------------------ the thread pool */

/* Runs work(context, worker, item) for item 0..item_count-1 on `threads`
 * threads (the calling one is worker 0); items are handed out in order.
 * A thread that cannot start leaves its share to the others; -1 only
 * when out of memory. */
typedef void (*parallel_work)(void *context, int worker, int item);
int parallel_for(int threads, int item_count, parallel_work work,
                 void *context, pt_error *err);

/* Worker threads to use for options->threads: the online cores when 0
 * or more than them. */
int search_thread_count(int requested);

/* ---------------------------------------------------------- hash tables */

/* A hash table from byte strings to byte strings, for the memos of one
 * search worker (never shared between threads). Keys and values live in
 * an arena owned by the table; a value pointer stays valid until the next
 * insertion. */
typedef struct memo_entry {
    uint64_t hash;
    size_t key_offset, key_length;
    size_t value_offset;
} memo_entry;

typedef struct memo_table {
    size_t slot_count;          /* a power of two; 0 before first use */
    size_t entry_count;
    memo_entry *slots;          /* key_length 0 = empty slot */
    unsigned char *arena;
    size_t arena_used, arena_size;
    bool arena_huge;            /* moved to a reservation for huge pages */
    /* set before first use: the arena and the slots lie in reservations
       advised for huge pages from the first entry (a memo that fills
       hundreds of kilobytes a few bytes at a time: the asymmetric
       search's) */
    bool huge;
    region slot_room;           /* huge: the slots' arrays, each taken anew */
} memo_table;

uint64_t memo_hash(const void *key, size_t length);
/* The value stored under key, or NULL. */
void *memo_find(const memo_table *table, const void *key, size_t length,
                uint64_t hash);
/* Stores key (length > 0) and returns room for its value of
 * value_length bytes (8-byte aligned), or NULL when out of memory. */
void *memo_insert(memo_table *table, const void *key, size_t length,
                  uint64_t hash, size_t value_length);
/* Empties the table but keeps its memory. */
void memo_clear(memo_table *table);
void memo_free(memo_table *table);
/* Bytes the table holds. */
size_t memo_bytes(const memo_table *table);

/* -------------------------------------------------------- stage facts */

/* What the search reads of one stage: its linear terms and the placement
 * they come from (the simulator reads the same placement, so two orders
 * whose stages have equal facts cost exactly the same). */
typedef struct stage_facts {
    stage_terms terms;
    stage_placement place;
} stage_facts;

/* A worker's memos: stage facts by the node types around the stage, and
 * partition solutions by the multiset of stage terms. */
typedef struct search_memo {
    memo_table stage_table;
    memo_table partition_table;
    int *key;                    /* scratch key */
    int key_capacity;            /* ints */
    partition_stage *sorted;     /* [max pp] */
    int *canonical;              /* [max pp] */
    int *sorted_layers;          /* [max pp] */
    long long stage_lookups, stage_misses;
    long long partition_lookups, partition_misses;
} search_memo;

int search_memo_open(search_memo *memo, int max_pp, int node_count,
                     pt_error *err);
void search_memo_close(search_memo *memo);
/* The memos are caches: a worker drops one past this size. */
#define SEARCH_MEMO_BYTES ((size_t)32 << 20)

/* Forgets what the memos hold once they pass `bytes` (they are caches:
 * forgetting changes no result). */
void search_memo_trim(search_memo *memo, size_t bytes);

/* The facts of stage s from the lane of the nodes placed so far, which
 * must cover GPUs [(s-1) S, (s+2) S) (clipped to the pipeline). With
 * next_known false only [(s-1) S, (s+1) S) is needed and the send to
 * stage s+1 is left out (costs 0). Memoised by the node types over that
 * window and where it starts in its first node. */
int search_stage_facts(costmodel *cm, search_memo *memo,
                       const parallel_config *config, const node_lane *lane,
                       int stage, bool next_known, stage_facts *out,
                       pt_error *err);

/* Solves a partition through the memo: the surrogate does not depend on
 * the order of the stages, so the stages are put in a canonical order
 * (fixed time, per-layer time, cap, then position), solved there once
 * per distinct multiset, and the layers mapped back. The FASOP greedy,
 * which depends on the order, is solved directly. */
int search_solve_partition(search_memo *memo, partition_solver solver,
                           const partition_problem *problem, int *layers,
                           double *value, pt_error *err);

/* ----------------------------------------------------------- shortlist */

/* A scored placement: its score and what identifies it. Two placements
 * of one task whose stages have the same facts (the same key) cost the
 * same in every respect, so a shortlist keeps one of them. */
typedef struct candidate {
    double score_s;        /* surrogate + per-step work, see search_tree.c */
    int task;              /* index into the search space */
    int node_count;
    int pp;
    int key_length;        /* bytes */
    unsigned char *node_types; /* [node_count] type of each node in order */
    int *partition;        /* [pp] */
    unsigned char *key;    /* [key_length]: the facts of every stage */
} candidate;

/* The best candidates seen, in the total order (score, task, key): slots
 * of fixed capacity plus their indices sorted best first. */
typedef struct shortlist {
    int count, capacity;
    int max_nodes, max_pp, max_key;
    candidate *slots;
    int *sorted;
    unsigned char *storage;
} shortlist;

int shortlist_open(shortlist *list, int capacity, int max_nodes, int max_pp,
                   pt_error *err);
void shortlist_close(shortlist *list);
void shortlist_clear(shortlist *list);
/* The candidate at a rank (0 best). */
const candidate *shortlist_at(const shortlist *list, int position);
/* The score a newcomer must not exceed to enter (INFINITY while the list
 * has room). */
double shortlist_threshold(const shortlist *list);
/* Keeps a copy of the candidate when it is among the capacity best and no
 * candidate with the same task and key is there. */
void shortlist_offer(shortlist *list, const candidate *offered);

/* What simulating a placement gives the ranking, before a ranked_plan
 * is written for it (a ranked_plan has room for the most stages and
 * nodes of any plan: the rankings write one only for the few kept). */
typedef struct simulated_figures {
    double step_time_s, tokens_per_s, tflops_per_gpu, cost_per_step_usd;
    double peak_memory_gib_by_type[PLANNER_MAX_TYPES];
} simulated_figures;

/* The figures into a ranked plan (shortlist.c). */
void ranked_take_figures(ranked_plan *out, const simulated_figures *f);
/* Bytes of the key of pp stages. */
int shortlist_key_bytes(int pp);
/* Writes the key of a placement (its stages' facts and its embedding
 * link; dp_of_one: dp is 1) into out; returns its length. */
int shortlist_key_write(const stage_facts *facts, int pp, bool dp_of_one,
                        link_spec embedding_link, int embedding_curve,
                        unsigned char *out);

/* ------------------------------------------------------- the tree search */

/* What a task's search needs and leaves behind. */
typedef struct tree_limits {
    bool exhaustive;       /* visit every placement, prune nothing */
    double threshold_s;    /* prune subtrees whose floor is above it */
    long long node_budget; /* stop after this many tree nodes (0: none) */
    /* tests only: called with every complete order visited, may be NULL */
    void (*on_order)(void *context, const int *types, int count);
    void *on_order_context;
} tree_limits;

typedef struct tree_outcome {
    long long scored;      /* complete placements scored */
    long long feasible;    /* of which a partition fits memory */
    long long pruned;      /* subtrees a floor ruled out */
    long long nodes;       /* tree nodes visited */
    bool stopped;          /* the node budget ran out */
    double open_floor_s;   /* when stopped: no unvisited placement of the
                              task scores below it */
} tree_outcome;

/* A worker's scratch memory for tree searches, sized for the cluster. */
typedef struct tree_worker tree_worker;

int tree_worker_open(tree_worker **out, costmodel *cm, int max_pp,
                     const search_options *options, pt_error *err);
void tree_worker_close(tree_worker *w);
search_memo *tree_worker_memo(tree_worker *w);
costmodel *tree_worker_costmodel(tree_worker *w);

/* A floor under every placement's score of a task (the bound of the
 * empty placement); with a finite threshold, also the capacity tables'
 * floor for it (dearer: tables are built). */
int search_task_floor(tree_worker *w, const search_task *task,
                      double threshold_s, double *floor_s, pt_error *err);

/* Searches the placements of one task depth first, node by node, keeping
 * one canonical order per class of orders that cost the same, scoring
 * every complete one and offering it to `best`; without `exhaustive`,
 * subtrees whose floor exceeds min(threshold, best's threshold) are cut. */
int search_tree_run(tree_worker *w, const search_task *task,
                    const tree_limits *limits, shortlist *best,
                    tree_outcome *outcome, pt_error *err);

/* ------------------------------------------------------------ the bound */

/* One relaxed stage to come, by pace rank: what its real partner is at
 * least (the pace of the rank's GPU; the best send and head of the types
 * at least that slow, whose GPUs the partner must hold). */
typedef struct relaxed {
    double pace, send, head;
    int first_eligible;      /* index into pace_order */
} relaxed;

#define CAPACITY_GRID_MAX 32

/* Capacity tables (search_capacity.c): for a grid of bottleneck times M,
 * the most layers the stages at positions [s, pp) can hold with every
 * stage time at most M, by how many stages of each pace kind they are.
 * The grid's last point is INFINITY (memory alone). */
typedef struct capacity_table {
    int grid_count;          /* 0: no tables built */
    double grid_s[CAPACITY_GRID_MAX]; /* increasing */
    int kinds;               /* the types with nodes, in pace order */
    int radix[PLANNER_MAX_TYPES]; /* most stages of a kind, plus one */
    double price[PLANNER_MAX_TYPES]; /* layer prices: each kind's pace */
    long long states;        /* per position and grid point */
    int *held;               /* [grid x (pp + 1) x states]; -1: cannot */
    double *sums;            /* [grid x kinds x (pp + 1) x states] least
                                Lagrange sums, one table per price */
    size_t held_allocated, sums_allocated; /* entries */
} capacity_table;

/* Per task, what the floors read: each type's fastest possible pace, its
 * least send, head and embedding, and the memory of a stage of it at
 * every position. Owned by a tree worker; refilled per task. */
typedef struct bound_tables {
    const costmodel *cm;
    parallel_config config;
    int type_count, pp, layers, microbatches;
    long long stage_gpus;
    bool caps_by_pace;       /* a stage holds at most what its slowest
                                type fits: every profile makes the same
                                flash-attention assumption */
    bool head_by_pace;       /* no tp group may span nodes: a stage's
                                pace, head and sends are its slowest
                                type's, which is at least as slow as its
                                pace rank says */
    int *pace_order;         /* [types] fastest first, types without
                                nodes last */
    double *pace;            /* [types] fastest possible layer pace */
    double *send;            /* [types] least time of a send of a stage
                                holding this type */
    double *head, *embedding; /* [types] forward + backward */
    double *optimizer_per_param; /* [types] */
    double *stream_per_byte;     /* [types]: type_costs' */
    stage_terms *pure;       /* [types x pp] a stage of one type at a
                                position: its memory terms */
    double sum_floor_s;      /* no placement's stage times sum lower */
    double tail_floor_s;     /* nor is its per-step work lower */
    /* [slow][small]: a first or last stage of those types pays at least
       this for the tied embedding's all-reduce */
    double embedding_floor_s[PLANNER_MAX_TYPES][PLANNER_MAX_TYPES];
    relaxed *ranks;          /* scratch [pp] */
    type_costs *costs;       /* [types] as the score prices them */
    /* the per-step work of a placed stage by its layers (search_tail.c):
       a cache by placement, and the walk's scratch */
    memo_table *tail_memo;
    const double **tail_rows; /* [pp] each placed stage's, in tail_memo
                                 (valid until its next insertion) */
    double *tail_values;     /* [2 x (pp + types) x (layers + 1)] */
    size_t tail_allocated;   /* its entries */
    int *tail_top, *tail_caps; /* [pp] */
    int *relaxed_layers;     /* [pp] the layers of bound_relaxed's
                                partition by type */
    /* when every stage sits inside one node of one type: the least work
       of a later stage of a type by its layers, in the middle and at the
       end: [2 x types x (layers + 1)] */
    bool pure_tail_known;
    bool pure_tail_tried;    /* rows made on a task's first walk only */
    double *pure_tail;
    size_t pure_tail_allocated;
    int *rank_caps;          /* [2 x pp] the walk's caps on the stages to
                                come: in the middle, then with the head */
    long long walk_solves;   /* the walks' relaxed partitions: the tree
                                counts them towards its node budget */
    capacity_table capacity;
    int *cap_by_position;    /* scratch [pp] */
    partition_stage *stages; /* scratch [pp] */
    int *layers_out;         /* scratch [pp] */
} bound_tables;

/* The most layers a stage of one type alone holds at a position (its
 * memory cap; -1 when none): what the relaxed partition and the capacity
 * tables bound a stage's memory by. */
static inline int bound_pure_cap(const bound_tables *tables, int type,
                                 int stage)
{
    return tables->pure[(size_t)type * tables->pp + stage].max_layers;
}

int bound_tables_open(bound_tables **out, int max_pp, int type_count,
                      pt_error *err);
void bound_tables_close(bound_tables *tables);
int bound_tables_fill(bound_tables *tables, costmodel *cm,
                      const parallel_config *config, pt_error *err);

/* A placement in the making: stages [0, final_count) have final facts;
 * stage final_count, when pending, has all its GPUs placed but not yet
 * the next stage's (its send to it is left out of its facts); the GPUs
 * of the later stages are gpus_left[t] of each type. */
typedef struct partial_placement {
    const stage_facts *facts;  /* [final_count (+1 when pending)] */
    int final_count;
    bool pending;
    const int *gpus_left;      /* [type count] */
} partial_placement;

/* The layers stage s can hold at bottleneck M when its pace is that of
 * pace rank `kind` (search_capacity.c); -1 when none. */
int capacity_of_kind(const bound_tables *tables, int kind, int stage,
                     double bottleneck_s);

/* Builds the capacity tables for a grid of bottlenecks from low_s up to
 * high_s (geometric), then INFINITY, as many points as max_bytes allows
 * (none when even one point would pass it: grid_count 0). */
int capacity_build(bound_tables *tables, double low_s, double high_s,
                   size_t max_bytes, pt_error *err);

/* Builds the tables at the bottlenecks that bracket, to 0.1 %, the least
 * one under which the partial placement's stages can hold the layers
 * (below high_s; bisection: dearer than a grid, sharper). */
int capacity_bisect(bound_tables *tables, const partial_placement *partial,
                    double high_s, size_t max_bytes, pt_error *err);

/* The bottleneck M above which no placement can score below threshold_s:
 * (threshold - sum_floor) / (m - 1); INFINITY when m is 1. */
double capacity_bottleneck_for(const bound_tables *tables,
                               double threshold_s);

/* A floor under the score of every completion of the partial placement
 * from the tables (search_capacity.c). INFINITY when its stages cannot
 * hold the layers at all; -INFINITY when the tables say nothing. */
double capacity_floor(const bound_tables *tables,
                      const partial_placement *partial);

/* How close a task comes to fitting memory at best: each position's
 * roomiest type, layers given one by one to the stage whose share of its
 * memory grows least; the worst stage's needed and usable bytes. */
typedef struct memory_miss {
    double ratio;          /* needed / usable */
    int stage, type;
    double needed_bytes, usable_bytes;
} memory_miss;

void bound_memory_miss(const bound_tables *tables, memory_miss *out);

/* The per-step work the score adds is at least that of every placed
 * stage without its layers. */
double bound_tail_floor(const bound_tables *tables, const stage_facts *facts,
                        int count);

/* A floor under the score of every completion of the partial placement
 * (shaded down a little so rounding never lifts it above a real score);
 * INFINITY when no completion can fit memory. The floor may be left
 * weaker once it is known to be above threshold_s. */
int bound_floor(bound_tables *tables, search_memo *memo,
                const partial_placement *partial, double threshold_s,
                double *floor_s, pt_error *err);

/* The relaxed partition's value alone (search_relaxed.c): the placed stages
 * (final and pending) as they are, their layers further capped by
 * caps[s] when caps is not NULL, the stages to come relaxed, the one of
 * pace rank i capped by rank_caps[i] when rank_caps is not NULL, and
 * by rank_caps[pp + i] when it is the one given the head. The
 * second relaxation (memory by position) is solved only while the first
 * value plus `extras` stays at or below threshold_s, and never with
 * rank_caps. INFINITY when nothing fits. Leaves the ranks in
 * tables->ranks and the first relaxation's layers in relaxed_layers. */
int bound_relaxed(const bound_tables *tables, search_memo *memo,
                  const partial_placement *partial, const int *caps,
                  const int *rank_caps, double extras, double threshold_s,
                  double *value, pt_error *err);

/* search_tail.c: a floor that sees the placed stages' per-step work grow
 * with their layers. With relaxed_s the uncapped relaxed value, tail_s a
 * floor under the score's per-step work and sends the sends the relaxed
 * stages leave out, *floor_s gets a floor under every completion's
 * score less the sends (not shaded); the search for it stops once the
 * floor is known to be at or below threshold_s. */
int tail_walk_floor(bound_tables *tables, search_memo *memo,
                    const partial_placement *partial, double relaxed_s,
                    double tail_s, double sends, double threshold_s,
                    double *floor_s, pt_error *err);
/* Room for the walk's scratch of a task (bound_tables_fill). */
int tail_tables_fill(bound_tables *tables, pt_error *err);

/* ------------------------------------------- stages of their own degrees */

/* planner_search_asymmetric (search_asym.c: ranking), its plans' scores
 * (search_asym_score.c), its tree (search_asym_tree.c: tasks, node
 * types and stages placed one by one) and the tree's floors
 * (search_asym_bound.c). docs/planner.md, "Stages of their own
 * degrees". */

#define ASYM_MAX_STAGES PT_MAX_STAGES

/* An asymmetric plan whose partition was solved, kept by its score. */
typedef struct asym_candidate {
    double score;
    parallel_config config;
    stage_degrees stages[ASYM_MAX_STAGES];
    int partition[ASYM_MAX_STAGES];
    int node_order[PLANNER_MAX_NODES];
    int node_count;
} asym_candidate;

/* The search's state: the plan at hand (node order, pp, samples a
 * micro-batch, each stage's degrees), the shortlist and what the walk
 * left open when its budget ran out. */
typedef struct asym_walk {
    costmodel *cm;
    const search_options *options;
    int gpus, node_count;
    int order[PLANNER_MAX_NODES];
    int pp, samples;
    stage_degrees degrees[ASYM_MAX_STAGES];
    asym_candidate *kept;
    int kept_count, capacity;
    long long scored, pruned, nodes;
    long long offered;   /* plans the shortlist took */
    long long alike;     /* partial plans given an alike one's floor */
    double cutoff;       /* plans scoring at or above it are not kept */
    double best_score;
    bool stopped;        /* the tree-node budget ran out */
    double open_floor;   /* then: no plan not visited scores below it */
    pt_error *err;
    bool failed;
} asym_walk;

/* The config of a stage of tp x dp in a plan of pp stages whose
 * micro-batch is `samples` samples (parallel_stage_config's, for stage 0
 * the plan's own). */
parallel_config asym_stage_config(const search_options *o, int pp,
                                  int samples, int tp, int dp);
/* Solves the walk's plan exactly, scores it (surrogate and per-step
 * work, as the symmetric search scores a placement) and offers it to the
 * shortlist (plans whose stages are all alike are the symmetric
 * search's: skipped). */
void asym_score_plan(asym_walk *w);
/* The score a plan must beat to enter the shortlist: the cutoff until
 * the shortlist is full, then the lower of it and the shortlist's worst. */
double asym_threshold(const asym_walk *w);
/* Walks every micro-batch, pp, node order and split, stage by stage,
 * cutting by floors; -1 on error (w->err). */
int asym_walk_tree(asym_walk *w);

/* The lesser and the greater of two doubles, never NAN: inlined where
 * libm's fmin and fmax are calls (the asymmetric floors' inner loops). */
static inline double asym_min(double a, double b)
{
    return b < a ? b : a;
}

static inline double asym_max(double a, double b)
{
    return b > a ? b : a;
}

/* A stage shape: its GPUs as tp x dp. */
typedef struct asym_shape {
    int gpus, tp, dp;
} asym_shape;

/* A micro-batch of `samples` samples and the stage shapes it allows. */
typedef struct asym_batch {
    int samples, microbatches, count;
    asym_shape *shape; /* [count] */
} asym_batch;

/* A stage the tree placed: its time and memory terms (final once the
 * stages beside it are placed; before, without its sends, which only
 * add) and its per-step work by layers, work[l] for l = 0..layers (the
 * score's: reduction, gather and optimizer step), with `extra` more (a
 * floor of the embedding's all-reduce on the first and last stage). */
typedef struct asym_placed {
    double fixed, pace;
    int cap;
    double *work; /* [layers + 1], the tree's */
    double extra;
} asym_placed;

/* Where a stage sits as the cost model reads it: stage `stage` of pp.
 * The tree places stages from the last and does not know pp until the
 * first: a stage's terms read only whether it is first or last and how
 * many micro-batches it holds in flight (min(pp - stage, m) under
 * 1F1B), so the tree names a place with those. */
typedef struct asym_role {
    int pp, stage;
} asym_role;

/* search_asym_stages.c: what a stage costs. */
typedef struct asym_stages asym_stages;

enum { ASYM_MIDDLE, ASYM_FIRST, ASYM_LAST, ASYM_ROLES };

/* Floors of what any stage of a shape that holds a GPU of a type costs,
 * by role: its pace, its fixed time without sends (the relaxation adds
 * asym_stages_send_floor's by the types left), its per-step work by
 * layers (the first and last with the embedding's all-reduce). */
typedef struct asym_pure {
    double pace;
    double fixed[ASYM_ROLES];
    double *work[ASYM_ROLES]; /* [layers + 1] */
} asym_pure;

/* `cutoff`: no plan scoring at or above it is kept (asym_stages_caps). */
int asym_stages_open(asym_stages **out, costmodel *cm,
                     const search_options *options, const asym_batch *batches,
                     int batch_count, double cutoff, pt_error *err);
void asym_stages_close(asym_stages *s);
/* Stage of shape k of micro-batch `batch` at `role` on GPUs first.. of
 * the lane (which must cover them): its terms without sends and its work
 * by layers, into *out (work into out->work, extra 0); memoised by what
 * they depend on. */
int asym_stages_price(asym_stages *s, int batch, int k, const asym_role *role,
                      const node_lane *lane, long long first,
                      asym_placed *out, pt_error *err);
/* The floors of shape k holding a GPU of type `type` (NULL on error). */
const asym_pure *asym_stages_pure(asym_stages *s, int batch, int k,
                                  int type, pt_error *err);
/* The micro-batches in flight the floors price memory at: every count
 * up to ASYM_LEVELS_EXACT, then powers of two; asym_level gives the
 * largest at most `inflight`, asym_level_below the one before. */
#define ASYM_LEVELS_EXACT 64
int asym_level(int inflight);
int asym_level_below(int level);
/* The memory caps of shape k on type `type` alone, by role, its middle
 * stages and first holding asym_level(level) micro-batches in flight
 * (the most a stage holding that type holds), each no more than the
 * layers at which its floors put C = (m - 1) T + W at the cutoff (-1:
 * none below it). */
int asym_stages_caps(asym_stages *s, int batch, int k, int type, int level,
                     int *caps, pt_error *err);
/* A floor of one send of shape k's stage to a neighbour when the
 * stage lies on GPUs of the types in `mask` (a bit a type). */
double asym_stages_send_floor(const asym_stages *s, int batch, int k,
                              int mask);
/* A floor of the tied embedding's all-reduce between the first and the
 * last stage, one of them of tp `tp` (0 s within one node). */
double asym_stages_embedding_floor(const asym_stages *s, int tp);

/* What a floor is asked about: the stages placed (from the last) and
 * the GPUs left in front of them. */
typedef struct asym_floor_query {
    int batch, microbatches;
    const asym_placed *placed;
    int count;
    const int *gpus_left;   /* [type] */
    int inflight;           /* the stages to come hold at least this many
                               micro-batches in flight at their peak */
    bool root;              /* nothing placed: the last stage is to come */
    bool full;              /* refined up to the threshold, not only until
                               it is known not to cut */
    bool by_gpu;            /* the relaxation's list by the GPUs left of
                               each type (search_asym_relax.c) */
} asym_floor_query;

/* search_asym_relax.c: the stages to come, relaxed. */
typedef struct asym_relax asym_relax;

/* The relaxation's side of a floor: for each count of layers the stages
 * to come hold, their least max C; the intervals of max C whose sums
 * asym_relax_sum gives. */
typedef struct asym_relax_view {
    bool infeasible;
    const double *bottleneck;            /* [layers + 1] */
    const double *paced;   /* [layers + 1]: their least max (m - 1) T */
    int interval_count;
    const double *bounds;                /* [interval_count + 1] */
    void *table;
    size_t row;
    int batch, gpus;                     /* GPUs left */
} asym_relax_view;

int asym_relax_open(asym_relax **out, costmodel *cm,
                    const search_options *options, const asym_batch *batches,
                    int batch_count, double cutoff, asym_stages *stages,
                    pt_error *err);
void asym_relax_close(asym_relax *r);
int asym_relax_view_of(asym_relax *r, const asym_floor_query *q,
                       asym_relax_view *out, pt_error *err);
/* For each count of layers the stages to come hold, their least sum of
 * T with every C at most interval j's upper bound. */
int asym_relax_sum(asym_relax *r, const asym_relax_view *view, int j,
                   const double **out, pt_error *err);

/* search_asym_bound.c: the floors of the asymmetric tree. */
typedef struct asym_bound asym_bound;

/* Floors over the relaxation (the bound's from then on) of a model of
 * `layers` layers. */
int asym_bound_open(asym_bound **out, asym_relax *relax, int layers,
                    pt_error *err);
void asym_bound_close(asym_bound *b);
/* A floor under the score of every plan that completes the query's
 * (INFINITY when none can hold the layers, NAN on error); it may stop
 * refining once it is below threshold. */
double asym_bound_floor(asym_bound *b, const asym_floor_query *q,
                        double threshold, pt_error *err);
/* Stage `stage` of the placed ones (from the last) and all in front of
 * it have changed since the last floor: what the bound kept of them is
 * taken again (the tree calls it on every change of a placed stage). */
void asym_bound_forget(asym_bound *b, int stage);

#endif
