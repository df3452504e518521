/*
 * Megatron's schedule levers on the threads comm. The interleaved 1F1B:
 * the same mathematics as the plain 1F1B, so the same losses and
 * gradient norms step after step (tied and untied embeddings, data and
 * tensor parallelism, ZeRO-1, full recompute, a stage of no layers);
 * each rank's chunks hold the virtual stages Megatron gives them, its
 * order of chunk forwards and backwards is Megatron's, and its chunks'
 * slots suffice. Sequence parallelism: the plain tp's losses and norms
 * within fp32 round-off (its norms' weight gradients are summed shard by
 * shard), with pipelines, interleaving, ZeRO-1 and recompute.
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

#define STEPS 3
#define SEED 91

static model_shape tiny_shape(bool tied)
{
    model_shape shape = {.name = "tiny", .layers = 8, .hidden = 16,
                         .heads = 2, .ffn_hidden = 64, .seq = 8,
                         .vocab = 31, .tied_embeddings = tied};
    return shape;
}

static uint32_t *make_tokens(const model_shape *shape, int gbs)
{
    size_t count = (size_t)STEPS * (size_t)gbs * (size_t)(shape->seq + 1);
    uint32_t *tokens = malloc(count * sizeof *tokens);
    assert_non_null(tokens);
    model_rng rng;
    model_rng_seed(&rng, 9);
    for (size_t i = 0; i < count; i++)
        tokens[i] = (uint32_t)(model_rng_next(&rng) % (uint64_t)shape->vocab);
    return tokens;
}

/* STEPS steps of config's layout; the step results into out. */
static void run_steps(const model_shape *shape, const parallel_config *config,
                      const int *partition, const uint32_t *tokens,
                      step_result *out)
{
    train_config train = train_config_defaults();
    train.schedule.max_lr = 1e-2;
    train.schedule.warmup_steps = 0;
    train.schedule.decay_steps = 10;
    pipeline_layout layout;
    pipeline_threads p;
    pt_error err = {{0}};
    if (pipeline_layout_init(&layout, shape, config, partition, config->pp,
                             &err) != 0 ||
        pipeline_threads_create(&p, &layout, BACKEND_CPU, SEED, 30.0,
                                &err) != 0)
        fail_msg("%s", err.message);
    size_t batch = (size_t)config->gbs * (size_t)(shape->seq + 1);
    for (int step = 0; step < STEPS; step++)
        if (pipeline_threads_step(&p, &train, tokens + step * batch,
                                  &out[step], &err) != 0)
            fail_msg("%s", err.message);
    pipeline_threads_destroy(&p);
}

/* Sequence parallelism against the plain tp, both with v chunks: the
 * same within fp32 round-off. */
static void check_sequence_parallel(int pp, int dp, int v, bool tied,
                                    bool zero1, bool recompute,
                                    const int *partition)
{
    model_shape shape = tiny_shape(tied);
    parallel_config config = {.gbs = 8, .mbs = 1, .tp = 2, .dp = dp,
                              .pp = pp, .schedule = SCHEDULE_1F1B,
                              .precision = PRECISION_FP32,
                              .recompute = recompute,
                              .distributed_optimizer = zero1,
                              .virtual_stages = v};
    uint32_t *tokens = make_tokens(&shape, config.gbs);
    step_result plain[STEPS], sequence[STEPS];
    run_steps(&shape, &config, partition, tokens, plain);
    config.sequence_parallel = true;
    run_steps(&shape, &config, partition, tokens, sequence);
    for (int step = 0; step < STEPS; step++) {
        float tolerance_loss = 1e-6f + 1e-5f * plain[step].loss;
        float tolerance_norm = 1e-6f + 1e-5f * plain[step].grad_norm;
        if (fabsf(sequence[step].loss - plain[step].loss) > tolerance_loss ||
            fabsf(sequence[step].grad_norm - plain[step].grad_norm) >
                tolerance_norm)
            fail_msg("pp %d dp %d v %d, step %d: loss %.9g norm %.9g, "
                     "plain tp %.9g %.9g",
                     pp, dp, v, step, (double)sequence[step].loss,
                     (double)sequence[step].grad_norm,
                     (double)plain[step].loss, (double)plain[step].grad_norm);
    }
    free(tokens);
}

static void test_sequence_parallel_equals_plain_tp(void **state)
{
    (void)state;
    static const int whole[] = {8}, even2[] = {4, 4}, uneven2[] = {6, 2};
    check_sequence_parallel(1, 1, 1, true, false, false, whole);
    check_sequence_parallel(2, 1, 1, true, false, false, uneven2);
    check_sequence_parallel(2, 1, 2, false, false, false, even2);
    check_sequence_parallel(2, 2, 1, true, true, false, even2);
    check_sequence_parallel(1, 1, 1, true, false, true, whole);
}

/* The interleaved run of v chunks against the plain one: losses equal,
 * norms equal up to the order of their sums of squares. */
static void check_same_as_plain(int pp, int dp, int tp, int v, bool tied,
                                bool zero1, bool recompute,
                                const int *partition)
{
    model_shape shape = tiny_shape(tied);
    parallel_config config = {.gbs = 8, .mbs = 1, .tp = tp, .dp = dp,
                              .pp = pp, .schedule = SCHEDULE_1F1B,
                              .precision = PRECISION_FP32,
                              .recompute = recompute,
                              .distributed_optimizer = zero1};
    uint32_t *tokens = make_tokens(&shape, config.gbs);
    step_result plain[STEPS], chunked[STEPS];
    run_steps(&shape, &config, partition, tokens, plain);
    config.virtual_stages = v;
    run_steps(&shape, &config, partition, tokens, chunked);
    for (int step = 0; step < STEPS; step++) {
        assert_true(plain[step].loss > 2.0f);
        if (chunked[step].loss != plain[step].loss ||
            fabsf(chunked[step].grad_norm - plain[step].grad_norm) >
                1e-6f * plain[step].grad_norm)
            fail_msg("pp %d dp %d tp %d v %d, step %d: loss %.9g norm %.9g, "
                     "plain 1F1B %.9g %.9g",
                     pp, dp, tp, v, step, (double)chunked[step].loss,
                     (double)chunked[step].grad_norm,
                     (double)plain[step].loss, (double)plain[step].grad_norm);
    }
    free(tokens);
}

static void test_losses_equal_plain_1f1b(void **state)
{
    (void)state;
    static const int even2[] = {4, 4}, uneven2[] = {6, 2};
    static const int even4[] = {2, 2, 2, 2}, gap4[] = {2, 4, 0, 2};
    check_same_as_plain(2, 1, 1, 2, true, false, false, even2);
    check_same_as_plain(2, 1, 1, 4, false, false, false, even2);
    check_same_as_plain(2, 1, 1, 2, true, false, false, uneven2);
    check_same_as_plain(4, 1, 1, 2, true, false, false, even4);
    check_same_as_plain(4, 1, 1, 2, true, false, true, gap4);
    check_same_as_plain(2, 2, 1, 2, true, true, false, even2);
    check_same_as_plain(2, 1, 2, 2, true, false, false, even2);
}

/* Chunk c of stage s is virtual stage c pp + s: its layers, ends, slots
 * and the rank's order of chunk forwards and backwards. */
static void test_chunks_and_order(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    parallel_config config = {.gbs = 4, .mbs = 1, .tp = 1, .dp = 1, .pp = 2,
                              .schedule = SCHEDULE_1F1B,
                              .virtual_stages = 2};
    static const int partition[] = {4, 4};
    pipeline_layout layout;
    pt_error err = {{0}};
    assert_int_equal(pipeline_layout_init(&layout, &shape, &config,
                                          partition, 2, &err), 0);
    assert_int_equal(pipeline_chunk_count(&layout), 2);
    stage_spec spec;
    /* rank 1 (stage 1) chunk 0: layers 2..3; chunk 1: 6..7 and the head */
    assert_int_equal(pipeline_rank_chunk_spec(&layout, 1, 0, &spec, &err), 0);
    assert_int_equal(spec.first_layer, 2);
    assert_int_equal(spec.last_layer, 4);
    assert_false(spec.has_head);
    assert_int_equal(pipeline_rank_chunk_spec(&layout, 1, 1, &spec, &err), 0);
    assert_int_equal(spec.first_layer, 6);
    assert_true(spec.has_head);
    assert_int_equal(pipeline_rank_chunk_spec(&layout, 0, 1, &spec, &err), 0);
    assert_int_equal(spec.first_layer, 4);
    assert_false(spec.has_embedding);
    /* stage 0's warm-up 2 (2 - 1) + 2 = 4 chunk forwards: each chunk holds
     * all four of its micro-batches before its first backward */
    assert_int_equal(pipeline_chunk_slot_count(&layout, 0, 0), 4);
    assert_int_equal(pipeline_chunk_slot_count(&layout, 1, 1), 1);

    pipeline_threads p;
    assert_int_equal(pipeline_threads_create(&p, &layout, BACKEND_CPU, SEED,
                                             30.0, &err), 0);
    uint32_t *tokens = make_tokens(&shape, config.gbs);
    train_config train = train_config_defaults();
    step_result result;
    if (pipeline_threads_step(&p, &train, tokens, &result, &err) != 0)
        fail_msg("%s", err.message);
    /* Megatron's order on stage 0 (micro-batches; chunks 0 0 1 1 0 1 ...)
     * and stage 1 */
    static const char *const expected[2] = {
        "F0F1F0F1F2B0F3B1F2B0F3B1B2B3B2B3",
        "F0F1F0B0F1B1F2B0F3B1F2B2F3B3B2B3"};
    for (int rank = 0; rank < 2; rank++) {
        char order[128] = "";
        const pipeline_events *events = &p.events[rank];
        int sends = 0;
        for (int i = 0; i < events->count; i++) {
            const run_event *e = &events->events[i];
            if (strcmp(e->kind, "fwd") == 0 || strcmp(e->kind, "bwd") == 0)
                snprintf(order + strlen(order), sizeof order - strlen(order),
                         "%c%d", e->kind[0] == 'f' ? 'F' : 'B',
                         e->microbatch);
            sends += strncmp(e->kind, "send_", 5) == 0;
        }
        assert_string_equal(order, expected[rank]);
        /* every chunk boundary: 3 of the 4 chunks' forwards send on, 3
         * of their backwards send back: 4 micro-batches x 3 / 2 ranks,
         * both ways */
        assert_int_equal(sends, 12);
    }
    free(tokens);
    pipeline_threads_destroy(&p);
}

static void test_refusals(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    static const int partition[] = {5, 3};
    pipeline_layout layout;
    pt_error err = {{0}};
    parallel_config config = {.gbs = 8, .mbs = 1, .tp = 1, .dp = 1, .pp = 2,
                              .schedule = SCHEDULE_1F1B,
                              .virtual_stages = 2};
    assert_int_equal(pipeline_layout_init(&layout, &shape, &config,
                                          partition, 2, &err), -1);
    assert_non_null(strstr(err.message, "not a multiple of virtual_stages"));
    static const int even[] = {4, 4};
    config.gbs = 3;
    assert_int_equal(pipeline_layout_init(&layout, &shape, &config, even, 2,
                                          &err), -1);
    assert_non_null(strstr(err.message, "multiple of pp"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_losses_equal_plain_1f1b),
        cmocka_unit_test(test_chunks_and_order),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_sequence_parallel_equals_plain_tp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
