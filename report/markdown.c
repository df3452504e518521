/* report: report.md, the tables of estimated against measured. */
#include "report/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A value cell: the estimate's or the run's number with its unit, or "-"
 * when there is none. */
typedef enum value_unit { UNIT_SECONDS, UNIT_GIB, UNIT_TOKENS_PER_S,
                          UNIT_TFLOPS, UNIT_PERCENT } value_unit;

static void format_value(double value, value_unit unit, char *out,
                         size_t size)
{
    if (!isfinite(value)) {
        snprintf(out, size, "-");
        return;
    }
    switch (unit) {
    case UNIT_SECONDS: pt_format_seconds(value, out, size); break;
    case UNIT_GIB: pt_format_bytes(value * PT_GIB, out, size); break;
    case UNIT_TOKENS_PER_S: snprintf(out, size, "%.0f tokens/s", value); break;
    case UNIT_TFLOPS: snprintf(out, size, "%.3g TFLOP/s", value); break;
    case UNIT_PERCENT: snprintf(out, size, "%.1f %%", value * 100); break;
    }
}

/* Writes "| estimated | measured | error |" (the row's tail). */
static void write_comparison_cells(FILE *out, double estimated,
                                   double measured, value_unit unit)
{
    char est_text[64], meas_text[64], error_text[32];
    format_value(estimated, unit, est_text, sizeof est_text);
    format_value(measured, unit, meas_text, sizeof meas_text);
    report_format_error(report_error_percent(estimated, measured),
                        error_text, sizeof error_text);
    fprintf(out, " %s | %s | %s |\n", est_text, meas_text, error_text);
}

static void write_header(FILE *out, const report_input *in)
{
    const plan *p = in->plan;
    char partition[256];
    partition_format(p->partition, p->config.pp, partition, sizeof partition);
    fprintf(out,
            "# Partita report\n\n"
            "Plan `%s`: model %s (%d layers, hidden %d, sequence %d tokens) "
            "on cluster %s; tp %d, dp %d, pp %d; micro-batch %d, global "
            "batch %d (%d micro-batches per iteration); partition %s; "
            "schedule %s; precision %s.\n\n",
            in->plan_file, p->model.name, p->model.layers, p->model.hidden,
            p->model.seq, p->cluster.name, p->config.tp, p->config.dp,
            p->config.pp, p->config.mbs, p->config.gbs,
            parallel_microbatches(&p->config), partition,
            schedule_name(p->config.schedule),
            precision_name(p->config.precision));
    if (plan_first_asymmetric_stage(p) >= 0) {
        fprintf(out, "Stages of their own degrees (tp x dp, samples a "
                     "replica's micro-batch):");
        for (int s = 0; s < p->config.pp; s++) {
            parallel_config own =
                parallel_stage_config(&p->config, p->stages, s);
            fprintf(out, "%s stage %d %d x %d (%d)", s > 0 ? ";" : "", s,
                    own.tp, own.dp, own.mbs);
        }
        fprintf(out, ".\n\n");
    }
    if (in->run) {
        fprintf(out, "Run `%s`: backend %s, %d %s", in->run->file,
                in->run->backend[0] ? in->run->backend : "?",
                in->run->iteration_count,
                in->run->log_summary[0] ? "timed log lines" : "iterations");
        if (in->run->event_count > 0)
            fprintf(out, "; measured events from iteration %d",
                    in->run->events_iteration);
        fprintf(out, ".\n\n");
        if (in->run->log_summary[0] != '\0')
            fprintf(out, "%s\n\n", in->run->log_summary);
        fprintf(out, "Error = (estimated - measured) / measured: positive "
                     "when the estimate is too high.\n\n");
    }
    if (in->run && strcmp(in->run->backend, "cpu") == 0)
        fprintf(out, "The run used the cpu reference backend while the "
                     "estimate prices the plan's GPUs: the errors compare "
                     "two different machines and say nothing about the "
                     "cost model's accuracy.\n\n");
    else if (in->run == NULL && in->run_left_out && in->run_left_out[0])
        fprintf(out, "Run not compared: %s. Estimates only (`partita "
                     "report --any-device` compares them anyway).\n\n",
                in->run_left_out);
    else if (in->run == NULL)
        fprintf(out, "No run given: estimates only (run the plan with "
                     "`partita exec` and pass its run.json to compare).\n\n");
}

static double largest(const double *values, int count)
{
    double best = NAN;
    for (int i = 0; i < count; i++)
        if (isfinite(values[i]) && !(values[i] <= best))
            best = values[i];
    return best;
}

/* The largest estimate among the GPUs the run measured (all of them
 * without a run, or when it measured none): a training log may give only
 * some ranks' memory. */
static double largest_estimate_measured(const report_comparison *cmp)
{
    double best = NAN;
    for (int r = 0; r < cmp->rank_count; r++)
        if (isfinite(cmp->measured_memory_gib[r]) &&
            isfinite(cmp->estimated_memory_gib[r]) &&
            !(cmp->estimated_memory_gib[r] <= best))
            best = cmp->estimated_memory_gib[r];
    return isfinite(best) ? best
                          : largest(cmp->estimated_memory_gib, cmp->rank_count);
}

static void write_summary(FILE *out, const report_input *in,
                          const report_comparison *cmp)
{
    const estimate *est = in->estimate;
    const run_record *run = in->run;
    fprintf(out, "## Summary\n\n| quantity | estimated | measured | error |\n"
                 "|---|---:|---:|---:|\n| step time |");
    write_comparison_cells(out, est->step_time_s,
                           run ? run->step_time_s : NAN, UNIT_SECONDS);
    fprintf(out, "| throughput |");
    write_comparison_cells(out, est->tokens_per_s,
                           run ? run->tokens_per_s : NAN, UNIT_TOKENS_PER_S);
    fprintf(out, "| model TFLOP/s per GPU |");
    write_comparison_cells(out, est->tflops_per_gpu,
                           run ? run->tflops_per_gpu : NAN, UNIT_TFLOPS);
    fprintf(out, "| peak memory, largest GPU (CUDA context aside) |");
    write_comparison_cells(out, largest_estimate_measured(cmp),
                           largest(cmp->measured_memory_gib, cmp->rank_count),
                           UNIT_GIB);
    fprintf(out, "| pipeline bubble (estimate only) |");
    write_comparison_cells(out, est->bubble_fraction, NAN, UNIT_PERCENT);
    fprintf(out, "\n");
}

static void write_stage_table(FILE *out, const report_input *in,
                              const report_comparison *cmp)
{
    fprintf(out,
            "## Per stage\n\n"
            "Forward, backward and communication (point-to-point sends of "
            "activations and gradients) are per micro-batch; data-parallel "
            "all-reduce and optimizer once per step. Measured values are "
            "means over the run's events of the stage.\n\n"
            "| stage | GPU | layers | quantity | estimated | measured | "
            "error |\n|---:|---|---:|---|---:|---:|---:|\n");
    for (int s = 0; s < cmp->stage_count; s++) {
        const stage_phases *est = &cmp->estimated[s];
        const stage_phases *meas = &cmp->measured[s];
        const char *names[] = {"forward", "backward", "communication",
                               "dp all-reduce", "optimizer"};
        double est_values[] = {est->forward_s, est->backward_s,
                               est->communication_s, est->dp_allreduce_s,
                               est->optimizer_s};
        double meas_values[] = {meas->forward_s, meas->backward_s,
                                meas->communication_s, meas->dp_allreduce_s,
                                meas->optimizer_s};
        for (int q = 0; q < 5; q++) {
            fprintf(out, "| %d | %s | %d | %s |", s,
                    in->estimate->stages[s].gpu,
                    in->estimate->stages[s].layers, names[q]);
            write_comparison_cells(out, est_values[q], meas_values[q],
                                   UNIT_SECONDS);
        }
    }
    fprintf(out, "\n");
}

static void write_rank_memory_table(FILE *out, const report_input *in,
                                    const report_comparison *cmp)
{
    fprintf(out, "## Peak memory per GPU\n\n"
                 "Both leave the CUDA context out, as run.json's peak "
                 "does.\n\n"
                 "| rank | stage | GPU | estimated | measured | error |\n"
                 "|---:|---:|---|---:|---:|---:|\n");
    for (int r = 0; r < cmp->rank_count; r++) {
        int stage = plan_stage_of_rank(in->plan, r);
        fprintf(out, "| %d | %d | %s |", r, stage,
                in->estimate->stages[stage].gpu);
        write_comparison_cells(out, cmp->estimated_memory_gib[r],
                               cmp->measured_memory_gib[r], UNIT_GIB);
    }
    fprintf(out, "\n");
}

/* One row per stage: the estimate holds for each of its GPUs; the
 * measurement is the stage's fullest GPU. */
static void write_stage_memory_table(FILE *out, const report_input *in,
                                     const report_comparison *cmp)
{
    fprintf(out, "## Peak memory per stage\n\n"
                 "The estimate holds for every GPU of the stage; measured "
                 "is the stage's fullest GPU (`--per-rank` lists every "
                 "rank). Both leave the CUDA context out, as run.json's "
                 "peak does.\n\n"
                 "| stage | ranks | GPU | estimated | measured | error |\n"
                 "|---:|---:|---|---:|---:|---:|\n");
    for (int s = 0; s < cmp->stage_count; s++) {
        int first = plan_stage_first_rank(in->plan, s);
        int ranks_per_stage = plan_stage_ranks(in->plan, s);
        if (ranks_per_stage == 1)
            fprintf(out, "| %d | %d | %s |", s, first,
                    in->estimate->stages[s].gpu);
        else
            fprintf(out, "| %d | %d-%d | %s |", s, first,
                    first + ranks_per_stage - 1, in->estimate->stages[s].gpu);
        write_comparison_cells(out, cmp->stage_estimated_memory_gib[s],
                               cmp->stage_measured_memory_gib[s], UNIT_GIB);
    }
    fprintf(out, "\n");
}

static void write_chart_links(FILE *out, const report_input *in, bool charts,
                              const char *chart_warning)
{
    fprintf(out, "## Charts\n\n");
    if (!charts) {
        fprintf(out, "Charts are missing: %s.\n\n",
                chart_warning && chart_warning[0] ? chart_warning
                                                  : "gnuplot did not run");
        return;
    }
    const char *names[] = {"timeline", "stages", "step_time", "memory"};
    const char *titles[] = {
        in->per_rank ? "Pipeline timeline of one iteration, one lane per rank"
                     : "Pipeline timeline of one iteration, one lane per "
                       "stage",
        "Per stage: forward, backward and communication per micro-batch",
        "Step time over iterations; the dashed line is the estimate",
        in->per_rank ? "Peak memory per GPU"
                     : "Peak memory per stage (measured: its fullest GPU)"};
    for (int i = 0; i < 4; i++) {
        if (!in->run && strcmp(names[i], "step_time") == 0)
            continue;
        fprintf(out, "%s ([SVG](%s.svg)):\n\n![%s](%s.png)\n\n", titles[i],
                names[i], names[i], names[i]);
    }
}

static void write_trailer(FILE *out, const report_input *in)
{
    fprintf(out,
            "## Trace\n\n`trace.json` holds the events of the iteration in "
            "Chrome trace format, one process per %s with an `estimated` "
            "track%s: open it at https://ui.perfetto.dev (Open trace "
            "file).\n\n",
            in->per_rank ? "rank" : "stage",
            in->run ? " and a `measured` one" : "");
    if (in->costmodel == NULL || in->costmodel->note_count == 0)
        return;
    fprintf(out, "## Notes from the cost model\n\n");
    for (int i = 0; i < in->costmodel->note_count; i++)
        fprintf(out, "- %s\n", in->costmodel->notes[i]);
    fprintf(out, "\n");
}

char *report_markdown(const report_input *in, bool charts,
                      const char *chart_warning, pt_error *err)
{
    report_comparison cmp;
    if (report_compare(in->plan, in->estimate, in->run, &cmp, err) != 0)
        return NULL;
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    if (out == NULL) {
        report_comparison_free(&cmp);
        pt_fail(err, "out of memory writing report.md");
        return NULL;
    }
    write_header(out, in);
    write_summary(out, in, &cmp);
    write_stage_table(out, in, &cmp);
    if (in->per_rank)
        write_rank_memory_table(out, in, &cmp);
    else
        write_stage_memory_table(out, in, &cmp);
    write_chart_links(out, in, charts, chart_warning);
    write_trailer(out, in);
    report_comparison_free(&cmp);
    if (fclose(out) != 0 || text == NULL) {
        free(text);
        pt_fail(err, "out of memory writing report.md");
        return NULL;
    }
    return text;
}
