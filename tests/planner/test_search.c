/*
 * planner_search and planner_pareto on the bundled GPT-2 XL and BERT
 * problems: what the ranked plans must satisfy, and that neither the
 * thread count nor the pruning by score floors changes them; when
 * DeepSpeed's levers are searched; that issue 14's mixed-96 case ends
 * exact within its node budget.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "fixtures.h"

/* GPT-2 XL on the FASOP hetero cluster, opened once per test. */
static int open_gpt2_hetero(void **state)
{
    return search_fixture_open(state, "gpt2-xl", "hetero");
}

static search_result run_search(search_fixture *f, const search_options *o)
{
    search_result result;
    pt_error err = {{0}};
    if (planner_search(&f->cm, o, &result, &err) != 0)
        fail_msg("%s", err.message);
    return result;
}

static search_options gpt2_options(int threads)
{
    search_options o;
    search_options_default(&o);
    o.gbs = 64;
    o.keep = 8;
    o.threads = threads;
    return o;
}

static void expect_same_plans(const search_result *a, const search_result *b)
{
    assert_int_equal(a->plan_count, b->plan_count);
    for (int i = 0; i < a->plan_count; i++) {
        const ranked_plan *x = &a->plans[i], *y = &b->plans[i];
        assert_int_equal(x->config.tp, y->config.tp);
        assert_int_equal(x->config.dp, y->config.dp);
        assert_int_equal(x->config.pp, y->config.pp);
        assert_int_equal(x->config.mbs, y->config.mbs);
        assert_int_equal(x->config.recompute, y->config.recompute);
        assert_int_equal(x->config.distributed_optimizer,
                         y->config.distributed_optimizer);
        assert_memory_equal(x->partition, y->partition,
                            (size_t)x->config.pp * sizeof(int));
        assert_memory_equal(x->node_order, y->node_order,
                            (size_t)x->node_count * sizeof(int));
        assert_true(x->step_time_s == y->step_time_s);
    }
}

static void test_plans_are_consistent(void **state)
{
    search_fixture *f = *state;
    search_options o = gpt2_options(1);
    search_result r = run_search(f, &o);
    assert_int_equal(r.plan_count, o.keep);
    assert_true(r.configurations_scored > 0);
    assert_true(r.configurations_feasible > 0);
    assert_true(r.configurations_feasible <= r.configurations_scored);
    double price = 0.0;
    for (int t = 0; t < f->cluster.type_count; t++)
        price += f->cluster.types[t].count * f->cluster.types[t].price_per_hour;
    for (int i = 0; i < r.plan_count; i++) {
        const ranked_plan *p = &r.plans[i];
        if (i > 0)
            assert_true(p->step_time_s >= r.plans[i - 1].step_time_s);
        assert_int_equal(p->config.tp * p->config.dp * p->config.pp,
                         cluster_gpu_count(&f->cluster));
        assert_int_equal(p->config.gbs % (p->config.dp * p->config.mbs), 0);
        int layers = 0;
        for (int s = 0; s < p->config.pp; s++)
            layers += p->partition[s];
        assert_int_equal(layers, f->model.layers);
        int seen[PLANNER_MAX_NODES] = {0};
        assert_int_equal(p->node_count, f->cluster.node_count);
        for (int n = 0; n < p->node_count; n++)
            assert_int_equal(seen[p->node_order[n]]++, 0);
        assert_true(p->step_time_s > 0.0);
        assert_true(fabs(p->tokens_per_s * p->step_time_s -
                         64.0 * f->model.seq) < 1e-6 * 64.0 * f->model.seq);
        assert_true(fabs(p->cost_per_step_usd -
                         p->step_time_s / 3600.0 * price) < 1e-12);
        for (int t = 0; t < f->cluster.type_count; t++) {
            assert_true(p->peak_memory_gib_by_type[t] > 0.0);
            assert_true(p->peak_memory_gib_by_type[t] < 80.0);
        }
        /* the simulator agrees the plan fits and takes that long */
        estimate est;
        pt_error err = {{0}};
        assert_int_equal(costmodel_estimate(&f->cm, &p->config, p->node_order,
                                            p->node_count, p->partition,
                                            false, &est, &err), 0);
        assert_true(est.fits);
        assert_true(est.step_time_s == p->step_time_s);
        estimate_free(&est);
    }
    search_result_free(&r);
}

static void test_threads_do_not_change_plans(void **state)
{
    search_fixture *f = *state;
    search_options one = gpt2_options(1), three = gpt2_options(3);
    search_result a = run_search(f, &one), b = run_search(f, &three);
    expect_same_plans(&a, &b);
    /* and the counts the "scored N configurations" line prints */
    assert_int_equal(a.configurations_scored, b.configurations_scored);
    assert_int_equal(a.configurations_feasible, b.configurations_feasible);
    assert_int_equal(a.configurations_pruned, b.configurations_pruned);
    assert_int_equal(a.tree_nodes, b.tree_nodes);
    search_result_free(&a);
    search_result_free(&b);
}

static void test_pruning_does_not_change_plans(void **state)
{
    search_fixture *f = *state;
    search_options pruned = gpt2_options(2), exhaustive = gpt2_options(2);
    exhaustive.exhaustive = true;
    search_result a = run_search(f, &pruned), b = run_search(f, &exhaustive);
    expect_same_plans(&a, &b);
    assert_true(a.configurations_pruned > 0);
    assert_int_equal(b.configurations_pruned, 0);
    assert_true(b.configurations_scored > a.configurations_scored);
    print_message("hetero: %lld configurations scored exhaustively, %lld "
                  "with pruning (%lld pruned)\n", b.configurations_scored,
                  a.configurations_scored, a.configurations_pruned);
    search_result_free(&a);
    search_result_free(&b);
}

static void test_cost_objective_on_one_cluster(void **state)
{
    /* with every node in use, $ per step is step time times a constant:
       both objectives rank alike */
    search_fixture *f = *state;
    search_options time = gpt2_options(2), cost = gpt2_options(2);
    cost.objective = OBJECTIVE_COST;
    search_result a = run_search(f, &time), b = run_search(f, &cost);
    expect_same_plans(&a, &b);
    search_result_free(&a);
    search_result_free(&b);
}

static void test_ilp_and_greedy_solvers(void **state)
{
    search_fixture *f = *state;
    search_options dp = gpt2_options(2), ilp = gpt2_options(2),
                   greedy = gpt2_options(2);
    ilp.solver = SOLVER_ILP;
    greedy.solver = SOLVER_FASOP_GREEDY;
    dp.exhaustive = ilp.exhaustive = greedy.exhaustive = true;
    search_result a = run_search(f, &dp), b = run_search(f, &ilp),
                  c = run_search(f, &greedy);
    /* same optimal surrogates: same configurations fit and score; the
       best plan may differ only where partitions tie */
    assert_int_equal(a.configurations_scored, b.configurations_scored);
    assert_int_equal(a.configurations_feasible, b.configurations_feasible);
    assert_true(fabs(a.plans[0].step_time_s - b.plans[0].step_time_s) <=
                0.01 * a.plans[0].step_time_s);
    /* the greedy ignores memory: where no partition fits, neither does
       its own, and where one fits its own may not, sending the search to
       the memory levers more often */
    assert_true(c.configurations_scored >= a.configurations_scored);
    assert_true(c.plan_count > 0);
    print_message("best step time: dp %.4f s, ilp %.4f s, greedy %.4f s\n",
                  a.plans[0].step_time_s, b.plans[0].step_time_s,
                  c.plans[0].step_time_s);
    search_result_free(&a);
    search_result_free(&b);
    search_result_free(&c);
}

/* What the progress callback saw. */
typedef struct progress_log {
    int calls;
    long long last_done, total;
    bool went_back;
} progress_log;

static void log_progress(void *context, long long done, long long total,
                         long long scored)
{
    (void)scored;
    progress_log *log = context;
    if (done < log->last_done)
        log->went_back = true;
    log->calls++;
    log->last_done = done;
    log->total = total;
}

static void test_progress(void **state)
{
    search_fixture *f = *state;
    progress_log log = {0, 0, 0, false};
    search_options o = gpt2_options(2);
    o.progress = log_progress;
    o.progress_context = &log;
    search_result r = run_search(f, &o);
    assert_true(log.calls >= 2);
    assert_false(log.went_back);
    assert_true(log.total > 0);
    assert_true(log.last_done == log.total);
    assert_true(log.total <= r.configurations_scored + r.configurations_pruned);
    search_result_free(&r);
}

static void test_rejects_bad_options(void **state)
{
    search_fixture *f = *state;
    search_result r;
    pt_error err = {{0}};
    search_options o = gpt2_options(1);
    o.gbs = 0;
    assert_int_equal(planner_search(&f->cm, &o, &r, &err), -1);
    assert_non_null(strstr(err.message, "gbs"));
    o = gpt2_options(1);
    o.keep = 0;
    assert_int_equal(planner_search(&f->cm, &o, &r, &err), -1);
    o = gpt2_options(-1);
    assert_int_equal(planner_search(&f->cm, &o, &r, &err), -1);
}

static void test_nothing_fits(void **state)
{
    (void)state;
    search_fixture *f = NULL;
    search_fixture_open((void **)&f, "gpt-175b", "fasop-bert");
    search_options o;
    search_options_default(&o);
    o.gbs = 64;
    search_result r = run_search(f, &o);
    assert_int_equal(r.plan_count, 0);
    /* floors see that no task fits memory: nothing is even scored */
    assert_true(r.configurations_pruned > 0);
    assert_int_equal(r.configurations_feasible, 0);
    assert_non_null(strstr(r.no_fit_reason, "GiB"));
    assert_non_null(strstr(r.no_fit_reason, "stage"));
    print_message("gpt-175b on fasop-bert: %s\n", r.no_fit_reason);
    search_result_free(&r);
    void *state_f = f;
    search_fixture_close(&state_f);
}

/* DeepSpeed's levers: left out while plans fit without them, searched
 * beside the others on request (a superset: never a slower best plan),
 * and after a search that found nothing (gpt-175b still finds nothing,
 * and says how close offload came). */
static void test_zero_levers(void **state)
{
    search_fixture *f = *state;
    search_options o = gpt2_options(2);
    /* the tree's plans alone: interleaving is a trial on the shortlist,
     * which a larger search may shortlist differently */
    o.allow_interleave = false;
    search_result plain = run_search(f, &o);
    assert_true(plain.plan_count > 0);
    assert_false(plain.zero_levers_searched);
    for (int i = 0; i < plain.plan_count; i++) {
        assert_true(parallel_zero_stage(&plain.plans[i].config) <= 1);
        assert_false(plain.plans[i].config.offload_optimizer);
    }
    o.zero_levers = ZERO_LEVERS_ALWAYS;
    search_result all = run_search(f, &o);
    assert_true(all.tasks > plain.tasks);
    assert_true(all.plans[0].step_time_s <= plain.plans[0].step_time_s);
    bool deeper = false;
    for (int i = 0; i < all.plan_count; i++)
        deeper = deeper || parallel_zero_stage(&all.plans[i].config) >= 2;
    assert_true(deeper);
    search_result_free(&plain);
    search_result_free(&all);

    search_fixture *big = NULL;
    search_fixture_open((void **)&big, "gpt-175b", "fasop-bert");
    search_options_default(&o);
    o.gbs = 64;
    search_result r = run_search(big, &o);
    assert_int_equal(r.plan_count, 0);
    assert_true(r.zero_levers_searched);
    assert_non_null(strstr(r.no_fit_reason, "optimizer offload"));
    search_result_free(&r);
    o.zero_levers = ZERO_LEVERS_NEVER;
    r = run_search(big, &o);
    assert_false(r.zero_levers_searched);
    assert_null(strstr(r.no_fit_reason, "offload"));
    search_result_free(&r);
    void *state_big = big;
    search_fixture_close(&state_big);
}

static void test_pareto_front(void **state)
{
    (void)state;
    model_shape model;
    cluster pool;
    char profiles[PT_PATH_MAX];
    load_inputs("bert-large", "fasop-bert", &model, &pool);
    search_options o;
    search_options_default(&o);
    o.gbs = 256;
    o.threads = 2;
    pareto_result front;
    pt_error err = {{0}};
    if (planner_pareto(&model, &pool, profile_root(profiles, sizeof profiles),
                       &o, &front, &err) != 0)
        fail_msg("%s", err.message);
    /* 1 A100 node and 3 A10 nodes: 2 x 4 - 1 sub-clusters */
    assert_int_equal(front.subclusters_searched, 7);
    assert_true(front.point_count >= 2);
    for (int i = 0; i < front.point_count; i++) {
        const pareto_point *p = &front.points[i];
        int nodes = 0;
        for (int t = 0; t < pool.type_count; t++) {
            assert_true(p->type_counts[t] >= 0);
            assert_true(p->type_counts[t] <= pool.types[t].count);
            nodes += p->type_counts[t];
        }
        assert_int_equal(p->plan.node_count, nodes);
        if (i > 0) {
            /* faster first; each later point must be cheaper */
            assert_true(p->plan.step_time_s >=
                        front.points[i - 1].plan.step_time_s);
            assert_true(p->plan.cost_per_step_usd <
                        front.points[i - 1].plan.cost_per_step_usd);
        }
    }
    /* the whole pool is the fastest sub-cluster here */
    assert_int_equal(front.points[0].type_counts[0], 1);
    assert_int_equal(front.points[0].type_counts[1], 3);
    pareto_result_free(&front);
    cluster_free(&pool);
}

/* GPT-13B on one node of 8 H200s: the best plan is a pipeline of 2
 * stages of 20 layers whose bubble the interleaved 1F1B shrinks; every
 * plan with tp > 1 uses sequence parallelism unless told not to. */
static void test_schedule_levers(void **state)
{
    search_fixture *f = *state;
    search_options o = gpt2_options(1);
    o.keep = 32;
    search_result with = run_search(f, &o);
    assert_true(with.plan_count > 0);
    const ranked_plan *best = &with.plans[0];
    assert_true(parallel_virtual_stages(&best->config) > 1);
    for (int s = 0; s < best->config.pp; s++)
        assert_int_equal(best->partition[s] % best->config.virtual_stages, 0);
    /* sequence parallelism is tried beside the plain tp (in Partita's
     * executor it saves memory and costs time): both among the 32 */
    bool saw_sp = false, saw_plain_tp = false;
    for (int i = 0; i < with.plan_count; i++) {
        const parallel_config *c = &with.plans[i].config;
        assert_true(!c->sequence_parallel || c->tp > 1);
        saw_sp = saw_sp || c->sequence_parallel;
        saw_plain_tp = saw_plain_tp || (c->tp > 1 && !c->sequence_parallel);
    }
    assert_true(saw_sp && saw_plain_tp);
    o.allow_interleave = false;
    o.allow_sequence_parallel = false;
    search_result without = run_search(f, &o);
    assert_true(without.plan_count > 0);
    for (int i = 0; i < without.plan_count; i++) {
        assert_int_equal(parallel_virtual_stages(&without.plans[i].config),
                         1);
        assert_false(without.plans[i].config.sequence_parallel);
    }
    assert_true(best->step_time_s < without.plans[0].step_time_s);
    search_result_free(&with);
    search_result_free(&without);
}

static int open_gpt13b_h200(void **state)
{
    return search_fixture_open(state, "gpt-13b", "h200x8");
}


/* GPT 13B on mixed-96 (issue 14's case): its best plans leave the RTX
 * 3090 nodes a layer or none, wherever they sit, so hundreds of node
 * orders score within 0.1 % of each other, and what separates them is
 * the per-step work of stages reducing over slow PCIe rings. The search
 * ends exact within a budget of two million tree nodes a task: the floors
 * see that work grow with a stage's layers. (Without that, in 2026-11,
 * it stopped at the default budget's five million, 3.3 % from exact.) */
static void test_mixed96_exact_within_budget(void **state)
{
    (void)state;
    search_fixture *f = NULL;
    search_fixture_open((void **)&f, "gpt-13b", "mixed-96");
    search_options o;
    search_options_default(&o);
    o.gbs = 512;
    o.threads = 2;
    o.max_tree_nodes = SEARCH_DEFAULT_TREE_NODES; /* the command's */
    search_result r = run_search(f, &o);
    print_message("mixed-96: %lld placements scored, %lld pruned, exact "
                  "%d, best %.4f s\n", r.configurations_scored,
                  r.configurations_pruned, r.exact,
                  r.plan_count > 0 ? r.plans[0].step_time_s : 0.0);
    assert_true(r.exact);
    assert_true(r.plan_count > 0);
    assert_int_equal(r.plans[0].config.pp, 12);
    search_result_free(&r);
    void *state_f = f;
    search_fixture_close(&state_f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_plans_are_consistent,
                                        open_gpt2_hetero, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_threads_do_not_change_plans,
                                        open_gpt2_hetero, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_pruning_does_not_change_plans,
                                        open_gpt2_hetero, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_cost_objective_on_one_cluster,
                                        open_gpt2_hetero, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_ilp_and_greedy_solvers,
                                        open_gpt2_hetero, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_progress, open_gpt2_hetero,
                                        search_fixture_close),
        cmocka_unit_test_setup_teardown(test_rejects_bad_options,
                                        open_gpt2_hetero, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_schedule_levers,
                                        open_gpt13b_h200, search_fixture_close),
        cmocka_unit_test(test_nothing_fits),
        cmocka_unit_test_setup_teardown(test_zero_levers, open_gpt2_hetero,
                                        search_fixture_close),
        cmocka_unit_test(test_pareto_front),
        cmocka_unit_test(test_mixed96_exact_within_budget),
    };
    return cmocka_run_group_tests_name("search", tests, NULL, NULL);
}
