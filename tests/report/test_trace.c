/* The Chrome trace: valid JSON with the fields Perfetto reads, one process
 * per stage (or per rank when asked), estimated and measured tracks,
 * times in microseconds. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "fixtures.h"

/* Counts the events of a trace with the given phase and tid (-1: any). */
static int count_events(const json_t *trace, const char *ph, int tid)
{
    const json_t *events = json_object_get(trace, "traceEvents");
    size_t i;
    const json_t *event;
    int count = 0;
    json_array_foreach(events, i, event) {
        if (strcmp(json_string_value(json_object_get(event, "ph")), ph) != 0)
            continue;
        if (tid < 0 ||
            json_integer_value(json_object_get(event, "tid")) == tid)
            count++;
    }
    return count;
}

static const json_t *find_event(const json_t *trace, const char *name,
                                int tid)
{
    const json_t *events = json_object_get(trace, "traceEvents");
    size_t i;
    const json_t *event;
    json_array_foreach(events, i, event) {
        const char *event_name =
            json_string_value(json_object_get(event, "name"));
        if (event_name && strcmp(event_name, name) == 0 &&
            json_integer_value(json_object_get(event, "tid")) == tid)
            return event;
    }
    return NULL;
}

static void estimated_only_trace(void **state)
{
    (void)state;
    report_fixture f;
    report_fixture_init(&f);
    pt_error err = {{0}};
    json_t *trace = report_trace_json(&f.plan, &f.estimate, NULL, false,
                                      &err);
    assert_non_null(trace);
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_ESTIMATED), 5);
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_MEASURED), 0);
    /* The backward of micro-batch 0 on stage 1 starts at 4.5 ms. */
    const json_t *fwd = find_event(trace, "fwd 0", REPORT_TRACE_TID_ESTIMATED);
    assert_non_null(fwd);
    assert_true(fabs(json_number_value(json_object_get(fwd, "ts"))) < 1e-6);
    const json_t *bwd = find_event(trace, "bwd 0", REPORT_TRACE_TID_ESTIMATED);
    assert_non_null(bwd);
    assert_true(fabs(json_number_value(json_object_get(bwd, "ts")) - 4500) <
                1e-6);
    assert_true(fabs(json_number_value(json_object_get(bwd, "dur")) - 4000) <
                1e-6);
    assert_int_equal(json_integer_value(json_object_get(bwd, "pid")), 1);
    const json_t *opt = find_event(trace, "optimizer",
                                   REPORT_TRACE_TID_ESTIMATED);
    assert_non_null(opt);
    /* Metadata: a name for both processes, one thread name each. */
    assert_int_equal(count_events(trace, "M", REPORT_TRACE_TID_ESTIMATED), 4);
    json_decref(trace);
}

static void measured_track_and_round_trip(void **state)
{
    (void)state;
    report_fixture f;
    report_fixture_init(&f);
    timeline_event measured[] = {{0, 0, 0, EVENT_FWD, 0.0001, 0.0031},
                                 {1, 1, 0, EVENT_BWD, 0.004, 0.009}};
    run_record run = {.rank_count = 2, .event_count = 2, .events = measured};
    pt_error err = {{0}};
    json_t *trace = report_trace_json(&f.plan, &f.estimate, &run, false,
                                      &err);
    assert_non_null(trace);
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_MEASURED), 2);
    const json_t *fwd = find_event(trace, "fwd 0", REPORT_TRACE_TID_MEASURED);
    assert_non_null(fwd);
    assert_true(fabs(json_number_value(json_object_get(fwd, "ts")) - 100) <
                1e-6);
    assert_true(fabs(json_number_value(json_object_get(fwd, "dur")) - 3000) <
                1e-6);
    /* Thread names "estimated" and "measured" on each of the two ranks. */
    const json_t *events = json_object_get(trace, "traceEvents");
    size_t i;
    const json_t *event;
    int measured_names = 0, process_names = 0;
    json_array_foreach(events, i, event) {
        const char *name = json_string_value(json_object_get(event, "name"));
        const json_t *args = json_object_get(event, "args");
        const char *arg_name =
            json_string_value(json_object_get(args, "name"));
        if (strcmp(name, "thread_name") == 0 && arg_name &&
            strcmp(arg_name, "measured") == 0)
            measured_names++;
        if (strcmp(name, "process_name") == 0)
            process_names++;
    }
    assert_int_equal(measured_names, 2);
    assert_int_equal(process_names, 2);
    /* What report_write serialises parses back as the same document. */
    char *text = json_dumps(trace, JSON_COMPACT | JSON_REAL_PRECISION(12));
    assert_non_null(text);
    json_error_t json_err;
    json_t *again = json_loads(text, 0, &json_err);
    assert_non_null(again);
    assert_int_equal(json_array_size(json_object_get(again, "traceEvents")),
                     json_array_size(json_object_get(trace, "traceEvents")));
    json_decref(again);
    free(text);
    json_decref(trace);
}

/* Every event carries the fields Perfetto's JSON importer reads. */
static void assert_perfetto_fields(const json_t *trace)
{
    assert_string_equal(
        json_string_value(json_object_get(trace, "displayTimeUnit")), "ms");
    const json_t *events = json_object_get(trace, "traceEvents");
    assert_true(json_is_array(events));
    size_t i;
    const json_t *event;
    json_array_foreach(events, i, event) {
        const char *ph = json_string_value(json_object_get(event, "ph"));
        assert_non_null(ph);
        assert_true(json_is_string(json_object_get(event, "name")));
        assert_true(json_is_integer(json_object_get(event, "pid")));
        assert_true(json_is_integer(json_object_get(event, "tid")));
        if (strcmp(ph, "X") == 0) {
            assert_true(json_is_number(json_object_get(event, "ts")));
            assert_true(json_number_value(json_object_get(event, "dur")) >=
                        0);
        } else {
            assert_string_equal(ph, "M");
            assert_true(json_is_object(json_object_get(event, "args")));
        }
    }
}

/* Counts metadata events `name` whose args.name is arg_name. */
static int count_named(const json_t *trace, const char *name,
                       const char *arg_name)
{
    const json_t *events = json_object_get(trace, "traceEvents");
    size_t i;
    const json_t *event;
    int count = 0;
    json_array_foreach(events, i, event) {
        const char *event_name =
            json_string_value(json_object_get(event, "name"));
        const char *value = json_string_value(
            json_object_get(json_object_get(event, "args"), "name"));
        if (strcmp(event_name, name) == 0 &&
            (arg_name == NULL || (value && strcmp(value, arg_name) == 0)))
            count++;
    }
    return count;
}

/* dp 2: two ranks a stage. Per stage the estimate appears once and the
 * measured track shows the stage's first rank; per rank every rank gets
 * its stage's estimate and its own measurement. */
static void stage_lanes_and_rank_lanes(void **state)
{
    (void)state;
    report_fixture f;
    report_fixture_init(&f);
    f.plan.config.dp = 2;
    timeline_event measured[] = {{1, 0, 0, EVENT_FWD, 0.0, 0.003},
                                 {0, 0, 0, EVENT_FWD, 0.0, 0.002},
                                 {3, 1, 0, EVENT_BWD, 0.004, 0.009},
                                 {2, 1, 0, EVENT_BWD, 0.004, 0.008}};
    run_record run = {.rank_count = 4, .event_count = 4, .events = measured};
    assert_int_equal(report_stage_measured_rank(&f.plan, &run, 0), 0);
    assert_int_equal(report_stage_measured_rank(&f.plan, &run, 1), 2);
    assert_int_equal(report_stage_measured_rank(&f.plan, NULL, 1), -1);
    pt_error err = {{0}};

    json_t *trace = report_trace_json(&f.plan, &f.estimate, &run, false,
                                      &err);
    assert_non_null(trace);
    assert_perfetto_fields(trace);
    assert_int_equal(count_named(trace, "process_name", NULL), 2);
    assert_int_equal(count_named(trace, "process_name",
                                 "stage 1 (ranks 2-3, H200)"), 1);
    assert_int_equal(count_named(trace, "thread_name", "measured (rank 2)"),
                     1);
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_ESTIMATED), 5);
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_MEASURED), 2);
    const json_t *bwd = find_event(trace, "bwd 0", REPORT_TRACE_TID_MEASURED);
    assert_true(fabs(json_number_value(json_object_get(bwd, "dur")) - 4000) <
                1e-6);
    json_decref(trace);

    trace = report_trace_json(&f.plan, &f.estimate, &run, true, &err);
    assert_non_null(trace);
    assert_perfetto_fields(trace);
    assert_int_equal(count_named(trace, "process_name", NULL), 4);
    assert_int_equal(count_named(trace, "process_name",
                                 "rank 3 (stage 1, H200)"), 1);
    assert_int_equal(count_named(trace, "thread_name", "measured"), 4);
    /* stage 0's 2 events on ranks 0 and 1, stage 1's 3 on ranks 2 and 3 */
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_ESTIMATED),
                     10);
    assert_int_equal(count_events(trace, "X", REPORT_TRACE_TID_MEASURED), 4);
    json_decref(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(estimated_only_trace),
        cmocka_unit_test(measured_track_and_round_trip),
        cmocka_unit_test(stage_lanes_and_rank_lanes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
