/*
 * The arguments of `partita profile`: its help and their parsing, shared
 * by both executables: `partita` parses them to run --compare itself (and
 * to answer --help and bad arguments without loading the GPU stack);
 * `partita-exec` parses them again to measure (cli/profile_measure.c).
 */
#include "cli/cli.h"
#include "profiler/profiler.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_profile_help(void)
{
    printf(
        "usage: partita profile --model M [options] [-o FILE]\n"
        "       partita profile --compare A.json B.json [--tolerance P]\n"
        "       partita profile --derive GPU --from P1.json,... (see\n"
        "                       'partita profile --derive --help')\n"
        "       partita profile --from-logs TABLE --cluster FILE ... (see\n"
        "                       'partita profile --from-logs --help')\n"
        "       partita profile --fit-roofline [P.json] -o OUT.json (see\n"
        "                       'partita profile --fit-roofline --help')\n"
        "\n"
        "Measures, on the GPU at hand, the embedding, one transformer layer\n"
        "(GPT-2's, or a Llama-family layer as the model file describes it)\n"
        "and the head of the model, forward and backward, for every tp (the\n"
        "shard one rank of the group computes, without the tp all-reduces)\n"
        "and micro-batch that fits, the AdamW step per parameter, and for an\n"
        "offloaded optimizer the host's AdamW and copies per parameter; with\n"
        "two GPUs or more, NCCL all-reduce, reduce-scatter and all-gather\n"
        "curves over 2, 4 and 8 GPUs (as many as there are) and send/recv\n"
        "between two, from 4 KiB to 1 GiB.\n"
        "Writes a profile of source \"measured\" (docs/profiles.md).\n"
        "\n"
        "  --model M[,M2...]      model files or bundled names (required);\n"
        "                         each model is one shape of the profile,\n"
        "                         keyed by its widths and its layer's\n"
        "                         architecture (norm, mlp, positions,\n"
        "                         kv_heads, bias)\n"
        "  --gpu-name NAME        the profile's GPU name (default: from the\n"
        "                         device, \"H200\", with \"-<N>SM\" under\n"
        "                         --sm-limit; \"cpu\" on the cpu backend)\n"
        "  --sm-limit N           use only N SMs (a CUDA green context)\n"
        "  --beside LIST          with --sm-limit: the SM counts of the other\n"
        "                         slices of the GPU, each kept busy with the\n"
        "                         same model's layers while this slice is\n"
        "                         measured, as the other ranks of a plan on\n"
        "                         slices of one GPU are (name: \"-beside-\"\n"
        "                         and the list added)\n"
        "  --place P              with --beside: the measured slice is slice\n"
        "                         P of the split (0, first, by default;\n"
        "                         --beside lists the others in order), as\n"
        "                         rank P of a plan on slices of one GPU is\n"
        "                         (name: \"-place-P\" added)\n"
        "  --idle-neighbours      with --beside: split the GPU so, but leave\n"
        "                         the other slices idle (name: \"-idle\")\n"
        "  --memory-limit-gib G   cap the stages' memory at G GiB\n"
        "  --tp LIST              tensor-parallel degrees (1,2,4,8); one that\n"
        "                         does not divide the heads (or the key/value\n"
        "                         heads) is skipped with a note\n"
        "  --mbs LIST             micro-batch sizes (1,2,4,8,16)\n"
        "  --backend NAME         cuda (default) or cpu (slow: tiny models)\n"
        "  --quick                fewer runs per point, one set of stages,\n"
        "                         one process, no device warm-up\n"
        "  --processes N          measure in N fresh processes, one after\n"
        "                         the other; an entry is the mean of theirs\n"
        "                         (default 8 on cuda, 1 on the cpu)\n"
        "  --stage-sets N         in each process, make and measure the\n"
        "                         stages N times, each time in fresh memory;\n"
        "                         its entry is the median of every set's\n"
        "                         rounds (default 1)\n"
        "  --embedding-sets N     the embedding's sets, N >= --stage-sets: its\n"
        "                         stage alone made again for the rest (its\n"
        "                         entries, microseconds, move the most;\n"
        "                         default 4)\n"
        "  --rounds N             timed rounds of each part per set of\n"
        "                         stages (default 3; the entry is their\n"
        "                         median)\n"
        "  --round-ms MS          calls queued in a round: enough for MS ms\n"
        "                         (default 5)\n"
        "  --layer-stack K        time the layer as the mean layer of a stage\n"
        "                         of K layers (their own parameters and\n"
        "                         activations): an entry is the stage's time\n"
        "                         per call over K, forward and backward; K is\n"
        "                         cut to the model's layers and halved where\n"
        "                         the stage does not fit (provenance.runs.\n"
        "                         layers_stacked says how many were); default\n"
        "                         1, one layer in a stage of its own (a stack\n"
        "                         is not yet checked against whole models)\n"
        "  --hold-ms MS           cuda: before the layer's and the head's\n"
        "                         rounds of each point, run that part's\n"
        "                         calls back to back for MS ms, untimed, so\n"
        "                         the rounds see the clock its sustained\n"
        "                         load holds (power cap); default 0, none\n"
        "  --no-comm              skip the NCCL curves\n"
        "  --timing HOW           cuda: how the layer's and the head's rounds\n"
        "                         are timed: gated (default: queued behind a\n"
        "                         gate, device clock), graph (CUDA graphs),\n"
        "                         host (queued, host clock, every part: the\n"
        "                         profiler before 2026-11-28), step (the\n"
        "                         layer and the head inside training steps\n"
        "                         of the whole chain replayed back to back,\n"
        "                         after --hold-ms of them, default 1 s), exec\n"
        "                         (inside the executor's own training steps\n"
        "                         of whole models of --layer-stack layers and\n"
        "                         of half as many, made beside a chain for\n"
        "                         each micro-batch, the layer their\n"
        "                         difference; the head what the shallower\n"
        "                         leaves beside its layers where its rounds\n"
        "                         agree within 5 %%, else as step times it)\n"
        "  --graph                --timing graph\n"
        "  --missing-only         complete the profile -o names: measure\n"
        "                         only the models' shapes and tp it lacks\n"
        "                         and add them (no curves); nothing to do\n"
        "                         when it holds them all\n"
        "  --host-rates           measure only the host's rates an\n"
        "                         offloaded optimizer is priced at (its\n"
        "                         CPU AdamW and the host link's copies of\n"
        "                         the first model's layer stage) and write\n"
        "                         them into the profile -o names: they are\n"
        "                         the host's, so measure them on the host\n"
        "                         that will train\n"
        "  -o, --output FILE      profile to write (default NAME.json)\n"
        "\n"
        "  --compare A B          print every entry of two profiles with its\n"
        "                         difference; exit 1 when one differs by more\n"
        "                         than --tolerance percent (default 3)\n"
        "\n"
        "Exit status: 0 written (or profiles agree), 1 measurement or write\n"
        "failed (or profiles differ), 2 bad arguments or files.\n");
}

enum {
    OPT_MODEL = 256, OPT_GPU_NAME, OPT_SM_LIMIT, OPT_MEMORY_LIMIT, OPT_TP,
    OPT_MBS, OPT_BACKEND, OPT_QUICK, OPT_NO_COMM, OPT_GRAPH, OPT_COMPARE, OPT_TOLERANCE,
    OPT_MISSING_ONLY, OPT_HOST_RATES, OPT_BESIDE, OPT_PLACE, OPT_IDLE_NEIGHBOURS,
    OPT_STAGE_SETS, OPT_EMBEDDING_SETS, OPT_PROCESSES, OPT_ROUNDS, OPT_ROUND_MS,
    OPT_TIMING, OPT_LAYER_STACK, OPT_HOLD_MS, OPT_HELP
};

int profile_bad_argument(const char *option, const char *expected,
                         const char *got)
{
    fprintf(stderr, "partita profile: %s: expected %s, got '%s'\n", option,
            expected, got);
    return -1;
}

static int parse_positive(const char *option, const char *text, double max,
                          double *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) ||
        value <= 0.0 || value > max) {
        char expected[64];
        snprintf(expected, sizeof expected, "a number above 0, at most %g",
                 max);
        return profile_bad_argument(option, expected, text);
    }
    *out = value;
    return 0;
}

static int apply_option(int option, const char *value, profile_arguments *a)
{
    double number = 0.0;
    switch (option) {
    case OPT_MODEL: a->model = value; return 0;
    case OPT_GPU_NAME: a->gpu_name = value; return 0;
    case 'o': a->output = value; return 0;
    case OPT_BACKEND: a->backend = value; return 0;
    case OPT_TP: a->tp_list = value; return 0;
    case OPT_MBS: a->mbs_list = value; return 0;
    case OPT_QUICK: a->quick = true; return 0;
    case OPT_NO_COMM: a->no_comm = true; return 0;
    case OPT_GRAPH: a->timing = "graph"; return 0;
    case OPT_TIMING: a->timing = value; return 0;
    case OPT_MISSING_ONLY: a->missing_only = true; return 0;
    case OPT_HOST_RATES: a->host_rates = true; return 0;
    case OPT_BESIDE: a->beside_list = value; return 0;
    case OPT_IDLE_NEIGHBOURS: a->neighbours_idle = true; return 0;
    case OPT_PLACE: {
        char *end = NULL;
        errno = 0;
        long place = strtol(value, &end, 10);
        if (errno != 0 || end == value || *end != '\0' || place < 0 ||
            place > 1024)
            return profile_bad_argument("--place", "a slice index, 0 to 1024",
                                        value);
        a->beside_place = (int)place;
        return 0;
    }
    case OPT_COMPARE: a->compare = true; return 0;
    case OPT_STAGE_SETS:
    case OPT_EMBEDDING_SETS:
    case OPT_PROCESSES:
    case OPT_LAYER_STACK:
    case OPT_ROUNDS: {
        const char *name = option == OPT_STAGE_SETS       ? "--stage-sets"
                           : option == OPT_EMBEDDING_SETS ? "--embedding-sets"
                           : option == OPT_PROCESSES      ? "--processes"
                           : option == OPT_LAYER_STACK    ? "--layer-stack"
                                                          : "--rounds";
        double most = option == OPT_PROCESSES      ? PROFILER_MAX_PROCESSES
                      : option == OPT_ROUNDS       ? PROFILER_MAX_RUNS
                      : option == OPT_LAYER_STACK  ? PROFILER_MAX_LAYER_STACK
                                                   : PROFILER_MAX_SETS;
        if (parse_positive(name, value, most, &number) != 0)
            return -1;
        if (number != floor(number))
            return profile_bad_argument(name, "a whole number", value);
        *(option == OPT_STAGE_SETS       ? &a->stage_sets
          : option == OPT_EMBEDDING_SETS ? &a->embedding_sets
          : option == OPT_PROCESSES      ? &a->processes
          : option == OPT_LAYER_STACK    ? &a->layer_stack
                                         : &a->rounds) = (int)number;
        return 0;
    }
    case OPT_ROUND_MS:
        return parse_positive("--round-ms", value, 1000.0, &a->round_ms);
    case OPT_HOLD_MS:
        /* 0 turns the hold off (parse_positive wants more than 0) */
        if (strcmp(value, "0") == 0) {
            a->hold_ms = 0.0;
            return 0;
        }
        return parse_positive("--hold-ms", value, PROFILER_MAX_HOLD_S * 1e3,
                              &a->hold_ms);
    case OPT_SM_LIMIT:
        if (parse_positive("--sm-limit", value, 100000, &number) != 0)
            return -1;
        if (number != floor(number))
            return profile_bad_argument("--sm-limit", "a whole number of SMs", value);
        a->sm_limit = (int)number;
        return 0;
    case OPT_MEMORY_LIMIT:
        return parse_positive("--memory-limit-gib", value, 1e6,
                              &a->memory_limit_gib);
    case OPT_TOLERANCE:
        return parse_positive("--tolerance", value, 1e6,
                              &a->tolerance_percent);
    default: return -1;
    }
}

/* 0 to go on, 1 when the help was printed, -1 on bad arguments (printed). */
static int parse_arguments(int argc, char **argv, profile_arguments *a)
{
    static const struct option options[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"gpu-name", required_argument, NULL, OPT_GPU_NAME},
        {"sm-limit", required_argument, NULL, OPT_SM_LIMIT},
        {"memory-limit-gib", required_argument, NULL, OPT_MEMORY_LIMIT},
        {"tp", required_argument, NULL, OPT_TP},
        {"mbs", required_argument, NULL, OPT_MBS},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"quick", no_argument, NULL, OPT_QUICK},
        {"no-comm", no_argument, NULL, OPT_NO_COMM},
        {"graph", no_argument, NULL, OPT_GRAPH},
        {"missing-only", no_argument, NULL, OPT_MISSING_ONLY},
        {"host-rates", no_argument, NULL, OPT_HOST_RATES},
        {"beside", required_argument, NULL, OPT_BESIDE},
        {"place", required_argument, NULL, OPT_PLACE},
        {"stage-sets", required_argument, NULL, OPT_STAGE_SETS},
        {"embedding-sets", required_argument, NULL, OPT_EMBEDDING_SETS},
        {"processes", required_argument, NULL, OPT_PROCESSES},
        {"rounds", required_argument, NULL, OPT_ROUNDS},
        {"round-ms", required_argument, NULL, OPT_ROUND_MS},
        {"layer-stack", required_argument, NULL, OPT_LAYER_STACK},
        {"hold-ms", required_argument, NULL, OPT_HOLD_MS},
        {"timing", required_argument, NULL, OPT_TIMING},
        {"idle-neighbours", no_argument, NULL, OPT_IDLE_NEIGHBOURS},
        {"compare", no_argument, NULL, OPT_COMPARE},
        {"tolerance", required_argument, NULL, OPT_TOLERANCE},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    *a = (profile_arguments){.backend = "cuda", .tp_list = "1,2,4,8",
                             .mbs_list = "1,2,4,8,16",
                             .tolerance_percent = 3.0, .hold_ms = -1.0};
    optind = 1;
    int option;
    while ((option = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        if (option == OPT_HELP || option == 'h') {
            print_profile_help();
            return 1;
        }
        if (option == '?' || apply_option(option, optarg, a) != 0)
            return -1;
    }
    if (a->compare) {
        if (argc - optind != 2) {
            fprintf(stderr, "partita profile: --compare takes two profile "
                            "files\n");
            return -1;
        }
        a->compare_files[0] = argv[optind];
        a->compare_files[1] = argv[optind + 1];
        return 0;
    }
    if (optind < argc) {
        fprintf(stderr, "partita profile: unexpected argument '%s'\n",
                argv[optind]);
        return -1;
    }
    if (a->model == NULL) {
        fprintf(stderr, "partita profile: --model is required (see "
                        "'partita profile --help')\n");
        return -1;
    }
    if (a->beside_list != NULL && a->sm_limit == 0) {
        fprintf(stderr, "partita profile: --beside needs --sm-limit (the "
                        "measured slice)\n");
        return -1;
    }
    if ((a->beside_place > 0 || a->neighbours_idle) &&
        a->beside_list == NULL) {
        fprintf(stderr, "partita profile: --place and --idle-neighbours need "
                        "--beside (the other slices of the split)\n");
        return -1;
    }
    if (a->host_rates && a->output == NULL) {
        fprintf(stderr, "partita profile: --host-rates writes into a "
                        "profile: name it with -o\n");
        return -1;
    }
    if (a->host_rates && (a->missing_only || a->beside_list != NULL)) {
        fprintf(stderr, "partita profile: --host-rates measures the host "
                        "alone: not with --missing-only or --beside\n");
        return -1;
    }
    if (a->missing_only && a->output == NULL) {
        fprintf(stderr, "partita profile: --missing-only completes a "
                        "profile: name it with -o\n");
        return -1;
    }
    return 0;
}

int profile_run_unless_measuring(int argc, char **argv, profile_arguments *a)
{
    int parsed = parse_arguments(argc, argv, a);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (a->compare)
        return profile_compare(a->compare_files[0], a->compare_files[1],
                               a->tolerance_percent);
    return PROFILE_MEASURE;
}
