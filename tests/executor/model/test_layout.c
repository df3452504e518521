/*
 * The parameter buffer's layout, stage specs, initialisation, the
 * generator, and the errors a stage reports for bad input.
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

static model_shape gpt2_small(bool tied)
{
    model_shape shape = {.name = "gpt2-124m", .layers = 12, .hidden = 768,
                         .heads = 12, .ffn_hidden = 3072, .seq = 1024,
                         .vocab = 50257, .tied_embeddings = tied};
    return shape;
}

static model_shape tiny_shape(void)
{
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 8,
                         .heads = 2, .ffn_hidden = 32, .seq = 4,
                         .vocab = 11, .tied_embeddings = true};
    return shape;
}

static param_tensor *layout_of(const model_shape *shape,
                               const stage_spec *spec, int *count,
                               size_t *floats)
{
    pt_error err;
    *count = stage_parameter_layout(shape, spec, NULL, floats, &err);
    assert_true(*count > 0);
    param_tensor *table = calloc((size_t)*count, sizeof *table);
    assert_non_null(table);
    assert_int_equal(stage_parameter_layout(shape, spec, table, NULL, &err),
                     *count);
    return table;
}

/* GPT-2 small has 124,439,808 parameters with the head tied (the figure
 * of the released checkpoint); the layout must agree with it and with
 * common's count, and tile the buffer without gaps. */
static void test_gpt2_small_layout(void **state)
{
    (void)state;
    model_shape shape = gpt2_small(true);
    stage_spec whole = stage_spec_whole_model(&shape);
    int count = 0;
    size_t floats = 0;
    param_tensor *table = layout_of(&shape, &whole, &count, &floats);
    assert_int_equal(floats, 124439808);
    assert_true((double)floats == model_parameter_count(&shape));
    assert_int_equal(count, 2 + 12 * 12 + 2);
    assert_string_equal(table[0].name, "token_embedding");
    assert_string_equal(table[1].name, "position_embedding");
    assert_string_equal(table[2].name, "layers.0.ln1_weight");
    assert_string_equal(table[4].name, "layers.0.attn_qkv_weight");
    assert_int_equal(table[4].rows, 3 * 768);
    assert_int_equal(table[4].cols, 768);
    assert_string_equal(table[count - 1].name, "final_norm_bias");
    size_t expected_offset = 0;
    for (int i = 0; i < count; i++) {
        assert_int_equal(table[i].offset, expected_offset);
        assert_int_equal(table[i].count,
                         (size_t)table[i].rows * table[i].cols);
        assert_true(table[i].weight_decay == (table[i].rows > 1));
        assert_false(table[i].tied_copy);
        expected_offset += table[i].count;
    }
    assert_int_equal(expected_offset, floats);
    free(table);

    shape = gpt2_small(false);
    whole = stage_spec_whole_model(&shape);
    table = layout_of(&shape, &whole, &count, &floats);
    assert_int_equal(floats, 124439808 + 50257 * 768);
    assert_true((double)floats == model_parameter_count(&shape));
    assert_string_equal(table[count - 1].name, "lm_head_weight");
    assert_false(table[count - 1].tied_copy);
    free(table);
}

/* Split 5-7: the stages' layers add up, the last holds a tied copy of the
 * embedding, and together they hold one embedding more than the whole. */
static void test_split_layout(void **state)
{
    (void)state;
    model_shape shape = gpt2_small(true);
    int partition[] = {5, 7};
    stage_spec first, last;
    pt_error err;
    assert_int_equal(
        stage_spec_from_partition(&shape, partition, 2, 0, &first, &err), 0);
    assert_int_equal(
        stage_spec_from_partition(&shape, partition, 2, 1, &last, &err), 0);
    assert_true(first.has_embedding && !first.has_head);
    assert_true(!last.has_embedding && last.has_head);
    assert_int_equal(first.first_layer, 0);
    assert_int_equal(first.last_layer, 5);
    assert_int_equal(last.first_layer, 5);
    assert_int_equal(last.last_layer, 12);
    int first_count = 0, last_count = 0;
    size_t first_floats = 0, last_floats = 0;
    param_tensor *first_table =
        layout_of(&shape, &first, &first_count, &first_floats);
    param_tensor *last_table =
        layout_of(&shape, &last, &last_count, &last_floats);
    assert_string_equal(last_table[0].name, "layers.5.ln1_weight");
    assert_string_equal(last_table[last_count - 1].name, "lm_head_weight");
    assert_true(last_table[last_count - 1].tied_copy);
    assert_int_equal(first_floats + last_floats,
                     124439808 + (size_t)50257 * 768);
    free(first_table);
    free(last_table);
}

static void test_spec_errors(void **state)
{
    (void)state;
    model_shape shape = tiny_shape();
    pt_error err;
    stage_spec spec;
    int short_partition[] = {1, 0};
    assert_int_equal(stage_spec_from_partition(&shape, short_partition, 2, 0,
                                               &spec, &err),
                     -1);
    assert_non_null(strstr(err.message, "1 layers"));
    int partition[] = {1, 1};
    assert_int_equal(
        stage_spec_from_partition(&shape, partition, 2, 2, &spec, &err), -1);
    int negative[] = {3, -1};
    assert_int_equal(
        stage_spec_from_partition(&shape, negative, 2, 0, &spec, &err), -1);

    stage_spec beyond = {.first_layer = 1, .last_layer = 3};
    assert_int_equal(stage_parameter_layout(&shape, &beyond, NULL, NULL, &err),
                     -1);
    assert_non_null(strstr(err.message, "[1, 3)"));
    model_shape odd = shape;
    odd.heads = 3;
    stage_spec whole = stage_spec_whole_model(&odd);
    assert_int_equal(stage_parameter_layout(&odd, &whole, NULL, NULL, &err),
                     -1);
    assert_non_null(strstr(err.message, "divisible"));
}

static void test_backends(void **state)
{
    (void)state;
    pt_error err;
    backend_kind kind;
    assert_int_equal(backend_parse("cpu", &kind, &err), 0);
    assert_int_equal(kind, BACKEND_CPU);
    assert_int_equal(backend_parse("cuda", &kind, &err), 0);
    assert_int_equal(kind, BACKEND_CUDA);
    assert_int_equal(backend_parse("tpu", &kind, &err), -1);
    assert_non_null(strstr(err.message, "tpu"));
    assert_non_null(backend_find(BACKEND_CPU, &err));
    model_shape shape = tiny_shape();
    stage_spec whole = stage_spec_whole_model(&shape);
    model_stage stage;
    /* The cuda backend exists when the build found nvcc; either way a
     * stage on it fails with a reason where no GPU can take it (CI). */
    if (backend_find(BACKEND_CUDA, &err) == NULL) {
        assert_non_null(strstr(err.message, "not built"));
        assert_int_equal(model_stage_create(&stage, &shape, &whole,
                                            BACKEND_CUDA, 1, 1, &err),
                         -1);
    } else if (model_stage_create(&stage, &shape, &whole, BACKEND_CUDA, 1, 1,
                                  &err) == 0) {
        model_stage_destroy(&stage);
    } else {
        assert_true(strlen(err.message) > 0);
        print_message("cuda stage refused: %s\n", err.message);
    }
    assert_int_equal(
        model_stage_create(&stage, &shape, &whole, BACKEND_CPU, 0, 1, &err),
        -1);
}

/* splitmix64 from state 0 starts with 0xE220A8397B1DCDAF (the published
 * reference sequence); the normals have mean 0 and variance 1. */
static void test_rng(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 0);
    assert_true(model_rng_next(&rng) == 0xE220A8397B1DCDAFull);
    model_rng_seed(&rng, 42);
    double sum = 0.0, square_sum = 0.0;
    int samples = 20000;
    for (int i = 0; i < samples; i++) {
        double u = model_rng_uniform(&rng);
        assert_true(u >= 0.0 && u < 1.0);
        double z = model_rng_normal(&rng);
        sum += z;
        square_sum += z * z;
    }
    /* standard errors: 0.007 for the mean, 0.01 for the variance */
    assert_float_equal(sum / samples, 0.0, 0.03);
    assert_float_equal(square_sum / samples, 1.0, 0.05);
}

static double spread_of(const float *values, size_t count)
{
    double square_sum = 0.0;
    for (size_t i = 0; i < count; i++)
        square_sum += (double)values[i] * values[i];
    return sqrt(square_sum / count);
}

/* GPT-2's initialisation, and the same values in a split as in the
 * whole model. */
static void test_init(void **state)
{
    (void)state;
    model_shape shape = {.name = "init", .layers = 2, .hidden = 64,
                         .heads = 4, .ffn_hidden = 256, .seq = 8,
                         .vocab = 50, .tied_embeddings = true};
    pt_error err;
    stage_spec whole_spec = stage_spec_whole_model(&shape);
    model_stage whole, again, late;
    assert_int_equal(model_stage_create(&whole, &shape, &whole_spec,
                                        BACKEND_CPU, 1, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&whole, 7, &err), 0);
    const param_tensor *embedding =
        model_stage_find_tensor(&whole, "token_embedding");
    const param_tensor *qkv =
        model_stage_find_tensor(&whole, "layers.1.attn_qkv_weight");
    const param_tensor *proj =
        model_stage_find_tensor(&whole, "layers.1.mlp_proj_weight");
    const param_tensor *bias =
        model_stage_find_tensor(&whole, "layers.0.mlp_fc_bias");
    const param_tensor *norm =
        model_stage_find_tensor(&whole, "final_norm_weight");
    assert_non_null(embedding);
    assert_null(model_stage_find_tensor(&whole, "lm_head_weight"));
    /* 3200 to 49152 samples: the spreads land within a few percent */
    assert_float_equal(
        spread_of(whole.params + embedding->offset, embedding->count), 0.02,
        0.002);
    assert_float_equal(spread_of(whole.params + qkv->offset, qkv->count),
                       0.02, 0.001);
    assert_float_equal(spread_of(whole.params + proj->offset, proj->count),
                       0.02 / 2.0, 0.0005);
    for (size_t i = 0; i < bias->count; i++)
        assert_true(whole.params[bias->offset + i] == 0.0f);
    for (size_t i = 0; i < norm->count; i++)
        assert_true(whole.params[norm->offset + i] == 1.0f);

    /* same seed, same values; another seed, others */
    assert_int_equal(model_stage_create(&again, &shape, &whole_spec,
                                        BACKEND_CPU, 1, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&again, 7, &err), 0);
    assert_memory_equal(whole.params, again.params,
                        whole.param_count * sizeof(float));
    assert_int_equal(model_stage_init_parameters(&again, 8, &err), 0);
    assert_memory_not_equal(whole.params, again.params,
                            whole.param_count * sizeof(float));

    /* a last stage with layer 1 and the head: its tensors equal the
     * whole model's, its tied copy equals the embedding */
    stage_spec late_spec = {.first_layer = 1, .last_layer = 2,
                            .has_embedding = false, .has_head = true};
    assert_int_equal(model_stage_create(&late, &shape, &late_spec,
                                        BACKEND_CPU, 1, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&late, 7, &err), 0);
    for (int i = 0; i < late.tensor_count; i++) {
        const param_tensor *mine = &late.tensors[i];
        const param_tensor *theirs = model_stage_find_tensor(
            &whole, mine->tied_copy ? "token_embedding" : mine->name);
        assert_non_null(theirs);
        assert_memory_equal(late.params + mine->offset,
                            whole.params + theirs->offset,
                            mine->count * sizeof(float));
    }
    model_stage_destroy(&whole);
    model_stage_destroy(&again);
    model_stage_destroy(&late);
}

/* Bad input comes back as an error, never a crash. */
static void test_stage_errors(void **state)
{
    (void)state;
    model_shape shape = tiny_shape();
    stage_spec whole_spec = stage_spec_whole_model(&shape);
    model_stage stage;
    pt_error err;
    assert_int_equal(model_stage_create(&stage, &shape, &whole_spec,
                                        BACKEND_CPU, 2, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&stage, 1, &err), 0);
    uint32_t tokens[2 * 5] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    stage_io io = {.mbs = 2, .tokens = tokens, .loss_scale = 1.0f};
    float loss = 0.0f;

    assert_int_equal(stage_backward(&stage, 0, &io, &err), -1);
    assert_non_null(strstr(err.message, "without a forward"));
    assert_int_equal(stage_forward(&stage, 0, &io, &loss, &err), 0);
    assert_true(loss > 0.0f);
    assert_int_equal(stage_backward(&stage, 0, &io, &err), 0);
    /* the probabilities became gradients: a second backward is refused */
    assert_int_equal(stage_backward(&stage, 0, &io, &err), -1);

    tokens[7] = 11;
    assert_int_equal(stage_forward(&stage, 0, &io, &loss, &err), -1);
    assert_non_null(strstr(err.message, "token 11 at sequence 1, position 2"));
    tokens[7] = 7;
    assert_int_equal(stage_forward(&stage, 1, &io, &loss, &err), -1);
    assert_non_null(strstr(err.message, "slot 1"));
    io.mbs = 3;
    assert_int_equal(stage_forward(&stage, 0, &io, &loss, &err), -1);
    assert_non_null(strstr(err.message, "capacity is 2"));
    io.mbs = 2;
    io.tokens = NULL;
    assert_int_equal(stage_forward(&stage, 0, &io, &loss, &err), -1);

    train_config config = train_config_defaults();
    stage_spec part = {.first_layer = 0, .last_layer = 1,
                       .has_embedding = true, .has_head = false};
    model_stage partial;
    assert_int_equal(model_stage_create(&partial, &shape, &part, BACKEND_CPU,
                                        2, 1, &err),
                     0);
    step_result result;
    assert_int_equal(
        train_step(&partial, &config, tokens, 1, 2, &result, &err), -1);
    assert_non_null(strstr(err.message, "whole model"));
    model_stage_destroy(&partial);
    model_stage_destroy(&stage);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_small_layout),
        cmocka_unit_test(test_split_layout),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_backends),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_stage_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
