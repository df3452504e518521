/*
 * Private to report/: what the readers of trainers' logs share
 * (train_log.c): reading a log line by line with line numbers, the
 * fields of a line, the timed lines and memory collected, and the run
 * record built from them. megatron_log.c and deepspeed_log.c know their
 * trainer's lines; report.h declares their public entry points.
 */
#ifndef PARTITA_REPORT_TRAIN_LOG_H
#define PARTITA_REPORT_TRAIN_LOG_H

#include "report/report.h"

/* One timed line of a log: a logged iteration. */
typedef struct log_step {
    long iteration;
    double step_time_s;       /* the trainer's mean over its log interval */
    double loss;              /* NAN when the line has none */
    double trainer_tflops;    /* the trainer's own figure; NAN: none */
    int line;
} log_step;

/* What a reader collects from a log of a run of `plan`. */
typedef struct train_log {
    const char *path;
    const plan *plan;
    const char *trainer;      /* "Megatron-LM", "DeepSpeed" */
    int step_count, step_capacity;
    log_step *steps;          /* owned, in the log's order */
    int rank_count;           /* the plan's GPUs */
    double *peak_memory_gib;  /* owned, [rank_count]; NAN: not printed */
    int memory_ranks;         /* ranks with a figure */
} train_log;

int train_log_open(train_log *log, const char *path, const plan *p,
                   const char *trainer, pt_error *err);
void train_log_close(train_log *log);

/* The longest line a trainer's log may hold: theirs are a few hundred
 * bytes; past it (/dev/zero, a binary file) the log is refused. */
#define TRAIN_LOG_MAX_LINE_BYTES ((size_t)1 << 20)

/* Calls line_fn for every line of the file with its 1-based number; cut
 * is true for a last line without its newline (the log may have been
 * cut off inside it). line_fn fills err with the reason alone; the
 * message becomes "PATH:LINE: reason". A read error, or a line longer
 * than TRAIN_LOG_MAX_LINE_BYTES, ends the reading with an error. */
typedef int (*train_log_line_fn)(train_log *log, void *state,
                                 const char *line, int number, bool cut,
                                 pt_error *err);
int train_log_each_line(train_log *log, train_log_line_fn line_fn,
                        void *state, pt_error *err);

/* Makes room for one more item in a growing array of count items of
 * item_size bytes, doubling *capacity when full: the array, moved or
 * not; NULL when out of memory (items is then unchanged and still
 * owned by the caller). */
void *log_grow(void *items, int count, int *capacity, size_t item_size,
               pt_error *err);

/* Appends a timed line, which must come after the last one's
 * iteration. */
int train_log_add_step(train_log *log, const log_step *step, pt_error *err);
/* Keeps the largest figure of a rank; fails on a rank the plan has not. */
int train_log_add_memory(train_log *log, long rank, double gib,
                         pt_error *err);

/* The value after "key:" (or "key=") in line, spaces skipped; NULL when
 * the key is not there. */
const char *log_field(const char *line, const char *key);
/* A number at text, ended by a space, '|', ", " or the end (a unit
 * suffix such as "GB" when unit is not NULL); -1 with the reason in err
 * naming what when it is not one. */
int log_number(const char *text, const char *what, const char *unit,
               double *out, pt_error *err);
int log_integer(const char *text, const char *what, long *out,
                pt_error *err);
/* Whether the line, spaces trimmed, ends with c. */
bool log_ends_with(const char *line, char c);

/* The run record of the collected lines: the warm-up left out, step
 * time their median, tokens/s and TFLOP/s per GPU from it as the
 * estimate computes them, the memory, and a summary (log_summary) that
 * begins with what the caller says of its lines in `about`. */
int train_log_finish(train_log *log, const train_log_options *options,
                     const char *backend, const char *about,
                     run_record *out, pt_error *err);

#endif
