/*
 * Property test of the partition solvers on random instances (fixed seed):
 * the DP, the GLPK ILP and brute force agree on feasibility and on the
 * optimal surrogate; the FASOP greedy is never better than the DP. Prints
 * how often and by how much the greedy is worse.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "planner/planner.h"

#define INSTANCE_COUNT 2000
#define MAX_PP 8
#define MAX_LAYERS 24
/* brute force only where it stays cheap under the sanitizers */
#define BRUTE_FORCE_LIMIT 60000.0
#define RELATIVE_TOLERANCE 1e-9

/* xorshift64*: a small seeded generator, so every run sees the same
 * instances. */
typedef struct random_source {
    uint64_t state;
} random_source;

static uint64_t next_random(random_source *rng)
{
    rng->state ^= rng->state >> 12;
    rng->state ^= rng->state << 25;
    rng->state ^= rng->state >> 27;
    return rng->state * 2685821657736338717ULL;
}

static double uniform(random_source *rng, double low, double high)
{
    double unit = (double)(next_random(rng) >> 11) / 9007199254740992.0;
    return low + (high - low) * unit;
}

static int uniform_int(random_source *rng, int low, int high)
{
    return low + (int)(next_random(rng) % (uint64_t)(high - low + 1));
}

/* Stage costs of one of three families: independent random stages; two
 * GPU types in a random pattern with embedding, head and send costs (the
 * shape real problems have); small integers that make ties common,
 * zero per-layer costs included. */
static void random_costs(random_source *rng, int family, int pp,
                         partition_stage *stages)
{
    double fast_layer_s = uniform(rng, 1e-3, 5e-3);
    double slow_layer_s = fast_layer_s * uniform(rng, 1.2, 4.0);
    for (int s = 0; s < pp; s++) {
        partition_stage *stage = &stages[s];
        if (family == 0) {
            stage->fixed_s = uniform(rng, 0.0, 0.02);
            stage->per_layer_s = uniform(rng, 1e-4, 0.01);
        } else if (family == 1) {
            bool slow = next_random(rng) & 1;
            stage->per_layer_s = slow ? slow_layer_s : fast_layer_s;
            stage->fixed_s = s < pp - 1 ? uniform(rng, 0.0, 2e-3) : 0.0;
            if (s == 0)
                stage->fixed_s += uniform(rng, 0.0, 5e-3);
            if (s == pp - 1)
                stage->fixed_s += uniform(rng, 0.0, 0.02);
        } else {
            stage->fixed_s = uniform_int(rng, 0, 2) * 1e-3;
            stage->per_layer_s = uniform_int(rng, 0, 2) * 1e-3;
        }
    }
}

/* Mostly loose caps, often binding ones, now and then a stage that fits
 * nothing. */
static void random_caps(random_source *rng, int pp, int layers,
                        partition_stage *stages)
{
    int style = uniform_int(rng, 0, 9);
    for (int s = 0; s < pp; s++) {
        if (style == 0 && uniform_int(rng, 0, pp - 1) == 0)
            stages[s].max_layers = -1;
        else if (style <= 4)
            stages[s].max_layers = uniform_int(rng, 0, layers);
        else
            stages[s].max_layers = layers + uniform_int(rng, 0, 3);
    }
}

static double composition_count(int layers, int pp)
{
    double count = 1.0;
    for (int i = 1; i < pp; i++)
        count = count * (layers + i) / i;
    return count;
}

static bool close_enough(double a, double b)
{
    return fabs(a - b) <= RELATIVE_TOLERANCE * fmax(fabs(a), fabs(b)) + 1e-15;
}

static void check_partition(const partition_problem *problem,
                            const int *layers)
{
    int total = 0;
    for (int s = 0; s < problem->pp; s++) {
        assert_true(layers[s] >= 0);
        assert_true(layers[s] <= problem->stages[s].max_layers);
        total += layers[s];
    }
    assert_int_equal(total, problem->layers);
}

/* What the greedy comparison found over all instances. */
typedef struct greedy_tally {
    int compared;
    int worse;
    int ratio_count;        /* worse ones with a non-zero optimum */
    double worst_ratio;
    double ratio_sum;
} greedy_tally;

static void compare_greedy(const partition_problem *problem, int dp_status,
                           double dp_value, greedy_tally *tally)
{
    int layers[MAX_PP];
    double value = 0.0;
    pt_error err = {{0}};
    int status = partition_solve_fasop_greedy(problem, layers, &value, &err);
    assert_true(status == 0 || status == 1);
    if (dp_status == 0) {
        assert_int_equal(status, 0);
        return;
    }
    if (status == 0)
        return;
    check_partition(problem, layers);
    assert_true(dp_value <= value * (1.0 + RELATIVE_TOLERANCE) + 1e-15);
    tally->compared++;
    if (!close_enough(dp_value, value)) {
        tally->worse++;
        if (dp_value <= 0.0)
            return; /* free optimum: no ratio to speak of */
        double ratio = value / dp_value;
        tally->ratio_count++;
        tally->ratio_sum += ratio;
        if (ratio > tally->worst_ratio)
            tally->worst_ratio = ratio;
    }
}

static void test_solvers_agree(void **state)
{
    (void)state;
    random_source rng = {0x5eed1234abcdULL};
    greedy_tally tally = {0, 0, 0, 1.0, 0.0};
    int brute_forced = 0, feasible = 0, infeasible = 0;
    for (int instance = 0; instance < INSTANCE_COUNT; instance++) {
        partition_stage stages[MAX_PP];
        int pp = uniform_int(&rng, 1, MAX_PP);
        int layers = uniform_int(&rng, 0, MAX_LAYERS);
        int family = uniform_int(&rng, 0, 2);
        random_costs(&rng, family, pp, stages);
        random_caps(&rng, pp, layers, stages);
        partition_problem problem = {pp, layers, uniform_int(&rng, 1, 32),
                                     stages};

        int dp_layers[MAX_PP], ilp_layers[MAX_PP], brute_layers[MAX_PP];
        double dp_value = 0.0, ilp_value = 0.0, brute_value = 0.0;
        pt_error err = {{0}};
        int dp_status = partition_solve_dp(&problem, dp_layers, &dp_value,
                                           &err);
        int ilp_status = partition_solve_ilp(&problem, ilp_layers,
                                             &ilp_value, &err);
        if (dp_status < 0 || ilp_status < 0)
            fail_msg("instance %d: %s", instance, err.message);
        if (dp_status != ilp_status)
            fail_msg("instance %d: dp status %d, ilp status %d", instance,
                     dp_status, ilp_status);
        if (composition_count(layers, pp) <= BRUTE_FORCE_LIMIT) {
            int brute_status = partition_solve_brute_force(
                &problem, brute_layers, &brute_value, &err);
            assert_int_equal(brute_status, dp_status);
            if (dp_status == 1 && !close_enough(dp_value, brute_value))
                fail_msg("instance %d: dp %.17g, brute force %.17g",
                         instance, dp_value, brute_value);
            brute_forced++;
        }
        if (dp_status == 1) {
            check_partition(&problem, dp_layers);
            check_partition(&problem, ilp_layers);
            if (!close_enough(dp_value, ilp_value))
                fail_msg("instance %d: dp %.17g, ilp %.17g", instance,
                         dp_value, ilp_value);
            assert_true(close_enough(partition_surrogate(&problem, dp_layers),
                                     dp_value));
            feasible++;
        } else {
            infeasible++;
        }
        compare_greedy(&problem, dp_status, dp_value, &tally);
    }
    print_message("%d instances: %d feasible, %d infeasible, %d also brute "
                  "forced\n", INSTANCE_COUNT, feasible, infeasible,
                  brute_forced);
    print_message("greedy worse than the optimum in %d of %d compared "
                  "(mean %.2f %%, max %.2f %% higher surrogate)\n",
                  tally.worse, tally.compared,
                  tally.ratio_count
                      ? 100.0 * (tally.ratio_sum / tally.ratio_count - 1.0)
                      : 0.0,
                  100.0 * (tally.worst_ratio - 1.0));
    /* the families must exercise every path */
    assert_true(brute_forced >= INSTANCE_COUNT / 4);
    assert_true(infeasible >= 10);
    assert_true(feasible >= INSTANCE_COUNT / 2);
    assert_true(tally.worse >= 1);
}

/* Larger instances, the size of real searches: DP against ILP only. */
static void test_large_instances_agree_with_ilp(void **state)
{
    (void)state;
    random_source rng = {0xfeedbeefULL};
    for (int instance = 0; instance < 60; instance++) {
        partition_stage stages[48];
        int pp = uniform_int(&rng, 8, 48);
        int layers = uniform_int(&rng, pp / 2, 96);
        random_costs(&rng, instance % 3, pp, stages);
        for (int s = 0; s < pp; s++)
            stages[s].max_layers = uniform_int(&rng, layers / pp,
                                               2 * layers / pp + 4);
        partition_problem problem = {pp, layers, uniform_int(&rng, 1, 64),
                                     stages};
        int dp_layers[48], ilp_layers[48];
        double dp_value = 0.0, ilp_value = 0.0;
        pt_error err = {{0}};
        int dp_status = partition_solve_dp(&problem, dp_layers, &dp_value,
                                           &err);
        int ilp_status = partition_solve_ilp(&problem, ilp_layers,
                                             &ilp_value, &err);
        assert_int_equal(dp_status, ilp_status);
        if (dp_status == 1 && !close_enough(dp_value, ilp_value))
            fail_msg("instance %d (pp %d, %d layers): dp %.17g, ilp %.17g",
                     instance, pp, layers, dp_value, ilp_value);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_solvers_agree),
        cmocka_unit_test(test_large_instances_agree_with_ilp),
    };
    return cmocka_run_group_tests_name("partition_property", tests, NULL,
                                       NULL);
}
