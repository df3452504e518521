/* The arithmetic of the tables: error in %, per-stage means from events,
 * the comparison and the markdown cells built from it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "fixtures.h"

static void error_percent(void **state)
{
    (void)state;
    assert_true(fabs(report_error_percent(11, 10) - 10) < 1e-12);
    assert_true(fabs(report_error_percent(9, 10) + 10) < 1e-12);
    assert_true(fabs(report_error_percent(10, 10)) < 1e-12);
    assert_true(isnan(report_error_percent(1, 0)));
    assert_true(isnan(report_error_percent(1, -2)));
    assert_true(isnan(report_error_percent(1, NAN)));
    assert_true(isnan(report_error_percent(INFINITY, 1)));
    char text[32];
    report_format_error(1.44, text, sizeof text);
    assert_string_equal(text, "+1.4 %");
    report_format_error(-12.6, text, sizeof text);
    assert_string_equal(text, "-13 %");
    report_format_error(NAN, text, sizeof text);
    assert_string_equal(text, "n/a");
}

static void stage_phases_from_events(void **state)
{
    (void)state;
    /* Stage 0 on ranks 0 and 1 (dp 2): two forwards each of 1 and 3 ms,
     * one send per micro-batch, an optimizer of 2 ms on each rank. */
    const timeline_event events[] = {
        {0, 0, 0, EVENT_FWD, 0.000, 0.001},
        {0, 0, 0, EVENT_SEND_FWD, 0.001, 0.0015},
        {1, 0, 0, EVENT_FWD, 0.000, 0.003},
        {1, 0, 0, EVENT_SEND_FWD, 0.003, 0.0035},
        {0, 0, -1, EVENT_OPTIMIZER, 0.010, 0.012},
        {1, 0, -1, EVENT_OPTIMIZER, 0.010, 0.012},
        {2, 1, 0, EVENT_BWD, 0.004, 0.010},
    };
    stage_phases phases[3];
    report_stage_phases(events, 7, 3, phases);
    assert_true(fabs(phases[0].forward_s - 0.002) < 1e-12);
    assert_true(isnan(phases[0].backward_s));
    assert_true(fabs(phases[0].communication_s - 0.0005) < 1e-12);
    assert_true(fabs(phases[0].optimizer_s - 0.002) < 1e-12);
    assert_true(fabs(phases[0].dp_allreduce_s) < 1e-12);
    assert_true(fabs(phases[1].backward_s - 0.006) < 1e-12);
    assert_true(fabs(phases[1].communication_s) < 1e-12);
    assert_true(isnan(phases[2].forward_s)); /* no events: nothing known */
}

static void comparison_and_tables(void **state)
{
    (void)state;
    report_fixture f;
    report_fixture_init(&f);
    /* Measured: stage 0 forward 2.2 ms (estimate 2 ms: -9.1 %), step
     * 10 ms (estimate 9.5 ms: -5.0 %), memory 2.5 and 1 GiB. */
    timeline_event measured[] = {{0, 0, 0, EVENT_FWD, 0.0, 0.0022},
                                 {1, 1, 0, EVENT_FWD, 0.0022, 0.0042}};
    double memory[] = {2.5, 1.0};
    run_iteration iterations[] = {{1, 0.012, 5.0}, {2, 0.010, 4.9}};
    run_record run = {.file = "run.json", .backend = "cpu", .rank_count = 2,
                      .tp = 1, .dp = 1, .pp = 2, .gbs = 4, .mbs = 2,
                      .step_time_s = 0.010, .tokens_per_s = 950,
                      .tflops_per_gpu = 1.5, .events_iteration = 2,
                      .iteration_count = 2, .iterations = iterations,
                      .event_count = 2, .events = measured,
                      .peak_memory_gib = memory};
    pt_error err = {{0}};
    report_comparison cmp;
    assert_int_equal(report_compare(&f.plan, &f.estimate, &run, &cmp, &err),
                     0);
    assert_int_equal(cmp.stage_count, 2);
    assert_int_equal(cmp.rank_count, 2);
    assert_true(fabs(cmp.estimated[0].communication_s - 0.0005) < 1e-12);
    assert_true(fabs(cmp.measured[0].forward_s - 0.0022) < 1e-12);
    assert_true(fabs(cmp.estimated_memory_gib[1] - 2.0) < 1e-12);
    assert_true(fabs(cmp.measured_memory_gib[0] - 2.5) < 1e-12);
    report_comparison_free(&cmp);

    report_input input = {.plan_file = "plan.json", .plan = &f.plan,
                          .estimate = &f.estimate, .run = &run};
    strcpy(f.plan.model.name, "fixture");
    strcpy(f.plan.cluster.name, "fixture-box");
    char *text = report_markdown(&input, false, "gnuplot 'x' not found",
                                 &err);
    assert_non_null(text);
    assert_non_null(strstr(text, "| step time | 9.50 ms | 10.0 ms | -5.0 % |"));
    assert_non_null(strstr(text, "| 0 | H200 | 1 | forward | 2.00 ms | "
                                 "2.20 ms | -9.1 % |"));
    assert_non_null(strstr(text, "| throughput | 1000 tokens/s | "
                                 "950 tokens/s | +5.3 % |"));
    assert_non_null(strstr(text, "Charts are missing: gnuplot 'x' not found"));
    free(text);

    /* Without a run every measured cell is "-" and every error "n/a". */
    input.run = NULL;
    text = report_markdown(&input, true, "", &err);
    assert_non_null(text);
    assert_non_null(strstr(text, "| step time | 9.50 ms | - | n/a |"));
    assert_non_null(strstr(text, "![timeline](timeline.png)"));
    assert_null(strstr(text, "step_time.png"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(error_percent),
        cmocka_unit_test(stage_phases_from_events),
        cmocka_unit_test(comparison_and_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
