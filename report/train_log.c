/* report: what the readers of Megatron-LM and DeepSpeed logs share:
 * lines with their numbers, fields and numbers inside a line, the timed
 * lines and memory they collect, and the run record a report compares
 * (warm-up left out, median step time, throughput as the estimate's). */
#include "report/train_log.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int train_log_open(train_log *log, const char *path, const plan *p,
                   const char *trainer, pt_error *err)
{
    memset(log, 0, sizeof *log);
    log->path = path;
    log->plan = p;
    log->trainer = trainer;
    log->rank_count = plan_gpu_count(p);
    log->peak_memory_gib = calloc((size_t)log->rank_count + 1,
                                  sizeof *log->peak_memory_gib);
    if (log->peak_memory_gib == NULL)
        return pt_fail(err, "%s: out of memory", path);
    for (int r = 0; r < log->rank_count; r++)
        log->peak_memory_gib[r] = NAN;
    return 0;
}

void train_log_close(train_log *log)
{
    free(log->steps);
    free(log->peak_memory_gib);
    memset(log, 0, sizeof *log);
}

int train_log_each_line(train_log *log, train_log_line_fn line_fn,
                        void *state, pt_error *err)
{
    pt_line_reader reader;
    if (pt_line_reader_open(&reader, log->path, TRAIN_LOG_MAX_LINE_BYTES,
                            err) != 0)
        return -1;
    char *line;
    size_t length;
    int status = 0, more = 0;
    while (status == 0 &&
           (more = pt_line_reader_next(&reader, &line, &length, err)) > 0) {
        int number = reader.line_number > INT_MAX ? INT_MAX
                                                  : (int)reader.line_number;
        bool cut = !reader.ended_by_newline;
        while (length > 0 && line[length - 1] == '\r')
            line[--length] = '\0';
        if (length != strlen(line)) {
            status = pt_fail(err, "%s:%d: a NUL byte inside the line: not a "
                                  "text log", log->path, number);
            break;
        }
        if (line_fn(log, state, line, number, cut, err) != 0) {
            pt_error_prefix(err, "%s:%d", log->path, number);
            status = -1;
        }
    }
    if (status == 0 && more < 0)
        status = -1;
    pt_line_reader_close(&reader);
    return status;
}

void *log_grow(void *items, int count, int *capacity, size_t item_size,
               pt_error *err)
{
    if (count < *capacity)
        return items;
    int grown = *capacity ? 2 * *capacity : 64;
    void *more = realloc(items, (size_t)grown * item_size);
    if (more == NULL) {
        pt_fail(err, "out of memory");
        return NULL;
    }
    *capacity = grown;
    return more;
}

int train_log_add_step(train_log *log, const log_step *step, pt_error *err)
{
    if (step->iteration < 0 || step->iteration > INT_MAX)
        return pt_fail(err, "iteration %ld: out of range", step->iteration);
    if (log->step_count > 0) {
        const log_step *last = &log->steps[log->step_count - 1];
        if (step->iteration <= last->iteration)
            return pt_fail(err,
                           "iteration %ld after iteration %ld (line %d): "
                           "iterations must increase (two runs in one "
                           "log?)",
                           step->iteration, last->iteration, last->line);
    }
    log_step *steps = log_grow(log->steps, log->step_count,
                               &log->step_capacity, sizeof *steps, err);
    if (steps == NULL)
        return -1;
    log->steps = steps;
    log->steps[log->step_count++] = *step;
    return 0;
}

int train_log_add_memory(train_log *log, long rank, double gib,
                         pt_error *err)
{
    if (rank < 0 || rank >= log->rank_count)
        return pt_fail(err, "a memory figure of rank %ld: the plan has "
                            "ranks 0 to %d", rank,
                       log->rank_count - 1);
    double *peak = &log->peak_memory_gib[rank];
    if (isnan(*peak))
        log->memory_ranks++;
    if (isnan(*peak) || gib > *peak)
        *peak = gib;
    return 0;
}

/* ----------------------------------------------------------- fields */

const char *log_field(const char *line, const char *key)
{
    size_t key_length = strlen(key);
    for (const char *at = strstr(line, key); at != NULL;
         at = strstr(at + 1, key)) {
        const char *after = at + key_length;
        if (*after != ':' && *after != '=')
            continue;
        after++;
        while (*after == ' ')
            after++;
        return after;
    }
    return NULL;
}

/* The token at text, for messages: up to the next space or '|', without
 * a separating comma. */
static void token_of(const char *text, char *out, size_t size)
{
    size_t length = strcspn(text, " |\t");
    if (length > 0 && text[length - 1] == ',')
        length--;
    if (length == 0)
        snprintf(out, size, "nothing");
    else
        snprintf(out, size, "'%.*s'", length > 40 ? 40 : (int)length, text);
}

/* Whether a number may end at c: a space, '|', the end, or DeepSpeed's
 * ", " between fields (not a thousands comma). */
static bool ends_token(const char *c)
{
    return *c == '\0' || *c == ' ' || *c == '|' || *c == '\t' ||
           (*c == ',' && (c[1] == ' ' || c[1] == '\0'));
}

int log_number(const char *text, const char *what, const char *unit,
               double *out, pt_error *err)
{
    char *end = NULL;
    errno = 0;
    double value = text != NULL ? strtod(text, &end) : 0.0;
    bool good = text != NULL && end != text && errno == 0 && isfinite(value);
    if (good && unit != NULL && strncmp(end, unit, strlen(unit)) == 0)
        end += strlen(unit);
    if (!good || !ends_token(end)) {
        char got[64];
        token_of(text != NULL ? text : "", got, sizeof got);
        return pt_fail(err, "%s: expected a number%s%s, got %s", what,
                       unit ? " in " : "", unit ? unit : "", got);
    }
    *out = value;
    return 0;
}

int log_integer(const char *text, const char *what, long *out,
                pt_error *err)
{
    char *end = NULL;
    errno = 0;
    long value = text != NULL ? strtol(text, &end, 10) : 0;
    if (text == NULL || end == text || errno != 0 || !ends_token(end) ||
        !isdigit((unsigned char)*text)) {
        char got[64];
        token_of(text != NULL ? text : "", got, sizeof got);
        return pt_fail(err, "%s: expected a whole number, got %s", what,
                       got);
    }
    *out = value;
    return 0;
}

bool log_ends_with(const char *line, char c)
{
    size_t length = strlen(line);
    while (length > 0 && isspace((unsigned char)line[length - 1]))
        length--;
    return length > 0 && line[length - 1] == c;
}

/* ----------------------------------------------------------- record */

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of values, sorted in place; NAN when count is 0. */
static double median_of(double *values, int count)
{
    if (count <= 0)
        return NAN;
    qsort(values, (size_t)count, sizeof *values, compare_doubles);
    return count % 2 ? values[count / 2]
                     : (values[count / 2 - 1] + values[count / 2]) / 2;
}

/* The medians of the kept lines' step times and of the trainer's own
 * TFLOP/s (NAN when no line has it); -1 when out of memory. */
static int medians(const log_step *steps, int count, double *step_time_s,
                   double *own_tflops)
{
    double *values = malloc((size_t)count * sizeof *values);
    if (values == NULL)
        return -1;
    for (int i = 0; i < count; i++)
        values[i] = steps[i].step_time_s;
    *step_time_s = median_of(values, count);
    int with = 0;
    for (int i = 0; i < count; i++)
        if (isfinite(steps[i].trainer_tflops))
            values[with++] = steps[i].trainer_tflops;
    *own_tflops = median_of(values, with);
    free(values);
    return 0;
}

/* The first kept line: warm-up is every line up to the given iteration,
 * or by default the first line. */
static int first_kept(const train_log *log, const train_log_options *options)
{
    if (options->warmup_iterations < 0)
        return log->step_count > 1 ? 1 : 0;
    int first = 0;
    while (first < log->step_count &&
           log->steps[first].iteration <= options->warmup_iterations)
        first++;
    return first;
}

static void write_summary(const train_log *log, const char *about,
                          int kept, int skipped, double own_tflops,
                          run_record *out)
{
    char warmup[160] = "No line is left out as warm-up";
    if (skipped > 0)
        snprintf(warmup, sizeof warmup, "%s, up to iteration %ld, %s "
                 "left out as warm-up",
                 skipped == 1 ? "The first line" : "The first lines",
                 log->steps[skipped - 1].iteration,
                 skipped == 1 ? "is" : "are");
    char memory[160];
    if (log->memory_ranks > 0)
        snprintf(memory, sizeof memory,
                 "Measured memory: the peak of the %d of %d ranks that "
                 "printed it.",
                 log->memory_ranks, log->rank_count);
    else
        snprintf(memory, sizeof memory, "The log gives no rank's memory.");
    char own[256] = "";
    if (isfinite(own_tflops))
        snprintf(own, sizeof own,
                 " %s's own throughput figure, by its FLOP count: %.1f "
                 "TFLOP/s per GPU (median); the table's uses the estimate's "
                 "count over the measured step time.",
                 log->trainer, own_tflops);
    snprintf(out->log_summary, sizeof out->log_summary,
             "%s log: %s. %s; the step time is the median of the %d "
             "kept. %s A log has no per-phase events: the per-stage rows "
             "and the timeline show the estimate alone.%s",
             log->trainer, about, warmup, kept, memory, own);
}

int train_log_finish(train_log *log, const train_log_options *options,
                     const char *backend, const char *about,
                     run_record *out, pt_error *err)
{
    const plan *p = log->plan;
    int first = first_kept(log, options);
    int kept = log->step_count - first;
    if (kept <= 0)
        return pt_fail(err,
                       "%s: all %d timed lines are warm-up (up to iteration "
                       "%ld): nothing left to compare; lower "
                       "--warmup-iterations",
                       log->path, log->step_count, options->warmup_iterations);
    pt_copy_string(out->file, sizeof out->file, log->path);
    pt_copy_string(out->backend, sizeof out->backend, backend);
    out->rank_count = log->rank_count;
    out->tp = p->config.tp;
    out->dp = p->config.dp;
    out->pp = p->config.pp;
    out->gbs = p->config.gbs;
    out->mbs = p->config.mbs;
    out->iterations = calloc((size_t)kept, sizeof *out->iterations);
    out->events = calloc(1, sizeof *out->events);
    if (out->iterations == NULL || out->events == NULL)
        return pt_fail(err, "%s: out of memory", log->path);
    for (int i = 0; i < kept; i++) {
        const log_step *step = &log->steps[first + i];
        out->iterations[i] = (run_iteration){.iteration = (int)step->iteration,
                                             .step_time_s = step->step_time_s,
                                             .loss = step->loss};
    }
    out->iteration_count = kept;
    double own_tflops;
    if (medians(log->steps + first, kept, &out->step_time_s, &own_tflops) != 0)
        return pt_fail(err, "%s: out of memory", log->path);
    out->tokens_per_s = p->config.gbs * (double)p->model.seq /
                        out->step_time_s;
    out->tflops_per_gpu = model_flops_per_iteration(&p->model, p->config.gbs,
                                                    p->config.recompute) /
                          out->step_time_s / log->rank_count / 1e12;
    out->peak_memory_gib = log->peak_memory_gib;
    log->peak_memory_gib = NULL;
    write_summary(log, about, kept, first, own_tflops, out);
    return 0;
}
