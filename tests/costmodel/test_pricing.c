/* Pricing one GPU type: profile look-up by shape, tp and micro-batch,
 * the efficiency model for shapes a profile lacks, TP communication,
 * recompute, and the notes that say what was stretched. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

static type_costs price(fixture *f, int type, parallel_config config)
{
    type_costs costs;
    pt_error err = {{0}};
    if (costmodel_type_costs(&f->cm, type, &config, &costs, &err) != 0)
        fail_msg("%s", err.message);
    return costs;
}

/* The fixture's layer forward at a measured (tp, mbs), in seconds. */
static double measured_layer(double layer_ms, int tp, int mbs)
{
    return layer_ms * 1e-3 * pow(mbs, 0.9) / pow(tp, 0.8);
}

static void measured_points_are_returned_exactly(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    assert_int_equal(f.cm.note_count, 0);
    type_costs a10 = price(&f, 1, config_of(8, 2, 2, 1, 1));
    assert_true(close_to(a10.layer_forward_s, measured_layer(2.4, 2, 2), 1e-12));
    assert_true(close_to(a10.layer_backward_s,
                         2.0 * measured_layer(2.4, 2, 2), 1e-12));
    assert_true(close_to(a10.embedding_forward_s,
                         0.2e-3 * pow(2, 0.9) / pow(2, 0.8), 1e-12));
    assert_true(close_to(a10.head_backward_s,
                         1.6e-3 * pow(2, 0.9) / pow(2, 0.8), 1e-12));
    /* 22.2 GiB usable minus 0.5 GiB workspace */
    assert_true(close_to(a10.memory_cap_bytes, 21.7 * PT_GIB, 1e-12));
    assert_true(a10.optimizer_s_per_param == 5e-11);
    assert_int_equal(f.cm.note_count, 0);
    fixture_close(&f);
}

static void measured_scaling_interpolates_between_micro_batches(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    /* mbs 3 halfway between the points at 2 and 4 */
    type_costs a100 = price(&f, 0, config_of(12, 3, 1, 1, 1));
    double expected = 0.5 * (measured_layer(1.6, 1, 2) +
                             measured_layer(1.6, 1, 4));
    assert_true(close_to(a100.layer_forward_s, expected, 1e-12));
    /* beyond the grid: linear from the largest point, 8 = 2 x 4 is not
       far outside, so no note */
    a100 = price(&f, 0, config_of(8, 8, 1, 1, 1));
    assert_true(close_to(a100.layer_forward_s,
                         2.0 * measured_layer(1.6, 1, 4), 1e-12));
    assert_int_equal(f.cm.note_count, 0);
    fixture_close(&f);
}

static void linear_scaling_uses_the_nearest_point(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    make_cluster(&f.cluster, 1, 1);
    make_profiles(f.profiles);
    f.profiles[0].mbs_scaling = MBS_SCALING_LINEAR;
    f.model = m;
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&f.cm, &f.model, &f.cluster,
                                                  f.profiles, &err), 0);
    /* mbs 3: log-distance to 4 (0.288) is less than to 2 (0.405) */
    type_costs a100 = price(&f, 0, config_of(12, 3, 1, 1, 1));
    assert_true(close_to(a100.layer_forward_s,
                         measured_layer(1.6, 1, 4) * 3.0 / 4.0, 1e-12));
    fixture_close(&f);
}

static void missing_tp_is_scaled_from_the_nearest_with_a_note(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    type_costs a100 = price(&f, 0, config_of(8, 1, 8, 1, 1));
    /* tp 8 from tp 4 x 4/8 */
    assert_true(close_to(a100.layer_forward_s,
                         measured_layer(1.6, 4, 1) * 0.5, 1e-12));
    assert_true(has_note_containing(&f.cm, "no tp 8 points"));
    fixture_close(&f);
}

static void far_extrapolation_is_noted_once(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    type_costs a10 = price(&f, 1, config_of(16, 16, 1, 1, 1));
    assert_true(close_to(a10.layer_forward_s,
                         4.0 * measured_layer(2.4, 1, 4), 1e-12));
    assert_int_equal(f.cm.note_count, 1);
    assert_true(has_note_containing(&f.cm, "A10-TEST: micro-batch 16"));
    assert_true(has_note_containing(&f.cm, "more than 2x outside"));
    price(&f, 1, config_of(16, 16, 1, 1, 1));
    assert_int_equal(f.cm.note_count, 1);
    fixture_close(&f);
}

static void notes_are_bounded(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    for (int mbs = 9; mbs < 60; mbs++)
        price(&f, 0, config_of(mbs, mbs, 1, 1, 1));
    assert_int_equal(f.cm.note_count, COSTMODEL_MAX_NOTES);
    assert_true(has_note_containing(&f.cm, "further notes left out"));
    fixture_close(&f);
}

static void unheld_shape_uses_the_efficiency_model(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    m.hidden = 2048;
    m.heads = 16;
    m.ffn_hidden = 8192;
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    assert_true(has_note_containing(&f.cm, "A100-TEST: the profile holds no "
                                           "layer shape hidden 2048"));
    assert_true(has_note_containing(&f.cm, "efficiency model"));
    /* fitted efficiency: achieved / peak averaged over the tp 1 points */
    double efficiency = 0.0;
    int mbss[3] = {1, 2, 4};
    for (int j = 0; j < 3; j++) {
        double flops = 2.0 * mbss[j] * 1024 *
                           (4.0 * 1600 * 1600 + 2.0 * 1600 * 6400) +
                       4.0 * mbss[j] * 1024.0 * 1024 * 1600;
        efficiency += flops / measured_layer(1.6, 1, mbss[j]) / 312e12 / 3.0;
    }
    /* layer forward FLOPs of the new shape at b = 2, tp = 2 */
    double flops = (2.0 * 2 * 1024 * (4.0 * 2048 * 2048 + 2.0 * 2048 * 8192) +
                    4.0 * 2 * 1024.0 * 1024 * 2048) / 2.0;
    parallel_config config = config_of(8, 2, 2, 1, 1);
    type_costs a100 = price(&f, 0, config);
    double allreduce = allreduce_time(2.0 * 1024 * 2048 * 2, 2,
                                      f.cluster.types[0].intra_node);
    /* FLOPs carry no communication: the TP all-reduces are added */
    assert_true(close_to(a100.layer_forward_s,
                         flops / (312e12 * efficiency) + 2.0 * allreduce,
                         1e-9));
    assert_true(close_to(a100.layer_backward_s,
                         2.0 * flops / (312e12 * efficiency) + 2.0 * allreduce,
                         1e-9));
    assert_true(a100.embedding_forward_s > 0.0 && a100.head_forward_s > 0.0);

    /* a given efficiency is used as is */
    fixture_close(&f);
    make_cluster(&f.cluster, 1, 1);
    make_profiles(f.profiles);
    f.profiles[0].flops_efficiency = 0.5;
    f.model = m;
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&f.cm, &f.model, &f.cluster,
                                                  f.profiles, &err), 0);
    a100 = price(&f, 0, config_of(8, 2, 1, 1, 1));
    assert_true(close_to(a100.layer_forward_s, 2.0 * flops / (312e12 * 0.5),
                         1e-12));
    fixture_close(&f);
}

static void no_shape_and_no_peak_fails_at_open(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    m.seq = 2048;
    fixture f;
    make_cluster(&f.cluster, 1, 1);
    make_profiles(f.profiles);
    f.profiles[1].peak_tflops = 0.0;
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&f.cm, &m, &f.cluster,
                                                  f.profiles, &err), -1);
    assert_non_null(strstr(err.message, "A10-TEST"));
    assert_non_null(strstr(err.message, "seq 2048"));
    profile_free(&f.profiles[0]);
    profile_free(&f.profiles[1]);
    cluster_free(&f.cluster);
}

static void tp_communication_is_added_only_when_not_measured(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    make_cluster(&f.cluster, 1, 1);
    make_profiles(f.profiles);
    f.profiles[1].layer_times_include_tp_comm = false;
    f.model = m;
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&f.cm, &f.model, &f.cluster,
                                                  f.profiles, &err), 0);
    parallel_config config = config_of(8, 1, 4, 1, 1);
    type_costs a100 = price(&f, 0, config), a10 = price(&f, 1, config);
    assert_true(close_to(a100.layer_forward_s, measured_layer(1.6, 4, 1),
                         1e-12));
    /* 2 all-reduces of b x s x h x 2 bytes = 3,276,800 bytes over 4 GPUs
       on the A10 node's 16 GB/s, 10 us link, forward and backward */
    double allreduce = 2.0 * 3.0 / 4.0 * 3276800.0 / 16e9 + 2.0 * 3.0 * 10e-6;
    assert_true(close_to(a10.layer_forward_s,
                         measured_layer(2.4, 4, 1) + 2.0 * allreduce, 1e-12));
    assert_true(close_to(a10.layer_backward_s,
                         2.0 * measured_layer(2.4, 4, 1) + 2.0 * allreduce,
                         1e-12));
    /* tp 1: nothing to add */
    a10 = price(&f, 1, config_of(8, 1, 1, 1, 1));
    assert_true(close_to(a10.layer_forward_s, measured_layer(2.4, 1, 1),
                         1e-12));
    fixture_close(&f);
}

static void measured_allreduce_curve_is_preferred(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    make_cluster(&f.cluster, 1, 1);
    make_profiles(f.profiles);
    f.profiles[0].layer_times_include_tp_comm = false;
    comm_sample samples[2] = {{.gpus = 2, .bytes = 1e6, .time_s = 100e-6},
                             {.gpus = 2, .bytes = 1e7, .time_s = 400e-6}};
    f.profiles[0].allreduce = (comm_curve){2, samples};
    f.model = m;
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&f.cm, &f.model, &f.cluster,
                                                  f.profiles, &err), 0);
    f.profiles[0].allreduce = (comm_curve){0, NULL}; /* ours, not a copy */
    type_costs a100 = price(&f, 0, config_of(8, 1, 2, 1, 1));
    /* 3,276,800 bytes: 100 us + (3,276,800 - 1e6) / 9e6 x 300 us */
    double allreduce = 100e-6 + (3276800.0 - 1e6) / 9e6 * 300e-6;
    assert_true(close_to(a100.layer_forward_s,
                         measured_layer(1.6, 2, 1) + 2.0 * allreduce, 1e-12));
    fixture_close(&f);
}

static void recompute_adds_a_forward_to_the_backward(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(8, 1, 1, 1, 1);
    type_costs plain = price(&f, 0, config);
    config.recompute = true;
    type_costs again = price(&f, 0, config);
    assert_true(close_to(again.layer_backward_s,
                         plain.layer_backward_s + plain.layer_forward_s, 1e-12));
    assert_true(again.layer_forward_s == plain.layer_forward_s);
    assert_true(again.head_backward_s == plain.head_backward_s);
    fixture_close(&f);
}

static void bad_type_index_fails(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(8, 1, 1, 1, 1);
    type_costs costs;
    pt_error err = {{0}};
    assert_int_equal(costmodel_type_costs(&f.cm, 2, &config, &costs, &err), -1);
    assert_non_null(strstr(err.message, "type 2"));
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(measured_points_are_returned_exactly),
        cmocka_unit_test(measured_scaling_interpolates_between_micro_batches),
        cmocka_unit_test(linear_scaling_uses_the_nearest_point),
        cmocka_unit_test(missing_tp_is_scaled_from_the_nearest_with_a_note),
        cmocka_unit_test(far_extrapolation_is_noted_once),
        cmocka_unit_test(notes_are_bounded),
        cmocka_unit_test(unheld_shape_uses_the_efficiency_model),
        cmocka_unit_test(no_shape_and_no_peak_fails_at_open),
        cmocka_unit_test(tp_communication_is_added_only_when_not_measured),
        cmocka_unit_test(measured_allreduce_curve_is_preferred),
        cmocka_unit_test(recompute_adds_a_forward_to_the_backward),
        cmocka_unit_test(bad_type_index_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
