/*
 * A few training steps of a tiny GPT (4 layers, hidden 16, vocabulary 31)
 * under a parallel config, every rank a thread on the cpu backend, for
 * the tests that compare one way of training with another: each step's
 * result, and rank 0's parameters and first AdamW moment after the last.
 */
#ifndef PARTITA_TEST_TINY_TRAINING_H
#define PARTITA_TEST_TINY_TRAINING_H

#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"
#include "executor/executor.h"

#define TINY_MAX_STEPS 4

static inline model_shape tiny_shape(void)
{
    model_shape shape = {.name = "tiny", .layers = 4, .hidden = 16,
                         .heads = 2, .ffn_hidden = 64, .seq = 8,
                         .vocab = 31, .tied_embeddings = true};
    return shape;
}

/* What a run leaves to compare (tiny_run_free frees it). */
typedef struct tiny_run {
    step_result steps[TINY_MAX_STEPS];
    float *params, *moment;
    size_t count, moment_count;
    size_t grad_count;       /* rank 0's gradient floats (ZeRO-2/3: its
                                shard's) and its unit buffers' bytes; its
                                parameters' likewise (ZeRO-3) */
    size_t unit_bytes;
    size_t param_unit_bytes;
} tiny_run;

static inline void tiny_run_free(tiny_run *r)
{
    free(r->params);
    free(r->moment);
}

/* `steps` steps of config (pp 1 or 2: partitions 4 and 1-3) on fixed
 * tokens, the dp buckets of bucket_bytes (0: the default). */
static inline tiny_run tiny_train(const parallel_config *config,
                                  size_t bucket_bytes,
                                  const train_config *train, int steps)
{
    model_shape shape = tiny_shape();
    int partition[2] = {config->pp == 2 ? 1 : 4, 3};
    pipeline_layout layout;
    pt_error err = {{0}};
    if (pipeline_layout_init(&layout, &shape, config, partition, config->pp,
                             &err) != 0)
        fail_msg("layout: %s", err.message);
    pipeline_launch launch = {.backend = BACKEND_CPU, .seed = 9,
                              .timeout_s = 30.0,
                              .grad_bucket_bytes = bucket_bytes};
    pipeline_threads p;
    if (pipeline_threads_start(&p, &layout, &launch, &err) != 0)
        fail_msg("start: %s", err.message);
    size_t total = (size_t)config->gbs * ((size_t)shape.seq + 1);
    uint32_t *tokens = malloc(total * sizeof *tokens);
    for (size_t i = 0; i < total; i++)
        tokens[i] = (uint32_t)((i * 13 + 5) % 31);
    tiny_run out = {0};
    for (int step = 0; step < steps && step < TINY_MAX_STEPS; step++)
        if (pipeline_threads_step(&p, train, tokens, &out.steps[step],
                                  &err) != 0)
            fail_msg("step %d: %s", step, err.message);
    model_stage *stage = &p.stages[0];
    /* rank 0's parameters: all, or under ZeRO-3 its shard */
    out.count = model_stage_buffer_count(stage, STAGE_PARAMS);
    out.params = malloc((out.count + 1) * sizeof *out.params);
    if (model_stage_read(stage, STAGE_PARAMS, out.params, &err) != 0)
        fail_msg("parameters: %s", err.message);
    out.moment_count = model_stage_buffer_count(stage, STAGE_ADAM_M);
    out.grad_count = model_stage_buffer_count(stage, STAGE_GRADS);
    out.unit_bytes = cpu_stage_unit_bytes(stage, STAGE_GRADS);
    out.param_unit_bytes = cpu_stage_unit_bytes(stage, STAGE_PARAMS);
    out.moment = malloc((out.moment_count + 1) * sizeof *out.moment);
    if (model_stage_read(stage, STAGE_ADAM_M, out.moment, &err) != 0)
        fail_msg("moments: %s", err.message);
    free(tokens);
    pipeline_threads_destroy(&p);
    return out;
}

/* Two runs' losses, norms, parameters and moments, bit for bit. */
static inline void tiny_expect_same_bits(const tiny_run *a, const tiny_run *b,
                                         int steps)
{
    for (int s = 0; s < steps && s < TINY_MAX_STEPS; s++) {
        assert_memory_equal(&a->steps[s].loss, &b->steps[s].loss,
                            sizeof a->steps[s].loss);
        assert_memory_equal(&a->steps[s].grad_norm, &b->steps[s].grad_norm,
                            sizeof a->steps[s].grad_norm);
    }
    assert_int_equal(a->count, b->count);
    assert_memory_equal(a->params, b->params, a->count * sizeof(float));
    assert_int_equal(a->moment_count, b->moment_count);
    assert_memory_equal(a->moment, b->moment,
                        a->moment_count * sizeof(float));
}

#endif
