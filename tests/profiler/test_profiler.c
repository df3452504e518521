/*
 * The profiler (profiler/profiler.c): the median and spread of timed
 * runs, the checks of its options, and a whole measurement of a tiny
 * model on the cpu backend: every point that the shape allows is there,
 * the others are skipped with a note, progress reaches its total; the
 * profile's communication curves from the curves of every GPU count. No
 * time is asserted beyond being positive.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "profiler/profiler.h"

static void test_summary_of_odd_and_even_counts(void **state)
{
    (void)state;
    const double odd[] = {5.0, 1.0, 3.0, 2.0, 4.0};
    timing_summary s = timing_summarize(odd, 5);
    assert_int_equal(s.runs, 5);
    assert_float_equal(s.median_s, 3.0, 1e-12);
    /* quartiles 2 and 4: range 2 over median 3 */
    assert_float_equal(s.spread, 2.0 / 3.0, 1e-12);
    const double even[] = {4.0, 1.0, 3.0, 2.0};
    s = timing_summarize(even, 4);
    assert_float_equal(s.median_s, 2.5, 1e-12);
    /* quartiles at positions 0.75 and 2.25: 1.75 and 3.25 */
    assert_float_equal(s.spread, 1.5 / 2.5, 1e-12);
    assert_float_equal(odd[0], 5.0, 0.0); /* the input is left as is */
}

/* A round's backward is its pair less its forward, floored at 5 % of the
 * pair where noise makes the forward look as long as the pair; the
 * backward's median is then that of those rounds. */
static void test_backward_from_pairs(void **state)
{
    (void)state;
    const double forward[] = {1.0, 1.1, 0.9, 2.0, 1.0};
    const double pair[] = {3.0, 3.2, 2.9, 2.0, 3.1};
    double backward[5];
    profiler_backward_rounds(forward, pair, 5, backward);
    assert_float_equal(backward[0], 2.0, 1e-12);
    assert_float_equal(backward[1], 2.1, 1e-12);
    assert_float_equal(backward[2], 2.0, 1e-12);
    assert_float_equal(backward[3], 0.1, 1e-12); /* floored: 5 % of 2.0 */
    assert_float_equal(backward[4], 2.1, 1e-12);
    timing_summary s = timing_summarize(backward, 5);
    assert_float_equal(s.median_s, 2.0, 1e-12);
    /* one wild round moves the median of the forwards not at all */
    const double noisy[] = {1.0, 1.0, 1.0, 1.0, 9.0};
    assert_float_equal(timing_summarize(noisy, 5).median_s, 1.0, 0.0);
}

static void test_summary_of_one_run(void **state)
{
    (void)state;
    const double one[] = {0.25};
    timing_summary s = timing_summarize(one, 1);
    assert_float_equal(s.median_s, 0.25, 0.0);
    assert_float_equal(s.spread, 0.0, 0.0);
    assert_int_equal(timing_summarize(one, 0).runs, 0);
}

static void expect_refused(const profiler_options *options,
                           const char *fragment)
{
    pt_error err = {{0}};
    assert_int_equal(profiler_options_check(options, &err), -1);
    if (strstr(err.message, fragment) == NULL)
        fail_msg("'%s' not in '%s'", fragment, err.message);
}

static void test_option_checks(void **state)
{
    (void)state;
    pt_error err = {{0}};
    profiler_options options = profiler_options_defaults(BACKEND_CPU);
    assert_int_equal(profiler_options_check(&options, &err), 0);
    profiler_options bad = options;
    bad.tp_values[1] = 3;
    expect_refused(&bad, "tp 3 is not a power of two");
    bad = options;
    bad.mbs_values[2] = 1;
    expect_refused(&bad, "ascend");
    bad = options;
    bad.tp_count = 0;
    expect_refused(&bad, "1 to 16");
    bad = options;
    bad.min_timed_runs = bad.timed_runs + 1;
    expect_refused(&bad, "timed");
    bad = options;
    bad.sm_limit = 16;
    expect_refused(&bad, "cuda backend");
    /* the rounds of every set of stages are pooled: at most 256 in all */
    bad = options;
    bad.stage_sets = 0;
    expect_refused(&bad, "sets of stages");
    bad = options;
    bad.stage_sets = 16;
    bad.embedding_sets = 0;
    bad.timing_rounds = 17;
    expect_refused(&bad, "17 timing rounds of 16 sets of stages");
    bad.timing_rounds = 16;
    assert_int_equal(profiler_options_check(&bad, &err), 0);
    /* the embedding's sets: none (as many as the stages') or at least
     * the stages' (defaults: 1 set of stages, 4 of the embedding) */
    bad = options;
    assert_int_equal(bad.stage_sets, 1);
    assert_int_equal(bad.embedding_sets, 4);
    bad.stage_sets = 3;
    bad.embedding_sets = 2;
    expect_refused(&bad, "2 sets of the embedding, fewer than the 3 sets");
    /* defaults: 3 rounds of about 5 ms */
    assert_int_equal(bad.timing_rounds, 3);
    assert_true(bad.round_s == 0.005);
    bad.embedding_sets = 86;
    expect_refused(&bad, "3 timing rounds of 86 sets");
    bad.embedding_sets = 85;
    assert_int_equal(profiler_options_check(&bad, &err), 0);
    /* 1 to 16 processes; 8 by default on the cuda backend, 1 on the cpu */
    assert_int_equal(options.processes, 1);
    assert_int_equal(profiler_options_defaults(BACKEND_CUDA).processes, 8);
    bad = options;
    bad.processes = 0;
    expect_refused(&bad, "0 processes; expected 1 to 16");
    bad.processes = 17;
    expect_refused(&bad, "17 processes");
    /* busy neighbours need a measured slice, on the cuda backend */
    profiler_options cuda = profiler_options_defaults(BACKEND_CUDA);
    cuda.beside_count = 1;
    cuda.beside_sms[0] = 16;
    expect_refused(&cuda, "an SM limit");
    cuda.sm_limit = 16;
    assert_int_equal(profiler_options_check(&cuda, &err), 0);
    /* the measured slice's place: 0 .. the neighbours' count */
    cuda.beside_place = 1;
    assert_int_equal(profiler_options_check(&cuda, &err), 0);
    cuda.beside_place = 2;
    expect_refused(&cuda, "place 2 is outside the split of 2 slices");
    cuda.beside_place = -1;
    expect_refused(&cuda, "place -1");
    cuda.beside_place = 0;
    cuda.neighbours_idle = true;
    assert_int_equal(profiler_options_check(&cuda, &err), 0);
    cuda.beside_sms[0] = 0;
    expect_refused(&cuda, "neighbour slice 1 has 0 SMs");
    cuda.beside_sms[0] = 16;
    cuda.beside_count = 0;
    expect_refused(&cuda, "idle neighbours need neighbour slices");
    bad = options;
    bad.beside_count = 1;
    bad.beside_sms[0] = 16;
    expect_refused(&bad, "cuda backend");
    /* a layer stack of 1 (the default) to 256 layers */
    assert_int_equal(options.layer_stack, 1);
    bad = options;
    bad.layer_stack = 0;
    expect_refused(&bad, "a layer stack of 0 layers; expected 1 to 256");
    bad.layer_stack = PROFILER_MAX_LAYER_STACK + 1;
    expect_refused(&bad, "257 layers");
    bad.layer_stack = PROFILER_MAX_LAYER_STACK;
    assert_int_equal(profiler_options_check(&bad, &err), 0);
}

/* The default name says the SM limit and the busy neighbours. */
static void test_default_gpu_names(void **state)
{
    (void)state;
    profiled_device device = {.name = "NVIDIA H200"};
    profiler_options o = profiler_options_defaults(BACKEND_CUDA);
    char name[PT_NAME_MAX];
    profiler_default_gpu_name(&device, &o, name, sizeof name);
    assert_string_equal(name, "H200");
    o.sm_limit = 16;
    profiler_default_gpu_name(&device, &o, name, sizeof name);
    assert_string_equal(name, "H200-16SM");
    o.beside_count = 3;
    o.beside_sms[0] = 40, o.beside_sms[1] = 40, o.beside_sms[2] = 16;
    profiler_default_gpu_name(&device, &o, name, sizeof name);
    assert_string_equal(name, "H200-16SM-beside-40-40-16");
    /* a slice at its rank's place, its neighbours idle */
    o.beside_place = 2;
    o.neighbours_idle = true;
    profiler_default_gpu_name(&device, &o, name, sizeof name);
    assert_string_equal(name, "H200-16SM-place-2-beside-40-40-16-idle");
    o.backend = BACKEND_CPU;
    profiler_default_gpu_name(&device, &o, name, sizeof name);
    assert_string_equal(name, "cpu");
}

typedef struct progress_log {
    int calls;
    int last_done;
    int total;
    int points;
} progress_log;

static void record_progress(int done, int total, const char *label,
                            const profiled_point *point, void *data)
{
    progress_log *log = data;
    assert_non_null(label);
    assert_true(done >= log->last_done);
    log->calls++;
    log->last_done = done;
    log->total = total;
    log->points += point != NULL;
}

static void assert_positive(const profiled_part *part)
{
    assert_true(part->forward.median_s > 0.0);
    assert_true(part->backward.median_s > 0.0);
    assert_true(part->forward.spread >= 0.0);
    assert_int_equal(part->forward.runs, 3);
}

/* The quick options on the cpu with the tp list given and micro-batches
 * 1 and 2, progress recorded into log. */
static profiler_options tiny_options(const int *tp, int tp_count,
                                     progress_log *log)
{
    profiler_options options = profiler_options_defaults(BACKEND_CPU);
    profiler_options_quick(&options);
    options.tp_count = tp_count;
    memcpy(options.tp_values, tp, (size_t)tp_count * sizeof(int));
    options.mbs_count = 2;
    memcpy(options.mbs_values, (int[]){1, 2}, 2 * sizeof(int));
    options.progress = record_progress;
    options.progress_data = log;
    return options;
}

/* A tiny GPT measured with the options (test_free the result). */
static profiler_result *measure_tiny(const profiler_options *options)
{
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 32,
                         .heads = 4, .ffn_hidden = 128, .seq = 16,
                         .vocab = 100, .tied_embeddings = true};
    profiler_result *result = test_calloc(1, sizeof *result);
    pt_error err = {{0}};
    if (profiler_measure(&shape, options, result, &err) != 0)
        fail_msg("%s", err.message);
    return result;
}

static void test_tiny_model_on_cpu(void **state)
{
    (void)state;
    progress_log log = {0};
    profiler_options options = tiny_options((int[]){1, 2, 8}, 3, &log);
    options.timed_runs = options.min_timed_runs = 3;
    assert_int_equal(options.timing, PROFILER_TIMING_GATED);
    profiler_result *result = measure_tiny(&options);
    assert_int_equal(result->point_count, 4);
    const int expected[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}};
    for (int i = 0; i < 4; i++) {
        const profiled_point *p = &result->points[i];
        assert_int_equal(p->tp, expected[i][0]);
        assert_int_equal(p->mbs, expected[i][1]);
        assert_positive(&p->embedding);
        assert_positive(&p->layer);
        assert_positive(&p->head);
        /* no CUDA graphs or gates on the cpu, whatever the option says:
         * every round queued on the host clock */
        for (int part = 0; part < 3; part++)
            assert_int_equal(p->timed[part], PROFILER_TIMING_HOST);
        /* the cpu backend never fuses the head (head.fused) */
        assert_false(p->head_fused);
    }
    assert_int_equal(result->note_count, 1);
    assert_non_null(strstr(result->notes[0], "tp 8 skipped"));
    assert_true(result->optimizer_s_per_param > 0.0);
    assert_true(result->layer_parameters > 0.0);
    assert_true(result->embedding_parameters > 0.0);
    assert_non_null(strstr(result->device.name, "cpu"));
    assert_int_equal(log.points, 4);
    assert_int_equal(log.total, 7); /* 3 tp x 2 mbs + the optimizer */
    assert_int_equal(log.last_done, log.total);
    test_free(result);
}

/* Three sets of stages: every entry is the median of the rounds of all
 * three (3 x 3), the AdamW step of the first set's 3, and the progress
 * counts each set of each point. */
static void test_sets_of_stages_pool_their_rounds(void **state)
{
    (void)state;
    progress_log log = {0};
    profiler_options options = tiny_options((int[]){1, 2}, 2, &log);
    assert_int_equal(options.stage_sets, 1);
    options.stage_sets = 3;
    profiler_result *result = measure_tiny(&options);
    assert_int_equal(result->point_count, 4);
    for (int i = 0; i < 4; i++) {
        const profiled_part *parts[] = {&result->points[i].embedding,
                                        &result->points[i].layer,
                                        &result->points[i].head};
        for (int part = 0; part < 3; part++) {
            assert_int_equal(parts[part]->forward.runs, 9);
            assert_int_equal(parts[part]->backward.runs, 9);
            assert_true(parts[part]->forward.median_s > 0.0);
            assert_true(parts[part]->backward.median_s > 0.0);
        }
        assert_int_equal(result->points[i].tp, i < 2 ? 1 : 2);
        assert_int_equal(result->points[i].mbs, 1 + i % 2);
        assert_true(result->points[i].calls_per_round[1] >= 1);
    }
    assert_int_equal(result->optimizer_layer.runs, 3);
    assert_int_equal(log.points, 4);
    assert_int_equal(log.last_done, log.total);
    /* each set of each point a step, and the optimizer's */
    assert_int_equal(log.total, 2 * 2 * 3 + 1);
    test_free(result);
}

/* Two sets of stages and five of the embedding: the embedding's entries
 * pool 5 x 3 rounds (its stage made again three times), the layer's and
 * the head's 2 x 3; the progress counts the sets of stages only. */
static void test_embedding_made_again_for_its_sets(void **state)
{
    (void)state;
    progress_log log = {0};
    profiler_options options = tiny_options((int[]){1, 2}, 2, &log);
    options.stage_sets = 2;
    options.embedding_sets = 5;
    profiler_result *result = measure_tiny(&options);
    assert_int_equal(result->point_count, 4);
    for (int i = 0; i < 4; i++) {
        const profiled_point *p = &result->points[i];
        assert_int_equal(p->embedding.forward.runs, 15);
        assert_int_equal(p->embedding.backward.runs, 15);
        assert_true(p->embedding.forward.median_s > 0.0);
        assert_int_equal(p->layer.forward.runs, 6);
        assert_int_equal(p->head.backward.runs, 6);
    }
    assert_int_equal(log.total, 2 * 2 * 2 + 1);
    assert_int_equal(log.last_done, log.total);
    assert_int_equal(log.points, 4);
    test_free(result);
}

/* A stack of the tiny model's two layers: every point says it stacked
 * two, the AdamW step covers both layers' parameters (twice the lone
 * layer's, exactly); more layers than the model holds are cut to its two
 * with a note. */
static void test_layer_stack_of_the_model(void **state)
{
    (void)state;
    progress_log log = {0};
    profiler_options options = tiny_options((int[]){1, 2}, 2, &log);
    profiler_result *lone = measure_tiny(&options);
    progress_log again = {0};
    options.progress_data = &again;
    options.layer_stack = 3;
    profiler_result *stack = measure_tiny(&options);
    assert_int_equal(stack->point_count, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(lone->points[i].layers_stacked, 1);
        assert_int_equal(stack->points[i].layers_stacked, 2);
        assert_int_equal(stack->points[i].tp, lone->points[i].tp);
        assert_int_equal(stack->points[i].mbs, lone->points[i].mbs);
        assert_positive(&stack->points[i].layer);
    }
    assert_float_equal(stack->layer_parameters, 2 * lone->layer_parameters,
                       0.0);
    assert_int_equal(lone->note_count, 0);
    assert_int_equal(stack->note_count, 1);
    assert_string_equal(stack->notes[0],
                        "a layer stack of the model's 2 layers, not 3");
    test_free(stack);
    test_free(lone);
}

/* A curve of the profile from the curves of every GPU count measured:
 * two counts (2 and 4 GPUs) of two sizes each give all-reduce,
 * reduce-scatter and all-gather samples of both counts, sorted by GPUs
 * then bytes, and send/recv only the 2-GPU count's (it is measured
 * between GPUs 0 and 1 alone); a sample's compute_lost is written where
 * it was measured. */
static void test_curves_of_every_gpu_count(void **state)
{
    (void)state;
    progress_log log = {0};
    profiler_options options = tiny_options((int[]){1}, 1, &log);
    profiler_result *result = measure_tiny(&options);
    profiler_comm_result *comm = test_calloc(1, sizeof *comm);
    comm->count_sets = 2;
    comm->sample_count = 2;
    for (int c = 0; c < 2; c++) {
        profiled_comm_curves *set = &comm->curves[c];
        set->gpus = 2 << c;
        for (int i = 0; i < 2; i++) {
            profiled_comm_sample sample = {
                .bytes = 4096.0 * (1 << i),
                .time = {.median_s = 1e-5 * (1 + i + 2 * c)}};
            set->allreduce[i] = set->reduce_scatter[i] = sample;
            set->all_gather[i] = sample;
            if (set->gpus == 2)
                set->sendrecv[i] = sample;
        }
    }
    /* measured beside products at one size of one count */
    comm->curves[0].all_gather[1].compute_lost = 0.4;
    model_shape shape = {.name = "tiny", .layers = 2, .hidden = 32,
                         .heads = 4, .ffn_hidden = 128, .seq = 16,
                         .vocab = 100, .tied_embeddings = true};
    profiler_writeup writeup = {.model_count = 1, .shapes = &shape,
                                .options = &options, .results = result,
                                .comm = comm, .gpu = "cpu",
                                .command_line = "partita profile",
                                .date_utc = "2026-11-29T00:00:00Z"};
    pt_error err = {{0}};
    json_t *root = profiler_profile_json(&writeup, "test.json", &err);
    if (root == NULL)
        fail_msg("%s", err.message);
    const json_t *curves = json_object_get(root, "communication");
    const char *collectives[] = {"allreduce", "reducescatter", "allgather"};
    for (int k = 0; k < 3; k++) {
        const json_t *samples = json_object_get(curves, collectives[k]);
        assert_int_equal(json_array_size(samples), 4);
        const int gpus[] = {2, 2, 4, 4};
        for (size_t i = 0; i < 4; i++) {
            const json_t *sample = json_array_get(samples, i);
            assert_int_equal(
                json_integer_value(json_object_get(sample, "gpus")),
                gpus[i]);
        }
    }
    /* compute_lost where measured, and nowhere else */
    const json_t *gathers = json_object_get(curves, "allgather");
    for (size_t i = 0; i < 4; i++) {
        const json_t *lost =
            json_object_get(json_array_get(gathers, i), "compute_lost");
        if (i == 1)
            assert_true(json_real_value(lost) == 0.4);
        else
            assert_null(lost);
    }
    const json_t *sendrecv = json_object_get(curves, "sendrecv");
    assert_int_equal(json_array_size(sendrecv), 2);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(sendrecv, 1), "gpus")),
                     2);
    json_decref(root);
    test_free(comm);
    test_free(result);
}

static void test_comm_needs_nccl_and_two_gpus(void **state)
{
    (void)state;
    char reason[160] = "";
    if (profiler_comm_available(reason, sizeof reason))
        skip();
    assert_true(reason[0] != '\0');
    profiler_options options = profiler_options_defaults(BACKEND_CUDA);
    profiler_comm_result *out = test_calloc(1, sizeof *out);
    pt_error err = {{0}};
    assert_int_equal(
        profiler_measure_comm(&options, 4096, 1 << 20, out, &err), -1);
    assert_true(err.message[0] != '\0');
    test_free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_of_odd_and_even_counts),
        cmocka_unit_test(test_summary_of_one_run),
        cmocka_unit_test(test_backward_from_pairs),
        cmocka_unit_test(test_option_checks),
        cmocka_unit_test(test_default_gpu_names),
        cmocka_unit_test(test_tiny_model_on_cpu),
        cmocka_unit_test(test_curves_of_every_gpu_count),
        cmocka_unit_test(test_sets_of_stages_pool_their_rounds),
        cmocka_unit_test(test_embedding_made_again_for_its_sets),
        cmocka_unit_test(test_layer_stack_of_the_model),
        cmocka_unit_test(test_comm_needs_nccl_and_two_gpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
