/* partita report: estimated against measured, as tables, gnuplot charts
 * and a Perfetto trace. */
#include "cli/cli.h"
#include "report/report.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_report_help(void)
{
    printf(
        "usage: partita report PLAN [RUN] [-o DIR] [--per-rank]\n"
        "                      [--profiles DIR]\n"
        "\n"
        "Compares the cost model's estimate of PLAN with what 'partita exec'\n"
        "measured (RUN, its run.json) and writes into DIR (default:\n"
        "report):\n"
        "  report.md    tables: step time, tokens/s, TFLOP/s per GPU, per-stage\n"
        "               forward/backward/communication and memory per GPU,\n"
        "               estimated, measured and the error in %%\n"
        "  *.png *.svg  charts drawn with gnuplot: timeline, stages, memory,\n"
        "               step_time (the last only with a run)\n"
        "  trace.json   Chrome trace of one iteration, for Perfetto\n"
        "               (https://ui.perfetto.dev)\n"
        "Without RUN only the estimate is reported.\n"
        "\n"
        "  -o, --output DIR   the report folder, created when missing\n"
        "  --per-rank         one lane per rank in the timeline and the trace,\n"
        "                     one bar and row per rank for memory (default:\n"
        "                     one per stage, readable at any size)\n"
        "  --profiles DIR     look for profiles/<gpu>.json here first\n"
        "\n"
        "PARTITA_GNUPLOT names the gnuplot binary (default: gnuplot on\n"
        "PATH).\n"
        "Without a working gnuplot the tables and the trace are still written.\n"
        "Exit status 2 when the plan or the run is invalid.\n");
}

typedef struct report_arguments {
    const char *plan_path;
    const char *run_path;    /* NULL: estimate only */
    const char *output_dir;
    const char *profiles;
    bool per_rank;
} report_arguments;

static int parse_report_arguments(int argc, char **argv,
                                  report_arguments *args)
{
    enum { OPT_PROFILES = 256, OPT_PER_RANK, OPT_HELP };
    static const struct option options[] = {
        {"output", required_argument, NULL, 'o'},
        {"per-rank", no_argument, NULL, OPT_PER_RANK},
        {"profiles", required_argument, NULL, OPT_PROFILES},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    args->output_dir = "report";
    optind = 1;
    int option;
    while ((option = getopt_long(argc, argv, "ho:", options, NULL)) != -1) {
        switch (option) {
        case 'o': args->output_dir = optarg; break;
        case OPT_PROFILES: args->profiles = optarg; break;
        case OPT_PER_RANK: args->per_rank = true; break;
        case OPT_HELP:
        case 'h': print_report_help(); return 1;
        default: return -1;
        }
    }
    int positional = argc - optind;
    if (positional < 1 || positional > 2 || args->output_dir[0] == '\0') {
        fprintf(stderr, "partita report: expected a plan file and optionally "
                        "a run file (see 'partita report --help')\n");
        return -1;
    }
    args->plan_path = argv[optind];
    args->run_path = positional == 2 ? argv[optind + 1] : NULL;
    return 0;
}

/* Writes the folder and tells what it holds; returns the exit status. */
static int write_report(const report_arguments *args, const plan *p,
                        const costmodel *cm, const estimate *est,
                        const run_record *run)
{
    report_input input = {
        .plan_file = args->plan_path, .plan = p, .estimate = est,
        .costmodel = cm, .run = run, .gnuplot = getenv("PARTITA_GNUPLOT"),
        .per_rank = args->per_rank};
    report_outcome outcome;
    pt_error err = {{0}};
    if (report_write(&input, args->output_dir, &outcome, &err) != 0) {
        cli_error("report", err.message);
        return EXIT_FAILURE_RUN;
    }
    if (!outcome.charts_written)
        fprintf(stderr, "partita report: warning: no charts: %s "
                        "(tables and trace written)\n",
                outcome.chart_warning);
    for (int i = 0; i < outcome.file_count; i++)
        fprintf(stderr, "partita report: wrote %s/%s\n", args->output_dir,
                outcome.files[i]);
    return EXIT_OK;
}

static int estimate_and_report(const report_arguments *args, const plan *p,
                               const run_record *run)
{
    pt_error err = {{0}};
    costmodel cm;
    if (costmodel_open(&cm, &p->model, &p->cluster, args->profiles, &err) !=
        0) {
        cli_error("report", err.message);
        return EXIT_BAD_INPUT;
    }
    estimate est;
    int status;
    if (costmodel_estimate(&cm, &p->config, p->node_order,
                           p->node_order_count, p->partition, true, &est,
                           &err) != 0) {
        char message[1200];
        snprintf(message, sizeof message, "%s: %s", args->plan_path,
                 err.message);
        cli_error("report", message);
        status = EXIT_BAD_INPUT;
    } else {
        if (!est.fits) {
            char miss[256];
            format_memory_miss(&est, miss, sizeof miss);
            fprintf(stderr, "partita report: warning: %s: plan does not "
                            "fit: %s\n", args->plan_path, miss);
        }
        status = write_report(args, p, &cm, &est, run);
        estimate_free(&est);
    }
    costmodel_close(&cm);
    return status;
}

int command_report(int argc, char **argv)
{
    report_arguments args = {0};
    int parsed = parse_report_arguments(argc, argv, &args);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (cli_check_output("report", args.output_dir, true) != 0)
        return EXIT_BAD_INPUT;
    pt_error err = {{0}};
    plan p;
    if (plan_load_file(args.plan_path, &p, &err) != 0) {
        cli_error("report", err.message);
        return EXIT_BAD_INPUT;
    }
    run_record run;
    bool have_run = args.run_path != NULL;
    if (have_run && (run_record_load_file(args.run_path, &run, &err) != 0 ||
                     run_record_check_plan(&run, &p, &err) != 0)) {
        cli_error("report", err.message);
        run_record_free(&run);
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    int status = estimate_and_report(&args, &p, have_run ? &run : NULL);
    if (have_run)
        run_record_free(&run);
    plan_free(&p);
    return status;
}
