/* report: the Chrome trace (trace.json) that Perfetto and chrome://tracing
 * open. One process per stage (or per rank when asked), each with an
 * "estimated" and a "measured" thread. */
#include "report/report.h"

#include <math.h>
#include <stdio.h>

#define MICROSECONDS_PER_SECOND 1e6

/* Appends value to array, taking the reference; -1 on failure. */
static int append(json_t *array, json_t *value)
{
    return value == NULL ? -1 : json_array_append_new(array, value);
}

static json_t *metadata_event(const char *name, int pid, int tid,
                              json_t *args)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:o}", "name", name, "ph", "M",
                     "pid", pid, "tid", tid, "args", args);
}

/* Names a process and sorts it by pid. */
static int append_process(json_t *events, int pid, const char *name)
{
    return append(events, metadata_event("process_name", pid, 0,
                                         json_pack("{s:s}", "name", name))) ||
           append(events, metadata_event("process_sort_index", pid, 0,
                                         json_pack("{s:i}", "sort_index",
                                                   pid)));
}

static int append_thread(json_t *events, int pid, int tid, const char *name)
{
    return append(events, metadata_event("thread_name", pid, tid,
                                         json_pack("{s:s}", "name", name))) ||
           append(events, metadata_event("thread_sort_index", pid, tid,
                                         json_pack("{s:i}", "sort_index",
                                                   tid)));
}

static json_t *complete_event(const timeline_event *event, int pid, int tid)
{
    char name[64];
    const char *kind = event_kind_name(event->kind);
    if (event->microbatch >= 0)
        snprintf(name, sizeof name, "%s %d", kind, event->microbatch);
    else
        snprintf(name, sizeof name, "%s", kind);
    double start_us = event->start_s * MICROSECONDS_PER_SECOND;
    double duration_us = (event->end_s - event->start_s) *
                         MICROSECONDS_PER_SECOND;
    return json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:{s:i, s:i}}",
                     "name", name, "cat", kind, "ph", "X", "ts", start_us,
                     "dur", duration_us, "pid", pid, "tid", tid, "args",
                     "stage", event->stage, "microbatch", event->microbatch);
}

/* The events of list that belong to the lane (stage, and rank unless
 * rank is -1), as complete events of (pid, tid). */
static int append_lane_events(json_t *events, const timeline_event *list,
                              int count, int stage, int rank, int pid,
                              int tid)
{
    for (int i = 0; i < count; i++) {
        if (list[i].stage != stage || (rank >= 0 && list[i].rank != rank))
            continue;
        if (append(events, complete_event(&list[i], pid, tid)) != 0)
            return -1;
    }
    return 0;
}

/* The rank of a stage whose measured events a per-stage lane shows: the
 * stage's first rank with events in the run, -1 when it has none. */
int report_stage_measured_rank(const plan *p, const run_record *run,
                               int stage)
{
    if (run == NULL)
        return -1;
    int first = plan_stage_first_rank(p, stage);
    int last = first + plan_stage_ranks(p, stage) - 1;
    int shown = -1;
    for (int i = 0; i < run->event_count; i++) {
        int rank = run->events[i].rank;
        if (run->events[i].stage == stage && rank >= first &&
            rank <= last && (shown < 0 || rank < shown))
            shown = rank;
    }
    return shown;
}

/* One process for a stage: its estimated events and the measured events
 * of one of its ranks (report_stage_measured_rank). */
static int append_stage(json_t *events, const plan *p, const estimate *est,
                        const run_record *run, int stage)
{
    int first = plan_stage_first_rank(p, stage);
    int ranks = plan_stage_ranks(p, stage);
    char process[160], measured[64];
    if (ranks == 1)
        snprintf(process, sizeof process, "stage %d (rank %d, %s)", stage,
                 first, est->stages[stage].gpu);
    else
        snprintf(process, sizeof process, "stage %d (ranks %d-%d, %s)",
                 stage, first, first + ranks - 1, est->stages[stage].gpu);
    if (append_process(events, stage, process) ||
        append_thread(events, stage, REPORT_TRACE_TID_ESTIMATED,
                      "estimated") ||
        append_lane_events(events, est->events, est->event_count, stage, -1,
                           stage, REPORT_TRACE_TID_ESTIMATED))
        return -1;
    if (run == NULL)
        return 0;
    int shown = report_stage_measured_rank(p, run, stage);
    if (ranks == 1 || shown < 0)
        snprintf(measured, sizeof measured, "measured");
    else
        snprintf(measured, sizeof measured, "measured (rank %d)", shown);
    if (append_thread(events, stage, REPORT_TRACE_TID_MEASURED, measured))
        return -1;
    return shown < 0 ? 0
                     : append_lane_events(events, run->events,
                                          run->event_count, stage, shown,
                                          stage, REPORT_TRACE_TID_MEASURED);
}

/* One process for a rank: its stage's estimated events, its own measured
 * ones. */
static int append_rank(json_t *events, const plan *p, const estimate *est,
                       const run_record *run, int rank)
{
    int stage = plan_stage_of_rank(p, rank);
    char process[160];
    snprintf(process, sizeof process, "rank %d (stage %d, %s)", rank, stage,
             est->stages[stage].gpu);
    if (append_process(events, rank, process) ||
        append_thread(events, rank, REPORT_TRACE_TID_ESTIMATED,
                      "estimated") ||
        append_lane_events(events, est->events, est->event_count, stage, -1,
                           rank, REPORT_TRACE_TID_ESTIMATED))
        return -1;
    if (run == NULL)
        return 0;
    return append_thread(events, rank, REPORT_TRACE_TID_MEASURED,
                         "measured") ||
           append_lane_events(events, run->events, run->event_count, stage,
                              rank, rank, REPORT_TRACE_TID_MEASURED);
}

json_t *report_trace_json(const plan *p, const estimate *est,
                          const run_record *run, bool per_rank,
                          pt_error *err)
{
    json_t *events = json_array();
    json_t *root = json_pack("{s:o, s:s}", "traceEvents", events,
                             "displayTimeUnit", "ms");
    if (root == NULL) {
        pt_fail(err, "out of memory building the trace");
        return NULL;
    }
    int status = 0;
    if (per_rank) {
        int rank_count = plan_rank_count(p);
        for (int rank = 0; rank < rank_count && status == 0; rank++)
            status = append_rank(events, p, est, run, rank);
    } else {
        for (int stage = 0; stage < est->stage_count && status == 0; stage++)
            status = append_stage(events, p, est, run, stage);
    }
    if (status != 0) {
        json_decref(root);
        pt_fail(err, "out of memory building the trace");
        return NULL;
    }
    return root;
}
