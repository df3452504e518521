/*
 * The whole model's gradient against finite differences of its loss, on
 * a tiny GPT (2 layers, hidden 8, 2 heads, seq 4, vocab 11), tied and
 * untied, and on a tiny Llama of the same size (RMSNorm, SwiGLU, rotary
 * positions, 4 heads sharing 2 key/value heads, no biases or biases on
 * q, k and v only, its own head matrix); and gradient accumulation over
 * micro-batches.
 *
 * Parameters are drawn with spread 0.3 rather than GPT-2's 0.02 so that
 * every path (attention scores, GELU curvature, layer-norm scaling)
 * carries gradients large enough to be checked. The tied model checks
 * every one of its ~1,900 parameters, the untied one every fifth (and
 * each tensor's last). Tolerance atol 2e-4, rtol 2e-2: the loss is an
 * fp32 mean of O(1) terms (rounding about 3e-7 per evaluation, ~1e-4 once
 * divided by the step and extrapolated, see grad_check.h); the worst
 * element observed sits at about a fifth of the tolerance, while a wrong
 * gradient term is off by its own size (1e-3 .. 1).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "grad_check.h"

#define MODEL_ATOL 2e-4
#define MODEL_RTOL 2e-2
#define MBS 2

static model_shape tiny_shape(bool tied)
{
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 8,
                         .heads = 2, .ffn_hidden = 32, .seq = 4,
                         .vocab = 11, .tied_embeddings = tied};
    return shape;
}

/* The same size, Llama's layer: the untied head has its own matrix and
 * gradient (lm_head_weight). */
static model_shape tiny_llama_shape(model_bias bias)
{
    model_shape shape = {.name = "tiny-llama", .layers = 2, .hidden = 8,
                         .heads = 4, .kv_heads = 2, .ffn_hidden = 12,
                         .seq = 4, .vocab = 11, .tied_embeddings = false,
                         .norm = MODEL_NORM_RMSNORM, .norm_eps = 1e-5,
                         .mlp = MODEL_MLP_SWIGLU,
                         .positions = MODEL_POSITIONS_ROPE,
                         .rope_base = 10000.0, .bias = bias};
    return shape;
}

/* Two windows of seq + 1 = 5 tokens, with repeats. */
static const uint32_t batch_tokens[MBS * 5] = {3, 7, 1, 3, 10,
                                               0, 5, 5, 9, 2};

/* Spread-0.3 parameters, norm weights around 1. */
static void randomise(model_stage *stage, uint64_t seed)
{
    model_rng rng;
    model_rng_seed(&rng, seed);
    fill_normal(&rng, stage->params, stage->param_count, 0.3);
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        if (strstr(t->name, "ln1_weight") || strstr(t->name, "ln2_weight") ||
            strstr(t->name, "final_norm_weight"))
            for (size_t k = 0; k < t->count; k++)
                stage->params[t->offset + k] += 1.0f;
    }
}

static model_stage *new_stage(const model_shape *shape, int mbs)
{
    model_stage *stage = calloc(1, sizeof *stage);
    assert_non_null(stage);
    stage_spec whole = stage_spec_whole_model(shape);
    pt_error err;
    assert_int_equal(model_stage_create(stage, shape, &whole, BACKEND_CPU,
                                        mbs, 1, &err),
                     0);
    return stage;
}

static void free_stage(model_stage *stage)
{
    model_stage_destroy(stage);
    free(stage);
}

static double loss_objective(void *context)
{
    model_stage *stage = context;
    stage_io io = {.mbs = MBS, .tokens = batch_tokens, .loss_scale = 1.0f};
    float loss = 0.0f;
    pt_error err;
    assert_int_equal(stage_forward(stage, 0, &io, &loss, &err), 0);
    return loss;
}

/* Checks every stride-th parameter of every tensor of the shape's model
 * (all ~1,900 of the tied GPT's with stride 1), always including each
 * tensor's first and last. */
static void check_shape_gradients(const model_shape *shape, uint64_t seed,
                                  size_t stride)
{
    model_stage *stage = new_stage(shape, MBS);
    randomise(stage, seed);
    pt_error err;
    stage_io io = {.mbs = MBS, .tokens = batch_tokens, .loss_scale = 1.0f};
    float loss = 0.0f;
    assert_int_equal(stage_zero_grads(stage, &err), 0);
    assert_int_equal(stage_forward(stage, 0, &io, &loss, &err), 0);
    assert_int_equal(stage_backward(stage, 0, &io, &err), 0);
    float *analytic = malloc(stage->param_count * sizeof *analytic);
    assert_non_null(analytic);
    assert_int_equal(model_stage_read(stage, STAGE_GRADS, analytic, &err), 0);

    size_t *sample = malloc(stage->param_count * sizeof *sample);
    assert_non_null(sample);
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t sample_count = 0;
        for (size_t k = 0; k < t->count; k += stride)
            sample[sample_count++] = k;
        if (sample[sample_count - 1] != t->count - 1)
            sample[sample_count++] = t->count - 1;
        double worst = worst_gradient_error(
            t->name, loss_objective, stage, stage->params + t->offset,
            analytic + t->offset, sample_count, sample, MODEL_ATOL,
            MODEL_RTOL);
        assert_true(worst < 1.0);
    }
    free(sample);
    /* A test that cannot fail proves nothing: the gradients checked must
     * not all be tiny. */
    double square_sum = 0.0;
    assert_int_equal(stage_grad_square_sum(stage, &square_sum, &err), 0);
    assert_true(square_sum > 1e-2);
    free(analytic);
    free_stage(stage);
}

static void check_gradients(bool tied, size_t stride)
{
    model_shape shape = tiny_shape(tied);
    check_shape_gradients(&shape, tied ? 21 : 22, stride);
}

static void test_tied_gradients(void **state)
{
    (void)state;
    check_gradients(true, 1);
}

static void test_untied_gradients(void **state)
{
    (void)state;
    check_gradients(false, 5); /* a sample: the paths are the tied ones' */
}

/* Every parameter of the Llama model, its untied head's included. */
static void test_llama_gradients(void **state)
{
    (void)state;
    model_shape shape = tiny_llama_shape(MODEL_BIAS_NONE);
    model_stage *stage = new_stage(&shape, MBS);
    const param_tensor *head = model_stage_find_tensor(stage,
                                                       "lm_head_weight");
    assert_non_null(head);
    assert_false(head->tied_copy);
    assert_null(model_stage_find_tensor(stage, "position_embedding"));
    assert_null(model_stage_find_tensor(stage, "layers.0.ln1_bias"));
    free_stage(stage);
    check_shape_gradients(&shape, 24, 1);
    shape = tiny_llama_shape(MODEL_BIAS_QKV); /* Qwen's q, k, v biases */
    check_shape_gradients(&shape, 25, 1);
}

static float *read_grads(const model_stage *stage)
{
    float *grads = malloc(stage->param_count * sizeof *grads);
    assert_non_null(grads);
    pt_error err;
    assert_int_equal(model_stage_read(stage, STAGE_GRADS, grads, &err), 0);
    return grads;
}

static void forward_backward(model_stage *stage, int mbs,
                             const uint32_t *tokens, float loss_scale,
                             float *loss)
{
    pt_error err;
    stage_io io = {.mbs = mbs, .tokens = tokens, .loss_scale = loss_scale};
    assert_int_equal(stage_forward(stage, 0, &io, loss, &err), 0);
    assert_int_equal(stage_backward(stage, 0, &io, &err), 0);
}

/* Two micro-batches of one sequence with loss_scale 1/2 accumulate to the
 * gradient of one micro-batch holding both; doubling loss_scale doubles
 * the gradients exactly (a power of two scales without rounding). */
static void test_accumulation(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    model_stage *stage = new_stage(&shape, MBS);
    randomise(stage, 23);
    pt_error err;
    float loss_both = 0.0f, loss_first = 0.0f, loss_second = 0.0f;

    assert_int_equal(stage_zero_grads(stage, &err), 0);
    forward_backward(stage, MBS, batch_tokens, 1.0f, &loss_both);
    float *together = read_grads(stage);

    assert_int_equal(stage_zero_grads(stage, &err), 0);
    forward_backward(stage, 1, batch_tokens, 0.5f, &loss_first);
    forward_backward(stage, 1, batch_tokens + 5, 0.5f, &loss_second);
    float *accumulated = read_grads(stage);

    assert_float_equal(loss_both, 0.5 * (loss_first + loss_second), 1e-6);
    for (size_t i = 0; i < stage->param_count; i++)
        assert_float_equal(accumulated[i], together[i],
                           1e-6 + 1e-5 * fabsf(together[i]));

    assert_int_equal(stage_zero_grads(stage, &err), 0);
    forward_backward(stage, MBS, batch_tokens, 2.0f, &loss_both);
    float *doubled = read_grads(stage);
    for (size_t i = 0; i < stage->param_count; i++)
        assert_true(doubled[i] == 2.0f * together[i]);
    free(together);
    free(accumulated);
    free(doubled);
    free_stage(stage);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied_gradients),
        cmocka_unit_test(test_untied_gradients),
        cmocka_unit_test(test_llama_gradients),
        cmocka_unit_test(test_accumulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
