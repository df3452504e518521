/*
 * The command-line layer: the only code that prints and exits. Each
 * subcommand is a function taking argc/argv (argv[0] is the subcommand)
 * and returning the process exit status. Two executables share it:
 * `partita` (main.c: plan, estimate, prep, report, profile --derive and
 * --compare), which never loads the GPU stack, and partita-exec
 * (exec_main.c: exec and the measuring profile), to which partita hands
 * those commands (hand_over.c).
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
/* `partita exec` (cmd_exec.c, in partita-exec). */
int command_exec(int argc, char **argv);
int command_report(int argc, char **argv);
/* `partita export` (cmd_export.c): a plan as a Megatron-LM launch or a
 * DeepSpeed ds_config. */
int command_export(int argc, char **argv);
/* `partita profile` as partita runs it (cmd_profile.c): --derive to
 * cmd_profile_derive, --compare to profile_compare, a measurement handed
 * to partita-exec. */
int command_profile(int argc, char **argv);
/* `partita profile` in partita-exec (profile_measure.c): measures and
 * writes the profile. */
int command_profile_measure(int argc, char **argv);
/* Prints every entry of two profiles with the difference of B against A
 * in percent; EXIT_OK when all are within tolerance_percent and present
 * in both, EXIT_FAILURE_RUN when not, EXIT_BAD_INPUT when a file does
 * not load (cli/profile_compare.c). */
int profile_compare(const char *path_a, const char *path_b,
                    double tolerance_percent);
/* The layers a measured profile's layer entries were asked to be the
 * mean of (provenance.runs.layer_stack): 1 when it does not say (one
 * layer in a stage of its own, as before the option). */
int profile_layer_stack(const profile *p);
/* `partita profile --derive GPU --from ...` (cli/cmd_derive.c): the
 * measuring `partita profile` hands its whole argv here when --derive is
 * given; argv[0] names the command in messages. */
int cmd_profile_derive(int argc, char **argv);
/* `partita estimate --runs TABLE` and `partita profile --from-logs
 * TABLE` (cli/cmd_runs.c): a table of measured training runs estimated,
 * or a derived profile calibrated on it. */
int cmd_estimate_runs(int argc, char **argv);
int cmd_profile_from_logs(int argc, char **argv);
/* partita profile --fit-roofline (cli/cmd_fit_roofline.c): a measured
 * profile's roofline fitted on its own times. */
int cmd_profile_fit_roofline(int argc, char **argv);

/* The arguments of `partita profile` (profile_args.c), parsed by both
 * executables. Strings point into argv. */
typedef struct profile_arguments {
    const char *model;          /* --model: names or files, comma-separated */
    const char *gpu_name;       /* --gpu-name, NULL: from the device */
    const char *output;         /* -o, NULL: <gpu>.json */
    const char *backend;        /* --backend: "cuda" or "cpu" */
    int sm_limit;               /* --sm-limit, 0: every SM */
    int stage_sets;             /* --stage-sets, 0: the default (1) */
    int embedding_sets;         /* --embedding-sets, 0: the default (4,
                                   or --stage-sets' when more) */
    int processes;              /* --processes, 0: the default (8 on
                                   cuda, 1 on the cpu and --quick) */
    int rounds;                 /* --rounds, 0: the default (3) */
    int layer_stack;            /* --layer-stack, 0: the default (1) */
    double round_ms;            /* --round-ms, 0: the default (5) */
    double hold_ms;             /* --hold-ms, < 0: the default (0) */
    const char *beside_list;    /* --beside: SMs of the busy neighbour
                                   slices, NULL: none */
    int beside_place;           /* --place: the measured slice's place in
                                   the split, 0: first */
    bool neighbours_idle;       /* --idle-neighbours: split, not busy */
    double memory_limit_gib;    /* --memory-limit-gib, 0: the device's */
    const char *tp_list;        /* --tp, "1,2,4,8" */
    const char *mbs_list;       /* --mbs, "1,2,4,8,16" */
    bool quick;
    bool no_comm;
    const char *timing;         /* --timing gated|graph|host, NULL:
                                   gated; --graph is --timing graph */
    bool missing_only;          /* --missing-only: complete -o's profile */
    bool host_rates;            /* --host-rates: measure -o's host rates */
    bool compare;               /* --compare: compare_files, no measuring */
    double tolerance_percent;   /* --tolerance of --compare */
    const char *compare_files[2];
} profile_arguments;
/* Parses the arguments of `partita profile` into a and does what needs
 * no device: prints the help, refuses bad arguments, runs --compare; the
 * exit status of that, or PROFILE_MEASURE when a measurement is asked. */
enum { PROFILE_MEASURE = -1 };
int profile_run_unless_measuring(int argc, char **argv, profile_arguments *a);
/* Prints "partita profile: OPTION: expected EXPECTED, got 'GOT'"; -1. */
int profile_bad_argument(const char *option, const char *expected,
                         const char *got);

/* Runs the command in partita-exec in this process's place (execv, with
 * this process's argv[0]): its exit status is the command's. Returns only when partita-exec cannot be
 * found or started (printed, EXIT_FAILURE_RUN). argv[0] is the command. */
int cli_hand_over(int argc, char **argv);

/* partita plan's constraints (cli/plan_constraints.c). --tp, --pp, --dp
 * or --mbs's value ("8", "2,4") into out: -1 after printing why not. */
int plan_parse_degree(const char *option, const char *value,
                      degree_choice *out);
/* --nodes TYPE:COUNT,... on pool: out is the pool with those counts (its
 * types in order, those not named with none), freed by cluster_free; -1
 * with a message beginning "--nodes: " when a type is not the pool's, a
 * count is more than it has, or no node is left. */
int plan_restrict_nodes(const cluster *pool, const char *spec,
                        cluster *out, pt_error *err);
/* A plan found on part of the pool (type_counts[t] nodes of each type,
 * numbered as that part numbers them) renumbered to the pool's nodes:
 * the part's node of a type and ordinal is the pool's. */
void plan_map_to_pool(const cluster *pool, const int *type_counts,
                      ranked_plan *plan);
/* Prints "partita <command>: <message>" on stderr. */
void cli_error(const char *command, const char *message);
/* What a provenance records of the command that wrote a file: "partita"
 * and the arguments, in `out` (cut to its size) with the UTC date
 * (YYYY-MM-DD) in `date` (at least 11 bytes). */
void cli_command_and_date(int argc, char **argv, char *out, size_t size,
                          char *date, size_t date_size);
/* "partita COMMAND: FILE: MESSAGE", naming FILE once: not again when the
 * message begins with it already (a reader's message does). */
void cli_error_in(const char *command, const char *file,
                  const char *message);

/* `-o -` puts a command's file on standard output: from here on the text
 * the command prints goes to standard error, so the file stays clean for
 * a pipe. */
void cli_text_to_stderr(void);
/* The output as messages name it: "standard output" for "-". */
const char *cli_output_name(const char *path);
/* Checks an output file (or, folder true, a folder made when missing)
 * before any work (pt_check_output_file / _folder): prints the reason
 * and returns -1 when it cannot be written. */
int cli_check_output(const char *command, const char *path, bool folder);
/* "1,2,4" into values (at most capacity of them, each 1..max_value);
 * -1 after printing "partita COMMAND: OPTION: expected ..." on anything
 * else. */
int cli_parse_int_list(const char *command, const char *option,
                       const char *text, int max_value, int *values,
                       int capacity, int *count);
/* Before any work: refuses (one line, as cli_error) an output that is
 * the same file as an input, which writing it would replace; role says
 * what the input is ("plan", "model"). 0 when it is not. */
int cli_check_not_input(const char *command, const char *output,
                        const char *input, const char *role);
/* The same against a loaded plan's file and the model and cluster files
 * it names (older plans refer to them by path). */
int cli_check_not_plan_input(const char *command, const char *output,
                             const char *plan_path, const plan *p);
/* Writes root (taken: its reference is dropped) to path with the one
 * writer; root NULL means building it failed, with err saying why. Prints
 * the reason and returns -1 on failure. */
int cli_write_json(const char *command, json_t *root, const char *path,
                   pt_error *err);

/* Finds a model or cluster given as a path or as a bundled name
 * ("gpt2-xl" -> models/gpt2-xl.json). kind is "models" or "clusters". */
int cli_locate(const char *kind, const char *name_or_path, char *out,
               size_t out_size, pt_error *err);

/* Tables shared by plan and estimate. */
void print_notes(const costmodel *cm);
/* A note when a stage's tp does not split the model as exec needs (the
 * cost model prices it as FASOP prices GPT-2 XL's 25 heads). */
void print_tp_split_note(const plan *p);
/* "# not measured: ..." for every entry of est->pricing that was not
 * measured, one line each, then how many were. */
void print_pricing(const estimate *est);
void print_stage_table(const plan *p, const estimate *est);
/* Each stage's memory terms, GiB. */
void print_memory_table(const estimate *est);
void print_estimate_summary(const plan *p, const estimate *est);
/* "# model llama3-8b: 8030261248 parameters (8.03 billion), rmsnorm,
 * ...": the model's size and layer, for plan and estimate. */
void print_model_line(const model_shape *m);
/* "a100 a10x7": runs of identical node types in pipeline order. */
void format_node_order(const cluster *c, const int *order, int count,
                       char *out, size_t size);
/* A stage that does not fit: "stage 3 (A10-FASOP) needs 25.1 GiB, has
 * 22.2 GiB: 2.9 GiB over". */
void format_memory_miss(const estimate *est, char *out, size_t size);

#endif
