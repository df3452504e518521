/*
 * planner_search_asymmetric (issue 36) on random small mixed clusters:
 * 2 or 3 node types, 2 to 4 nodes of 1 or 2 GPUs (the derived A10, RTX
 * 3090, A100 and V100 profiles), random links, batches and models. On
 * every cluster its best plan is never slower than the symmetric
 * search's (the symmetric optimum is among its candidates), and the best
 * surrogate it solved equals that of an enumeration written here on its
 * own: every permutation of the nodes (not only the distinct ones),
 * every split, every (tp, dp), every micro-batch, each partition by
 * brute force.
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
    int layers[MAX_GPUS];
    double value;
    int solved = partition_solve_brute_force(&problem, layers, &value, &err);
    if (solved < 0)
        fail_msg("%s", err.message);
    if (solved == 1 && value < e->best)
        e->best = value;
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

static void test_against_enumeration(void **state)
{
    (void)state;
    random_source r = {0x2545f4914f6cdd1dULL};
    char profiles[PT_PATH_MAX];
    profile_root(profiles, sizeof profiles);
    int with_plans = 0, asymmetric_best = 0;
    for (int i = 0; i < CLUSTERS; i++) {
        char text[4096];
        small_cluster_text(&r, i, text, sizeof text);
        cluster c;
        costmodel cm;
        model_shape m = small_model(&r);
        open_random_case(text, &m, profiles, &c, &cm);
        search_options o = small_options(&r);
        search_result symmetric, both;
        pt_error err = {{0}};
        if (planner_search(&cm, &o, &symmetric, &err) != 0 ||
            planner_search_asymmetric(&cm, &o, &both, &err) != 0)
            fail_msg("cluster %d: %s", i, err.message);
        enumeration e = {.cm = &cm, .o = &o, .node_count = c.node_count,
                         .gpus = cluster_gpu_count(&c), .best = INFINITY};
        bool placed[MAX_NODES] = {false};
        permutations(&e, 0, placed);
        if (e.best != both.asymmetric_best_score_s)
            fail_msg("cluster %d (%s): the search's best surrogate %.17g, "
                     "the enumeration's %.17g", i, text,
                     both.asymmetric_best_score_s, e.best);
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
        search_result_free(&symmetric);
        search_result_free(&both);
        costmodel_close(&cm);
        cluster_free(&c);
    }
    print_message("%d clusters, %d with a plan, %d of them best with stages "
                  "of their own degrees\n", CLUSTERS, with_plans,
                  asymmetric_best);
    assert_true(with_plans >= CLUSTERS / 2);
}

/* Above its bounds it refuses, naming the cluster and the bound. */
static void test_refuses_large_clusters(void **state)
{
    (void)state;
    model_shape m;
    cluster c;
    load_inputs("gpt-13b", "mixed-96", &m, &c);
    char profiles[PT_PATH_MAX];
    costmodel cm;
    pt_error err = {{0}};
    if (costmodel_open(&cm, &m, &c, profile_root(profiles, sizeof profiles),
                       &err) != 0)
        fail_msg("%s", err.message);
    search_options o;
    search_options_default(&o);
    search_result result;
    assert_int_equal(planner_search_asymmetric(&cm, &o, &result, &err), -1);
    assert_non_null(strstr(err.message, "--asymmetric: cluster mixed-96 "
                                        "has 96 GPUs on 12 nodes in 369600 "
                                        "distinct orders"));
    costmodel_close(&cm);
    cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_enumeration),
        cmocka_unit_test(test_refuses_large_clusters),
    };
    return cmocka_run_group_tests_name("asymmetric_search", tests, NULL,
                                       NULL);
}
