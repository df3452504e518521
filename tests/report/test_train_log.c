/* The readers of Megatron-LM and DeepSpeed logs: what they keep from good
 * logs (with the trainers' prefixes and older formats), and one message
 * naming the file and the line for malformed, truncated or foreign
 * ones. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report/report.h"

/* tp 1 x dp 2 x pp 2 on one node of 4 "GPUs": 4 ranks, gbs 8 of mbs 2. */
static const char *plan_text =
    "{ \"model\": { \"name\": \"small\", \"layers\": 4, \"hidden\": 64,"
    "             \"heads\": 4, \"seq\": 32, \"vocab\": 256 },"
    "  \"cluster\": { \"name\": \"box\", \"nodes\": ["
    "    { \"name\": \"box\", \"gpu\": \"H100\", \"gpus\": 4,"
    "      \"intra_node\": { \"bandwidth_GBps\": 200, \"latency_us\": 5 } }"
    "  ] },"
    "  \"gbs\": 8, \"mbs\": 2, \"tp\": 1, \"dp\": 2, \"pp\": 2 }";

/* Megatron-LM's lines for the plan above. */
#define ARGS_LINES                                                          \
    "------------------------ arguments ------------------------\n"         \
    "  data_parallel_size .............................. 2\n"               \
    "  global_batch_size ............................... 8\n"               \
    "  hidden_size ..................................... 64\n"              \
    "  micro_batch_size ................................ 2\n"               \
    "  num_layers ...................................... 4\n"               \
    "  pipeline_model_parallel_size .................... 2\n"               \
    "  rampup_batch_size ............................... None\n"            \
    "  seq_length ...................................... 32\n"              \
    "  tensor_model_parallel_size ...................... 1\n"               \
    "-------------------- end of arguments ---------------------\n"

#define ITERATION(n, ms, loss)                                              \
    " [2026-08-24 10:00:00.000000] iteration " n "/      20 | consumed "    \
    "samples:           40 | elapsed time per iteration (ms): " ms " | "    \
    "throughput per GPU (TFLOP/s/GPU): 12.5 | learning rate: 1.0E-04 | "    \
    "global batch size:     8 | lm loss: " loss " | loss scale: 1.0 | "     \
    "number of skipped iterations:   0 | number of nan iterations:   0 |"

static const char *good_megatron =
    "using world size: 4, data-parallel size: 2\n" ARGS_LINES
    "training ...\n"
    ITERATION("       5", "900.0", "1.000000E+01") "\n"
    "[Rank 0] (after 5 iterations) memory (MB) | allocated: 100.0 | max "
    "allocated: 2048.00 | reserved: 3000.0 | max reserved: 3000.0\n"
    "[Rank 2] (after 5 iterations) memory (MB) | allocated: 100.0 | max "
    "allocated: 1024.00 | reserved: 3000.0 | max reserved: 3000.0\n"
    ITERATION("      10", "410.0", "9.000000E+00") "\n"
    " validation loss at iteration 10 | lm loss value: 8.9E+00 | lm loss "
    "PPL: 7.3E+03 | \n"
    "saving checkpoint at iteration      10 to ckpt\n"
    ITERATION("      15", "400.0", "8.000000E+00") "\n"
    "[Rank 0] (after 15 iterations) memory (MB) | allocated: 100.0 | max "
    "allocated: 3072.00 | reserved: 3000.0 | max reserved: 3000.0\n"
    ITERATION("      20", "420.0", "7.000000E+00") "\n";

typedef struct fixture {
    plan plan;
    char dir[64];
    char path[128];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    json_error_t json_err;
    json_t *root = json_loads(plan_text, 0, &json_err);
    pt_error err = {{0}};
    if (root == NULL || plan_from_json(root, NULL, &f->plan, &err) != 0) {
        json_decref(root);
        free(f);
        return -1;
    }
    json_decref(root);
    snprintf(f->dir, sizeof f->dir, "/tmp/partita-log-test-XXXXXX");
    if (mkdtemp(f->dir) == NULL)
        return -1;
    snprintf(f->path, sizeof f->path, "%s/train.log", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    unlink(f->path);
    rmdir(f->dir);
    plan_free(&f->plan);
    free(f);
    return 0;
}

static void write_log(const fixture *f, const char *text, size_t length)
{
    FILE *file = fopen(f->path, "w");
    assert_non_null(file);
    assert_int_equal(fwrite(text, 1, length, file), length);
    assert_int_equal(fclose(file), 0);
}

/* Reads text as a Megatron-LM (or DeepSpeed) log with warm-up option. */
static int read_log(fixture *f, const char *text, bool deepspeed, long warmup,
                    run_record *run, pt_error *err)
{
    write_log(f, text, strlen(text));
    train_log_options options = {.warmup_iterations = warmup};
    return deepspeed
               ? deepspeed_log_load_file(f->path, &f->plan, &options, run, err)
               : megatron_log_load_file(f->path, &f->plan, &options, run, err);
}

static void expect_in(const char *text, const char *needle)
{
    if (strstr(text, needle) == NULL)
        fail_msg("'%s' not in '%s'", needle, text);
}

/* The message names the file and the line: "PATH:LINE: reason". */
static void expect_failure(fixture *f, const char *text, bool deepspeed,
                           int line, const char *reason)
{
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, text, deepspeed, -1, &run, &err), -1);
    char where[160];
    if (line > 0)
        snprintf(where, sizeof where, "%s:%d: ", f->path, line);
    else
        snprintf(where, sizeof where, "%s: ", f->path);
    if (strncmp(err.message, where, strlen(where)) != 0)
        fail_msg("'%s' does not start with '%s'", err.message, where);
    expect_in(err.message, reason);
    assert_null(run.iterations);
    assert_null(run.peak_memory_gib);
    assert_int_equal(run.iteration_count, 0);
}

/* ------------------------------------------------------------ megatron */

static void test_megatron_good_log(void **state)
{
    fixture *f = *state;
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, good_megatron, false, -1, &run, &err), 0);
    assert_string_equal(run.backend, "megatron-lm");
    assert_string_equal(run.file, f->path);
    /* the first line (iteration 5) is warm-up by default */
    assert_int_equal(run.iteration_count, 3);
    assert_int_equal(run.iterations[0].iteration, 10);
    assert_int_equal(run.iterations[2].iteration, 20);
    assert_float_equal(run.iterations[1].step_time_s, 0.400, 1e-12);
    assert_float_equal(run.iterations[2].loss, 7.0, 1e-12);
    /* the median of 410, 400 and 420 ms */
    assert_float_equal(run.step_time_s, 0.410, 1e-12);
    assert_float_equal(run.tokens_per_s, 8 * 32 / 0.410, 1e-6);
    double flops = model_flops_per_iteration(&f->plan.model, 8, false);
    assert_float_equal(run.tflops_per_gpu, flops / 0.410 / 4 / 1e12, 1e-12);
    assert_int_equal(run.tp, 1);
    assert_int_equal(run.dp, 2);
    assert_int_equal(run.pp, 2);
    assert_int_equal(run.rank_count, 4);
    assert_int_equal(run.event_count, 0);
    /* the largest figure of a rank, in GiB; the others not measured */
    assert_float_equal(run.peak_memory_gib[0], 3.0, 1e-12);
    assert_float_equal(run.peak_memory_gib[2], 1.0, 1e-12);
    assert_true(isnan(run.peak_memory_gib[1]));
    assert_true(isnan(run.peak_memory_gib[3]));
    expect_in(run.log_summary, "4 iteration lines (the last of iteration 20 "
                               "of 20)");
    expect_in(run.log_summary, "3 memory lines; 8 printed arguments");
    expect_in(run.log_summary, "up to iteration 5, is left out");
    expect_in(run.log_summary, "the peak of the 2 of 4 ranks");
    expect_in(run.log_summary, "12.5 TFLOP/s per GPU");
    assert_int_equal(run_record_check_plan(&run, &f->plan, &err), 0);
    run_record_free(&run);
}

static void test_megatron_warmup_option(void **state)
{
    fixture *f = *state;
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, good_megatron, false, 0, &run, &err), 0);
    assert_int_equal(run.iteration_count, 4);
    /* median of an even count: the mean of the middle two */
    assert_float_equal(run.step_time_s, (0.410 + 0.420) / 2, 1e-12);
    expect_in(run.log_summary, "No line is left out as warm-up");
    run_record_free(&run);
    assert_int_equal(read_log(f, good_megatron, false, 12, &run, &err), 0);
    assert_int_equal(run.iteration_count, 2);
    assert_int_equal(run.iterations[0].iteration, 15);
    expect_in(run.log_summary, "The first lines, up to iteration 10, are");
    run_record_free(&run);
    assert_int_equal(read_log(f, good_megatron, false, 20, &run, &err), -1);
    expect_in(err.message, "all 4 timed lines are warm-up (up to iteration "
                           "20)");
}

/* torchrun's rank prefix, no date (older Megatron-LM), no arguments, a
 * last line without its newline but whole. */
static void test_megatron_prefixes_and_old_format(void **state)
{
    fixture *f = *state;
    const char *text =
        "[default3]: iteration        1/       4 | consumed samples:     8 | "
        "elapsed time per iteration (ms): 2000.0 | learning rate: 1.0E-04 | "
        "lm loss: 1.1E+01 | loss scale: 1.0 | number of skipped iterations: "
        "  0 | number of nan iterations:   0 |\n"
        "[default3]: iteration        2/       4 | consumed samples:    16 | "
        "elapsed time per iteration (ms): 500.0 | learning rate: 1.0E-04 | "
        "lm loss: 1.0E+01 | loss scale: 1.0 | number of skipped iterations: "
        "  0 | number of nan iterations:   0 |";
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, text, false, -1, &run, &err), 0);
    assert_int_equal(run.iteration_count, 1);
    assert_float_equal(run.step_time_s, 0.5, 1e-12);
    assert_float_equal(run.iterations[0].loss, 10.0, 1e-12);
    expect_in(run.log_summary, "no rank's memory");
    expect_in(run.log_summary, "0 printed arguments");
    if (strstr(run.log_summary, "own throughput") != NULL)
        fail_msg("a throughput figure without one in the log");
    run_record_free(&run);
}

static void test_megatron_malformed(void **state)
{
    fixture *f = *state;
    expect_failure(f,
                   ARGS_LINES ITERATION("       5", "fast", "1.0E+01") "\n",
                   false, 12,
                   "elapsed time per iteration (ms): expected a number, got "
                   "'fast'");
    expect_failure(f,
                   ARGS_LINES ITERATION("       5", "1,135.2", "1.0E+01") "\n",
                   false, 12,
                   "elapsed time per iteration (ms): expected a number, got "
                   "'1,135.2'");
    expect_failure(f,
                   ARGS_LINES ITERATION("       5", "-3.0", "1.0E+01") "\n",
                   false, 12, "expected a positive time, got -3");
    expect_failure(f, ARGS_LINES ITERATION("       5", "9.0", "high") "\n",
                   false, 12, "lm loss: expected a number, got 'high'");
    expect_failure(f,
                   " iteration        5/      20 | consumed samples: 40 | "
                   "lm loss: 1.0 |\n",
                   false, 1,
                   "an iteration line without 'elapsed time per iteration "
                   "(ms)'");
    expect_failure(f, ITERATION("      25", "9.0", "1.0") "\n", false, 1,
                   "iteration 25 of 20: past the last");
    expect_failure(f,
                   ITERATION("      10", "9.0", "1.0") "\n"
                   ITERATION("       5", "9.0", "1.0") "\n",
                   false, 2,
                   "iteration 5 after iteration 10 (line 1): iterations "
                   "must increase");
    expect_failure(f,
                   "[Rank 7] (after 5 iterations) memory (MB) | allocated: "
                   "1.0 | max allocated: 2.0 | reserved: 3.0\n",
                   false, 1,
                   "a memory figure of rank 7: the plan has ranks 0 to 3");
    expect_failure(f,
                   "[Rank 1] (after 5 iterations) memory (MB) | allocated: "
                   "1.0 | reserved: 3.0\n",
                   false, 1, "a memory line without 'max allocated'");
    expect_failure(f,
                   "(after 5 iterations) memory (MB) | allocated: 1.0 | max "
                   "allocated: 2.0\n",
                   false, 1, "a memory line without '[Rank N]'");
    expect_failure(f, "nothing to see\n", false, 0,
                   "no Megatron-LM iteration line");
    expect_failure(f, "", false, 0, "no Megatron-LM iteration line");
}

static void test_megatron_truncated(void **state)
{
    fixture *f = *state;
    char text[4096];
    snprintf(text, sizeof text, "%s", good_megatron);
    /* cut inside the last iteration line, after its time */
    char *last = strstr(text, " [2026-08-24 10:00:00.000000] iteration       "
                              "20/");
    assert_non_null(last);
    last[strlen(last) - 40] = '\0';
    expect_failure(f, text, false, 22,
                   "the log ends inside this iteration line (truncated)");
    /* cut inside "iteration N/ M" itself */
    last[40] = '\0';
    expect_failure(f, text, false, 22,
                   "the log ends inside this line, which may be an "
                   "iteration line (truncated)");
    /* cut at a line's end: a whole log */
    last[0] = '\0';
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, text, false, -1, &run, &err), 0);
    assert_int_equal(run.iteration_count, 2);
    run_record_free(&run);
    /* a NUL byte: not a text log */
    char binary[] = "abc\0def\n";
    write_log(f, binary, sizeof binary - 1);
    train_log_options options = {.warmup_iterations = -1};
    assert_int_equal(
        megatron_log_load_file(f->path, &f->plan, &options, &run, &err), -1);
    expect_in(err.message, ":1: a NUL byte inside the line");
}

static void test_megatron_other_plan(void **state)
{
    fixture *f = *state;
    expect_failure(f,
                   "  tensor_model_parallel_size ...................... 4\n",
                   false, 1,
                   "tensor_model_parallel_size is 4, the plan's tp is 1: the "
                   "log is of another plan");
    expect_failure(f, "  num_layers ...................................... 8\n",
                   false, 1, "num_layers is 8, the plan's model.layers is 4");
    char text[1024];
    snprintf(text, sizeof text, "%s", ITERATION("       5", "9.0", "1.0"));
    char *batch = strstr(text, "global batch size:     8");
    assert_non_null(batch);
    batch[strlen("global batch size:     ")] = '6';
    expect_failure(f, text, false, 1,
                   "global batch size 6, the plan's gbs is 8: the log is of "
                   "another plan");
    expect_failure(f, "", false, 0, "");
}

/* ------------------------------------------------------------ deepspeed */

static const char *pipeline_log =
    "[2026-08-24 10:00:00,001] [INFO] [engine.py:100:__init__] DeepSpeed "
    "info: version=0.19.6\n"
    "steps: 10 loss: 10.2345 iter time (s): 1.910 samples/sec: 4.188\n"
    "epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=4.1, "
    "CurrSamplesPerSec=4.2, MemAllocated=1.2GB, MaxMemAllocated=2.5GB\n"
    "steps: 20 loss: 9.0123 iter time (s): 0.400 samples/sec: 20.0\n"
    "epoch=0/micro_step=20/global_step=20, RunningAvgSamplesPerSec=9.1, "
    "CurrSamplesPerSec=20.0, MemAllocated=1.2GB, MaxMemAllocated=2.75GB\n"
    "steps: 30 loss: 8.5 aux_loss: 0.1 iter time (s): 0.300 samples/sec: "
    "26.7\n";

static void test_deepspeed_pipeline_log(void **state)
{
    fixture *f = *state;
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, pipeline_log, true, -1, &run, &err), 0);
    assert_string_equal(run.backend, "deepspeed");
    assert_int_equal(run.iteration_count, 2);
    assert_int_equal(run.iterations[0].iteration, 20);
    assert_float_equal(run.iterations[1].loss, 8.5, 1e-12);
    assert_float_equal(run.step_time_s, 0.35, 1e-12);
    /* the throughput lines give rank 0's memory */
    assert_float_equal(run.peak_memory_gib[0], 2.75, 1e-12);
    assert_true(isnan(run.peak_memory_gib[1]));
    expect_in(run.log_summary, "3 pipeline-engine step lines");
    expect_in(run.log_summary, "whose MaxMemAllocated is rank 0's");
    run_record_free(&run);
}

static void test_deepspeed_throughput_log(void **state)
{
    fixture *f = *state;
    const char *text =
        "[2026-08-24 10:00:05,456] [INFO] [timer.py:264:stop] "
        "epoch=0/micro_step=20/global_step=10, RunningAvgSamplesPerSec=5.0, "
        "CurrSamplesPerSec=4.0, MemAllocated=4.1GB, MaxMemAllocated=11.2GB\n"
        "[2026-08-24 10:00:05,457] [INFO] [timer.py:264:stop] "
        "epoch=0/micro_step=20/global_step=10, RunningAvgSamplesPerSec=5.0, "
        "CurrSamplesPerSec=4.0, MemAllocated=4.1GB, MaxMemAllocated=11.5GB\n"
        "[2026-08-24 10:00:09,456] [INFO] [timer.py:264:stop] "
        "epoch=0/micro_step=40/global_step=20, RunningAvgSamplesPerSec=6.0, "
        "CurrSamplesPerSec=16.0, MemAllocated=4.1GB, MaxMemAllocated=11.2GB\n"
        "[2026-08-24 10:00:13,456] [INFO] [timer.py:264:stop] "
        "epoch=0/micro_step=60/global_step=30, RunningAvgSamplesPerSec=7.0, "
        "CurrSamplesPerSec=20.0, MemAllocated=4.1GB, MaxMemAllocated=11.2GB\n";
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_log(f, text, true, -1, &run, &err), 0);
    /* gbs 8 / 16 and 8 / 20 samples per second */
    assert_int_equal(run.iteration_count, 2);
    assert_float_equal(run.iterations[0].step_time_s, 0.5, 1e-12);
    assert_float_equal(run.step_time_s, 0.45, 1e-12);
    assert_true(isnan(run.iterations[0].loss));
    for (int r = 0; r < 4; r++)
        assert_true(isnan(run.peak_memory_gib[r]));
    expect_in(run.log_summary, "3 throughput-timer lines");
    expect_in(run.log_summary, "1 more taken as other ranks' copies");
    expect_in(run.log_summary, "the largest MaxMemAllocated, 11.50 GiB, "
                               "names no rank");
    run_record_free(&run);
}

static void test_deepspeed_bad_logs(void **state)
{
    fixture *f = *state;
    expect_failure(f, "steps: 10 loss: 10.2 iter ti", true, 1,
                   "the log ends inside this step line (truncated)");
    expect_failure(f, "steps: 10 loss: 10.2 samples/sec: 3\n", true, 1,
                   "a step line without 'iter time (s)'");
    expect_failure(f, "steps: 10 loss: nan? iter time (s): 1.0\n", true, 1,
                   "loss: expected a number, got 'nan?'");
    expect_failure(f,
                   "steps: 20 loss: 1 iter time (s): 1.0 samples/sec: 8\n"
                   "steps: 10 loss: 1 iter time (s): 1.0 samples/sec: 8\n",
                   true, 2, "iteration 10 after iteration 20");
    expect_failure(f,
                   "epoch=0/micro_step=10/global_step=10, "
                   "RunningAvgSamplesPerSec=50.3, CurrSamplesPerSec=4",
                   true, 1,
                   "the log ends inside this throughput line (truncated)");
    expect_failure(f,
                   "epoch=0/micro_step=10/global_step=10, "
                   "RunningAvgSamplesPerSec=5, CurrSamplesPerSec=0, "
                   "MaxMemAllocated=3GB\n",
                   true, 1, "CurrSamplesPerSec: expected a positive rate");
    expect_failure(f,
                   "epoch=0/micro_step=10/global_step=10, "
                   "RunningAvgSamplesPerSec=5, CurrSamplesPerSec=4, "
                   "MaxMemAllocated=lots\n",
                   true, 1, "MaxMemAllocated: expected a number in GB");
    expect_failure(f, good_megatron, true, 0, "no DeepSpeed step line");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_megatron_good_log, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_megatron_warmup_option, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_megatron_prefixes_and_old_format,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_megatron_malformed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_megatron_truncated, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_megatron_other_plan, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_deepspeed_pipeline_log, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_deepspeed_throughput_log, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_deepspeed_bad_logs, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
