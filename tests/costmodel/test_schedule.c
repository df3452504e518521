/* Properties of the pipeline simulator: closed forms of uniform
 * pipelines, one micro-batch, one thing at a time per stream, every
 * dependency respected, and the 1F1B in-flight count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

#define EPS 1e-12

/* Deterministic pseudo-random numbers (a 64-bit LCG). */
static uint64_t rng_state = 0x853c49e6748fea9bULL;
static double random_unit(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static int random_int(int low, int high)
{
    return low + (int)(random_unit() * (high - low + 1));
}

/* The event of (stage, microbatch, kind); fails the test when absent or
 * duplicated. */
static const timeline_event *find_event(const schedule_result *r, int stage,
                                        int microbatch, event_kind kind)
{
    const timeline_event *found = NULL;
    for (int i = 0; i < r->event_count; i++) {
        const timeline_event *e = &r->events[i];
        if (e->stage == stage && e->microbatch == microbatch &&
            e->kind == kind) {
            assert_null(found);
            found = e;
        }
    }
    assert_non_null(found);
    return found;
}

/* No two events of one kind family on one stage overlap. */
static void check_no_overlap(const schedule_result *r, int stage,
                             event_kind a, event_kind b)
{
    for (int i = 0; i < r->event_count; i++) {
        const timeline_event *x = &r->events[i];
        if (x->stage != stage || (x->kind != a && x->kind != b))
            continue;
        for (int j = i + 1; j < r->event_count; j++) {
            const timeline_event *y = &r->events[j];
            if (y->stage != stage || (y->kind != a && y->kind != b))
                continue;
            bool apart = x->end_s <= y->start_s + EPS ||
                         y->end_s <= x->start_s + EPS;
            assert_true(apart);
        }
    }
}

/* Most micro-batches whose activations a stage holds at once: counted
 * from a forward's start to its backward's end. */
static int max_in_flight(const schedule_result *r, int stage, int m)
{
    int most = 0;
    for (int i = 0; i < m; i++) {
        double t = find_event(r, stage, i, EVENT_FWD)->start_s;
        int held = 0;
        for (int j = 0; j < m; j++) {
            const timeline_event *f = find_event(r, stage, j, EVENT_FWD);
            const timeline_event *b = find_event(r, stage, j, EVENT_BWD);
            if (f->start_s <= t + EPS && b->end_s > t + EPS)
                held++;
        }
        if (held > most)
            most = held;
    }
    return most;
}

/* Every rule the simulator promises, checked on its events. */
static void check_schedule(schedule_kind kind, const schedule_stage *stages,
                           int pp, int m, const schedule_result *r)
{
    int expected = 2 * pp * m + 4 * (pp - 1) * m;
    assert_int_equal(r->event_count, expected);
    double latest = 0.0;
    for (int s = 0; s < pp; s++) {
        check_no_overlap(r, s, EVENT_FWD, EVENT_BWD);
        check_no_overlap(r, s, EVENT_SEND_FWD, EVENT_SEND_FWD);
        check_no_overlap(r, s, EVENT_SEND_BWD, EVENT_SEND_BWD);
        double busy = 0.0, stage_end = 0.0;
        for (int i = 0; i < m; i++) {
            const timeline_event *f = find_event(r, s, i, EVENT_FWD);
            const timeline_event *b = find_event(r, s, i, EVENT_BWD);
            assert_true(close_to(f->end_s - f->start_s, stages[s].forward_s,
                                 1e-9) || stages[s].forward_s == 0.0);
            assert_true(b->start_s >= f->end_s - EPS);
            if (s > 0) {
                const timeline_event *send =
                    find_event(r, s - 1, i, EVENT_SEND_FWD);
                const timeline_event *recv = find_event(r, s, i, EVENT_RECV_FWD);
                assert_true(send->start_s >=
                            find_event(r, s - 1, i, EVENT_FWD)->end_s - EPS);
                assert_true(recv->start_s == send->start_s &&
                            recv->end_s == send->end_s);
                assert_true(f->start_s >= recv->end_s - EPS);
            }
            if (s < pp - 1) {
                const timeline_event *send =
                    find_event(r, s + 1, i, EVENT_SEND_BWD);
                const timeline_event *recv = find_event(r, s, i, EVENT_RECV_BWD);
                assert_true(send->start_s >=
                            find_event(r, s + 1, i, EVENT_BWD)->end_s - EPS);
                assert_true(recv->end_s == send->end_s);
                assert_true(b->start_s >= recv->end_s - EPS);
            }
            busy += (f->end_s - f->start_s) + (b->end_s - b->start_s);
            if (b->end_s > stage_end)
                stage_end = b->end_s;
        }
        assert_true(close_to(r->stage_busy_s[s], busy, 1e-9) || busy == 0.0);
        assert_true(r->stage_end_s[s] == stage_end);
        if (stage_end > latest)
            latest = stage_end;
        int limit = kind == SCHEDULE_1F1B ? (pp - s < m ? pp - s : m) : m;
        assert_true(max_in_flight(r, s, m) <= limit);
    }
    assert_true(r->pipeline_end_s == latest);
}

static int simulate(schedule_kind kind, const schedule_stage *stages, int pp,
                    int m, bool events, schedule_result *r)
{
    pt_error err = {{0}};
    int rc = schedule_simulate(kind, stages, pp, m, events, r, &err);
    if (rc != 0)
        fail_msg("%s", err.message);
    return rc;
}

static void uniform_pipeline_matches_closed_form(void **state)
{
    (void)state;
    schedule_stage stages[8];
    for (int s = 0; s < 8; s++)
        stages[s] = (schedule_stage){0.003, 0.006, 0.0, 0.0};
    schedule_kind kinds[2] = {SCHEDULE_1F1B, SCHEDULE_GPIPE};
    for (int k = 0; k < 2; k++) {
        for (int pp = 1; pp <= 8; pp++) {
            for (int m = 1; m <= 12; m++) {
                schedule_result r;
                simulate(kinds[k], stages, pp, m, true, &r);
                /* (m + pp - 1) x (f + b) */
                assert_true(close_to(r.pipeline_end_s,
                                     (m + pp - 1) * 0.009, 1e-9));
                check_schedule(kinds[k], stages, pp, m, &r);
                schedule_result_free(&r);
            }
        }
    }
}

static void one_microbatch_is_the_sum_of_stages(void **state)
{
    (void)state;
    schedule_stage stages[6];
    for (int trial = 0; trial < 50; trial++) {
        int pp = random_int(1, 6);
        double expected = 0.0;
        for (int s = 0; s < pp; s++) {
            stages[s] = (schedule_stage){random_unit(), random_unit(),
                                         random_unit() * 0.1,
                                         random_unit() * 0.1};
            expected += stages[s].forward_s + stages[s].backward_s;
            if (s < pp - 1)
                expected += stages[s].send_fwd_s;
            if (s > 0)
                expected += stages[s].send_bwd_s;
        }
        for (int k = 0; k < 2; k++) {
            schedule_result r;
            simulate(k == 0 ? SCHEDULE_1F1B : SCHEDULE_GPIPE, stages, pp, 1,
                     false, &r);
            assert_true(close_to(r.pipeline_end_s, expected, 1e-12));
            assert_null(r.events);
            schedule_result_free(&r);
        }
    }
}

static void random_pipelines_keep_every_rule(void **state)
{
    (void)state;
    schedule_stage stages[8];
    for (int trial = 0; trial < 120; trial++) {
        int pp = random_int(1, 8), m = random_int(1, 16);
        double slowest_busy = 0.0;
        for (int s = 0; s < pp; s++) {
            stages[s] = (schedule_stage){
                0.5 + random_unit(), 1.0 + 2.0 * random_unit(),
                random_unit() < 0.3 ? 0.0 : random_unit(),
                random_unit() < 0.3 ? 0.0 : random_unit()};
            double busy = m * (stages[s].forward_s + stages[s].backward_s);
            if (busy > slowest_busy)
                slowest_busy = busy;
        }
        schedule_kind kind = trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
        schedule_result with, without;
        simulate(kind, stages, pp, m, true, &with);
        check_schedule(kind, stages, pp, m, &with);
        assert_true(with.pipeline_end_s >= slowest_busy - EPS);
        /* events or not, the same timeline */
        simulate(kind, stages, pp, m, false, &without);
        assert_true(without.pipeline_end_s == with.pipeline_end_s);
        assert_int_equal(without.event_count, 0);
        schedule_result_free(&with);
        schedule_result_free(&without);
    }
}

static void one_f_one_b_holds_min_of_pp_minus_s_and_m(void **state)
{
    (void)state;
    schedule_stage stages[6];
    for (int s = 0; s < 6; s++)
        stages[s] = (schedule_stage){1.0, 2.0, 0.1, 0.1};
    int ms[3] = {2, 6, 10};
    for (int i = 0; i < 3; i++) {
        int m = ms[i];
        schedule_result r;
        simulate(SCHEDULE_1F1B, stages, 6, m, true, &r);
        for (int s = 0; s < 6; s++) {
            int expected = 6 - s < m ? 6 - s : m;
            assert_int_equal(max_in_flight(&r, s, m), expected);
            assert_int_equal(costmodel_microbatches_in_flight(
                                 &(parallel_config){.pp = 6,
                                                    .schedule = SCHEDULE_1F1B},
                                 s, m),
                             expected);
        }
        schedule_result_free(&r);
        simulate(SCHEDULE_GPIPE, stages, 6, m, true, &r);
        for (int s = 0; s < 6; s++)
            assert_int_equal(max_in_flight(&r, s, m), m);
        schedule_result_free(&r);
    }
}

static void slow_stage_sets_the_pace(void **state)
{
    (void)state;
    /* a stage twice as slow as the others: steady state runs at its pace,
       so the pipeline takes at least m x its f + b */
    schedule_stage stages[4] = {{1, 2, 0, 0}, {2, 4, 0, 0}, {1, 2, 0, 0},
                                {1, 2, 0, 0}};
    schedule_result r;
    simulate(SCHEDULE_1F1B, stages, 4, 16, false, &r);
    assert_true(r.pipeline_end_s >= 16 * 6.0);
    assert_true(r.pipeline_end_s < 16 * 6.0 + 3 * 6.0 + 1e-9);
    assert_true(r.stage_busy_s[1] == 16 * 6.0);
    schedule_result_free(&r);
}

static void bad_inputs_fail_with_a_message(void **state)
{
    (void)state;
    schedule_stage stages[2] = {{1, 2, 0, 0}, {-1, 2, 0, 0}};
    schedule_result r;
    pt_error err = {{0}};
    assert_int_equal(schedule_simulate(SCHEDULE_1F1B, stages, 2, 4, false, &r,
                                       &err), -1);
    assert_non_null(strstr(err.message, "stage 1"));
    assert_int_equal(schedule_simulate(SCHEDULE_1F1B, stages, 1, 0, false, &r,
                                       &err), -1);
    assert_int_equal(schedule_simulate(SCHEDULE_1F1B, stages, 0, 4, false, &r,
                                       &err), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(uniform_pipeline_matches_closed_form),
        cmocka_unit_test(one_microbatch_is_the_sum_of_stages),
        cmocka_unit_test(random_pipelines_keep_every_rule),
        cmocka_unit_test(one_f_one_b_holds_min_of_pp_minus_s_and_m),
        cmocka_unit_test(slow_stage_sets_the_pace),
        cmocka_unit_test(bad_inputs_fail_with_a_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
