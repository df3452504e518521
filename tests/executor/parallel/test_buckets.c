/*
 * The data-parallel reduction in buckets, on the CPU: a stage's buckets
 * cover its gradient buffer once, at tensor boundaries, last tensors
 * first, each within the cap unless one tensor alone is larger (a cap
 * below every tensor gives one bucket per tensor, a large one a single
 * bucket); and training with buckets of 256 bytes (dozens per stage)
 * gives bit for bit the losses, norms and parameters of one bucket, for
 * dp 2, dp 2 with ZeRO-1, and pp 2 x dp 2 with ZeRO-1 and tied
 * embeddings (the sums are element-wise in group order whatever the cut).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tiny_training.h"

static void make_stage(model_stage *stage)
{
    model_shape shape = tiny_shape();
    stage_spec spec = stage_spec_whole_model(&shape);
    pt_error err = {{0}};
    if (model_stage_create(stage, &shape, &spec, BACKEND_CPU, 1, 1, &err) !=
        0)
        fail_msg("stage: %s", err.message);
}

/* Whether `at` is where a tensor of the stage starts (or the end). */
static bool tensor_boundary(const model_stage *stage, size_t at)
{
    if (at == stage->param_count)
        return true;
    for (int t = 0; t < stage->tensor_count; t++)
        if (stage->tensors[t].offset == at)
            return true;
    return false;
}

/* Whether the bucket is exactly one tensor. */
static bool single_tensor(const model_stage *stage, pipeline_bucket bucket)
{
    for (int t = 0; t < stage->tensor_count; t++)
        if (stage->tensors[t].offset == bucket.offset &&
            stage->tensors[t].count == bucket.count)
            return true;
    return false;
}

/* The properties every cut must have; returns the bucket count. */
static int check_cut(const model_stage *stage, size_t cap_bytes)
{
    pipeline_buckets buckets;
    pt_error err = {{0}};
    assert_int_equal(pipeline_grad_buckets(stage, cap_bytes, &buckets, &err),
                     0);
    assert_true(buckets.count >= 1);
    size_t end = stage->param_count;
    for (int b = 0; b < buckets.count; b++) {
        pipeline_bucket bucket = buckets.buckets[b];
        /* last tensors first, no gap, no overlap */
        assert_int_equal(bucket.offset + bucket.count, end);
        assert_true(bucket.count > 0);
        assert_true(tensor_boundary(stage, bucket.offset));
        end = bucket.offset;
        /* within the cap, or one tensor alone */
        if (cap_bytes > 0 && bucket.count * sizeof(float) > cap_bytes)
            assert_true(single_tensor(stage, bucket));
    }
    assert_int_equal(end, 0);
    int count = buckets.count;
    pipeline_buckets_free(&buckets);
    return count;
}

static void buckets_cover_the_buffer_at_tensor_boundaries(void **state)
{
    (void)state;
    model_stage stage;
    make_stage(&stage);
    /* the default (25 MiB): one bucket for this tiny model */
    assert_int_equal(check_cut(&stage, 0), 1);
    /* a cap below every tensor: one bucket per tensor */
    assert_int_equal(check_cut(&stage, 1), stage.tensor_count);
    /* in between: more than one, fewer than the tensors */
    int some = check_cut(&stage, 4096);
    assert_true(some > 1 && some < stage.tensor_count);
    /* a larger cap never makes more buckets */
    assert_true(check_cut(&stage, 16384) <= some);
    /* the first bucket holds the buffer's last tensor */
    pipeline_buckets buckets;
    pt_error err = {{0}};
    assert_int_equal(pipeline_grad_buckets(&stage, 1, &buckets, &err), 0);
    const param_tensor *last = &stage.tensors[stage.tensor_count - 1];
    assert_int_equal(buckets.buckets[0].offset, last->offset);
    assert_int_equal(buckets.buckets[0].count, last->count);
    pipeline_buckets_free(&buckets);
    model_stage_destroy(&stage);
}

/* Three steps of a layout through the launcher with buckets of
 * bucket_bytes. */
static tiny_run train(int dp, int pp, bool zero, size_t bucket_bytes)
{
    parallel_config config = {.gbs = 4 * dp, .mbs = 1, .tp = 1, .dp = dp,
                              .pp = pp, .schedule = SCHEDULE_1F1B,
                              .distributed_optimizer = zero};
    train_config train = train_config_defaults();
    return tiny_train(&config, bucket_bytes, &train, 3);
}

static void check_same_training(int dp, int pp, bool zero)
{
    tiny_run one = train(dp, pp, zero, 0);
    tiny_run many = train(dp, pp, zero, 256);
    tiny_expect_same_bits(&one, &many, 3);
    tiny_run_free(&one);
    tiny_run_free(&many);
}

static void dp2_buckets_change_no_bit(void **state)
{
    (void)state;
    check_same_training(2, 1, false);
}

static void dp2_zero1_buckets_change_no_bit(void **state)
{
    (void)state;
    check_same_training(2, 1, true);
}

static void pp2_dp2_zero1_tied_buckets_change_no_bit(void **state)
{
    (void)state;
    check_same_training(2, 2, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buckets_cover_the_buffer_at_tensor_boundaries),
        cmocka_unit_test(dp2_buckets_change_no_bit),
        cmocka_unit_test(dp2_zero1_buckets_change_no_bit),
        cmocka_unit_test(pp2_dp2_zero1_tied_buckets_change_no_bit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
