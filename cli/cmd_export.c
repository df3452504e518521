/* partita export: a plan as another trainer's launch: a Megatron-LM launch
 * script or a DeepSpeed ds_config (interop/, docs/interop.md). */
#include "cli/cli.h"
#include "interop/interop.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_export_help(void)
{
    printf(
        "usage: partita export PLAN --to megatron|deepspeed [--symmetric]\n"
        "                      [-o FILE]\n"
        "\n"
        "Writes PLAN as another trainer's launch (docs/interop.md):\n"
        "  megatron   a bash script running Megatron-LM's pretrain_gpt.py\n"
        "             under torchrun, one per node (NODE_RANK=i), or srun\n"
        "             (LAUNCHER=srun): tp, pp, batch sizes, model shape,\n"
        "             precision, recompute, distributed optimizer, the\n"
        "             partition, the hosts in the plan's node order\n"
        "  deepspeed  a ds_config JSON: batch sizes, gradient accumulation,\n"
        "             ZeRO stage, precision; its \"partita\" block holds the\n"
        "             partition as PipelineModule boundaries and the\n"
        "             hostfile\n"
        "What the trainer cannot be told is said in notes inside the file.\n"
        "\n"
        "  --to TRAINER       megatron or deepspeed\n"
        "  --symmetric        a plan whose stages run their own tp or dp\n"
        "                     (which neither trainer runs): export the\n"
        "                     nearest symmetric plan (one tp x dp that the\n"
        "                     fewest stages change; layers per stage and\n"
        "                     node order kept; docs/interop.md) instead of\n"
        "                     refusing it\n"
        "  -o, --output FILE  write FILE (atomically); default or '-':\n"
        "                     standard output\n"
        "\n"
        "Exit status 2 when the plan is invalid, the trainer cannot run it\n"
        "(a stage of its own tp or dp without --symmetric), or FILE cannot\n"
        "be written.\n");
}

typedef struct export_arguments {
    const char *plan_path;
    const char *output;    /* NULL or "-": standard output */
    int target;            /* interop_target, -1 until --to */
    bool symmetric;        /* --symmetric */
} export_arguments;

static int parse_export_arguments(int argc, char **argv,
                                  export_arguments *args)
{
    enum { OPT_TO = 256, OPT_SYMMETRIC, OPT_HELP };
    static const struct option options[] = {
        {"to", required_argument, NULL, OPT_TO},
        {"symmetric", no_argument, NULL, OPT_SYMMETRIC},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    args->target = -1;
    optind = 1;
    int option;
    while ((option = getopt_long(argc, argv, "ho:", options, NULL)) != -1) {
        switch (option) {
        case OPT_TO:
            args->target = interop_target_from_name(optarg);
            if (args->target < 0) {
                fprintf(stderr, "partita export: --to: expected megatron or "
                                "deepspeed, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 'o': args->output = optarg; break;
        case OPT_SYMMETRIC: args->symmetric = true; break;
        case OPT_HELP:
        case 'h': print_export_help(); return 1;
        default: return -1;
        }
    }
    if (optind + 1 != argc || args->target < 0 ||
        (args->output != NULL && args->output[0] == '\0')) {
        fprintf(stderr, "partita export: expected one plan file and --to "
                        "megatron|deepspeed (see 'partita export --help')\n");
        return -1;
    }
    args->plan_path = argv[optind];
    return 0;
}

/* The export's text: the script, or the ds_config as Partita writes every
 * JSON file. NULL with err. */
static char *export_text(const plan *p, const export_arguments *args,
                         pt_error *err)
{
    if (args->target == INTEROP_MEGATRON)
        return interop_megatron_script(p, args->plan_path, err);
    json_t *config = interop_deepspeed_config(p, args->plan_path, err);
    if (config == NULL)
        return NULL;
    char *text = json_format_text(config);
    json_decref(config);
    if (text == NULL)
        pt_fail(err, "out of memory writing the ds_config");
    return text;
}

static int write_export(const char *text, const export_arguments *args,
                        const plan *p)
{
    bool to_stdout = args->output == NULL || strcmp(args->output, "-") == 0;
    pt_error err = {{0}};
    /* standard output too goes through the one writer, whose message
       says why a write failed ("No space left on device") */
    if (pt_write_file_atomic(to_stdout ? "-" : args->output, text,
                             strlen(text), &err) != 0) {
        cli_error("export", err.message);
        return EXIT_BAD_INPUT;
    }
    if (to_stdout)
        return EXIT_OK;
    interop_notes notes;
    interop_notes_of(p, (interop_target)args->target, &notes);
    fprintf(stderr, "partita export: wrote %s (%s, %d note%s inside)\n",
            args->output,
            args->target == INTEROP_MEGATRON ? "Megatron-LM launch script"
                                             : "DeepSpeed ds_config",
            notes.count, notes.count == 1 ? "" : "s");
    return EXIT_OK;
}

/* A plan whose stages run their own tp or dp: refused in one line naming
 * the stage, or with --symmetric replaced by the nearest symmetric plan
 * (said on standard error). */
static int symmetric_plan(const export_arguments *args, plan *p)
{
    pt_error err = {{0}};
    if (interop_check_symmetric(p, (interop_target)args->target, &err) == 0)
        return 0;
    if (!args->symmetric) {
        cli_error_in("export", args->plan_path, err.message);
        return -1;
    }
    plan nearest;
    char said[512];
    if (interop_nearest_symmetric(p, args->plan_path, &nearest, said,
                                  sizeof said, &err) != 0) {
        cli_error_in("export", args->plan_path, err.message);
        return -1;
    }
    plan_free(p);
    *p = nearest;
    fprintf(stderr, "partita export: %s: %s\n", args->plan_path, said);
    return 0;
}

int command_export(int argc, char **argv)
{
    export_arguments args = {0};
    int parsed = parse_export_arguments(argc, argv, &args);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (args.output != NULL && strcmp(args.output, "-") != 0 &&
        cli_check_output("export", args.output, false) != 0)
        return EXIT_BAD_INPUT;
    pt_error err = {{0}};
    plan p;
    if (plan_load_file(args.plan_path, &p, &err) != 0) {
        cli_error("export", err.message);
        return EXIT_BAD_INPUT;
    }
    if (args.output != NULL &&
        cli_check_not_plan_input("export", args.output, args.plan_path,
                                 &p) != 0) {
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    if (symmetric_plan(&args, &p) != 0) {
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    char *text = export_text(&p, &args, &err);
    int status;
    if (text == NULL) {
        cli_error_in("export", args.plan_path, err.message);
        status = EXIT_BAD_INPUT;
    } else {
        status = write_export(text, &args, &p);
        free(text);
    }
    plan_free(&p);
    return status;
}
