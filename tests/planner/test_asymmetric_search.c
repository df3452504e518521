/*
 * planner_search_asymmetric (issue 36) on random small mixed clusters:
 * 2 or 3 node types, 2 to 4 nodes of 1 or 2 GPUs (the derived A10, RTX
 * 3090, A100 and V100 profiles), random links, batches and models. On
 * every cluster its best plan is never slower than the symmetric
 * search's, and the best score it finds among the plans of stages of
 * their own degrees that score below the symmetric search's best (its
 * cutoff) equals that of an enumeration written here on its own: every
 * permutation of the nodes (not only the distinct ones), every split,
 * every (tp, dp), every micro-batch, each partition by brute force (held
 * to the DP, at whose layers the per-step work is taken), scored as the
 * symmetric search scores a placement. With a small budget of tree nodes
 * it stops with a floor.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "fixtures.h"

#define CLUSTERS 120
#define MAX_GPUS 8
#define MAX_NODES 4

/* 2 or 3 types, 2 to 4 nodes of 1 or 2 GPUs, as JSON text. */
static void small_cluster_text(random_source *r, int index, char *out,
                               size_t size)
{
    static const int sizes[] = {1, 2};
    int types = 2 + pick(r, 2);
    random_cluster_json(r, "small", index, types, types + pick(r, 5 - types),
                        sizes, 2, out, size);
}

/* A GPT of 3..6 layers, wide enough that memory binds now and then. */
static model_shape small_model(random_source *r)
{
    static const int hiddens[] = {1024, 2048, 4096};
    model_shape m = {.layers = 3 + pick(r, 4), .heads = 16, .seq = 2048,
                     .vocab = 50257, .tied_embeddings = true};
    m.hidden = hiddens[pick(r, 3)];
    m.ffn_hidden = 4 * m.hidden;
    snprintf(m.name, sizeof m.name, "small-%d", m.layers);
    return m;
}

/* The enumeration: a node permutation, its split and degrees. */
typedef struct enumeration {
    costmodel *cm;
    const search_options *o;
    int order[MAX_NODES], node_count, gpus, pp;
    int sizes[MAX_GPUS];
    stage_degrees degrees[MAX_GPUS];
    double best;
} enumeration;

/* The plan's score as the symmetric search scores a placement: the
 * partition's surrogate (brute force, held to the DP, whose layers the
 * per-step work is taken at) and the largest per-step work. */
static void solve(enumeration *e, int samples)
{
    parallel_config config = {
        .gbs = e->o->gbs, .mbs = samples / e->degrees[0].dp,
        .tp = e->degrees[0].tp, .dp = e->degrees[0].dp, .pp = e->pp,
        .schedule = e->o->schedule, .precision = e->o->precision};
    stage_terms terms[MAX_GPUS];
    pt_error err = {{0}};
    if (costmodel_stage_terms_stages(e->cm, &config, e->degrees, e->order,
                                     e->node_count, terms, &err) != 0)
        fail_msg("%s", err.message);
    partition_stage stages[MAX_GPUS];
    for (int s = 0; s < e->pp; s++)
        stages[s] = (partition_stage){terms[s].fixed_s, terms[s].per_layer_s,
                                      terms[s].max_layers};
    partition_problem problem = {e->pp, e->cm->model.layers,
                                 e->o->gbs / samples, stages};
    int layers[MAX_GPUS], dp_layers[MAX_GPUS];
    double value, dp_value;
    int solved = partition_solve_brute_force(&problem, layers, &value, &err);
    int dp_solved = partition_solve_dp(&problem, dp_layers, &dp_value, &err);
    if (solved < 0 || dp_solved < 0)
        fail_msg("%s", err.message);
    assert_int_equal(solved, dp_solved);
    if (solved != 1)
        return;
    if (fabs(dp_value - value) > 1e-9 * value)
        fail_msg("the DP's surrogate %.17g, brute force's %.17g", dp_value,
                 value);
    double tail;
    if (costmodel_step_tail_stages(e->cm, &config, e->degrees, e->order,
                                   e->node_count, dp_layers, &tail,
                                   &err) != 0)
        fail_msg("%s", err.message);
    if (dp_value + tail < e->best)
        e->best = dp_value + tail;
}

static void micro_batches(enumeration *e)
{
    bool alike = true;
    int smallest = e->degrees[0].dp;
    for (int s = 0; s < e->pp; s++) {
        alike = alike && e->degrees[s].tp == e->degrees[0].tp &&
                e->degrees[s].dp == e->degrees[0].dp;
        smallest = e->degrees[s].dp < smallest ? e->degrees[s].dp : smallest;
    }
    if (alike)
        return;
    for (int samples = 1; samples <= e->o->gbs; samples++) {
        bool splits = e->o->gbs % samples == 0 &&
                      samples / smallest <= e->o->max_mbs;
        for (int s = 0; s < e->pp && splits; s++)
            splits = samples % e->degrees[s].dp == 0;
        if (splits)
            solve(e, samples);
    }
}

static void degrees(enumeration *e, int stage)
{
    if (stage == e->pp) {
        micro_batches(e);
        return;
    }
    for (int tp = 1; tp <= 8; tp *= 2)
        if (e->sizes[stage] % tp == 0 &&
            model_check_tp(&e->cm->model, tp, NULL) == 0) {
            e->degrees[stage] = (stage_degrees){tp, e->sizes[stage] / tp};
            degrees(e, stage + 1);
        }
}

static void splits(enumeration *e, int stage, int left)
{
    if (stage == e->pp - 1) {
        e->sizes[stage] = left;
        degrees(e, 0);
        return;
    }
    for (int g = 1; g <= left - (e->pp - stage - 1); g++) {
        e->sizes[stage] = g;
        splits(e, stage + 1, left - g);
    }
}

static void permutations(enumeration *e, int position, bool *placed)
{
    if (position >= e->node_count || position >= MAX_NODES) {
        int most = e->gpus < e->cm->model.layers ? e->gpus
                                                 : e->cm->model.layers;
        for (e->pp = 2; e->pp <= most; e->pp++)
            splits(e, 0, e->gpus);
        return;
    }
    for (int node = 0; node < e->node_count && node < MAX_NODES; node++)
        if (!placed[node]) {
            placed[node] = true;
            e->order[position] = node;
            permutations(e, position + 1, placed);
            placed[node] = false;
        }
}

static double objective(const search_options *o, const ranked_plan *p)
{
    return o->objective == OBJECTIVE_COST ? p->cost_per_step_usd
                                          : p->step_time_s;
}

/* gbs 8 or 16, micro-batches up to 4, 4 plans kept, one thread; the
 * objective $ per step one time in four. */
static search_options small_options(random_source *r)
{
    search_options o;
    search_options_default(&o);
    o.gbs = 8 << pick(r, 2);
    o.max_mbs = 4;
    o.keep = 4;
    o.threads = 1;
    o.objective = pick(r, 4) == 0 ? OBJECTIVE_COST : OBJECTIVE_TIME;
    return o;
}

/* What the clusters of one test gave. */
typedef struct enumerated {
    int with_plans, asymmetric_best, below_cutoff;
    long long alike;
} enumerated;

/* The search against the enumeration on `clusters` random clusters of
 * make_cluster's; with every link between nodes of one latency when
 * same_latency. */
static enumerated against_enumeration(
    random_source *r, int clusters,
    void (*make_cluster)(random_source *, int, char *, size_t),
    bool same_latency)
{
    char profiles[PT_PATH_MAX];
    profile_root(profiles, sizeof profiles);
    enumerated seen = {0};
    int with_plans = 0, asymmetric_best = 0, below_cutoff = 0;
    for (int i = 0; i < clusters; i++) {
        char text[4096];
        make_cluster(r, i, text, sizeof text);
        cluster c;
        costmodel cm;
        model_shape m = small_model(r);
        cluster_from_text(text, "<random>", &c);
        for (int t = 0; same_latency && t < c.type_count; t++)
            c.types[t].inter_node.latency_s = 20e-6;
        pt_error open_err = {{0}};
        if (costmodel_open(&cm, &m, &c, profiles, &open_err) != 0)
            fail_msg("%s", open_err.message);
        search_options o = small_options(r);
        search_result symmetric, both;
        pt_error err = {{0}};
        if (planner_search(&cm, &o, &symmetric, &err) != 0 ||
            planner_search_asymmetric(&cm, &o, &both, &err) != 0)
            fail_msg("cluster %d: %s", i, err.message);
        enumeration e = {.cm = &cm, .o = &o, .node_count = c.node_count,
                         .gpus = cluster_gpu_count(&c), .best = INFINITY};
        bool placed[MAX_NODES] = {false};
        permutations(&e, 0, placed);
        /* the search keeps the plans below the symmetric best's score */
        double cutoff = both.asymmetric_cutoff_s;
        assert_true(cutoff == symmetric.best_score_s);
        double expected = e.best < cutoff ? e.best : INFINITY;
        if (expected != both.asymmetric_best_score_s)
            fail_msg("cluster %d (%s): the search's best score %.17g, the "
                     "enumeration's %.17g (cutoff %.17g)", i, text,
                     both.asymmetric_best_score_s, e.best, cutoff);
        assert_true(both.asymmetric_exact);
        below_cutoff += e.best < cutoff;
        assert_true(both.plan_count >= symmetric.plan_count);
        if (symmetric.plan_count > 0 &&
            objective(&o, &both.plans[0]) >
                objective(&o, &symmetric.plans[0]))
            fail_msg("cluster %d: the asymmetric search's best %.9g loses "
                     "to the symmetric %.9g", i,
                     objective(&o, &both.plans[0]),
                     objective(&o, &symmetric.plans[0]));
        with_plans += both.plan_count > 0;
        asymmetric_best +=
            both.plan_count > 0 &&
            stage_degrees_first_own(&both.plans[0].config,
                                    both.plans[0].stages) >= 0;
        seen.alike += both.asymmetric_alike;
        search_result_free(&symmetric);
        search_result_free(&both);
        costmodel_close(&cm);
        cluster_free(&c);
    }
    print_message("%d clusters, %d with a plan, %d with a plan of stages of "
                  "their own degrees scoring below the symmetric best, %d "
                  "best with such a plan; %lld partial plans given an "
                  "alike one's floor\n", clusters, with_plans, below_cutoff,
                  asymmetric_best, seen.alike);
    seen.with_plans = with_plans;
    seen.asymmetric_best = asymmetric_best;
    seen.below_cutoff = below_cutoff;
    return seen;
}

static void test_against_enumeration(void **state)
{
    (void)state;
    random_source r = {0x2545f4914f6cdd1dULL};
    enumerated seen = against_enumeration(&r, CLUSTERS, small_cluster_text,
                                          false);
    assert_true(seen.with_plans >= CLUSTERS / 2);
}

/* 2 or 3 types, 3 or 4 nodes of 2 GPUs: stages over two nodes or more
 * whose nodes may be put in another order, whose children share one
 * floor (search_asym_tree.c's kin_of) once every link between nodes has
 * one latency. */
static void alike_cluster_text(random_source *r, int index, char *out,
                               size_t size)
{
    static const int sizes[] = {2};
    int types = 2 + pick(r, 2);
    random_cluster_json(r, "alike", index, types, 3 + pick(r, 2), sizes, 1,
                        out, size);
}

/* Where alike children share a floor the search is as exact: against
 * the enumeration on 40 clusters where they do. */
static void test_alike_children_against_enumeration(void **state)
{
    (void)state;
    random_source r = {0x9e3779b97f4a7c15ULL};
    enumerated seen = against_enumeration(&r, 40, alike_cluster_text, true);
    assert_true(seen.alike > 0);
    assert_true(seen.with_plans >= 20);
}

/* With a small budget of tree nodes it stops and says how far from
 * exact it may be: a floor no higher than the best score it knows of
 * (GPT-2 XL on FASOP's 32-GPU cluster, whose symmetric search ends well
 * within the budget). */
static void test_budget_gives_a_floor(void **state)
{
    (void)state;
    model_shape m;
    cluster c;
    load_inputs("gpt2-xl", "hetero", &m, &c);
    char profiles[PT_PATH_MAX];
    costmodel cm;
    pt_error err = {{0}};
    if (costmodel_open(&cm, &m, &c, profile_root(profiles, sizeof profiles),
                       &err) != 0)
        fail_msg("%s", err.message);
    search_options o;
    search_options_default(&o);
    o.gbs = 64;
    o.threads = 1;
    o.max_tree_nodes = 2000;
    search_result result;
    if (planner_search_asymmetric(&cm, &o, &result, &err) != 0)
        fail_msg("%s", err.message);
    assert_true(result.plan_count > 0);
    double best = fmin(result.asymmetric_cutoff_s,
                       result.asymmetric_best_score_s);
    assert_true(result.asymmetric_floor_s <= best);
    assert_false(result.asymmetric_exact);
    search_result_free(&result);
    costmodel_close(&cm);
    cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_enumeration),
        cmocka_unit_test(test_alike_children_against_enumeration),
        cmocka_unit_test(test_budget_gives_a_floor),
    };
    return cmocka_run_group_tests_name("asymmetric_search", tests, NULL,
                                       NULL);
}
