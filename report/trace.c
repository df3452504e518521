/* report: the Chrome trace (trace.json) that Perfetto and chrome://tracing
 * open. One process per rank, an "estimated" and a "measured" thread. */
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

static int append_rank_metadata(json_t *events, const plan *p,
                                const estimate *est, int rank, bool measured)
{
    int ranks_per_stage = p->config.tp * p->config.dp;
    int stage = rank / ranks_per_stage;
    char process[160];
    const char *gpu = stage < est->stage_count ? est->stages[stage].gpu : "";
    snprintf(process, sizeof process, "rank %d (stage %d, %s)", rank, stage,
             gpu);
    if (append(events, metadata_event("process_name", rank, 0,
                                      json_pack("{s:s}", "name", process))) ||
        append(events, metadata_event("process_sort_index", rank, 0,
                                      json_pack("{s:i}", "sort_index",
                                                rank))) ||
        append(events, metadata_event("thread_name", rank,
                                      REPORT_TRACE_TID_ESTIMATED,
                                      json_pack("{s:s}", "name",
                                                "estimated"))) ||
        append(events, metadata_event("thread_sort_index", rank,
                                      REPORT_TRACE_TID_ESTIMATED,
                                      json_pack("{s:i}", "sort_index", 1))))
        return -1;
    if (!measured)
        return 0;
    if (append(events, metadata_event("thread_name", rank,
                                      REPORT_TRACE_TID_MEASURED,
                                      json_pack("{s:s}", "name",
                                                "measured"))) ||
        append(events, metadata_event("thread_sort_index", rank,
                                      REPORT_TRACE_TID_MEASURED,
                                      json_pack("{s:i}", "sort_index", 2))))
        return -1;
    return 0;
}

static json_t *complete_event(const timeline_event *event, int tid)
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
                     "dur", duration_us, "pid", event->rank, "tid", tid,
                     "args", "stage", event->stage, "microbatch",
                     event->microbatch);
}

static int append_events(json_t *events, const timeline_event *list,
                         int count, int rank_count, int tid)
{
    for (int i = 0; i < count; i++) {
        if (list[i].rank < 0 || list[i].rank >= rank_count)
            continue;
        if (append(events, complete_event(&list[i], tid)) != 0)
            return -1;
    }
    return 0;
}

json_t *report_trace_json(const plan *p, const estimate *est,
                          const run_record *run, pt_error *err)
{
    int rank_count = p->config.tp * p->config.dp * p->config.pp;
    json_t *events = json_array();
    json_t *root = json_pack("{s:o, s:s}", "traceEvents", events,
                             "displayTimeUnit", "ms");
    if (root == NULL) {
        pt_fail(err, "out of memory building the trace");
        return NULL;
    }
    int status = 0;
    for (int rank = 0; rank < rank_count && status == 0; rank++)
        status = append_rank_metadata(events, p, est, rank, run != NULL);
    if (status == 0)
        status = append_events(events, est->events, est->event_count,
                               rank_count, REPORT_TRACE_TID_ESTIMATED);
    if (status == 0 && run != NULL)
        status = append_events(events, run->events, run->event_count,
                               rank_count, REPORT_TRACE_TID_MEASURED);
    if (status != 0) {
        json_decref(root);
        pt_fail(err, "out of memory building the trace");
        return NULL;
    }
    return root;
}
