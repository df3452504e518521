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


/* Ring: 2(n-1)/n X / B + 2(n-1) a; tree: 2 X / B + 2 ceil(log2 n) a. They
 * cross at X* = n B a (n - 1 - ceil(log2 n)): the tree below, the ring
 * above, as NCCL's tuner chooses. */
static void ring_and_tree_cross_where_the_formulas_say(void **state)
{
    (void)state;
    link_spec network = link_of(50.0, 8.0);
    for (int n = 4; n <= 256; n *= 2) {
        comm_group group = {n, n, network, network};
        double depth = tree_allreduce_steps(n) / 2;
        double crossover = n * 50e9 * 8e-6 * (n - 1 - depth);
        assert_true(close_to(allreduce_time(crossover, n, network),
                             tree_allreduce_time(crossover, n, network),
                             1e-9));
        comm_price below = nccl_allreduce(0.9 * crossover, &group);
        comm_price above = nccl_allreduce(1.1 * crossover, &group);
        assert_true(below.algorithm == ALLREDUCE_TREE ||
                    below.algorithm == ALLREDUCE_HIERARCHICAL_TREE);
        assert_true(above.algorithm == ALLREDUCE_RING ||
                    above.algorithm == ALLREDUCE_HIERARCHICAL_RING);
        assert_true(close_to(below.seconds,
                             tree_allreduce_time(0.9 * crossover, n, network),
                             1e-12));
        assert_true(close_to(above.seconds,
                             allreduce_time(1.1 * crossover, n, network),
                             1e-12));
    }
    /* two ranks: the ring always (the same steps, half the bytes) */
    comm_group pair = {2, 2, network, network};
    assert_int_equal(nccl_allreduce(1.0, &pair).algorithm, ALLREDUCE_RING);
    assert_int_equal(tree_allreduce_steps(2), 2);
    assert_int_equal(tree_allreduce_steps(5), 6);
}

/* One node: the hierarchy is the flat ring on the intra-node link; one
 * member a node: the ring (or tree) over the network; and the step
 * counts add up for a hierarchy of g x k. */
static void hierarchical_reduces_to_flat(void **state)
{
    (void)state;
    link_spec nvlink = link_of(300.0, 3.0), nic = link_of(50.0, 10.0);
    for (int n = 2; n <= 16; n++) {
        comm_group node = {n, 1, nvlink, nic};
        for (double bytes = 1024.0; bytes < 1e10; bytes *= 7.0) {
            comm_price price = nccl_allreduce(bytes, &node);
            assert_int_equal(price.algorithm, ALLREDUCE_RING);
            assert_true(close_to(price.seconds,
                                 allreduce_time(bytes, n, nvlink), 1e-12));
            assert_true(close_to(nccl_reduce_scatter(bytes, &node),
                                 reduce_scatter_time(bytes, n, nvlink),
                                 1e-12));
            comm_group spread = {n, n, nvlink, nic};
            double flat = fmin(allreduce_time(bytes, n, nic),
                               tree_allreduce_time(bytes, n, nic));
            assert_true(close_to(nccl_allreduce(bytes, &spread).seconds,
                                 flat, 1e-12));
        }
    }
    /* 2 nodes of 8, 1 GiB: the ring through all 16 runs at the 8 rails'
       400 GB/s, capped by NVLink's 300, with the NIC's latency; the
       hierarchy (2 RS(8, NVLink) + AR(2, NIC) of 1/8) is slower */
    comm_group dgx = {16, 2, nvlink, nic};
    double bytes = 1073741824.0;
    double ring = 2.0 * 15.0 / 16.0 * bytes / 300e9 + 30.0 * 10e-6;
    double hierarchy = 2.0 * (7.0 / 8.0 * bytes / 300e9 + 7.0 * 3e-6) +
                       bytes / 8.0 / 50e9 + 2.0 * 10e-6;
    comm_price price = nccl_allreduce(bytes, &dgx);
    assert_int_equal(price.algorithm, ALLREDUCE_RING);
    assert_true(close_to(price.seconds, ring, 1e-12));
    assert_true(hierarchy > ring);
    /* with slow rails the hierarchy wins: 1 GB/s NICs */
    comm_group thin = {16, 2, nvlink, link_of(1.0, 10.0)};
    price = nccl_allreduce(bytes, &thin);
    assert_int_equal(price.algorithm, ALLREDUCE_HIERARCHICAL_RING);
    assert_true(close_to(price.seconds,
                         2.0 * (7.0 / 8.0 * bytes / 300e9 + 7.0 * 3e-6) +
                             bytes / 8.0 / 1e9 + 2.0 * 10e-6,
                         1e-12));
    /* uneven spread (16 over 3 nodes) is priced flat */
    comm_group uneven = {16, 3, nvlink, nic};
    assert_true(close_to(nccl_allreduce(bytes, &uneven).seconds,
                         allreduce_time(bytes, 16, nic), 1e-12));
}

/* Times never fall with more bytes (a reduce-scatter has no tree, so it
 * may take longer than a small all-reduce); the floor never exceeds the
 * price;
 * bus bandwidth approaches the link's for large messages and is latency
 * bound for small ones. */
static void monotone_in_size_and_floored(void **state)
{
    (void)state;
    uint64_t seed = 7;
    for (int trial = 0; trial < 300; trial++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int nodes = 1 + (int)((seed >> 33) % 16);
        int per_node = 1 + (int)((seed >> 41) % 8);
        link_spec intra = link_of(10.0 + (double)((seed >> 20) % 900),
                                  (double)((seed >> 10) % 10));
        link_spec inter = link_of(1.0 + (double)((seed >> 50) % 100),
                                  (double)((seed >> 5) % 30));
        comm_group group = {nodes * per_node, nodes, intra, inter};
        double previous = 0.0, previous_rs = 0.0;
        for (double bytes = 1.0; bytes < 4e10; bytes *= 1.9) {
            double t = nccl_allreduce(bytes, &group).seconds;
            double rs = nccl_reduce_scatter(bytes, &group);
            assert_true(t >= previous);
            assert_true(rs >= previous_rs);
            previous = t;
            previous_rs = rs;
            double floor = allreduce_floor_time(
                bytes, group.members, per_node + (int)(trial % 3),
                intra.bandwidth_bytes_per_s, inter.bandwidth_bytes_per_s);
            assert_true(floor <= t * (1.0 + 1e-12));
            assert_true(0.5 * floor <= rs * (1.0 + 1e-12));
        }
    }
    link_spec nvlink = link_of(100.0, 5.0);
    double big = allreduce_bus_bandwidth(
        1073741824.0, 8, allreduce_time(1073741824.0, 8, nvlink));
    assert_true(big > 0.99 * 100e9 && big <= 100e9);
    double small = allreduce_bus_bandwidth(
        8192.0, 8, allreduce_time(8192.0, 8, nvlink));
    assert_true(small < 0.02 * 100e9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allreduce_is_the_ring_formula),
        cmocka_unit_test(reduce_scatter_is_half_an_allreduce),
        cmocka_unit_test(p2p_is_latency_plus_bytes_over_bandwidth),
        cmocka_unit_test(event_names_round_trip),
        cmocka_unit_test(flops_match_megatron_formula),
        cmocka_unit_test(ring_and_tree_cross_where_the_formulas_say),
        cmocka_unit_test(hierarchical_reduces_to_flat),
        cmocka_unit_test(monotone_in_size_and_floored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
