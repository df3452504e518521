/*
 * A Llama-shaped model (tests/data/models/llama-tiny.json: 4 layers,
 * hidden 64, 4 heads sharing 2 key/value heads, SwiGLU, RMSNorm, rotary
 * positions, no biases, an untied head) under run_training, cpu backend,
 * ranks as threads, as test_parallel.c runs GPT-2's: every layout (tp 2
 * with GQA, pp 2 with the head on the last stage, dp 2, their products,
 * ZeRO-1/2/3, sequence parallelism, the interleaved 1F1B) trains on the
 * same samples from the same initial weights as the one-stage run, so
 * its losses and gradient norms match within fp32 round-off (1e-5
 * relative); full recompute changes no bit; the loss falls over a few
 * steps; a run stopped with a checkpoint and resumed equals the straight
 * run bit for bit (pp 2 x tp 2, the head's own weight and moments in
 * the last stage's blobs); kv_heads not divisible by tp and the cuda
 * backend are refused in one line.
 */
#include "run_test_support.h"

#include <math.h>

#define GBS 4
#define MBS 1
#define ITERATIONS 3

/* The model file, inline in a plan of one node of tp x dp x pp "gpus". */
static void llama_plan(plan *out, int tp, int dp, int pp,
                       const char *partition)
{
    char extra[128] = "";
    if (partition != NULL)
        snprintf(extra, sizeof extra, ", \"partition\": \"%s\"", partition);
    run_test_node_plan(out, run_test_llama_model(), tp * dp * pp, GBS, MBS,
                       tp, dp, pp, extra);
}

/* A layout's levers beside its degrees. */
typedef struct levers {
    const char *partition;
    int zero;                 /* 0 .. 3 */
    bool sequence_parallel;
    bool recompute;
    int virtual_stages;
} levers;

static void apply_levers(plan *p, const levers *l)
{
    parallel_set_zero_stage(&p->config, l->zero);
    p->config.sequence_parallel = l->sequence_parallel;
    p->config.recompute = l->recompute;
    p->config.virtual_stages = l->virtual_stages > 1 ? l->virtual_stages : 1;
}

/* The layout's losses and norms against the one-stage run's. */
static void expect_same_as_one_stage(const run_scratch *s, int tp, int dp,
                                     int pp, const levers *l,
                                     const char *layout)
{
    plan one, parallel;
    llama_plan(&one, 1, 1, 1, NULL);
    llama_plan(&parallel, tp, dp, pp, l->partition);
    apply_levers(&parallel, l);
    run_options options = run_test_warm_options(s, ITERATIONS);
    run_result reference, result;
    run_train_ok(&one, &options, &reference);
    run_train_ok(&parallel, &options, &result);
    assert_int_equal(result.iteration_count, ITERATIONS);
    assert_int_equal(result.rank_count, tp * dp * pp);
    run_expect_same_iterations(&result, &reference, ITERATIONS, layout);
    run_result_free(&reference);
    run_result_free(&result);
    plan_free(&one);
    plan_free(&parallel);
}

static void tp2_splits_query_and_key_value_heads(void **state)
{
    levers l = {0};
    expect_same_as_one_stage(*state, 2, 1, 1, &l, "tp 2");
    l.sequence_parallel = true;
    expect_same_as_one_stage(*state, 2, 1, 1, &l, "tp 2, sequence parallel");
}

static void pp2_puts_the_untied_head_on_the_last_stage(void **state)
{
    levers l = {.partition = "3-1"};
    expect_same_as_one_stage(*state, 1, 1, 2, &l, "pp 2");
    l.partition = "2-2";
    l.virtual_stages = 2;
    expect_same_as_one_stage(*state, 1, 1, 2, &l, "pp 2, 2 chunks a rank");
}

static void dp2_and_zero_levels(void **state)
{
    levers l = {0};
    expect_same_as_one_stage(*state, 1, 2, 1, &l, "dp 2");
    for (l.zero = 1; l.zero <= 3; l.zero++) {
        char layout[32];
        snprintf(layout, sizeof layout, "dp 2, ZeRO-%d", l.zero);
        expect_same_as_one_stage(*state, 1, 2, 1, &l, layout);
    }
}

static void products_of_degrees(void **state)
{
    levers l = {.partition = "1-3"};
    expect_same_as_one_stage(*state, 1, 2, 2, &l, "pp 2 x dp 2");
    l = (levers){.partition = "3-1", .sequence_parallel = true};
    expect_same_as_one_stage(*state, 2, 1, 2, &l, "pp 2 x tp 2, sp");
    l = (levers){.zero = 1};
    expect_same_as_one_stage(*state, 2, 2, 1, &l, "tp 2 x dp 2, ZeRO-1");
}

/* Full recompute: the same arithmetic, so the same bits. */
static void recompute_changes_nothing(void **state)
{
    const run_scratch *s = *state;
    plan keep, recompute;
    llama_plan(&keep, 2, 1, 2, "3-1");
    llama_plan(&recompute, 2, 1, 2, "3-1");
    recompute.config.recompute = true;
    run_options options = run_test_warm_options(s, ITERATIONS);
    run_result kept, recomputed;
    run_train_ok(&keep, &options, &kept);
    run_train_ok(&recompute, &options, &recomputed);
    for (long i = 0; i < ITERATIONS; i++)
        if (kept.iterations[i].loss != recomputed.iterations[i].loss ||
            kept.iterations[i].grad_norm != recomputed.iterations[i].grad_norm)
            fail_msg("iteration %ld: recomputed %.9g, kept %.9g", i + 1,
                     recomputed.iterations[i].loss, kept.iterations[i].loss);
    run_result_free(&kept);
    run_result_free(&recomputed);
    plan_free(&keep);
    plan_free(&recompute);
}

static void loss_falls(void **state)
{
    plan p;
    llama_plan(&p, 1, 1, 1, NULL);
    run_options options = run_test_warm_options(*state, 8);
    options.train.schedule.max_lr = 1e-2;
    options.train.schedule.min_lr = 1e-3;
    run_result result;
    run_train_ok(&p, &options, &result);
    /* log(257) at the start; the byte statistics are learnt fast */
    assert_true(fabs(result.iterations[0].loss - log(257.0)) < 0.5);
    if (!(result.iterations[7].loss < result.iterations[0].loss - 0.5f))
        fail_msg("loss %.4f after 8 steps, %.4f at the first",
                 result.iterations[7].loss, result.iterations[0].loss);
    run_result_free(&result);
    plan_free(&p);
}

/* 4 iterations straight against 2, a checkpoint, and 2 resumed: the same
 * bits. The last stage's blobs hold the head's own matrix (vocab x
 * hidden floats) and its moments. */
static void checkpoint_resumes_exactly(void **state)
{
    const run_scratch *s = *state;
    plan p;
    llama_plan(&p, 2, 1, 2, "3-1");
    run_options options = run_test_warm_options(s, 4);
    run_result straight, first;
    run_train_ok(&p, &options, &straight);
    char dir[512];
    run_path(s, "llama-checkpoint", dir, sizeof dir);
    run_options first_half = options;
    first_half.iterations = 2;
    first_half.save_dir = dir;
    run_train_ok(&p, &first_half, &first);
    assert_int_equal(first.last_checkpoint_iteration, 2);
    /* rank 2 (stage 1, tp shard 0): one layer of its shard, the final
     * norm, half of the head's vocabulary rows */
    stage_spec spec;
    pt_error err = {{0}};
    static const int partition[] = {3, 1};
    assert_int_equal(stage_spec_from_partition(&p.model, partition, 2, 1,
                                               &spec, &err), 0);
    spec.tp = 2;
    size_t floats = 0;
    assert_true(stage_parameter_layout(&p.model, &spec, NULL, &floats,
                                       &err) > 0);
    assert_true(run_blob_bytes(dir, "params.rank2") == 4 * floats);
    assert_true(run_blob_bytes(dir, "adam_v.rank2") == 4 * floats);
    int vocab_rows = (p.model.vocab + 1) / 2;
    assert_true(floats > (size_t)vocab_rows * (size_t)p.model.hidden);
    run_expect_resume_matches(&p, options, dir, &straight, &first);
    plan_free(&p);
}

/* tp 4 over 2 key/value heads would copy them (Megatron's layout): not
 * run; the cuda backend's Llama layer takes head sizes of multiples of 8
 * only (16 heads of 4 channels here). */
static void refusals(void **state)
{
    plan p;
    llama_plan(&p, 4, 1, 1, NULL);
    run_options options = run_test_warm_options(*state, 1);
    run_expect_refusal(&p, &options, "kv_heads 2: tp 4 does not divide them");
    plan_free(&p);
    llama_plan(&p, 1, 1, 1, NULL);
    p.model.heads = 16;
    options.backend = BACKEND_CUDA;
    run_expect_refusal(&p, &options, "model llama-tiny: hidden 64 over 16 "
                                     "heads: the cuda backend's Llama layer "
                                     "needs a head size that is a multiple "
                                     "of 8, not 4");
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tp2_splits_query_and_key_value_heads),
        cmocka_unit_test(pp2_puts_the_untied_head_on_the_last_stage),
        cmocka_unit_test(dp2_and_zero_levels),
        cmocka_unit_test(products_of_degrees),
        cmocka_unit_test(recompute_changes_nothing),
        cmocka_unit_test(loss_falls),
        cmocka_unit_test(checkpoint_resumes_exactly),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
