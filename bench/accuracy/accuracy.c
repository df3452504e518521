/*
 * bench/accuracy: the cost model against the GPUs. For every plan of the
 * suite (bench/accuracy/plans/NAME.json) and the run.json that `partita
 * exec` wrote for it on the GPU machine (RUNS/NAME.run.json, made by
 * bench/accuracy/run.sh), estimates the plan with the committed profiles
 * and compares step time and peak memory; writes the table, the mean and
 * largest errors, the terms of the model (forward, backward,
 * communication per stage) and a scatter chart (gnuplot) of estimated
 * against measured step time; and, where the runs carry them
 * (memory_terms_gib), each memory term estimated and measured per stage.
 * Suites: bench/accuracy/plans (run.sh, run_gpus.sh) and plans-1gpu
 * (run_one_gpu.sh). docs/accuracy.md is its output.
 *
 * usage: accuracy PLANS_DIR RUNS_DIR OUT.md CHART_DIR
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "report/report.h"

#define MAX_PLANS 64

/* One plan of the suite, compared. */
typedef struct suite_row {
    char name[PT_NAME_MAX];
    char layout[400];             /* model, degrees, partition, batch */
    double estimated_step_s, measured_step_s;
    double estimated_memory_gib, measured_memory_gib;
    double forward_error, backward_error; /* % per micro-batch, mean over
                                             stages */
    /* per stage (stage_count): the estimate's memory terms, and the
     * measured ones of the stage's largest rank (NAN where not known) */
    int stage_count;
    pt_memory_terms *estimated_terms;     /* owned */
    pt_memory_terms *measured_terms;      /* owned; NULL: the run has none */
    bool memory_with_context; /* the memory compared counts the CUDA
                                 context on both sides (measured for
                                 every stage) */
    bool has_run;
    char problem[sizeof(pt_error)]; /* why a row has no comparison */
} suite_row;

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The .json files of dir, sorted; returns how many (<= MAX_PLANS). */
static int list_plans(const char *dir, char **names)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL && count < MAX_PLANS) {
        size_t length = strlen(entry->d_name);
        if (length > 5 && strcmp(entry->d_name + length - 5, ".json") == 0)
            names[count++] = strdup(entry->d_name);
    }
    closedir(d);
    qsort(names, (size_t)count, sizeof *names, compare_names);
    return count;
}

static void describe_layout(const plan *p, char *out, size_t size)
{
    char partition[96];
    partition_format(p->partition, p->config.pp, partition, sizeof partition);
    snprintf(out, size, "%s on %s: tp %d dp %d pp %d (%s), mbs %d, gbs %d, %s",
             p->model.name, p->cluster.name, p->config.tp, p->config.dp,
             p->config.pp, partition, p->config.mbs, p->config.gbs,
             p->config.schedule == SCHEDULE_GPIPE ? "GPipe" : "1F1B");
}

static double largest(const double *values, int count)
{
    double top = 0.0;
    for (int i = 0; i < count; i++)
        if (values[i] > top)
            top = values[i];
    return top;
}

/* Mean over stages of the per-micro-batch forward and backward errors. */
static void phase_errors(const report_comparison *cmp, suite_row *row)
{
    double forward = 0.0, backward = 0.0;
    int counted = 0;
    for (int s = 0; s < cmp->stage_count; s++) {
        double f = report_error_percent(cmp->estimated[s].forward_s,
                                        cmp->measured[s].forward_s);
        double b = report_error_percent(cmp->estimated[s].backward_s,
                                        cmp->measured[s].backward_s);
        if (isnan(f) || isnan(b))
            continue;
        forward += f;
        backward += b;
        counted++;
    }
    row->forward_error = counted > 0 ? forward / counted : NAN;
    row->backward_error = counted > 0 ? backward / counted : NAN;
}

/* The estimate's terms of every stage; the memory compared with a run's
 * peak is the largest stage's without the context, which a run's peak
 * leaves out too (its terms measure it apart). */
static int keep_estimated_terms(const estimate *est, suite_row *row)
{
    row->stage_count = est->stage_count;
    row->estimated_terms =
        calloc((size_t)est->stage_count, sizeof *row->estimated_terms);
    if (row->estimated_terms == NULL)
        return -1;
    row->estimated_memory_gib = 0.0;
    for (int s = 0; s < est->stage_count; s++) {
        row->estimated_terms[s] = est->stages[s].memory;
        double gib =
            pt_memory_terms_total(&est->stages[s].memory, false) / PT_GIB;
        if (gib > row->estimated_memory_gib)
            row->estimated_memory_gib = gib;
    }
    return 0;
}

/* Whether any rank of the run has any term (the cpu backend's have
 * none). */
static bool run_has_terms(const run_record *run)
{
    for (int rank = 0; run->memory_terms != NULL && rank < run->rank_count;
         rank++)
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            if (!isnan(run->memory_terms[rank].bytes[t]))
                return true;
    return false;
}

/* The total of the terms measured (NAN bytes left out). */
static double measured_total(const pt_memory_terms *terms, bool with_context)
{
    double sum = 0.0;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        if ((with_context || t != PT_MEMORY_CONTEXT) && !isnan(terms->bytes[t]))
            sum += terms->bytes[t];
    return sum;
}

/* Where the run measured the context of every stage (ranks alone on
 * their GPUs), the memory compared is the whole device memory in use:
 * every term and the context, on both sides, the largest stage's. */
static void compare_with_context(suite_row *row)
{
    if (row->measured_terms == NULL)
        return;
    double estimated = 0.0, measured = 0.0;
    for (int s = 0; s < row->stage_count; s++) {
        if (isnan(row->measured_terms[s].bytes[PT_MEMORY_CONTEXT]))
            return;
        estimated = fmax(estimated,
                         pt_memory_terms_total(&row->estimated_terms[s], true));
        measured = fmax(measured,
                        measured_total(&row->measured_terms[s], true));
    }
    row->memory_with_context = true;
    row->estimated_memory_gib = estimated / PT_GIB;
    row->measured_memory_gib = measured / PT_GIB;
}

/* Each stage's measured terms: those of its rank with the largest peak. */
static int keep_measured_terms(const plan *p, const run_record *run,
                               suite_row *row)
{
    if (!run_has_terms(run))
        return 0;
    row->measured_terms =
        calloc((size_t)row->stage_count, sizeof *row->measured_terms);
    if (row->measured_terms == NULL)
        return -1;
    /* A stage's ranks by its own degrees (plans whose stages run their
     * own tp and dp take other ranks than the plan-wide layout). A run
     * with fewer ranks than the plan (a stage that never started) leaves
     * that stage's terms unknown rather than reading past the run. */
    for (int s = 0; s < row->stage_count; s++) {
        int first = plan_stage_first_rank(p, s);
        int count = plan_stage_ranks(p, s);
        if (first >= run->rank_count) {
            for (int term = 0; term < PT_MEMORY_TERM_COUNT; term++)
                row->measured_terms[s].bytes[term] = NAN;
            continue;
        }
        int largest = first;
        for (int rank = first; rank < first + count; rank++)
            if (rank < run->rank_count &&
                run->peak_memory_gib[rank] > run->peak_memory_gib[largest])
                largest = rank;
        row->measured_terms[s] = run->memory_terms[largest];
    }
    return 0;
}

static int compare_plan(const char *plans_dir, const char *runs_dir,
                        const char *file, suite_row *row, pt_error *err)
{
    char path[PT_PATH_MAX * 2], run_path[PT_PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", plans_dir, file);
    pt_copy_string(row->name, sizeof row->name, file);
    row->name[strlen(row->name) - 5] = '\0';
    snprintf(run_path, sizeof run_path, "%s/%s.run.json", runs_dir,
             row->name);
    plan p;
    if (plan_load_file(path, &p, err) != 0)
        return -1;
    describe_layout(&p, row->layout, sizeof row->layout);
    costmodel cm;
    estimate est;
    int status = -1;
    if (costmodel_open(&cm, &p.model, &p.cluster, NULL, err) != 0)
        goto no_model;
    if (costmodel_estimate_stages(&cm, &p.config, p.stages, p.node_order,
                                  p.node_order_count, p.partition, true,
                                  &est, err) != 0)
        goto no_estimate;
    row->estimated_step_s = est.step_time_s;
    if (keep_estimated_terms(&est, row) != 0) {
        pt_fail(err, "out of memory");
        goto no_run;
    }
    run_record run;
    pt_error run_err = {{0}};
    if (run_record_load_file(run_path, &run, &run_err) != 0 ||
        run_record_check_plan(&run, &p, &run_err) != 0) {
        snprintf(row->problem, sizeof row->problem, "%s", run_err.message);
        status = 0;
        goto no_run;
    }
    report_comparison cmp;
    if (report_compare(&p, &est, &run, &cmp, err) == 0) {
        row->has_run = true;
        row->measured_step_s = run.step_time_s;
        row->measured_memory_gib = largest(run.peak_memory_gib,
                                           run.rank_count);
        phase_errors(&cmp, row);
        report_comparison_free(&cmp);
        status = keep_measured_terms(&p, &run, row) == 0
                     ? 0
                     : pt_fail(err, "out of memory");
        compare_with_context(row);
    }
    run_record_free(&run);
no_run:
    estimate_free(&est);
no_estimate:
    costmodel_close(&cm);
no_model:
    plan_free(&p);
    return status;
}

static void format_error(double percent, char *out, size_t size)
{
    report_format_error(percent, out, size);
}

static void write_table(FILE *out, const suite_row *rows, int count)
{
    fprintf(out, "| plan | layout | step est. | step meas. | error | "
                 "memory est. | memory meas. | error | fwd err. | "
                 "bwd err. |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < count; i++) {
        const suite_row *r = &rows[i];
        if (!r->has_run) {
            fprintf(out, "| %s | %s | %.1f ms | not run | | %.2f GiB | | | "
                         "| |\n",
                    r->name, r->layout, 1e3 * r->estimated_step_s,
                    r->estimated_memory_gib);
            continue;
        }
        char step[32], memory[32], forward[32], backward[32];
        format_error(report_error_percent(r->estimated_step_s,
                                          r->measured_step_s),
                     step, sizeof step);
        format_error(report_error_percent(r->estimated_memory_gib,
                                          r->measured_memory_gib),
                     memory, sizeof memory);
        format_error(r->forward_error, forward, sizeof forward);
        format_error(r->backward_error, backward, sizeof backward);
        const char *mark = r->memory_with_context ? " (c)" : "";
        fprintf(out, "| %s | %s | %.1f ms | %.1f ms | %s | %.2f GiB%s | "
                     "%.2f GiB%s | %s | %s | %s |\n",
                r->name, r->layout, 1e3 * r->estimated_step_s,
                1e3 * r->measured_step_s, step, r->estimated_memory_gib,
                mark, r->measured_memory_gib, mark, memory, forward,
                backward);
    }
}

static void write_summary(FILE *out, const suite_row *rows, int count)
{
    for (int i = 0; i < count; i++)
        if (rows[i].has_run && rows[i].memory_with_context) {
            fprintf(out, "\n(c): the whole device memory in use, the CUDA "
                         "context included (measured: cudaMemGetInfo, for "
                         "ranks alone on their GPU); elsewhere the memory "
                         "the ranks allocated, the context left out on "
                         "both sides.\n");
            break;
        }
    double step_sum = 0.0, step_max = 0.0, memory_sum = 0.0,
           memory_max = 0.0;
    int measured = 0;
    for (int i = 0; i < count; i++) {
        if (!rows[i].has_run)
            continue;
        double step = fabs(report_error_percent(rows[i].estimated_step_s,
                                                rows[i].measured_step_s));
        double memory = fabs(report_error_percent(
            rows[i].estimated_memory_gib, rows[i].measured_memory_gib));
        step_sum += step;
        memory_sum += memory;
        step_max = step > step_max ? step : step_max;
        memory_max = memory > memory_max ? memory : memory_max;
        measured++;
    }
    if (measured == 0) {
        fprintf(out, "\nNo plan of the suite has a run yet.\n");
        return;
    }
    fprintf(out, "\n%d of %d plans measured. Step time: mean absolute error "
                 "%.1f %%, largest %.1f %% (targets 3 %% and 8 %%). Peak "
                 "memory: mean absolute error %.1f %%, largest %.1f %% "
                 "(target 5 %%).\n",
            measured, count, step_sum / measured, step_max,
            memory_sum / measured, memory_max);
}

/* "3.05 / 3.04" (GiB, estimated / measured), "3.05 / -" where the run
 * did not measure the term. */
static void format_pair(double estimated, double measured, char *out,
                        size_t size)
{
    if (isnan(measured))
        snprintf(out, size, "%.2f / -", estimated / PT_GIB);
    else
        snprintf(out, size, "%.2f / %.2f", estimated / PT_GIB,
                 measured / PT_GIB);
}

/* One row per stage of every run that carries memory terms: each term
 * estimated / measured (GiB), then the total without the context and
 * its error. */
static void write_term_table(FILE *out, const suite_row *rows, int count)
{
    static const char *const headers[PT_MEMORY_TERM_COUNT] = {
        "weights", "mirror", "grads", "optimizer", "activations", "logits",
        "scratch", "cuBLASLt", "comm", "rounding", "context"};
    int shown = 0;
    for (int i = 0; i < count; i++)
        shown += rows[i].has_run && rows[i].measured_terms != NULL;
    if (shown == 0) {
        fprintf(out, "\nNo run carries memory terms (memory_terms_gib) "
                     "yet.\n");
        return;
    }
    fprintf(out, "\nMemory per stage, term by term (GiB, estimated / "
                 "measured on the stage's largest rank; the total leaves "
                 "the context out, as the peak above):\n\n| plan | stage |");
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        fprintf(out, " %s |", headers[t]);
    fprintf(out, " total | error |\n|---|---:|");
    for (int t = 0; t <= PT_MEMORY_TERM_COUNT + 1; t++)
        fprintf(out, "---:|");
    fprintf(out, "\n");
    for (int i = 0; i < count; i++) {
        const suite_row *r = &rows[i];
        if (!r->has_run || r->measured_terms == NULL)
            continue;
        for (int s = 0; s < r->stage_count; s++) {
            const pt_memory_terms *e = &r->estimated_terms[s];
            const pt_memory_terms *m = &r->measured_terms[s];
            fprintf(out, "| %s | %d |", r->name, s);
            char pair[48];
            for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++) {
                format_pair(e->bytes[t], m->bytes[t], pair, sizeof pair);
                fprintf(out, " %s |", pair);
            }
            double estimated = pt_memory_terms_total(e, false);
            double measured = measured_total(m, false);
            char error[32];
            format_error(report_error_percent(estimated, measured), error,
                         sizeof error);
            format_pair(estimated, measured, pair, sizeof pair);
            fprintf(out, " %s | %s |\n", pair, error);
        }
    }
}

/* The scatter chart with gnuplot (PNG and SVG); returns 0 when drawn. */
static int draw_scatter(const char *chart_dir, const suite_row *rows,
                        int count)
{
    char data_path[PT_PATH_MAX], script[4096];
    snprintf(data_path, sizeof data_path, "%s/accuracy-scatter.dat",
             chart_dir);
    FILE *data = fopen(data_path, "w");
    if (data == NULL)
        return -1;
    double top = 0.0;
    for (int i = 0; i < count; i++) {
        if (!rows[i].has_run)
            continue;
        fprintf(data, "%.3f %.3f %s\n", 1e3 * rows[i].measured_step_s,
                1e3 * rows[i].estimated_step_s, rows[i].name);
        double larger = 1e3 * fmax(rows[i].measured_step_s,
                                   rows[i].estimated_step_s);
        top = larger > top ? larger : top;
    }
    fclose(data);
    const char *gnuplot = getenv("PARTITA_GNUPLOT");
    snprintf(script, sizeof script,
             "%s -e \"set xlabel 'measured step time (ms)'; "
             "set ylabel 'estimated step time (ms)'; set key top left; "
             "set grid; set xrange [0:%.0f]; set yrange [0:%.0f]; "
             "do for [t in 'pngcairo svg'] { "
             "set terminal t size 800,600; "
             "set output '%s/accuracy-scatter.'.(t eq 'svg' ? 'svg' : 'png'); "
             "plot '%s' using 1:2 with points pt 7 ps 1.3 title 'plans', "
             "x with lines dt 2 title 'y = x' }\"",
             gnuplot != NULL ? gnuplot : "gnuplot", top * 1.1, top * 1.1,
             chart_dir, data_path);
    int status = system(script);
    remove(data_path);
    return status == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s PLANS_DIR RUNS_DIR OUT.md CHART_DIR\n",
                argv[0]);
        return 2;
    }
    char *names[MAX_PLANS];
    int count = list_plans(argv[1], names);
    if (count <= 0) {
        fprintf(stderr, "accuracy: no plans in %s\n", argv[1]);
        return 2;
    }
    suite_row *rows = calloc((size_t)count, sizeof *rows);
    int status = 0;
    for (int i = 0; i < count && rows != NULL; i++) {
        pt_error err = {{0}};
        if (compare_plan(argv[1], argv[2], names[i], &rows[i], &err) != 0) {
            fprintf(stderr, "accuracy: %s: %s\n", names[i], err.message);
            status = 1;
        } else if (!rows[i].has_run) {
            fprintf(stderr, "accuracy: %s: no run (%s)\n", names[i],
                    rows[i].problem);
        }
    }
    FILE *out = rows != NULL ? fopen(argv[3], "w") : NULL;
    if (out == NULL) {
        fprintf(stderr, "accuracy: cannot write %s\n", argv[3]);
        status = 2;
    } else {
        write_table(out, rows, count);
        write_summary(out, rows, count);
        write_term_table(out, rows, count);
        bool drawn = draw_scatter(argv[4], rows, count) == 0;
        fprintf(out, "\n%s\n", drawn ? "![estimated against measured step "
                                       "time](accuracy/accuracy-scatter.svg)"
                                     : "(gnuplot failed: no scatter chart)");
        fclose(out);
    }
    for (int i = 0; i < count; i++) {
        free(names[i]);
        if (rows != NULL) {
            free(rows[i].estimated_terms);
            free(rows[i].measured_terms);
        }
    }
    free(rows);
    return status;
}
