/* report: reads a DeepSpeed training log into a run record: the pipeline
 * engine's "steps: N loss: L iter time (s): T samples/sec: S" lines
 * (deepspeed/runtime/pipe/engine.py) and the throughput timer's
 * "epoch=E/micro_step=M/global_step=N, RunningAvgSamplesPerSec=...,
 * CurrSamplesPerSec=S, MemAllocated=...GB, MaxMemAllocated=M GB" lines
 * (deepspeed/utils/timer.py). docs/interop.md says which is used when. */
#include "report/train_log.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A throughput-timer line: every rank may print it, so a step number seen
 * before is another rank's copy. */
typedef struct throughput_line {
    long step;
    double step_time_s;       /* train_batch_size / CurrSamplesPerSec */
    double max_allocated_gib; /* NAN when the line has none */
    int line;
} throughput_line;

typedef struct deepspeed_state {
    int count, capacity;
    throughput_line *lines;   /* owned, steps increasing */
    int copies;               /* lines skipped as other ranks' copies */
    double largest_gib;       /* MaxMemAllocated of every line, copies
                                 included; NAN: none */
} deepspeed_state;

/* "steps: N loss:" at the start of a word: the pipeline engine's line. */
static bool find_pipeline_step(const char *line, long *step)
{
    const char *word = "steps: ";
    for (const char *at = strstr(line, word); at != NULL;
         at = strstr(at + 1, word)) {
        if (at > line && (isalnum((unsigned char)at[-1]) || at[-1] == '_'))
            continue;
        char *end;
        const char *digits = at + strlen(word);
        if (!isdigit((unsigned char)*digits))
            continue;
        long n = strtol(digits, &end, 10);
        if (strncmp(end, " loss: ", 7) != 0)
            continue;
        *step = n;
        return true;
    }
    return false;
}

static int pipeline_line(train_log *log, const char *line, int number,
                         bool cut, long step_number, pt_error *err)
{
    if (cut && log_field(line, "samples/sec") == NULL)
        return pt_fail(err, "the log ends inside this step line "
                            "(truncated)");
    const char *key = "iter time (s)";
    const char *time = log_field(line, key);
    if (time == NULL)
        return pt_fail(err, "a step line without '%s'", key);
    log_step step = {.iteration = step_number, .line = number,
                     .trainer_tflops = NAN};
    if (log_number(time, key, NULL, &step.step_time_s, err) != 0 ||
        log_number(log_field(line, "loss"), "loss", NULL, &step.loss, err) !=
            0)
        return -1;
    if (step.step_time_s <= 0)
        return pt_fail(err, "%s: expected a positive time, got %g", key,
                       step.step_time_s);
    return train_log_add_step(log, &step, err);
}

static int add_throughput(deepspeed_state *state, const throughput_line *in,
                          pt_error *err)
{
    if (!(in->max_allocated_gib <= state->largest_gib))
        state->largest_gib = in->max_allocated_gib;
    if (state->count > 0 && in->step <= state->lines[state->count - 1].step) {
        state->copies++;
        return 0;
    }
    throughput_line *lines = log_grow(state->lines, state->count,
                                      &state->capacity, sizeof *lines, err);
    if (lines == NULL)
        return -1;
    state->lines = lines;
    state->lines[state->count++] = *in;
    return 0;
}

static int throughput_timer_line(train_log *log, deepspeed_state *state,
                                 const char *line, int number, bool cut,
                                 pt_error *err)
{
    const char *memory = log_field(line, "MaxMemAllocated");
    if (cut && memory == NULL)
        return pt_fail(err, "the log ends inside this throughput line "
                            "(truncated)");
    throughput_line entry = {.line = number, .max_allocated_gib = NAN};
    double samples_per_s;
    if (log_integer(log_field(line, "global_step"), "global_step",
                    &entry.step, err) != 0 ||
        log_number(log_field(line, "CurrSamplesPerSec"), "CurrSamplesPerSec",
                   NULL, &samples_per_s, err) != 0 ||
        (memory != NULL && log_number(memory, "MaxMemAllocated", "GB",
                                      &entry.max_allocated_gib, err) != 0))
        return -1;
    if (samples_per_s <= 0)
        return pt_fail(err, "CurrSamplesPerSec: expected a positive rate, "
                            "got %g", samples_per_s);
    entry.step_time_s = log->plan->config.gbs / samples_per_s;
    return add_throughput(state, &entry, err);
}

static int deepspeed_line(train_log *log, void *opaque, const char *line,
                          int number, bool cut, pt_error *err)
{
    deepspeed_state *state = opaque;
    long step;
    if (find_pipeline_step(line, &step))
        return pipeline_line(log, line, number, cut, step, err);
    if (log_field(line, "global_step") != NULL &&
        strstr(line, "SamplesPerSec=") != NULL)
        return throughput_timer_line(log, state, line, number, cut, err);
    return 0;
}

/* With the pipeline engine's lines, the throughput lines only give rank
 * 0's memory (the engine prints them there alone); without, their times
 * are the steps and their memory belongs to no known rank. */
static int use_throughput_lines(train_log *log, deepspeed_state *state,
                                char *about, size_t size, pt_error *err)
{
    double largest = state->largest_gib;
    if (log->step_count > 0) {
        if (isfinite(largest) && train_log_add_memory(log, 0, largest, err))
            return -1;
        snprintf(about, size,
                 "%d pipeline-engine step lines, each the mean over its "
                 "steps_per_print interval; %d throughput-timer lines, whose "
                 "MaxMemAllocated is rank 0's",
                 log->step_count, state->count);
        return 0;
    }
    for (int i = 0; i < state->count; i++) {
        log_step step = {.iteration = state->lines[i].step,
                         .step_time_s = state->lines[i].step_time_s,
                         .loss = NAN, .trainer_tflops = NAN,
                         .line = state->lines[i].line};
        if (train_log_add_step(log, &step, err) != 0)
            return -1;
    }
    char memory[160] = "";
    if (isfinite(largest))
        snprintf(memory, sizeof memory,
                 "; the largest MaxMemAllocated, %.2f GiB, names no rank and "
                 "is left out of the tables",
                 largest);
    snprintf(about, size,
             "%d throughput-timer lines, each the time of its one step "
             "(train_batch_size / CurrSamplesPerSec), %d more taken as other "
             "ranks' copies, no loss%s",
             state->count, state->copies, memory);
    return 0;
}

int deepspeed_log_load_file(const char *path, const plan *p,
                            const train_log_options *options,
                            run_record *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    train_log log;
    if (train_log_open(&log, path, p, "DeepSpeed", err) != 0)
        return -1;
    deepspeed_state state = {.largest_gib = NAN};
    char about[512];
    int status = train_log_each_line(&log, deepspeed_line, &state, err);
    if (status == 0 && log.step_count == 0 && state.count == 0)
        status = pt_fail(err,
                         "%s: no DeepSpeed step line ('steps: N loss: L "
                         "iter time (s): T ...' or 'global_step=N, ... "
                         "CurrSamplesPerSec=S ...'): is it the log of a "
                         "DeepSpeed run with steps_per_print set?",
                         path);
    if (status == 0)
        status = use_throughput_lines(&log, &state, about, sizeof about, err);
    if (status == 0)
        status = train_log_finish(&log, options, "deepspeed", about, out,
                                  err);
    if (status != 0 && err != NULL &&
        strncmp(err->message, path, strlen(path)) != 0)
        pt_error_prefix(err, "%s", path);
    free(state.lines);
    train_log_close(&log);
    if (status != 0)
        run_record_free(out);
    return status;
}
