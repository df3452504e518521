/*
 * The profiler's options (profiler/profiler.h, profiler_options): their
 * defaults, the quick set, and the check of a set before anything is
 * measured: one error naming the option and the reason.
 */
#include "profiler/profiler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

profiler_options profiler_options_defaults(backend_kind backend)
{
    profiler_options options = {
        .backend = backend,
        .tp_count = 4,
        .tp_values = {1, 2, 4, 8},
        .mbs_count = 5,
        .mbs_values = {1, 2, 4, 8, 16},
        .warmup_runs = 5,
        /* the curves' timed runs */
        .timed_runs = PROFILER_MAX_RUNS,
        .min_timed_runs = 7,
        .device_warmup_s = 2.0,
        /* 3 rounds of 5 ms: as repeatable as 5 of 5 ms, and a whole
         * shape measured in under a minute (docs/profiles.md,
         * "Repeatable entries" and "Time budget") */
        .timing_rounds = 3,
        /* 8 processes of one set each (the embedding 4): docs/profiles.md,
         * "Processes" */
        .stage_sets = 1,
        .embedding_sets = 4,
        .processes = backend == BACKEND_CUDA ? 8 : 1,
        .round_s = 0.005,
        .hold_s = 0.0,
        /* 32M parameters, 512 MiB of host memory: tens of milliseconds a
         * pass on 16 cores */
        .host_adamw_params = (size_t)32 << 20,
        .timing = PROFILER_TIMING_GATED,
        /* one layer in a stage of its own until a stack is validated
         * against whole models on a GPU (docs/profiles.md, "Layer
         * stack") */
        .layer_stack = 1,
        .seed = 1234,
    };
    return options;
}

void profiler_options_quick(profiler_options *options)
{
    options->warmup_runs = 1;
    options->timed_runs = 5;
    options->min_timed_runs = 5;
    options->device_warmup_s = 0.0;
    options->timing_rounds = 3;
    options->stage_sets = 1;
    options->embedding_sets = 0;
    options->processes = 1;
    options->round_s = 0.0;
    options->hold_s = 0.0;
    options->host_adamw_params = (size_t)4 << 20;
}

static int check_list(const char *what, const int *values, int count,
                      bool powers_of_two, pt_error *err)
{
    if (count < 1 || count > PROFILER_MAX_VALUES)
        return pt_fail(err, "profiler: the %s list has %d entries, expected "
                            "1 to %d",
                       what, count, PROFILER_MAX_VALUES);
    for (int i = 0; i < count; i++) {
        int value = values[i];
        if (value < 1 || value > 1024)
            return pt_fail(err, "profiler: %s %d is outside 1..1024", what,
                           value);
        if (powers_of_two && (value & (value - 1)) != 0)
            return pt_fail(err, "profiler: %s %d is not a power of two",
                           what, value);
        if (i > 0 && value <= values[i - 1])
            return pt_fail(err, "profiler: the %s list must ascend without "
                                "repeats (%d after %d)",
                           what, value, values[i - 1]);
    }
    return 0;
}

int profiler_options_check(const profiler_options *options, pt_error *err)
{
    if (check_list("tp", options->tp_values, options->tp_count, true,
                   err) != 0 ||
        check_list("micro-batch", options->mbs_values, options->mbs_count,
                   false, err) != 0)
        return -1;
    if (options->warmup_runs < 0 || options->min_timed_runs < 1 ||
        options->timed_runs < options->min_timed_runs ||
        options->timed_runs > PROFILER_MAX_RUNS)
        return pt_fail(err, "profiler: runs: %d warm-up, %d to %d timed; "
                            "expected >= 0 warm-up and 1 <= min <= max <= %d "
                            "timed",
                       options->warmup_runs, options->min_timed_runs,
                       options->timed_runs, PROFILER_MAX_RUNS);
    if (!(options->device_warmup_s >= 0.0) || !(options->round_s >= 0.0) ||
        !(options->hold_s >= 0.0) || options->hold_s > PROFILER_MAX_HOLD_S)
        return pt_fail(err, "profiler: time budgets must be >= 0 s");
    int most_sets = options->embedding_sets > options->stage_sets
                        ? options->embedding_sets
                        : options->stage_sets;
    if (options->timing_rounds < 1 || options->stage_sets < 1 ||
        options->timing_rounds * most_sets > PROFILER_MAX_RUNS)
        return pt_fail(err, "profiler: %d timing rounds of %d sets of "
                            "stages; expected 1 to %d rounds in all",
                       options->timing_rounds, most_sets, PROFILER_MAX_RUNS);
    if (options->embedding_sets != 0 &&
        options->embedding_sets < options->stage_sets)
        return pt_fail(err, "profiler: %d sets of the embedding, fewer "
                            "than the %d sets of stages",
                       options->embedding_sets, options->stage_sets);
    if (options->processes < 1 || options->processes > PROFILER_MAX_PROCESSES)
        return pt_fail(err, "profiler: %d processes; expected 1 to %d",
                       options->processes, PROFILER_MAX_PROCESSES);
    if (options->layer_stack < 1 ||
        options->layer_stack > PROFILER_MAX_LAYER_STACK)
        return pt_fail(err, "profiler: a layer stack of %d layers; "
                            "expected 1 to %d",
                       options->layer_stack, PROFILER_MAX_LAYER_STACK);
    if (options->backend == BACKEND_CPU &&
        (options->sm_limit != 0 || options->memory_limit_bytes != 0.0))
        return pt_fail(err, "profiler: an SM limit or memory limit needs the "
                            "cuda backend");
    if (options->sm_limit < 0 || options->memory_limit_bytes < 0.0)
        return pt_fail(err, "profiler: SM and memory limits must be >= 0");
    if (options->beside_count < 0 ||
        options->beside_count > PROFILER_MAX_VALUES)
        return pt_fail(err, "profiler: %d busy neighbour slices; expected "
                            "0 to %d",
                       options->beside_count, PROFILER_MAX_VALUES);
    if (options->beside_count > 0 &&
        (options->backend != BACKEND_CUDA || options->sm_limit == 0))
        return pt_fail(err, "profiler: busy neighbour slices need the cuda "
                            "backend and an SM limit (the measured slice)");
    if (options->beside_place < 0 ||
        options->beside_place > options->beside_count)
        return pt_fail(err, "profiler: the measured slice's place %d is "
                            "outside the split of %d slices (0 to %d)",
                       options->beside_place, options->beside_count + 1,
                       options->beside_count);
    if (options->neighbours_idle && options->beside_count == 0)
        return pt_fail(err, "profiler: idle neighbours need neighbour "
                            "slices (--beside)");
    for (int i = 0; i < options->beside_count; i++)
        if (options->beside_sms[i] < 1)
            return pt_fail(err, "profiler: neighbour slice %d has %d SMs; "
                                "expected at least 1",
                           i + 1, options->beside_sms[i]);
    return 0;
}
