/*
 * The command-line layer: the only code that prints and exits. Each
 * subcommand is a function taking argc/argv (argv[0] is the subcommand)
 * and returning the process exit status.
 */
#ifndef PARTITA_CLI_H
#define PARTITA_CLI_H

#include "common/common.h"
#include "costmodel/costmodel.h"
#include "planner/planner.h"

/* Exit statuses: 0 success, 1 failure of the machine (I/O, memory),
 * 2 bad input (arguments, files, plans that cannot work). */
enum { EXIT_OK = 0, EXIT_FAILURE_RUN = 1, EXIT_BAD_INPUT = 2 };

int command_plan(int argc, char **argv);
int command_estimate(int argc, char **argv);
int command_prep(int argc, char **argv);
int command_exec(int argc, char **argv);
int command_report(int argc, char **argv);
/* `partita profile` (cli/cmd_profile.c): measures a profile; hands
 * --derive to cmd_profile_derive and --compare to profile_compare. */
int command_profile(int argc, char **argv);
/* Prints every entry of two profiles with the difference of B against A
 * in percent; EXIT_OK when all are within tolerance_percent and present
 * in both, EXIT_FAILURE_RUN when not, EXIT_BAD_INPUT when a file does
 * not load (cli/profile_compare.c). */
int profile_compare(const char *path_a, const char *path_b,
                    double tolerance_percent);
/* `partita profile --derive GPU --from ...` (cli/cmd_derive.c): the
 * measuring `partita profile` hands its whole argv here when --derive is
 * given; argv[0] names the command in messages. */
int cmd_profile_derive(int argc, char **argv);

/* Prints "partita <command>: <message>" on stderr. */
void cli_error(const char *command, const char *message);

/* Finds a model or cluster given as a path or as a bundled name
 * ("gpt2-xl" -> models/gpt2-xl.json). kind is "models" or "clusters". */
int cli_locate(const char *kind, const char *name_or_path, char *out,
               size_t out_size, pt_error *err);

/* Tables shared by plan and estimate. */
void print_notes(const costmodel *cm);
void print_stage_table(const plan *p, const estimate *est);
void print_estimate_summary(const plan *p, const estimate *est);
/* "a100 a10x7": runs of identical node types in pipeline order. */
void format_node_order(const cluster *c, const int *order, int count,
                       char *out, size_t size);
/* A stage that does not fit: "stage 3 (A10-FASOP) needs 25.1 GiB, has
 * 22.2 GiB: 2.9 GiB over". */
void format_memory_miss(const estimate *est, char *out, size_t size);

#endif
