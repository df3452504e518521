/* report: the arithmetic of estimated against measured. */
#include "report/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double report_error_percent(double estimated, double measured)
{
    if (!isfinite(estimated) || !isfinite(measured) || measured <= 0)
        return NAN;
    return (estimated - measured) / measured * 100.0;
}

void report_format_error(double error_percent, char *out, size_t size)
{
    if (!isfinite(error_percent))
        snprintf(out, size, "n/a");
    else if (fabs(error_percent) >= 10)
        snprintf(out, size, "%+.0f %%", error_percent);
    else
        snprintf(out, size, "%+.1f %%", error_percent);
}

/* Sums of one stage's event durations, to be turned into means. */
typedef struct phase_sums {
    double forward_s, backward_s, communication_s;
    int forward_count, backward_count;
    double dp_allreduce_s, optimizer_s;
    int rank_count;          /* distinct ranks with events of the stage */
} phase_sums;

static void add_event(phase_sums *sums, const timeline_event *event,
                      bool *rank_seen)
{
    double duration = event->end_s - event->start_s;
    if (rank_seen != NULL && !rank_seen[event->rank]) {
        rank_seen[event->rank] = true;
        sums->rank_count++;
    }
    switch (event->kind) {
    case EVENT_FWD: sums->forward_s += duration; sums->forward_count++; break;
    case EVENT_BWD: sums->backward_s += duration; sums->backward_count++; break;
    case EVENT_SEND_FWD:
    case EVENT_SEND_BWD: sums->communication_s += duration; break;
    case EVENT_DP_ALLREDUCE: sums->dp_allreduce_s += duration; break;
    case EVENT_OPTIMIZER: sums->optimizer_s += duration; break;
    default: break;
    }
}

void report_stage_phases(const timeline_event *events, int event_count,
                         int pp, stage_phases *phases)
{
    int max_rank = 0;
    for (int i = 0; i < event_count; i++)
        if (events[i].rank > max_rank)
            max_rank = events[i].rank;
    /* Without this buffer per-step work is averaged as if over one rank. */
    bool *rank_seen = calloc((size_t)max_rank + 1, sizeof *rank_seen);
    for (int s = 0; s < pp; s++) {
        phase_sums sums = {0};
        if (rank_seen != NULL)
            for (int r = 0; r <= max_rank; r++)
                rank_seen[r] = false;
        for (int i = 0; i < event_count; i++)
            if (events[i].stage == s && events[i].rank >= 0)
                add_event(&sums, &events[i], rank_seen);
        stage_phases *out = &phases[s];
        if (sums.forward_count == 0 && sums.backward_count == 0) {
            *out = (stage_phases){NAN, NAN, NAN, NAN, NAN};
            continue;
        }
        int microbatches = sums.forward_count > sums.backward_count
                               ? sums.forward_count
                               : sums.backward_count;
        int ranks = sums.rank_count > 0 ? sums.rank_count : 1;
        out->forward_s = sums.forward_count
                             ? sums.forward_s / sums.forward_count
                             : NAN;
        out->backward_s = sums.backward_count
                              ? sums.backward_s / sums.backward_count
                              : NAN;
        out->communication_s = sums.communication_s / microbatches;
        out->dp_allreduce_s = sums.dp_allreduce_s / ranks;
        out->optimizer_s = sums.optimizer_s / ranks;
    }
    free(rank_seen);
}

static void estimated_phases(const stage_estimate *stage, stage_phases *out)
{
    out->forward_s = stage->forward_s;
    out->backward_s = stage->backward_s;
    out->communication_s = stage->send_s + stage->send_bwd_s;
    out->dp_allreduce_s = stage->dp_allreduce_s;
    out->optimizer_s = stage->optimizer_s;
}

int report_compare(const plan *p, const estimate *est, const run_record *run,
                   report_comparison *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    int pp = est->stage_count;
    int ranks = plan_rank_count(p);
    out->estimated = calloc((size_t)pp, sizeof *out->estimated);
    out->measured = calloc((size_t)pp, sizeof *out->measured);
    out->estimated_memory_gib = calloc((size_t)ranks, sizeof(double));
    out->measured_memory_gib = calloc((size_t)ranks, sizeof(double));
    out->stage_estimated_memory_gib = calloc((size_t)pp, sizeof(double));
    out->stage_measured_memory_gib = calloc((size_t)pp, sizeof(double));
    out->stage_measured_memory_rank = calloc((size_t)pp, sizeof(int));
    if (!out->estimated || !out->measured || !out->estimated_memory_gib ||
        !out->measured_memory_gib || !out->stage_estimated_memory_gib ||
        !out->stage_measured_memory_gib || !out->stage_measured_memory_rank) {
        report_comparison_free(out);
        return pt_fail(err, "out of memory comparing the run");
    }
    out->stage_count = pp;
    out->rank_count = ranks;
    for (int s = 0; s < pp; s++) {
        estimated_phases(&est->stages[s], &out->estimated[s]);
        /* interleaved 1F1B: each of the v chunks sends (the wrap-around
         * sends priced as the stage's own) */
        out->estimated[s].communication_s *=
            parallel_virtual_stages(&p->config);
    }
    if (run != NULL) {
        report_stage_phases(run->events, run->event_count, pp, out->measured);
        /* interleaved 1F1B: a micro-batch is v chunk events, as the
         * estimate's per-micro-batch figures hold v chunks' work */
        int v = parallel_virtual_stages(&p->config);
        for (int s = 0; s < pp; s++) {
            out->measured[s].forward_s *= v;
            out->measured[s].backward_s *= v;
            out->measured[s].communication_s *= v;
        }
    } else
        for (int s = 0; s < pp; s++)
            out->measured[s] = (stage_phases){NAN, NAN, NAN, NAN, NAN};
    /* Memory without the CUDA context on both sides, as bench/accuracy
     * compares it: run.json's peak (the cuda backend's allocations) and
     * the training logs' allocator peaks leave it out. */
    for (int s = 0; s < pp; s++) {
        out->stage_estimated_memory_gib[s] =
            pt_memory_terms_total(&est->stages[s].memory, false) / PT_GIB;
        out->stage_measured_memory_gib[s] = NAN;
        out->stage_measured_memory_rank[s] = -1;
    }
    for (int r = 0; r < ranks; r++) {
        int s = plan_stage_of_rank(p, r);
        out->estimated_memory_gib[r] = out->stage_estimated_memory_gib[s];
        double measured = run != NULL && r < run->rank_count
                              ? run->peak_memory_gib[r]
                              : NAN;
        out->measured_memory_gib[r] = measured;
        if (isfinite(measured) &&
            !(measured <= out->stage_measured_memory_gib[s])) {
            out->stage_measured_memory_gib[s] = measured;
            out->stage_measured_memory_rank[s] = r;
        }
    }
    return 0;
}

void report_comparison_free(report_comparison *cmp)
{
    free(cmp->estimated);
    free(cmp->measured);
    free(cmp->estimated_memory_gib);
    free(cmp->measured_memory_gib);
    free(cmp->stage_estimated_memory_gib);
    free(cmp->stage_measured_memory_gib);
    free(cmp->stage_measured_memory_rank);
    memset(cmp, 0, sizeof *cmp);
}
