/*
 * The search's memos. Most configurations of a search repeat work done
 * for another one: a stage of one node order often sits exactly as a
 * stage of another (same position, same node types over it and over its
 * neighbours), and many orders give the same multiset of stages, whose
 * best partition is the same up to the order of the stages. Each worker
 * remembers both, so a configuration costs a few hash lookups once its
 * pieces have been seen.
 */
#include "planner/internal.h"

#include <stdlib.h>
#include <string.h>

/* Ints of a stage key before the node types: the config (its fields a
 * search varies: sequence parallelism too, a task of its own beside the
 * plain tp's), the stage, whether the next stage is known, where the
 * window starts in its first node and how many nodes it spans. */
#define STAGE_KEY_HEADER 15
/* Ints of a partition key before the stages, and per stage (two doubles
 * and the cap). */
#define PARTITION_KEY_HEADER 4
#define PARTITION_KEY_PER_STAGE 5

/* A memoised partition: status, surrogate and the layers of the stages
 * in canonical order. */
typedef struct partition_memo_value {
    int status;
    double value;
    int layers[];
} partition_memo_value;

int search_memo_open(search_memo *memo, int max_pp, int node_count,
                     pt_error *err)
{
    memset(memo, 0, sizeof *memo);
    int stage_key = STAGE_KEY_HEADER + node_count;
    int partition_key = PARTITION_KEY_HEADER +
                        PARTITION_KEY_PER_STAGE * max_pp;
    memo->key_capacity = stage_key > partition_key ? stage_key
                                                   : partition_key;
    memo->key = malloc((size_t)memo->key_capacity * sizeof(int));
    memo->canonical = malloc((size_t)max_pp * sizeof(int));
    memo->sorted = malloc((size_t)max_pp * sizeof *memo->sorted);
    memo->sorted_layers = malloc((size_t)max_pp * sizeof(int));
    if (!memo->key || !memo->canonical || !memo->sorted ||
        !memo->sorted_layers) {
        search_memo_close(memo);
        return pt_fail(err, "search: out of memory for the memos");
    }
    return 0;
}

void search_memo_close(search_memo *memo)
{
    memo_free(&memo->stage_table);
    memo_free(&memo->partition_table);
    free(memo->key);
    free(memo->canonical);
    free(memo->sorted);
    free(memo->sorted_layers);
    memset(memo, 0, sizeof *memo);
}

void search_memo_trim(search_memo *memo, size_t bytes)
{
    if (memo_bytes(&memo->stage_table) > bytes)
        memo_clear(&memo->stage_table);
    if (memo_bytes(&memo->partition_table) > bytes)
        memo_clear(&memo->partition_table);
}

/* ------------------------------------------------------- stage facts */

/* The slot of the lane holding GPU x (the lane must cover it). */
static int lane_slot(const node_lane *lane, long long gpu)
{
    int low = 0, high = lane->count - 1;
    while (low < high) {
        int middle = (low + high + 1) / 2;
        if (lane->starts[middle] <= gpu)
            low = middle;
        else
            high = middle - 1;
    }
    return low;
}

/* Writes the key of stage s over the window's slots [first, last];
 * returns its length in ints. */
static int stage_key(const search_memo *memo, const parallel_config *config,
                     int stage, bool next_known, const node_lane *lane,
                     int first, int last, long long window_low)
{
    int *key = memo->key;
    int header[STAGE_KEY_HEADER] = {
        config->gbs, config->mbs, config->tp, config->dp, config->pp,
        (int)config->schedule,
        ((int)config->precision * 2 + (int)config->grad_precision) * 2 +
            config->deterministic,
        config->recompute, config->sequence_parallel,
        parallel_zero_stage(config), config->offload_optimizer, stage,
        next_known,
        (int)(window_low - lane->starts[first]), last - first + 1};
    memcpy(key, header, sizeof header);
    for (int i = first; i <= last; i++)
        key[STAGE_KEY_HEADER + i - first] = lane->types[i];
    return STAGE_KEY_HEADER + last - first + 1;
}

/* Places stage s (and s - 1, whose link prices the gradient sent back)
 * on the window's nodes and prices it. */
static int price_stage(costmodel *cm, const parallel_config *config,
                       const node_lane *window, int stage, bool next_known,
                       stage_facts *out, pt_error *err)
{
    stage_placement previous;
    if (stage > 0 && costmodel_place_stage(cm, config, window, stage - 1,
                                           true, &previous, err) != 0)
        return -1;
    if (costmodel_place_stage(cm, config, window, stage, next_known,
                              &out->place, err) != 0)
        return -1;
    return costmodel_stage_terms_between(cm, config,
                                         stage > 0 ? &previous : NULL,
                                         &out->place, stage, &out->terms,
                                         err);
}

int search_stage_facts(costmodel *cm, search_memo *memo,
                       const parallel_config *config, const node_lane *lane,
                       int stage, bool next_known, stage_facts *out,
                       pt_error *err)
{
    long long stage_gpus = (long long)config->dp * config->tp;
    long long gpus = stage_gpus * config->pp;
    long long low = (stage - 1) * stage_gpus > 0 ? (stage - 1) * stage_gpus
                                                 : 0;
    long long high = (stage + (next_known ? 2 : 1)) * stage_gpus;
    if (high > gpus)
        high = gpus;
    int first = lane_slot(lane, low), last = lane_slot(lane, high - 1);
    int length = stage_key(memo, config, stage, next_known, lane, first, last,
                           low);
    size_t bytes = (size_t)length * sizeof(int);
    uint64_t hash = memo_hash(memo->key, bytes);
    const stage_facts *known = memo_find(&memo->stage_table, memo->key, bytes,
                                         hash);
    memo->stage_lookups++;
    if (known != NULL) {
        *out = *known;
        return 0;
    }
    node_lane window = {last - first + 1, lane->types + first,
                        lane->starts + first};
    if (price_stage(cm, config, &window, stage, next_known, out, err) != 0)
        return -1;
    void *slot = memo_insert(&memo->stage_table, memo->key, bytes, hash,
                             sizeof *out);
    if (slot == NULL)
        return pt_fail(err, "search: out of memory for the stage memo");
    memcpy(slot, out, sizeof *out);
    memo->stage_misses++;
    return 0;
}

/* --------------------------------------------------------- partitions */

static bool stage_before(const partition_stage *a, int index_a,
                         const partition_stage *b, int index_b)
{
    if (a->fixed_s != b->fixed_s)
        return a->fixed_s < b->fixed_s;
    if (a->per_layer_s != b->per_layer_s)
        return a->per_layer_s < b->per_layer_s;
    if (a->max_layers != b->max_layers)
        return a->max_layers < b->max_layers;
    return index_a < index_b;
}

/* Sorts the stages into memo->canonical / memo->sorted and writes the
 * key; returns its length in bytes. */
static size_t partition_key(search_memo *memo, partition_solver solver,
                            const partition_problem *problem)
{
    int *order = memo->canonical;
    for (int s = 0; s < problem->pp; s++) {
        int position = s;
        while (position > 0 &&
               stage_before(&problem->stages[s], s,
                            &problem->stages[order[position - 1]],
                            order[position - 1])) {
            order[position] = order[position - 1];
            position--;
        }
        order[position] = s;
    }
    unsigned char *key = (unsigned char *)memo->key;
    int header[PARTITION_KEY_HEADER] = {problem->layers,
                                        problem->microbatches, (int)solver,
                                        problem->pp};
    memcpy(key, header, sizeof header);
    size_t used = sizeof header;
    for (int i = 0; i < problem->pp; i++) {
        const partition_stage *stage = &problem->stages[order[i]];
        memo->sorted[i] = *stage;
        memcpy(key + used, &stage->fixed_s, sizeof(double));
        memcpy(key + used + sizeof(double), &stage->per_layer_s,
               sizeof(double));
        memcpy(key + used + 2 * sizeof(double), &stage->max_layers,
               sizeof(int));
        used += 2 * sizeof(double) + sizeof(int);
    }
    return used;
}

int search_solve_partition(search_memo *memo, partition_solver solver,
                           const partition_problem *problem, int *layers,
                           double *value, pt_error *err)
{
    if (solver == SOLVER_FASOP_GREEDY)
        return partition_solve_fasop_greedy(problem, layers, value, err);
    size_t length = partition_key(memo, solver, problem);
    uint64_t hash = memo_hash(memo->key, length);
    const partition_memo_value *known =
        memo_find(&memo->partition_table, memo->key, length, hash);
    memo->partition_lookups++;
    if (known == NULL) {
        partition_problem sorted = {problem->pp, problem->layers,
                                    problem->microbatches, memo->sorted};
        double solved_value = 0.0;
        int status = solver == SOLVER_ILP
                         ? partition_solve_ilp(&sorted, memo->sorted_layers,
                                               &solved_value, err)
                         : partition_solve_dp(&sorted, memo->sorted_layers,
                                              &solved_value, err);
        if (status < 0)
            return -1;
        partition_memo_value *slot = memo_insert(
            &memo->partition_table, memo->key, length, hash,
            sizeof *slot + (size_t)problem->pp * sizeof(int));
        if (slot == NULL)
            return pt_fail(err, "search: out of memory for the partition "
                           "memo");
        slot->status = status;
        slot->value = solved_value;
        memcpy(slot->layers, memo->sorted_layers,
               (size_t)problem->pp * sizeof(int));
        known = slot;
        memo->partition_misses++;
    }
    if (known->status == 1) {
        for (int i = 0; i < problem->pp; i++)
            layers[memo->canonical[i]] = known->layers[i];
        *value = known->value;
    }
    return known->status;
}
