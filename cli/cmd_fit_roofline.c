/*
 * partita profile --fit-roofline: gives a measured profile the per-kernel
 * roofline (costmodel/roofline.c) fitted on its own layer and head times,
 * so that the shapes it did not measure, and that have no measured
 * neighbours, are priced by the model that transfers to other GPUs
 * rather than by one mean efficiency (docs/profiles.md, "Shapes far from
 * the measured ones"). The measured times are kept as they were; the
 * fitted parameters go to efficiency.roofline and what was fitted, on
 * what and with which error to provenance.roofline_fit.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "costmodel/costmodel.h"

typedef struct fit_arguments {
    const char *source; /* the profile read (default: the output) */
    const char *output;
} fit_arguments;

static void print_fit_help(void)
{
    printf(
        "usage: partita profile --fit-roofline [SOURCE.json] -o OUT.json\n"
        "\n"
        "Fits the per-kernel roofline (docs/profiles.md) on the layer and\n"
        "head times of a measured profile and writes the profile with it\n"
        "(efficiency.roofline) and the fit's error (provenance.roofline_fit).\n"
        "The cost model then prices a shape the profile lacks, with no\n"
        "measured shape near it, by that roofline. Without SOURCE, OUT is\n"
        "read and rewritten (atomically) with the roofline added; its\n"
        "measured times are never changed.\n"
        "\n"
        "  -o, --output FILE   profile to write (required)\n"
        "\n"
        "Exit status: 0 written, 1 the write failed, 2 bad arguments or "
        "files.\n");
}

/* Returns 0 to go on, 1 when help was printed, -1 on a bad argument. */
static int parse_fit_arguments(int argc, char **argv, fit_arguments *a)
{
    enum { OPT_FIT = 256, OPT_HELP };
    static const struct option options[] = {
        {"fit-roofline", no_argument, NULL, OPT_FIT},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    optind = 1;
    opterr = 1;
    int option;
    while ((option = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        switch (option) {
        case OPT_FIT: break;
        case 'o': a->output = optarg; break;
        case OPT_HELP:
        case 'h': print_fit_help(); return 1;
        default: return -1;
        }
    }
    if (optind < argc)
        a->source = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "partita profile: unexpected argument '%s'\n",
                argv[optind]);
        return -1;
    }
    if (a->output == NULL) {
        fprintf(stderr, "partita profile: --fit-roofline needs -o OUT.json "
                        "(see 'partita profile --fit-roofline --help')\n");
        return -1;
    }
    if (a->source == NULL)
        a->source = a->output;
    return 0;
}

/* provenance.roofline_fit: what was fitted, on which times, its error. */
static int record_fit(profile *p, const roofline_fit_result *fit, int argc,
                      char **argv, pt_error *err)
{
    char command[1024], date[16];
    cli_command_and_date(argc, argv, command, sizeof command, date,
                         sizeof date);
    json_t *record = json_pack(
        "{s:s, s:i, s:i, s:f, s:f, s:s, s:s, s:s}", "fitted_on",
        "this profile's measured layer and head times, forward and backward "
        "(the embedding's, and times with tensor-parallel communication "
        "inside, left out)",
        "times_fitted", fit->all.points, "times_left_out", fit->all.left_out,
        "rms_log_error", pt_round_significant(fit->all.rms_log_error, 3),
        "max_error_percent",
        pt_round_significant(100.0 * fit->all.max_error, 3), "model",
        "per-kernel roofline, costmodel/roofline.c, docs/profiles.md; "
        "fitted numbers, not measured ones",
        "date", date, "command", command);
    if (record == NULL || p->provenance == NULL ||
        json_object_set_new(p->provenance, "roofline_fit", record) != 0)
        return pt_fail(err, "out of memory writing the provenance");
    return 0;
}

static int fit_and_write(const fit_arguments *a, int argc, char **argv,
                         pt_error *err)
{
    profile p = {0};
    roofline_fit_result fit;
    json_t *root = NULL;
    int status = EXIT_BAD_INPUT;
    if (profile_load_file(a->source, &p, err) != 0)
        goto done;
    if (p.source == PROFILE_DERIVED) {
        pt_fail(err, "%s: source is \"derived\": its roofline is already "
                "fitted on the profiles it was derived from",
                a->source);
        goto done;
    }
    if (roofline_fit(&p, 1, &fit, err) != 0 ||
        record_fit(&p, &fit, argc, argv, err) != 0)
        goto done;
    p.roofline = fit.params;
    root = profile_to_json(&p, a->output, err);
    if (root == NULL)
        goto done;
    status = EXIT_FAILURE_RUN;
    if (json_write_file_atomic(root, a->output, err) != 0)
        goto done;
    printf("# roofline fitted on %d times of %s (%d left out): RMS log "
           "error %.3f, largest error %.1f %%\n",
           fit.all.points, a->source, fit.all.left_out,
           fit.all.rms_log_error, 100.0 * fit.all.max_error);
    printf("# wrote %s\n", a->output);
    status = EXIT_OK;
done:
    json_decref(root);
    profile_free(&p);
    return status;
}

int cmd_profile_fit_roofline(int argc, char **argv)
{
    fit_arguments arguments = {0};
    int parsed = parse_fit_arguments(argc, argv, &arguments);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (cli_check_output("profile", arguments.output, false) != 0)
        return EXIT_BAD_INPUT;
    pt_error err = {""};
    int status = fit_and_write(&arguments, argc, argv, &err);
    if (status != EXIT_OK)
        cli_error("profile", err.message);
    return status;
}
