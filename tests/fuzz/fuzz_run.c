/*
 * Fuzzes the run.json reader the way `partita report` meets it: the input
 * is written as <scratch>/run.json and read with run_record_load_file
 * (file reading, JSON parsing, then run_record_from_json). An accepted
 * record is held to the promises of report/report.h, checked against
 * plans with run_record_check_plan, and handed to report_stage_phases,
 * which indexes by its ranks and stages.
 */
#include "fuzz.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "report/report.h"

/* report_stage_phases walks every stage x every rank slot; beyond these
 * bounds an accepted record is valid but would stall the campaign. */
enum { PHASES_MAX_STAGES = 64, PHASES_MAX_RANKS = 4096 };

/* What the reader promises about a record it accepted. */
static void check_record(const run_record *run)
{
    if (run->tp < 1 || run->dp < 1 || run->pp < 1 || run->gbs < 1 ||
        run->mbs < 1)
        abort();
    if ((long long)run->tp * run->dp * run->pp != run->rank_count)
        abort(); /* one peak-memory figure per rank of the plan */
    if (run->peak_memory_gib == NULL || run->iterations == NULL ||
        run->events == NULL)
        abort();
    for (int r = 0; r < run->rank_count; r++)
        if (!isfinite(run->peak_memory_gib[r]) || run->peak_memory_gib[r] < 0)
            abort();
    for (int i = 0; i < run->iteration_count; i++)
        if (!(run->iterations[i].step_time_s >= 0) ||
            run->iterations[i].iteration < 1)
            abort();
    for (int i = 0; i < run->event_count; i++) {
        const timeline_event *event = &run->events[i];
        if (event->rank < 0 || event->rank >= run->rank_count ||
            event->stage < 0 || event->stage >= run->pp ||
            !(event->end_s >= event->start_s) || event->start_s < 0)
            abort();
    }
    if (!(run->step_time_s > 0) || !(run->tokens_per_s > 0))
        abort();
}

/* The record's own degrees must pass run_record_check_plan; another mbs
 * must fail it. */
static void check_against_plans(const run_record *run)
{
    plan same = {0};
    same.config = (parallel_config){.gbs = run->gbs, .mbs = run->mbs,
                                    .tp = run->tp, .dp = run->dp,
                                    .pp = run->pp};
    pt_error err;
    if (run_record_check_plan(run, &same, &err) != 0)
        abort();
    plan other = same;
    other.config.mbs = run->mbs == 1 ? 2 : 1;
    if (run_record_check_plan(run, &other, &err) == 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch_dir();
    if (dir == NULL)
        return 0;
    char path[600];
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (fuzz_write_file(path, data, size) != 0)
        return 0;
    run_record run;
    pt_error err;
    if (run_record_load_file(path, &run, &err) != 0) {
        /* A refused file leaves nothing owned behind. */
        if (run.iterations != NULL || run.events != NULL ||
            run.peak_memory_gib != NULL)
            abort();
        return 0;
    }
    check_record(&run);
    check_against_plans(&run);
    if (run.pp <= PHASES_MAX_STAGES && run.rank_count <= PHASES_MAX_RANKS) {
        stage_phases phases[PHASES_MAX_STAGES];
        report_stage_phases(run.events, run.event_count, run.pp, phases);
    }
    run_record_free(&run);
    /* It leaves an empty record, so freeing again must be harmless. */
    run_record_free(&run);
    return 0;
}
