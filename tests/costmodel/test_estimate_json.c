/* The "estimate" section of plan.json: the stage table with rank ranges,
 * the timeline once per stage (column-wise, grouped by kind) holding
 * exactly the estimate's events, and per rank only when asked; by default
 * each kind's first and last 8 events with a count of those between, so
 * that a plan of 4,096 GPUs stays under 1 MB whatever its batch. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

/* GPT-2 XL, tp 1, dp 4, pp 4 on one A100 node and three A10 nodes: 16
 * ranks, 4 a stage, 16 micro-batches per replica. */
static void estimate_plan_gbs(fixture *f, parallel_config *config,
                              estimate *e, int gbs)
{
    model_shape m = gpt2_xl();
    assert_int_equal(fixture_open(f, &m, 1, 3), 0);
    *config = (parallel_config){.gbs = gbs, .mbs = 1, .tp = 1, .dp = 4,
                                .pp = 4};
    int order[4] = {1, 2, 3, 0}, partition[4] = {10, 13, 13, 12};
    pt_error err = {{0}};
    if (costmodel_estimate(&f->cm, config, order, 4, partition, true, e,
                           &err) != 0)
        fail_msg("%s", err.message);
}

static void estimate_plan(fixture *f, parallel_config *config, estimate *e)
{
    estimate_plan_gbs(f, config, e, 64);
}

/* estimate_plan, then its JSON (per stage or per rank). */
static json_t *estimate_plan_json(fixture *f, parallel_config *config,
                                  estimate *e, bool per_rank)
{
    estimate_plan(f, config, e);
    pt_error err = {{0}};
    json_t *obj = estimate_to_json(e, config,
                                   per_rank ? ESTIMATE_JSON_PER_RANK : 0,
                                   &err);
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
    obj = estimate_to_json(&quiet, &config, ESTIMATE_JSON_PER_RANK, &err);
    assert_non_null(obj);
    assert_null(json_object_get(obj, "timeline"));
    assert_int_equal(json_array_size(json_object_get(obj, "stages")), 4);
    json_decref(obj);
    estimate_free(&quiet);
    estimate_free(&e);
    fixture_close(&f);
}

/* Whether the compact column is the full one's first and last 8. */
static void assert_ends_kept(const json_t *compact, const json_t *full)
{
    size_t n = json_array_size(full), kept = json_array_size(compact);
    assert_int_equal(kept, n > 16 ? 16 : n);
    for (size_t i = 0; i < kept; i++) {
        size_t from = i < 8 ? i : n - (kept - i);
        assert_true(json_equal(json_array_get(compact, i),
                               json_array_get(full, from)));
    }
}

static void compact_timeline_keeps_both_ends(void **state)
{
    (void)state;
    fixture f;
    parallel_config config;
    estimate e;
    estimate_plan_gbs(&f, &config, &e, 256); /* 64 micro-batches */
    pt_error err = {{0}};
    json_t *compact = estimate_to_json(&e, &config, 0, &err);
    json_t *full = estimate_to_json(&e, &config, ESTIMATE_JSON_FULL_TIMELINE,
                                    &err);
    assert_non_null(compact);
    assert_non_null(full);
    int kept = 0, elided = 0, all = 0, elided_kinds = 0;
    for (size_t s = 0; s < 4; s++) {
        json_t *a = json_object_get(json_array_get(
                        json_object_get(compact, "timeline"), s), "events");
        json_t *b = json_object_get(json_array_get(
                        json_object_get(full, "timeline"), s), "events");
        assert_int_equal(json_object_size(a), json_object_size(b));
        kept += lane_event_count(json_array_get(
            json_object_get(compact, "timeline"), s));
        all += lane_event_count(json_array_get(
            json_object_get(full, "timeline"), s));
        const char *kind;
        json_t *columns;
        json_object_foreach(a, kind, columns) {
            const json_t *whole = json_object_get(b, kind);
            assert_null(json_object_get(whole, "elided"));
            const char *names[] = {"microbatch", "start_s", "end_s"};
            for (int c = 0; c < 3; c++)
                assert_ends_kept(json_object_get(columns, names[c]),
                                 json_object_get(whole, names[c]));
            const json_t *gap = json_object_get(columns, "elided");
            size_t n = json_array_size(json_object_get(whole, "microbatch"));
            if (n <= 16) {
                assert_null(gap);
                continue;
            }
            elided_kinds++;
            assert_int_equal(json_integer_value(json_object_get(gap, "after")),
                             8);
            elided += (int)json_integer_value(json_object_get(gap, "count"));
        }
    }
    assert_true(elided_kinds >= 4 * 4); /* fwd, bwd and sends a stage */
    assert_int_equal(all, e.event_count);
    assert_int_equal(kept + elided, e.event_count);
    json_decref(compact);
    json_decref(full);
    estimate_free(&e);
    fixture_close(&f);
}

/* A timeline as large as the planner makes: 4,096 GPUs (tp 8, dp 4,
 * pp 128), 512 micro-batches a replica (more change nothing compact),
 * six kinds of event a micro-batch. The compact section stays far under
 * 1 MB; the full one would not. */
static void synthetic_large_timeline_stays_small(void **state)
{
    (void)state;
    enum { PP = 128, MICROBATCHES = 512, KINDS = 6 };
    parallel_config config = {.gbs = 4 * MICROBATCHES, .mbs = 1, .tp = 8,
                              .dp = 4, .pp = PP};
    estimate e = {.step_time_s = 10.0, .stage_count = PP,
                  .event_count = PP * MICROBATCHES * KINDS};
    e.stages = calloc(PP, sizeof *e.stages);
    e.events = calloc((size_t)e.event_count, sizeof *e.events);
    assert_non_null(e.stages);
    assert_non_null(e.events);
    const event_kind kinds[KINDS] = {EVENT_FWD, EVENT_BWD, EVENT_SEND_FWD,
                                     EVENT_RECV_FWD, EVENT_SEND_BWD,
                                     EVENT_RECV_BWD};
    int next = 0;
    for (int s = 0; s < PP; s++)
        for (int m = 0; m < MICROBATCHES; m++)
            for (int k = 0; k < KINDS; k++)
                e.events[next++] = (timeline_event){
                    .rank = -1, .stage = s, .microbatch = m,
                    .kind = kinds[k], .start_s = 0.001 * (m + s) + 1e-4 * k,
                    .end_s = 0.001 * (m + s) + 1e-4 * (k + 1)};
    pt_error err = {{0}};
    json_t *compact = estimate_to_json(&e, &config, 0, &err);
    assert_non_null(compact);
    char *text = json_format_text(compact);
    assert_non_null(text);
    assert_true(strlen(text) < 600 * 1024);
    free(text);
    json_decref(compact);
    json_t *full = estimate_to_json(&e, &config, ESTIMATE_JSON_FULL_TIMELINE,
                                    &err);
    text = json_format_text(full);
    assert_non_null(text);
    assert_true(strlen(text) > 1024 * 1024);
    free(text);
    json_decref(full);
    free(e.stages);
    free(e.events);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(timeline_is_written_once_per_stage),
        cmocka_unit_test(per_rank_timeline_only_when_asked),
        cmocka_unit_test(compact_timeline_keeps_both_ends),
        cmocka_unit_test(synthetic_large_timeline_stays_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
