/* A hand-made two-stage plan and estimate for the report tests: no
 * profiles and no cost model needed, every number known in advance. */
#ifndef PARTITA_TEST_REPORT_FIXTURES_H
#define PARTITA_TEST_REPORT_FIXTURES_H

#include "report/report.h"

#include <string.h>

/* Two stages, one rank each (tp 1, dp 1, pp 2), two micro-batches. */
typedef struct report_fixture {
    plan plan;
    stage_estimate stages[2];
    timeline_event events[5];
    estimate estimate;
} report_fixture;

static inline void report_fixture_init(report_fixture *f)
{
    memset(f, 0, sizeof *f);
    f->plan.config = (parallel_config){.gbs = 4, .mbs = 2, .tp = 1, .dp = 1,
                                       .pp = 2};
    f->plan.partition[0] = 1;
    f->plan.partition[1] = 1;
    for (int s = 0; s < 2; s++) {
        strcpy(f->stages[s].gpu, "H200");
        f->stages[s].layers = 1;
        f->stages[s].forward_s = 0.002;
        f->stages[s].backward_s = 0.004;
        f->stages[s].send_s = s == 0 ? 0.0005 : 0;
        f->stages[s].send_bwd_s = s == 1 ? 0.0005 : 0;
        f->stages[s].optimizer_s = 0.001;
        /* 2 GiB of weights and a context of 0.5 GiB, which the
         * comparison leaves out as run.json's peak does */
        f->stages[s].peak_memory_bytes = 2.5 * PT_GIB;
        f->stages[s].memory.bytes[PT_MEMORY_WEIGHTS] = 2.0 * PT_GIB;
        f->stages[s].memory.bytes[PT_MEMORY_CONTEXT] = 0.5 * PT_GIB;
    }
    /* As costmodel_estimate gives them: once per stage, rank -1. */
    const timeline_event events[] = {
        {-1, 0, 0, EVENT_FWD, 0.0, 0.002},
        {-1, 0, 0, EVENT_SEND_FWD, 0.002, 0.0025},
        {-1, 1, 0, EVENT_FWD, 0.0025, 0.0045},
        {-1, 1, 0, EVENT_BWD, 0.0045, 0.0085},
        {-1, 1, -1, EVENT_OPTIMIZER, 0.0085, 0.0095},
    };
    memcpy(f->events, events, sizeof events);
    f->estimate = (estimate){.step_time_s = 0.0095, .tokens_per_s = 1000,
                             .tflops_per_gpu = 1.5, .fits = true,
                             .stage_count = 2, .stages = f->stages,
                             .event_count = 5, .events = f->events};
}

#endif
