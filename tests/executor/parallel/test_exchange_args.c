/*
 * The device exchange without a GPU (builds with the cuda backend): the
 * emulated links' closed forms (those of docs/cost-model.md: a message
 * latency + bytes / bandwidth, a ring all-reduce 2 (n - 1) / n of the
 * bytes and 2 (n - 1) latencies, a reduce-scatter or all-gather half of
 * it, an unpaced link nothing), the world's refusals (too few or too many
 * ranks, no timeout, a link that is negative or not finite), and that
 * the exchange offers stream-ordered collectives while its ranks refuse
 * to work before they are opened on their GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "executor/executor.h"

static void emulated_times_are_the_cost_models(void **state)
{
    (void)state;
    link_spec nvlink = {.bandwidth_bytes_per_s = 450e9, .latency_s = 5e-6};
    double bytes = 13107200.0; /* a tp sum of GPT-2 XL at mbs 4, bf16 */
    assert_float_equal(comm_emulated_seconds(COMM_PATTERN_MESSAGE, bytes, 2,
                                             nvlink),
                       5e-6 + bytes / 450e9, 1e-15);
    assert_float_equal(comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, bytes,
                                             2, nvlink),
                       bytes / 450e9 + 2 * 5e-6, 1e-15);
    assert_float_equal(comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, bytes,
                                             4, nvlink),
                       1.5 * bytes / 450e9 + 6 * 5e-6, 1e-15);
    assert_float_equal(comm_emulated_seconds(COMM_PATTERN_HALF_ALL_REDUCE,
                                             bytes, 4, nvlink),
                       0.75 * bytes / 450e9 + 3 * 5e-6, 1e-15);
    link_spec unpaced = {0.0, 5e-6};
    assert_true(comm_emulated_seconds(COMM_PATTERN_MESSAGE, bytes, 2,
                                      unpaced) == 0.0);
    assert_true(comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, 0.0, 2,
                                      nvlink) == 0.0);
    assert_true(comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, bytes, 1,
                                      nvlink) == 0.0);
}

static void worlds_are_refused_with_reasons(void **state)
{
    (void)state;
    comm_exchange *world = NULL;
    pt_error err = {{0}};
    assert_int_equal(comm_exchange_create(1, NULL, 10.0, &world, &err), -1);
    assert_non_null(strstr(err.message, "2 to 16 ranks"));
    assert_int_equal(comm_exchange_create(17, NULL, 10.0, &world, &err), -1);
    assert_int_equal(comm_exchange_create(2, NULL, 0.0, &world, &err), -1);
    link_spec links[4] = {{450e9, 5e-6}, {450e9, 5e-6}, {450e9, -1.0},
                          {450e9, 5e-6}};
    assert_int_equal(comm_exchange_create(2, links, 10.0, &world, &err), -1);
    assert_non_null(strstr(err.message, "ranks 1 and 0"));
    links[2] = (link_spec){NAN, 5e-6};
    assert_int_equal(comm_exchange_create(2, links, 10.0, &world, &err), -1);
    assert_null(world);
}

static void ranks_refuse_before_they_open(void **state)
{
    (void)state;
    link_spec links[4] = {{0.0, 0.0}, {450e9, 5e-6}, {450e9, 5e-6},
                          {0.0, 0.0}};
    comm_exchange *world = NULL;
    pt_error err = {{0}};
    assert_int_equal(comm_exchange_create(2, links, 10.0, &world, &err), 0);
    comm c = comm_exchange_rank(world, 0);
    assert_true(comm_has_stream_ops(&c));
    float x = 1.0f;
    assert_int_equal(comm_send(&c, 1, 0, &x, 1, &err), -1);
    assert_non_null(strstr(err.message, "not open"));
    assert_int_equal(comm_recv(&c, 1, 0, &x, 1, &err), -1);
    assert_non_null(strstr(err.message, "not open"));
    int group[2] = {0, 1};
    assert_int_equal(comm_all_reduce_sum(&c, group, 2, &x, 1, &err), -1);
    assert_non_null(strstr(err.message, "not open"));
    assert_true(comm_exchange_rank_peak_bytes(world, 0) == 0.0);
    comm_exchange_destroy(world);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(emulated_times_are_the_cost_models),
        cmocka_unit_test(worlds_are_refused_with_reasons),
        cmocka_unit_test(ranks_refuse_before_they_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
