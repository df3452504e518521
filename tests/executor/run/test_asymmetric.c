/*
 * Plans whose stages run their own tp and dp (issue 36, item 4) under
 * run_training, cpu backend, ranks as threads, as test_parallel.c and
 * test_llama.c run the symmetric layouts: GPT-2's tiny model and the
 * Llama-shaped one train on the same samples from the same initial
 * weights as the one-stage run, so their losses and gradient norms match
 * within fp32 round-off (1e-5 relative), whether a boundary splits a
 * micro-batch over more replicas or merges it onto fewer, scatters an
 * activation over more tensor-parallel shards or gathers it from them,
 * with sequence parallelism, ZeRO-1/2/3 and full recompute; a run stopped
 * with a checkpoint and resumed equals the straight run bit for bit, and
 * its checkpoint resumes only under its own stages; the record names
 * every rank.
 */
#include "run_test_support.h"

#define GBS 4
#define ITERATIONS 3

/* A plan of GPT-2's tiny model (4 heads: tp up to 4) or, llama, the
 * Llama-shaped one (2 key/value heads: tp up to 2) on one node of `gpus`
 * "gpus": the plan-wide tp, dp, pp and mbs, and `extra` (", \"stages\":
 * [...]", a partition, levers) after them. */
static void asym_plan(plan *out, bool llama, int gpus, int tp, int dp, int pp,
                      int mbs, const char *extra)
{
    json_error_t json_err;
    json_t *model = llama ? run_test_llama_model()
                          : json_loads("{ \"name\": \"tiny\", \"layers\": 4, "
                                       "\"hidden\": 16, \"heads\": 4, "
                                       "\"seq\": 16, \"vocab\": 257 }",
                                       0, &json_err);
    assert_non_null(model);
    run_test_node_plan(out, model, gpus, GBS, mbs, tp, dp, pp, extra);
}

/* One layout of stages of their own degrees, and its levers. */
typedef struct asym_case {
    const char *name;
    int gpus, tp, dp, pp, mbs;
    const char *extra;           /* stages, partition and levers */
    int zero;
} asym_case;

/* The layout's losses and norms against the one-stage run's. */
static void expect_same_as_one_stage(const run_scratch *s, bool llama,
                                     const asym_case *c)
{
    plan one, parallel;
    asym_plan(&one, llama, 1, 1, 1, 1, 1, "");
    asym_plan(&parallel, llama, c->gpus, c->tp, c->dp, c->pp, c->mbs,
              c->extra);
    parallel_set_zero_stage(&parallel.config, c->zero);
    assert_true(plan_first_asymmetric_stage(&parallel) >= 0);
    run_options options = run_test_warm_options(s, ITERATIONS);
    run_result reference, result;
    run_train_ok(&one, &options, &reference);
    run_train_ok(&parallel, &options, &result);
    assert_int_equal(result.iteration_count, ITERATIONS);
    assert_int_equal(result.rank_count, c->gpus);
    char layout[160];
    snprintf(layout, sizeof layout, "%s%s", llama ? "llama, " : "",
             c->name);
    run_expect_same_iterations(&result, &reference, ITERATIONS, layout);
    bool noted = false;
    for (int n = 0; n < result.note_count; n++)
        noted |= strstr(result.notes[n], "stages of their own degrees") !=
                 NULL;
    assert_true(noted);
    run_result_free(&reference);
    run_result_free(&result);
    plan_free(&one);
    plan_free(&parallel);
}

/* stage 0 tp 1 x dp 2, stage 1 tp 2 x dp 1: each micro-batch's two
 * samples merged onto one replica, its activation scattered over two
 * shards; and the other way round */
static const asym_case merge = {
    "pp 2: tp 1 x dp 2, then tp 2 x dp 1", 4, 1, 2, 2, 1,
    ", \"partition\": \"2-2\", \"stages\": [{}, {\"tp\": 2, \"dp\": 1}]", 0};
static const asym_case split = {
    "pp 2: tp 2 x dp 1, then tp 1 x dp 2", 4, 2, 1, 2, 2,
    ", \"partition\": \"3-1\", \"stages\": [{}, {\"tp\": 1, \"dp\": 2}]", 0};
/* three stages, each its own, the first and last of different degrees */
static const asym_case three = {
    "pp 3: tp 1 x dp 2, tp 2 x dp 1, tp 1 x dp 1", 5, 1, 2, 3, 1,
    ", \"partition\": \"2-1-1\", \"stages\": "
    "[{}, {\"tp\": 2, \"dp\": 1}, {\"tp\": 1, \"dp\": 1}]",
    0};

static void gpt_two_stages(void **state)
{
    expect_same_as_one_stage(*state, false, &merge);
    expect_same_as_one_stage(*state, false, &split);
}

static void gpt_three_stages_and_recompute(void **state)
{
    expect_same_as_one_stage(*state, false, &three);
    asym_case recompute = three;
    recompute.name = "pp 3 mixed, recompute full";
    recompute.extra = ", \"partition\": \"2-1-1\", \"recompute\": \"full\", "
                      "\"stages\": [{}, {\"tp\": 2, \"dp\": 1}, "
                      "{\"tp\": 1, \"dp\": 1}]";
    expect_same_as_one_stage(*state, false, &recompute);
}

/* sequence parallelism: tp 2 x dp 2 then tp 4 x dp 1, each rank sending
 * and receiving its own rows of the micro-batch */
static void gpt_sequence_parallel(void **state)
{
    asym_case sp = {"pp 2, sequence parallel: tp 2 x dp 2, then tp 4 x dp 1",
                    8, 2, 2, 2, 1,
                    ", \"partition\": \"2-2\", \"sequence_parallel\": true, "
                    "\"stages\": [{}, {\"tp\": 4, \"dp\": 1}]",
                    0};
    expect_same_as_one_stage(*state, false, &sp);
}

static void gpt_zero(void **state)
{
    asym_case zero = merge;
    for (zero.zero = 1; zero.zero <= 3; zero.zero++) {
        char name[96];
        snprintf(name, sizeof name, "%s, ZeRO-%d", merge.name, zero.zero);
        zero.name = name;
        expect_same_as_one_stage(*state, false, &zero);
    }
    zero = three;
    zero.zero = 1;
    zero.name = "pp 3 mixed, ZeRO-1";
    expect_same_as_one_stage(*state, false, &zero);
}

static void llama_layouts(void **state)
{
    expect_same_as_one_stage(*state, true, &merge);
    expect_same_as_one_stage(*state, true, &split);
    expect_same_as_one_stage(*state, true, &three);
    /* the same tp, sequence parallel, the micro-batch merged */
    asym_case sp = {"pp 2, sequence parallel: tp 2 x dp 2, then tp 2 x dp 1",
                    6, 2, 2, 2, 1,
                    ", \"partition\": \"1-3\", \"sequence_parallel\": true, "
                    "\"stages\": [{}, {\"tp\": 2, \"dp\": 1}]",
                    0};
    expect_same_as_one_stage(*state, true, &sp);
    asym_case zero = split;
    zero.zero = 2;
    zero.name = "pp 2: tp 2 x dp 1, then tp 1 x dp 2, ZeRO-2";
    expect_same_as_one_stage(*state, true, &zero);
}

/* 4 iterations straight against 2, a checkpoint, and 2 resumed: the same
 * bits; the checkpoint resumes only under its own stages. */
static void checkpoint_resumes_exactly(void **state)
{
    const run_scratch *s = *state;
    plan p;
    asym_plan(&p, false, merge.gpus, merge.tp, merge.dp, merge.pp, merge.mbs,
              merge.extra);
    run_options options = run_test_warm_options(s, 4);
    run_result straight, first;
    run_train_ok(&p, &options, &straight);
    /* every rank recorded: its device, memory and events */
    assert_int_equal(straight.rank_count, 4);
    bool ranks_seen[4] = {false};
    for (int e = 0; e < straight.event_count; e++)
        ranks_seen[straight.events[e].rank] = true;
    for (int rank = 0; rank < 4; rank++) {
        assert_true(ranks_seen[rank]);
        assert_true(straight.rank_peak_memory_bytes[rank] > 0.0);
    }
    char dir[512];
    run_path(s, "asymmetric-checkpoint", dir, sizeof dir);
    run_options first_half = options;
    first_half.iterations = 2;
    first_half.save_dir = dir;
    run_train_ok(&p, &first_half, &first);
    assert_true(run_blob_bytes(dir, "params.rank3") > 0);
    run_options resumed =
        run_expect_resume_matches(&p, options, dir, &straight, &first);
    plan_free(&p);
    /* the symmetric plan of those plan-wide degrees: another layout */
    plan other;
    asym_plan(&other, false, 4, 1, 2, 2, 1, ", \"partition\": \"2-2\"");
    pt_error err = {{0}};
    run_result refused;
    assert_int_equal(run_training(&other, &resumed, &refused, &err), -1);
    run_result_free(&refused);
    assert_message_has(&err, "another layout");
    assert_message_has(&err, "stages");
    plan_free(&other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpt_two_stages),
        cmocka_unit_test(gpt_three_stages_and_recompute),
        cmocka_unit_test(gpt_sequence_parallel),
        cmocka_unit_test(gpt_zero),
        cmocka_unit_test(llama_layouts),
        cmocka_unit_test(checkpoint_resumes_exactly),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
