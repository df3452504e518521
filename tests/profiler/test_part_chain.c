/*
 * The profiler's part chain (profiler/part_chain.c) on the cpu backend:
 * its parameters are drawn alike in every chain (the draw's threads share
 * a tensor by chunks, each chunk its own stream), the embedding made
 * again gets the values drawn first, and the values have GPT-2's spread.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "profiler/part_chain.h"

/* A vocabulary of 20,000 rows of 64: 1.28 million embedding values, more
 * than one chunk of the draw (2^20). */
static const model_shape wide_vocab = {
    .name = "wide-vocab", .layers = 2, .hidden = 64, .heads = 4,
    .ffn_hidden = 256, .seq = 8, .vocab = 20000, .tied_embeddings = true};

static float *read_params(const model_stage *stage)
{
    float *values = test_malloc(stage->param_count * sizeof *values);
    pt_error err = {{0}};
    if (model_stage_read(stage, STAGE_PARAMS, values, &err) != 0)
        fail_msg("%s", err.message);
    return values;
}

static void make_stack(part_chain *chain, const profiler_options *options,
                       int layers)
{
    pt_error err = {{0}};
    if (chain_create(chain, &wide_vocab, 1, 1, layers, options, &err) != 0)
        fail_msg("%s", err.message);
}

static void make_chain(part_chain *chain, const profiler_options *options)
{
    make_stack(chain, options, 1);
}

static void test_values_drawn_alike_and_kept(void **state)
{
    (void)state;
    profiler_options options = profiler_options_defaults(BACKEND_CPU);
    part_chain first, second;
    make_chain(&first, &options);
    make_chain(&second, &options);
    size_t count = first.embedding.param_count;
    assert_true(count > ((size_t)1 << 20));
    assert_non_null(first.embedding_values);
    float *a = read_params(&first.embedding);
    float *b = read_params(&second.embedding);
    assert_memory_equal(a, b, count * sizeof *a);
    /* the second chunk is not the first one again */
    assert_memory_not_equal(a, a + ((size_t)1 << 20), 64 * sizeof *a);
    /* uniform, standard deviation 0.02: within +-0.0347, spread right */
    double sum_squares = 0.0;
    size_t drawn = 0;
    for (size_t i = 0; i < count; i++) {
        assert_true(fabsf(a[i]) <= 0.0347f);
        if (a[i] != 0.0f && a[i] != 1.0f) {
            sum_squares += (double)a[i] * a[i];
            drawn++;
        }
    }
    assert_true(drawn > count / 2);
    assert_float_equal(sqrt(sum_squares / (double)drawn), 0.02, 0.0005);
    /* made again in fresh memory: the same values, written from those
     * kept */
    pt_error err = {{0}};
    assert_int_equal(chain_remake_embedding(&first, &err), 0);
    float *again = read_params(&first.embedding);
    assert_memory_equal(a, again, count * sizeof *a);
    test_free(again);
    test_free(b);
    test_free(a);
    chain_destroy(&second);
    chain_destroy(&first);
}

/* A layer stage of two layers holds two layers' parameters, the first
 * drawn as the lone layer's (one seed, chunk by chunk from the first
 * tensor), the second its own; a run of the chain goes through it. */
static void test_layer_stack_holds_distinct_layers(void **state)
{
    (void)state;
    profiler_options options = profiler_options_defaults(BACKEND_CPU);
    part_chain lone, stack;
    make_chain(&lone, &options);
    make_stack(&stack, &options, 2);
    assert_int_equal(lone.layers, 1);
    assert_int_equal(stack.layers, 2);
    size_t count = lone.layer.param_count;
    assert_int_equal(stack.layer.param_count, 2 * count);
    float *a = read_params(&lone.layer);
    float *b = read_params(&stack.layer);
    assert_memory_equal(a, b, count * sizeof *a);
    assert_memory_not_equal(b, b + count, count * sizeof *b);
    double seconds[CHAIN_CALLS];
    pt_error err = {{0}};
    assert_int_equal(chain_run(&stack, 1, seconds, &err), 0);
    /* the embedding and the head are the lone layer's chain's */
    assert_int_equal(stack.embedding.param_count, lone.embedding.param_count);
    assert_int_equal(stack.head.param_count, lone.head.param_count);
    test_free(b);
    test_free(a);
    chain_destroy(&stack);
    chain_destroy(&lone);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_drawn_alike_and_kept),
        cmocka_unit_test(test_layer_stack_holds_distinct_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
