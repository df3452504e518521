/* partita prep: text or JSON lines -> Megatron .bin/.idx token files. */
#include "cli/cli.h"
#include "executor/data/data.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void print_prep_help(void)
{
    printf(
        "usage: partita prep INPUT -o PREFIX [--jsonl]\n"
        "\n"
        "Turns a text file (documents separated by blank lines) or a JSON-\n"
        "lines file (one object with a \"text\" field per line) into the\n"
        "Megatron indexed dataset PREFIX.bin / PREFIX.idx, with a byte-level\n"
        "tokenizer: token = byte value, end-of-document token %d appended to\n"
        "each document, vocabulary %d, dtype uint16. Both files are written\n"
        "atomically; on any error nothing is left behind.\n"
        "\n"
        "  -o, --output PREFIX   output prefix (PREFIX.bin, PREFIX.idx)\n"
        "  --jsonl               read JSON lines instead of plain text\n",
        PREP_EOD_TOKEN, PREP_VOCAB_SIZE);
}

int command_prep(int argc, char **argv)
{
    enum { OPT_JSONL = 256, OPT_HELP };
    static const struct option options[] = {
        {"output", required_argument, NULL, 'o'},
        {"jsonl", no_argument, NULL, OPT_JSONL},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    const char *output = NULL;
    prep_format format = PREP_FORMAT_TEXT;
    optind = 1;
    int option;
    while ((option = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        switch (option) {
        case 'o': output = optarg; break;
        case OPT_JSONL: format = PREP_FORMAT_JSONL; break;
        case OPT_HELP:
        case 'h': print_prep_help(); return EXIT_OK;
        default: return EXIT_BAD_INPUT;
        }
    }
    if (optind + 1 != argc || output == NULL) {
        fprintf(stderr, "partita prep: expected INPUT and -o PREFIX "
                        "(see 'partita prep --help')\n");
        return EXIT_BAD_INPUT;
    }
    pt_error err = {{0}};
    prep_stats stats;
    if (prep_run(argv[optind], format, output, &stats, &err) != 0) {
        cli_error("prep", err.message);
        return EXIT_BAD_INPUT;
    }
    char bin_size[32], idx_size[32];
    pt_format_bytes((double)stats.bin_bytes, bin_size, sizeof bin_size);
    pt_format_bytes((double)stats.idx_bytes, idx_size, sizeof idx_size);
    printf("prep: %s -> %s.bin (%s), %s.idx (%s)\n", argv[optind], output,
           bin_size, output, idx_size);
    printf("prep: %" PRIu64 " documents, %" PRIu64 " tokens "
           "(end-of-document tokens included), %" PRIu64 " text bytes\n",
           stats.documents, stats.tokens, stats.text_bytes);
    return EXIT_OK;
}
