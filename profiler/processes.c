/*
 * The profiler's measurement repeated in fresh processes, one after the
 * other, and their results combined: each entry the mean of the
 * processes' medians (docs/profiles.md, "Processes"). Small entries (tens
 * of microseconds) sit at a level that holds for a whole process, every
 * set of stages in it alike, and moves by 2-7 % from one process to the
 * next; a mean over processes is what repeats.
 */
#include "profiler/profiler.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ combining */

static const profiled_point *find_point(const profiler_result *r, int tp,
                                        int mbs)
{
    for (int i = 0; i < r->point_count; i++)
        if (r->points[i].tp == tp && r->points[i].mbs == mbs)
            return &r->points[i];
    return NULL;
}

/* The mean of the summaries' medians; the largest spread; every run. */
static timing_summary mean_summary(const timing_summary *const *each,
                                   int count)
{
    timing_summary out = {0};
    for (int i = 0; i < count; i++) {
        out.median_s += each[i]->median_s / count;
        out.spread = fmax(out.spread, each[i]->spread);
        out.runs += each[i]->runs;
    }
    return out;
}

/* One point's parts over the processes' points: each part's forward and
 * backward the mean of theirs; a process that fell back to the host
 * clock for a part marks it so, and the layers stacked are the fewest of
 * theirs (each process's layer entry is already per layer). */
static void combine_point(const profiled_point *const *points, int count,
                          profiled_point *to)
{
    *to = *points[0];
    for (int i = 1; i < count; i++)
        if (points[i]->layers_stacked < to->layers_stacked)
            to->layers_stacked = points[i]->layers_stacked;
    profiled_part *into[3] = {&to->embedding, &to->layer, &to->head};
    for (int part = 0; part < 3; part++) {
        const timing_summary *forward[PROFILER_MAX_PROCESSES];
        const timing_summary *backward[PROFILER_MAX_PROCESSES];
        for (int i = 0; i < count; i++) {
            const profiled_part *from[3] = {&points[i]->embedding,
                                            &points[i]->layer,
                                            &points[i]->head};
            forward[i] = &from[part]->forward;
            backward[i] = &from[part]->backward;
            if (points[i]->timed[part] == PROFILER_TIMING_HOST)
                to->timed[part] = PROFILER_TIMING_HOST;
        }
        into[part]->forward = mean_summary(forward, count);
        into[part]->backward = mean_summary(backward, count);
    }
}

static void add_note(profiler_result *out, const char *text)
{
    if (out->note_count < PROFILER_MAX_NOTES)
        snprintf(out->notes[out->note_count++], sizeof out->notes[0], "%s",
                 text);
}

/* The points every process measured, each entry their mean; a point
 * some process lacks is left out with a note. */
static void combine_points(const profiler_result *results, int count,
                           profiler_result *out)
{
    out->point_count = 0;
    for (int p = 0; p < results[0].point_count; p++) {
        const profiled_point *first = &results[0].points[p];
        const profiled_point *points[PROFILER_MAX_PROCESSES] = {first};
        int found = 1;
        for (int i = 1; i < count; i++)
            if ((points[found] = find_point(&results[i], first->tp,
                                            first->mbs)) != NULL)
                found++;
        if (found < count) {
            char note[320];
            snprintf(note, sizeof note, "tp %d, micro-batch %d: measured "
                                        "in %d of %d processes, left out",
                     first->tp, first->mbs, found, count);
            add_note(out, note);
            continue;
        }
        combine_point(points, count, &out->points[out->point_count++]);
    }
}

int profiler_results_combine(const profiler_result *results, int count,
                             profiler_result *out, pt_error *err)
{
    if (count < 1 || count > PROFILER_MAX_PROCESSES)
        return pt_fail(err, "profiler: %d results to combine, expected 1 "
                            "to %d",
                       count, PROFILER_MAX_PROCESSES);
    const timing_summary *layer[PROFILER_MAX_PROCESSES];
    const timing_summary *embedding[PROFILER_MAX_PROCESSES];
    double per_param = 0.0, host_per_param = 0.0, copy_per_param = 0.0;
    double elapsed = 0.0;
    for (int i = 0; i < count; i++) {
        layer[i] = &results[i].optimizer_layer;
        embedding[i] = &results[i].optimizer_embedding;
        per_param += results[i].optimizer_s_per_param / count;
        host_per_param += results[i].host_adamw_s_per_param / count;
        copy_per_param += results[i].host_copy_s_per_param / count;
        elapsed += results[i].elapsed_s;
    }
    profiler_result combined = results[0];
    combine_points(results, count, &combined);
    combined.optimizer_layer = mean_summary(layer, count);
    combined.optimizer_embedding = mean_summary(embedding, count);
    combined.optimizer_s_per_param = per_param;
    combined.host_adamw_s_per_param = host_per_param;
    combined.host_copy_s_per_param = copy_per_param;
    combined.elapsed_s = elapsed;
    *out = combined;
    if (out->point_count == 0)
        return pt_fail(err, "profiler: no point was measured in all %d "
                            "processes",
                       count);
    return 0;
}

/* ------------------------------------------------------------ processes */

/* What a measuring child sends its parent through a pipe: its status and
 * error, then its result (the same executable on both ends). */
typedef struct child_report {
    int status;
    pt_error err;
} child_report;

static int write_all(int fd, const void *data, size_t size)
{
    const char *at = data;
    while (size > 0) {
        ssize_t done = write(fd, at, size);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return -1;
        at += done;
        size -= (size_t)done;
    }
    return 0;
}

/* Reads up to size bytes; the count read (short at the end of the pipe). */
static size_t read_all(int fd, void *data, size_t size)
{
    char *at = data;
    size_t got = 0;
    while (got < size) {
        ssize_t done = read(fd, at + got, size - got);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            break;
        got += (size_t)done;
    }
    return got;
}

/* The child's side: measures, reports through fd, never returns. */
static void child_measure(const model_shape *shape,
                          const profiler_options *options, int fd)
{
    static profiler_result result;
    child_report report = {0};
    report.status = profiler_measure(shape, options, &result, &report.err);
    int sent = write_all(fd, &report, sizeof report) == 0 &&
               write_all(fd, &result, sizeof result) == 0;
    close(fd);
    _exit(sent ? 0 : 1);
}

/* Waits for the child to end; its wait status. */
static int reap(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return status;
}

/* Why a child that ended with wait status `status` did not report. */
static int child_failed(int status, int index, int count, pt_error *err)
{
    if (WIFSIGNALED(status))
        return pt_fail(err, "profiler: process %d of %d ended by signal "
                            "%d (%s) before it reported",
                       index + 1, count, WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
    return pt_fail(err, "profiler: process %d of %d exited with status %d "
                        "before it reported",
                   index + 1, count, WEXITSTATUS(status));
}

/* One measurement in a child process, its result into out. A process
 * after the first warms the device up as a later set of stages does: the
 * one before kept it busy until a moment ago (the CUDA context and the
 * stages are made in between). */
static int measure_in_child(const model_shape *shape,
                            const profiler_options *options, int index,
                            int count, profiler_result *out, pt_error *err)
{
    profiler_options mine = *options;
    mine.device_was_busy = index > 0;
    int fds[2];
    if (pipe(fds) != 0)
        return pt_fail(err, "profiler: cannot make a pipe for process %d: "
                            "%s",
                       index + 1, strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return pt_fail(err, "profiler: cannot start process %d of %d: %s",
                       index + 1, count, strerror(errno));
    }
    if (pid == 0) {
        close(fds[0]);
        child_measure(shape, &mine, fds[1]);
    }
    close(fds[1]);
    child_report report = {0};
    bool whole = read_all(fds[0], &report, sizeof report) == sizeof report &&
                 read_all(fds[0], out, sizeof *out) == sizeof *out;
    close(fds[0]);
    int ended = reap(pid);
    if (!whole)
        return child_failed(ended, index, count, err);
    if (report.status != 0) {
        *err = report.err;
        return -1;
    }
    return 0;
}

int profiler_measure_processes(const model_shape *shape,
                               const profiler_options *options,
                               profiler_result *out, pt_error *err)
{
    int count = options->processes;
    if (count <= 1)
        return profiler_measure(shape, options, out, err);
    if (profiler_options_check(options, err) != 0)
        return -1;
    profiler_result *results = calloc((size_t)count, sizeof *results);
    if (results == NULL)
        return pt_fail(err, "profiler: out of memory for %d results", count);
    int status = 0;
    for (int i = 0; i < count && status == 0; i++) {
        if (options->progress != NULL) {
            char label[64];
            snprintf(label, sizeof label, "process %d of %d", i + 1, count);
            options->progress(i, count, label, NULL,
                              options->progress_data);
        }
        status = measure_in_child(shape, options, i, count, &results[i],
                                  err);
    }
    if (status == 0)
        status = profiler_results_combine(results, count, out, err);
    free(results);
    return status;
}
