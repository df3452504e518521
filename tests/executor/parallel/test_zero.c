/*
 * ZeRO-2, ZeRO-3 and optimizer offload on the CPU, three steps of a tiny
 * model through the threads launcher: ZeRO-2 (gradients reduce-scattered
 * at every micro-batch) trains as plain data parallelism does, within
 * rounding (the sums are ordered differently), for dp 2 and for pp 2 x
 * dp 2 with tied embeddings; ZeRO-3 (weights gathered before every
 * forward and backward, zeroed outside the shard in between) gives
 * ZeRO-2's results bit for bit, so the gathers bring back every weight;
 * offload (AdamW on host copies) gives the device step's results bit for
 * bit on the cpu backend, alone and with ZeRO-3, and its moments read
 * back through model_stage_read. Under ZeRO-2/3 the cpu backend keeps
 * the gradients of the rank's shard and one buffer per unit kind (also
 * at tp 2 x dp 2), and a step through them is a step through whole
 * gradients. The range wrappers refuse bad ranges.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tiny_training.h"

#define STEPS 3

typedef tiny_run zero_run;
#define run_free tiny_run_free

static zero_run train_tp(int tp, int dp, int pp, int zero, bool offload)
{
    parallel_config config = {.gbs = 4 * dp, .mbs = 1, .tp = tp, .dp = dp,
                              .pp = pp, .schedule = SCHEDULE_1F1B,
                              .offload_optimizer = offload};
    parallel_set_zero_stage(&config, zero);
    train_config train = train_config_defaults();
    train.schedule.max_lr = 1e-2;
    train.schedule.warmup_steps = 0;
    return tiny_train(&config, 512, &train, STEPS);
}

static zero_run train(int dp, int pp, int zero, bool offload)
{
    return train_tp(1, dp, pp, zero, offload);
}

static void expect_equal_bits(const zero_run *a, const zero_run *b)
{
    tiny_expect_same_bits(a, b, STEPS);
}

/* ZeRO-3 (rank 0 holds its parameters' shard, the first of the buffer)
 * against ZeRO-2 (all of them): the same bits where both hold them. */
static void expect_zero3_bits(const zero_run *zero2, const zero_run *zero3)
{
    zero_run shard = *zero2;
    assert_true(zero3->count < zero2->count);
    shard.count = zero3->count;
    tiny_expect_same_bits(&shard, zero3, STEPS);
}

static bool near(double a, double b, double relative, double absolute)
{
    return fabs(a - b) <= relative * fmax(fabs(a), fabs(b)) + absolute;
}

/* The same training up to the order of the sums. */
static void expect_close(const zero_run *a, const zero_run *b)
{
    for (int s = 0; s < STEPS; s++) {
        if (!near(a->steps[s].loss, b->steps[s].loss, 1e-5, 2e-6) ||
            !near(a->steps[s].grad_norm, b->steps[s].grad_norm, 1e-5, 2e-6))
            fail_msg("step %d: loss %.9g against %.9g, norm %.9g against "
                     "%.9g", s, a->steps[s].loss, b->steps[s].loss,
                     a->steps[s].grad_norm, b->steps[s].grad_norm);
    }
    assert_int_equal(a->count, b->count);
    for (size_t i = 0; i < a->count; i++)
        if (!near(a->params[i], b->params[i], 1e-5, 1e-5))
            fail_msg("parameter %zu: %.9g against %.9g", i, a->params[i],
                     b->params[i]);
}

/* The tiny model's units: a layer (12 tensors), the embeddings (31 + 8
 * rows of 16), the head (the final norm; the head is tied). */
#define TINY_LAYER_FLOATS (2 * 16 + 3 * 16 * 16 + 3 * 16 + 16 * 16 + 16 + \
                           2 * 16 + 64 * 16 + 64 + 16 * 64 + 16)
#define TINY_EMBEDDING_FLOATS ((31 + 8) * 16)

static void zero2_and_zero3_train_as_plain_dp(void **state)
{
    (void)state;
    zero_run plain = train(2, 1, 0, false);
    zero_run zero2 = train(2, 1, 2, false);
    zero_run zero3 = train(2, 1, 3, false);
    expect_close(&plain, &zero2);
    expect_zero3_bits(&zero2, &zero3);
    /* plain dp keeps every gradient; ZeRO-2/3 the shard's (the moments'
     * range) and one buffer per unit kind; ZeRO-3 its parameters so too */
    assert_int_equal(zero2.param_unit_bytes, 0);
    assert_int_equal(zero3.count, zero3.moment_count);
    assert_int_equal(zero3.param_unit_bytes, zero3.unit_bytes);
    assert_int_equal(plain.grad_count, plain.count);
    assert_int_equal(plain.unit_bytes, 0);
    for (const zero_run *z = &zero2; z != NULL; z = z == &zero2 ? &zero3
                                                                : NULL) {
        assert_int_equal(z->grad_count, z->moment_count);
        assert_true(z->grad_count <= zero2.count / 2 + 64);
        assert_int_equal(z->unit_bytes,
                         4 * (TINY_LAYER_FLOATS + TINY_EMBEDDING_FLOATS +
                              2 * 16));
    }
    run_free(&plain);
    run_free(&zero2);
    run_free(&zero3);
}

static void zero2_and_zero3_with_tied_embeddings_over_stages(void **state)
{
    (void)state;
    zero_run plain = train(2, 2, 0, false);
    zero_run zero2 = train(2, 2, 2, false);
    zero_run zero3 = train(2, 2, 3, false);
    expect_close(&plain, &zero2);
    expect_zero3_bits(&zero2, &zero3);
    run_free(&plain);
    run_free(&zero2);
    run_free(&zero3);
}

/* One step of the whole tiny model as shard 1 of 2, its gradients whole
 * or (shard_gradients) its shard's only, through the unit buffers with
 * no sink: one micro-batch adds each gradient to zeros once either way,
 * so loss, norm and parameters are the same bits; exec's memory check
 * predicts what either allocates. */
static step_result shard_step(bool by_unit, float **params, size_t *count,
                              size_t *grads)
{
    model_shape shape = tiny_shape();
    stage_spec spec = stage_spec_whole_model(&shape);
    spec.optimizer_shards = 2;
    spec.optimizer_shard = 1;
    spec.shard_gradients = by_unit;
    model_stage stage;
    pt_error err = {{0}};
    if (model_stage_create(&stage, &shape, &spec, BACKEND_CPU, 2, 1,
                           &err) != 0 ||
        model_stage_init_parameters(&stage, 5, &err) != 0)
        fail_msg("stage: %s", err.message);
    assert_true(stage.grads_by_unit == by_unit);
    /* exec's memory check sizes what the stage holds */
    double activations = 0.0;
    double predicted = run_cpu_partial_stage_bytes(&shape, &spec, 2, 1,
                                                   &activations);
    double held = 4.0 * (double)model_stage_buffer_count(&stage,
                                                         STAGE_PARAMS) +
                  8.0 * (double)stage.optimizer_count +
                  4.0 * (double)model_stage_buffer_count(&stage,
                                                          STAGE_GRADS) +
                  (double)cpu_stage_unit_bytes(&stage, STAGE_GRADS) +
                  (double)cpu_stage_activation_bytes(&stage);
    assert_true(predicted == held);
    uint32_t tokens[2 * 9];
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        tokens[i] = (uint32_t)((i * 7 + 3) % 31);
    train_config config = train_config_defaults();
    step_result result = {0};
    if (train_step(&stage, &config, tokens, 1, 2, &result, &err) != 0)
        fail_msg("step: %s", err.message);
    *count = stage.param_count;
    *params = malloc(*count * sizeof **params);
    memcpy(*params, stage.params, *count * sizeof **params);
    *grads = model_stage_buffer_count(&stage, STAGE_GRADS);
    model_stage_destroy(&stage);
    return result;
}

/* ZeRO-3's stage as shard 1 of 2 holds its parameters' run and one
 * buffer per unit kind, as exec's memory check predicts. */
static void sharded_parameters_are_sized_as_predicted(void **state)
{
    (void)state;
    model_shape shape = tiny_shape();
    stage_spec spec = stage_spec_whole_model(&shape);
    spec.optimizer_shards = 2;
    spec.optimizer_shard = 1;
    spec.shard_gradients = spec.shard_parameters = true;
    model_stage stage;
    pt_error err = {{0}};
    assert_int_equal(
        model_stage_create(&stage, &shape, &spec, BACKEND_CPU, 2, 1, &err),
        0);
    assert_true(stage.params_by_unit && stage.grads_by_unit);
    assert_int_equal(model_stage_buffer_count(&stage, STAGE_PARAMS),
                     stage.optimizer_count);
    assert_int_equal(cpu_stage_unit_bytes(&stage, STAGE_PARAMS),
                     4 * (TINY_LAYER_FLOATS + TINY_EMBEDDING_FLOATS + 2 * 16));
    double activations = 0.0;
    double predicted = run_cpu_partial_stage_bytes(&shape, &spec, 2, 1,
                                                   &activations);
    double held = 4.0 * (double)stage.optimizer_count * 2.0 +
                  2.0 * (double)cpu_stage_unit_bytes(&stage, STAGE_PARAMS) +
                  8.0 * (double)stage.optimizer_count +
                  (double)cpu_stage_activation_bytes(&stage);
    assert_true(predicted == held);
    model_stage_destroy(&stage);
}

static void sharded_gradients_are_the_whole_backwards(void **state)
{
    (void)state;
    float *whole = NULL, *sharded = NULL;
    size_t count = 0, whole_grads = 0, shard_grads = 0;
    step_result a = shard_step(false, &whole, &count, &whole_grads);
    step_result b = shard_step(true, &sharded, &count, &shard_grads);
    assert_memory_equal(&a, &b, sizeof a);
    assert_memory_equal(whole, sharded, count * sizeof *whole);
    assert_true(shard_grads < whole_grads / 2 + 64);
    free(whole);
    free(sharded);
}

/* tp 2 x dp 2: each tp shard's gradients sharded over its dp group (the
 * replicated tensors' norms counted once through the shard's run). */
static void zero2_with_tensor_parallelism(void **state)
{
    (void)state;
    zero_run plain = train_tp(2, 2, 1, 0, false);
    zero_run zero2 = train_tp(2, 2, 1, 2, false);
    expect_close(&plain, &zero2);
    assert_int_equal(zero2.grad_count, zero2.moment_count);
    assert_true(zero2.grad_count < plain.grad_count);
    run_free(&plain);
    run_free(&zero2);
}

static void offload_steps_as_the_backend_does(void **state)
{
    (void)state;
    zero_run device = train(1, 2, 0, false);
    zero_run host = train(1, 2, 0, true);
    expect_equal_bits(&device, &host);
    run_free(&device);
    run_free(&host);
    zero_run zero3 = train(2, 1, 3, false);
    zero_run zero3_host = train(2, 1, 3, true);
    expect_equal_bits(&zero3, &zero3_host);
    /* the host step cut over three threads: the same, element-wise */
    setenv("PARTITA_OFFLOAD_THREADS", "3", 1);
    zero_run threaded = train(1, 2, 0, true);
    unsetenv("PARTITA_OFFLOAD_THREADS");
    zero_run device_again = train(1, 2, 0, false);
    expect_equal_bits(&device_again, &threaded);
    run_free(&zero3);
    run_free(&zero3_host);
    run_free(&threaded);
    run_free(&device_again);
}

static void ranges_are_checked(void **state)
{
    (void)state;
    model_shape shape = tiny_shape();
    stage_spec spec = stage_spec_whole_model(&shape);
    model_stage stage;
    pt_error err = {{0}};
    assert_int_equal(
        model_stage_create(&stage, &shape, &spec, BACKEND_CPU, 1, 1, &err),
        0);
    float host[4] = {1, 2, 3, 4};
    size_t n = stage.param_count;
    assert_int_equal(model_stage_write_range(&stage, STAGE_PARAMS, n - 4, 4,
                                             host, &err),
                     0);
    assert_true(stage.params[n - 1] == 4.0f);
    assert_int_equal(model_stage_zero_range(&stage, STAGE_PARAMS, n - 2, 2,
                                            &err),
                     0);
    assert_true(stage.params[n - 1] == 0.0f && stage.params[n - 3] == 2.0f);
    assert_int_equal(model_stage_read_range(&stage, STAGE_PARAMS, n - 3, 4,
                                            host, &err),
                     -1);
    assert_non_null(strstr(err.message, "outside"));
    assert_int_equal(model_stage_zero_range(&stage, STAGE_ADAM_M, 0, 1, &err),
                     -1);
    assert_non_null(strstr(err.message, "params or grads"));
    model_stage_destroy(&stage);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zero2_and_zero3_train_as_plain_dp),
        cmocka_unit_test(zero2_and_zero3_with_tied_embeddings_over_stages),
        cmocka_unit_test(zero2_with_tensor_parallelism),
        cmocka_unit_test(sharded_gradients_are_the_whole_backwards),
        cmocka_unit_test(sharded_parameters_are_sized_as_predicted),
        cmocka_unit_test(offload_steps_as_the_backend_does),
        cmocka_unit_test(ranges_are_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
