/*
 * planner's private declarations, shared between its source files. Not
 * part of the public interface (planner.h).
 */
#ifndef PARTITA_PLANNER_INTERNAL_H
#define PARTITA_PLANNER_INTERNAL_H

#include "planner/planner.h"

#define SEARCH_MAX_MBS_VALUES 16

/* One (tp, dp, pp) that fills the cluster, the micro-batch sizes gbs
 * allows for it, and where its distinct node orders sit in the space. */
typedef struct search_shape {
    int tp, dp, pp;
    int mbs_count;
    int mbs[SEARCH_MAX_MBS_VALUES];
    int first_order;
    int order_count;
    /* per mbs: no configuration of this shape scores below it, whatever
       its order or levers (filled by the search) */
    double score_floor_s[SEARCH_MAX_MBS_VALUES];
} search_shape;

/* Everything a search visits: shapes and, shape after shape, their node
 * orders (node instances in pipeline order). A work item of the search is
 * one order, so item i belongs to shape order_shape[i]. */
typedef struct search_space {
    int node_count;
    int shape_count;
    search_shape *shapes;       /* owned */
    int order_count;
    int *orders;                /* owned, [order_count x node_count] */
    int *order_shape;           /* owned, [order_count] */
} search_space;

/* Enumerates the shapes of a cluster for a model and the options (gbs,
 * max_mbs), and the distinct node orders of each. A shape that no
 * micro-batch size fits is left out. */
int search_space_build(const cluster *c, int layers,
                       const search_options *options, search_space *out,
                       pt_error *err);
void search_space_free(search_space *space);

static inline const int *search_space_order(const search_space *space,
                                            int index)
{
    return space->orders + (size_t)index * (size_t)space->node_count;
}

/* Runs work(context, worker, item) for item 0..item_count-1 on `threads`
 * threads (the calling one is worker 0); items are handed out in order.
 * after_item, when not NULL, runs on the calling thread after each of its
 * own items with the number of items finished so far. A thread that
 * cannot start leaves its share to the others; -1 only when out of
 * memory. */
typedef void (*parallel_work)(void *context, int worker, int item);
int parallel_for(int threads, int item_count, parallel_work work,
                 void *context,
                 void (*after_item)(void *context, long long finished),
                 pt_error *err);

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
} memo_table;

uint64_t memo_hash(const void *key, size_t length);
/* The value stored under key, or NULL. */
void *memo_find(const memo_table *table, const void *key, size_t length,
                uint64_t hash);
/* Stores key (length > 0) and returns room for its value of
 * value_length bytes (8-byte aligned), or NULL when out of memory. */
void *memo_insert(memo_table *table, const void *key, size_t length,
                  uint64_t hash, size_t value_length);
void memo_free(memo_table *table);

/* What the search reads of one stage: its linear terms and the
 * placement facts the score and the no-fit message use. */
typedef struct stage_facts {
    stage_terms terms;
    int slow_type, small_type;
    link_spec dp_link;
} stage_facts;

/* A worker's memo of stage facts and partition solutions, and its
 * scratch memory (sized for the largest pp and node count). */
typedef struct search_memo {
    memo_table stage_table;
    memo_table partition_table;
    int *key;                    /* scratch key, [key_capacity] ints */
    int key_capacity;
    stage_placement *placement;  /* [max pp] */
    int *node_start;             /* [nodes + 1] GPU offset of each node */
    int *node_type;              /* [nodes] */
    int *canonical;              /* [max pp] stage order for the memo */
    partition_stage *sorted;     /* [max pp] */
    int *sorted_layers;          /* [max pp] */
    long long stage_lookups, stage_misses;
    long long partition_lookups, partition_misses;
} search_memo;

int search_memo_open(search_memo *memo, int max_pp, int node_count,
                     pt_error *err);
void search_memo_close(search_memo *memo);

/* The facts of every stage of config on order, from the memo where the
 * same stage was priced before: a stage's terms depend only on its
 * position, the config and how node types lie over it and its two
 * neighbours (docs/planner.md), which is the key. */
int search_stage_facts(costmodel *cm, search_memo *memo,
                       const parallel_config *config, const int *order,
                       int node_count, stage_facts *out, pt_error *err);

/* Solves a partition through the memo: the surrogate does not depend on
 * the order of the stages, so the stages are put in a canonical order
 * (fixed time, per-layer time, cap, then position), solved there once
 * per distinct multiset, and the layers mapped back. The FASOP greedy,
 * which depends on the order, is solved directly. */
int search_solve_partition(search_memo *memo, partition_solver solver,
                           const partition_problem *problem, int *layers,
                           double *value, pt_error *err);

/* Fills every shape's score_floor_s: no configuration of the shape, at
 * that micro-batch size, whatever its node order and memory levers,
 * scores below it. */
int search_score_floors(costmodel *cm, const search_options *options,
                        search_space *space, pt_error *err);
/* The order indices in the order the workers should take them: shapes
 * by their lowest floor first (owned by the caller). */
int search_visit_order(const search_space *space, int **visit,
                       pt_error *err);

/* Worker threads to use for options->threads (0: the online cores). */
int search_thread_count(int requested);

#endif
