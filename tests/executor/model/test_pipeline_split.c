/*
 * A model split into pipeline stages, activations and gradients passed
 * between them by hand, gives the loss and the gradients of the unsplit
 * model: the groundwork of the 1F1B runtime. Covers a 1-1 split, splits
 * with zero-layer stages (embedding alone, head alone, an empty middle
 * stage), tied and untied heads, several micro-batches in flight (one
 * activation slot each), and full activation recompute (also: the
 * activation bytes exec's memory check predicts are those allocated).
 *
 * The stages run the same ops in the same order as the whole model, so
 * losses and gradients must match bit for bit; the one exception is a
 * tied embedding, whose two gradient parts (embedding lookup, LM head)
 * are summed in another order once the head sits on another stage: that
 * sum must match within 1e-6 (plus 1e-6 relative).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "executor/run/run.h"

#include <stdlib.h>
#include <string.h>

#include "grad_check.h"

#define MBS 2
#define MICRO_BATCHES 3
#define WINDOW 5 /* seq + 1 */
#define MAX_STAGES 4

static model_shape tiny_shape(bool tied)
{
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 8,
                         .heads = 2, .ffn_hidden = 32, .seq = 4,
                         .vocab = 11, .tied_embeddings = tied};
    return shape;
}

static const uint32_t tokens[MICRO_BATCHES * MBS * WINDOW] = {
    3, 7, 1, 3, 10, 0, 5, 5, 9, 2,
    4, 4, 8, 1, 6,  2, 9, 0, 7, 3,
    10, 1, 2, 6, 5, 8, 3, 3, 0, 9,
};

static const uint32_t *micro_batch_tokens(int m)
{
    return tokens + (size_t)m * MBS * WINDOW;
}

/* The reference: the whole model, micro-batches accumulated. */
static void run_whole(model_stage *whole, float *losses)
{
    pt_error err;
    assert_int_equal(stage_zero_grads(whole, &err), 0);
    for (int m = 0; m < MICRO_BATCHES; m++) {
        stage_io io = {.mbs = MBS, .tokens = micro_batch_tokens(m),
                       .loss_scale = 1.0f / MICRO_BATCHES};
        assert_int_equal(stage_forward(whole, 0, &io, &losses[m], &err), 0);
        assert_int_equal(stage_backward(whole, 0, &io, &err), 0);
    }
}

/* All forwards first, each micro-batch in its own slot, then the
 * backwards in micro-batch order (the order 1F1B keeps too), so that the
 * gradients of successive micro-batches are summed in the whole model's
 * order and may be compared bit for bit. The activation of stage s is copied
 * into stage s + 1's own input buffer (as a receive would write it) for
 * even micro-batches and passed by pointer for odd ones. */
static void run_pipeline(model_stage *stages, int stage_count,
                         float *losses)
{
    pt_error err;
    for (int s = 0; s < stage_count; s++)
        assert_int_equal(stage_zero_grads(&stages[s], &err), 0);
    size_t activation = (size_t)MBS * 4 * 8;
    for (int m = 0; m < MICRO_BATCHES; m++) {
        const float *passed = NULL;
        for (int s = 0; s < stage_count; s++) {
            stage_io io = {.mbs = MBS, .tokens = micro_batch_tokens(m),
                           .input = passed};
            if (passed != NULL && m % 2 == 0) {
                float *receive = stage_input_buffer(&stages[s], m);
                memcpy(receive, passed, activation * sizeof(float));
                io.input = receive;
            }
            float loss = -1.0f;
            assert_int_equal(stage_forward(&stages[s], m, &io, &loss, &err),
                             0);
            if (stages[s].spec.has_head)
                losses[m] = loss;
            else
                assert_true(loss == 0.0f);
            passed = stage_output(&stages[s], m);
            assert_non_null(passed);
        }
    }
    for (int m = 0; m < MICRO_BATCHES; m++) {
        const float *gradient = NULL;
        for (int s = stage_count - 1; s >= 0; s--) {
            stage_io io = {.mbs = MBS, .tokens = micro_batch_tokens(m),
                           .output_grad = gradient,
                           .loss_scale = 1.0f / MICRO_BATCHES};
            assert_int_equal(stage_backward(&stages[s], m, &io, &err), 0);
            gradient = stage_input_grad(&stages[s]);
            if (s > 0)
                assert_non_null(gradient);
        }
    }
}

/* Gives the whole model random spread-0.3 parameters and each stage the
 * same values for the tensors it holds. */
static void share_parameters(model_stage *whole, model_stage *stages,
                             int stage_count)
{
    model_rng rng;
    model_rng_seed(&rng, 31);
    fill_normal(&rng, whole->params, whole->param_count, 0.3);
    for (int s = 0; s < stage_count; s++) {
        for (int i = 0; i < stages[s].tensor_count; i++) {
            const param_tensor *mine = &stages[s].tensors[i];
            const param_tensor *source = model_stage_find_tensor(
                whole, mine->tied_copy ? "token_embedding" : mine->name);
            assert_non_null(source);
            assert_int_equal(source->count, mine->count);
            memcpy(stages[s].params + mine->offset,
                   whole->params + source->offset,
                   mine->count * sizeof(float));
        }
    }
}

/* The gradient of one whole-model tensor as the stages hold it: its own
 * part plus, for a tied embedding, the head's copy on the last stage. */
static void compare_gradients(const model_stage *whole,
                              const model_stage *stages, int stage_count)
{
    int covered = 0;
    for (int s = 0; s < stage_count; s++) {
        for (int i = 0; i < stages[s].tensor_count; i++) {
            const param_tensor *mine = &stages[s].tensors[i];
            if (mine->tied_copy)
                continue; /* added to token_embedding below */
            const param_tensor *theirs =
                model_stage_find_tensor(whole, mine->name);
            assert_non_null(theirs);
            covered++;
            const float *expected = whole->grads + theirs->offset;
            const float *got = stages[s].grads + mine->offset;
            const param_tensor *copy =
                strcmp(mine->name, "token_embedding") == 0
                    ? model_stage_find_tensor(&stages[stage_count - 1],
                                              "lm_head_weight")
                    : NULL;
            if (copy != NULL && copy->tied_copy) {
                const float *head_part =
                    stages[stage_count - 1].grads + copy->offset;
                for (size_t k = 0; k < mine->count; k++) {
                    float sum = got[k] + head_part[k];
                    assert_float_equal(sum, expected[k],
                                       1e-6 + 1e-6 * fabsf(expected[k]));
                }
            } else {
                assert_memory_equal(got, expected,
                                    mine->count * sizeof(float));
            }
        }
    }
    assert_int_equal(covered, whole->tensor_count);
}

/* What exec's memory check predicts for a stage's activations is what
 * the cpu backend allocates, with full recompute or without; recompute
 * allocates less once a stage keeps several micro-batches of layers. */
static void expect_sized_as_allocated(const model_stage *stage)
{
    double predicted = 0.0, kept = 0.0;
    run_cpu_partial_stage_bytes(&stage->shape, &stage->spec, MBS,
                                stage->slot_count, &predicted);
    assert_true(predicted == (double)cpu_stage_activation_bytes(stage));
    stage_spec keep = stage->spec;
    keep.recompute_layers = false;
    run_cpu_partial_stage_bytes(&stage->shape, &keep, MBS, stage->slot_count,
                                &kept);
    if (stage->spec.recompute_layers &&
        stage->spec.last_layer > stage->spec.first_layer)
        assert_true(predicted < kept);
}

/* recompute: the stages run full activation recompute (the whole model
 * does not), which must not change a bit. */
static void check_split_with(const int *partition, int stage_count,
                             bool tied, bool recompute)
{
    model_shape shape = tiny_shape(tied);
    stage_spec whole_spec = stage_spec_whole_model(&shape);
    model_stage whole;
    model_stage stages[MAX_STAGES];
    pt_error err;
    assert_int_equal(model_stage_create(&whole, &shape, &whole_spec,
                                        BACKEND_CPU, MBS, 1, &err),
                     0);
    for (int s = 0; s < stage_count; s++) {
        stage_spec spec;
        assert_int_equal(stage_spec_from_partition(&shape, partition,
                                                   stage_count, s, &spec,
                                                   &err),
                         0);
        spec.recompute_layers = recompute;
        assert_int_equal(model_stage_create(&stages[s], &shape, &spec,
                                            BACKEND_CPU, MBS, MICRO_BATCHES,
                                            &err),
                         0);
        expect_sized_as_allocated(&stages[s]);
    }
    share_parameters(&whole, stages, stage_count);

    float whole_losses[MICRO_BATCHES], split_losses[MICRO_BATCHES];
    run_whole(&whole, whole_losses);
    run_pipeline(stages, stage_count, split_losses);
    for (int m = 0; m < MICRO_BATCHES; m++) {
        assert_true(whole_losses[m] > 1.0f); /* a real loss, not a stub */
        assert_true(split_losses[m] == whole_losses[m]);
    }
    compare_gradients(&whole, stages, stage_count);

    double whole_square_sum = 0.0;
    assert_int_equal(stage_grad_square_sum(&whole, &whole_square_sum, &err),
                     0);
    assert_true(whole_square_sum > 1e-3);
    for (int s = 0; s < stage_count; s++)
        model_stage_destroy(&stages[s]);
    model_stage_destroy(&whole);
}

static void check_split(const int *partition, int stage_count, bool tied)
{
    check_split_with(partition, stage_count, tied, false);
}

/* Full recompute keeps only each layer's input per micro-batch and runs
 * the layer's forward again before its backward, into one set of
 * activations: three micro-batches in flight share it. */
static void test_recompute_changes_nothing(void **state)
{
    (void)state;
    static const int whole[] = {2};
    static const int two[] = {1, 1};
    static const int ends_alone[] = {0, 2, 0};
    check_split_with(whole, 1, true, true);
    check_split_with(two, 2, true, true);
    check_split_with(two, 2, false, true);
    check_split_with(ends_alone, 3, true, true);
}

static void test_two_stages(void **state)
{
    (void)state;
    static const int partition[] = {1, 1};
    check_split(partition, 2, true);
    check_split(partition, 2, false);
}

/* The head alone on the last stage, or the embedding alone on the
 * first. */
static void test_zero_layer_end_stages(void **state)
{
    (void)state;
    static const int head_alone[] = {2, 0};
    static const int embedding_alone[] = {0, 2};
    static const int both_alone[] = {0, 2, 0};
    check_split(head_alone, 2, true);
    check_split(embedding_alone, 2, true);
    check_split(both_alone, 3, true);
    check_split(both_alone, 3, false);
}

/* A middle stage with no layers passes activations and gradients
 * through unchanged. */
static void test_empty_middle_stage(void **state)
{
    (void)state;
    static const int partition[] = {1, 0, 0, 1};
    check_split(partition, 4, true);

    model_shape shape = tiny_shape(true);
    stage_spec empty = {.first_layer = 1, .last_layer = 1};
    model_stage stage;
    pt_error err;
    assert_int_equal(
        model_stage_create(&stage, &shape, &empty, BACKEND_CPU, 1, 1, &err),
        0);
    assert_int_equal(stage.param_count, 0);
    float input[4 * 8], gradient[4 * 8];
    for (int i = 0; i < 32; i++) {
        input[i] = (float)i;
        gradient[i] = (float)(100 - i);
    }
    stage_io io = {.mbs = 1, .input = input, .output_grad = gradient};
    assert_int_equal(stage_forward(&stage, 0, &io, NULL, &err), 0);
    assert_memory_equal(stage_output(&stage, 0), input, sizeof input);
    assert_int_equal(stage_backward(&stage, 0, &io, &err), 0);
    assert_memory_equal(stage_input_grad(&stage), gradient, sizeof gradient);
    model_stage_destroy(&stage);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_stages),
        cmocka_unit_test(test_zero_layer_end_stages),
        cmocka_unit_test(test_empty_middle_stage),
        cmocka_unit_test(test_recompute_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
