/* partita estimate: the step time, timeline and memory of a given plan. */
#include "cli/cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_estimate_help(void)
{
    printf(
        "usage: partita estimate PLAN [--json] [-o FILE]\n"
        "                             [--per-rank-timeline] [--full-timeline]\n"
        "                             [--profiles DIR]\n"
        "                             [--dp-overlap F]\n"
        "\n"
        "Estimates a plan (written by 'partita plan' or by hand): per-stage\n"
        "forward, backward, send and all-reduce times, memory per GPU, and\n"
        "the simulated step time.\n"
        "\n"
        "  --json            print the plan with its \"estimate\" filled\n"
        "                    (the timeline of one iteration included, once\n"
        "                    per stage, each kind of event its first and\n"
        "                    last 8 with a count of those between) on\n"
        "                    standard output\n"
        "  -o, --output FILE  write that plan to FILE instead (atomically;\n"
        "                    - is standard output, as --json); the tables\n"
        "                    are then printed as without --json\n"
        "  --per-rank-timeline  with --json or -o: the timeline once per\n"
        "                    rank (tp x dp times larger)\n"
        "  --full-timeline   with --json or -o: every event of the timeline\n"
        "                    (its size grows with the micro-batches)\n"
        "  --profiles DIR    look for profiles/<gpu>.json here first\n"
        "  --dp-overlap F    price the dp gradient reduction's overlap with\n"
        "                    the backward bucket by bucket (25 MiB), F (0..1)\n"
        "                    of what the buckets could hide hidden\n"
        "                    (docs/cost-model.md 7.1; default: the closed\n"
        "                    form of the executor's overlap)\n"
        "\n"
        "partita estimate --runs TABLE --cluster FILE ... estimates a table\n"
        "of measured training runs instead (see 'partita estimate --runs\n"
        "--help').\n"
        "\n"
        "Exit status 2 when the plan is invalid or does not fit in memory.\n");
}

typedef struct estimate_arguments {
    const char *plan_path;
    const char *profiles;
    const char *output;      /* the plan with its estimate; NULL: none */
    unsigned timeline;          /* ESTIMATE_JSON_* flags */
    double dp_overlap;          /* -1: off */
} estimate_arguments;

/* --dp-overlap F: a fraction from 0 to 1; -1 (printed) otherwise. */
static int parse_fraction(const char *text, double *out)
{
    char *end = NULL;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= 0.0 && value <= 1.0)) {
        fprintf(stderr, "partita estimate: --dp-overlap: expected a "
                        "fraction from 0 to 1, got '%s'\n", text);
        return -1;
    }
    *out = value;
    return 0;
}

static int parse_estimate_arguments(int argc, char **argv,
                                    estimate_arguments *args)
{
    enum { OPT_JSON = 256, OPT_PER_RANK_TIMELINE, OPT_FULL_TIMELINE,
           OPT_PROFILES, OPT_DP_OVERLAP, OPT_HELP };
    static const struct option options[] = {
        {"json", no_argument, NULL, OPT_JSON},
        {"per-rank-timeline", no_argument, NULL, OPT_PER_RANK_TIMELINE},
        {"full-timeline", no_argument, NULL, OPT_FULL_TIMELINE},
        {"profiles", required_argument, NULL, OPT_PROFILES},
        {"output", required_argument, NULL, 'o'},
        {"dp-overlap", required_argument, NULL, OPT_DP_OVERLAP},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    optind = 1;
    int option;
    bool json = false;
    while ((option = getopt_long(argc, argv, "ho:", options, NULL)) != -1) {
        switch (option) {
        case OPT_JSON: json = true; break;
        case 'o': args->output = optarg; break;
        case OPT_PER_RANK_TIMELINE:
            args->timeline |= ESTIMATE_JSON_PER_RANK;
            break;
        case OPT_FULL_TIMELINE:
            args->timeline |= ESTIMATE_JSON_FULL_TIMELINE;
            break;
        case OPT_PROFILES: args->profiles = optarg; break;
        case OPT_DP_OVERLAP:
            if (parse_fraction(optarg, &args->dp_overlap) != 0)
                return -1;
            break;
        case OPT_HELP:
        case 'h': print_estimate_help(); return 1;
        default: return -1;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "partita estimate: expected one plan file "
                        "(see 'partita estimate --help')\n");
        return -1;
    }
    if (json && args->output != NULL && strcmp(args->output, "-") != 0) {
        fprintf(stderr, "partita estimate: --json prints on standard output "
                        "and -o %s writes a file: give one of them\n",
                args->output);
        return -1;
    }
    if (json)
        args->output = "-";
    if (args->timeline != 0 && args->output == NULL) {
        fprintf(stderr, "partita estimate: --%s shapes the --json output; "
                        "give --json too (or -o FILE)\n",
                args->timeline & ESTIMATE_JSON_PER_RANK ? "per-rank-timeline"
                                                        : "full-timeline");
        return -1;
    }
    args->plan_path = argv[optind];
    return 0;
}

/* The plan with its "estimate" through the one writer (common/). */
static int write_estimated_plan(const estimate_arguments *args,
                                const plan *p, const estimate *est)
{
    pt_error err = {{0}};
    plan_json_sections sections = {
        .estimate = estimate_to_json(est, &p->config, args->timeline,
                                     &err)};
    json_t *root = sections.estimate != NULL
                       ? plan_to_json(p, &sections, &err)
                       : NULL;
    json_decref(sections.estimate);
    return cli_write_json("estimate", root, args->output, &err);
}

/* Prints and, for --json or -o, writes; returns the exit status. */
static int report_estimate(const estimate_arguments *args, const plan *p,
                           costmodel *cm, const estimate *est)
{
    bool json_on_stdout = args->output != NULL &&
                          strcmp(args->output, "-") == 0;
    /* a plan that does not fit is bad input: it replaces no file (on
       standard output it still shows where the memory goes) */
    bool write = json_on_stdout || (args->output != NULL && est->fits);
    if (write && write_estimated_plan(args, p, est) != 0)
        return EXIT_FAILURE_RUN;
    if (json_on_stdout) {
        for (int i = 0; i < cm->note_count; i++)
            fprintf(stderr, "partita estimate: note: %s\n", cm->notes[i]);
    } else {
        printf("# partita estimate: %s\n", args->plan_path);
        print_estimate_summary(p, est);
        if (cm->dp_overlap.enabled)
            printf("# dp overlap: gradients reduced in %.0f MiB buckets "
                   "during the last backward, %.0f %% of what they could "
                   "hide hidden\n",
                   cm->dp_overlap.bucket_bytes / (1024.0 * 1024.0),
                   cm->dp_overlap.hidden_fraction * 100.0);
        print_pricing(est);
        print_notes(cm);
        print_tp_split_note(p);
        if (write)
            printf("# wrote %s (the plan with its estimate)\n",
                   args->output);
    }
    if (!est->fits) {
        char miss[256];
        format_memory_miss(est, miss, sizeof miss);
        char message[320];
        snprintf(message, sizeof message, "%s: plan does not fit: %s",
                 args->plan_path, miss);
        cli_error("estimate", message);
        return EXIT_BAD_INPUT;
    }
    return EXIT_OK;
}

int command_estimate(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--runs") == 0)
            return cmd_estimate_runs(argc, argv);
    estimate_arguments args = {.dp_overlap = -1.0};
    int parsed = parse_estimate_arguments(argc, argv, &args);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (args.output != NULL &&
        cli_check_output("estimate", args.output, false) != 0)
        return EXIT_BAD_INPUT;
    pt_error err = {{0}};
    plan p;
    if (plan_load_file(args.plan_path, &p, &err) != 0) {
        cli_error("estimate", err.message);
        return EXIT_BAD_INPUT;
    }
    if (args.output != NULL &&
        cli_check_not_plan_input("estimate", args.output, args.plan_path,
                                 &p) != 0) {
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    costmodel cm;
    if (costmodel_open(&cm, &p.model, &p.cluster, args.profiles, &err) != 0) {
        cli_error_in("estimate", args.plan_path, err.message);
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    if (args.dp_overlap >= 0.0) {
        cm.dp_overlap.enabled = true;
        cm.dp_overlap.hidden_fraction = args.dp_overlap;
    }
    estimate est;
    int status;
    if (costmodel_estimate_stages(&cm, &p.config, p.stages, p.node_order,
                                  p.node_order_count, p.partition, true,
                                  &est, &err) != 0) {
        cli_error_in("estimate", args.plan_path, err.message);
        status = EXIT_BAD_INPUT;
    } else {
        status = report_estimate(&args, &p, &cm, &est);
        estimate_free(&est);
    }
    costmodel_close(&cm);
    plan_free(&p);
    return status;
}
