/*
 * Parallel plans (pp, dp and/or tp > 1) under run_training, cpu
 * backend, ranks as threads: every layout trains on the same samples from
 * the same initial weights as the one-stage run, so its losses and
 * gradient norms match within fp32 round-off (with the distributed
 * optimizer, ZeRO-1, too); a pp = 2 run resumed from
 * its checkpoint equals the straight run bit for bit, under the
 * interleaved 1F1B too; the record holds
 * one device, one memory figure and events for every rank; the stop flag
 * ends the run after the current iteration with a checkpoint; too little
 * memory for the ranks together, a parallel plan on cuda without the
 * GPUs it names and a checkpoint of another layout are refused.
 */
#include "run_test_support.h"

#include <math.h>

#define LAYERS 4
#define GBS 4
#define MBS 1
#define ITERATIONS 3

/* A plan of the tiny model on one node of tp x dp x pp "gpus". */
static void parallel_plan(plan *out, int tp, int dp, int pp,
                          const char *partition, const char *schedule)
{
    char extra[128] = "";
    if (partition != NULL)
        snprintf(extra, sizeof extra, ", \"partition\": \"%s\"", partition);
    char text[1400];
    snprintf(text, sizeof text,
             "{ \"model\": { \"name\": \"tiny\", \"layers\": %d, "
             "\"hidden\": 16, \"heads\": 2, \"seq\": 16, \"vocab\": 257 },"
             "  \"cluster\": { \"name\": \"one\", \"nodes\": ["
             "    { \"name\": \"box\", \"gpu\": \"A100-FASOP\", \"gpus\": %d,"
             "      \"intra_node\": { \"bandwidth_GBps\": 230,"
             "                        \"latency_us\": 5 } } ] },"
             "  \"gbs\": %d, \"mbs\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d,"
             "  \"schedule\": \"%s\"%s }",
             LAYERS, tp * dp * pp, GBS, MBS, tp, dp, pp, schedule, extra);
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    assert_non_null(root);
    pt_error err = {{0}};
    int status = plan_from_json(root, NULL, out, &err);
    if (status != 0)
        fprintf(stderr, "%s\n", err.message);
    assert_int_equal(status, 0);
    json_decref(root);
}

static run_options base_options(const run_scratch *s, long iterations)
{
    run_options options = run_options_defaults(iterations);
    options.data_prefix = s->corpus;
    /* a little warm-up so the learning rate changes between steps */
    options.train.schedule.warmup_steps = 1;
    return options;
}

/* The layout's run against the one-stage run on the same data and seed;
 * zero1: with the distributed optimizer. */
static void expect_run_same_as_one_stage(const run_scratch *s, int tp,
                                         int dp, int pp,
                                         const char *partition,
                                         const char *schedule, bool zero1)
{
    plan one, parallel;
    parallel_plan(&one, 1, 1, 1, NULL, "1f1b");
    parallel_plan(&parallel, tp, dp, pp, partition, schedule);
    parallel.config.distributed_optimizer = zero1;
    run_options options = base_options(s, ITERATIONS);
    run_result reference, result;
    run_train_ok(&one, &options, &reference);
    run_train_ok(&parallel, &options, &result);
    assert_int_equal(result.iteration_count, ITERATIONS);
    assert_int_equal(result.rank_count, tp * dp * pp);
    run_expect_same_iterations(&result, &reference, ITERATIONS, "this layout");
    run_result_free(&reference);
    run_result_free(&result);
    plan_free(&one);
    plan_free(&parallel);
}

static void expect_tp_same_as_one_stage(const run_scratch *s, int tp, int dp,
                                        int pp, const char *partition,
                                        const char *schedule)
{
    expect_run_same_as_one_stage(s, tp, dp, pp, partition, schedule, false);
}

static void expect_same_as_one_stage(const run_scratch *s, int dp, int pp,
                                     const char *partition,
                                     const char *schedule)
{
    expect_tp_same_as_one_stage(s, 1, dp, pp, partition, schedule);
}

static void pp2_uneven_1f1b_matches_one_stage(void **state)
{
    expect_same_as_one_stage(*state, 1, 2, "3-1", "1f1b");
}

static void pp3_with_empty_stage_matches_one_stage(void **state)
{
    expect_same_as_one_stage(*state, 1, 3, "2-0-2", "gpipe");
}

static void dp2_matches_one_stage(void **state)
{
    expect_same_as_one_stage(*state, 2, 1, NULL, "1f1b");
}

static void pp2_dp2_matches_one_stage(void **state)
{
    expect_same_as_one_stage(*state, 2, 2, "1-3", "1f1b");
}

static void tp2_matches_one_stage(void **state)
{
    expect_tp_same_as_one_stage(*state, 2, 1, 1, NULL, "1f1b");
}

static void pp2_tp2_matches_one_stage(void **state)
{
    expect_tp_same_as_one_stage(*state, 2, 1, 2, "3-1", "1f1b");
}

/* Full activation recompute: the same arithmetic, so the same bits as
 * the layout without it; each rank's activation memory is smaller. */
static void expect_recompute_changes_nothing(const run_scratch *s, int tp,
                                             int dp, int pp,
                                             const char *partition)
{
    plan keep, recompute;
    parallel_plan(&keep, tp, dp, pp, partition, "1f1b");
    parallel_plan(&recompute, tp, dp, pp, partition, "1f1b");
    recompute.config.recompute = true;
    run_options options = base_options(s, ITERATIONS);
    run_result kept, recomputed;
    run_train_ok(&keep, &options, &kept);
    run_train_ok(&recompute, &options, &recomputed);
    for (long i = 0; i < ITERATIONS; i++) {
        const run_iteration *got = &recomputed.iterations[i];
        const run_iteration *want = &kept.iterations[i];
        if (got->loss != want->loss || got->grad_norm != want->grad_norm)
            fail_msg("iteration %ld: recomputed loss %.9g norm %.9g, kept "
                     "%.9g %.9g",
                     got->iteration, got->loss, got->grad_norm, want->loss,
                     want->grad_norm);
    }
    /* a rank keeping one micro-batch of one layer saves nothing (that
     * layer's activations move to the shared set); the others do */
    double kept_total = 0.0, recomputed_total = 0.0;
    for (int rank = 0; rank < kept.rank_count; rank++) {
        assert_true(recomputed.rank_peak_memory_bytes[rank] <=
                    kept.rank_peak_memory_bytes[rank]);
        kept_total += kept.rank_peak_memory_bytes[rank];
        recomputed_total += recomputed.rank_peak_memory_bytes[rank];
    }
    assert_true(recomputed_total < kept_total);
    for (int n = 0; n < recomputed.note_count; n++)
        assert_null(strstr(recomputed.notes[n], "recompute"));
    run_result_free(&kept);
    run_result_free(&recomputed);
    plan_free(&keep);
    plan_free(&recompute);
}

static void pp2_recompute_changes_nothing(void **state)
{
    expect_recompute_changes_nothing(*state, 1, 1, 2, "3-1");
}

static void tp2_dp2_recompute_changes_nothing(void **state)
{
    expect_recompute_changes_nothing(*state, 2, 2, 1, NULL);
}

/* ZeRO-1: each replica steps its shard of the parameters and the
 * all-gather brings the others' */
static void dp2_zero1_matches_one_stage(void **state)
{
    expect_run_same_as_one_stage(*state, 1, 2, 1, NULL, "1f1b", true);
}

/* the tied embedding's two copies are summed before the reduce-scatter;
 * shards cut the first and last stages' buffers differently */
static void pp2_dp2_zero1_matches_one_stage(void **state)
{
    expect_run_same_as_one_stage(*state, 1, 2, 2, "1-3", "1f1b", true);
}

static void tp2_dp2_zero1_matches_one_stage(void **state)
{
    expect_run_same_as_one_stage(*state, 2, 2, 1, NULL, "1f1b", true);
}

/* A ZeRO-1 checkpoint holds each replica's shard of the AdamW moments,
 * resumes bit for bit, and only under a plan with the same optimizer. */
static void dp2_zero1_checkpoint_holds_shards_and_resumes(void **state)
{
    run_scratch *s = *state;
    plan p;
    parallel_plan(&p, 1, 2, 1, NULL, "1f1b");
    p.config.distributed_optimizer = true;
    run_options options = base_options(s, 4);
    run_result straight, first;
    run_train_ok(&p, &options, &straight);
    char dir[512];
    run_path(s, "zero1-checkpoint", dir, sizeof dir);
    run_options first_half = options;
    first_half.iterations = 2;
    first_half.save_dir = dir;
    run_train_ok(&p, &first_half, &first);
    uint64_t params = run_blob_bytes(dir, "params.rank0");
    uint64_t shard0 = run_blob_bytes(dir, "adam_m.rank0");
    uint64_t shard1 = run_blob_bytes(dir, "adam_v.rank1");
    assert_true(shard0 < params && shard1 < params);
    assert_int_equal(shard0 + shard1, params);
    run_options resumed =
        run_expect_resume_matches(&p, options, dir, &straight, &first);
    p.config.distributed_optimizer = false;
    pt_error err = {{0}};
    run_result refused;
    assert_int_equal(run_training(&p, &resumed, &refused, &err), -1);
    run_result_free(&refused);
    assert_message_has(&err, "distributed_optimizer");
    plan_free(&p);
}

/* 4 iterations straight, against 2 + checkpoint + resume + 2. */
static void pp2_resume_equals_straight_run(void **state)
{
    run_scratch *s = *state;
    plan p;
    parallel_plan(&p, 1, 1, 2, "3-1", "1f1b");
    run_options options = base_options(s, 4);
    run_result straight, first, second;
    run_train_ok(&p, &options, &straight);

    char dir[512];
    run_path(s, "pp2-checkpoint", dir, sizeof dir);
    run_options first_half = options;
    first_half.iterations = 2;
    first_half.train.schedule = options.train.schedule; /* of the 4-run */
    first_half.save_dir = dir;
    run_train_ok(&p, &first_half, &first);
    assert_int_equal(first.last_checkpoint_iteration, 2);
    /* every rank's stage is saved under its own name */
    uint64_t bytes = 0;
    pt_error blob_err = {{0}};
    assert_int_equal(checkpoint_blob_size(dir, "params.rank1", &bytes,
                                          &blob_err),
                     0);
    assert_true(bytes > 0);
    assert_int_equal(checkpoint_blob_size(dir, "adam_v.rank0", &bytes,
                                          &blob_err),
                     0);
    assert_int_equal(checkpoint_blob_size(dir, "params", &bytes, &blob_err),
                     -1);

    run_options resumed = options;
    resumed.load_dir = dir;
    run_train_ok(&p, &resumed, &second);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(first.iterations[i].iteration, i + 1);
        assert_true(first.iterations[i].loss == straight.iterations[i].loss);
    }
    run_expect_resumed_equals_straight(&second, &straight);
    run_result_free(&straight);
    run_result_free(&first);
    run_result_free(&second);

    /* the checkpoint resumes only under its own layout */
    plan other;
    parallel_plan(&other, 1, 1, 2, "2-2", "1f1b");
    pt_error err = {{0}};
    run_result refused;
    assert_int_equal(run_training(&other, &resumed, &refused, &err), -1);
    run_result_free(&refused);
    assert_message_has(&err, "another layout");
    assert_message_has(&err, "partition[0]");
    plan_free(&other);
    parallel_plan(&other, 1, 1, 1, NULL, "1f1b");
    assert_int_equal(run_training(&other, &resumed, &refused, &err), -1);
    run_result_free(&refused);
    assert_message_has(&err, "pp is 2");
    plan_free(&other);
    /* and only under the precision recipe that wrote it (issue 34) */
    parallel_plan(&other, 1, 1, 2, "3-1", "1f1b");
    other.config.grad_precision = GRAD_PRECISION_BF16;
    assert_int_equal(run_training(&other, &resumed, &refused, &err), -1);
    run_result_free(&refused);
    assert_message_has(&err, "another precision recipe: meta.json: "
                             "grad_precision is fp32, the run's is bf16");
    plan_free(&other);
    plan_free(&p);
}

static bool has_kind_of_rank(json_t *events, int rank, const char *kind)
{
    size_t i;
    json_t *event;
    json_array_foreach(events, i, event)
    {
        if (json_integer_value(json_object_get(event, "rank")) == rank &&
            strcmp(json_string_value(json_object_get(event, "kind")),
                   kind) == 0)
            return true;
    }
    return false;
}

static void pp2_record_holds_every_rank(void **state)
{
    run_scratch *s = *state;
    plan p;
    parallel_plan(&p, 1, 1, 2, "3-1", "1f1b");
    run_options options = base_options(s, ITERATIONS);
    run_result result;
    run_train_ok(&p, &options, &result);
    json_t *plan_json = json_object();
    pt_error err = {{0}};
    json_t *root = run_to_json(&result, plan_json, 1e9, &err);
    assert_non_null(root);
    json_t *devices = json_object_get(root, "devices");
    assert_int_equal(json_array_size(devices), 2);
    for (int rank = 0; rank < 2; rank++)
        assert_int_equal(json_integer_value(json_object_get(
                             json_array_get(devices, (size_t)rank), "rank")),
                         rank);
    json_t *memory = json_object_get(root, "peak_memory_gib");
    assert_int_equal(json_array_size(memory), 2);
    /* stage 0 holds 3 layers and the embedding, stage 1 one layer and
     * the head: their figures differ and each is below the whole
     * model's */
    double whole = run_cpu_stage_bytes(&p.model, MBS, false, NULL) / PT_GIB;
    double rank0 = json_real_value(json_array_get(memory, 0));
    double rank1 = json_real_value(json_array_get(memory, 1));
    assert_true(rank0 > 0 && rank1 > 0 && rank0 != rank1);
    assert_true(rank1 < whole);
    json_t *events = json_object_get(root, "events");
    assert_true(json_array_size(events) > 2 * GBS + 1);
    assert_true(has_kind_of_rank(events, 0, "fwd"));
    assert_true(has_kind_of_rank(events, 0, "send_fwd"));
    assert_true(has_kind_of_rank(events, 0, "recv_bwd"));
    assert_true(has_kind_of_rank(events, 0, "optimizer"));
    assert_true(has_kind_of_rank(events, 1, "recv_fwd"));
    assert_true(has_kind_of_rank(events, 1, "bwd"));
    assert_true(has_kind_of_rank(events, 1, "send_bwd"));
    assert_true(has_kind_of_rank(events, 1, "optimizer"));
    size_t i;
    json_t *event;
    json_array_foreach(events, i, event)
    {
        double start = json_real_value(json_object_get(event, "start_s"));
        double end = json_real_value(json_object_get(event, "end_s"));
        assert_true(start >= 0.0 && end >= start);
    }
    json_decref(root);
    json_decref(plan_json);
    run_result_free(&result);
    plan_free(&p);
}

/* The stop flag of a run, raised once `after` iterations are done, as
 * the signal handler of partita exec would. */
typedef struct stop_order {
    volatile sig_atomic_t flag;
    int after;
} stop_order;

static void stop_when_done(const run_result *so_far, void *data)
{
    stop_order *order = data;
    if (so_far->iteration_count >= order->after)
        order->flag = 1;
}

/* Options that save into dir and stop after `order->after` iterations. */
static run_options stopping_options(run_options options, stop_order *order,
                                    const char *dir)
{
    options.stop = &order->flag;
    options.observer = stop_when_done;
    options.observer_data = order;
    options.save_dir = dir;
    return options;
}

static void pp2_stop_flag_ends_after_the_iteration(void **state)
{
    run_scratch *s = *state;
    plan p;
    parallel_plan(&p, 1, 1, 2, "3-1", "1f1b");
    char dir[512];
    run_path(s, "pp2-stopped", dir, sizeof dir);
    stop_order order = {.after = 1};
    run_options options = stopping_options(base_options(s, 50), &order, dir);
    run_result result;
    run_train_ok(&p, &options, &result);
    assert_true(result.stopped);
    assert_int_equal(result.iteration_count, 1);
    assert_int_equal(result.last_checkpoint_iteration, 1);
    assert_true(checkpoint_exists(dir));
    run_result_free(&result);
    plan_free(&p);
}

/* Plan p (interleaved) 4 iterations straight against a run stopped
 * after 2 with a checkpoint in dir and resumed: bit for bit. Returns the
 * resuming options. */
static run_options expect_stopped_run_resumes(const run_scratch *s,
                                              const plan *p, const char *dir)
{
    run_options options = base_options(s, 4);
    run_result straight, first;
    run_train_ok(p, &options, &straight);
    stop_order order = {.after = 2};
    run_options first_half = stopping_options(options, &order, dir);
    run_train_ok(p, &first_half, &first);
    assert_true(first.stopped);
    assert_int_equal(first.last_checkpoint_iteration, 2);
    return run_expect_resume_matches(p, options, dir, &straight, &first);
}

/* The interleaved 1F1B (2 chunks a rank): a run stopped after 2 of 4
 * iterations saves every chunk of every rank, and resumed it equals the
 * straight run bit for bit; the checkpoint resumes only under its own
 * virtual_stages. */
static void pp2_interleaved_stopped_run_resumes_exactly(void **state)
{
    run_scratch *s = *state;
    plan p;
    parallel_plan(&p, 1, 1, 2, "2-2", "1f1b");
    p.config.virtual_stages = 2;
    char dir[512];
    run_path(s, "pp2-v2-checkpoint", dir, sizeof dir);
    run_options resumed = expect_stopped_run_resumes(s, &p, dir);
    /* chunk 1 of each rank under its own name, beside chunk 0's */
    const char *const names[] = {"params.rank0", "adam_m.rank0.chunk1",
                                 "params.rank1.chunk1", "adam_v.rank1"};
    for (int i = 0; i < 4; i++)
        assert_true(run_blob_bytes(dir, names[i]) > 0);
    /* rank 0's chunk 0 holds the embedding, its chunk 1 does not */
    assert_true(run_blob_bytes(dir, "params.rank0") >
                run_blob_bytes(dir, "params.rank0.chunk1"));
    p.config.virtual_stages = 1;
    run_expect_refusal(&p, &resumed,
                   "another layout: meta.json: virtual_stages is 2");
    plan_free(&p);
}

/* ...with dp 2 and ZeRO-1: each chunk's moments are its replica's shard
 * of that chunk. */
static void pp2_dp2_zero1_interleaved_resumes_exactly(void **state)
{
    run_scratch *s = *state;
    plan p;
    parallel_plan(&p, 1, 2, 2, "2-2", "1f1b");
    p.config.virtual_stages = 2;
    p.config.distributed_optimizer = true;
    char dir[512];
    run_path(s, "pp2-dp2-v2-checkpoint", dir, sizeof dir);
    expect_stopped_run_resumes(s, &p, dir);
    /* ranks 0 and 1: the two replicas of stage 0 */
    assert_int_equal(run_blob_bytes(dir, "adam_m.rank0.chunk1") +
                         run_blob_bytes(dir, "adam_m.rank1.chunk1"),
                     run_blob_bytes(dir, "params.rank0.chunk1"));
    assert_true(run_blob_bytes(dir, "adam_v.rank1.chunk1") <
                run_blob_bytes(dir, "params.rank1.chunk1"));
    plan_free(&p);
}

static void cuda_parallel_and_memory_are_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    run_options options = base_options(s, 2);
    pt_error err = {{0}};
    parallel_plan(&p, 1, 1, 2, NULL, "1f1b");
    assert_int_equal(run_check_plan(&p, &err), 0);
    /* memory: the sum of the ranks' figures must fit */
    options.memory_available_bytes = 1024.0;
    run_expect_refusal(&p, &options, "the 2 ranks of this plan");
    options.memory_available_bytes = 0.0;
    /* on cuda, a parallel plan is checked against this machine's GPUs
     * before anything is allocated: refused here with no GPU (or no cuda
     * backend; a cuda backend built without NCCL takes the host-staged
     * comm and is refused for the GPUs too), and on a GPU machine for the
     * cluster's A100 type */
    options.backend = BACKEND_CUDA;
    run_result result;
    int status = run_training(&p, &options, &result, &err);
    run_result_free(&result);
    if (status != -1)
        fail_msg("expected a refusal, got %d (%s)", status, err.message);
    pt_error ignored = {{0}};
    if (backend_find(BACKEND_CUDA, &ignored) == NULL)
        assert_message_has(&err, "cuda backend is not built");
    else if (strstr(err.message, "GPU") == NULL &&
             strstr(err.message, "device") == NULL &&
             strstr(err.message, "NCCL") == NULL)
        fail_msg("expected a refusal naming the GPUs or NCCL, got \"%s\"",
                 err.message);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pp2_uneven_1f1b_matches_one_stage),
        cmocka_unit_test(pp3_with_empty_stage_matches_one_stage),
        cmocka_unit_test(dp2_matches_one_stage),
        cmocka_unit_test(pp2_dp2_matches_one_stage),
        cmocka_unit_test(pp2_resume_equals_straight_run),
        cmocka_unit_test(pp2_record_holds_every_rank),
        cmocka_unit_test(pp2_stop_flag_ends_after_the_iteration),
        cmocka_unit_test(pp2_interleaved_stopped_run_resumes_exactly),
        cmocka_unit_test(pp2_dp2_zero1_interleaved_resumes_exactly),
        cmocka_unit_test(tp2_matches_one_stage),
        cmocka_unit_test(pp2_tp2_matches_one_stage),
        cmocka_unit_test(pp2_recompute_changes_nothing),
        cmocka_unit_test(tp2_dp2_recompute_changes_nothing),
        cmocka_unit_test(dp2_zero1_matches_one_stage),
        cmocka_unit_test(pp2_dp2_zero1_matches_one_stage),
        cmocka_unit_test(tp2_dp2_zero1_matches_one_stage),
        cmocka_unit_test(dp2_zero1_checkpoint_holds_shards_and_resumes),
        cmocka_unit_test(cuda_parallel_and_memory_are_refused),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
