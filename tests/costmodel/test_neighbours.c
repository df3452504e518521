/* Slices of one GPU priced between their profile at rest and beside busy
 * neighbours by the neighbours' busy share (costmodel/neighbours.c,
 * docs/cost-model.md section 12): a profile at rest equal to the busy
 * one changes nothing, a stage whose neighbours are its own ranks pays
 * the busy price, a pipeline's stages sit at the fixed point
 * rest + share x (busy - rest), and GPUs that are not slices keep their
 * price; a device's memory_limit_gib caps its type's memory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

#define SLICES 4

/* One node of four 16-SM slices of GPU 0, whose busy profile is layer_ms
 * 2.0 and its profile at rest 1.2 (embedding and head alike scaled). */
typedef struct slices {
    model_shape model;
    cluster cluster;
    profile busy, rest;
    costmodel cm;
} slices;

/* The fixture's model, cluster and profiles, the cost model not open. */
static void slices_make(slices *f, bool sliced)
{
    memset(f, 0, sizeof *f);
    f->model = gpt2_xl();
    make_cluster(&f->cluster, 1, 0);
    f->cluster.type_count = 1;
    node_type *type = &f->cluster.types[0];
    pt_copy_string(type->gpu, sizeof type->gpu, "BUSY");
    type->intra_node = link_of(100.0, 10.0);
    if (sliced) {
        type->device_count = SLICES;
        for (int i = 0; i < SLICES; i++)
            type->devices[i] = (device_spec){.index = 0, .sm_limit = 16};
    }
    make_profile(&f->busy, "BUSY", 139.8, 2.0);
    make_profile(&f->rest, "REST", 139.8, 1.2);
}

/* The cost model over slices_make's fixture, with its profile at rest
 * (rest_override's, or the fixture's) when with_rest. */
static void slices_open_model(slices *f, bool with_rest,
                              const profile *rest_override)
{
    pt_error err = {{0}};
    if (costmodel_open_with_profiles(&f->cm, &f->model, &f->cluster,
                                     &f->busy, &err) != 0 ||
        (with_rest && costmodel_set_rest_profile(
                          &f->cm, 0, rest_override ? rest_override : &f->rest,
                          &err) != 0))
        fail_msg("%s", err.message);
}

static void slices_open(slices *f, bool sliced, bool with_rest,
                        const profile *rest_override)
{
    slices_make(f, sliced);
    slices_open_model(f, with_rest, rest_override);
}

static void slices_close(slices *f)
{
    costmodel_close(&f->cm);
    profile_free(&f->busy);
    profile_free(&f->rest);
    cluster_free(&f->cluster);
}

static parallel_config slice_config(int tp, int dp, int pp, int gbs)
{
    return (parallel_config){.gbs = gbs, .mbs = 1, .tp = tp, .dp = dp,
                             .pp = pp, .schedule = SCHEDULE_1F1B,
                             .precision = PRECISION_BF16};
}

static void estimate_of(costmodel *cm, const parallel_config *config,
                        estimate *out)
{
    int order[1] = {0};
    int partition[SLICES];
    for (int s = 0; s < config->pp; s++)
        partition[s] = 48 / config->pp;
    pt_error err = {{0}};
    if (costmodel_estimate(cm, config, order, 1, partition, false, out,
                           &err) != 0)
        fail_msg("%s", err.message);
}

static bool near(double a, double b, double rel)
{
    return fabs(a - b) <= rel * fabs(b);
}

/* The estimate with a profile at rest equals the busy one's, stage by
 * stage: on slices (`sliced`) or whole GPUs, with the rest profile the
 * busy one itself (`rest_is_busy`) or the slower-at-rest fixture's. */
static void expect_busy_estimate(bool sliced, bool rest_is_busy,
                                 parallel_config config)
{
    slices plain, rest;
    slices_open(&plain, sliced, false, NULL);
    slices_open(&rest, sliced, true, rest_is_busy ? &plain.busy : NULL);
    estimate a, b;
    estimate_of(&plain.cm, &config, &a);
    estimate_of(&rest.cm, &config, &b);
    assert_true(near(b.step_time_s, a.step_time_s, 1e-12));
    for (int s = 0; s < config.pp; s++)
        assert_true(near(b.stages[s].forward_s, a.stages[s].forward_s,
                         1e-12));
    estimate_free(&a), estimate_free(&b);
    slices_close(&plain), slices_close(&rest);
}

/* A profile at rest equal to the busy one: the estimate of a pipeline is
 * the busy estimate, stage by stage. */
static void rest_equal_to_busy_changes_nothing(void **state)
{
    (void)state;
    expect_busy_estimate(true, true, slice_config(1, 1, 4, 8));
}

/* tp 4 on one stage: every neighbour is a rank of the stage, busy with
 * it, so the share is 1 and the busy price stands. */
static void neighbours_of_one_stage_are_busy(void **state)
{
    (void)state;
    expect_busy_estimate(true, false, slice_config(4, 1, 1, 4));
}

/* pp 4 on four slices: each stage's forward and backward are the rest
 * price plus the share of the busy one's excess, the share the mean of
 * the three other stages' duty (equal SMs) over the final step: a fixed
 * point, within the iteration's 0.01 % on the step. */
static void pipeline_sits_at_the_fixed_point(void **state)
{
    (void)state;
    slices busy, at_rest, mixed;
    slices_open(&busy, true, false, NULL);
    slices_open(&mixed, true, true, NULL);
    slices_open(&at_rest, true, false, NULL);
    parallel_config config = slice_config(1, 1, 4, 8);
    estimate hi, lo, e;
    estimate_of(&busy.cm, &config, &hi);
    estimate_of(&mixed.cm, &config, &e);
    /* the price at rest alone: the rest profile as the type's own */
    costmodel_close(&at_rest.cm);
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&at_rest.cm,
                                                  &at_rest.model,
                                                  &at_rest.cluster,
                                                  &at_rest.rest, &err),
                     0);
    estimate_of(&at_rest.cm, &config, &lo);
    assert_true(e.step_time_s < hi.step_time_s);
    assert_true(e.step_time_s > lo.step_time_s);
    /* the note is there from the profile's loading on (threads share cm) */
    bool noted = false;
    for (int i = 0; i < mixed.cm.note_count; i++)
        noted = noted || strstr(mixed.cm.notes[i], "section 12") != NULL;
    assert_true(noted);
    int m = 8;
    for (int s = 0; s < 4; s++) {
        double others = 0.0;
        for (int j = 0; j < 4; j++)
            if (j != s)
                others += m * (e.stages[j].forward_s + e.stages[j].backward_s) /
                          e.step_time_s;
        double share = others / 3.0;
        double forward = lo.stages[s].forward_s +
                         share * (hi.stages[s].forward_s -
                                  lo.stages[s].forward_s);
        double backward = lo.stages[s].backward_s +
                          share * (hi.stages[s].backward_s -
                                   lo.stages[s].backward_s);
        if (!near(e.stages[s].forward_s, forward, 2e-3) ||
            !near(e.stages[s].backward_s, backward, 2e-3))
            fail_msg("stage %d: %.6f / %.6f s, the fixed point %.6f / %.6f",
                     s, e.stages[s].forward_s, e.stages[s].backward_s,
                     forward, backward);
    }
    estimate_free(&hi), estimate_free(&lo), estimate_free(&e);
    slices_close(&busy), slices_close(&at_rest), slices_close(&mixed);
}

/* GPUs that are not slices of one GPU (no devices entries) keep the
 * busy price even with a profile at rest given. */
static void whole_gpus_keep_their_price(void **state)
{
    (void)state;
    expect_busy_estimate(false, false, slice_config(1, 1, 4, 8));
}

/* A device of the cluster file with memory_limit_gib (exec's cap) holds
 * no more than the smallest cap of its type, noted; without caps the
 * profile's memory stands. */
static void capped_devices_price_their_cap(void **state)
{
    (void)state;
    parallel_config config = slice_config(1, 1, 4, 8);
    slices capped, plain;
    slices_open(&plain, true, true, NULL);
    slices_make(&capped, true);
    for (int i = 0; i < SLICES; i++)
        capped.cluster.types[0].devices[i].memory_limit_gib =
            i == 2 ? 12.0 : 16.0;
    slices_open_model(&capped, true, NULL);
    estimate a, b;
    estimate_of(&plain.cm, &config, &a);
    estimate_of(&capped.cm, &config, &b);
    for (int s = 0; s < config.pp; s++) {
        assert_true(near(a.stages[s].memory_cap_bytes,
                         139.8 * PT_GIB, 1e-12));
        assert_true(near(b.stages[s].memory_cap_bytes, 12.0 * PT_GIB,
                         1e-12));
        assert_true(near(b.stages[s].peak_memory_bytes,
                         a.stages[s].peak_memory_bytes, 1e-12));
    }
    assert_true(near(b.step_time_s, a.step_time_s, 1e-12));
    bool noted = false;
    for (int i = 0; i < capped.cm.note_count; i++)
        noted = noted || strstr(capped.cm.notes[i], "memory_limit_gib") != NULL;
    assert_true(noted);
    estimate_free(&a), estimate_free(&b);
    slices_close(&plain), slices_close(&capped);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rest_equal_to_busy_changes_nothing),
        cmocka_unit_test(neighbours_of_one_stage_are_busy),
        cmocka_unit_test(pipeline_sits_at_the_fixed_point),
        cmocka_unit_test(whole_gpus_keep_their_price),
        cmocka_unit_test(capped_devices_price_their_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
