/* partita plan: search every plan, print the ranking, write plan.json. */
#include "cli/cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct plan_arguments {
    const char *cluster;
    const char *model;
    const char *profiles;
    const char *output;
    const char *nodes;         /* --nodes TYPE:COUNT,...: part of the cluster */
    char constrained[256];     /* the degree options as given, for messages */
    bool pareto;
    bool asymmetric;           /* --asymmetric: stages of their own tp, dp */
    bool quiet;
    unsigned timeline;         /* ESTIMATE_JSON_* flags */
    search_options search;
} plan_arguments;

static void print_plan_help(void)
{
    printf(
        "usage: partita plan --model M --gbs N [options]\n"
        "\n"
        "Searches every (tp, dp, pp, micro-batch, node order) of a cluster,\n"
        "solves the layer partition of each exactly, prints the ranking and\n"
        "writes the best plan with its estimated timeline.\n"
        "\n"
        "  --model M          model file or bundled name (gpt2-xl, bert-large...)\n"
        "  --cluster C        cluster file or bundled name (default: hetero)\n"
        "  --gbs N            global batch size in sequences\n"
        "  --objective O      time (default) or cost ($ per step)\n"
        "  --pareto           front of step time vs $ over every sub-cluster\n"
        "  --asymmetric       also plans whose stages run their own tp and\n"
        "                     dp that score below the symmetric best,\n"
        "                     ranked with the symmetric ones (exact,\n"
        "                     branch and bound, --max-tree-nodes as below;\n"
        "                     no memory levers, no degree options;\n"
        "                     docs/planner.md)\n"
        "  --tp LIST          fix or limit tp: a value or a list (--tp 8,\n"
        "                     --tp 2,4), each a power of two; likewise\n"
        "  --pp LIST, --dp LIST  pp and dp, and\n"
        "  --mbs LIST         the micro-batch sizes (instead of the powers of\n"
        "                     two up to --max-mbs)\n"
        "  --nodes T:N,...    plan on part of the cluster: N nodes of node\n"
        "                     type T (--nodes a100:4,a10:8; types not named\n"
        "                     are left out); with --pareto, the pool\n"
        "  --solver S         dp (default, exact), ilp (GLPK, exact) or\n"
        "                     greedy (FASOP's min-max heuristic)\n"
        "  --schedule S       1f1b (default) or gpipe\n"
        "  --precision P      bf16 (default), fp16 or fp32\n"
        "  --grad-precision G fp32 (default: Megatron-LM's recipe, fp32 main\n"
        "                     gradients) or bf16 (llm.c's; precision bf16)\n"
        "  --deterministic    plans that give the same bits on every run\n"
        "                     (Megatron-LM's --deterministic-mode): cuDNN's\n"
        "                     deterministic attention backward, its larger\n"
        "                     workspace priced\n"
        "  --max-mbs N        largest micro-batch tried (default 16)\n"
        "  --no-recompute     never use full activation recompute\n"
        "  --no-distributed-optimizer  never shard over dp (no ZeRO at all)\n"
        "  --zero-levers W    when to try ZeRO-2, ZeRO-3 and optimizer\n"
        "                     offload: when-needed (default: only if no plan\n"
        "                     fits without them), always, or never\n"
        "  --max-zero N       highest ZeRO stage tried, 1..3 (default 3)\n"
        "  --no-offload       never offload the optimizer to the host\n"
        "  --no-sequence-parallel  never use sequence parallelism (tp > 1)\n"
        "  --no-interleave    never use the interleaved 1F1B (virtual stages)\n"
        "  --top K            plans shown and kept as alternatives (default 10)\n"
        "  --search S         bb (default): branch and bound, exact, cuts what\n"
        "                     cannot make the shortlist; exhaustive: visit\n"
        "                     every distinct node order (same plans, slower)\n"
        "  --max-tree-nodes N stop the search after about N tree nodes and say\n"
        "                     how far from exact its best plan may be\n"
        "                     (default 40000000, about 10 s; 0: never stop;\n"
        "                     --asymmetric's tree counts a partial plan as\n"
        "                     200 tree nodes)\n"
        "  --threads N        search threads (default: one per core, and at\n"
        "                     most that); the plans and counts do not depend\n"
        "                     on it\n"
        "  --profiles DIR     look for profiles/<gpu>.json here first\n"
        "  -o, --output FILE  plan file to write (default plan.json; - for\n"
        "                     standard output, the tables then on stderr)\n"
        "  --per-rank-timeline  write the estimated timeline once per rank\n"
        "                     (default: once per stage, which every rank of\n"
        "                     the stage runs; per rank is tp x dp times larger)\n"
        "  --full-timeline    write every event of the timeline (default: each\n"
        "                     kind's first and last 8 with a count of those\n"
        "                     between, so the file does not grow with gbs)\n"
        "  --quiet            no progress lines (a search longer than a few\n"
        "                     seconds prints one on stderr every few seconds)\n");
}

static int parse_choice(const char *value, const char *const *names,
                        int count, const char *option, int *out)
{
    for (int i = 0; i < count; i++)
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "partita plan: %s: unknown value '%s'\n", option, value);
    return -1;
}

static int parse_positive(const char *value, const char *option, int *out)
{
    char *end = NULL;
    long number = strtol(value, &end, 10);
    if (end == value || *end != '\0' || number <= 0 || number > 1 << 24) {
        fprintf(stderr, "partita plan: %s: expected a positive integer, "
                        "got '%s'\n", option, value);
        return -1;
    }
    *out = (int)number;
    return 0;
}

static int parse_count(const char *value, const char *option, long long *out)
{
    char *end = NULL;
    long long number = strtoll(value, &end, 10);
    if (end == value || *end != '\0' || number < 0) {
        fprintf(stderr, "partita plan: %s: expected a count >= 0, got '%s'\n",
                option, value);
        return -1;
    }
    *out = number;
    return 0;
}

/* More threads than cores only adds memory (a cost model per thread) and
 * switching: the search uses one per core at most, and says so. */
static void cap_threads(int *threads)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1 || *threads <= cores)
        return;
    fprintf(stderr, "partita plan: --threads %d is more than the %ld cores "
                    "here: using %ld\n",
            *threads, cores, cores);
    *threads = (int)cores;
}

enum { OPT_MODEL = 256, OPT_CLUSTER, OPT_GBS, OPT_OBJECTIVE, OPT_PARETO,
       OPT_SOLVER, OPT_SCHEDULE, OPT_PRECISION, OPT_GRAD_PRECISION,
       OPT_MAX_MBS,
       OPT_NO_RECOMPUTE, OPT_NO_ZERO, OPT_NO_SP, OPT_NO_INTERLEAVE, OPT_TOP, OPT_THREADS, OPT_PROFILES,
       OPT_QUIET, OPT_SEARCH, OPT_MAX_TREE_NODES, OPT_PER_RANK_TIMELINE,
       OPT_FULL_TIMELINE, OPT_TP, OPT_PP, OPT_DP, OPT_MBS, OPT_NODES,
       OPT_MAX_ZERO, OPT_NO_OFFLOAD, OPT_ZERO_LEVERS, OPT_ASYMMETRIC,
       OPT_DETERMINISTIC, OPT_HELP };
static const struct option plan_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"cluster", required_argument, NULL, OPT_CLUSTER},
    {"gbs", required_argument, NULL, OPT_GBS},
    {"objective", required_argument, NULL, OPT_OBJECTIVE},
    {"pareto", no_argument, NULL, OPT_PARETO},
    {"asymmetric", no_argument, NULL, OPT_ASYMMETRIC},
    {"solver", required_argument, NULL, OPT_SOLVER},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"precision", required_argument, NULL, OPT_PRECISION},
    {"grad-precision", required_argument, NULL, OPT_GRAD_PRECISION},
    {"deterministic", no_argument, NULL, OPT_DETERMINISTIC},
    {"max-mbs", required_argument, NULL, OPT_MAX_MBS},
    {"no-recompute", no_argument, NULL, OPT_NO_RECOMPUTE},
    {"no-distributed-optimizer", no_argument, NULL, OPT_NO_ZERO},
    {"max-zero", required_argument, NULL, OPT_MAX_ZERO},
    {"no-offload", no_argument, NULL, OPT_NO_OFFLOAD},
    {"zero-levers", required_argument, NULL, OPT_ZERO_LEVERS},
    {"no-sequence-parallel", no_argument, NULL, OPT_NO_SP},
    {"no-interleave", no_argument, NULL, OPT_NO_INTERLEAVE},
    {"top", required_argument, NULL, OPT_TOP},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"profiles", required_argument, NULL, OPT_PROFILES},
    {"output", required_argument, NULL, 'o'},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"search", required_argument, NULL, OPT_SEARCH},
    {"max-tree-nodes", required_argument, NULL, OPT_MAX_TREE_NODES},
    {"per-rank-timeline", no_argument, NULL, OPT_PER_RANK_TIMELINE},
    {"full-timeline", no_argument, NULL, OPT_FULL_TIMELINE},
    {"tp", required_argument, NULL, OPT_TP},
    {"pp", required_argument, NULL, OPT_PP},
    {"dp", required_argument, NULL, OPT_DP},
    {"mbs", required_argument, NULL, OPT_MBS},
    {"nodes", required_argument, NULL, OPT_NODES},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0}};

/* The options that choose a name from a list. */
static int apply_choice_option(int option, const char *value,
                               search_options *search)
{
    static const char *const objectives[] = {"time", "cost"};
    static const char *const solvers[] = {"dp", "ilp", "greedy"};
    static const char *const schedules[] = {"1f1b", "gpipe"};
    static const char *const precisions[] = {"bf16", "fp16", "fp32"};
    static const char *const grad_precisions[] = {"fp32", "bf16"};
    static const char *const searches[] = {"bb", "exhaustive"};
    static const char *const lever_policies[] = {"when-needed", "always",
                                                 "never"}; /* enum order */
    int choice = 0, status = 0;
    switch (option) {
    case OPT_OBJECTIVE:
        status = parse_choice(value, objectives, 2, "--objective", &choice);
        search->objective = (plan_objective)choice;
        break;
    case OPT_SOLVER:
        status = parse_choice(value, solvers, 3, "--solver", &choice);
        search->solver = (partition_solver)choice;
        break;
    case OPT_SCHEDULE:
        status = parse_choice(value, schedules, 2, "--schedule", &choice);
        search->schedule = (schedule_kind)choice;
        break;
    case OPT_PRECISION:
        status = parse_choice(value, precisions, 3, "--precision", &choice);
        search->precision = (precision_kind)choice;
        break;
    case OPT_GRAD_PRECISION:
        status = parse_choice(value, grad_precisions, 2, "--grad-precision",
                              &choice);
        search->grad_precision = (grad_precision_kind)choice;
        break;
    case OPT_ZERO_LEVERS:
        status = parse_choice(value, lever_policies, 3, "--zero-levers",
                              &choice);
        search->zero_levers = (zero_levers)choice;
        break;
    default: /* OPT_SEARCH */
        status = parse_choice(value, searches, 2, "--search", &choice);
        search->exhaustive = choice == 1;
        break;
    }
    return status;
}

/* --tp, --pp, --dp or --mbs: the degree's choice, and the option as
 * given kept for messages. */
static int apply_degree_option(int option, const char *value,
                               plan_arguments *args)
{
    search_constraints *constraints = &args->search.constraints;
    const char *name = option == OPT_TP   ? "--tp"
                       : option == OPT_PP ? "--pp"
                       : option == OPT_DP ? "--dp"
                                          : "--mbs";
    degree_choice *choice = option == OPT_TP   ? &constraints->tp
                            : option == OPT_PP ? &constraints->pp
                            : option == OPT_DP ? &constraints->dp
                                               : &constraints->mbs;
    if (plan_parse_degree(name, value, choice) != 0)
        return -1;
    size_t used = strlen(args->constrained);
    snprintf(args->constrained + used, sizeof args->constrained - used,
             "%s%s %s", used > 0 ? " " : "", name, value);
    return 0;
}

/* One option of the command line: 0, or -1 on a bad value. */
static int apply_plan_option(int option, const char *value,
                             plan_arguments *args)
{
    search_options *search = &args->search;
    switch (option) {
    case OPT_MODEL: args->model = value; return 0;
    case OPT_CLUSTER: args->cluster = value; return 0;
    case OPT_GBS: return parse_positive(value, "--gbs", &search->gbs);
    case OPT_OBJECTIVE:
    case OPT_SOLVER:
    case OPT_SCHEDULE:
    case OPT_PRECISION:
    case OPT_GRAD_PRECISION:
    case OPT_ZERO_LEVERS:
    case OPT_SEARCH: return apply_choice_option(option, value, search);
    case OPT_PARETO: args->pareto = true; return 0;
    case OPT_ASYMMETRIC: args->asymmetric = true; return 0;
    case OPT_TP:
    case OPT_PP:
    case OPT_DP:
    case OPT_MBS: return apply_degree_option(option, value, args);
    case OPT_NODES: args->nodes = value; return 0;
    case OPT_MAX_MBS:
        return parse_positive(value, "--max-mbs", &search->max_mbs);
    case OPT_NO_RECOMPUTE: search->allow_recompute = false; return 0;
    case OPT_DETERMINISTIC: search->deterministic = true; return 0;
    case OPT_NO_ZERO: search->allow_distributed_optimizer = false; return 0;
    case OPT_NO_OFFLOAD: search->allow_offload = false; return 0;
    case OPT_MAX_ZERO:
        if (parse_positive(value, "--max-zero", &search->max_zero_stage) != 0)
            return -1;
        if (search->max_zero_stage > 3) {
            fprintf(stderr, "partita plan: --max-zero must be 1, 2 or 3, "
                            "got %s\n", value);
            return -1;
        }
        return 0;
    case OPT_NO_SP: search->allow_sequence_parallel = false; return 0;
    case OPT_NO_INTERLEAVE: search->allow_interleave = false; return 0;
    case OPT_TOP: return parse_positive(value, "--top", &search->keep);
    case OPT_THREADS:
        return parse_positive(value, "--threads", &search->threads);
    case OPT_PROFILES: args->profiles = value; return 0;
    case 'o': args->output = value; return 0;
    case OPT_QUIET: args->quiet = true; return 0;
    case OPT_MAX_TREE_NODES:
        return parse_count(value, "--max-tree-nodes",
                           &search->max_tree_nodes);
    case OPT_PER_RANK_TIMELINE:
        args->timeline |= ESTIMATE_JSON_PER_RANK;
        return 0;
    case OPT_FULL_TIMELINE:
        args->timeline |= ESTIMATE_JSON_FULL_TIMELINE;
        return 0;
    default: return -1;
    }
}

/* Returns 0 to go on, 1 when help was printed, -1 on a bad argument. */
static int parse_plan_arguments(int argc, char **argv, plan_arguments *args)
{
    optind = 1;
    opterr = 1;
    int option;
    while ((option = getopt_long(argc, argv, "o:h", plan_options, NULL)) !=
           -1) {
        if (option == OPT_HELP || option == 'h') {
            print_plan_help();
            return 1;
        }
        if (apply_plan_option(option, optarg, args) != 0)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "partita plan: unexpected argument '%s'\n",
                argv[optind]);
        return -1;
    }
    if (args->model == NULL || args->search.gbs == 0) {
        fprintf(stderr, "partita plan: --model and --gbs are required "
                        "(see 'partita plan --help')\n");
        return -1;
    }
    if (args->search.grad_precision == GRAD_PRECISION_BF16 &&
        args->search.precision != PRECISION_BF16) {
        fprintf(stderr, "partita plan: --grad-precision bf16 only with "
                        "--precision bf16 (got %s)\n",
                precision_name(args->search.precision));
        return -1;
    }
    if (args->asymmetric && (args->pareto || args->constrained[0])) {
        fprintf(stderr, "partita plan: --asymmetric: not with %s yet (the "
                        "asymmetric search takes neither)\n",
                args->pareto ? "--pareto" : args->constrained);
        return -1;
    }
    cap_threads(&args->search.threads);
    return 0;
}

/* Progress of a long search: a line on stderr every few seconds, on a
 * terminal or in a batch job's log alike. */
typedef struct progress_state {
    double started, last_line;
    const char *unit;          /* what done / total count */
} progress_state;

#define PROGRESS_EVERY_S 3.0

static void show_progress(void *context, long long done, long long total,
                          long long scored)
{
    progress_state *state = context;
    double now = pt_monotonic_seconds();
    if (total <= 0 || now - state->last_line < PROGRESS_EVERY_S)
        return;
    state->last_line = now;
    char took[32];
    pt_format_seconds(now - state->started, took, sizeof took);
    fprintf(stderr, "# searching: %lld / %lld %s (%.0f %%), %lld placements "
                    "scored, %s\n",
            done, total, state->unit, 100.0 * (double)done / (double)total,
            scored, took);
    fflush(stderr);
}

/* Widths of the node-order and partition columns: the longest entry. */
typedef struct ranking_widths {
    int order;
    int partition;
} ranking_widths;

static ranking_widths ranking_column_widths(const cluster *c,
                                            const ranked_plan *plans,
                                            int count)
{
    ranking_widths widths = {10, 9};
    for (int i = 0; i < count; i++) {
        char order[256], partition[PT_MAX_STAGES * 6];
        format_node_order(c, plans[i].node_order, plans[i].node_count, order,
                          sizeof order);
        partition_format(plans[i].partition, plans[i].config.pp, partition,
                         sizeof partition);
        if ((int)strlen(order) > widths.order)
            widths.order = (int)strlen(order);
        if ((int)strlen(partition) > widths.partition)
            widths.partition = (int)strlen(partition);
    }
    return widths;
}

static void print_ranking_header(const cluster *c, ranking_widths w)
{
    printf("#\n# %4s %3s %3s %3s %4s %-8s %-*s %-*s %10s %10s %8s",
           "rank", "tp", "dp", "pp", "mbs", "levers", w.order, "node order",
           w.partition, "partition", "step", "tokens/s", "TFLOP/s");
    for (int t = 0; t < c->type_count && t < PLANNER_MAX_TYPES; t++)
        printf(" %12.12s", c->types[t].gpu);
    printf(" %9s\n", "$/step");
    printf("# %4s %3s %3s %3s %4s %-8s %-*s %-*s %10s %10s %8s", "", "",
           "", "", "", "", w.order, "", w.partition, "", "(s)", "",
           "per GPU");
    for (int t = 0; t < c->type_count && t < PLANNER_MAX_TYPES; t++)
        printf(" %12s", "(GiB)");
    printf(" %9s\n", "(USD)");
}

static void format_levers(const parallel_config *config, char *out,
                          size_t size)
{
    /* rc, zeroN, off, sp, vN: the levers a plan uses, '+'-joined */
    int zero = parallel_zero_stage(config);
    char zero_text[16] = "", chunks[16] = "";
    if (zero >= 1)
        snprintf(zero_text, sizeof zero_text, "+zero%d", zero);
    if (parallel_virtual_stages(config) > 1)
        snprintf(chunks, sizeof chunks, "+v%d", config->virtual_stages);
    snprintf(out, size, "%s%s%s%s%s", config->recompute ? "+rc" : "",
             zero_text, config->offload_optimizer ? "+off" : "",
             config->sequence_parallel ? "+sp" : "", chunks);
    if (out[0] == '+')
        memmove(out, out + 1, strlen(out));
    if (out[0] == '\0')
        snprintf(out, size, "-");
}

static void print_ranked_row(const cluster *c, ranking_widths w, int rank,
                             const ranked_plan *ranked)
{
    char order[256], partition[PT_MAX_STAGES * 6], levers[48];
    format_node_order(c, ranked->node_order, ranked->node_count, order,
                      sizeof order);
    partition_format(ranked->partition, ranked->config.pp, partition,
                     sizeof partition);
    format_levers(&ranked->config, levers, sizeof levers);
    /* a plan whose stages run their own tp and dp: the columns give
       stage 0's */
    if (stage_degrees_first_own(&ranked->config, ranked->stages) >= 0)
        snprintf(levers, sizeof levers, "asym");
    printf("  %4d %3d %3d %3d %4d %-8s %-*s %-*s %10.4f %10.0f %8.1f", rank,
           ranked->config.tp, ranked->config.dp, ranked->config.pp,
           ranked->config.mbs, levers, w.order, order, w.partition, partition,
           ranked->step_time_s, ranked->tokens_per_s, ranked->tflops_per_gpu);
    for (int t = 0; t < c->type_count && t < PLANNER_MAX_TYPES; t++) {
        if (ranked->peak_memory_gib_by_type[t] > 0)
            printf(" %12.2f", ranked->peak_memory_gib_by_type[t]);
        else
            printf(" %12s", "-");
    }
    printf(" %9.4f\n", ranked->cost_per_step_usd);
}

/* One compact entry of plan.json's "alternatives". */
static json_t *alternative_to_json(const cluster *c, const ranked_plan *r)
{
    char partition[PT_MAX_STAGES * 6];
    partition_format(r->partition, r->config.pp, partition, sizeof partition);
    json_t *order = json_array();
    for (int i = 0; i < r->node_count; i++) {
        char name[PT_NAME_MAX + 16];
        cluster_node_name(c, r->node_order[i], name, sizeof name);
        json_array_append_new(order, json_string(name));
    }
    json_t *entry = json_pack("{s:i, s:i, s:i, s:i, s:s, s:o, s:s, s:b, s:i, "
                     "s:b, s:f, s:f, s:f, s:f}",
                     "mbs", r->config.mbs, "tp", r->config.tp, "dp",
                     r->config.dp, "pp", r->config.pp, "partition", partition,
                     "node_order", order, "recompute",
                     r->config.recompute ? "full" : "none",
                     "distributed_optimizer",
                     (int)r->config.distributed_optimizer, "virtual_stages",
                     parallel_virtual_stages(&r->config),
                     "sequence_parallel", (int)r->config.sequence_parallel,
                     "step_time_s",
                     r->step_time_s, "tokens_per_s", r->tokens_per_s,
                     "tflops_per_gpu", r->tflops_per_gpu, "cost_per_step_usd",
                     r->cost_per_step_usd);
    /* as plan.json writes them: only when they say more */
    if (entry != NULL && parallel_zero_stage(&r->config) >= 2)
        json_object_set_new(entry, "zero",
                            json_integer(parallel_zero_stage(&r->config)));
    if (entry != NULL && r->config.offload_optimizer)
        json_object_set_new(entry, "offload_optimizer", json_true());
    /* a plan of stages of their own degrees names them, as plan.json's
     * "stages" does: without them the entry would read as a plan of the
     * first stage's tp and dp everywhere */
    bool failed = false;
    json_t *stages = entry != NULL ? stage_degrees_to_json(&r->config,
                                                           r->stages, &failed)
                                   : NULL;
    if (stages != NULL)
        json_object_set_new(entry, "stages", stages);
    return entry;
}

typedef struct plan_inputs {
    char model_path[PT_PATH_MAX];
    char cluster_path[PT_PATH_MAX];
    model_shape model;
    cluster cluster;
    cluster part;          /* --nodes: the part searched (else unused) */
    const cluster *searched; /* the part, or the cluster */
} plan_inputs;

/* Writes the best plan, its estimated timeline and the alternatives
 * (pareto: the front, or NULL). Model and cluster go inline, so the plan
 * loads wherever it is moved; "origin" keeps the files they came from. */
static int write_plan_file(const plan_arguments *args, const plan_inputs *in,
                           costmodel *cm, const ranked_plan *plans,
                           int plan_count, json_t *pareto, pt_error *err)
{
    plan best;
    if (plan_from_ranked(&plans[0], &in->model, &in->cluster, in->model_path,
                         in->cluster_path, &best, err) != 0)
        return -1;
    estimate est;
    int status = costmodel_estimate_stages(cm, &best.config, best.stages,
                                           best.node_order,
                                           best.node_order_count,
                                           best.partition, true, &est, err);
    if (status != 0) {
        plan_free(&best);
        return -1;
    }
    print_pricing(&est);
    print_tp_split_note(&best);
    plan_json_sections sections = {
        .estimate = estimate_to_json(&est, &best.config, args->timeline,
                                     err),
        .alternatives = json_array(),
        .pareto = pareto};
    for (int i = 1; sections.alternatives != NULL && i < plan_count; i++)
        json_array_append_new(sections.alternatives,
                              alternative_to_json(&in->cluster, &plans[i]));
    if (sections.estimate == NULL || sections.alternatives == NULL)
        status = pt_fail(err, "out of memory building the plan JSON");
    else
        status = plan_write_file(&best, &sections, args->output, err);
    json_decref(sections.estimate);
    json_decref(sections.alternatives);
    estimate_free(&est);
    plan_free(&best);
    return status;
}

static int load_inputs(const plan_arguments *args, plan_inputs *in,
                       pt_error *err)
{
    if (cli_locate("models", args->model, in->model_path,
                   sizeof in->model_path, err) != 0 ||
        cli_locate("clusters", args->cluster, in->cluster_path,
                   sizeof in->cluster_path, err) != 0)
        return -1;
    if (pt_check_output_not_input(args->output, in->model_path, "model",
                                  err) != 0 ||
        pt_check_output_not_input(args->output, in->cluster_path, "cluster",
                                  err) != 0)
        return -1;
    if (model_load_file(in->model_path, &in->model, err) != 0 ||
        cluster_load_file(in->cluster_path, &in->cluster, err) != 0)
        return -1;
    in->searched = &in->cluster;
    if (args->nodes == NULL)
        return 0;
    if (plan_restrict_nodes(&in->cluster, args->nodes, &in->part, err) != 0)
        return -1;
    in->searched = &in->part;
    return 0;
}

/* "cluster C (N nodes, G GPUs)", or with --nodes "cluster C (N of its M
 * nodes: --nodes ..., G GPUs)". */
static void print_cluster_words(const plan_arguments *args,
                                const plan_inputs *in)
{
    if (in->searched == &in->cluster)
        printf("cluster %s (%d nodes, %d GPUs)", in->cluster.name,
               in->cluster.node_count, cluster_gpu_count(&in->cluster));
    else
        printf("cluster %s (%d of its %d nodes: --nodes %s, %d GPUs)",
               in->cluster.name, in->part.node_count, in->cluster.node_count,
               args->nodes, cluster_gpu_count(&in->part));
}

/* Checks the constraints and searches the cluster or, with --nodes, its
 * part, through the cluster's cost model (the part keeps its types in
 * order); the plans then name the cluster's nodes. 0 or -1. */
static int search_cluster(const plan_arguments *args, const plan_inputs *in,
                          costmodel *cm, search_result *result,
                          pt_error *err)
{
    cm->cluster = in->searched;
    int status = planner_check_constraints(in->searched, &in->model,
                                           &args->search, err);
    if (status == 0)
        status = args->asymmetric
                     ? planner_search_asymmetric(cm, &args->search, result,
                                                 err)
                     : planner_search(cm, &args->search, result, err);
    cm->cluster = &in->cluster;
    if (status != 0 || in->searched == &in->cluster)
        return status;
    int counts[PLANNER_MAX_TYPES] = {0};
    for (int t = 0; t < in->part.type_count && t < PLANNER_MAX_TYPES; t++)
        counts[t] = in->part.types[t].count;
    for (int i = 0; i < result->plan_count; i++)
        plan_map_to_pool(&in->cluster, counts, &result->plans[i]);
    return 0;
}

/* The asymmetric search's counts, and how far from exact it is when its
 * budget stopped it. */
static void print_asymmetric_counts(const search_result *r)
{
    printf("# and %lld plans whose stages run their own tp and dp "
           "(without memory levers; %lld partial plans cut by a lower "
           "bound; \"asym\" below: tp and dp are stage 0's, plan.json's "
           "\"stages\" gives each)\n",
           r->asymmetric_scored, r->asymmetric_pruned);
    if (r->asymmetric_exact)
        return;
    double best = fmin(r->asymmetric_cutoff_s, r->asymmetric_best_score_s);
    printf("# NOT EXACT: the asymmetric search stopped after %lld partial "
           "plans (--max-tree-nodes); the best plan scores %.4f s, and no "
           "plan whose stages run their own tp and dp scores below %.4f s "
           "(gap %.2f %%)\n",
           r->asymmetric_nodes, best, r->asymmetric_floor_s,
           100.0 * (best - r->asymmetric_floor_s) / best);
}

static int run_search(const plan_arguments *args, plan_inputs *in,
                      pt_error *err)
{
    costmodel cm;
    if (costmodel_open(&cm, &in->model, &in->cluster, args->profiles, err) !=
        0)
        return EXIT_BAD_INPUT;
    /* Notes of the search cover every configuration tried; the user needs
     * those of opening the profiles and of the plans written. */
    int notes_of_open = cm.note_count;
    search_result result;
    double started = pt_monotonic_seconds();
    int status = search_cluster(args, in, &cm, &result, err);
    double elapsed = pt_monotonic_seconds() - started;
    if (status != 0) {
        costmodel_close(&cm);
        return EXIT_BAD_INPUT;
    }
    if (result.plan_count == 0) {
        pt_fail(err, "no plan fits %s on cluster %s%s%s with gbs %d: %s",
                in->model.name, in->cluster.name,
                args->nodes != NULL ? " --nodes " : "",
                args->nodes != NULL ? args->nodes : "", args->search.gbs,
                result.no_fit_reason[0] ? result.no_fit_reason
                                        : "no configuration is possible");
        search_result_free(&result);
        costmodel_close(&cm);
        return EXIT_BAD_INPUT;
    }
    char took[32];
    pt_format_seconds(elapsed, took, sizeof took);
    printf("# partita plan: model %s, ", in->model.name);
    print_cluster_words(args, in);
    printf(", gbs %d, objective %s%s%s\n", args->search.gbs,
           args->search.objective == OBJECTIVE_COST ? "$ per step"
                                                     : "step time",
           args->constrained[0] ? ", " : "", args->constrained);
    print_model_line(&in->model);
    printf("# scored %lld configurations (%lld fit) of %lld tasks and "
           "skipped %lld that a lower bound ruled out, in %s\n",
           result.configurations_scored, result.configurations_feasible,
           result.tasks, result.configurations_pruned, took);
    if (args->asymmetric)
        print_asymmetric_counts(&result);
    if (result.zero_levers_searched)
        printf("# no plan fits with ZeRO-1 and recompute alone: ZeRO-2, "
               "ZeRO-3 and optimizer offload searched too (the counts are "
               "that search's)\n");
    if (result.plan_count > 0 &&
        parallel_zero_stage(&result.plans[0].config) >= 2 &&
        result.plans[0].config.dp > 1)
        printf("# the best plan's ZeRO-%d memory is the shards and unit "
               "buffers partita exec holds (docs/executor.md)\n",
               parallel_zero_stage(&result.plans[0].config));
    if (!result.exact)
        printf("# NOT EXACT: the search stopped after %lld tree nodes "
               "(--max-tree-nodes); the best plan scores %.4f s, and no plan "
               "scores below %.4f s (gap %.2f %%)\n",
               result.tree_nodes, result.best_score_s, result.score_floor_s,
               100.0 * (result.best_score_s - result.score_floor_s) /
                   result.best_score_s);
    ranking_widths widths = ranking_column_widths(
        &in->cluster, result.plans, result.plan_count);
    print_ranking_header(&in->cluster, widths);
    for (int i = 0; i < result.plan_count; i++)
        print_ranked_row(&in->cluster, widths, i + 1, &result.plans[i]);
    cm.note_count = notes_of_open;
    status = write_plan_file(args, in, &cm, result.plans, result.plan_count,
                             NULL, err);
    print_notes(&cm);
    if (status == 0)
        printf("# wrote %s (best plan, its timeline, %d alternatives)\n",
               cli_output_name(args->output), result.plan_count - 1);
    search_result_free(&result);
    costmodel_close(&cm);
    return status == 0 ? EXIT_OK : EXIT_FAILURE_RUN;
}

static void print_pareto_front(const cluster *pool,
                               const pareto_result *front)
{
    printf("#\n# %-24s %5s %3s %3s %3s %4s %-26s %10s %10s %10s\n",
           "sub-cluster", "GPUs", "tp", "dp", "pp", "mbs", "partition",
           "step (s)", "tokens/s", "$/step");
    for (int i = 0; i < front->point_count; i++) {
        const pareto_point *point = &front->points[i];
        char mix[128] = "";
        size_t used = 0;
        int gpus = 0;
        for (int t = 0; t < pool->type_count && t < PLANNER_MAX_TYPES; t++) {
            if (point->type_counts[t] == 0)
                continue;
            used += (size_t)snprintf(mix + used, sizeof mix - used, "%s%dx%s",
                                     used ? " + " : "", point->type_counts[t],
                                     pool->types[t].name);
            gpus += point->type_counts[t] * pool->types[t].gpus;
            if (used >= sizeof mix)
                break;
        }
        char partition[PT_MAX_STAGES * 6];
        partition_format(point->plan.partition, point->plan.config.pp,
                         partition, sizeof partition);
        printf("  %-24s %5d %3d %3d %3d %4d %-26s %10.4f %10.0f %10.4f\n",
               mix, gpus, point->plan.config.tp, point->plan.config.dp,
               point->plan.config.pp, point->plan.config.mbs, partition,
               point->plan.step_time_s, point->plan.tokens_per_s,
               point->plan.cost_per_step_usd);
    }
}

/* The Pareto points as plan.json's "pareto" array; node orders name pool
 * nodes, so each entry is a plan over the pool file. */
static json_t *pareto_to_json(const cluster *pool, const pareto_result *front)
{
    json_t *points = json_array();
    for (int i = 0; i < front->point_count; i++) {
        const pareto_point *point = &front->points[i];
        json_t *entry = alternative_to_json(pool, &point->plan);
        json_t *counts = json_object();
        for (int t = 0; t < pool->type_count && t < PLANNER_MAX_TYPES; t++)
            json_object_set_new(counts, pool->types[t].name,
                                json_integer(point->type_counts[t]));
        json_object_set_new(entry, "nodes_used", counts);
        json_array_append_new(points, entry);
    }
    return points;
}

static int run_pareto(const plan_arguments *args, plan_inputs *in,
                      pt_error *err)
{
    pareto_result front;
    double started = pt_monotonic_seconds();
    if (planner_pareto(&in->model, in->searched, args->profiles,
                       &args->search, &front, err) != 0)
        return EXIT_BAD_INPUT;
    double elapsed = pt_monotonic_seconds() - started;
    if (front.point_count == 0) {
        pt_fail(err, "no sub-cluster of %s%s%s can train %s with gbs %d%s%s",
                in->cluster.name, args->nodes != NULL ? " --nodes " : "",
                args->nodes != NULL ? args->nodes : "", in->model.name,
                args->search.gbs, args->constrained[0] ? " and " : "",
                args->constrained);
        pareto_result_free(&front);
        return EXIT_BAD_INPUT;
    }
    char took[32];
    pt_format_seconds(elapsed, took, sizeof took);
    printf("# partita plan --pareto: model %s, pool %s%s%s, gbs %d%s%s\n",
           in->model.name, in->cluster.name,
           args->nodes != NULL ? " --nodes " : "",
           args->nodes != NULL ? args->nodes : "", args->search.gbs,
           args->constrained[0] ? ", " : "", args->constrained);
    printf("# searched %d sub-clusters: %lld configurations scored, %lld "
           "ruled out by a lower bound, in %s; %d plans on the front of "
           "step time vs $ per step\n",
           front.subclusters_searched, front.configurations_scored,
           front.configurations_pruned, took, front.point_count);
    for (int i = 0; i < front.point_count; i++)
        plan_map_to_pool(&in->cluster, front.points[i].type_counts,
                         &front.points[i].plan);
    print_pareto_front(&in->cluster, &front);

    costmodel cm;
    int status = EXIT_BAD_INPUT;
    if (costmodel_open(&cm, &in->model, &in->cluster, args->profiles, err) ==
        0) {
        json_t *points = pareto_to_json(&in->cluster, &front);
        ranked_plan fastest = front.points[0].plan;
        status = write_plan_file(args, in, &cm, &fastest, 1, points,
                                 err) == 0
                     ? EXIT_OK
                     : EXIT_FAILURE_RUN;
        json_decref(points);
        print_notes(&cm);
        if (status == EXIT_OK)
            printf("# wrote %s (the fastest plan of the front; the front "
                   "under \"pareto\")\n", cli_output_name(args->output));
        costmodel_close(&cm);
    }
    pareto_result_free(&front);
    return status;
}

int command_plan(int argc, char **argv)
{
    plan_arguments args = {.cluster = "hetero", .output = "plan.json"};
    search_options_default(&args.search);
    args.search.gbs = 0;
    int parsed = parse_plan_arguments(argc, argv, &args);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    /* an output that cannot be written is found now, not after the
       search */
    if (cli_check_output("plan", args.output, false) != 0)
        return EXIT_BAD_INPUT;
    if (strcmp(args.output, "-") == 0)
        cli_text_to_stderr();
    progress_state progress = {pt_monotonic_seconds(), pt_monotonic_seconds(),
                               args.pareto ? "sub-clusters" : "tasks"};
    if (!args.quiet) {
        args.search.progress = show_progress;
        args.search.progress_context = &progress;
    }
    pt_error err = {{0}};
    plan_inputs inputs;
    memset(&inputs, 0, sizeof inputs);
    if (load_inputs(&args, &inputs, &err) != 0) {
        cli_error("plan", err.message);
        cluster_free(&inputs.cluster);
        return EXIT_BAD_INPUT;
    }
    int status = args.pareto ? run_pareto(&args, &inputs, &err)
                             : run_search(&args, &inputs, &err);
    if (status != EXIT_OK)
        cli_error("plan", err.message);
    if (inputs.searched == &inputs.part)
        cluster_free(&inputs.part);
    cluster_free(&inputs.cluster);
    return status;
}
