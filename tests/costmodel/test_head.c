/* The fused head's phases (costmodel/head.c): where the partita executor
 * fuses the head (tp 1, gradients in the one buffer), its backward
 * products move from the backward into the forward, exactly and with the
 * sum unchanged, in the phases and in the estimate's stages; elsewhere
 * (tp > 1, ZeRO-2/3's shards, other runtimes, stages without the head)
 * nothing moves; and the roofline's share of the products is the head's
 * backward less the final norm's, by hand, over random shapes, and its
 * share of a fused head's forward gives the same products. How the
 * profile timed the head: test_head_profile.c. That the
 * condition is the executor's is test_memory.c's check_head_fused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

/* Deterministic pseudo-random numbers (a 64-bit LCG). */
static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static int random_int(int low, int high)
{
    return fixture_random_int(&rng_state, low, high);
}

static type_costs costs_of(costmodel *cm, int type,
                           const parallel_config *config)
{
    type_costs costs;
    pt_error err = {{0}};
    if (costmodel_type_costs(cm, type, config, &costs, &err) != 0)
        fail_msg("%s", err.message);
    return costs;
}

/* GPT-2 XL at pp 2, dp 2 on a node of 4 A100s, tp 1: the last stage's
 * forward is its 24 layers, the head's forward and its backward
 * products (all of its backward on a profile without a roofline) and
 * the boundary it receives at; its backward keeps the rest; the first
 * stage is as before. */
static void fused_stage_moves_exactly_the_products(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 0), 0);
    parallel_config config = config_of(8, 1, 1, 2, 2);
    int order[1] = {0}, partition[2] = {24, 24};
    estimate e;
    pt_error err = {{0}};
    if (costmodel_estimate(&f.cm, &config, order, 1, partition, false, &e,
                           &err) != 0)
        fail_msg("%s", err.message);
    type_costs c = costs_of(&f.cm, 0, &config);
    assert_true(costmodel_head_fused(&m, &config, 1));
    assert_true(c.head_products_s == c.head_backward_s);
    int fwd_boundaries, bwd_boundaries;
    costmodel_boundary_count(1, 2, &fwd_boundaries, &bwd_boundaries);
    assert_true(close_to(e.stages[1].forward_s,
                         24 * c.layer_forward_s + c.head_forward_s +
                             c.head_products_s +
                             fwd_boundaries * c.boundary_s,
                         1e-12));
    assert_true(close_to(e.stages[1].backward_s,
                         24 * c.layer_backward_s + c.head_backward_s -
                             c.head_products_s +
                             bwd_boundaries * c.boundary_s,
                         1e-12));
    costmodel_boundary_count(0, 2, &fwd_boundaries, &bwd_boundaries);
    assert_true(close_to(e.stages[0].forward_s,
                         24 * c.layer_forward_s + c.embedding_forward_s +
                             fwd_boundaries * c.boundary_s,
                         1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

/* The phases equal the costs where the head is not fused, and the
 * stages without it have none. */
static void assert_unmoved(const model_shape *m, const parallel_config *c,
                           const type_costs *costs)
{
    double forward, backward;
    assert_false(costmodel_head_fused(m, c, c->pp - 1));
    costmodel_head_phases(m, c, c->pp - 1, costs, &forward, &backward);
    assert_true(forward == costs->head_forward_s);
    assert_true(backward == costs->head_backward_s);
}

static void head_stays_in_the_backward_where_not_fused(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 0), 0);
    /* tp 2: the vocab-parallel softmax sums whole rows over the group */
    parallel_config c = config_of(8, 1, 2, 1, 2);
    type_costs costs = costs_of(&f.cm, 0, &c);
    assert_true(costs.head_products_s > 0.0);
    assert_unmoved(&m, &c, &costs);
    /* ZeRO-2 and 3 at dp 2 on one stage: the head's gradient unit opens
     * in the backward */
    for (int zero = 2; zero <= 3; zero++) {
        c = config_of(8, 1, 1, 2, 1);
        parallel_set_zero_stage(&c, zero);
        costs = costs_of(&f.cm, 0, &c);
        assert_unmoved(&m, &c, &costs);
    }
    /* Megatron-LM runs the head's products in its backward */
    c = config_of(8, 1, 1, 1, 2);
    c.runtime = RUNTIME_MEGATRON;
    costs = costs_of(&f.cm, 0, &c);
    assert_unmoved(&m, &c, &costs);
    /* a stage without the head has no head phases */
    c = config_of(8, 1, 1, 1, 2);
    costs = costs_of(&f.cm, 0, &c);
    double forward, backward;
    assert_false(costmodel_head_fused(&m, &c, 0));
    costmodel_head_phases(&m, &c, 0, &costs, &forward, &backward);
    assert_true(forward == 0.0 && backward == 0.0);
    /* ZeRO-2 on a pipeline's tied pair: whole buffers, so fused */
    c = config_of(8, 1, 1, 2, 2);
    parallel_set_zero_stage(&c, 2);
    assert_true(costmodel_head_fused(&m, &c, 1));
    fixture_close(&f);
}

/* A profile that holds no shape and prices every one from the roofline
 * (fixtures.h's parameters, an H200's figures). */
static void make_roofline_profile(profile *p)
{
    make_profile(p, "RF-TEST", 139.8, 1.0);
    for (int i = 0; i < p->shape_count; i++)
        free(p->shapes[i].points);
    free(p->shapes);
    p->shapes = NULL;
    p->shape_count = 0;
    p->peak_tflops = 989.0;
    p->memory_bandwidth_GBps = 4800.0;
    p->sms = 132;
    p->roofline = known_roofline_params();
}

static model_shape random_shape(int tp)
{
    return fixture_random_shape(&rng_state, tp);
}

/* The share by hand: what is not a product is the final norm's
 * backward, one memory pass reading its input and the incoming gradient
 * and writing a gradient (2 x its forward's 2 N h e bytes) at the full
 * bandwidth (every SM used). */
static void roofline_share_is_the_head_backward_less_the_norm(void **state)
{
    (void)state;
    roofline_params p = known_roofline_params();
    roofline_device device = h200_device(132);
    const int tps[3] = {1, 2, 4};
    for (int trial = 0; trial < 200; trial++) {
        int tp = tps[random_int(0, 2)];
        model_shape m = random_shape(tp);
        roofline_shard shard = {tp, random_int(1, 16), 2.0, false, 4.0,
                                true, true};
        model_part_costs costs;
        roofline_part_costs(&p, &device, &m, shard, &costs);
        double share = roofline_head_products_share(&p, &device, &m, shard);
        double tokens = (double)shard.mbs * m.seq;
        double norm_s = 2.0 * (2.0 * tokens * m.hidden * 2.0) /
                            (device.bandwidth_bytes_per_s *
                             p.bandwidth_efficiency) +
                        p.kernel_overhead_s;
        assert_true(share > 0.0 && share < 1.0);
        if (!close_to((1.0 - share) * costs.head.backward_s, norm_s, 1e-9))
            fail_msg("trial %d: share %.6f of %.6g s leaves %.6g s, the "
                     "norm's backward is %.6g s", trial, share,
                     costs.head.backward_s,
                     (1.0 - share) * costs.head.backward_s, norm_s);
        /* a head timed fused gives the same products back: its share of
         * the fused forward (the forward and the products) */
        double products = share * costs.head.backward_s;
        double fused =
            roofline_head_fused_products_share(&p, &device, &m, shard);
        if (!close_to(fused * (costs.head.forward_s + products), products,
                      1e-9))
            fail_msg("trial %d: fused share %.6f, share %.6f", trial, fused,
                     share);
    }
}

/* Over random shapes, degrees, ZeRO stages and runtimes: the products
 * are part of the backward, the phases' sum is the head's, and the
 * forward grows by exactly the products where the head is fused. */
static void phases_keep_the_sum_over_random_plans(void **state)
{
    (void)state;
    const int tps[3] = {1, 2, 4};
    for (int trial = 0; trial < 200; trial++) {
        int tp = tps[random_int(0, 2)];
        model_shape m = random_shape(tp);
        cluster cl = one_node_cluster("RF-TEST", 8);
        profile prof;
        make_roofline_profile(&prof);
        costmodel cm;
        pt_error err = {{0}};
        if (costmodel_open_with_profiles(&cm, &m, &cl, &prof, &err) != 0)
            fail_msg("trial %d: %s", trial, err.message);
        int dp = random_int(1, 2), pp = random_int(1, 2);
        parallel_config c = config_of(8 * dp, random_int(1, 4), tp, dp, pp);
        c.gbs = c.mbs * dp * random_int(1, 4);
        int zero = random_int(0, 3);
        if (zero > 0)
            parallel_set_zero_stage(&c, zero);
        if (random_int(0, 3) == 0)
            c.runtime = RUNTIME_MEGATRON;
        type_costs costs = costs_of(&cm, 0, &c);
        assert_true(costs.head_products_s > 0.0 &&
                    costs.head_products_s < costs.head_backward_s);
        double forward, backward;
        costmodel_head_phases(&m, &c, pp - 1, &costs, &forward, &backward);
        assert_true(close_to(forward + backward,
                             costs.head_forward_s + costs.head_backward_s,
                             1e-12));
        bool fused = c.runtime == RUNTIME_PARTITA && tp == 1 &&
                     !(zero >= 2 && dp > 1 && !(pp > 1));
        assert_true(costmodel_head_fused(&m, &c, pp - 1) == fused);
        double moved = fused ? costs.head_products_s : 0.0;
        assert_true(forward == costs.head_forward_s + moved);
        assert_true(backward == costs.head_backward_s - moved);
        costmodel_close(&cm);
        profile_free(&prof);
        cluster_free(&cl);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fused_stage_moves_exactly_the_products),
        cmocka_unit_test(head_stays_in_the_backward_where_not_fused),
        cmocka_unit_test(roofline_share_is_the_head_backward_less_the_norm),
        cmocka_unit_test(phases_keep_the_sum_over_random_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
