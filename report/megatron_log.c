/* report: reads a Megatron-LM training log into a run record: the
 * iteration lines of training_log (megatron/training/training.py), the
 * memory lines of report_memory, and the arguments Megatron prints at
 * start, checked against the plan. docs/interop.md gives the lines and
 * the version they were read from. */
#include "report/train_log.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the reader has seen, for the summary. */
typedef struct megatron_state {
    long total_iterations;   /* the M of "iteration N/ M" */
    int memory_lines;
    int arguments_checked;
} megatron_state;

/* Finds "iteration N/ M |" in line: Megatron's iteration line (the
 * validation and checkpoint lines name an iteration without "/ M"). */
static bool find_iteration(const char *line, long *iteration, long *total)
{
    const char *word = "iteration";
    for (const char *at = strstr(line, word); at != NULL;
         at = strstr(at + 1, word)) {
        const char *c = at + strlen(word);
        char *end;
        if (*c != ' ')
            continue;
        while (*c == ' ')
            c++;
        if (!isdigit((unsigned char)*c))
            continue;
        long n = strtol(c, &end, 10);
        if (*end != '/')
            continue;
        c = end + 1;
        while (*c == ' ')
            c++;
        if (!isdigit((unsigned char)*c))
            continue;
        long m = strtol(c, &end, 10);
        for (c = end; *c == ' '; c++) {
        }
        if (*c != '|')
            continue;
        *iteration = n;
        *total = m;
        return true;
    }
    return false;
}

/* An optional number field: NAN when absent, -1 when malformed. */
static int optional_number(const char *line, const char *key, double *out,
                           pt_error *err)
{
    const char *value = log_field(line, key);
    *out = NAN;
    return value == NULL ? 0 : log_number(value, key, NULL, out, err);
}

static int iteration_line(train_log *log, megatron_state *state,
                          const char *line, bool cut, long iteration,
                          long total, int number, pt_error *err)
{
    if (cut && !log_ends_with(line, '|'))
        return pt_fail(err, "the log ends inside this iteration line "
                            "(truncated)");
    if (iteration > total)
        return pt_fail(err, "iteration %ld of %ld: past the last", iteration,
                       total);
    const char *time_key = "elapsed time per iteration (ms)";
    const char *time = log_field(line, time_key);
    if (time == NULL)
        return pt_fail(err, "an iteration line without '%s'", time_key);
    log_step step = {.iteration = iteration, .line = number};
    double milliseconds;
    if (log_number(time, time_key, NULL, &milliseconds, err) != 0)
        return -1;
    if (milliseconds <= 0)
        return pt_fail(err, "%s: expected a positive time, got %g", time_key,
                       milliseconds);
    step.step_time_s = milliseconds / 1e3;
    double batch;
    if (optional_number(line, "lm loss", &step.loss, err) != 0 ||
        optional_number(line, "throughput per GPU (TFLOP/s/GPU)",
                        &step.trainer_tflops, err) != 0 ||
        optional_number(line, "global batch size", &batch, err) != 0)
        return -1;
    if (!isnan(batch) && batch != log->plan->config.gbs)
        return pt_fail(err,
                       "global batch size %g, the plan's gbs is %d: the log "
                       "is of another plan",
                       batch, log->plan->config.gbs);
    state->total_iterations = total;
    return train_log_add_step(log, &step, err);
}

/* "[Rank 3] (after 10 iterations) memory (MB) | allocated: ... | max
 * allocated: 2345.6 | ...": the rank's peak, in MiB. */
static int memory_line(train_log *log, megatron_state *state,
                       const char *line, pt_error *err)
{
    const char *rank_text = strstr(line, "[Rank ");
    if (rank_text == NULL)
        return pt_fail(err, "a memory line without '[Rank N]'");
    rank_text += strlen("[Rank ");
    long rank;
    char *end;
    rank = strtol(rank_text, &end, 10);
    if (end == rank_text || *end != ']')
        return pt_fail(err, "a memory line without '[Rank N]'");
    const char *peak_text = log_field(line, "max allocated");
    if (peak_text == NULL)
        return pt_fail(err, "a memory line without 'max allocated'");
    double mib;
    if (log_number(peak_text, "max allocated", NULL, &mib, err) != 0)
        return -1;
    if (mib < 0)
        return pt_fail(err, "max allocated: expected a size, got %g", mib);
    state->memory_lines++;
    return train_log_add_memory(log, rank, mib / 1024.0, err);
}

/* The value of "  name ........ value", Megatron's printed arguments;
 * NULL when the line is not that argument's. */
static const char *argument_value(const char *line, const char *name)
{
    size_t length = strlen(name);
    for (const char *at = strstr(line, name); at != NULL;
         at = strstr(at + 1, name)) {
        if (at == line || at[-1] != ' ' || strncmp(at + length, " .", 2) != 0)
            continue;
        const char *value = at + length + 1;
        while (*value == '.' || *value == ' ')
            value++;
        return value;
    }
    return NULL;
}

/* The printed arguments that must be the plan's. */
static int argument_line(train_log *log, megatron_state *state,
                         const char *line, pt_error *err)
{
    const plan *p = log->plan;
    const struct {
        const char *argument, *field;
        long planned;
    } checks[] = {
        {"tensor_model_parallel_size", "tp", p->config.tp},
        {"pipeline_model_parallel_size", "pp", p->config.pp},
        {"data_parallel_size", "dp", p->config.dp},
        {"micro_batch_size", "mbs", p->config.mbs},
        {"global_batch_size", "gbs", p->config.gbs},
        {"num_layers", "model.layers", p->model.layers},
        {"hidden_size", "model.hidden", p->model.hidden},
        {"num_attention_heads", "model.heads", p->model.heads},
        {"seq_length", "model.seq", p->model.seq},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        const char *value = argument_value(line, checks[i].argument);
        long logged;
        if (value == NULL || log_integer(value, "", &logged, NULL) != 0)
            continue; /* not this argument, or None */
        if (logged != checks[i].planned)
            return pt_fail(err,
                           "%s is %ld, the plan's %s is %ld: the log is of "
                           "another plan",
                           checks[i].argument, logged, checks[i].field,
                           checks[i].planned);
        state->arguments_checked++;
    }
    return 0;
}

static int megatron_line(train_log *log, void *opaque, const char *line,
                         int number, bool cut, pt_error *err)
{
    megatron_state *state = opaque;
    long iteration, total;
    if (find_iteration(line, &iteration, &total))
        return iteration_line(log, state, line, cut, iteration, total,
                              number, err);
    if (strstr(line, "memory (MB)") != NULL)
        return memory_line(log, state, line, err);
    if (strstr(line, " .") != NULL)
        return argument_line(log, state, line, err);
    if (cut && strstr(line, "iteration") != NULL)
        return pt_fail(err, "the log ends inside this line, which may be "
                            "an iteration line (truncated)");
    return 0;
}

int megatron_log_load_file(const char *path, const plan *p,
                           const train_log_options *options, run_record *out,
                           pt_error *err)
{
    memset(out, 0, sizeof *out);
    train_log log;
    if (train_log_open(&log, path, p, "Megatron-LM", err) != 0)
        return -1;
    megatron_state state = {0};
    int status = train_log_each_line(&log, megatron_line, &state, err);
    if (status == 0 && log.step_count == 0)
        status = pt_fail(err,
                         "%s: no Megatron-LM iteration line ('iteration N/ "
                         "M | ... | elapsed time per iteration (ms): T | "
                         "...'): is it the log of a Megatron-LM run?",
                         path);
    if (status == 0) {
        char about[320];
        snprintf(about, sizeof about,
                 "%d iteration lines (the last of iteration %ld of %ld), "
                 "each Megatron-LM's mean over its logging interval; %d "
                 "memory lines; %d printed arguments that match the plan",
                 log.step_count, log.steps[log.step_count - 1].iteration,
                 state.total_iterations, state.memory_lines,
                 state.arguments_checked);
        status = train_log_finish(&log, options, "megatron-lm", about, out,
                                  err);
    }
    train_log_close(&log);
    if (status != 0)
        run_record_free(out);
    return status;
}
