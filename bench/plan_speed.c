/*
 * plan_speed: how fast `partita plan` searches, against FASOP's published
 * search times (shared/reference/anchors.md), in the manner of
 * nccl-tests: a warm-up run, then the median of several timed runs, one
 * table row per problem.
 *
 *   plan_speed [--runs N] [--threads N] [--only a|b|c] [--exhaustive]
 *             [--greedy-report] [--no-scale] [--scale-runs N]
 *             [--random N] [--with-exhaustive]
 *
 * Then issue 14's cases as whole processes (plan_scale.c): --no-scale
 * leaves them out, --random N times N random 20-node clusters (default
 * 10), --with-exhaustive also times the 160-GPU case's enumeration.
 *
 * --exhaustive scores every configuration (no pruning by score floors).
 * --greedy-report also compares FASOP's greedy partition with the exact
 * one on every configuration of the GPT-2 XL and BERT problems, under
 * Partita's cost model (docs/planner.md quotes the numbers).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/plan_speed.h"

#ifndef PLAN_SPEED_SOURCE_ROOT
#define PLAN_SPEED_SOURCE_ROOT "."
#endif

#define MAX_RUNS 101

/* One benchmark problem and FASOP's published figures for it. */
typedef struct speed_problem {
    const char *label;
    const char *model;      /* relative to the source root */
    const char *cluster;
    int gbs;
    bool pareto;
    double fasop_s;         /* FASOP's wall time on a 2-core machine */
    long long fasop_configurations;
} speed_problem;

static const speed_problem problems[] = {
    {"(a) GPT-2 XL, hetero.json, gbs 64", "models/gpt2-xl.json",
     "clusters/hetero.json", 64, false, 4.3, 592},
    {"(b) BERT-large, fasop-bert.json, gbs 256", "models/bert-large.json",
     "clusters/fasop-bert.json", 256, false, 2.3, 356},
    {"(c) GPT-2 XL Pareto, pareto pool, gbs 64",
     "models/gpt2-xl.json", "clusters/fasop-pareto-pool.json", 64, true,
     541.0, 31362},
};
#define PROBLEM_COUNT 3

/* What the command line asked for. */
typedef struct bench_arguments {
    int runs;
    int threads;
    bool greedy_report;
    bool exhaustive;        /* no pruning by score floors */
    int only;               /* -1: every problem, else its index */
    char root[PT_PATH_MAX];
    bool scale;             /* also the whole-process table */
    scale_arguments scaling;
} bench_arguments;

/* The inputs of one problem, loaded once. */
typedef struct loaded_problem {
    model_shape model;
    cluster cluster;
    char profiles[PT_PATH_MAX];
} loaded_problem;

/* One timed row. */
typedef struct speed_row {
    long long configurations;   /* scored */
    long long pruned;           /* skipped by score floors */
    double median_ms;
    double best_step_s;
    char best[3072];
} speed_row;

static double seconds_now(void)
{
    return pt_monotonic_seconds();
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count)
{
    qsort(values, (size_t)count, sizeof *values, compare_doubles);
    return count % 2 ? values[count / 2]
                     : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

static int load_problem(const bench_arguments *args,
                        const speed_problem *problem, loaded_problem *out,
                        pt_error *err)
{
    char path[PT_PATH_MAX];
    pt_resolve_path(args->root, problem->model, path, sizeof path);
    if (model_load_file(path, &out->model, err) != 0)
        return -1;
    pt_resolve_path(args->root, problem->cluster, path, sizeof path);
    if (cluster_load_file(path, &out->cluster, err) != 0)
        return -1;
    pt_resolve_path(args->root, "profiles", out->profiles,
                    sizeof out->profiles);
    return 0;
}

static void describe_plan(const ranked_plan *plan, char *out, size_t size)
{
    char partition[PT_MAX_STAGES * 4];
    partition_format(plan->partition, plan->config.pp, partition,
                     sizeof partition);
    snprintf(out, size, "tp %d dp %d pp %d mbs %d%s%s, %s, %.4f s/step",
             plan->config.tp, plan->config.dp, plan->config.pp,
             plan->config.mbs, plan->config.recompute ? " recompute" : "",
             plan->config.distributed_optimizer ? " dist-opt" : "",
             partition, plan->step_time_s);
}

/* One run of a problem; fills configurations and the best plan. */
static int run_once(const loaded_problem *in, const speed_problem *problem,
                    const search_options *options, speed_row *row,
                    pt_error *err)
{
    if (problem->pareto) {
        pareto_result front;
        if (planner_pareto(&in->model, &in->cluster, in->profiles, options,
                           &front, err) != 0)
            return -1;
        row->configurations = front.configurations_scored;
        row->pruned = front.configurations_pruned;
        if (front.point_count > 0) {
            row->best_step_s = front.points[0].plan.step_time_s;
            snprintf(row->best, sizeof row->best, "%d plans on the front, "
                     "fastest %.4f s/step", front.point_count,
                     front.points[0].plan.step_time_s);
        }
        pareto_result_free(&front);
        return 0;
    }
    costmodel cm;
    if (costmodel_open(&cm, &in->model, &in->cluster, in->profiles, err) != 0)
        return -1;
    search_result result;
    int status = planner_search(&cm, options, &result, err);
    if (status == 0) {
        row->configurations = result.configurations_scored;
        row->pruned = result.configurations_pruned;
        if (result.plan_count > 0) {
            row->best_step_s = result.plans[0].step_time_s;
            describe_plan(&result.plans[0], row->best, sizeof row->best);
        } else {
            snprintf(row->best, sizeof row->best, "no plan fits: %s",
                     result.no_fit_reason);
        }
        search_result_free(&result);
    }
    costmodel_close(&cm);
    return status;
}

/* Warm-up, then the median of args->runs timed runs. */
static int time_problem(const bench_arguments *args,
                        const loaded_problem *in,
                        const speed_problem *problem,
                        partition_solver solver, int runs, speed_row *row,
                        pt_error *err)
{
    search_options options;
    search_options_default(&options);
    options.gbs = problem->gbs;
    options.solver = solver;
    options.threads = args->threads;
    options.exhaustive = args->exhaustive;
    options.keep = 1;
    double times[MAX_RUNS];
    if (run_once(in, problem, &options, row, err) != 0)
        return -1;
    for (int r = 0; r < runs; r++) {
        double start = seconds_now();
        if (run_once(in, problem, &options, row, err) != 0)
            return -1;
        times[r] = seconds_now() - start;
    }
    row->median_ms = 1e3 * median(times, runs);
    return 0;
}

static void print_machine(const bench_arguments *args)
{
    char cpu[256] = "unknown CPU";
    FILE *info = fopen("/proc/cpuinfo", "r");
    if (info != NULL) {
        char line[512];
        while (fgets(line, sizeof line, info) != NULL) {
            char *colon = strchr(line, ':');
            if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
                pt_copy_string(cpu, sizeof cpu, colon + 2);
                cpu[strcspn(cpu, "\n")] = '\0';
                break;
            }
        }
        fclose(info);
    }
    printf("# machine: %s, %ld online cores; search threads: %d\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), search_thread_count(args->threads));
    printf("# each row: one warm-up run, then the median of %d timed runs "
           "(wall clock)%s\n", args->runs,
           args->exhaustive ? "; exhaustive: no pruning" : "");
    printf("# FASOP cannot run on this machine (no PyPI, no network): its "
           "column is the\n# wall time it publishes for a 2-core machine "
           "(shared/reference/anchors.md).\n#\n");
}

static void print_row(const char *label, const char *solver,
                      const speed_row *row, const speed_problem *problem)
{
    double per_s = row->configurations / (row->median_ms * 1e-3);
    printf("%-44.44s %-6s %9lld %9lld %10.2f %11.0f %9.1f %9.0fx\n", label,
           solver, row->configurations, row->pruned, row->median_ms, per_s,
           problem->fasop_s, problem->fasop_s / (row->median_ms * 1e-3));
}

static int speed_table(const bench_arguments *args, pt_error *err)
{
    print_machine(args);
    printf("%-44s %-6s %9s %9s %10s %11s %9s %10s\n", "# problem", "solver",
           "scored", "pruned", "time (ms)", "scored/s", "FASOP (s)",
           "speed-up");
    speed_row ilp_row;
    bool have_ilp = false;
    for (int p = 0; p < PROBLEM_COUNT; p++) {
        if (args->only >= 0 && p != args->only)
            continue;
        loaded_problem in;
        memset(&in, 0, sizeof in);
        speed_row row;
        memset(&row, 0, sizeof row);
        int status = load_problem(args, &problems[p], &in, err);
        if (status == 0)
            status = time_problem(args, &in, &problems[p], SOLVER_DP,
                                  args->runs, &row, err);
        if (status == 0 && p == 0) {
            memset(&ilp_row, 0, sizeof ilp_row);
            status = time_problem(args, &in, &problems[p], SOLVER_ILP,
                                  args->runs < 3 ? args->runs : 3, &ilp_row,
                                  err);
            have_ilp = status == 0;
        }
        cluster_free(&in.cluster);
        if (status != 0)
            return -1;
        print_row(problems[p].label, "dp", &row, &problems[p]);
        if (p == 0 && have_ilp)
            print_row(problems[p].label, "ilp", &ilp_row, &problems[p]);
        printf("#   best: %s\n", row.best);
    }
    printf("#\n# scored: (tp, dp, pp, mbs, node order, memory levers) "
           "placed, priced and partitioned\n# exactly; pruned: skipped "
           "because a floor under their score could not beat the\n# plans "
           "kept. Time includes loading the profiles. FASOP scored %lld, "
           "%lld and\n# %lld configurations of its own, narrower space.\n",
           problems[0].fasop_configurations, problems[1].fasop_configurations,
           problems[2].fasop_configurations);
    return 0;
}

/* ------------------------------------------------ greedy against exact */

/* How FASOP's greedy partition compares with the exact one. */
typedef struct greedy_tally {
    long long compared;        /* both found a partition that fits */
    long long greedy_no_fit;   /* exact fits, the greedy's result not */
    long long worse;           /* greedy surrogate higher */
    double excess_sum, excess_max;           /* surrogate, relative */
    long long step_worse;      /* greedy simulated step time higher */
    double step_excess_sum, step_excess_max; /* relative */
    long long step_better;     /* greedy simulated step time lower */
    double step_better_sum, step_better_max; /* relative */
} greedy_tally;

static void tally_excess(double greedy, double exact, long long *count,
                         double *sum, double *max)
{
    double excess = greedy / exact - 1.0;
    if (excess <= 1e-9)
        return;
    (*count)++;
    *sum += excess;
    if (excess > *max)
        *max = excess;
}

static int simulated_step(costmodel *cm, const parallel_config *config,
                          const int *order, int node_count,
                          const int *partition, double *step_s, pt_error *err)
{
    estimate est;
    memset(&est, 0, sizeof est);
    if (costmodel_estimate(cm, config, order, node_count, partition, false,
                           &est, err) != 0)
        return -1;
    *step_s = est.step_time_s;
    estimate_free(&est);
    return 0;
}

/* Solves one configuration both ways; *fits tells whether the exact
 * solver found a partition. */
static int compare_configuration(costmodel *cm, const parallel_config *config,
                                 const int *order, int node_count,
                                 greedy_tally *tally, bool *fits,
                                 pt_error *err)
{
    static _Thread_local stage_placement placement[PT_MAX_STAGES];
    partition_stage stages[PT_MAX_STAGES];
    if (costmodel_place(cm, config, order, node_count, placement, err) != 0)
        return -1;
    for (int s = 0; s < config->pp; s++) {
        stage_terms terms;
        if (costmodel_stage_terms(cm, config, placement, s, &terms, err) != 0)
            return -1;
        stages[s] = (partition_stage){terms.fixed_s, terms.per_layer_s,
                                      terms.max_layers};
    }
    partition_problem problem = {config->pp, cm->model.layers,
                                 parallel_microbatches(config), stages};
    int exact[PT_MAX_STAGES], greedy[PT_MAX_STAGES];
    double exact_value = 0.0, greedy_value = 0.0;
    int status = partition_solve_dp(&problem, exact, &exact_value, err);
    *fits = status == 1;
    if (status != 1)
        return status < 0 ? -1 : 0;
    status = partition_solve_fasop_greedy(&problem, greedy, &greedy_value,
                                          err);
    if (status < 0)
        return -1;
    if (status == 0) {
        tally->greedy_no_fit++;
        return 0;
    }
    tally->compared++;
    tally_excess(greedy_value, exact_value, &tally->worse, &tally->excess_sum,
                 &tally->excess_max);
    double exact_step = 0.0, greedy_step = 0.0;
    if (simulated_step(cm, config, order, node_count, exact, &exact_step,
                       err) != 0 ||
        simulated_step(cm, config, order, node_count, greedy, &greedy_step,
                       err) != 0)
        return -1;
    tally_excess(greedy_step, exact_step, &tally->step_worse,
                 &tally->step_excess_sum, &tally->step_excess_max);
    /* the exact partition is optimal for the surrogate, not for the
       simulated schedule: count the other way round too */
    tally_excess(exact_step, greedy_step, &tally->step_better,
                 &tally->step_better_sum, &tally->step_better_max);
    return 0;
}

/* What the walk of one task compares at every node order it visits. */
typedef struct greedy_walk {
    costmodel *cm;
    const parallel_config *config;
    greedy_tally *tally;
    bool failed;
    pt_error err;
} greedy_walk;

static void compare_order(void *context, const int *types, int count)
{
    greedy_walk *walk = context;
    const cluster *c = walk->cm->cluster;
    int order[PT_MAX_NODES], first[PLANNER_MAX_TYPES],
        used[PLANNER_MAX_TYPES] = {0};
    for (int t = 0, node = 0; t < c->type_count; t++) {
        first[t] = node;
        node += c->types[t].count;
    }
    for (int i = 0; i < count; i++)
        order[i] = first[types[i]] + used[types[i]]++;
    bool fits = false;
    if (!walk->failed &&
        compare_configuration(walk->cm, walk->config, order, count,
                              walk->tally, &fits, &walk->err) != 0)
        walk->failed = true;
}

/* Every placement of every task the search has, visited exhaustively. */
static int compare_problem(costmodel *cm, const search_space *space,
                           const search_options *options, greedy_tally *tally,
                           pt_error *err)
{
    int max_pp = 1;
    for (int i = 0; i < space->task_count; i++)
        if (space->tasks[i].config.pp > max_pp)
            max_pp = space->tasks[i].config.pp;
    tree_worker *worker;
    shortlist best;
    if (tree_worker_open(&worker, cm, max_pp, options, err) != 0)
        return -1;
    int status = shortlist_open(&best, 1, space->node_count, max_pp, err);
    for (int i = 0; status == 0 && i < space->task_count; i++) {
        greedy_walk walk = {cm, &space->tasks[i].config, tally, false,
                            {{0}}};
        tree_limits limits = {true, INFINITY, 0, compare_order, &walk};
        tree_outcome outcome;
        status = search_tree_run(worker, &space->tasks[i], &limits, &best,
                                 &outcome, err);
        if (status == 0 && walk.failed) {
            *err = walk.err;
            status = -1;
        }
    }
    shortlist_close(&best);
    tree_worker_close(worker);
    return status;
}

static int greedy_report(const bench_arguments *args, pt_error *err)
{
    printf("#\n# FASOP's greedy partition against the exact (DP) one, same "
           "stage costs (Partita's cost model)\n");
    printf("%-40s %8s %6s %17s %22s %22s %6s\n", "# problem", "compared",
           "worse", "surrogate mean/max", "step worse: mean/max",
           "step better: mean/max", "no fit");
    for (int p = 0; p < 2; p++) {
        loaded_problem in;
        memset(&in, 0, sizeof in);
        costmodel cm;
        search_space space;
        search_options options;
        search_options_default(&options);
        options.gbs = problems[p].gbs;
        greedy_tally tally;
        memset(&tally, 0, sizeof tally);
        if (load_problem(args, &problems[p], &in, err) != 0)
            return -1;
        int status = costmodel_open(&cm, &in.model, &in.cluster, in.profiles,
                                    err);
        if (status == 0) {
            status = search_space_build(&in.cluster, &in.model,
                                        &options, &space, err);
            if (status == 0) {
                status = compare_problem(&cm, &space, &options, &tally, err);
                search_space_free(&space);
            }
            costmodel_close(&cm);
        }
        cluster_free(&in.cluster);
        if (status != 0)
            return -1;
        printf("%-40.40s %8lld %6lld %6.2f%% /%7.2f%% %4lld: %5.2f%% /%6.2f%% "
               "%4lld: %5.2f%% /%6.2f%% %6lld\n",
               problems[p].label, tally.compared, tally.worse,
               tally.worse ? 100.0 * tally.excess_sum / tally.worse : 0.0,
               100.0 * tally.excess_max, tally.step_worse,
               tally.step_worse ? 100.0 * tally.step_excess_sum /
                                      tally.step_worse
                                : 0.0,
               100.0 * tally.step_excess_max, tally.step_better,
               tally.step_better ? 100.0 * tally.step_better_sum /
                                       tally.step_better
                                 : 0.0,
               100.0 * tally.step_better_max, tally.greedy_no_fit);
    }
    printf("# compared: configurations where both partitions fit; worse: "
           "greedy surrogate\n# higher (mean and max excess over those); "
           "step worse / better: the simulated\n# step time of the greedy's "
           "partition higher / lower than the exact one's\n# (count, "
           "mean/max difference); no fit: the greedy's partition exceeds\n"
           "# memory where an exact one fits.\n");
    return 0;
}

static int parse_arguments(int argc, char **argv, bench_arguments *args)
{
    args->runs = 7;
    args->threads = 0;
    args->greedy_report = false;
    args->only = -1;
    args->exhaustive = false;
    const char *root = getenv("PARTITA_SOURCE");
    pt_copy_string(args->root, sizeof args->root,
                   root && *root ? root : PLAN_SPEED_SOURCE_ROOT);
    args->scale = true;
    args->scaling = (scale_arguments){PLAN_SPEED_PARTITA, "", 3, 10, false};
    pt_copy_string(args->scaling.root, sizeof args->scaling.root, args->root);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            args->runs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            args->threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            args->only = argv[++i][0] - 'a';
            if (args->only < 0 || args->only >= PROBLEM_COUNT)
                args->only = PROBLEM_COUNT; /* rejected below */
        } else if (strcmp(argv[i], "--exhaustive") == 0) {
            args->exhaustive = true;
        } else if (strcmp(argv[i], "--greedy-report") == 0) {
            args->greedy_report = true;
        } else if (strcmp(argv[i], "--no-scale") == 0) {
            args->scale = false;
        } else if (strcmp(argv[i], "--with-exhaustive") == 0) {
            args->scaling.with_exhaustive = true;
        } else if (strcmp(argv[i], "--scale-runs") == 0 && i + 1 < argc) {
            args->scaling.scale_runs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--random") == 0 && i + 1 < argc) {
            args->scaling.random_clusters = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: plan_speed [--runs N] [--threads N] "
                    "[--only a|b|c] [--exhaustive] [--greedy-report] "
                    "[--no-scale] [--scale-runs N] [--random N] "
                    "[--with-exhaustive]\n");
            return -1;
        }
    }
    if (args->runs < 1 || args->runs > MAX_RUNS || args->threads < 0 ||
        args->only >= PROBLEM_COUNT || args->scaling.scale_runs < 1 ||
        args->scaling.random_clusters < 0) {
        fprintf(stderr, "plan_speed: --runs must be 1..%d, --threads >= 0, "
                "--only a, b or c\n", MAX_RUNS);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_arguments args;
    if (parse_arguments(argc, argv, &args) != 0)
        return 2;
    pt_error err = {{0}};
    printf("# plan_speed: Partita's planner search time against FASOP's\n");
    if (speed_table(&args, &err) != 0 ||
        (args.greedy_report && greedy_report(&args, &err) != 0) ||
        (args.scale && scale_table(&args.scaling, &err) != 0)) {
        fprintf(stderr, "plan_speed: %s\n", err.message);
        return 1;
    }
    return 0;
}
