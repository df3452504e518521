/* Closed forms of the collectives, event kind names and Megatron's
 * FLOPs formula. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

static void allreduce_is_the_ring_formula(void **state)
{
    (void)state;
    link_spec link = link_of(100.0, 10.0); /* 100 GB/s, 10 us */
    /* 8 members, 1 GB: 2 x 7/8 x 1e9 / 1e11 + 2 x 7 x 1e-5 = 0.0175 +
       0.00014 = 0.01764 s */
    assert_true(close_to(allreduce_time(1e9, 8, link), 0.01764, 1e-12));
    /* 2 members: 2 x 1/2 x 1e9/1e11 + 2 x 1e-5 = 0.01002 s */
    assert_true(close_to(allreduce_time(1e9, 2, link), 0.01002, 1e-12));
    assert_true(allreduce_time(1e9, 1, link) == 0.0);
    assert_true(allreduce_time(0.0, 8, link) == 0.0);
}

static void reduce_scatter_is_half_an_allreduce(void **state)
{
    (void)state;
    link_spec link = link_of(25.0, 3.0);
    for (int n = 2; n <= 64; n *= 2) {
        double bytes = 123456789.0;
        /* (n-1)/n x bytes / bw + (n-1) x latency */
        double expected = (n - 1.0) / n * bytes / 25e9 + (n - 1.0) * 3e-6;
        assert_true(close_to(reduce_scatter_time(bytes, n, link), expected,
                             1e-12));
        assert_true(close_to(2.0 * reduce_scatter_time(bytes, n, link),
                             allreduce_time(bytes, n, link), 1e-12));
    }
    assert_true(reduce_scatter_time(1e6, 1, link) == 0.0);
}

static void p2p_is_latency_plus_bytes_over_bandwidth(void **state)
{
    (void)state;
    link_spec link = link_of(5.0, 20.0);
    /* 3,276,800 bytes (GPT-2 XL b=1 activation in bf16) over 5 GB/s plus
       20 us: 655.36 us + 20 us = 675.36 us */
    assert_true(close_to(p2p_time(3276800.0, link), 675.36e-6, 1e-12));
    assert_true(p2p_time(0.0, link) == 0.0);
    link_spec broken = {0.0, 1e-6};
    assert_true(isinf(p2p_time(1.0, broken)));
}

static void event_names_round_trip(void **state)
{
    (void)state;
    const char *names[EVENT_KIND_COUNT] = {
        "fwd", "bwd", "send_fwd", "recv_fwd", "send_bwd", "recv_bwd",
        "tp_allreduce", "dp_allreduce", "embedding_allreduce", "optimizer"};
    for (int k = 0; k < EVENT_KIND_COUNT; k++) {
        assert_string_equal(event_kind_name((event_kind)k), names[k]);
        assert_int_equal(event_kind_from_name(names[k]), k);
    }
    assert_int_equal(event_kind_from_name("forward"), -1);
    assert_int_equal(event_kind_from_name(""), -1);
    assert_int_equal(event_kind_from_name(NULL), -1);
    assert_string_equal(event_kind_name(EVENT_KIND_COUNT), "unknown");
}

static void flops_match_megatron_formula(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    double B = 64, s = m.seq, l = m.layers, h = m.hidden, V = m.vocab;
    double plain = 72.0 * B * s * l * h * h *
                   (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
    double recompute = 96.0 * B * s * l * h * h *
                       (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
    assert_true(close_to(model_flops_per_iteration(&m, 64, false), plain,
                         1e-12));
    assert_true(close_to(model_flops_per_iteration(&m, 64, true), recompute,
                         1e-12));
    /* GPT-2 XL, gbs 64: 6N x tokens = 6 x 1.56e9 x 65,536 = 6.1e14 plus
       attention and head: 6.73e14 FLOPs per iteration */
    assert_true(plain > 6.7e14 && plain < 6.75e14);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allreduce_is_the_ring_formula),
        cmocka_unit_test(reduce_scatter_is_half_an_allreduce),
        cmocka_unit_test(p2p_is_latency_plus_bytes_over_bandwidth),
        cmocka_unit_test(event_names_round_trip),
        cmocka_unit_test(flops_match_megatron_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
