/*
 * Training end to end on the cpu backend: a tiny GPT trained repeatedly on
 * one fixed batch must memorise it, and a step must report the gradient
 * norm and learning rate it used; under llm.c's recipe (bf16 gradients)
 * the gradients are bf16 values and the batch is memorised as well; a
 * step whose loss or norm is not finite is refused with nothing applied.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "executor/executor.h"

#define MBS 4
#define MICRO_BATCHES 2
#define SEQ 8
#define VOCAB 11

static model_shape tiny_shape(void)
{
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 16,
                         .heads = 2, .ffn_hidden = 64, .seq = SEQ,
                         .vocab = VOCAB, .tied_embeddings = true};
    return shape;
}

/* micro_batches x mbs windows of seq + 1 random tokens. */
static uint32_t *random_batch(uint64_t seed)
{
    size_t count = (size_t)MICRO_BATCHES * MBS * (SEQ + 1);
    uint32_t *tokens = malloc(count * sizeof *tokens);
    assert_non_null(tokens);
    model_rng rng;
    model_rng_seed(&rng, seed);
    for (size_t i = 0; i < count; i++)
        tokens[i] = (uint32_t)(model_rng_next(&rng) % VOCAB);
    return tokens;
}

/* The whole tiny model on the cpu backend, initialised from seed;
 * bf16_grads: llm.c's recipe. */
static void open_tiny_stage(model_stage *stage, bool bf16_grads,
                            uint64_t seed)
{
    model_shape shape = tiny_shape();
    stage_spec whole = stage_spec_whole_model(&shape);
    whole.bf16_grads = bf16_grads;
    pt_error err;
    assert_int_equal(model_stage_create(stage, &shape, &whole, BACKEND_CPU,
                                        MBS, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(stage, seed, &err), 0);
}

static train_config memorise_config(void)
{
    train_config config = train_config_defaults();
    config.schedule.max_lr = 1e-2;
    config.schedule.min_lr = 1e-3;
    config.schedule.warmup_steps = 10;
    config.schedule.decay_steps = 100;
    return config;
}

/*
 * 64 random tokens to predict from their prefixes: at initialisation
 * (GPT-2's small weights) the prediction is near uniform, loss about
 * ln 11 = 2.40 nats; 100 steps of AdamW on that one batch must bring it
 * below 0.5 (it reaches about 0.06), having fallen by more than 0.5
 * nats by step 50 (it is near 0.33 there).
 */
static void test_loss_falls(void **state)
{
    (void)state;
    model_stage stage;
    pt_error err;
    open_tiny_stage(&stage, false, 1234);
    uint32_t *tokens = random_batch(99);
    train_config config = memorise_config();
    float first_loss = 0.0f, loss_at_50 = 0.0f;
    step_result result = {0};
    for (int step = 0; step < 100; step++) {
        assert_int_equal(train_step(&stage, &config, tokens, MICRO_BATCHES,
                                    MBS, &result, &err),
                         0);
        assert_true(isfinite(result.loss) && isfinite(result.grad_norm));
        if (step == 0)
            first_loss = result.loss;
        if (step == 50)
            loss_at_50 = result.loss;
    }
    assert_float_equal(first_loss, logf(VOCAB), 0.1);
    assert_true(loss_at_50 < first_loss - 0.5f);
    assert_true(result.loss < loss_at_50);
    assert_true(result.loss < 0.5f);
    assert_int_equal(stage.optimizer_steps, 100);
    free(tokens);
    model_stage_destroy(&stage);
}

/* The step reports the pre-clipping norm of the averaged gradients (left
 * in the buffer) and the schedule's rate for its step. */
static void test_step_reports(void **state)
{
    (void)state;
    model_shape shape = tiny_shape();
    stage_spec whole = stage_spec_whole_model(&shape);
    model_stage stage;
    pt_error err;
    assert_int_equal(model_stage_create(&stage, &shape, &whole, BACKEND_CPU,
                                        MBS, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&stage, 7, &err), 0);
    uint32_t *tokens = random_batch(5);
    train_config config = memorise_config();
    config.max_grad_norm = 1e-3f; /* clips every step */
    step_result result;
    assert_int_equal(train_step(&stage, &config, tokens, MICRO_BATCHES, MBS,
                                &result, &err),
                     0);
    double square_sum = 0.0;
    assert_int_equal(stage_grad_square_sum(&stage, &square_sum, &err), 0);
    assert_float_equal(result.grad_norm, sqrt(square_sum),
                       1e-6 * sqrt(square_sum));
    assert_true(result.grad_norm > 1e-3f);
    assert_float_equal(result.learning_rate, 1e-3, 1e-9); /* 1e-2 x 1/10 */
    assert_int_equal(train_step(&stage, &config, tokens, MICRO_BATCHES, MBS,
                                &result, &err),
                     0);
    assert_float_equal(result.learning_rate, 2e-3, 1e-9);

    assert_int_equal(
        train_step(&stage, &config, tokens, 0, MBS, &result, &err), -1);
    free(tokens);
    model_stage_destroy(&stage);
}

/* spec.bf16_grads: after a step every gradient is a bfloat16 (its low
 * 16 bits zero), and the loss falls as under fp32 gradients. */
static void test_bf16_grads(void **state)
{
    (void)state;
    model_stage stage;
    pt_error err;
    open_tiny_stage(&stage, true, 1234);
    uint32_t *tokens = random_batch(99);
    train_config config = memorise_config();
    step_result result = {0};
    for (int step = 0; step < 100; step++) {
        assert_int_equal(train_step(&stage, &config, tokens, MICRO_BATCHES,
                                    MBS, &result, &err),
                         0);
        if (step == 0) {
            const float *grads = model_stage_buffer(&stage, STAGE_GRADS);
            size_t count = model_stage_buffer_count(&stage, STAGE_GRADS);
            size_t nonzero = 0;
            for (size_t i = 0; i < count; i++) {
                uint32_t bits;
                memcpy(&bits, &grads[i], sizeof bits);
                assert_int_equal(bits & 0xffffu, 0);
                nonzero += bits != 0;
            }
            assert_true(nonzero > count / 2);
        }
    }
    assert_true(result.loss < 0.5f);
    free(tokens);
    model_stage_destroy(&stage);
}

/* The stage's output under spec.bf16_residual (the embedding and every
 * layer, no head): the residual stream rounded to bf16 as the cuda
 * backend stores it, so every value is a bfloat16, and within bf16's
 * rounding of the fp32 stream's. */
static void open_headless(model_stage *stage, bool bf16_residual)
{
    model_shape shape = tiny_shape();
    stage_spec spec = stage_spec_whole_model(&shape);
    spec.has_head = false;
    spec.bf16_residual = bf16_residual;
    pt_error err;
    assert_int_equal(model_stage_create(stage, &shape, &spec, BACKEND_CPU,
                                        MBS, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(stage, 77, &err), 0);
}

static void test_bf16_residual(void **state)
{
    (void)state;
    model_stage rounded, exact;
    pt_error err;
    open_headless(&rounded, true);
    open_headless(&exact, false);
    uint32_t *tokens = random_batch(5);
    stage_io io = {.mbs = MBS, .tokens = tokens, .loss_scale = 1.0f};
    float loss = 0.0f;
    assert_int_equal(stage_forward(&rounded, 0, &io, &loss, &err), 0);
    assert_int_equal(stage_forward(&exact, 0, &io, &loss, &err), 0);
    const float *got = stage_output(&rounded, 0);
    const float *want = stage_output(&exact, 0);
    size_t count = (size_t)MBS * SEQ * tiny_shape().hidden;
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &got[i], sizeof bits);
        assert_int_equal(bits & 0xffffu, 0);
        diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
    }
    assert_true(diff > 0.0 && sqrt(diff / norm) < 1e-2);
    free(tokens);
    model_stage_destroy(&rounded);
    model_stage_destroy(&exact);
}

/* A NaN parameter makes the loss and the norm NaN: the step is refused
 * and nothing of it applied (parameters, moments, the step count). */
static void test_non_finite_refused(void **state)
{
    (void)state;
    model_stage stage;
    pt_error err;
    open_tiny_stage(&stage, false, 3);
    uint32_t *tokens = random_batch(8);
    train_config config = memorise_config();
    step_result result;
    assert_int_equal(train_step(&stage, &config, tokens, MICRO_BATCHES, MBS,
                                &result, &err),
                     0);
    const param_tensor *t = model_stage_find_tensor(&stage,
                                                    "final_norm_weight");
    assert_non_null(t);
    float nan_value = NAN;
    assert_int_equal(model_stage_write_range(&stage, STAGE_PARAMS, t->offset,
                                             1, &nan_value, &err),
                     0);
    size_t bytes = stage.param_count * sizeof(float);
    float *before = malloc(3 * bytes);
    assert_non_null(before);
    memcpy(before, stage.params, bytes);
    memcpy((char *)before + bytes, stage.adam_m, bytes);
    memcpy((char *)before + 2 * bytes, stage.adam_v, bytes);
    assert_int_equal(train_step(&stage, &config, tokens, MICRO_BATCHES, MBS,
                                &result, &err),
                     -1);
    assert_non_null(strstr(err.message, "not finite"));
    assert_int_equal(stage.optimizer_steps, 1);
    assert_memory_equal(before, stage.params, bytes);
    assert_memory_equal((char *)before + bytes, stage.adam_m, bytes);
    assert_memory_equal((char *)before + 2 * bytes, stage.adam_v, bytes);
    free(before);
    free(tokens);
    model_stage_destroy(&stage);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_step_reports),
        cmocka_unit_test(test_bf16_grads),
        cmocka_unit_test(test_bf16_residual),
        cmocka_unit_test(test_non_finite_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
