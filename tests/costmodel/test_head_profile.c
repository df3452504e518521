/* How the profile timed the head against how the stage runs it
 * (costmodel/head.c, price.c, lookup.c; docs/cost-model.md section 5):
 * profile points with head.fused hold the products in the head's
 * forward. All four cases (timed fused or not x stage fused or not),
 * exactly, on a profile without a roofline (the efficiency model's
 * shares: all of the backward, 2 of the fused forward's 3 products);
 * fused and unfused points that meet in a lookup; and the fit, which
 * reads a fused point by the fused head's kernels. The roofline's fused
 * share against its unfused one: test_head.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

/* make_profiles' A100 and A10 with the head of every tp-1 point marked
 * as timed fused when `fused` (as the profiler marks them on cuda), the
 * costmodel over one A100 node. */
typedef struct head_fixture {
    model_shape model;
    cluster cluster;
    profile profiles[2];
    costmodel cm;
} head_fixture;

static void open_fixture(head_fixture *f, bool fused)
{
    memset(f, 0, sizeof *f);
    f->model = gpt2_xl();
    make_cluster(&f->cluster, 1, 0);
    make_profiles(f->profiles);
    for (int i = 0; i < f->profiles[0].shapes[0].point_count; i++) {
        profile_point *pt = &f->profiles[0].shapes[0].points[i];
        pt->head_fused = fused && pt->tp == 1;
    }
    pt_error err = {{0}};
    if (costmodel_open_with_profiles(&f->cm, &f->model, &f->cluster,
                                     f->profiles, &err) != 0)
        fail_msg("%s", err.message);
}

static void close_fixture(head_fixture *f)
{
    costmodel_close(&f->cm);
    profile_free(&f->profiles[0]);
    profile_free(&f->profiles[1]);
    cluster_free(&f->cluster);
}

/* The fixture's measured head at (tp, mbs). */
static part_cost measured_head(const head_fixture *f, int tp, int mbs)
{
    const profile_shape *shape = &f->profiles[0].shapes[0];
    int i = profile_find_point(shape, tp, mbs);
    assert_true(i >= 0);
    return shape->points[i].head;
}

static type_costs costs_of(head_fixture *f, const parallel_config *config)
{
    type_costs costs;
    pt_error err = {{0}};
    if (costmodel_type_costs(&f->cm, 0, config, &costs, &err) != 0)
        fail_msg("%s", err.message);
    return costs;
}

/* The head's phases on the last stage of c: timed as timed_fused says,
 * forward_s and backward_s (within rounding). */
static void expect_phases(head_fixture *f, const parallel_config *c,
                          bool timed_fused, double forward_s,
                          double backward_s)
{
    type_costs costs = costs_of(f, c);
    assert_true(costs.head_timed_fused == timed_fused);
    double forward, backward;
    costmodel_head_phases(&f->model, c, c->pp - 1, &costs, &forward,
                          &backward);
    if (!close_to(forward, forward_s, 1e-12) ||
        !close_to(backward, backward_s, 1e-12))
        fail_msg("phases %.9g / %.9g s, expected %.9g / %.9g s", forward,
                 backward, forward_s, backward_s);
}

/* tp 1, one stage, no ZeRO: the executor fuses the head */
static parallel_config fused_stage(void) { return config_of(8, 2, 1, 1, 1); }

/* tp 1 under ZeRO-2 at dp 2: the head's gradient unit opens in the
 * backward, so the executor does not fuse */
static parallel_config sharded_stage(void)
{
    parallel_config c = config_of(8, 2, 1, 2, 1);
    parallel_set_zero_stage(&c, 2);
    return c;
}

static void timed_fused_stage_fused_uses_the_entries(void **state)
{
    (void)state;
    head_fixture f;
    open_fixture(&f, true);
    parallel_config c = fused_stage();
    assert_true(costmodel_head_fused(&f.model, &c, 0));
    part_cost head = measured_head(&f, 1, 2);
    expect_phases(&f, &c, true, head.forward_s, head.backward_s);
    close_fixture(&f);
}

static void timed_fused_stage_unfused_gets_the_products_back(void **state)
{
    (void)state;
    head_fixture f;
    open_fixture(&f, true);
    part_cost head = measured_head(&f, 1, 2);
    /* without a roofline the products are 2 of the fused forward's 3
     * head products */
    double products = 2.0 / 3.0 * head.forward_s;
    parallel_config sharded = sharded_stage();
    parallel_config megatron = fused_stage();
    megatron.runtime = RUNTIME_MEGATRON;
    const parallel_config *cases[2] = {&sharded, &megatron};
    for (int i = 0; i < 2; i++) {
        assert_false(costmodel_head_fused(&f.model, cases[i], 0));
        assert_true(close_to(costs_of(&f, cases[i]).head_products_s,
                             products, 1e-12));
        expect_phases(&f, cases[i], true, head.forward_s - products,
                      head.backward_s + products);
    }
    /* tp 2: the profiler's tp-2 points were timed unfused */
    parallel_config tp2 = config_of(8, 2, 2, 1, 1);
    part_cost head2 = measured_head(&f, 2, 2);
    expect_phases(&f, &tp2, false, head2.forward_s, head2.backward_s);
    close_fixture(&f);
}

/* Today's case (every profile committed before head.fused) and the
 * plain one. */
static void timed_unfused_as_before(void **state)
{
    (void)state;
    head_fixture f;
    open_fixture(&f, false);
    part_cost head = measured_head(&f, 1, 2);
    parallel_config c = fused_stage();
    /* the efficiency model's head backward is all products */
    expect_phases(&f, &c, false, head.forward_s + head.backward_s, 0.0);
    c = sharded_stage();
    expect_phases(&f, &c, false, head.forward_s, head.backward_s);
    close_fixture(&f);
}

/* Micro-batch 3 between an unfused point (2) and a fused one (4, merged
 * in from a later profile): both taken unfused, then the fused stage
 * moves the products forward as for any unfused time. */
static void fused_and_unfused_points_meet_unfused(void **state)
{
    (void)state;
    head_fixture f;
    open_fixture(&f, false);
    profile_shape *shape = &f.cm.profiles[0].shapes[0];
    shape->points[profile_find_point(shape, 1, 4)].head_fused = true;
    part_cost two = measured_head(&f, 1, 2), four = measured_head(&f, 1, 4);
    parallel_config c = config_of(12, 3, 1, 1, 1);
    type_costs costs = costs_of(&f, &c);
    assert_false(costs.head_timed_fused);
    double four_forward = four.forward_s / 3.0;
    double four_backward = four.backward_s + 2.0 / 3.0 * four.forward_s;
    assert_true(close_to(costs.head_forward_s,
                         0.5 * two.forward_s + 0.5 * four_forward, 1e-12));
    assert_true(close_to(costs.head_backward_s,
                         0.5 * two.backward_s + 0.5 * four_backward, 1e-12));
    close_fixture(&f);
}

/* The fit reads a fused head's point by the fused kernels: its forward
 * is predicted with the backward's products (more than the plain
 * forward), and its backward, which the kernel list does not describe
 * (costmodel/roofline.c, time_is_usable), is left out of the fit. */
static void fit_reads_a_fused_point_fused(void **state)
{
    (void)state;
    profile p;
    make_profile(&p, "RF-TEST", 139.8, 1.0);
    p.backward_over_forward = 0.0; /* every backward measured */
    p.peak_tflops = 989.0;
    p.memory_bandwidth_GBps = 4800.0;
    p.sms = 132;
    roofline_params params = known_roofline_params();
    roofline_observation *plain = NULL, *fused = NULL;
    int plain_count, fused_count, plain_left_out, fused_left_out;
    pt_error err = {{0}};
    assert_int_equal(roofline_observations(&params, &p, &plain, &plain_count,
                                           &plain_left_out, &err), 0);
    for (int i = 0; i < p.shapes[0].point_count; i++)
        p.shapes[0].points[i].head_fused = p.shapes[0].points[i].tp == 1;
    assert_int_equal(roofline_observations(&params, &p, &fused, &fused_count,
                                           &fused_left_out, &err), 0);
    int heads = 0;
    for (int i = 0, j = 0; i < plain_count; i++) {
        const roofline_observation *a = &plain[i];
        bool fused_head = a->part == 2 && a->tp == 1;
        if (fused_head && a->backward)
            continue; /* left out */
        assert_true(j < fused_count);
        const roofline_observation *b = &fused[j++];
        assert_true(a->part == b->part && a->backward == b->backward &&
                    a->tp == b->tp && a->mbs == b->mbs);
        if (!fused_head) {
            assert_true(a->predicted_s == b->predicted_s);
            continue;
        }
        assert_true(b->predicted_s > a->predicted_s);
        heads++;
    }
    assert_int_equal(heads, 3);
    assert_int_equal(fused_count, plain_count - 3);
    assert_int_equal(fused_left_out, plain_left_out + 3);
    free(plain);
    free(fused);
    profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(timed_fused_stage_fused_uses_the_entries),
        cmocka_unit_test(timed_fused_stage_unfused_gets_the_products_back),
        cmocka_unit_test(timed_unfused_as_before),
        cmocka_unit_test(fused_and_unfused_points_meet_unfused),
        cmocka_unit_test(fit_reads_a_fused_point_fused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
