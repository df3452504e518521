/*
 * Hand-checked partition problems: each expected partition and surrogate
 * below is worked out in the comment beside it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "planner/planner.h"

typedef int (*solver_fn)(const partition_problem *, int *, double *,
                         pt_error *);

static const solver_fn exact_solvers[] = {
    partition_solve_dp, partition_solve_ilp, partition_solve_brute_force};
static const char *const exact_names[] = {"dp", "ilp", "brute force"};
#define EXACT_SOLVER_COUNT 3

static partition_problem make_problem(int pp, int layers, int microbatches,
                                      const partition_stage *stages)
{
    partition_problem problem = {pp, layers, microbatches, stages};
    return problem;
}

/* Every exact solver finds `value`; the DP also finds `expected` (its tie
 * rule is documented, the others' is not). */
static void expect_exact(const partition_problem *problem, double value,
                         const int *expected)
{
    for (int i = 0; i < EXACT_SOLVER_COUNT; i++) {
        int layers[PT_MAX_STAGES];
        double found = -1.0;
        pt_error err = {{0}};
        int status = exact_solvers[i](problem, layers, &found, &err);
        if (status != 1)
            fail_msg("%s: status %d (%s)", exact_names[i], status,
                     err.message);
        if (fabs(found - value) > 1e-12 * (1.0 + value))
            fail_msg("%s: value %.15g, expected %.15g", exact_names[i],
                     found, value);
        assert_true(fabs(partition_surrogate(problem, layers) - found) <
                    1e-15 * (1.0 + value));
        if (i == 0 && expected != NULL)
            assert_memory_equal(layers, expected,
                                (size_t)problem->pp * sizeof(int));
    }
}

static void expect_infeasible(const partition_problem *problem)
{
    for (int i = 0; i < EXACT_SOLVER_COUNT; i++) {
        int layers[PT_MAX_STAGES];
        double value = 0.0;
        pt_error err = {{0}};
        assert_int_equal(exact_solvers[i](problem, layers, &value, &err), 0);
    }
    int layers[PT_MAX_STAGES];
    assert_int_equal(partition_solve_fasop_greedy(problem, layers, NULL, NULL),
                     0);
}

static void test_homogeneous_even_split(void **state)
{
    (void)state;
    /* 8 layers of 1 s over 4 stages, 4 micro-batches: 2-2-2-2, sum 8 s
       plus 3 x 2 s = 14 s */
    partition_stage stages[4] = {{0, 1, 100}, {0, 1, 100}, {0, 1, 100},
                                 {0, 1, 100}};
    partition_problem problem = make_problem(4, 8, 4, stages);
    int expected[4] = {2, 2, 2, 2};
    expect_exact(&problem, 14.0, expected);
}

static void test_two_speeds_balance(void **state)
{
    (void)state;
    /* per layer 1 s and 2 s, 6 layers, 10 micro-batches. l0 = 4 gives
       (4, 4): 8 + 9 x 4 = 44; l0 = 5 gives (5, 2): 7 + 45 = 52; l0 = 3
       gives (3, 6): 9 + 54 = 63 */
    partition_stage stages[2] = {{0, 1, 100}, {0, 2, 100}};
    partition_problem problem = make_problem(2, 6, 10, stages);
    int expected[2] = {4, 2};
    expect_exact(&problem, 44.0, expected);
}

static void test_one_microbatch_minimises_the_sum(void **state)
{
    (void)state;
    /* m = 1: only the sum counts, every layer goes to the cheaper stage */
    partition_stage stages[2] = {{0.5, 1, 100}, {0.25, 2, 100}};
    partition_problem problem = make_problem(2, 6, 1, stages);
    int expected[2] = {6, 0};
    expect_exact(&problem, 6.75, expected);
}

static void test_one_microbatch_ties_balance(void **state)
{
    (void)state;
    /* m = 1 and equal stages: every partition sums to 4 s; the DP keeps
       the one with the lowest bottleneck, 2-2 (its per-step work, left
       out of the surrogate, is balanced too) */
    partition_stage stages[2] = {{0, 1, 100}, {0, 1, 100}};
    partition_problem problem = make_problem(2, 4, 1, stages);
    int expected[2] = {2, 2};
    expect_exact(&problem, 4.0, expected);
}

static void test_memory_cap_binds(void **state)
{
    (void)state;
    /* as two_speeds_balance with at most 2 layers on stage 0: (2, 8),
       10 + 9 x 8 = 82 */
    partition_stage stages[2] = {{0, 1, 2}, {0, 2, 100}};
    partition_problem problem = make_problem(2, 6, 10, stages);
    int expected[2] = {2, 4};
    expect_exact(&problem, 82.0, expected);
}

static void test_more_stages_than_layers(void **state)
{
    (void)state;
    /* 5 stages of (1 s + 1 s/layer), 2 layers, 3 micro-batches. Two
       one-layer stages: sum 7, max 2 -> 11; one two-layer stage: sum 7,
       max 3 -> 13. Ties go to the last stages. */
    partition_stage stages[5] = {{1, 1, 9}, {1, 1, 9}, {1, 1, 9}, {1, 1, 9},
                                 {1, 1, 9}};
    partition_problem problem = make_problem(5, 2, 3, stages);
    int expected[5] = {0, 0, 0, 1, 1};
    expect_exact(&problem, 11.0, expected);
}

static void test_zero_per_layer_cost(void **state)
{
    (void)state;
    /* stage 0 costs 5 s whatever it holds; stage 1 costs 1 s a layer.
       All on stage 0: (5, 0) -> 5 + 5 = 10; one on stage 1: (5, 1) ->
       6 + 5 = 11 */
    partition_stage stages[2] = {{5, 0, 100}, {0, 1, 100}};
    partition_problem problem = make_problem(2, 4, 2, stages);
    int expected[2] = {4, 0};
    expect_exact(&problem, 10.0, expected);
}

static void test_all_free_layers_tie_to_the_last_stage(void **state)
{
    (void)state;
    partition_stage stages[3] = {{0, 0, 10}, {0, 0, 10}, {0, 0, 10}};
    partition_problem problem = make_problem(3, 4, 8, stages);
    int expected[3] = {0, 0, 4};
    expect_exact(&problem, 0.0, expected);
}

static void test_ties_prefer_late_stages(void **state)
{
    (void)state;
    /* 4 layers of 1 s on 3 stages, 2 micro-batches: every partition with
       bottleneck 2 s costs 4 + 2 = 6; the DP's rule picks 0-2-2 */
    partition_stage stages[3] = {{0, 1, 10}, {0, 1, 10}, {0, 1, 10}};
    partition_problem problem = make_problem(3, 4, 2, stages);
    int expected[3] = {0, 2, 2};
    expect_exact(&problem, 6.0, expected);
}

static void test_no_layers(void **state)
{
    (void)state;
    partition_stage stages[2] = {{1, 1, 0}, {3, 1, 0}};
    partition_problem problem = make_problem(2, 0, 4, stages);
    int expected[2] = {0, 0};
    expect_exact(&problem, 4.0 + 3.0 * 3.0, expected);
}

static void test_infeasible(void **state)
{
    (void)state;
    partition_stage nothing_fits[2] = {{0, 1, -1}, {0, 1, 10}};
    partition_problem problem = make_problem(2, 4, 2, nothing_fits);
    expect_infeasible(&problem);

    partition_stage too_small[3] = {{0, 1, 1}, {0, 1, 2}, {0, 1, 0}};
    problem = make_problem(3, 4, 2, too_small);
    expect_infeasible(&problem);

    /* zero layers still need every stage to fit its fixed memory */
    partition_stage empty_model[2] = {{0, 1, 0}, {0, 1, -1}};
    problem = make_problem(2, 0, 2, empty_model);
    expect_infeasible(&problem);
}

static void test_rejects_bad_problems(void **state)
{
    (void)state;
    partition_stage stages[2] = {{0, 1, 4}, {0, 1, 4}};
    int layers[2];
    pt_error err = {{0}};
    partition_problem problem = make_problem(0, 4, 2, stages);
    assert_int_equal(partition_solve_dp(&problem, layers, NULL, &err), -1);
    assert_non_null(strstr(err.message, "pp"));

    problem = make_problem(2, 4, 0, stages);
    assert_int_equal(partition_solve_ilp(&problem, layers, NULL, &err), -1);
    assert_non_null(strstr(err.message, "micro-batches"));

    partition_stage negative[2] = {{0, -1, 4}, {0, 1, 4}};
    problem = make_problem(2, 4, 2, negative);
    assert_int_equal(partition_solve_fasop_greedy(&problem, layers, NULL,
                                                  &err), -1);
    assert_non_null(strstr(err.message, "stage 0"));

    partition_stage not_finite[2] = {{NAN, 1, 4}, {0, 1, 4}};
    problem = make_problem(2, 4, 2, not_finite);
    assert_int_equal(partition_solve_brute_force(&problem, layers, NULL,
                                                 &err), -1);
    problem = make_problem(2, -1, 2, stages);
    assert_int_equal(partition_solve_dp(&problem, layers, NULL, &err), -1);
    assert_int_equal(partition_solve_dp(NULL, layers, NULL, &err), -1);
}

static void test_greedy_follows_fasop(void **state)
{
    (void)state;
    int layers[4];
    double value = 0.0;
    /* homogeneous: the even split is already balanced */
    partition_stage even[4] = {{0, 1, 100}, {0, 1, 100}, {0, 1, 100},
                               {0, 1, 100}};
    partition_problem problem = make_problem(4, 8, 4, even);
    assert_int_equal(partition_solve_fasop_greedy(&problem, layers, &value,
                                                  NULL), 1);
    int expected_even[4] = {2, 2, 2, 2};
    assert_memory_equal(layers, expected_even, sizeof expected_even);
    assert_true(fabs(value - 14.0) < 1e-12);

    /* 9 layers: the remainder goes to the last stage first: 2-2-2-3.
       The last stage (3 s, above its floor of two layers) gives a layer
       to the first fastest stage: 3-2-2-2, bottleneck still 3 s (a
       plateau, new partition: go on); stage 0 gives one to stage 1:
       2-3-2-2; stage 1 gives one back to stage 0: 3-2-2-2 repeats, so
       that move is undone. Result 2-3-2-2, 9 + 3 x 3 = 18. */
    problem.layers = 9;
    assert_int_equal(partition_solve_fasop_greedy(&problem, layers, &value,
                                                  NULL), 1);
    int expected_nine[4] = {2, 3, 2, 2};
    assert_memory_equal(layers, expected_nine, sizeof expected_nine);
    assert_true(fabs(value - (9.0 + 3.0 * 3.0)) < 1e-12);

    /* a slow last stage at its floor of two layers: the greedy cannot
       move anything, 2-2-2-2 with times (2, 2, 2, 6): 12 + 3 x 6 = 30 */
    partition_stage slow_last[4] = {{0, 1, 100}, {0, 1, 100}, {0, 1, 100},
                                    {0, 3, 100}};
    problem = make_problem(4, 8, 4, slow_last);
    assert_int_equal(partition_solve_fasop_greedy(&problem, layers, &value,
                                                  NULL), 1);
    assert_memory_equal(layers, expected_even, sizeof expected_even);
    assert_true(fabs(value - 30.0) < 1e-12);
    /* the optimum 3-3-2-0 (or a tie): sum 8, max 3 -> 17 */
    double optimum = 0.0;
    assert_int_equal(partition_solve_dp(&problem, layers, &optimum, NULL), 1);
    assert_true(fabs(optimum - 17.0) < 1e-12);

    /* a cap the greedy ignores: its 2-2 result does not fit stage 0 */
    partition_stage capped[2] = {{0, 1, 1}, {0, 1, 100}};
    problem = make_problem(2, 4, 4, capped);
    assert_int_equal(partition_solve_fasop_greedy(&problem, layers, NULL,
                                                  NULL), 0);
    assert_int_equal(partition_solve_dp(&problem, layers, NULL, NULL), 1);
}

static void test_greedy_moves_towards_balance(void **state)
{
    (void)state;
    /* per layer 1 s on stage 0, 2 s on stage 1; 12 layers: start 6-6,
       times (6, 12); moves to 7-5 (7, 10), 8-4 (8, 8), then 9-3 (9, 6)
       raises the bottleneck: undone, 8-4 */
    partition_stage stages[2] = {{0, 1, 100}, {0, 2, 100}};
    partition_problem problem = make_problem(2, 12, 8, stages);
    int layers[2];
    double value = 0.0;
    assert_int_equal(partition_solve_fasop_greedy(&problem, layers, &value,
                                                  NULL), 1);
    assert_int_equal(layers[0], 8);
    assert_int_equal(layers[1], 4);
    assert_true(fabs(value - (16.0 + 7.0 * 8.0)) < 1e-12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_homogeneous_even_split),
        cmocka_unit_test(test_two_speeds_balance),
        cmocka_unit_test(test_one_microbatch_minimises_the_sum),
        cmocka_unit_test(test_one_microbatch_ties_balance),
        cmocka_unit_test(test_memory_cap_binds),
        cmocka_unit_test(test_more_stages_than_layers),
        cmocka_unit_test(test_zero_per_layer_cost),
        cmocka_unit_test(test_all_free_layers_tie_to_the_last_stage),
        cmocka_unit_test(test_ties_prefer_late_stages),
        cmocka_unit_test(test_no_layers),
        cmocka_unit_test(test_infeasible),
        cmocka_unit_test(test_rejects_bad_problems),
        cmocka_unit_test(test_greedy_follows_fasop),
        cmocka_unit_test(test_greedy_moves_towards_balance),
    };
    return cmocka_run_group_tests_name("partition", tests, NULL, NULL);
}
