/*
 * Measured training runs against the cost model (docs/profiles.md,
 * "Calibrated on training runs"):
 *   partita estimate --runs TABLE --cluster C      every run estimated,
 *                                                  each error and the sum
 *   partita profile --from-logs TABLE --cluster C  a derived profile's
 *                                                  roofline fitted to them
 * A runs table is common/runs_table.c's; a run may also be a plan and
 * the Megatron-LM or DeepSpeed log of its launch (PLAN=LOG), read as
 * `partita report --megatron-log` reads it; the fit is
 * costmodel/calibrate.c.
 */
#include "cli/cli.h"
#include "report/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The arguments both commands take; strings point into argv. */
typedef struct runs_arguments {
    const char *command;     /* "estimate" or "profile", for messages */
    const char *runs;        /* --runs / --from-logs */
    const char *cluster;     /* --cluster */
    const char *profile;     /* --profile (estimate) or --base (profile) */
    const char *profiles;    /* --profiles DIR */
    const char *output;      /* -o (profile) */
    const char *where;       /* --where COLUMN=VALUE */
    runs_table_options table;
    char where_column[128];  /* --where's column, table.where_column */
    bool help;
} runs_arguments;

static void print_runs_help(const char *command)
{
    bool fit = strcmp(command, "profile") == 0;
    printf("usage: partita %s %s TABLE [--cluster FILE] [%s FILE]\n"
           "        [--precision P] [--recompute R] [--runtime R]\n"
           "        [--attention A] [--vocab N] [--where COLUMN=VALUE]\n"
           "        [--profiles DIR]%s\n\n",
           command, fit ? "--from-logs" : "--runs",
           fit ? "--base" : "--profile", fit ? " [-o FILE]" : "");
    if (fit)
        printf("Fits the roofline of a derived profile (--base, default the\n"
               "profile of the cluster's GPU) to the step times of measured\n"
               "training runs, and writes the calibrated profile (-o).\n\n");
    else
        printf("Estimates every run of a table of measured training runs\n"
               "and prints each one's error and the summary.\n\n");
    printf("  TABLE             comma-separated sources of runs, each a runs\n"
           "                    table (.csv) or PLAN.json=LOG, a Megatron-LM\n"
           "                    log of that plan's launch (PLAN.json=\n"
           "                    deepspeed:LOG for a DeepSpeed log); its\n"
           "                    step time the median of its timed iterations\n"
           "  a runs table:     runs, one a line, comma-separated under a\n"
           "                    header: hidden, heads, layers, seq, gbs,\n"
           "                    mbs, tp, dp, pp, measured_ms (or\n"
           "                    measured_s); optional id, vocab,\n"
           "                    ffn_hidden, precision, recompute, runtime,\n"
           "                    attention (docs/formats.md, \"Runs table\")\n"
           "  --cluster FILE    the cluster a table's runs ran on: one node\n"
           "                    type; each run gets the nodes its GPUs fill\n"
           "                    (a plan's run: the plan's own cluster)\n"
           "  --precision, --recompute, --runtime, --attention\n"
           "                    what a column the table lacks means (the\n"
           "                    plan's fields; default: the plan's defaults)\n"
           "  --vocab N         vocabulary when the table has none (50257)\n"
           "  --where C=V       only the rows whose column C is V\n"
           "  --profiles DIR    look for profiles/<gpu>.json here first\n");
    if (fit)
        printf("  -o FILE           write the calibrated profile (atomically)\n");
    printf("\nExit status 2 on a bad table, cluster or profile.\n");
}

static int parse_where(runs_arguments *a)
{
    const char *equals = a->where ? strchr(a->where, '=') : NULL;
    if (a->where == NULL)
        return 0;
    if (equals == NULL || equals == a->where ||
        (size_t)(equals - a->where) >= sizeof a->where_column) {
        cli_error(a->command, "--where takes COLUMN=VALUE");
        return -1;
    }
    memcpy(a->where_column, a->where, (size_t)(equals - a->where));
    a->where_column[equals - a->where] = '\0';
    a->table.where_column = a->where_column;
    a->table.where_value = equals + 1;
    return 0;
}

static int parse_runs_arguments(int argc, char **argv, runs_arguments *a)
{
    const char *flag = strcmp(a->command, "profile") == 0 ? "--from-logs"
                                                          : "--runs";
    const char *profile_flag = strcmp(a->command, "profile") == 0
                                   ? "--base"
                                   : "--profile";
    a->table.vocab = 50257;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            a->help = true;
            return 0;
        }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (i + 1 >= argc) {
            char message[256];
            snprintf(message, sizeof message, "unknown argument or missing "
                     "value: %s (see --help)", arg);
            cli_error(a->command, message);
            return -1;
        }
        const char *value = argv[++i];
        if (strcmp(arg, flag) == 0)
            a->runs = value;
        else if (strcmp(arg, "--cluster") == 0)
            a->cluster = value;
        else if (strcmp(arg, profile_flag) == 0)
            a->profile = value;
        else if (strcmp(arg, "--profiles") == 0)
            a->profiles = value;
        else if (strcmp(arg, "-o") == 0 && profile_flag[2] == 'b')
            a->output = value;
        else if (strcmp(arg, "--precision") == 0)
            a->table.precision = value;
        else if (strcmp(arg, "--recompute") == 0)
            a->table.recompute = value;
        else if (strcmp(arg, "--runtime") == 0)
            a->table.runtime = value;
        else if (strcmp(arg, "--attention") == 0)
            a->table.attention = value;
        else if (strcmp(arg, "--where") == 0)
            a->where = value;
        else if (strcmp(arg, "--vocab") == 0) {
            char *end = NULL;
            a->table.vocab = strtol(value, &end, 10);
            if (*end != '\0' || a->table.vocab < 1) {
                cli_error(a->command, "--vocab takes a positive integer");
                return -1;
            }
        } else {
            char message[256];
            snprintf(message, sizeof message, "unknown argument: %s (see "
                     "--help)", arg);
            cli_error(a->command, message);
            return -1;
        }
    }
    if (a->runs == NULL) {
        char message[256];
        snprintf(message, sizeof message, "%s TABLE is needed (see --help)",
                 flag);
        cli_error(a->command, message);
        return -1;
    }
    return parse_where(a);
}

/* The runs of the table, and the profile that prices their GPU. */
typedef struct runs_input {
    json_t *cluster;
    measured_run *runs;
    int count;
    calibration_run *calibration;
    profile prof;
    char profile_path[PT_PATH_MAX];
} runs_input;

static void runs_input_free(runs_input *in)
{
    runs_table_free(in->runs, in->count);
    free(in->calibration);
    json_decref(in->cluster);
    profile_free(&in->prof);
}

/* Appends the runs of more to in's (taking them over). */
static int append_runs(runs_input *in, measured_run *more, int count,
                       pt_error *err)
{
    measured_run *all = realloc(in->runs, (size_t)(in->count + count) *
                                              sizeof *all);
    if (all == NULL) {
        runs_table_free(more, count);
        return pt_fail(err, "out of memory");
    }
    memcpy(all + in->count, more, (size_t)count * sizeof *all);
    free(more);
    in->runs = all;
    in->count += count;
    return 0;
}

/* One run from a plan and the log of its launch ("PLAN=LOG", or
 * "PLAN=deepspeed:LOG"): the median step time of its timed iterations. */
static int load_log_run(const char *item, measured_run *out, pt_error *err)
{
    char plan_path[PT_PATH_MAX];
    const char *equals = strchr(item, '=');
    size_t length = (size_t)(equals - item);
    if (length == 0 || length >= sizeof plan_path)
        return pt_fail(err, "%s: a run from a log is PLAN.json=LOG", item);
    memcpy(plan_path, item, length);
    plan_path[length] = '\0';
    const char *log = equals + 1;
    bool deepspeed = strncmp(log, "deepspeed:", 10) == 0;
    if (deepspeed)
        log += 10;
    memset(out, 0, sizeof *out);
    if (plan_load_file(plan_path, &out->plan, err) != 0)
        return -1;
    train_log_options options = {.warmup_iterations = -1};
    run_record record;
    int status = deepspeed ? deepspeed_log_load_file(log, &out->plan,
                                                     &options, &record, err)
                           : megatron_log_load_file(log, &out->plan,
                                                    &options, &record, err);
    if (status == 0 && !(record.step_time_s > 0.0))
        status = pt_fail(err, "%s: no step time in it", log);
    if (status == 0) {
        out->measured_s = record.step_time_s;
        const char *name = strrchr(log, '/');
        snprintf(out->id, sizeof out->id, "%s", name ? name + 1 : log);
    }
    if (status == 0)
        run_record_free(&record);
    else
        plan_free(&out->plan);
    return status;
}

/* Every source of --runs / --from-logs: runs tables and plan=log pairs,
 * comma-separated. */
static int load_sources(runs_arguments *a, runs_input *in, pt_error *err)
{
    char *list = strdup(a->runs);
    if (list == NULL)
        return pt_fail(err, "out of memory");
    int status = 0;
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); status == 0 && item;
         item = strtok_r(NULL, ",", &save)) {
        measured_run *more = NULL;
        int count = 0;
        if (strchr(item, '=') != NULL) {
            more = calloc(1, sizeof *more);
            if (more == NULL)
                status = pt_fail(err, "out of memory");
            else if ((status = load_log_run(item, more, err)) == 0)
                count = 1;
            else
                free(more);
        } else {
            status = runs_table_load(item, &a->table, &more, &count, err);
        }
        if (status == 0)
            status = append_runs(in, more, count, err);
    }
    free(list);
    if (status == 0 && in->count == 0)
        status = pt_fail(err, "%s: no runs", a->runs);
    return status;
}

static int load_runs_input(runs_arguments *a, runs_input *in, pt_error *err)
{
    memset(in, 0, sizeof *in);
    if (a->cluster != NULL) {
        in->cluster = pt_json_load_file(a->cluster, err);
        if (in->cluster == NULL)
            return -1;
    }
    a->table.cluster = in->cluster;
    a->table.cluster_file = a->cluster;
    if (load_sources(a, in, err) != 0)
        return -1;
    in->calibration = calloc((size_t)in->count, sizeof *in->calibration);
    if (in->calibration == NULL)
        return pt_fail(err, "out of memory");
    for (int i = 0; i < in->count; i++)
        in->calibration[i] = (calibration_run){.plan = &in->runs[i].plan,
                                               .measured_s =
                                                   in->runs[i].measured_s};
    for (int i = 0; i < in->count; i++)
        pt_copy_string(in->calibration[i].id, sizeof in->calibration[i].id,
                       in->runs[i].id);
    const char *gpu = in->runs[0].plan.cluster.types[0].gpu;
    if (a->profile != NULL) {
        pt_copy_string(in->profile_path, sizeof in->profile_path,
                       a->profile);
        return profile_load_file(a->profile, &in->prof, err);
    }
    if (profile_find(gpu, a->profiles, NULL, in->profile_path,
                     sizeof in->profile_path, err) != 0)
        return -1;
    return profile_load_for_gpu(in->profile_path, gpu, &in->prof, err);
}

/* Each run's line and the summary, as estimate --runs prints them. */
static void print_runs(const runs_input *in, const double *estimated,
                       const bool *fits, const char *title)
{
    printf("# %s: %d runs, profile %s (%s)\n", title, in->count,
           in->prof.gpu, in->profile_path);
    int width = 8;
    for (int i = 0; i < in->count; i++)
        if ((int)strlen(in->runs[i].id) > width)
            width = (int)strlen(in->runs[i].id);
    printf("# %-*s %5s %4s %4s %4s %4s %12s %12s %8s\n", width, "id", "gpus",
           "tp", "dp", "pp", "mbs", "measured", "estimated", "error");
    printf("# %-*s %5s %4s %4s %4s %4s %12s %12s %8s\n", width, "", "", "",
           "", "", "", "(s)", "(s)", "(%)");
    int refused = 0;
    for (int i = 0; i < in->count; i++) {
        const parallel_config *c = &in->runs[i].plan.config;
        double error = 100.0 * (estimated[i] / in->runs[i].measured_s - 1.0);
        printf("  %-*s %5d %4d %4d %4d %4d %12.4f %12.4f %+7.1f%s\n",
               width, in->runs[i].id, c->tp * c->dp * c->pp, c->tp, c->dp, c->pp,
               c->mbs, in->runs[i].measured_s, estimated[i], error,
               fits[i] ? "" : "  does not fit");
        refused += !fits[i];
    }
    calibration_summary sum;
    calibration_summarise(in->calibration, in->count, estimated, &sum);
    printf("# mean |error| %.1f %%, median %.1f %%, %d of %d within 10 %% "
           "(%.0f %%), worst %+.1f %%, RMS log error %.3f; %d refused (do "
           "not fit in memory)\n",
           100.0 * sum.mean_abs_error, 100.0 * sum.median_abs_error,
           sum.within_10_percent, sum.run_count,
           100.0 * sum.within_10_percent / sum.run_count,
           100.0 * sum.worst_error, sum.rms_log_error, refused);
}

int cmd_estimate_runs(int argc, char **argv)
{
    runs_arguments a = {.command = "estimate"};
    if (parse_runs_arguments(argc, argv, &a) != 0)
        return EXIT_BAD_INPUT;
    if (a.help) {
        print_runs_help("estimate");
        return EXIT_OK;
    }
    pt_error err = {{0}};
    runs_input in;
    int status = EXIT_OK;
    double *estimated = NULL;
    bool *fits = NULL;
    if (load_runs_input(&a, &in, &err) != 0) {
        cli_error("estimate", err.message);
        status = EXIT_BAD_INPUT;
    } else {
        estimated = calloc((size_t)in.count, sizeof *estimated);
        fits = calloc((size_t)in.count, sizeof *fits);
        if (!estimated || !fits) {
            cli_error("estimate", "out of memory");
            status = EXIT_FAILURE_RUN;
        } else if (calibration_estimate(in.calibration, in.count, &in.prof,
                                        estimated, fits, &err) != 0) {
            cli_error_in("estimate", a.runs, err.message);
            status = EXIT_BAD_INPUT;
        } else {
            print_runs(&in, estimated, fits, a.runs);
        }
    }
    free(estimated);
    free(fits);
    runs_input_free(&in);
    return status;
}

/* ------------------------------------------------------ profile --from-logs */

static json_t *roofline_json(const roofline_params *p)
{
    json_t *obj = json_object();
    json_object_set_new(obj, "gemm_efficiency", json_real(p->gemm_efficiency));
    json_object_set_new(obj, "gemm_half_work_gflop_per_sm",
                        json_real(p->gemm_half_work_flop / 1e9));
    json_object_set_new(obj, "attention_efficiency",
                        json_real(p->attention_efficiency));
    json_object_set_new(obj, "bandwidth_efficiency",
                        json_real(p->bandwidth_efficiency));
    json_object_set_new(obj, "kernel_overhead_us",
                        json_real(p->kernel_overhead_s * 1e6));
    json_object_set_new(obj, "bandwidth_saturation_sm_fraction",
                        json_real(p->bandwidth_saturation_sm_fraction));
    return obj;
}

/* The base profile's file with its roofline calibrated and what was
 * done said in its provenance (calibrated_on, which keeps the
 * transferred roofline the fit started from: fitted numbers stay apart
 * from the measured ones they came from). */
static json_t *calibrated_profile_json(const runs_arguments *a,
                                       const runs_input *in,
                                       const roofline_params *fitted,
                                       const calibration_summary *before,
                                       const calibration_summary *after,
                                       int argc, char **argv, pt_error *err)
{
    json_t *root = pt_json_load_file(in->profile_path, err);
    if (root == NULL)
        return NULL;
    json_t *efficiency = json_object_get(root, "efficiency");
    json_t *provenance = json_object_get(root, "provenance");
    if (!json_is_object(efficiency) || !json_is_object(provenance)) {
        json_decref(root);
        pt_fail(err, "%s: a derived profile with efficiency and provenance "
                "is needed to calibrate", in->profile_path);
        return NULL;
    }
    json_t *transferred = json_object_get(efficiency, "roofline");
    json_t *on = json_object();
    json_object_set(on, "transferred_roofline", transferred);
    json_object_set_new(efficiency, "roofline", roofline_json(fitted));
    char command[1024], date[16];
    cli_command_and_date(argc, argv, command, sizeof command, date,
                         sizeof date);
    json_object_set_new(on, "runs", json_string(a->runs));
    json_object_set_new(on, "cluster", json_string(a->cluster));
    json_object_set_new(on, "run_count", json_integer(in->count));
    json_object_set_new(on, "fitted",
                        json_string("gemm_efficiency, gemm_half_work, "
                                    "attention_efficiency, "
                                    "bandwidth_efficiency, "
                                    "kernel_overhead_us: least squares in "
                                    "log step time over the runs, pulled "
                                    "towards the transferred values "
                                    "(costmodel/calibrate.c)"));
    json_object_set_new(on, "mean_abs_error_percent_before",
                        json_real(pt_round_significant(
                            100.0 * before->mean_abs_error, 3)));
    json_object_set_new(on, "mean_abs_error_percent",
                        json_real(pt_round_significant(
                            100.0 * after->mean_abs_error, 3)));
    json_object_set_new(on, "within_10_percent",
                        json_integer(after->within_10_percent));
    json_object_set_new(on, "worst_error_percent",
                        json_real(pt_round_significant(
                            100.0 * after->worst_error, 3)));
    json_object_set_new(on, "date", json_string(date));
    json_object_set_new(on, "command", json_string(command));
    json_object_set_new(provenance, "calibrated_on", on);
    return root;
}

int cmd_profile_from_logs(int argc, char **argv)
{
    runs_arguments a = {.command = "profile"};
    if (parse_runs_arguments(argc, argv, &a) != 0)
        return EXIT_BAD_INPUT;
    if (a.help) {
        print_runs_help("profile");
        return EXIT_OK;
    }
    if (a.output != NULL && cli_check_output("profile", a.output, false) != 0)
        return EXIT_BAD_INPUT;
    pt_error err = {{0}};
    runs_input in;
    int status = EXIT_OK;
    double *before = NULL, *after = NULL;
    bool *fits = NULL;
    json_t *out = NULL;
    if (load_runs_input(&a, &in, &err) != 0) {
        cli_error("profile", err.message);
        runs_input_free(&in);
        return EXIT_BAD_INPUT;
    }
    before = calloc((size_t)in.count, sizeof *before);
    after = calloc((size_t)in.count, sizeof *after);
    fits = calloc((size_t)in.count, sizeof *fits);
    roofline_params fitted;
    calibration_summary was, is;
    if (!before || !after || !fits) {
        cli_error("profile", "out of memory");
        status = EXIT_FAILURE_RUN;
    } else if (calibration_estimate(in.calibration, in.count, &in.prof,
                                    before, fits, &err) != 0 ||
               calibration_fit(in.calibration, in.count, &in.prof, &fitted,
                               &err) != 0) {
        cli_error_in("profile", a.runs, err.message);
        status = EXIT_BAD_INPUT;
    } else {
        calibration_summarise(in.calibration, in.count, before, &was);
        in.prof.roofline = fitted;
        if (calibration_estimate(in.calibration, in.count, &in.prof, after,
                                 fits, &err) != 0) {
            cli_error_in("profile", a.runs, err.message);
            status = EXIT_BAD_INPUT;
        } else {
            calibration_summarise(in.calibration, in.count, after, &is);
            printf("# before calibration: mean |error| %.1f %%, %d of %d "
                   "within 10 %%\n", 100.0 * was.mean_abs_error,
                   was.within_10_percent, was.run_count);
            printf("# calibrated roofline: GEMM efficiency %.4g, half work "
                   "%.4g GFLOP/SM, attention %.4g, bandwidth %.4g, kernel "
                   "overhead %.4g us\n", fitted.gemm_efficiency,
                   fitted.gemm_half_work_flop / 1e9,
                   fitted.attention_efficiency, fitted.bandwidth_efficiency,
                   fitted.kernel_overhead_s * 1e6);
            print_runs(&in, after, fits, "calibrated on");
        }
    }
    if (status == EXIT_OK && a.output != NULL) {
        out = calibrated_profile_json(&a, &in, &fitted, &was, &is, argc, argv,
                                      &err);
        if (out == NULL ||
            json_write_file_atomic(out, a.output, &err) != 0) {
            cli_error("profile", err.message);
            status = EXIT_BAD_INPUT;
        } else {
            printf("# wrote %s\n", a.output);
        }
    }
    json_decref(out);
    free(before);
    free(after);
    free(fits);
    runs_input_free(&in);
    return status;
}
