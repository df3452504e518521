/*
 * The profiler's measurement in several processes (profiler/processes.c):
 * results combined as the mean of each entry over the processes (a
 * closed form on made-up results), points some process lacks left out,
 * a whole measurement of a tiny model in three child processes on the
 * cpu backend, and a child's error reported by the parent.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "profiler/profiler.h"

/* A made-up point: every entry `seconds` (the head's backward twice),
 * spread `spread`, 5 runs each. */
static profiled_point made_point(int tp, int mbs, double seconds,
                                 double spread)
{
    timing_summary s = {.median_s = seconds, .spread = spread, .runs = 5};
    timing_summary twice = {.median_s = 2 * seconds, .spread = spread,
                            .runs = 5};
    profiled_point p = {.tp = tp, .mbs = mbs,
                        .embedding = {s, s}, .layer = {s, s},
                        .head = {s, twice},
                        .calls_per_round = {7, 8, 9},
                        .layers_stacked = 8};
    for (int part = 0; part < 3; part++)
        p.timed[part] = PROFILER_TIMING_GATED;
    return p;
}

/* Three results: points (1,1) and (2,1) in all, (1,2) in the first two;
 * entries 1, 2 and 6 us; the third process fell back to the host clock
 * for (2,1)'s layer. */
static profiler_result *made_results(void)
{
    profiler_result *r = test_calloc(3, sizeof *r);
    const double seconds[3] = {1e-6, 2e-6, 6e-6};
    for (int i = 0; i < 3; i++) {
        r[i].points[r[i].point_count++] =
            made_point(1, 1, seconds[i], 0.01 * (i + 1));
        if (i < 2)
            r[i].points[r[i].point_count++] =
                made_point(1, 2, seconds[i], 0.0);
        r[i].points[r[i].point_count++] = made_point(2, 1, seconds[i], 0.0);
        r[i].optimizer_layer = (timing_summary){.median_s = seconds[i],
                                                .runs = 3};
        r[i].optimizer_s_per_param = seconds[i] * 1e-6;
        r[i].elapsed_s = 10.0 * (i + 1);
        snprintf(r[i].device.name, sizeof r[i].device.name, "gpu %d", i);
    }
    r[2].points[1].timed[1] = PROFILER_TIMING_HOST;
    r[1].points[2].layers_stacked = 4; /* (2,1): a stack cut there */
    return r;
}

static void test_entries_are_means_over_processes(void **state)
{
    (void)state;
    profiler_result *r = made_results();
    profiler_result *out = test_calloc(1, sizeof *out);
    pt_error err = {{0}};
    assert_int_equal(profiler_results_combine(r, 3, out, &err), 0);
    assert_int_equal(out->point_count, 2);
    const profiled_point *p = &out->points[0];
    assert_int_equal(p->tp, 1);
    assert_int_equal(p->mbs, 1);
    /* (1 + 2 + 6) / 3 = 3 us, the head's backward twice that */
    assert_float_equal(p->embedding.forward.median_s, 3e-6, 1e-15);
    assert_float_equal(p->layer.backward.median_s, 3e-6, 1e-15);
    assert_float_equal(p->head.backward.median_s, 6e-6, 1e-15);
    assert_float_equal(p->layer.forward.spread, 0.03, 1e-12); /* largest */
    assert_int_equal(p->layer.forward.runs, 15);
    assert_int_equal(p->calls_per_round[2], 9);
    assert_int_equal(p->timed[1], PROFILER_TIMING_GATED);
    /* (2,1) kept its place after the point left out, host-marked */
    assert_int_equal(out->points[1].tp, 2);
    assert_int_equal(out->points[1].timed[1], PROFILER_TIMING_HOST);
    /* the layers stacked: the fewest of the processes' */
    assert_int_equal(p->layers_stacked, 8);
    assert_int_equal(out->points[1].layers_stacked, 4);
    assert_int_equal(out->points[1].timed[0], PROFILER_TIMING_GATED);
    assert_int_equal(out->note_count, 1);
    assert_string_equal(out->notes[0], "tp 1, micro-batch 2: measured in "
                                       "2 of 3 processes, left out");
    assert_float_equal(out->optimizer_layer.median_s, 3e-6, 1e-15);
    assert_float_equal(out->optimizer_s_per_param, 3e-12, 1e-21);
    assert_float_equal(out->elapsed_s, 60.0, 1e-12);
    assert_string_equal(out->device.name, "gpu 0");
    /* in place, into the first result, the same */
    assert_int_equal(profiler_results_combine(r, 3, &r[0], &err), 0);
    assert_int_equal(memcmp(&r[0], out, sizeof *out), 0);
    test_free(out);
    test_free(r);
}

static void test_one_result_is_itself(void **state)
{
    (void)state;
    profiler_result *r = made_results();
    profiler_result *out = test_calloc(1, sizeof *out);
    pt_error err = {{0}};
    assert_int_equal(profiler_results_combine(r, 1, out, &err), 0);
    assert_int_equal(out->point_count, 3);
    assert_float_equal(out->points[2].head.backward.median_s, 2e-6, 0.0);
    assert_int_equal(out->note_count, 0);
    assert_int_equal(profiler_results_combine(r, 0, out, &err), -1);
    assert_non_null(strstr(err.message, "0 results to combine"));
    /* no point in all of them */
    r[1].point_count = 0;
    assert_int_equal(profiler_results_combine(r, 2, out, &err), -1);
    assert_non_null(strstr(err.message, "no point was measured in all 2"));
    test_free(out);
    test_free(r);
}

typedef struct progress_log {
    int processes_announced;
    int points;
} progress_log;

static void record_progress(int done, int total, const char *label,
                            const profiled_point *point, void *data)
{
    (void)done, (void)total;
    progress_log *log = data;
    if (strncmp(label, "process ", 8) == 0)
        log->processes_announced++;
    if (point != NULL)
        log->points++;
}

/* Three children measure a tiny GPT one after the other; the parent
 * announces each, and the result holds every point once. The children's
 * own progress goes to their copy of the log, so this one counts none of
 * their points. */
static void test_tiny_model_in_three_processes(void **state)
{
    (void)state;
    progress_log log = {0};
    profiler_options options = profiler_options_defaults(BACKEND_CPU);
    assert_int_equal(options.processes, 1); /* the cpu's default */
    profiler_options_quick(&options);
    options.processes = 3;
    options.tp_count = 2;
    memcpy(options.tp_values, (int[]){1, 2}, 2 * sizeof(int));
    options.mbs_count = 2;
    memcpy(options.mbs_values, (int[]){1, 2}, 2 * sizeof(int));
    options.progress = record_progress;
    options.progress_data = &log;
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 32,
                         .heads = 4, .ffn_hidden = 128, .seq = 16,
                         .vocab = 100, .tied_embeddings = true};
    profiler_result *result = test_calloc(1, sizeof *result);
    pt_error err = {{0}};
    if (profiler_measure_processes(&shape, &options, result, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(result->point_count, 4);
    for (int i = 0; i < 4; i++) {
        assert_true(result->points[i].layer.forward.median_s > 0.0);
        assert_int_equal(result->points[i].layer.forward.runs, 3 * 3);
    }
    assert_true(result->optimizer_s_per_param > 0.0);
    assert_int_equal(log.processes_announced, 3);
    assert_int_equal(log.points, 0);
    /* a bad option is refused before any process starts */
    options.processes = PROFILER_MAX_PROCESSES + 1;
    assert_int_equal(
        profiler_measure_processes(&shape, &options, result, &err), -1);
    assert_non_null(strstr(err.message, "processes; expected 1 to 16"));
    assert_int_equal(log.processes_announced, 3);
    /* a child's own error comes back through the pipe: no tp of the list
     * divides 3 heads, so the first child measures nothing */
    options.processes = 2;
    shape.heads = 3;
    shape.hidden = 48;
    memcpy(options.tp_values, (int[]){2, 4}, 2 * sizeof(int));
    assert_int_equal(
        profiler_measure_processes(&shape, &options, result, &err), -1);
    assert_non_null(strstr(err.message, "nothing could be measured"));
    assert_int_equal(log.processes_announced, 4);
    test_free(result);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries_are_means_over_processes),
        cmocka_unit_test(test_one_result_is_itself),
        cmocka_unit_test(test_tiny_model_in_three_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
