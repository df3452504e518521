/*
 * report: estimated against measured. Reads what `partita exec` measured
 * (run.json), joins it with the cost model's estimate of the same plan and
 * writes report.md (tables), gnuplot charts (PNG and SVG) and a Chrome
 * trace (trace.json) for Perfetto. docs/report.md describes every file.
 */
#ifndef PARTITA_REPORT_H
#define PARTITA_REPORT_H

#include "common/common.h"
#include "costmodel/costmodel.h"

/* ------------------------------------------------------------- run.json */

/* One timed iteration of a run. */
typedef struct run_iteration {
    int iteration;       /* 1-based, as exec counts them */
    double step_time_s;
    double loss;         /* nats per token */
} run_iteration;

/* The parts of run.json a report uses, validated; everything else in the
 * file is left unread. */
typedef struct run_record {
    char file[PT_PATH_MAX];         /* as the user named it */
    char backend[PT_NAME_MAX];      /* training.backend, "" when absent */
    int rank_count;                 /* length of peak_memory_gib */
    int tp, dp, pp, gbs, mbs;       /* of the plan that ran */
    double step_time_s;             /* median of the timed iterations */
    double tokens_per_s;
    double tflops_per_gpu;
    int events_iteration;           /* the iteration `events` come from */
    int iteration_count;
    run_iteration *iterations;      /* owned */
    int event_count;
    timeline_event *events;         /* owned */
    double *peak_memory_gib;        /* owned, [rank_count]; NAN: not
                                       measured */
    pt_memory_terms *memory_terms;  /* owned, [rank_count], NAN where not
                                       known; NULL: the file has none */
    /* Read from a training log rather than a run.json: what it held and
     * lacked, a paragraph for the report's header ("" for a run.json). */
    char log_summary[1024];
    json_t *plan_json;              /* owned reference: run.json's "plan"
                                       (NULL for a log) */
} run_record;

/* Readers zero *out first and free what they built on failure. Messages
 * name the file, the JSON path and the reason. */
int run_record_from_json(const json_t *root, const char *file,
                         run_record *out, pt_error *err);
int run_record_load_file(const char *path, run_record *out, pt_error *err);
void run_record_free(run_record *run);

/* Fails, naming the run's field, when the run's plan has other degrees,
 * batch sizes or rank count than the plan being reported. */
int run_record_check_plan(const run_record *run, const plan *p,
                          pt_error *err);

/* Whether the run ran on the devices the plan is for. False, with why
 * ("ran on the cpu reference backend, the plan is for A100-FASOP
 * GPUs"), for a run of the cpu backend: its times compare two machines
 * (+287,904 %), not the cost model with the GPUs. A cuda run was checked
 * against the cluster's GPU types before it started (device_check_plan)
 * and a trainer's log is of the plan's launch: both are. */
/* Fails, naming the first field that differs ("plan.model.hidden"),
 * when the whole plan recorded in a run.json (model, cluster, partition,
 * node order, levers) is not the plan being reported: a run of another
 * plan compares nothing. A record read from a log holds no plan: 0. */
int run_record_check_same_plan(const run_record *run, const plan *p,
                               pt_error *err);

bool run_record_on_plan_devices(const run_record *run, const plan *p,
                                char *why, size_t why_size);

/* ------------------------------------------------------- training logs */

/* How a trainer's log is read (report/train_log.c). */
typedef struct train_log_options {
    /* Iterations up to this one are warm-up, left out; -1: leave out the
     * first timed line only (its time holds the start-up). */
    long warmup_iterations;
} train_log_options;

/* Reads the log of a Megatron-LM run of plan p (report/megatron_log.c:
 * its iteration lines, memory lines and printed arguments) into a run
 * record, which a report compares like a run.json: step times and
 * losses per logged iteration, peak memory of the ranks that printed
 * it, no events. Fails, naming the file and the line number, on a
 * malformed or truncated line, a log of another plan, or no timed
 * line. *out is zeroed first and empty on failure. */
int megatron_log_load_file(const char *path, const plan *p,
                           const train_log_options *options, run_record *out,
                           pt_error *err);
/* The same for DeepSpeed (report/deepspeed_log.c): the pipeline engine's
 * "steps: N loss: L iter time (s): T" lines, else the throughput timer's
 * "global_step=N, ... CurrSamplesPerSec=S, ... MaxMemAllocated=M GB". */
int deepspeed_log_load_file(const char *path, const plan *p,
                            const train_log_options *options,
                            run_record *out, pt_error *err);

/* ----------------------------------------------------------- comparison */

/* Signed error of an estimate against a measurement in percent:
 * (estimated - measured) / measured x 100. NAN when the measurement is
 * missing (NAN), not positive, or either value is not finite. */
double report_error_percent(double estimated, double measured);

/* "+1.4 %", "-12 %", or "n/a" for NAN. */
void report_format_error(double error_percent, char *out, size_t size);

/* What a stage did in one iteration, taken from events: the mean duration
 * per micro-batch of its forward and backward passes and of its
 * point-to-point transfers, and the once-per-step work. NAN where the
 * events hold no such phase for the stage (communication and per-step
 * terms are 0, not NAN, once the stage has any compute event: a phase
 * that never happened took no time). */
typedef struct stage_phases {
    double forward_s;
    double backward_s;
    double communication_s;   /* send_fwd + send_bwd per micro-batch */
    double dp_allreduce_s;    /* per step, mean over the stage's ranks */
    double optimizer_s;
} stage_phases;

/* Fills phases[pp] from any event list (estimated or measured). */
void report_stage_phases(const timeline_event *events, int event_count,
                         int pp, stage_phases *phases);

/* Everything a report compares, stage by stage and rank by rank. The
 * estimated stage phases come from the estimate's stage table, the
 * measured ones from the run's events; measured values are NAN without a
 * run. An estimate is per stage: every rank of a stage has its figures. */
typedef struct report_comparison {
    int stage_count, rank_count;
    stage_phases *estimated;        /* owned, [stage_count] */
    stage_phases *measured;         /* owned, [stage_count] */
    double *estimated_memory_gib;   /* owned, [rank_count] */
    double *measured_memory_gib;    /* owned, [rank_count] */
    /* Per stage: the estimate, and the fullest of the stage's ranks in
     * the run (its rank in measured_memory_rank, -1 and NAN: none). */
    double *stage_estimated_memory_gib; /* owned, [stage_count] */
    double *stage_measured_memory_gib;  /* owned, [stage_count] */
    int *stage_measured_memory_rank;    /* owned, [stage_count] */
} report_comparison;

/* run may be NULL. Fails only when out of memory. */
int report_compare(const plan *p, const estimate *est, const run_record *run,
                   report_comparison *out, pt_error *err);
void report_comparison_free(report_comparison *cmp);

/* ---------------------------------------------------------------- trace */

/* The Chrome trace (Perfetto's JSON format): one process per stage
 * (pid = stage), or with per_rank one per rank (pid = rank); thread 1
 * "estimated" (the stage's estimated events, which every rank of it runs)
 * and thread 2 "measured" (a stage shows the run's events of one of its
 * ranks, report_stage_measured_rank; a rank its own). Complete ("X")
 * events with ts and dur in microseconds, process_name / thread_name
 * metadata. run may be NULL (estimated threads only). */
json_t *report_trace_json(const plan *p, const estimate *est,
                          const run_record *run, bool per_rank,
                          pt_error *err);

/* The rank whose measured events stand for a stage in per-stage views:
 * the stage's first rank with events in the run; -1 when run is NULL or
 * holds none of the stage's. */
int report_stage_measured_rank(const plan *p, const run_record *run,
                               int stage);

#define REPORT_TRACE_TID_ESTIMATED 1
#define REPORT_TRACE_TID_MEASURED 2

/* ---------------------------------------------------------------- write */

/* What report_write needs; run may be NULL. */
typedef struct report_input {
    const char *plan_file;        /* as the user named them, for titles */
    const plan *plan;
    const estimate *estimate;     /* with events */
    const costmodel *costmodel;   /* for its notes; may be NULL */
    const run_record *run;
    const char *gnuplot;          /* binary name or path; NULL: "gnuplot" */
    double gnuplot_timeout_s;     /* gnuplot is stopped after this long;
                                     0: REPORT_GNUPLOT_TIMEOUT_S */
    /* A run given but not compared (run is then NULL): why, for the
     * header of report.md; NULL or "" when none was left out. */
    const char *run_left_out;
    /* Lanes of the timeline chart and the trace, bars of the memory chart
     * and rows of the memory table: one per rank, instead of one per
     * stage (readable at any size; a stage's ranks share its estimate). */
    bool per_rank;
} report_input;

#define REPORT_MAX_FILES 16
/* gnuplot draws a 1,024-GPU plan's charts in a few seconds: one that runs
 * for a minute hangs (a wrong PARTITA_GNUPLOT, say). */
#define REPORT_GNUPLOT_TIMEOUT_S 60.0

/* What report_write did. The library never prints: the caller shows the
 * warning and the files. */
typedef struct report_outcome {
    bool charts_written;
    char chart_warning[512];      /* why the charts are missing, or "" */
    int file_count;
    char files[REPORT_MAX_FILES][PT_NAME_MAX]; /* names inside dir */
} report_outcome;

/* Creates dir when missing and writes report.md, trace.json and (when
 * gnuplot works) the charts, each atomically (temporary file, rename).
 * A gnuplot failure is not an error: outcome->chart_warning says why and
 * report.md says the charts are missing. */
int report_write(const report_input *in, const char *dir,
                 report_outcome *outcome, pt_error *err);

/* The markdown text of report.md (caller frees); charts says whether the
 * chart files exist, chart_warning why not. */
char *report_markdown(const report_input *in, bool charts,
                      const char *chart_warning, pt_error *err);

/* Draws the charts with gnuplot into dir (see docs/report.md); fills
 * charts->files with the chart names. -1 with reason set when gnuplot is
 * missing, fails or runs past its time limit (it is then killed); no
 * chart is then left in dir. Charts in dir that this report does not
 * draw (an older report's) are removed either way. */
int report_draw_charts(const report_input *in, const report_comparison *cmp,
                       const char *dir, report_outcome *charts,
                       char *reason, size_t reason_size);

#endif
