/*
 * partita: plans and runs the training of GPT-style transformers on
 * clusters that mix GPU types. This file only dispatches subcommands;
 * exec (and profile when it measures) run in partita-exec, which this
 * executable becomes (cli/hand_over.c), so that the others never load
 * the GPU stack.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"plan", command_plan,
     "search every plan for a cluster and model, write plan.json"},
    {"estimate", command_estimate,
     "estimate a given (even hand-written) plan: step time, memory"},
    {"prep", command_prep,
     "turn text or JSON lines into a Megatron .bin/.idx dataset"},
    {"exec", cli_hand_over, "train under a plan, write run.json"},
    {"report", command_report, "estimated vs measured: tables, charts, trace"},
    {"export", command_export,
     "write a plan as a Megatron-LM launch or a DeepSpeed ds_config"},
    {"profile", command_profile,
     "measure this GPU's per-layer and communication costs (or --derive)"},
};

static void print_usage(FILE *out)
{
    fprintf(out,
            "usage: partita <command> [options]\n"
            "\n"
            "Plans and runs the training of GPT-style and Llama-family\n"
            "transformers on clusters that mix GPU types.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(out, "  %-10s %s\n", subcommands[i].name,
                subcommands[i].summary);
    fprintf(out,
            "\n"
            "exec runs every plan partita writes on the cpu backend\n"
            "(threads) and on the GPUs of one machine (cuda: one thread\n"
            "per GPU over NCCL, or one process per rank under mpirun);\n"
            "see docs/executor.md.\n"
            "'partita <command> --help' describes a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return EXIT_BAD_INPUT;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 ||
        strcmp(name, "help") == 0) {
        print_usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("partita %s\n", PARTITA_VERSION);
        return EXIT_OK;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(name, subcommands[i].name) == 0)
            return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "partita: unknown command '%s'\n\n", name);
    print_usage(stderr);
    return EXIT_BAD_INPUT;
}
