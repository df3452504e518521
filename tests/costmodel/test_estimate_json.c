/* The "estimate" section of plan.json: the stage table with rank ranges,
 * the timeline once per stage (column-wise, grouped by kind) holding
 * exactly the estimate's events, and per rank only when asked. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "fixtures.h"

/* GPT-2 XL, tp 1, dp 4, pp 4 on one A100 node and three A10 nodes: 16
 * ranks, 4 a stage, 16 micro-batches per replica. */
static void estimate_plan(fixture *f, parallel_config *config, estimate *e)
{
    model_shape m = gpt2_xl();
    assert_int_equal(fixture_open(f, &m, 1, 3), 0);
    *config = (parallel_config){.gbs = 64, .mbs = 1, .tp = 1, .dp = 4,
                                .pp = 4};
    int order[4] = {1, 2, 3, 0}, partition[4] = {10, 13, 13, 12};
    pt_error err = {{0}};
    if (costmodel_estimate(&f->cm, config, order, 4, partition, true, e,
                           &err) != 0)
        fail_msg("%s", err.message);
}

/* estimate_plan, then its JSON (per stage or per rank). */
static json_t *estimate_plan_json(fixture *f, parallel_config *config,
                                  estimate *e, bool per_rank)
{
    estimate_plan(f, config, e);
    pt_error err = {{0}};
    json_t *obj = estimate_to_json(e, config, per_rank, &err);
    if (obj == NULL)
        fail_msg("%s", err.message);
    return obj;
}

static long long range_value(const json_t *lane, int index)
{
    return json_integer_value(
        json_array_get(json_object_get(lane, "ranks"), (size_t)index));
}

/* Counts a lane's events; each kind's three columns have one length. */
static int lane_event_count(const json_t *lane)
{
    const json_t *events = json_object_get(lane, "events");
    assert_true(json_is_object(events));
    const char *kind;
    const json_t *columns;
    int count = 0;
    json_object_foreach((json_t *)events, kind, columns) {
        assert_true(event_kind_from_name(kind) >= 0);
        size_t n = json_array_size(json_object_get(columns, "microbatch"));
        assert_true(n > 0);
        assert_int_equal(json_array_size(json_object_get(columns,
                                                         "start_s")), n);
        assert_int_equal(json_array_size(json_object_get(columns, "end_s")),
                         n);
        count += (int)n;
    }
    return count;
}

static void timeline_is_written_once_per_stage(void **state)
{
    (void)state;
    fixture f;
    parallel_config config;
    estimate e;
    json_t *obj = estimate_plan_json(&f, &config, &e, false);
    assert_true(json_number_value(json_object_get(obj, "step_time_s")) ==
                e.step_time_s);
    const json_t *stages = json_object_get(obj, "stages");
    assert_int_equal(json_array_size(stages), 4);
    assert_int_equal(range_value(json_array_get(stages, 2), 0), 8);
    assert_int_equal(range_value(json_array_get(stages, 2), 1), 11);
    /* the memory terms, keyed by name, sum to the stage's peak */
    for (size_t s = 0; s < 4; s++) {
        const json_t *stage = json_array_get(stages, s);
        const json_t *terms = json_object_get(stage, "memory_terms_gib");
        assert_int_equal(json_object_size(terms), PT_MEMORY_TERM_COUNT);
        double sum = 0.0;
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            sum += json_number_value(
                json_object_get(terms, pt_memory_term_name(t)));
        double peak =
            json_number_value(json_object_get(stage, "peak_memory_gib"));
        assert_true(fabs(sum - peak) <= 1e-9 * peak);
    }

    const json_t *timeline = json_object_get(obj, "timeline");
    assert_int_equal(json_array_size(timeline), 4);
    int total = 0;
    for (int s = 0; s < 4; s++) {
        const json_t *lane = json_array_get(timeline, (size_t)s);
        assert_int_equal(json_integer_value(json_object_get(lane, "stage")),
                         s);
        assert_int_equal(range_value(lane, 0), 4 * s);
        assert_int_equal(range_value(lane, 1), 4 * s + 3);
        total += lane_event_count(lane);
    }
    assert_int_equal(total, e.event_count);
    /* stage 1 (no embedding): 16 fwd 0..15 in order, its first forward
       starts when stage 0's first activation arrived */
    const json_t *fwd = json_object_get(
        json_object_get(json_array_get(timeline, 1), "events"), "fwd");
    const json_t *microbatch = json_object_get(fwd, "microbatch");
    assert_int_equal(json_array_size(microbatch), 16);
    for (size_t i = 0; i < 16; i++)
        assert_int_equal(json_integer_value(json_array_get(microbatch, i)),
                         (long long)i);
    assert_true(json_real_value(json_array_get(
                    json_object_get(fwd, "start_s"), 0)) > 0.0);
    json_decref(obj);
    estimate_free(&e);
    fixture_close(&f);
}

static void per_rank_timeline_only_when_asked(void **state)
{
    (void)state;
    fixture f;
    parallel_config config;
    estimate e;
    json_t *obj = estimate_plan_json(&f, &config, &e, true);
    const json_t *timeline = json_object_get(obj, "timeline");
    assert_int_equal(json_array_size(timeline), 16);
    for (int r = 0; r < 16; r++) {
        const json_t *lane = json_array_get(timeline, (size_t)r);
        assert_int_equal(range_value(lane, 0), r);
        assert_int_equal(range_value(lane, 1), r);
        assert_int_equal(json_integer_value(json_object_get(lane, "stage")),
                         r / 4);
        /* a rank's lane is its stage's */
        assert_true(json_equal(
            json_object_get(lane, "events"),
            json_object_get(json_array_get(timeline, (size_t)(r / 4 * 4)),
                            "events")));
    }
    json_decref(obj);

    /* an estimate made without events has no timeline */
    estimate quiet;
    pt_error err = {{0}};
    int order[4] = {1, 2, 3, 0}, partition[4] = {10, 13, 13, 12};
    assert_int_equal(costmodel_estimate(&f.cm, &config, order, 4, partition,
                                        false, &quiet, &err), 0);
    obj = estimate_to_json(&quiet, &config, true, &err);
    assert_non_null(obj);
    assert_null(json_object_get(obj, "timeline"));
    assert_int_equal(json_array_size(json_object_get(obj, "stages")), 4);
    json_decref(obj);
    estimate_free(&quiet);
    estimate_free(&e);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(timeline_is_written_once_per_stage),
        cmocka_unit_test(per_rank_timeline_only_when_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
