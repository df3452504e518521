/*
 * Fuzzes the readers of Megatron-LM and DeepSpeed training logs the way
 * `partita report --megatron-log / --deepspeed-log` meets them. The first
 * byte picks the reader (bit 0), the warm-up option (bits 1-2: the
 * default, 0, 10 or 50) and a read that fails (bits 3-4: none, or the
 * 1st, 2nd or 3rd read(2), failed with EIO by tests/fault_injection.c,
 * which must fail the reading, never end it quietly); the rest is
 * written as <scratch>/train.log and
 * read against a fixed plan (tp 1 x dp 2 x pp 2, gbs 8, mbs 2). An
 * accepted record is held to the promises of report/report.h; a refused
 * log leaves nothing allocated and a message naming the file.
 */
#include "fuzz.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "tests/fault_injection.h"

#include <errno.h>

static const char *plan_text =
    "{ \"model\": { \"name\": \"small\", \"layers\": 4, \"hidden\": 64,"
    "             \"heads\": 4, \"seq\": 32, \"vocab\": 256 },"
    "  \"cluster\": { \"name\": \"box\", \"nodes\": ["
    "    { \"name\": \"box\", \"gpu\": \"H100\", \"gpus\": 4,"
    "      \"intra_node\": { \"bandwidth_GBps\": 200, \"latency_us\": 5 } }"
    "  ] },"
    "  \"gbs\": 8, \"mbs\": 2, \"tp\": 1, \"dp\": 2, \"pp\": 2 }";

/* The plan, read once; NULL if it cannot be (then nothing is fuzzed). */
static const plan *fixed_plan(void)
{
    static plan p;
    static int state; /* 0 not read, 1 read, -1 failed */
    if (state == 0) {
        json_error_t json_err;
        json_t *root = json_loads(plan_text, 0, &json_err);
        pt_error err;
        state = root != NULL && plan_from_json(root, NULL, &p, &err) == 0
                    ? 1
                    : -1;
        json_decref(root);
    }
    return state == 1 ? &p : NULL;
}

/* What the readers promise about a record they accepted. */
static void check_record(const run_record *run, const plan *p)
{
    if (run->iterations == NULL || run->events == NULL ||
        run->peak_memory_gib == NULL || run->event_count != 0 ||
        run->iteration_count < 1 || run->rank_count != 4)
        abort();
    for (int i = 0; i < run->iteration_count; i++) {
        if (!(run->iterations[i].step_time_s > 0) ||
            !isfinite(run->iterations[i].step_time_s) ||
            run->iterations[i].iteration < 0)
            abort();
        if (i > 0 &&
            run->iterations[i].iteration <= run->iterations[i - 1].iteration)
            abort();
    }
    for (int r = 0; r < run->rank_count; r++)
        if (!isnan(run->peak_memory_gib[r]) &&
            !(run->peak_memory_gib[r] >= 0 &&
              isfinite(run->peak_memory_gib[r])))
            abort();
    if (!(run->step_time_s > 0) || !isfinite(run->step_time_s) ||
        !(run->tokens_per_s > 0) || !(run->tflops_per_gpu > 0) ||
        run->log_summary[0] == '\0')
        abort();
    pt_error err;
    if (run_record_check_plan(run, p, &err) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const plan *p = fixed_plan();
    const char *dir = fuzz_scratch_dir();
    if (p == NULL || dir == NULL || size == 0)
        return 0;
    const long warmups[] = {-1, 0, 10, 50};
    train_log_options options = {.warmup_iterations = warmups[(data[0] >> 1) & 3]};
    bool deepspeed = data[0] & 1;
    char path[600];
    snprintf(path, sizeof path, "%s/train.log", dir);
    if (fuzz_write_file(path, data + 1, size - 1) != 0)
        return 0;
    int failing_read = (data[0] >> 3) & 3;
    if (failing_read > 0)
        fault_fail_read_after(failing_read - 1, EIO);
    run_record run;
    pt_error err;
    int status = deepspeed
                     ? deepspeed_log_load_file(path, p, &options, &run, &err)
                     : megatron_log_load_file(path, p, &options, &run, &err);
    bool read_failed = fault_read_fired();
    fault_clear();
    if (read_failed && (status == 0 || strstr(err.message, "read error") ==
                                           NULL))
        abort();  /* a failed read taken for the end of the log */
    if (status != 0) {
        /* A refused log leaves nothing owned behind, and says which. */
        if (run.iterations != NULL || run.events != NULL ||
            run.peak_memory_gib != NULL ||
            strncmp(err.message, path, strlen(path)) != 0)
            abort();
        return 0;
    }
    check_record(&run, p);
    run_record_free(&run);
    run_record_free(&run);
    return 0;
}
