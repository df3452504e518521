/*
 * AdamW against updates worked out by hand, weight decay only on
 * matrices, ZeRO-1 shards that step together as the whole optimizer,
 * the learning-rate schedule's values and the clipping factor.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"

/*
 * Two steps, lr 0.1, beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1.
 * Element 0 (decayed) starts at 1, element 1 (not decayed) at -2; both
 * see gradient 0.5, then -0.25 with grad_scale 2 (so -0.5).
 * Step 1: m = 0.1 x 0.5 = 0.05, v = 0.05 x 0.25 = 0.0125,
 *   m_hat = 0.05 / 0.1 = 0.5, v_hat = 0.0125 / 0.05 = 0.25, ratio 1;
 *   p0 = 1 - 0.1 (1 + 0.1 x 1) = 0.89;  p1 = -2 - 0.1 x 1 = -2.1.
 * Step 2: m = 0.045 - 0.05 = -0.005, v = 0.011875 + 0.0125 = 0.024375,
 *   m_hat = -0.005 / 0.19 = -0.0263158, v_hat = 0.024375 / 0.0975 = 0.25,
 *   ratio -0.0526316;
 *   p0 = 0.89 - 0.1 (-0.0526316 + 0.1 x 0.89) = 0.8863632;
 *   p1 = -2.1 - 0.1 (-0.0526316) = -2.0947368.
 * The 1e-6 tolerance covers fp32 rounding of these O(1) values.
 */
static void test_adamw_by_hand(void **state)
{
    (void)state;
    adamw_config config = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f};
    float decayed = 1.0f, plain = -2.0f;
    float m[2] = {0}, v[2] = {0};
    float grad = 0.5f;
    cpu_adamw_update(&decayed, &grad, &m[0], &v[0], 1, &config, 0.1f, 1.0f,
                     1, true);
    cpu_adamw_update(&plain, &grad, &m[1], &v[1], 1, &config, 0.1f, 1.0f, 1,
                     false);
    assert_float_equal(m[0], 0.05, 1e-7);
    assert_float_equal(v[0], 0.0125, 1e-7);
    assert_float_equal(decayed, 0.89, 1e-6);
    assert_float_equal(plain, -2.1, 1e-6);
    grad = -0.25f;
    cpu_adamw_update(&decayed, &grad, &m[0], &v[0], 1, &config, 0.1f, 2.0f,
                     2, true);
    cpu_adamw_update(&plain, &grad, &m[1], &v[1], 1, &config, 0.1f, 2.0f, 2,
                     false);
    assert_float_equal(m[0], -0.005, 1e-7);
    assert_float_equal(v[0], 0.024375, 1e-7);
    assert_float_equal(decayed, 0.8863632, 1e-6);
    assert_float_equal(plain, -2.0947368, 1e-6);

    adamw_config defaults = adamw_defaults();
    assert_float_equal(defaults.beta1, 0.9, 0.0);
    assert_float_equal(defaults.beta2, 0.95, 0.0);
    assert_float_equal(defaults.eps, 1e-8, 0.0);
}

/* With zero gradients AdamW moves nothing but the decay: matrices and
 * embeddings shrink by lr x weight_decay, biases and norms stay. */
static void test_decay_only_on_matrices(void **state)
{
    (void)state;
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 8,
                         .heads = 2, .ffn_hidden = 32, .seq = 4,
                         .vocab = 11, .tied_embeddings = false};
    stage_spec whole = stage_spec_whole_model(&shape);
    model_stage stage;
    pt_error err;
    assert_int_equal(
        model_stage_create(&stage, &shape, &whole, BACKEND_CPU, 1, 1, &err),
        0);
    model_rng rng;
    model_rng_seed(&rng, 5);
    for (size_t i = 0; i < stage.param_count; i++)
        stage.params[i] = (float)model_rng_normal(&rng);
    float *before = malloc(stage.param_count * sizeof *before);
    assert_non_null(before);
    memcpy(before, stage.params, stage.param_count * sizeof *before);
    assert_int_equal(stage_zero_grads(&stage, &err), 0);
    adamw_config config = adamw_defaults();
    assert_int_equal(stage_adamw_step(&stage, &config, 0.5f, 1.0f, &err), 0);
    assert_int_equal(stage.optimizer_steps, 1);
    int decayed = 0;
    for (int i = 0; i < stage.tensor_count; i++) {
        const param_tensor *t = &stage.tensors[i];
        float factor = t->weight_decay ? 1.0f - 0.5f * 0.1f : 1.0f;
        decayed += t->weight_decay;
        for (size_t k = 0; k < t->count; k++)
            assert_float_equal(stage.params[t->offset + k],
                               factor * before[t->offset + k], 1e-6);
    }
    /* embeddings, 4 matrices a layer, the untied head */
    assert_int_equal(decayed, 2 + 2 * 4 + 1);

    config.beta2 = 1.0f;
    assert_int_equal(stage_adamw_step(&stage, &config, 0.5f, 1.0f, &err), -1);
    assert_int_equal(stage.optimizer_steps, 1);
    free(before);
    model_stage_destroy(&stage);
}

/* ZeRO-1's shards cover the buffer once, in aligned runs, and three
 * shard stages stepping their own parts give the parameters of the
 * whole optimizer exactly (same element-wise arithmetic); their moments
 * hold only their part, and their gradient norms only their part. */
static void fill_normal(float *values, size_t count, uint64_t seed)
{
    model_rng rng;
    model_rng_seed(&rng, seed);
    for (size_t i = 0; i < count; i++)
        values[i] = (float)model_rng_normal(&rng);
}

static void test_sharded_optimizer_equals_whole(void **state)
{
    (void)state;
    size_t offsets[4];
    stage_optimizer_offsets(1000, 3, offsets);
    assert_true(offsets[0] == 0 && offsets[3] == 1000);
    assert_true(offsets[1] % 64 == 0 && offsets[2] % 64 == 0);
    stage_optimizer_offsets(100, 3, offsets); /* 2 runs for 3 shards */
    assert_true(offsets[1] == 64 && offsets[2] == 100 && offsets[3] == 100);

    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 8,
                         .heads = 2, .ffn_hidden = 32, .seq = 4,
                         .vocab = 11, .tied_embeddings = false};
    stage_spec spec = stage_spec_whole_model(&shape);
    model_stage whole, shards[3];
    pt_error err;
    adamw_config config = adamw_defaults();
    assert_int_equal(
        model_stage_create(&whole, &shape, &spec, BACKEND_CPU, 1, 1, &err), 0);
    size_t count = whole.param_count;
    fill_normal(whole.params, count, 5);
    fill_normal(whole.grads, count, 6);
    double whole_norm = 0.0, shard_norms = 0.0;
    assert_int_equal(stage_grad_square_sum(&whole, &whole_norm, &err), 0);
    assert_int_equal(stage_adamw_step(&whole, &config, 0.1f, 0.5f, &err), 0);
    float *gathered = calloc(count, sizeof *gathered);
    assert_non_null(gathered);
    size_t covered = 0;
    for (int i = 0; i < 3; i++) {
        spec.optimizer_shards = 3;
        spec.optimizer_shard = i;
        model_stage *shard = &shards[i];
        assert_int_equal(model_stage_create(shard, &shape, &spec, BACKEND_CPU,
                                            1, 1, &err),
                         0);
        assert_true(model_stage_buffer_count(shard, STAGE_ADAM_M) <
                    model_stage_buffer_count(shard, STAGE_PARAMS));
        fill_normal(shard->params, count, 5);
        fill_normal(shard->grads, count, 6);
        double norm = 0.0;
        assert_int_equal(stage_grad_square_sum(shard, &norm, &err), 0);
        shard_norms += norm;
        assert_int_equal(stage_adamw_step(shard, &config, 0.1f, 0.5f, &err),
                         0);
        memcpy(gathered + shard->optimizer_first,
               shard->params + shard->optimizer_first,
               shard->optimizer_count * sizeof *gathered);
        covered += shard->optimizer_count;
    }
    assert_true(covered == count);
    assert_memory_equal(gathered, whole.params, count * sizeof *gathered);
    assert_float_equal(shard_norms, whole_norm, 1e-9 * whole_norm);
    spec.optimizer_shard = 3;
    model_stage refused;
    assert_int_equal(
        model_stage_create(&refused, &shape, &spec, BACKEND_CPU, 1, 1, &err),
        -1);
    assert_non_null(strstr(err.message, "shard 3 of 3"));
    free(gathered);
    for (int i = 0; i < 3; i++)
        model_stage_destroy(&shards[i]);
    model_stage_destroy(&whole);
}

/*
 * max 1, min 0.1, warm-up 10 steps, decay until step 110:
 * warm-up rises by 0.1 a step from 0.1 at step 0 to 1 at step 9;
 * the cosine starts at 1 (step 10), is half-way, 0.55, at step 60, a
 * quarter of the way, 0.1 + 0.9 (1 + cos(pi/4)) / 2 = 0.86820, at step
 * 35, and reaches 0.1 at step 110, where it stays.
 */
static void test_lr_schedule(void **state)
{
    (void)state;
    lr_schedule schedule = {.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 10,
                            .decay_steps = 110};
    pt_error err;
    assert_int_equal(lr_schedule_check(&schedule, &err), 0);
    assert_float_equal(lr_schedule_at(&schedule, 0), 0.1, 1e-12);
    assert_float_equal(lr_schedule_at(&schedule, 4), 0.5, 1e-12);
    assert_float_equal(lr_schedule_at(&schedule, 9), 1.0, 1e-12);
    assert_float_equal(lr_schedule_at(&schedule, 10), 1.0, 1e-12);
    assert_float_equal(lr_schedule_at(&schedule, 35), 0.868198, 1e-6);
    assert_float_equal(lr_schedule_at(&schedule, 60), 0.55, 1e-12);
    assert_float_equal(lr_schedule_at(&schedule, 110), 0.1, 1e-12);
    assert_float_equal(lr_schedule_at(&schedule, 100000), 0.1, 1e-12);
    for (long step = 10; step < 110; step++)
        assert_true(lr_schedule_at(&schedule, step + 1) <
                    lr_schedule_at(&schedule, step));

    lr_schedule flat = {.max_lr = 3e-3, .min_lr = 3e-3};
    assert_int_equal(lr_schedule_check(&flat, &err), 0);
    assert_float_equal(lr_schedule_at(&flat, 0), 3e-3, 0.0);
    assert_float_equal(lr_schedule_at(&flat, 50), 3e-3, 0.0);

    lr_schedule defaults = lr_schedule_defaults();
    assert_int_equal(lr_schedule_check(&defaults, &err), 0);
    assert_float_equal(lr_schedule_at(&defaults, 1999), 6e-4, 1e-12);

    lr_schedule bad = schedule;
    bad.min_lr = 2.0;
    assert_int_equal(lr_schedule_check(&bad, &err), -1);
    assert_non_null(strstr(err.message, "min_lr"));
    bad = schedule;
    bad.decay_steps = 5;
    assert_int_equal(lr_schedule_check(&bad, &err), -1);
    assert_non_null(strstr(err.message, "decay_steps"));
    bad = schedule;
    bad.warmup_steps = -1;
    assert_int_equal(lr_schedule_check(&bad, &err), -1);
}

static void test_clip_coefficient(void **state)
{
    (void)state;
    assert_float_equal(clip_coefficient(2.0, 1.0f), 0.5, 1e-6);
    assert_float_equal(clip_coefficient(10.0, 0.5f), 0.05, 1e-7);
    assert_true(clip_coefficient(0.5, 1.0f) == 1.0f);
    assert_true(clip_coefficient(0.0, 1.0f) == 1.0f);
    assert_true(clip_coefficient(100.0, 0.0f) == 1.0f); /* clipping off */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_by_hand),
        cmocka_unit_test(test_decay_only_on_matrices),
        cmocka_unit_test(test_sharded_optimizer_equals_whole),
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_clip_coefficient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
