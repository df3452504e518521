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
        "                      [--profiles DIR] [--any-device]\n"
        "       partita report PLAN --megatron-log LOG|--deepspeed-log LOG\n"
        "                      [--warmup-iterations N] [-o DIR] ...\n"
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
        "A Megatron-LM or DeepSpeed training log takes RUN's place\n"
        "(docs/interop.md): its step times, losses and, where it prints\n"
        "them, peak memory per rank are compared with the estimate.\n"
        "\n"
        "  -o, --output DIR   the report folder, created when missing\n"
        "  --per-rank         one lane per rank in the timeline and the trace,\n"
        "                     one bar and row per rank for memory (default:\n"
        "                     one per stage, readable at any size)\n"
        "  --profiles DIR     look for profiles/<gpu>.json here first\n"
        "  --any-device       compare a run of the cpu backend with the\n"
        "                     estimate of the plan's GPUs too (by default\n"
        "                     such a run is left out, saying why: its errors\n"
        "                     compare two machines)\n"
        "  --megatron-log LOG  the log of a Megatron-LM run of PLAN\n"
        "  --deepspeed-log LOG the log of a DeepSpeed run of PLAN\n"
        "  --warmup-iterations N  leave out a log's lines of iterations up\n"
        "                     to N (default: its first timed line)\n"
        "\n"
        "PARTITA_GNUPLOT names the gnuplot binary (default: gnuplot on\n"
        "PATH); PARTITA_GNUPLOT_TIMEOUT the seconds it may run (default\n"
        "60; then it is stopped and the report has no charts).\n"
        "Without a working gnuplot the tables and the trace are still written.\n"
        "Exit status 2 when the plan, the run or the log is invalid (a\n"
        "log's message names the line), or the folder cannot take the\n"
        "report (a full disk).\n");
}

typedef struct report_arguments {
    const char *plan_path;
    const char *run_path;    /* NULL: estimate only */
    const char *output_dir;
    const char *profiles;
    bool per_rank;
    bool any_device;         /* compare a run on other devices too */
    double gnuplot_timeout_s;  /* PARTITA_GNUPLOT_TIMEOUT, 0: default */
    const char *log_path;    /* a trainer's log in the run's place */
    bool deepspeed_log;      /* log_path is DeepSpeed's, else Megatron's */
    train_log_options log_options;
    bool warmup_given;
} report_arguments;

/* Prints "partita report: MESSAGE (see ...)"; -1. */
static int report_usage_error(const char *message)
{
    fprintf(stderr, "partita report: %s (see 'partita report --help')\n",
            message);
    return -1;
}

static int parse_warmup(const char *text, train_log_options *options)
{
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < 0) {
        fprintf(stderr, "partita report: --warmup-iterations: expected an "
                        "iteration number (0 or more), got '%s'\n", text);
        return -1;
    }
    options->warmup_iterations = value;
    return 0;
}

/* PARTITA_GNUPLOT_TIMEOUT: seconds, > 0; unset or empty: the default. */
static int parse_gnuplot_timeout(report_arguments *args)
{
    const char *text = getenv("PARTITA_GNUPLOT_TIMEOUT");
    if (text == NULL || text[0] == '\0')
        return 0;
    char *end = NULL;
    double seconds = strtod(text, &end);
    if (end == text || *end != '\0' || !(seconds > 0 && seconds <= 1e6)) {
        fprintf(stderr, "partita report: PARTITA_GNUPLOT_TIMEOUT: expected "
                        "seconds in (0, 1e6], got '%s'\n", text);
        return -1;
    }
    args->gnuplot_timeout_s = seconds;
    return 0;
}

static int parse_report_arguments(int argc, char **argv,
                                  report_arguments *args)
{
    enum { OPT_PROFILES = 256, OPT_PER_RANK, OPT_HELP, OPT_MEGATRON_LOG,
           OPT_DEEPSPEED_LOG, OPT_WARMUP, OPT_ANY_DEVICE };
    static const struct option options[] = {
        {"output", required_argument, NULL, 'o'},
        {"per-rank", no_argument, NULL, OPT_PER_RANK},
        {"any-device", no_argument, NULL, OPT_ANY_DEVICE},
        {"profiles", required_argument, NULL, OPT_PROFILES},
        {"megatron-log", required_argument, NULL, OPT_MEGATRON_LOG},
        {"deepspeed-log", required_argument, NULL, OPT_DEEPSPEED_LOG},
        {"warmup-iterations", required_argument, NULL, OPT_WARMUP},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    args->output_dir = "report";
    args->log_options.warmup_iterations = -1;
    optind = 1;
    int option;
    while ((option = getopt_long(argc, argv, "ho:", options, NULL)) != -1) {
        switch (option) {
        case 'o': args->output_dir = optarg; break;
        case OPT_PROFILES: args->profiles = optarg; break;
        case OPT_PER_RANK: args->per_rank = true; break;
        case OPT_ANY_DEVICE: args->any_device = true; break;
        case OPT_MEGATRON_LOG:
        case OPT_DEEPSPEED_LOG:
            if (args->log_path != NULL)
                return report_usage_error("give one training log");
            args->log_path = optarg;
            args->deepspeed_log = option == OPT_DEEPSPEED_LOG;
            break;
        case OPT_WARMUP:
            if (parse_warmup(optarg, &args->log_options) != 0)
                return -1;
            args->warmup_given = true;
            break;
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
    if (args->log_path != NULL && positional == 2)
        return report_usage_error("give a run file or a training log, not "
                                  "both");
    if (args->warmup_given && args->log_path == NULL)
        return report_usage_error("--warmup-iterations needs "
                                  "--megatron-log or --deepspeed-log");
    args->plan_path = argv[optind];
    args->run_path = positional == 2 ? argv[optind + 1] : NULL;
    return parse_gnuplot_timeout(args);
}

/* Writes the folder and tells what it holds; returns the exit status. */
static int write_report(const report_arguments *args, const plan *p,
                        const costmodel *cm, const estimate *est,
                        const run_record *run, const char *run_left_out)
{
    report_input input = {
        .plan_file = args->plan_path, .plan = p, .estimate = est,
        .costmodel = cm, .run = run, .gnuplot = getenv("PARTITA_GNUPLOT"),
        .gnuplot_timeout_s = args->gnuplot_timeout_s,
        .per_rank = args->per_rank, .run_left_out = run_left_out};
    report_outcome outcome;
    pt_error err = {{0}};
    if (report_write(&input, args->output_dir, &outcome, &err) != 0) {
        /* a folder that cannot take the report is an unwritable output */
        cli_error("report", err.message);
        return EXIT_BAD_INPUT;
    }
    if (!outcome.charts_written) {
        /* the reason may quote gnuplot's own error line */
        char shown[4 * sizeof outcome.chart_warning + 1];
        pt_escape_controls(outcome.chart_warning, shown, sizeof shown);
        fprintf(stderr, "partita report: warning: no charts: %s "
                        "(tables and trace written)\n",
                shown);
    }
    for (int i = 0; i < outcome.file_count; i++)
        fprintf(stderr, "partita report: wrote %s/%s\n", args->output_dir,
                outcome.files[i]);
    return EXIT_OK;
}

static int estimate_and_report(const report_arguments *args, const plan *p,
                               const run_record *run,
                               const char *run_left_out)
{
    pt_error err = {{0}};
    costmodel cm;
    if (costmodel_open(&cm, &p->model, &p->cluster, args->profiles, &err) !=
        0) {
        cli_error_in("report", args->plan_path, err.message);
        return EXIT_BAD_INPUT;
    }
    estimate est;
    int status;
    if (costmodel_estimate_stages(&cm, &p->config, p->stages, p->node_order,
                                  p->node_order_count, p->partition, true,
                                  &est, &err) != 0) {
        cli_error_in("report", args->plan_path, err.message);
        status = EXIT_BAD_INPUT;
    } else {
        if (!est.fits) {
            char miss[256];
            format_memory_miss(&est, miss, sizeof miss);
            fprintf(stderr, "partita report: warning: %s: plan does not "
                            "fit: %s\n", args->plan_path, miss);
        }
        status = write_report(args, p, &cm, &est, run, run_left_out);
        estimate_free(&est);
    }
    costmodel_close(&cm);
    return status;
}

/* The report's files must not replace its inputs (a plan named
 * trace.json in the report folder, say). */
static int check_outputs_not_inputs(const report_arguments *args)
{
    const char *const written[] = {"report.md", "trace.json"};
    const char *const inputs[] = {args->plan_path, args->run_path,
                                  args->log_path};
    const char *const roles[] = {"plan", "run record", "training log"};
    for (int w = 0; w < 2; w++) {
        char output[PT_PATH_MAX + 16];
        snprintf(output, sizeof output, "%s/%s", args->output_dir,
                 written[w]);
        for (int i = 0; i < 3; i++)
            if (cli_check_not_input("report", output, inputs[i],
                                    roles[i]) != 0)
                return -1;
    }
    return 0;
}

int command_report(int argc, char **argv)
{
    report_arguments args = {0};
    int parsed = parse_report_arguments(argc, argv, &args);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (cli_check_output("report", args.output_dir, true) != 0 ||
        check_outputs_not_inputs(&args) != 0)
        return EXIT_BAD_INPUT;
    pt_error err = {{0}};
    plan p;
    if (plan_load_file(args.plan_path, &p, &err) != 0) {
        cli_error("report", err.message);
        return EXIT_BAD_INPUT;
    }
    run_record run;
    bool have_run = args.run_path != NULL || args.log_path != NULL;
    int loaded = 0;
    if (args.log_path != NULL)
        loaded = args.deepspeed_log
                     ? deepspeed_log_load_file(args.log_path, &p,
                                               &args.log_options, &run, &err)
                     : megatron_log_load_file(args.log_path, &p,
                                              &args.log_options, &run, &err);
    else if (have_run && (run_record_load_file(args.run_path, &run, &err) != 0 ||
                          run_record_check_plan(&run, &p, &err) != 0 ||
                          run_record_check_same_plan(&run, &p, &err) != 0))
        loaded = -1;
    if (loaded != 0) {
        cli_error("report", err.message);
        run_record_free(&run);
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    /* a run on other devices than the plan's is compared only when asked:
       its errors would compare two machines */
    char why[512], left_out[PT_PATH_MAX + 600] = "";
    bool compared = have_run;
    if (have_run && !args.any_device &&
        !run_record_on_plan_devices(&run, &p, why, sizeof why)) {
        compared = false;
        snprintf(left_out, sizeof left_out, "`%s`: %s", run.file, why);
        fprintf(stderr, "partita report: %s: not compared: %s (--any-device "
                        "compares it anyway)\n", run.file, why);
    }
    int status = estimate_and_report(&args, &p, compared ? &run : NULL,
                                     left_out);
    if (have_run)
        run_record_free(&run);
    plan_free(&p);
    return status;
}
