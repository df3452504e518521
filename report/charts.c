/* report: charts drawn by gnuplot, run as a child process on a generated
 * script under a time limit. Every chart is drawn into a private
 * temporary folder and renamed into place only when gnuplot succeeded, so
 * a failure leaves none, and charts of an older report that this one does
 * not draw are removed. */
#include "report/report.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define SECONDS_TO_MS 1e3
/* How often a running gnuplot is looked at (a hung one is killed after
 * report_input.gnuplot_timeout_s). */
#define GNUPLOT_POLL_S 0.02

/* Every chart a report may draw, each as .png and .svg: step_time only
 * with a run. */
static const char *const chart_names[] = {"timeline", "stages", "memory",
                                          "step_time"};
#define CHART_NAME_COUNT (sizeof chart_names / sizeof *chart_names)

/* Colours of the event kinds in the timeline, 0xRRGGBB, by event_kind. */
static const unsigned kind_colours[EVENT_KIND_COUNT] = {
    0x4C72B0, /* fwd */
    0xDD8452, /* bwd */
    0x55A868, /* send_fwd */
    0x8CC084, /* recv_fwd */
    0xC44E52, /* send_bwd */
    0xE59A9C, /* recv_bwd */
    0x8172B3, /* tp_allreduce */
    0x937860, /* dp_allreduce */
    0xDA8BC3, /* embedding_allreduce */
    0x8C8C8C, /* optimizer */
};

/* Sets the terminal and output of one chart in one format. */
static void emit_terminal(FILE *script, const char *chart, bool svg,
                          int width, int height)
{
    fprintf(script, "reset\n");
    if (svg)
        fprintf(script,
                "set terminal svg size %d,%d dynamic noenhanced "
                "font \"sans,11\"\n",
                width, height);
    else
        fprintf(script,
                "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) {\n"
                "  set terminal pngcairo size %d,%d noenhanced "
                "font \"sans,10\"\n"
                "} else {\n  set terminal png size %d,%d noenhanced\n}\n",
                width, height, width, height);
    fprintf(script, "set output \"%s.%s\"\n", chart, svg ? "svg" : "png");
}

/* The lanes of the timeline: one per stage (default) or per rank, each
 * followed by its measured lane when there is a run. */
typedef struct timeline_lanes {
    bool per_rank;
    int units;              /* stages or ranks */
    int per_unit;           /* 1, or 2 with a run */
    const plan *plan;       /* its stages' ranks (their own tp x dp) */
    const int *shown_rank;  /* per stage: the rank its measured lane shows */
} timeline_lanes;

static void emit_box(FILE *script, const timeline_event *e, int lane,
                     bool *kinds_used)
{
    kinds_used[e->kind] = true;
    fprintf(script, "%.6f %.6f %d %u\n", e->start_s * SECONDS_TO_MS,
            e->end_s * SECONDS_TO_MS, lane, kind_colours[e->kind]);
}

/* Estimated boxes: a stage's events in its lane, or in the lane of every
 * rank of the stage. */
static void emit_estimated_boxes(FILE *script, const estimate *est,
                                 const timeline_lanes *lanes,
                                 bool *kinds_used)
{
    for (int i = 0; i < est->event_count; i++) {
        const timeline_event *e = &est->events[i];
        if (e->stage < 0 || e->stage >= est->stage_count)
            continue;
        if (!lanes->per_rank) {
            emit_box(script, e, e->stage * lanes->per_unit, kinds_used);
            continue;
        }
        int first = plan_stage_first_rank(lanes->plan, e->stage);
        int ranks = plan_stage_ranks(lanes->plan, e->stage);
        for (int r = first; r < first + ranks; r++)
            emit_box(script, e, r * lanes->per_unit, kinds_used);
    }
}

/* Measured boxes: each rank's own lane, or per stage the lane of the
 * rank shown for it. */
static void emit_measured_boxes(FILE *script, const run_record *run,
                                const timeline_lanes *lanes,
                                bool *kinds_used)
{
    for (int i = 0; i < run->event_count; i++) {
        const timeline_event *e = &run->events[i];
        int unit = lanes->per_rank ? e->rank : e->stage;
        if (unit < 0 || unit >= lanes->units ||
            (!lanes->per_rank && lanes->shown_rank[unit] != e->rank))
            continue;
        emit_box(script, e, unit * lanes->per_unit + 1, kinds_used);
    }
}

static void emit_timeline_data(FILE *script, const report_input *in,
                               const timeline_lanes *lanes, bool *kinds_used)
{
    fprintf(script, "$timeline << EOD\n");
    emit_estimated_boxes(script, in->estimate, lanes, kinds_used);
    if (in->run)
        emit_measured_boxes(script, in->run, lanes, kinds_used);
    fprintf(script, "EOD\n");
}

/* "stage 2 estimated", "stage 2 measured (rank 9)", "rank 9 measured". */
static void lane_label(const timeline_lanes *lanes, int lane, char *out,
                       size_t size)
{
    int unit = lane / lanes->per_unit;
    bool measured = lane % lanes->per_unit == 1;
    int written = snprintf(out, size, "%s %d %s",
                           lanes->per_rank ? "rank" : "stage", unit,
                           measured ? "measured" : "estimated");
    if (measured && !lanes->per_rank &&
        plan_stage_ranks(lanes->plan, unit) > 1 &&
        lanes->shown_rank[unit] >= 0 && written > 0 && (size_t)written < size)
        snprintf(out + written, size - (size_t)written, " (rank %d)",
                 lanes->shown_rank[unit]);
}

static void emit_timeline_plot(FILE *script, const report_input *in,
                               const timeline_lanes *lanes,
                               const bool *kinds_used)
{
    int count = lanes->units * lanes->per_unit;
    fprintf(script,
            "set title \"Pipeline timeline of one iteration%s\"\n"
            "set xlabel \"time from the start of the iteration (ms)\"\n"
            "set yrange [%d-0.5:-0.5]\nset grid xtics\nset xrange [0:*]\n"
            "set key outside top center horizontal\nset ytics (",
            in->run ? ": estimated and measured" : " (estimated)", count);
    for (int lane = 0; lane < count; lane++) {
        char label[96];
        lane_label(lanes, lane, label, sizeof label);
        fprintf(script, "%s\"%s\" %d", lane ? ", " : "", label, lane);
    }
    fprintf(script, ")\nplot $timeline using (($1+$2)/2):3:(($2-$1)/2):"
                    "(0.4):4 with boxxyerror fs solid 0.9 noborder "
                    "lc rgb variable notitle");
    for (int k = 0; k < EVENT_KIND_COUNT; k++)
        if (kinds_used[k])
            fprintf(script, ", \\\n  keyentry with boxes fs solid 0.9 "
                            "lc rgb \"#%06X\" title \"%s\"",
                    kind_colours[k], event_kind_name((event_kind)k));
    fprintf(script, "\n");
}

/* A value in a data block: NAN (nothing measured) as gnuplot's NaN. */
static void emit_value(FILE *script, double value)
{
    if (isfinite(value))
        fprintf(script, " %.9g", value);
    else
        fprintf(script, " NaN");
}

static void emit_stage_data(FILE *script, const report_comparison *cmp)
{
    fprintf(script, "$stages << EOD\n");
    for (int s = 0; s < cmp->stage_count; s++) {
        const stage_phases *est = &cmp->estimated[s];
        const stage_phases *meas = &cmp->measured[s];
        const char *names[] = {"forward", "backward", "comm."};
        double est_values[] = {est->forward_s, est->backward_s,
                               est->communication_s};
        double meas_values[] = {meas->forward_s, meas->backward_s,
                                meas->communication_s};
        for (int q = 0; q < 3; q++) {
            fprintf(script, "\"s%d %s\"", s, names[q]);
            emit_value(script, est_values[q] * SECONDS_TO_MS);
            emit_value(script, meas_values[q] * SECONDS_TO_MS);
            fprintf(script, "\n");
        }
    }
    fprintf(script, "EOD\n");
}

/* Whether a measured column holds a number: gnuplot refuses a histogram
 * column of NaN alone, which a run without events (a training log) or
 * without memory figures gives. */
static bool stages_measured(const report_comparison *cmp)
{
    for (int s = 0; s < cmp->stage_count; s++)
        if (isfinite(cmp->measured[s].forward_s) ||
            isfinite(cmp->measured[s].backward_s) ||
            isfinite(cmp->measured[s].communication_s))
            return true;
    return false;
}

static bool memory_measured(const report_comparison *cmp)
{
    for (int r = 0; r < cmp->rank_count; r++)
        if (isfinite(cmp->measured_memory_gib[r]))
            return true;
    return false;
}

static void emit_histogram_style(FILE *script)
{
    fprintf(script,
            "set style data histograms\n"
            "set style histogram clustered gap 1\n"
            "set style fill solid 0.85 border -1\n"
            "set boxwidth 0.9\nset grid ytics\nset yrange [0:*]\n"
            "set key outside right top\nset xtics rotate by -30 nomirror\n");
}

static void emit_stage_plot(FILE *script, bool measured)
{
    emit_histogram_style(script);
    fprintf(script,
            "set title \"Per stage, one micro-batch: forward, backward, "
            "communication\"\nset ylabel \"time per micro-batch (ms)\"\n"
            "plot $stages using 2:xtic(1) title \"estimated\" "
            "lc rgb \"#4C72B0\"%s\n",
            measured ? ", $stages using 3 title \"measured\" "
                       "lc rgb \"#DD8452\""
                     : "");
}

/* One bar pair per stage (the estimate, the run's fullest rank of the
 * stage) or per rank. */
static void emit_memory_data(FILE *script, const report_comparison *cmp,
                             bool per_rank)
{
    fprintf(script, "$memory << EOD\n");
    int count = per_rank ? cmp->rank_count : cmp->stage_count;
    for (int i = 0; i < count; i++) {
        fprintf(script, "\"%d\"", i);
        emit_value(script, per_rank ? cmp->estimated_memory_gib[i]
                                    : cmp->stage_estimated_memory_gib[i]);
        emit_value(script, per_rank ? cmp->measured_memory_gib[i]
                                    : cmp->stage_measured_memory_gib[i]);
        fprintf(script, "\n");
    }
    fprintf(script, "EOD\n");
}

static void emit_memory_plot(FILE *script, bool measured, bool per_rank)
{
    emit_histogram_style(script);
    fprintf(script,
            "set title \"Peak memory %s\"\nset ylabel \"GiB\"\n"
            "set xlabel \"%s\"\nset xtics norotate\n"
            "plot $memory using 2:xtic(1) title \"estimated\" "
            "lc rgb \"#4C72B0\"%s\n",
            per_rank ? "per GPU" : "per stage (measured: its fullest GPU)",
            per_rank ? "rank" : "stage",
            measured ? ", $memory using 3 title \"measured\" "
                       "lc rgb \"#DD8452\""
                     : "");
}

static void emit_step_data(FILE *script, const run_record *run)
{
    fprintf(script, "$steps << EOD\n");
    for (int i = 0; i < run->iteration_count; i++)
        fprintf(script, "%d %.9g\n", run->iterations[i].iteration,
                run->iterations[i].step_time_s * SECONDS_TO_MS);
    fprintf(script, "EOD\n");
}

static void emit_step_plot(FILE *script, double estimated_s)
{
    fprintf(script,
            "set title \"Step time over iterations\"\n"
            "set xlabel \"iteration\"\nset ylabel \"step time (ms)\"\n"
            "set grid\nset yrange [0:*]\nset key outside right top\n"
            "plot $steps using 1:2 with linespoints pt 7 ps 0.6 "
            "lc rgb \"#DD8452\" title \"measured\", "
            "%.9g with lines dt 2 lw 2 lc rgb \"#4C72B0\" "
            "title \"estimated (%.3g ms)\"\n",
            estimated_s * SECONDS_TO_MS, estimated_s * SECONDS_TO_MS);
}

/* Writes the whole script; *charts gets the chart names drawn. */
static void emit_script(FILE *script, const report_input *in,
                        const report_comparison *cmp, const int *shown_rank,
                        report_outcome *charts)
{
    timeline_lanes lanes = {
        .per_rank = in->per_rank,
        .units = in->per_rank ? cmp->rank_count : cmp->stage_count,
        .per_unit = in->run ? 2 : 1,
        .plan = in->plan,
        .shown_rank = shown_rank};
    bool kinds_used[EVENT_KIND_COUNT] = {false};
    emit_timeline_data(script, in, &lanes, kinds_used);
    emit_stage_data(script, cmp);
    emit_memory_data(script, cmp, in->per_rank);
    if (in->run)
        emit_step_data(script, in->run);
    int timeline_height = 160 + 28 * lanes.units * lanes.per_unit;
    if (timeline_height > 4000)
        timeline_height = 4000;
    for (int svg = 0; svg < 2; svg++) {
        emit_terminal(script, "timeline", svg, 1200, timeline_height);
        emit_timeline_plot(script, in, &lanes, kinds_used);
        emit_terminal(script, "stages", svg, 1000, 560);
        emit_stage_plot(script, stages_measured(cmp));
        emit_terminal(script, "memory", svg, 1000, 520);
        emit_memory_plot(script, memory_measured(cmp), in->per_rank);
        if (in->run) {
            emit_terminal(script, "step_time", svg, 1000, 480);
            emit_step_plot(script, in->estimate->step_time_s);
        }
    }
    fprintf(script, "unset output\n");
    int count = in->run ? 4 : 3;
    for (int i = 0; i < count; i++)
        for (int svg = 0; svg < 2; svg++)
            snprintf(charts->files[charts->file_count++], PT_NAME_MAX,
                     "%s.%s", chart_names[i], svg ? "svg" : "png");
}

/* The first line gnuplot wrote on stderr, for the warning. */
static void first_error_line(const char *path, char *out, size_t size)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[400];
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strspn(line, " \t^") != strlen(line)) {
            pt_copy_string(out, size, line);
            break;
        }
    }
    fclose(f);
}

/* Waits for the child; past timeout_s kills its process group (a script
 * given as gnuplot may have started others) and says so. 0 with
 * *wait_status, or -1 with reason set. */
static int wait_gnuplot(pid_t child, const char *gnuplot, double timeout_s,
                        int *wait_status, char *reason, size_t reason_size)
{
    double deadline = pt_monotonic_seconds() + timeout_s;
    struct timespec poll = {0, (long)(GNUPLOT_POLL_S * 1e9)};
    for (;;) {
        pid_t done = waitpid(child, wait_status, WNOHANG);
        if (done == child)
            return 0;
        if (done < 0 && errno != EINTR) {
            snprintf(reason, reason_size, "waiting for gnuplot: %s",
                     strerror(errno));
            return -1;
        }
        if (pt_monotonic_seconds() > deadline)
            break;
        nanosleep(&poll, NULL);
    }
    kill(-child, SIGKILL);
    while (waitpid(child, wait_status, 0) < 0 && errno == EINTR)
        continue;
    snprintf(reason, reason_size, "gnuplot '%s' did not finish in %g s: "
             "stopped (PARTITA_GNUPLOT_TIMEOUT sets the limit)",
             gnuplot, timeout_s);
    return -1;
}

/* Runs `gnuplot script.gp` inside work_dir, in a process group of its
 * own, for at most timeout_s; 0 or -1 with reason set. */
static int run_gnuplot(const char *gnuplot, double timeout_s,
                       const char *work_dir, char *reason,
                       size_t reason_size)
{
    char script_path[PT_PATH_MAX + 64], error_path[PT_PATH_MAX + 64];
    snprintf(script_path, sizeof script_path, "%s/charts.gp", work_dir);
    snprintf(error_path, sizeof error_path, "%s/gnuplot.err", work_dir);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, error_path,
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addchdir_np(&actions, work_dir);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    char *argv[] = {(char *)gnuplot, "charts.gp", NULL};
    extern char **environ;
    pid_t child;
    int spawn_status = posix_spawnp(&child, gnuplot, &actions, &attributes,
                                    argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (spawn_status != 0) {
        if (spawn_status == ENOENT)
            snprintf(reason, reason_size,
                     "gnuplot not found ('%s': no such program; install "
                     "gnuplot or set PARTITA_GNUPLOT)", gnuplot);
        else
            snprintf(reason, reason_size, "cannot run gnuplot '%s': %s",
                     gnuplot, strerror(spawn_status));
        return -1;
    }
    int wait_status;
    if (wait_gnuplot(child, gnuplot, timeout_s, &wait_status, reason,
                     reason_size) != 0)
        return -1;
    if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0)
        return 0;
    char detail[300];
    first_error_line(error_path, detail, sizeof detail);
    if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 127)
        /* Where posix_spawn falls back to fork + exec, a program that
         * cannot be run shows only as the shell's status 127. */
        snprintf(reason, reason_size, "gnuplot '%s' could not be run "
                 "(exit 127: not found?)", gnuplot);
    else if (WIFEXITED(wait_status))
        snprintf(reason, reason_size, "gnuplot '%s' failed (exit %d)%s%s",
                 gnuplot, WEXITSTATUS(wait_status), detail[0] ? ": " : "",
                 detail);
    else
        snprintf(reason, reason_size, "gnuplot '%s' was killed by signal %d",
                 gnuplot, WTERMSIG(wait_status));
    return -1;
}

/* Empties and removes the private work folder (it holds no subfolders). */
static void remove_work_dir(const char *work_dir)
{
    DIR *dir = opendir(work_dir);
    if (dir != NULL) {
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 ||
                strcmp(entry->d_name, "..") == 0)
                continue;
            char path[PT_PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", work_dir, entry->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    rmdir(work_dir);
}

static int write_script(const char *work_dir, const report_input *in,
                        const report_comparison *cmp, report_outcome *charts,
                        char *reason, size_t reason_size)
{
    char path[PT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/charts.gp", work_dir);
    FILE *script = fopen(path, "w");
    if (script == NULL) {
        snprintf(reason, reason_size, "cannot write %s: %s", path,
                 strerror(errno));
        return -1;
    }
    int *shown_rank = calloc((size_t)cmp->stage_count + 1, sizeof *shown_rank);
    if (shown_rank == NULL) {
        fclose(script);
        snprintf(reason, reason_size, "out of memory drawing the charts");
        return -1;
    }
    for (int s = 0; s < cmp->stage_count; s++)
        shown_rank[s] = report_stage_measured_rank(in->plan, in->run, s);
    emit_script(script, in, cmp, shown_rank, charts);
    free(shown_rank);
    if (fclose(script) != 0) {
        snprintf(reason, reason_size, "cannot write %s: %s", path,
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* Moves the drawn charts into dir; fails when one is missing or empty. */
static int move_charts(const char *work_dir, const char *dir,
                       const report_outcome *charts, char *reason,
                       size_t reason_size)
{
    for (int i = 0; i < charts->file_count; i++) {
        char drawn[PT_PATH_MAX + 160];
        snprintf(drawn, sizeof drawn, "%s/%s", work_dir, charts->files[i]);
        struct stat info;
        if (stat(drawn, &info) != 0 || info.st_size == 0) {
            /* gnuplot says nothing when the disk is full: its files
               still fill it now, before the work folder goes */
            struct statvfs space;
            bool full = statvfs(work_dir, &space) == 0 &&
                        space.f_bavail == 0;
            snprintf(reason, reason_size, "gnuplot drew no %s%s%s",
                     charts->files[i], full ? ": " : "",
                     full ? strerror(ENOSPC) : "");
            return -1;
        }
    }
    for (int i = 0; i < charts->file_count; i++) {
        char drawn[PT_PATH_MAX + 160], final_path[PT_PATH_MAX + 160];
        snprintf(drawn, sizeof drawn, "%s/%s", work_dir, charts->files[i]);
        snprintf(final_path, sizeof final_path, "%s/%s", dir,
                 charts->files[i]);
        chmod(drawn, 0644);
        if (rename(drawn, final_path) != 0) {
            snprintf(reason, reason_size, "cannot move %s into place: %s",
                     charts->files[i], strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Removes dir's charts that this report did not draw (all of them when
 * it drew none), so that no chart of an older report is taken for one of
 * this report. */
static void remove_stale_charts(const char *dir, const report_outcome *drawn)
{
    for (size_t i = 0; i < CHART_NAME_COUNT; i++)
        for (int svg = 0; svg < 2; svg++) {
            char name[PT_NAME_MAX], path[PT_PATH_MAX + PT_NAME_MAX + 2];
            snprintf(name, sizeof name, "%s.%s", chart_names[i],
                     svg ? "svg" : "png");
            bool current = false;
            for (int f = 0; f < drawn->file_count; f++)
                current |= strcmp(drawn->files[f], name) == 0;
            snprintf(path, sizeof path, "%s/%s", dir, name);
            if (!current)
                unlink(path);
        }
}

int report_draw_charts(const report_input *in, const report_comparison *cmp,
                       const char *dir, report_outcome *charts,
                       char *reason, size_t reason_size)
{
    const char *gnuplot = in->gnuplot && in->gnuplot[0] ? in->gnuplot
                                                        : "gnuplot";
    char work_dir[PT_PATH_MAX + 32];
    snprintf(work_dir, sizeof work_dir, "%s/.charts.XXXXXX", dir);
    if (mkdtemp(work_dir) == NULL) {
        snprintf(reason, reason_size, "cannot create %s: %s", work_dir,
                 strerror(errno));
        return -1;
    }
    charts->file_count = 0;
    int status = write_script(work_dir, in, cmp, charts, reason, reason_size);
    double timeout_s = in->gnuplot_timeout_s > 0
                           ? in->gnuplot_timeout_s
                           : REPORT_GNUPLOT_TIMEOUT_S;
    if (status == 0)
        status = run_gnuplot(gnuplot, timeout_s, work_dir, reason,
                             reason_size);
    if (status == 0)
        status = move_charts(work_dir, dir, charts, reason, reason_size);
    remove_work_dir(work_dir);
    if (status != 0)
        charts->file_count = 0;
    remove_stale_charts(dir, charts);
    return status;
}
