/*
 * The search space and the search's memos, against brute force: every
 * arrangement of a cluster's nodes is represented by exactly one node
 * order of the space and costs what that order costs, and the memoised
 * stage terms and partitions equal the cost model's and the DP's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "fixtures.h"
#include "planner/internal.h"

#define MAX_SEQUENCES 4096
#define MAX_TEST_NODES 16

/* Every multiset permutation of a cluster's node types. */
typedef struct sequence_list {
    int node_count;
    int count;
    int types[MAX_SEQUENCES][MAX_TEST_NODES];
} sequence_list;

static void permute(const cluster *c, int *remaining, int *current,
                    int depth, sequence_list *out)
{
    if (depth == c->node_count) {
        assert_true(out->count < MAX_SEQUENCES);
        memcpy(out->types[out->count++], current,
               (size_t)depth * sizeof(int));
        return;
    }
    for (int t = 0; t < c->type_count; t++) {
        if (remaining[t] == 0)
            continue;
        remaining[t]--;
        current[depth] = t;
        permute(c, remaining, current, depth + 1, out);
        remaining[t]++;
    }
}

static void all_sequences(const cluster *c, sequence_list *out)
{
    int remaining[PLANNER_MAX_TYPES], current[MAX_TEST_NODES];
    for (int t = 0; t < c->type_count; t++)
        remaining[t] = c->types[t].count;
    out->node_count = c->node_count;
    out->count = 0;
    permute(c, remaining, current, 0, out);
}

/* The representative the space should hold: inside each stage, the run
 * of nodes lying wholly in it sorted by type. Written independently of
 * the walk in search_space.c. */
static void canonical_form(const cluster *c, int stage_gpus,
                           const int *types, int *out)
{
    int n = c->node_count, start[MAX_TEST_NODES + 1], position = 0;
    for (int i = 0; i < n; i++) {
        out[i] = types[i];
        start[i] = position;
        position += c->types[types[i]].gpus;
    }
    start[n] = position;
    for (int i = 0; i < n;) {
        int stage = start[i] / stage_gpus;
        if ((start[i + 1] - 1) / stage_gpus != stage) {
            i++; /* shared with the next stage: stays where it is */
            continue;
        }
        int j = i + 1;
        while (j < n && start[j] / stage_gpus == stage &&
               (start[j + 1] - 1) / stage_gpus == stage)
            j++;
        for (int a = i + 1; a < j; a++)
            for (int b = a; b > i && out[b - 1] > out[b]; b--) {
                int swap = out[b];
                out[b] = out[b - 1];
                out[b - 1] = swap;
            }
        i = j;
    }
}

static void types_to_nodes(const cluster *c, const int *types, int *nodes)
{
    int first[PLANNER_MAX_TYPES], used[PLANNER_MAX_TYPES] = {0}, node = 0;
    for (int t = 0; t < c->type_count; t++) {
        first[t] = node;
        node += c->types[t].count;
    }
    for (int i = 0; i < c->node_count; i++)
        nodes[i] = first[types[i]] + used[types[i]]++;
}

static int find_order(const search_space *space, const search_shape *shape,
                      const cluster *c, const int *types)
{
    int nodes[MAX_TEST_NODES];
    types_to_nodes(c, types, nodes);
    for (int o = 0; o < shape->order_count; o++)
        if (memcmp(search_space_order(space, shape->first_order + o), nodes,
                   (size_t)c->node_count * sizeof(int)) == 0)
            return shape->first_order + o;
    return -1;
}

static search_options small_options(int gbs)
{
    search_options o;
    search_options_default(&o);
    o.gbs = gbs;
    o.max_mbs = 2;
    return o;
}

static void check_space_covers(const cluster *c, int layers)
{
    search_options o = small_options(16);
    search_space space;
    pt_error err = {{0}};
    if (search_space_build(c, layers, &o, &space, &err) != 0)
        fail_msg("%s", err.message);
    static sequence_list all;
    all_sequences(c, &all);
    assert_true(space.shape_count > 0);
    for (int s = 0; s < space.shape_count; s++) {
        const search_shape *shape = &space.shapes[s];
        int stage_gpus = shape->dp * shape->tp;
        char used[MAX_SEQUENCES] = {0};
        for (int q = 0; q < all.count; q++) {
            int canonical[MAX_TEST_NODES];
            canonical_form(c, stage_gpus, all.types[q], canonical);
            int found = find_order(&space, shape, c, canonical);
            if (found < 0)
                fail_msg("shape tp %d dp %d pp %d: arrangement %d has no "
                         "order in the space", shape->tp, shape->dp,
                         shape->pp, q);
            used[found - shape->first_order] = 1;
        }
        /* every order of the space is some arrangement's representative:
           none is a duplicate */
        for (int o = 0; o < shape->order_count; o++)
            assert_int_equal(used[o], 1);
    }
    search_space_free(&space);
}

static void test_orders_distinct_and_complete(void **state)
{
    (void)state;
    cluster mixed, hetero;
    model_shape model;
    load_mixed_cluster(&mixed);
    load_inputs("gpt2-124m", "hetero", &model, &hetero);
    check_space_covers(&mixed, 12);
    check_space_covers(&hetero, 48);
    cluster_free(&mixed);
    cluster_free(&hetero);
}

static void even_partition(int layers, int pp, int *out)
{
    for (int s = 0; s < pp; s++)
        out[s] = layers / pp + (s < layers % pp ? 1 : 0);
}

static bool same_terms(const stage_terms *a, const stage_terms *b)
{
    return a->fixed_s == b->fixed_s && a->per_layer_s == b->per_layer_s &&
           a->fixed_bytes == b->fixed_bytes &&
           a->per_layer_bytes == b->per_layer_bytes &&
           a->cap_bytes == b->cap_bytes && a->max_layers == b->max_layers;
}

/* Cost of one arrangement: every stage's terms and the simulated step. */
static void price_order(costmodel *cm, const parallel_config *config,
                        const int *nodes, stage_terms *terms, double *step_s)
{
    stage_placement placement[PT_MAX_STAGES];
    pt_error err = {{0}};
    if (costmodel_place(cm, config, nodes, cm->cluster->node_count,
                        placement, &err) != 0)
        fail_msg("%s", err.message);
    for (int s = 0; s < config->pp; s++)
        if (costmodel_stage_terms(cm, config, placement, s, &terms[s],
                                  &err) != 0)
            fail_msg("%s", err.message);
    int partition[PT_MAX_STAGES];
    even_partition(cm->model.layers, config->pp, partition);
    estimate est;
    if (costmodel_estimate(cm, config, nodes, cm->cluster->node_count,
                           partition, false, &est, &err) != 0)
        fail_msg("%s", err.message);
    *step_s = est.step_time_s;
    estimate_free(&est);
}

static void test_rearranged_orders_cost_the_same(void **state)
{
    (void)state;
    cluster mixed;
    model_shape model;
    cluster unused;
    load_inputs("gpt2-124m", "hetero", &model, &unused);
    cluster_free(&unused);
    load_mixed_cluster(&mixed);
    costmodel cm;
    char profiles[PT_PATH_MAX];
    pt_error err = {{0}};
    if (costmodel_open(&cm, &model, &mixed, profile_root(profiles,
                                                         sizeof profiles),
                       &err) != 0)
        fail_msg("%s", err.message);
    search_options o = small_options(16);
    search_space space;
    assert_int_equal(search_space_build(&mixed, model.layers, &o, &space,
                                        &err), 0);
    static sequence_list all;
    all_sequences(&mixed, &all);
    int compared = 0;
    for (int s = 0; s < space.shape_count; s++) {
        const search_shape *shape = &space.shapes[s];
        parallel_config config = {16, shape->mbs[0], shape->tp, shape->dp,
                                  shape->pp, SCHEDULE_1F1B, PRECISION_BF16,
                                  false, false};
        for (int q = 0; q < all.count; q++) {
            int canonical[MAX_TEST_NODES], nodes[MAX_TEST_NODES];
            canonical_form(&mixed, shape->dp * shape->tp, all.types[q],
                           canonical);
            if (memcmp(canonical, all.types[q],
                       (size_t)mixed.node_count * sizeof(int)) == 0)
                continue;
            stage_terms mine[PT_MAX_STAGES], theirs[PT_MAX_STAGES];
            double my_step, their_step;
            types_to_nodes(&mixed, all.types[q], nodes);
            price_order(&cm, &config, nodes, mine, &my_step);
            types_to_nodes(&mixed, canonical, nodes);
            price_order(&cm, &config, nodes, theirs, &their_step);
            for (int st = 0; st < shape->pp; st++)
                assert_true(same_terms(&mine[st], &theirs[st]));
            assert_true(fabs(my_step - their_step) <= 1e-12 * their_step);
            compared++;
        }
    }
    print_message("%d rearranged orders priced like their representative\n",
                  compared);
    assert_true(compared >= 20);
    search_space_free(&space);
    costmodel_close(&cm);
    cluster_free(&mixed);
}

static void check_memo(costmodel *cm, const search_space *space, int gbs)
{
    search_memo memo;
    pt_error err = {{0}};
    int max_pp = 1;
    for (int s = 0; s < space->shape_count; s++)
        if (space->shapes[s].pp > max_pp)
            max_pp = space->shapes[s].pp;
    assert_int_equal(search_memo_open(&memo, max_pp, space->node_count, &err),
                     0);
    stage_facts facts[PT_MAX_STAGES];
    stage_terms direct[PT_MAX_STAGES];
    partition_stage stages[PT_MAX_STAGES];
    for (int pass = 0; pass < 2; pass++) { /* the second pass hits */
        for (int o = 0; o < space->order_count; o++) {
            const search_shape *shape = &space->shapes[space->order_shape[o]];
            for (int i = 0; i < shape->mbs_count; i++) {
                for (int lever = 0; lever < 4; lever++) {
                    parallel_config config = {
                        gbs, shape->mbs[i], shape->tp, shape->dp, shape->pp,
                        SCHEDULE_1F1B, PRECISION_BF16, lever & 1,
                        (lever & 2) && shape->dp > 1};
                    const int *order = search_space_order(space, o);
                    assert_int_equal(search_stage_facts(cm, &memo, &config,
                                                        order,
                                                        space->node_count,
                                                        facts, &err), 0);
                    double step_s;
                    price_order(cm, &config, order, direct, &step_s);
                    for (int s = 0; s < shape->pp; s++) {
                        assert_true(same_terms(&facts[s].terms, &direct[s]));
                        stages[s] = (partition_stage){direct[s].fixed_s,
                                                      direct[s].per_layer_s,
                                                      direct[s].max_layers};
                    }
                    partition_problem problem = {
                        shape->pp, cm->model.layers,
                        parallel_microbatches(&config), stages};
                    int a[PT_MAX_STAGES], b[PT_MAX_STAGES];
                    double va = 0.0, vb = 0.0;
                    int sa = search_solve_partition(&memo, SOLVER_DP, &problem,
                                                    a, &va, &err);
                    int sb = partition_solve_dp(&problem, b, &vb, &err);
                    assert_int_equal(sa, sb);
                    if (sa == 1) {
                        assert_true(fabs(va - vb) <= 1e-12 * vb);
                        assert_true(fabs(partition_surrogate(&problem, a) -
                                         vb) <= 1e-12 * vb);
                    }
                }
            }
        }
    }
    assert_true(memo.stage_misses < memo.stage_lookups / 2);
    assert_true(memo.partition_misses < memo.partition_lookups / 2);
    print_message("memo: %lld of %lld stage lookups and %lld of %lld "
                  "partition lookups missed\n", memo.stage_misses,
                  memo.stage_lookups, memo.partition_misses,
                  memo.partition_lookups);
    search_memo_close(&memo);
}

static void test_memo_matches_cost_model(void **state)
{
    (void)state;
    model_shape model;
    cluster c;
    load_inputs("gpt2-xl", "hetero", &model, &c);
    costmodel cm;
    char profiles[PT_PATH_MAX];
    pt_error err = {{0}};
    if (costmodel_open(&cm, &model, &c, profile_root(profiles,
                                                     sizeof profiles),
                       &err) != 0)
        fail_msg("%s", err.message);
    search_options o = small_options(64);
    search_space space;
    assert_int_equal(search_space_build(&c, model.layers, &o, &space, &err),
                     0);
    check_memo(&cm, &space, 64);
    search_space_free(&space);
    costmodel_close(&cm);
    cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders_distinct_and_complete),
        cmocka_unit_test(test_rearranged_orders_cost_the_same),
        cmocka_unit_test(test_memo_matches_cost_model),
    };
    return cmocka_run_group_tests_name("search_space", tests, NULL, NULL);
}
