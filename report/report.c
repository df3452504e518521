/* report: writes the report folder (report.md, trace.json, charts). */
#include "report/report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

/* mkdir -p: creates dir and its missing parents. */
static int make_directory(const char *dir, pt_error *err)
{
    char path[PT_PATH_MAX];
    pt_copy_string(path, sizeof path, dir);
    size_t length = strlen(path);
    for (size_t i = 1; i <= length; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return pt_fail(err, "%s: cannot create the folder: %s", path,
                           strerror(errno));
        path[i] = saved;
    }
    struct stat info;
    if (stat(dir, &info) != 0 || !S_ISDIR(info.st_mode))
        return pt_fail(err, "%s: not a folder", dir);
    return 0;
}

/* Writes data to dir/name with the one atomic writer (common/). */
static int write_file(const char *dir, const char *name, const char *data,
                      pt_error *err)
{
    char path[PT_PATH_MAX];
    int length = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (length < 0 || (size_t)length >= sizeof path)
        return pt_fail(err, "%s/%s: the path is too long", dir, name);
    return pt_write_file_atomic(path, data, strlen(data), err);
}

static void add_file(report_outcome *outcome, const char *name)
{
    if (outcome->file_count < REPORT_MAX_FILES)
        pt_copy_string(outcome->files[outcome->file_count++], PT_NAME_MAX,
                       name);
}

static int write_trace(const report_input *in, const char *dir,
                       report_outcome *outcome, pt_error *err)
{
    json_t *trace = report_trace_json(in->plan, in->estimate, in->run,
                                      in->per_rank, err);
    if (trace == NULL)
        return -1;
    char *text = json_dumps(trace, JSON_COMPACT | JSON_REAL_PRECISION(12));
    json_decref(trace);
    if (text == NULL)
        return pt_fail(err, "out of memory serialising trace.json");
    int status = write_file(dir, "trace.json", text, err);
    free(text);
    if (status == 0)
        add_file(outcome, "trace.json");
    return status;
}

/* Whether charts failed for want of disk space: gnuplot said so, or the
 * folder's file system has no block left. That is an output that cannot
 * be written, not a missing chart program. */
static bool disk_is_full(const char *dir, const char *chart_warning)
{
    struct statvfs space;
    return strstr(chart_warning, strerror(ENOSPC)) != NULL ||
           (statvfs(dir, &space) == 0 && space.f_bavail == 0);
}

/* Charts are optional (no gnuplot: a warning), a full disk is not. */
static int draw_charts(const report_input *in, const char *dir,
                       report_outcome *outcome, pt_error *err)
{
    report_comparison cmp;
    if (report_compare(in->plan, in->estimate, in->run, &cmp, err) != 0) {
        pt_copy_string(outcome->chart_warning, sizeof outcome->chart_warning,
                       err->message);
        return 0;
    }
    report_outcome charts = {0};
    int status = 0;
    if (report_draw_charts(in, &cmp, dir, &charts, outcome->chart_warning,
                           sizeof outcome->chart_warning) == 0) {
        outcome->charts_written = true;
        for (int i = 0; i < charts.file_count; i++)
            add_file(outcome, charts.files[i]);
    } else if (disk_is_full(dir, outcome->chart_warning)) {
        status = pt_fail(err, "%s: no space left on the disk: the charts "
                              "could not be written (%s); report.md was "
                              "not written",
                         dir, outcome->chart_warning);
    }
    report_comparison_free(&cmp);
    return status;
}

int report_write(const report_input *in, const char *dir,
                 report_outcome *outcome, pt_error *err)
{
    memset(outcome, 0, sizeof *outcome);
    if (in->estimate->events == NULL && in->estimate->event_count > 0)
        return pt_fail(err, "the estimate has no events");
    if (make_directory(dir, err) != 0)
        return -1;
    if (write_trace(in, dir, outcome, err) != 0)
        return -1;
    if (draw_charts(in, dir, outcome, err) != 0)
        return -1;
    char *text = report_markdown(in, outcome->charts_written,
                                 outcome->chart_warning, err);
    if (text == NULL)
        return -1;
    int status = write_file(dir, "report.md", text, err);
    free(text);
    if (status == 0)
        add_file(outcome, "report.md");
    return status;
}
