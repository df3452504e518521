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

/* Ints of a stage key before the node types: the config, the stage, the
 * offset of the window in its first node and the node count. */
#define STAGE_KEY_HEADER 12
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
    memo->placement = malloc((size_t)max_pp * sizeof *memo->placement);
    memo->node_start = malloc(((size_t)node_count + 1) * sizeof(int));
    memo->node_type = malloc((size_t)node_count * sizeof(int));
    memo->canonical = malloc((size_t)max_pp * sizeof(int));
    memo->sorted = malloc((size_t)max_pp * sizeof *memo->sorted);
    memo->sorted_layers = malloc((size_t)max_pp * sizeof(int));
    if (!memo->key || !memo->placement || !memo->node_start ||
        !memo->node_type || !memo->canonical || !memo->sorted ||
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
    free(memo->placement);
    free(memo->node_start);
    free(memo->node_type);
    free(memo->canonical);
    free(memo->sorted);
    free(memo->sorted_layers);
    memset(memo, 0, sizeof *memo);
}

/* ------------------------------------------------------- stage facts */

/* The key of stage s: the config, s, and the node types lying over the
 * GPUs of stages s-1..s+1 (with where the window starts in its first
 * node). The cost model reads a stage's slowest and smallest GPU type,
 * its link to the next stage and the previous stage's link to it; all
 * are functions of that window. Returns the key length in ints. */
static int stage_key(const search_memo *memo, const parallel_config *config,
                     int stage, int first_node, int last_node, int window_low)
{
    int *key = memo->key;
    int header[STAGE_KEY_HEADER] = {
        config->gbs, config->mbs, config->tp, config->dp, config->pp,
        (int)config->schedule, (int)config->precision, config->recompute,
        config->distributed_optimizer, stage,
        window_low - memo->node_start[first_node],
        last_node - first_node + 1};
    memcpy(key, header, sizeof header);
    for (int i = first_node; i <= last_node; i++)
        key[STAGE_KEY_HEADER + i - first_node] = memo->node_type[i];
    return STAGE_KEY_HEADER + last_node - first_node + 1;
}

static void lay_out_nodes(const cluster *c, search_memo *memo,
                          const int *order, int node_count)
{
    int position = 0;
    for (int i = 0; i < node_count; i++) {
        memo->node_type[i] = cluster_node_type(c, order[i]);
        memo->node_start[i] = position;
        position += c->types[memo->node_type[i]].gpus;
    }
    memo->node_start[node_count] = position;
}

/* Prices stage s for real (placing the order first when needed) and
 * remembers it under the key in memo->key. */
static int price_stage(costmodel *cm, search_memo *memo,
                       const parallel_config *config, const int *order,
                       int node_count, int stage, bool *placed,
                       int key_length, uint64_t hash, stage_facts *out,
                       pt_error *err)
{
    if (!*placed) {
        if (costmodel_place(cm, config, order, node_count, memo->placement,
                            err) != 0)
            return -1;
        *placed = true;
    }
    if (costmodel_stage_terms(cm, config, memo->placement, stage, &out->terms,
                              err) != 0)
        return -1;
    out->slow_type = memo->placement[stage].slow_type;
    out->small_type = memo->placement[stage].small_type;
    out->dp_link = memo->placement[stage].dp_link;
    void *slot = memo_insert(&memo->stage_table, memo->key,
                             (size_t)key_length * sizeof(int), hash,
                             sizeof *out);
    if (slot == NULL)
        return pt_fail(err, "search: out of memory for the stage memo");
    memcpy(slot, out, sizeof *out);
    memo->stage_misses++;
    return 0;
}

int search_stage_facts(costmodel *cm, search_memo *memo,
                       const parallel_config *config, const int *order,
                       int node_count, stage_facts *out, pt_error *err)
{
    lay_out_nodes(cm->cluster, memo, order, node_count);
    const int stage_gpus = config->dp * config->tp;
    const int gpus = memo->node_start[node_count];
    bool placed = false;
    int first = 0;
    for (int s = 0; s < config->pp; s++) {
        int low = (s - 1) * stage_gpus > 0 ? (s - 1) * stage_gpus : 0;
        int high = (s + 2) * stage_gpus < gpus ? (s + 2) * stage_gpus : gpus;
        while (memo->node_start[first + 1] <= low)
            first++;
        int last = first;
        while (last + 1 < node_count && memo->node_start[last + 1] < high)
            last++;
        int length = stage_key(memo, config, s, first, last, low);
        uint64_t hash = memo_hash(memo->key, (size_t)length * sizeof(int));
        const stage_facts *known = memo_find(
            &memo->stage_table, memo->key, (size_t)length * sizeof(int), hash);
        memo->stage_lookups++;
        if (known != NULL) {
            out[s] = *known;
            continue;
        }
        if (price_stage(cm, memo, config, order, node_count, s, &placed,
                        length, hash, &out[s], err) != 0)
            return -1;
    }
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
