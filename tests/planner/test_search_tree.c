/*
 * The tree search's walk and memos against brute force: on small
 * clusters whose node sizes and links differ (so tp groups also span
 * nodes), the exhaustive walk visits each node order at most once and
 * every arrangement of the nodes costs exactly what some visited order
 * costs; the facts of a stage priced from the nodes around it alone equal
 * the cost model's on the whole order, and the memoised partitions equal
 * the DP's. Every floor of a placement in the making lies at or under
 * the best score of the orders that complete it.
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
#define MAX_KEY 4096

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

/* The facts of every stage of an order, from the cost model's placement
 * of the whole order, and the key that identifies its cost. */
static int order_key(costmodel *cm, const parallel_config *config,
                     const int *types, stage_facts *facts,
                     unsigned char *key)
{
    int nodes[MAX_TEST_NODES];
    types_to_nodes(cm->cluster, types, nodes);
    stage_placement placement[PT_MAX_STAGES];
    pt_error err = {{0}};
    if (costmodel_place(cm, config, nodes, cm->cluster->node_count,
                        placement, &err) != 0)
        fail_msg("%s", err.message);
    for (int s = 0; s < config->pp; s++) {
        facts[s].place = placement[s];
        if (costmodel_stage_terms(cm, config, placement, s, &facts[s].terms,
                                  &err) != 0)
            fail_msg("%s", err.message);
    }
    int starts[MAX_TEST_NODES + 1] = {0};
    for (int i = 0; i < cm->cluster->node_count; i++)
        starts[i + 1] = starts[i] + cm->cluster->types[types[i]].gpus;
    node_lane lane = {cm->cluster->node_count, types, starts};
    link_spec link;
    int curve;
    costmodel_embedding_link(cm, config, &lane, &link, &curve);
    assert_true(shortlist_key_bytes(config->pp) <= MAX_KEY);
    return shortlist_key_write(facts, config->pp, config->dp == 1, link,
                               curve, key);
}

/* The orders an exhaustive walk of one task visits. */
typedef struct visit_log {
    int node_count;
    int count;
    int types[MAX_SEQUENCES][MAX_TEST_NODES];
} visit_log;

static void log_order(void *context, const int *types, int count)
{
    visit_log *log = context;
    assert_true(log->count < MAX_SEQUENCES);
    memcpy(log->types[log->count++], types, (size_t)count * sizeof(int));
}

static void walk_task(costmodel *cm, const search_task *task,
                      visit_log *log)
{
    search_options o;
    search_options_default(&o);
    tree_worker *w;
    pt_error err = {{0}};
    assert_int_equal(tree_worker_open(&w, cm, task->config.pp, &o, &err), 0);
    shortlist best;
    assert_int_equal(shortlist_open(&best, 4, cm->cluster->node_count,
                                    task->config.pp, &err), 0);
    tree_limits limits = {true, INFINITY, 0, log_order, log};
    tree_outcome outcome;
    log->node_count = cm->cluster->node_count;
    log->count = 0;
    if (search_tree_run(w, task, &limits, &best, &outcome, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(outcome.scored, log->count);
    shortlist_close(&best);
    tree_worker_close(w);
}

static bool same_order(const int *a, const int *b, int n)
{
    return memcmp(a, b, (size_t)n * sizeof(int)) == 0;
}

/* For every task: no order visited twice, and every arrangement costs the
 * same (the same key) as some order visited. Returns the arrangements
 * that are not visited themselves (rearrangements of a visited one). */
static int check_walk_covers(costmodel *cm, int gbs)
{
    const cluster *c = cm->cluster;
    search_options o;
    search_options_default(&o);
    o.gbs = gbs;
    o.max_mbs = 1;
    search_space space;
    pt_error err = {{0}};
    assert_int_equal(search_space_build(c, &cm->model, &o, &space,
                                        &err), 0);
    static sequence_list all;
    static visit_log visited;
    static unsigned char keys[MAX_SEQUENCES][MAX_KEY];
    static int key_length[MAX_SEQUENCES];
    all_sequences(c, &all);
    int rearranged = 0;
    stage_facts facts[PT_MAX_STAGES];
    unsigned char key[MAX_KEY];
    for (int i = 0; i < space.task_count; i++) {
        const search_task *task = &space.tasks[i];
        if (task->config.recompute || task->config.distributed_optimizer)
            continue; /* levers change no placement */
        walk_task(cm, task, &visited);
        for (int a = 0; a < visited.count; a++) {
            for (int b = 0; b < a; b++)
                assert_false(same_order(visited.types[a], visited.types[b],
                                        c->node_count));
            key_length[a] = order_key(cm, &task->config, visited.types[a],
                                      facts, keys[a]);
        }
        for (int q = 0; q < all.count; q++) {
            int length = order_key(cm, &task->config, all.types[q], facts,
                                   key);
            bool found = false, itself = false;
            for (int a = 0; a < visited.count && !found; a++) {
                found = length == key_length[a] &&
                        memcmp(key, keys[a], (size_t)length) == 0;
                itself = found && same_order(visited.types[a], all.types[q],
                                             c->node_count);
            }
            if (!found)
                fail_msg("task tp %d dp %d pp %d: arrangement %d costs like "
                         "no visited order", task->config.tp, task->config.dp,
                         task->config.pp, q);
            rearranged += !itself;
        }
    }
    search_space_free(&space);
    return rearranged;
}

static void open_model(costmodel *cm, const char *model_name, cluster *c)
{
    model_shape model;
    cluster unused;
    load_inputs(model_name, "hetero", &model, &unused);
    cluster_free(&unused);
    char profiles[PT_PATH_MAX];
    pt_error err = {{0}};
    if (costmodel_open(cm, &model, c, profile_root(profiles, sizeof profiles),
                       &err) != 0)
        fail_msg("%s", err.message);
}

static void test_walk_covers_every_arrangement(void **state)
{
    (void)state;
    cluster mixed, hetero;
    model_shape model;
    load_mixed_cluster(&mixed);
    load_inputs("gpt2-124m", "hetero", &model, &hetero);
    costmodel cm;
    open_model(&cm, "gpt2-124m", &mixed);
    int rearranged = check_walk_covers(&cm, 16);
    costmodel_close(&cm);
    open_model(&cm, "gpt2-124m", &hetero);
    rearranged += check_walk_covers(&cm, 16);
    costmodel_close(&cm);
    print_message("%d arrangements cost like a visited order they are not\n",
                  rearranged);
    assert_true(rearranged >= 20);
    cluster_free(&mixed);
    cluster_free(&hetero);
}

static bool same_terms(const stage_terms *a, const stage_terms *b)
{
    return a->fixed_s == b->fixed_s && a->per_layer_s == b->per_layer_s &&
           a->fixed_bytes == b->fixed_bytes &&
           a->per_layer_bytes == b->per_layer_bytes &&
           a->cap_bytes == b->cap_bytes && a->max_layers == b->max_layers;
}

/* The facts of stage s from the nodes over stages s-1..s+1 only (a lane
 * cut right after them) equal the whole order's; without the next stage,
 * only the send to it is missing. */
static void check_window_facts(costmodel *cm, search_memo *memo,
                               const parallel_config *config,
                               const int *types)
{
    stage_facts whole[PT_MAX_STAGES];
    unsigned char key[MAX_KEY];
    order_key(cm, config, types, whole, key);
    int starts[MAX_TEST_NODES + 1] = {0};
    int n = cm->cluster->node_count;
    for (int i = 0; i < n; i++)
        starts[i + 1] = starts[i] + cm->cluster->types[types[i]].gpus;
    long long stage_gpus = (long long)config->dp * config->tp;
    pt_error err = {{0}};
    for (int s = 0; s < config->pp; s++) {
        for (int known = 0; known < 2; known++) {
            long long end = (s + (known ? 2 : 1)) * stage_gpus;
            node_lane lane = {0, types, starts};
            while (lane.count < n && starts[lane.count] < end)
                lane.count++;
            stage_facts facts;
            assert_int_equal(search_stage_facts(cm, memo, config, &lane, s,
                                                known, &facts, &err), 0);
            stage_terms expected = whole[s].terms;
            if (!known && s < config->pp - 1) {
                const stage_placement *p = &whole[s].place;
                double bytes =
                    costmodel_pipeline_message_bytes(&cm->model, config);
                expected.fixed_s -= costmodel_send_seconds(
                    cm, bytes, p->next_curve_type, p->next_link);
                assert_true(fabs(facts.terms.fixed_s - expected.fixed_s) <=
                            1e-12 * whole[s].terms.fixed_s);
                facts.terms.fixed_s = expected.fixed_s;
            }
            assert_true(same_terms(&facts.terms, &expected));
            assert_int_equal(facts.place.slow_type, whole[s].place.slow_type);
            assert_int_equal(facts.place.small_type,
                             whole[s].place.small_type);
        }
    }
}

static void test_window_facts_match_cost_model(void **state)
{
    (void)state;
    cluster mixed;
    load_mixed_cluster(&mixed);
    costmodel cm;
    open_model(&cm, "gpt2-124m", &mixed);
    search_options o;
    search_options_default(&o);
    o.gbs = 16;
    o.max_mbs = 2;
    search_space space;
    pt_error err = {{0}};
    assert_int_equal(search_space_build(&mixed, &cm.model, &o, &space,
                                        &err), 0);
    search_memo memo;
    assert_int_equal(search_memo_open(&memo, 16, mixed.node_count, &err), 0);
    static sequence_list all;
    all_sequences(&mixed, &all);
    for (int pass = 0; pass < 2; pass++) /* the second pass hits */
        for (int i = 0; i < space.task_count; i++)
            for (int q = 0; q < all.count; q++)
                check_window_facts(&cm, &memo, &space.tasks[i].config,
                                   all.types[q]);
    print_message("stage memo: %lld of %lld lookups missed\n",
                  memo.stage_misses, memo.stage_lookups);
    assert_true(memo.stage_misses < memo.stage_lookups / 2);
    search_memo_close(&memo);
    search_space_free(&space);
    costmodel_close(&cm);
    cluster_free(&mixed);
}

/* The memoised partition equals a direct DP solve, hits or misses. */
static void test_partition_memo_matches_dp(void **state)
{
    (void)state;
    search_memo memo;
    pt_error err = {{0}};
    assert_int_equal(search_memo_open(&memo, 8, 8, &err), 0);
    uint64_t seed = 12345;
    for (int round = 0; round < 400; round++) {
        partition_stage stages[8];
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int pp = 1 + (int)((seed >> 33) % 3);
        for (int s = 0; s < pp; s++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            /* few distinct stages, so multisets repeat and the memo hits */
            static const int caps[3] = {-1, 3, 12};
            stages[s] = (partition_stage){(double)((seed >> 40) % 3) * 1e-3,
                                          1e-3 * (double)(1 + (seed >> 50) % 2),
                                          caps[(seed >> 55) % 3]};
        }
        partition_problem problem = {pp, 24, 8, stages};
        int a[8], b[8];
        double va = 0.0, vb = 0.0;
        int sa = search_solve_partition(&memo, SOLVER_DP, &problem, a, &va,
                                        &err);
        int sb = partition_solve_dp(&problem, b, &vb, &err);
        assert_int_equal(sa, sb);
        if (sa == 1) {
            assert_true(fabs(va - vb) <= 1e-12 * vb);
            assert_true(fabs(partition_surrogate(&problem, a) - vb) <=
                        1e-12 * vb);
        }
    }
    assert_true(memo.partition_misses < memo.partition_lookups);
    search_memo_close(&memo);
}


/* ------------------------------------------- floors against completions */

/* The score of a complete order as the tree scores it: the partition's
 * surrogate (through the memo, as the tree solves it) plus the largest
 * per-step work of any stage at the layers the partition gives it.
 * INFINITY when nothing fits. */
static double order_score(costmodel *cm, search_memo *memo,
                          const parallel_config *config, const int *types)
{
    stage_facts facts[PT_MAX_STAGES];
    unsigned char key[MAX_KEY];
    order_key(cm, config, types, facts, key);
    partition_stage stages[PT_MAX_STAGES];
    for (int s = 0; s < config->pp; s++)
        stages[s] = (partition_stage){facts[s].terms.fixed_s,
                                      facts[s].terms.per_layer_s,
                                      facts[s].terms.max_layers};
    partition_problem problem = {config->pp, cm->model.layers,
                                 parallel_microbatches(config), stages};
    int layers[PT_MAX_STAGES];
    double surrogate;
    pt_error err = {{0}};
    int status = search_solve_partition(memo, SOLVER_DP, &problem, layers,
                                        &surrogate, &err);
    assert_true(status >= 0);
    if (status == 0)
        return INFINITY;
    int n = cm->cluster->node_count;
    int starts[MAX_TEST_NODES + 1] = {0};
    for (int i = 0; i < n; i++)
        starts[i + 1] = starts[i] + cm->cluster->types[types[i]].gpus;
    node_lane lane = {n, types, starts};
    link_spec link;
    int curve;
    costmodel_embedding_link(cm, config, &lane, &link, &curve);
    double embedding = costmodel_embedding_allreduce_s(cm, config, link,
                                                       curve);
    double worst = 0.0;
    for (int s = 0; s < config->pp; s++) {
        type_costs costs;
        assert_int_equal(costmodel_type_costs(cm, facts[s].place.slow_type,
                                              config, &costs, &err), 0);
        step_work work;
        costmodel_step_work(cm, config, &facts[s].place, s, layers[s],
                            &costs, &work);
        double tail = work.reduce_s + work.gather_s + work.optimizer_s;
        if (s == 0 || s == config->pp - 1)
            tail += embedding;
        worst = fmax(worst, tail);
    }
    return surrogate + worst;
}

/* The floor of the first `depth` nodes of an order, as the tree builds
 * the placement when they complete a stage. */
static double prefix_floor(costmodel *cm, search_memo *memo,
                           bound_tables *tables,
                           const parallel_config *config, const int *types,
                           int depth, double threshold)
{
    const cluster *c = cm->cluster;
    long long stage = (long long)config->dp * config->tp;
    int starts[MAX_TEST_NODES + 1] = {0};
    for (int i = 0; i < c->node_count; i++)
        starts[i + 1] = starts[i] + c->types[types[i]].gpus;
    int complete = (int)(starts[depth] / stage);
    node_lane lane = {depth, types, starts};
    stage_facts facts[PT_MAX_STAGES];
    pt_error err = {{0}};
    for (int s = 0; s < complete; s++)
        assert_int_equal(search_stage_facts(cm, memo, config, &lane, s,
                                            s < complete - 1, &facts[s],
                                            &err), 0);
    int gpus_left[PLANNER_MAX_TYPES] = {0};
    for (int i = 0; i < c->node_count; i++) {
        long long from = starts[i] > complete * stage ? starts[i]
                                                      : complete * stage;
        if (starts[i + 1] > from)
            gpus_left[types[i]] += (int)(starts[i + 1] - from);
    }
    partial_placement partial = {facts, complete - 1, true, gpus_left};
    double floor_s;
    if (bound_floor(tables, memo, &partial, threshold, &floor_s, &err) != 0)
        fail_msg("%s", err.message);
    return floor_s;
}

/* For every task and every order of the cluster's nodes: at each node
 * that completes a stage, the floor, whatever the threshold, is at most
 * the best score of the orders that begin with those nodes. Returns how
 * many such floors the per-step work's walk could have cut (the
 * threshold below the best score). */
static int check_floors(costmodel *cm, int gbs)
{
    const cluster *c = cm->cluster;
    search_options o;
    search_options_default(&o);
    o.gbs = gbs;
    o.max_mbs = 2;
    search_space space;
    pt_error err = {{0}};
    assert_int_equal(search_space_build(c, &cm->model, &o, &space, &err), 0);
    static sequence_list all;
    static double scores[MAX_SEQUENCES];
    all_sequences(c, &all);
    search_memo memo;
    bound_tables *tables;
    assert_int_equal(search_memo_open(&memo, PT_MAX_STAGES, c->node_count,
                                      &err), 0);
    assert_int_equal(bound_tables_open(&tables, PT_MAX_STAGES, c->type_count,
                                       &err), 0);
    int checked = 0;
    for (int i = 0; i < space.task_count; i++) {
        const parallel_config *config = &space.tasks[i].config;
        long long stage = (long long)config->dp * config->tp;
        if (config->pp < 2)
            continue;
        assert_int_equal(bound_tables_fill(tables, cm, config, &err), 0);
        for (int q = 0; q < all.count; q++)
            scores[q] = order_score(cm, &memo, config, all.types[q]);
        for (int q = 0; q < all.count; q++) {
            long long placed = 0;
            for (int d = 1; d < c->node_count; d++) {
                long long before = placed;
                placed += c->types[all.types[q][d - 1]].gpus;
                if (placed / stage == before / stage ||
                    placed >= stage * config->pp)
                    continue;
                double best = INFINITY;
                for (int k = 0; k < all.count; k++)
                    if (same_order(all.types[k], all.types[q], d))
                        best = fmin(best, scores[k]);
                if (best == INFINITY)
                    continue;
                for (int t = 0; t < 3; t++) {
                    double threshold = best * (t == 0   ? 1.0
                                               : t == 1 ? 0.999
                                                        : 0.97);
                    double floor_s = prefix_floor(cm, &memo, tables, config,
                                                  all.types[q], d, threshold);
                    if (floor_s > best)
                        fail_msg("tp %d dp %d pp %d mbs %d, order %d, %d "
                                 "nodes: floor %.9g s above the best "
                                 "completion's %.9g s", config->tp,
                                 config->dp, config->pp, config->mbs, q, d,
                                 floor_s, best);
                    checked += t > 0 && floor_s > threshold;
                }
            }
        }
    }
    bound_tables_close(tables);
    search_memo_close(&memo);
    search_space_free(&space);
    return checked;
}

/* Three types of 2-GPU nodes (every stage of 1 or 2 GPUs then sits in
 * one node: the floors know each type's per-step work), slow PCIe
 * links on two of them, as on mixed-96. */
static void load_pcie_cluster(cluster *c)
{
    static const char *text =
        "{\"name\": \"pcie\", \"nodes\": ["
        "{\"name\": \"a100\", \"count\": 2, \"gpu\": \"A100-40GB\", "
        "\"gpus\": 2, \"intra_node\": {\"bandwidth_GBps\": 230, "
        "\"latency_us\": 5}, \"inter_node\": {\"bandwidth_Gbps\": 400, "
        "\"latency_us\": 20}},"
        "{\"name\": \"a10\", \"count\": 2, \"gpu\": \"A10\", "
        "\"gpus\": 2, \"intra_node\": {\"bandwidth_GBps\": 16, "
        "\"latency_us\": 10}, \"inter_node\": {\"bandwidth_Gbps\": 50, "
        "\"latency_us\": 20}},"
        "{\"name\": \"rtx3090\", \"count\": 2, \"gpu\": \"RTX3090\", "
        "\"gpus\": 2, \"intra_node\": {\"bandwidth_GBps\": 16, "
        "\"latency_us\": 10}, \"inter_node\": {\"bandwidth_Gbps\": 25, "
        "\"latency_us\": 20}}]}";
    cluster_from_text(text, "<pcie>", c);
}

static void test_floors_below_every_completion(void **state)
{
    (void)state;
    cluster mixed, pcie;
    load_mixed_cluster(&mixed);
    load_pcie_cluster(&pcie);
    costmodel cm;
    open_model(&cm, "gpt2-xl", &pcie);
    int cut = check_floors(&cm, 32);
    costmodel_close(&cm);
    open_model(&cm, "gpt2-124m", &mixed);
    cut += check_floors(&cm, 16);
    costmodel_close(&cm);
    print_message("%d floors above a threshold under the best completion\n",
                  cut);
    assert_true(cut > 0);
    cluster_free(&mixed);
    cluster_free(&pcie);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_walk_covers_every_arrangement),
        cmocka_unit_test(test_window_facts_match_cost_model),
        cmocka_unit_test(test_partition_memo_matches_dp),
        cmocka_unit_test(test_floors_below_every_completion),
    };
    return cmocka_run_group_tests_name("search_tree", tests, NULL, NULL);
}
