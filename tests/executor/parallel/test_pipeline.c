/*
 * The pipeline and data-parallel runtime against the one-stage
 * train_step: the same tokens, seed and training config, three steps;
 * the losses, gradient norms and every final parameter must match within
 * fp32 round-off. The runtime sums gradients in other orders (dp
 * replicas summed after accumulation, the tied embedding's two parts on
 * two stages, the norm's squares in float per stage): losses and norms
 * must agree within 1e-5 relative plus 2e-6. Parameters too, except
 * that AdamW turns noise into steps where the true gradient is zero (the
 * key biases of attention: softmax ignores a shift shared by every key),
 * since g / (sqrt(v) + eps) of a 1e-10 gradient is noise of order
 * 1e-2 x lr: every parameter must be within 1e-5 relative plus 1e-3 x lr
 * (1e-5), and all but 1% within 1e-5 relative plus 2e-6. A step moves
 * parameters by about lr = 1e-2, so a missing all-reduce, a lost
 * micro-batch or a wrong loss scale is off by a whole step and fails.
 * Tensor-parallel shards are compared with their slice of the whole
 * tensor. Also the 1F1B order on a stage, the event
 * kinds, and a rank that fails ending every other rank with its name.
 * Stages of their own tp and dp (issue 36) are held to the one-stage
 * run alike: micro-batches split and merged between stages of different
 * dp, activations re-sharded between stages of different tp, with and
 * without sequence parallelism, ZeRO-1/2, recompute, tied and untied
 * embeddings (test_asymmetric_*).
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
#define SEED 77

static model_shape tiny_shape(bool tied)
{
    model_shape shape = {.name = "tiny", .layers = 4, .hidden = 16,
                         .heads = 2, .ffn_hidden = 64, .seq = 8,
                         .vocab = 31, .tied_embeddings = tied};
    return shape;
}

/* A plan's layout for check_layout: the plan-wide degrees, each stage's
 * own (zeros: the plan's), and the levers. */
typedef struct layout_case {
    int pp, dp, tp, mbs, gbs;
    schedule_kind schedule;
    const int *partition;
    bool tied;
    stage_degrees stages[4];     /* pp entries; zeros: the plan's */
    bool sequence_parallel;
    int zero;                    /* 0 .. 2 */
    bool recompute;
    int heads;                   /* 0: the tiny shape's 2 */
} layout_case;

static train_config test_train_config(void)
{
    train_config config = train_config_defaults();
    config.schedule.max_lr = 1e-2;
    config.schedule.min_lr = 1e-3;
    config.schedule.warmup_steps = 0;
    config.schedule.decay_steps = 10;
    config.max_grad_norm = 1.0f;
    return config;
}

/* STEPS global batches of gbs windows of seq + 1 random ids. */
static uint32_t *make_tokens(const model_shape *shape, int gbs)
{
    size_t count = (size_t)STEPS * (size_t)gbs * (size_t)(shape->seq + 1);
    uint32_t *tokens = malloc(count * sizeof *tokens);
    assert_non_null(tokens);
    model_rng rng;
    model_rng_seed(&rng, 5);
    for (size_t i = 0; i < count; i++)
        tokens[i] = (uint32_t)(model_rng_next(&rng) % (uint64_t)shape->vocab);
    return tokens;
}

static bool close_enough(float got, float expected)
{
    return fabsf(got - expected) <= 2e-6f + 1e-5f * fabsf(expected);
}

/* The looser bound of parameters whose gradient is all noise. */
static bool close_for_adamw(float got, float expected)
{
    return fabsf(got - expected) <= 1e-5f + 1e-5f * fabsf(expected);
}

/* Where element k of a (possibly tensor-parallel) shard sits in the
 * whole tensor. */
static size_t whole_index(const param_tensor *shard, size_t k)
{
    int r = (int)(k / (size_t)shard->cols), c = (int)(k % (size_t)shard->cols);
    int kept_rows = shard->rows / shard->row_parts;
    int kept_cols = shard->cols / shard->col_parts;
    int row = r / kept_rows * (shard->full_rows / shard->row_parts) +
              shard->part_row_offset + r % kept_rows;
    int col = c / kept_cols * (shard->full_cols / shard->col_parts) +
              shard->part_col_offset + c % kept_cols;
    return (size_t)row * (size_t)shard->full_cols + (size_t)col;
}

/* Every tensor of every rank against the whole model's (a shard against
 * its slice); replicas of one shard must agree bit for bit (they
 * all-reduce, then step alike). */
static void compare_parameters(const model_stage *whole,
                               const pipeline_threads *p,
                               const float *initial)
{
    double largest_move = 0.0;
    size_t loose = 0, total = 0;
    for (int rank = 0; rank < p->layout.rank_count; rank++) {
        const model_stage *stage = &p->stages[rank];
        for (int i = 0; i < stage->tensor_count; i++) {
            const param_tensor *mine = &stage->tensors[i];
            const param_tensor *theirs = model_stage_find_tensor(
                whole, mine->tied_copy ? "token_embedding" : mine->name);
            assert_non_null(theirs);
            for (size_t k = 0; k < mine->count; k++) {
                float got = stage->params[mine->offset + k];
                size_t at = theirs->offset + whole_index(mine, k);
                float expected = whole->params[at];
                total++;
                loose += !close_enough(got, expected);
                if (!close_for_adamw(got, expected))
                    fail_msg("rank %d %s[%zu]: %.9g, one stage %.9g", rank,
                             mine->name, k, (double)got, (double)expected);
                double move = fabs((double)expected - (double)initial[at]);
                if (move > largest_move)
                    largest_move = move;
            }
        }
        int replica0 = pipeline_rank_of(
            &p->layout, pipeline_rank_stage(&p->layout, rank), 0,
            pipeline_rank_tp(&p->layout, rank));
        assert_memory_equal(stage->params, p->stages[replica0].params,
                            stage->param_count * sizeof(float));
    }
    assert_true(largest_move > 1e-2); /* the steps did move the model */
    if (loose * 100 > total)
        fail_msg("%zu of %zu parameters beyond 1e-5 relative + 2e-6", loose,
                 total);
}

static void check_layout(const layout_case *l)
{
    model_shape shape = tiny_shape(l->tied);
    if (l->heads > 0)
        shape.heads = l->heads;
    train_config config = test_train_config();
    uint32_t *tokens = make_tokens(&shape, l->gbs);
    size_t batch = (size_t)l->gbs * (size_t)(shape.seq + 1);
    pt_error err;

    model_stage whole;
    stage_spec whole_spec = stage_spec_whole_model(&shape);
    whole_spec.recompute_layers = l->recompute;
    assert_int_equal(model_stage_create(&whole, &shape, &whole_spec,
                                        BACKEND_CPU, l->mbs, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&whole, SEED, &err), 0);
    float *initial = malloc(whole.param_count * sizeof(float));
    assert_non_null(initial);
    memcpy(initial, whole.params, whole.param_count * sizeof(float));

    parallel_config parallel = {.gbs = l->gbs, .mbs = l->mbs, .tp = l->tp,
                                .dp = l->dp, .pp = l->pp,
                                .schedule = l->schedule,
                                .precision = PRECISION_FP32,
                                .sequence_parallel = l->sequence_parallel,
                                .recompute = l->recompute};
    parallel_set_zero_stage(&parallel, l->zero);
    pipeline_layout layout;
    if (pipeline_layout_init_stages(&layout, &shape, &parallel, l->partition,
                                    l->pp, l->stages, &err) != 0)
        fail_msg("%s", err.message);
    pipeline_threads p;
    if (pipeline_threads_create(&p, &layout, BACKEND_CPU, SEED, 30.0,
                                &err) != 0)
        fail_msg("%s", err.message);

    for (int step = 0; step < STEPS; step++) {
        step_result expected, got;
        const uint32_t *step_tokens = tokens + (size_t)step * batch;
        assert_int_equal(train_step(&whole, &config, step_tokens,
                                    l->gbs / l->mbs, l->mbs, &expected,
                                    &err),
                         0);
        if (pipeline_threads_step(&p, &config, step_tokens, &got, &err) != 0)
            fail_msg("%s", err.message);
        assert_true(expected.loss > 2.0f);
        if (!close_enough(got.loss, expected.loss) ||
            !close_enough(got.grad_norm, expected.grad_norm))
            fail_msg("step %d: loss %.9g norm %.9g, one stage %.9g %.9g",
                     step, (double)got.loss, (double)got.grad_norm,
                     (double)expected.loss, (double)expected.grad_norm);
        assert_true(got.learning_rate == expected.learning_rate);
    }
    compare_parameters(&whole, &p, initial);
    for (int rank = 0; rank < p.layout.rank_count; rank++)
        assert_int_equal(p.stages[rank].optimizer_steps, STEPS);

    pipeline_threads_destroy(&p);
    free(initial);
    model_stage_destroy(&whole);
    free(tokens);
}

static void check_tp_plan(int pp, int dp, int tp, int mbs, int gbs,
                          schedule_kind schedule, const int *partition,
                          bool tied)
{
    layout_case l = {.pp = pp, .dp = dp, .tp = tp, .mbs = mbs, .gbs = gbs,
                     .schedule = schedule, .partition = partition,
                     .tied = tied};
    check_layout(&l);
}

static void check_plan(int pp, int dp, int mbs, int gbs,
                       schedule_kind schedule, const int *partition,
                       bool tied)
{
    check_tp_plan(pp, dp, 1, mbs, gbs, schedule, partition, tied);
}

static void test_two_stages_1f1b(void **state)
{
    (void)state;
    static const int even[] = {2, 2};
    check_plan(2, 1, 2, 8, SCHEDULE_1F1B, even, true);
    check_plan(2, 1, 2, 8, SCHEDULE_1F1B, even, false);
}

static void test_three_stages_uneven(void **state)
{
    (void)state;
    static const int embedding_alone[] = {0, 3, 1};
    static const int empty_middle[] = {2, 0, 2};
    check_plan(3, 1, 1, 5, SCHEDULE_1F1B, embedding_alone, true);
    check_plan(3, 1, 2, 4, SCHEDULE_1F1B, empty_middle, true);
}

static void test_two_stages_gpipe(void **state)
{
    (void)state;
    static const int uneven[] = {3, 1};
    check_plan(2, 1, 2, 8, SCHEDULE_GPIPE, uneven, true);
}

static void test_data_parallel(void **state)
{
    (void)state;
    static const int whole[] = {4};
    check_plan(1, 2, 2, 8, SCHEDULE_1F1B, whole, true);
}

static void test_pipeline_and_data_parallel(void **state)
{
    (void)state;
    static const int uneven[] = {1, 3};
    check_plan(2, 2, 1, 8, SCHEDULE_1F1B, uneven, true);
}

/* Megatron tensor parallelism: two shards (31 vocabulary rows split 16 +
 * 15), tied and untied, alone and with pipeline and data parallelism. */
static void test_tensor_parallel(void **state)
{
    (void)state;
    static const int whole[] = {4};
    static const int uneven[] = {1, 3};
    check_tp_plan(1, 1, 2, 2, 8, SCHEDULE_1F1B, whole, true);
    check_tp_plan(1, 1, 2, 2, 8, SCHEDULE_1F1B, whole, false);
    check_tp_plan(2, 1, 2, 1, 8, SCHEDULE_1F1B, uneven, true);
    check_tp_plan(1, 2, 2, 1, 8, SCHEDULE_1F1B, whole, true);
}

/* Stages of their own degrees (issue 36). Two stages: a micro-batch of
 * dp x mbs = 2 samples split over stage 0's two replicas and merged on
 * stage 1's one (tp 2), and the other way; 1F1B and GPipe, tied and
 * untied; stages of the same dp and different tp. */
static void test_asymmetric_two_stages(void **state)
{
    (void)state;
    static const int even[] = {2, 2}, uneven[] = {1, 3};
    layout_case merge = {.pp = 2, .dp = 2, .tp = 1, .mbs = 1, .gbs = 8,
                         .schedule = SCHEDULE_1F1B, .partition = even,
                         .tied = true, .stages = {{0, 0}, {2, 1}}};
    check_layout(&merge);
    merge.schedule = SCHEDULE_GPIPE;
    merge.tied = false;
    check_layout(&merge);
    layout_case split = {.pp = 2, .dp = 1, .tp = 2, .mbs = 2, .gbs = 8,
                         .schedule = SCHEDULE_1F1B, .partition = uneven,
                         .tied = true, .stages = {{0, 0}, {1, 2}}};
    check_layout(&split);
    split.tied = false;
    check_layout(&split);
    /* only tp differs: each replica's tied embedding summed with its
     * twin's, shard by shard of rows; with ZeRO-1 too */
    layout_case widen = {.pp = 2, .dp = 2, .tp = 1, .mbs = 1, .gbs = 8,
                         .schedule = SCHEDULE_1F1B, .partition = even,
                         .tied = true, .stages = {{0, 0}, {2, 2}}};
    check_layout(&widen);
    widen.zero = 1;
    check_layout(&widen);
}

/* Three stages, each its own: tp 1 x dp 4, tp 2 x dp 1, tp 2 x dp 2
 * (4 samples a micro-batch: 1, 4 and 2 a replica); with recompute; and
 * a stage of no layers between two of their own. */
static void test_asymmetric_three_stages(void **state)
{
    (void)state;
    static const int middle[] = {1, 2, 1}, empty_middle[] = {2, 0, 2};
    layout_case mixed = {.pp = 3, .dp = 2, .tp = 1, .mbs = 2, .gbs = 8,
                         .schedule = SCHEDULE_1F1B, .partition = middle,
                         .tied = true,
                         .stages = {{1, 4}, {2, 1}, {2, 2}}};
    check_layout(&mixed);
    mixed.recompute = true;
    check_layout(&mixed);
    layout_case empty = {.pp = 3, .dp = 1, .tp = 2, .mbs = 2, .gbs = 4,
                         .schedule = SCHEDULE_1F1B,
                         .partition = empty_middle, .tied = true,
                         .stages = {{0, 0}, {1, 2}, {0, 0}}};
    check_layout(&empty);
}

/* Sequence parallelism across a boundary of tp 2 and tp 4 (4 heads):
 * each rank sends and receives exactly its own rows. */
static void test_asymmetric_sequence_parallel(void **state)
{
    (void)state;
    static const int even[] = {2, 2};
    layout_case widen = {.pp = 2, .dp = 2, .tp = 2, .mbs = 1, .gbs = 8,
                         .schedule = SCHEDULE_1F1B, .partition = even,
                         .tied = true, .stages = {{0, 0}, {4, 1}},
                         .sequence_parallel = true, .heads = 4};
    check_layout(&widen);
    layout_case narrow = widen;
    narrow.stages[0] = (stage_degrees){4, 1};
    narrow.stages[1] = (stage_degrees){0, 0};
    narrow.tied = false;
    check_layout(&narrow);
    /* the same boundaries without sequence parallelism: tp 4 gathers */
    widen.sequence_parallel = false;
    check_layout(&widen);
}

/* ZeRO-1 and ZeRO-2 on each stage's own dp group, the tied embedding
 * summed between a first and a last stage of different degrees after
 * their reduce-scatters. */
static void test_asymmetric_zero(void **state)
{
    (void)state;
    static const int even[] = {2, 2}, middle[] = {1, 2, 1};
    for (int zero = 1; zero <= 2; zero++) {
        layout_case merge = {.pp = 2, .dp = 2, .tp = 1, .mbs = 1, .gbs = 8,
                             .schedule = SCHEDULE_1F1B, .partition = even,
                             .tied = true, .stages = {{0, 0}, {2, 1}},
                             .zero = zero};
        check_layout(&merge);
        layout_case mixed = {.pp = 3, .dp = 2, .tp = 1, .mbs = 2, .gbs = 8,
                             .schedule = SCHEDULE_1F1B, .partition = middle,
                             .tied = true,
                             .stages = {{1, 4}, {2, 1}, {2, 2}},
                             .zero = zero};
        check_layout(&mixed);
    }
}

/* The rank layout of stages of their own degrees, and what it refuses. */
static void test_asymmetric_layout(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    static const int middle[] = {1, 2, 1};
    parallel_config config = {.gbs = 8, .mbs = 2, .tp = 1, .dp = 2,
                              .pp = 3, .schedule = SCHEDULE_1F1B};
    stage_degrees stages[3] = {{1, 4}, {2, 1}, {2, 2}};
    pipeline_layout layout;
    pt_error err;
    assert_int_equal(pipeline_layout_init_stages(&layout, &shape, &config,
                                                 middle, 3, stages, &err),
                     0);
    assert_true(layout.asymmetric);
    assert_int_equal(layout.rank_count, 4 + 2 + 4);
    assert_int_equal(layout.micro_batches, 2);
    assert_int_equal(layout.stage_mbs[0], 1);
    assert_int_equal(layout.stage_mbs[1], 4);
    assert_int_equal(layout.stage_mbs[2], 2);
    /* stage 2 from rank 6: rank = 6 + t + 2 d */
    assert_int_equal(pipeline_rank_stage(&layout, 5), 1);
    assert_int_equal(pipeline_rank_stage(&layout, 9), 2);
    assert_int_equal(pipeline_rank_replica(&layout, 9), 1);
    assert_int_equal(pipeline_rank_tp(&layout, 9), 1);
    assert_int_equal(pipeline_rank_of(&layout, 2, 1, 0), 8);
    /* rows of a micro-batch (4 samples x 8 positions): stage 1's two
     * shards 16 each, stage 0's replicas 8 each */
    size_t first = 0, count = 0;
    pipeline_boundary_rows(&layout, 5, &first, &count);
    assert_true(first == 16 && count == 16);
    pipeline_boundary_rows(&layout, 3, &first, &count);
    assert_true(first == 24 && count == 8);
    /* groups: stage 0's dp group, stage 2's two; stage 1's tp group,
     * stage 2's two; the tied embedding's pairs of replicas 0 and 1's
     * shards (stage 0 whole, stage 2 in two) */
    comm_groups groups;
    assert_int_equal(pipeline_layout_groups(&layout, &groups, &err), 0);
    static const int expected[][4] = {{0, 1, 2, 3}, {6, 8}, {7, 9},
                                      {4, 5},       {6, 7}, {8, 9},
                                      {0, 6},       {0, 7}, {1, 8},
                                      {1, 9}};
    static const int sizes[] = {4, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    assert_int_equal(groups.count, 10);
    for (int g = 0; g < groups.count; g++) {
        assert_int_equal(groups.offsets[g + 1] - groups.offsets[g],
                         sizes[g]);
        assert_memory_equal(groups.members + groups.offsets[g], expected[g],
                            (size_t)sizes[g] * sizeof(int));
    }
    comm_groups_free(&groups);
    /* a dp that cannot share the micro-batch's 4 samples */
    stages[1] = (stage_degrees){2, 3};
    assert_int_equal(pipeline_layout_init_stages(&layout, &shape, &config,
                                                 middle, 3, stages, &err),
                     -1);
    assert_non_null(strstr(err.message, "stage 1"));
    /* interleaving */
    stages[1] = (stage_degrees){2, 1};
    config.virtual_stages = 2;
    static const int even[] = {2, 2, 2};
    shape.layers = 6;
    assert_int_equal(pipeline_layout_init_stages(&layout, &shape, &config,
                                                 even, 3, stages, &err),
                     -1);
    assert_non_null(strstr(err.message, "virtual_stages"));
}

/* The order of a 1F1B stage and the events each rank records. */
static void test_schedule_and_events(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    parallel_config parallel = {.gbs = 4, .mbs = 1, .tp = 1, .dp = 1,
                                .pp = 3, .schedule = SCHEDULE_1F1B};
    static const int partition[] = {2, 1, 1};
    pipeline_layout layout;
    pt_error err;
    assert_int_equal(pipeline_layout_init(&layout, &shape, &parallel,
                                          partition, 3, &err),
                     0);
    assert_int_equal(pipeline_slot_count(&layout, 0), 3);
    assert_int_equal(pipeline_slot_count(&layout, 2), 1);
    pipeline_threads p;
    assert_int_equal(pipeline_threads_create(&p, &layout, BACKEND_CPU, SEED,
                                             30.0, &err),
                     0);
    uint32_t *tokens = make_tokens(&shape, 4);
    train_config config = test_train_config();
    step_result result;
    assert_int_equal(pipeline_threads_step(&p, &config, tokens, &result,
                                           &err),
                     0);
    /* stage 0 of 3, 4 micro-batches: two warm-up forwards */
    static const char expected_order[] = "F0F1F2B0F3B1B2B3";
    char order[64] = "";
    const pipeline_events *first = &p.events[0];
    for (int i = 0; i < first->count; i++) {
        const run_event *e = &first->events[i];
        if (strcmp(e->kind, "fwd") == 0 || strcmp(e->kind, "bwd") == 0)
            snprintf(order + strlen(order), sizeof order - strlen(order),
                     "%c%d", e->kind[0] == 'f' ? 'F' : 'B', e->microbatch);
    }
    assert_string_equal(order, expected_order);
    static const char *const known[] = {
        "fwd", "bwd", "send_fwd", "recv_fwd", "send_bwd", "recv_bwd",
        "dp_allreduce", "embedding_allreduce", "optimizer"};
    for (int rank = 0; rank < 3; rank++) {
        const pipeline_events *events = &p.events[rank];
        int sends = 0, receives = 0, optimizer = 0, embedding = 0;
        for (int i = 0; i < events->count; i++) {
            const run_event *e = &events->events[i];
            bool is_known = false;
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
                is_known = is_known || strcmp(e->kind, known[k]) == 0;
            assert_true(is_known);
            assert_int_equal(e->rank, rank);
            assert_int_equal(e->stage, rank);
            assert_true(e->start_s >= 0.0 && e->end_s >= e->start_s);
            if (i > 0)
                assert_true(e->start_s >= events->events[i - 1].end_s);
            sends += strncmp(e->kind, "send_", 5) == 0;
            receives += strncmp(e->kind, "recv_", 5) == 0;
            optimizer += strcmp(e->kind, "optimizer") == 0;
            embedding += strcmp(e->kind, "embedding_allreduce") == 0;
        }
        /* a middle stage sends and receives both ways, an end stage one */
        int expected_each = rank == 1 ? 8 : 4;
        assert_int_equal(sends, expected_each);
        assert_int_equal(receives, expected_each);
        assert_int_equal(optimizer, 1);
        assert_int_equal(embedding, rank == 1 ? 0 : 1);
    }
    free(tokens);
    pipeline_threads_destroy(&p);
}

/* A rank that fails after its first forward ends every other rank with
 * an error naming it, well before the timeout. */
static void test_failing_rank_stops_everyone(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    parallel_config parallel = {.gbs = 8, .mbs = 1, .tp = 1, .dp = 2,
                                .pp = 2, .schedule = SCHEDULE_1F1B};
    static const int partition[] = {2, 2};
    pipeline_layout layout;
    pt_error err;
    assert_int_equal(pipeline_layout_init(&layout, &shape, &parallel,
                                          partition, 2, &err),
                     0);
    pipeline_threads p;
    assert_int_equal(pipeline_threads_create(&p, &layout, BACKEND_CPU, SEED,
                                             60.0, &err),
                     0);
    p.inject_failure_rank = 3; /* stage 1, replica 1 */
    uint32_t *tokens = make_tokens(&shape, 8);
    train_config config = test_train_config();
    step_result result;
    assert_int_equal(pipeline_threads_step(&p, &config, tokens, &result,
                                           &err),
                     -1);
    assert_non_null(strstr(err.message, "rank 3 (stage 1, replica 1, tp 0)"));
    assert_non_null(strstr(err.message, "injected failure"));
    for (int rank = 0; rank < 4; rank++) {
        assert_int_equal(p.rank_status[rank], -1);
        if (rank != 3)
            assert_non_null(strstr(p.rank_errors[rank].message,
                                   "rank 3 failed"));
    }
    /* the world stays failed: the next step is refused */
    assert_int_equal(pipeline_threads_step(&p, &config, tokens, &result,
                                           &err),
                     -1);
    free(tokens);
    pipeline_threads_destroy(&p);
}

static void test_layout_refusals(void **state)
{
    (void)state;
    model_shape shape = tiny_shape(true);
    static const int partition[] = {2, 2};
    static const int short_partition[] = {2, 1};
    pipeline_layout layout;
    pt_error err;
    /* tp must divide the 2 heads */
    parallel_config tensor = {.gbs = 8, .mbs = 1, .tp = 4, .dp = 1, .pp = 2};
    assert_int_equal(pipeline_layout_init(&layout, &shape, &tensor,
                                          partition, 2, &err),
                     -1);
    assert_non_null(strstr(err.message, "tp 4"));
    parallel_config odd = {.gbs = 7, .mbs = 2, .tp = 1, .dp = 1, .pp = 2};
    assert_int_equal(pipeline_layout_init(&layout, &shape, &odd, partition,
                                          2, &err),
                     -1);
    assert_non_null(strstr(err.message, "gbs 7"));
    parallel_config fine = {.gbs = 8, .mbs = 2, .tp = 1, .dp = 1, .pp = 2};
    assert_int_equal(pipeline_layout_init(&layout, &shape, &fine,
                                          short_partition, 2, &err),
                     -1);
    assert_int_equal(pipeline_layout_init(&layout, &shape, &fine, partition,
                                          1, &err),
                     -1);
    assert_int_equal(pipeline_layout_init(&layout, &shape, &fine, partition,
                                          2, &err),
                     0);
    assert_int_equal(layout.micro_batches, 4);
    assert_int_equal(layout.rank_count, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_stages_1f1b),
        cmocka_unit_test(test_three_stages_uneven),
        cmocka_unit_test(test_two_stages_gpipe),
        cmocka_unit_test(test_data_parallel),
        cmocka_unit_test(test_pipeline_and_data_parallel),
        cmocka_unit_test(test_tensor_parallel),
        cmocka_unit_test(test_schedule_and_events),
        cmocka_unit_test(test_failing_rank_stops_everyone),
        cmocka_unit_test(test_layout_refusals),
        cmocka_unit_test(test_asymmetric_layout),
        cmocka_unit_test(test_asymmetric_two_stages),
        cmocka_unit_test(test_asymmetric_three_stages),
        cmocka_unit_test(test_asymmetric_sequence_parallel),
        cmocka_unit_test(test_asymmetric_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
