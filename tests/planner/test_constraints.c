/*
 * Degrees a user fixes or limits (search_constraints, `partita plan --tp
 * 2,4`): on BERT-large and the FASOP BERT cluster (one A100 node, three
 * A10 nodes), the best plan under a constraint satisfies it and is the
 * best plan of an exhaustive search, unconstrained, among those that
 * satisfy it; the branch and bound under a constraint keeps exactly the
 * exhaustive walk's plans; the Pareto sweep holds to it; and
 * planner_check_constraints names the option at fault when nothing
 * satisfies the constraints.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "fixtures.h"

static int open_bert(void **state)
{
    return search_fixture_open(state, "bert-large", "fasop-bert");
}

/* gbs 256, two threads; every placement kept when keep is large. */
static search_options bert_options(int keep, bool exhaustive)
{
    search_options o;
    search_options_default(&o);
    o.gbs = 256;
    o.keep = keep;
    o.threads = 2;
    o.exhaustive = exhaustive;
    return o;
}

static search_result run_search(search_fixture *f,
                                const search_options *o)
{
    search_result result;
    pt_error err = {{0}};
    if (planner_search(&f->cm, o, &result, &err) != 0)
        fail_msg("%s", err.message);
    return result;
}

static degree_choice choice_of(int count, const int *values)
{
    degree_choice choice = {count, {0}};
    for (int i = 0; i < count; i++)
        choice.values[i] = values[i];
    return choice;
}

static bool satisfies(const search_constraints *c, const ranked_plan *p)
{
    return degree_choice_allows(&c->tp, p->config.tp) &&
           degree_choice_allows(&c->pp, p->config.pp) &&
           degree_choice_allows(&c->dp, p->config.dp) &&
           degree_choice_allows(&c->mbs, p->config.mbs);
}

static void expect_same_plan(const ranked_plan *x, const ranked_plan *y)
{
    assert_int_equal(x->config.tp, y->config.tp);
    assert_int_equal(x->config.dp, y->config.dp);
    assert_int_equal(x->config.pp, y->config.pp);
    assert_int_equal(x->config.mbs, y->config.mbs);
    assert_memory_equal(x->partition, y->partition,
                        (size_t)x->config.pp * sizeof(int));
    assert_memory_equal(x->node_order, y->node_order,
                        (size_t)x->node_count * sizeof(int));
    assert_true(x->step_time_s == y->step_time_s);
}

/* The constraints tried: each degree alone, lists, and two together. */
static search_constraints constraint_case(int which)
{
    search_constraints c;
    memset(&c, 0, sizeof c);
    static const int two[] = {2}, four[] = {4}, one_two[] = {1, 2},
                     two_four[] = {2, 4}, eight[] = {8};
    switch (which) {
    case 0: c.tp = choice_of(1, two); break;
    case 1: c.pp = choice_of(2, two_four); break;
    case 2: c.dp = choice_of(1, four); break;
    case 3: c.mbs = choice_of(2, one_two); break;
    case 4: c.tp = choice_of(1, four); c.pp = choice_of(1, two); break;
    default: c.dp = choice_of(1, eight); c.mbs = choice_of(1, two); break;
    }
    return c;
}

#define CONSTRAINT_CASES 6
/* Enough to keep every placement of the cluster, so that the rankings
 * compared are the simulator's over every placement. */
#define KEEP_ALL 4000

static void test_best_under_constraint_is_best_of_all(void **state)
{
    search_fixture *f = *state;
    search_options all = bert_options(KEEP_ALL, true);
    all.allow_interleave = false;
    search_result every = run_search(f, &all);
    assert_true(every.plan_count < KEEP_ALL);
    for (int k = 0; k < CONSTRAINT_CASES; k++) {
        search_options o = bert_options(KEEP_ALL, false);
        o.allow_interleave = false;
        o.constraints = constraint_case(k);
        search_result r = run_search(f, &o);
        assert_true(r.plan_count > 0);
        for (int i = 0; i < r.plan_count; i++)
            assert_true(satisfies(&o.constraints, &r.plans[i]));
        int first = 0;
        while (first < every.plan_count &&
               !satisfies(&o.constraints, &every.plans[first]))
            first++;
        assert_true(first < every.plan_count);
        expect_same_plan(&r.plans[0], &every.plans[first]);
        print_message("constraint case %d: %d plans, best %.4f s (rank %d "
                      "unconstrained)\n", k, r.plan_count,
                      r.plans[0].step_time_s, first + 1);
        search_result_free(&r);
    }
    search_result_free(&every);
}

/* The branch and bound under a constraint keeps what the exhaustive
 * walk under it keeps. */
static void test_pruning_under_constraint(void **state)
{
    search_fixture *f = *state;
    for (int k = 0; k < CONSTRAINT_CASES; k++) {
        search_options bb = bert_options(8, false);
        search_options walk = bert_options(8, true);
        bb.constraints = walk.constraints = constraint_case(k);
        search_result a = run_search(f, &bb), b = run_search(f, &walk);
        assert_int_equal(a.plan_count, b.plan_count);
        for (int i = 0; i < a.plan_count; i++)
            expect_same_plan(&a.plans[i], &b.plans[i]);
        search_result_free(&a);
        search_result_free(&b);
    }
}

static void test_pareto_under_constraint(void **state)
{
    search_fixture *f = *state;
    search_options o = bert_options(1, false);
    static const int four[] = {4};
    o.constraints.tp = choice_of(1, four);
    pareto_result front;
    pt_error err = {{0}};
    if (planner_pareto(&f->model, &f->cluster, f->profiles, &o, &front,
                       &err) != 0)
        fail_msg("%s", err.message);
    assert_true(front.point_count >= 2);
    for (int i = 0; i < front.point_count; i++)
        assert_int_equal(front.points[i].plan.config.tp, 4);
    pareto_result_free(&front);
}

/* The message of planner_check_constraints, or "" when they pass. */
static const char *check(search_fixture *f, const search_constraints *c,
                         pt_error *err)
{
    search_options o = bert_options(1, false);
    o.constraints = *c;
    err->message[0] = '\0';
    int status = planner_check_constraints(&f->cluster, &f->model, &o, err);
    assert_int_equal(status, err->message[0] ? -1 : 0);
    return err->message;
}

static void expect_refused(const char *message, const char *start)
{
    if (strncmp(message, start, strlen(start)) != 0)
        fail_msg("expected '%s...', got '%s'", start, message);
}

static void test_check_names_the_option(void **state)
{
    search_fixture *f = *state;
    pt_error err;
    search_constraints c;
    memset(&c, 0, sizeof c);
    assert_string_equal(check(f, &c, &err), "");
    c = constraint_case(4);
    assert_string_equal(check(f, &c, &err), "");
    /* tp 16 on nodes of 4 GPUs: at most 8 */
    static const int sixteen[] = {16}, three[] = {3}, eight[] = {8},
                     two[] = {2}, four[] = {4};
    memset(&c, 0, sizeof c);
    c.tp = choice_of(1, sixteen);
    expect_refused(check(f, &c, &err), "--tp 16: no plan with that fills "
                                       "cluster fasop-bert-hetero's 16 GPUs");
    /* pp 3 divides no share of 16 GPUs; named alone beside a good tp */
    c.tp = choice_of(1, two);
    c.pp = choice_of(1, three);
    expect_refused(check(f, &c, &err), "--pp 3: no plan with that");
    /* each fine alone, not together: 8 x 4 x 2 is not 16 */
    memset(&c, 0, sizeof c);
    c.tp = choice_of(1, eight);
    c.pp = choice_of(1, two);
    c.dp = choice_of(1, four);
    expect_refused(check(f, &c, &err), "--tp 8 --pp 2 --dp 4: no plan with "
                                       "these together");
    /* gbs 256 is no multiple of dp 16 x mbs 32 */
    memset(&c, 0, sizeof c);
    static const int thirty_two[] = {32};
    c.mbs = choice_of(1, thirty_two);
    c.dp = choice_of(1, sixteen);
    expect_refused(check(f, &c, &err), "--dp 16 --mbs 32: no plan with "
                                       "these together");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_best_under_constraint_is_best_of_all, open_bert,
            search_fixture_close),
        cmocka_unit_test_setup_teardown(test_pruning_under_constraint,
                                        open_bert, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_pareto_under_constraint,
                                        open_bert, search_fixture_close),
        cmocka_unit_test_setup_teardown(test_check_names_the_option,
                                        open_bert, search_fixture_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
