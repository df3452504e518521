/*
 * asymmetric_speed: how long `partita plan --asymmetric`'s search takes
 * beside the symmetric one (issue 36, item 2), and what it gains: the
 * median of several runs of each on the bundled clusters it takes, one
 * table row per problem. A benchmark, run by hand (docs/benchmarks.md);
 * no test asserts a time.
 *
 *   asymmetric_speed [--runs N] [CLUSTER...]   (after one untimed
 *   warm-up run; CLUSTER...: only the problems on those clusters)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"

#ifndef ASYMMETRIC_SPEED_SOURCE_ROOT
#define ASYMMETRIC_SPEED_SOURCE_ROOT "."
#endif

#define MAX_RUNS 51

typedef struct speed_problem {
    const char *model, *cluster;
    int gbs;
} speed_problem;

static const speed_problem problems[] = {
    {"gpt2-xl", "h200x2-hetero", 64},
    {"gpt2-xl", "h200x4-hetero", 64},
    {"gpt2-xl", "h200x8", 64},
    /* the FASOP cases (plan_speed's (a) and (b)) and FASOP's GPT-2 XL
       cluster */
    {"bert-large", "fasop-bert", 256},
    {"gpt2-xl", "hetero", 64},
    {"gpt2-xl", "fasop-gpt2xl", 64},
    /* 96 GPUs of 4 types (plan_scale's) */
    {"gpt-13b", "mixed-96", 512},
};

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median seconds of `runs` searches (asymmetric or not) and the best
 * step of the last. */
static int time_search(costmodel *cm, const search_options *o,
                       bool asymmetric, int runs, double *median,
                       double *best_step, pt_error *err)
{
    double took[MAX_RUNS + 1];
    /* run 0 warms up (profiles priced, notes written), untimed */
    for (int r = 0; r <= runs; r++) {
        search_result result;
        double started = pt_monotonic_seconds();
        int rc = asymmetric ? planner_search_asymmetric(cm, o, &result, err)
                            : planner_search(cm, o, &result, err);
        took[r] = pt_monotonic_seconds() - started;
        if (rc != 0)
            return -1;
        *best_step = result.plan_count > 0 ? result.plans[0].step_time_s
                                           : 0.0;
        if (asymmetric && r == runs)
            fprintf(stderr, "  (%lld asymmetric plans solved, %lld cut)\n",
                    result.asymmetric_scored, result.asymmetric_pruned);
        search_result_free(&result);
    }
    qsort(took + 1, (size_t)runs, sizeof *took, compare_doubles);
    *median = took[1 + runs / 2];
    return 0;
}

static int run_problem(const speed_problem *p, int runs)
{
    char model_path[PT_PATH_MAX], cluster_path[PT_PATH_MAX];
    snprintf(model_path, sizeof model_path, "%s/models/%s.json",
             ASYMMETRIC_SPEED_SOURCE_ROOT, p->model);
    snprintf(cluster_path, sizeof cluster_path, "%s/clusters/%s.json",
             ASYMMETRIC_SPEED_SOURCE_ROOT, p->cluster);
    model_shape model;
    cluster c;
    costmodel cm;
    pt_error err = {{0}};
    if (model_load_file(model_path, &model, &err) != 0 ||
        cluster_load_file(cluster_path, &c, &err) != 0) {
        fprintf(stderr, "asymmetric_speed: %s\n", err.message);
        return -1;
    }
    int rc = costmodel_open(&cm, &model, &c, NULL, &err);
    search_options o;
    search_options_default(&o);
    o.gbs = p->gbs;
    o.threads = 1;
    o.allow_interleave = false;
    double symmetric_s = 0, asymmetric_s = 0, symmetric_step = 0,
           asymmetric_step = 0;
    if (rc == 0)
        rc = time_search(&cm, &o, false, runs, &symmetric_s, &symmetric_step,
                         &err) != 0 ||
                     time_search(&cm, &o, true, runs, &asymmetric_s,
                                 &asymmetric_step, &err) != 0
                 ? -1
                 : 0;
    if (rc == 0)
        printf("  %-8s %-14s %5d %4d %12.1f %12.1f %10.4f %10.4f %7.2f\n",
               p->model, p->cluster, p->gbs, cluster_gpu_count(&c),
               symmetric_s * 1e3, asymmetric_s * 1e3, symmetric_step,
               asymmetric_step,
               asymmetric_step > 0 ? symmetric_step / asymmetric_step : 0.0);
    else
        fprintf(stderr, "asymmetric_speed: %s\n", err.message);
    costmodel_close(&cm);
    cluster_free(&c);
    return rc;
}

/* Whether problem p is among the clusters named (all when none is). */
static bool wanted(const speed_problem *p, int count, char **names)
{
    for (int i = 0; i < count; i++)
        if (strcmp(names[i], p->cluster) == 0)
            return true;
    return count == 0;
}

int main(int argc, char **argv)
{
    int runs = 5, first_name = 1;
    if (argc >= 3 && strcmp(argv[1], "--runs") == 0) {
        runs = atoi(argv[2]);
        first_name = 3;
    }
    if (runs < 1 || runs > MAX_RUNS) {
        fprintf(stderr, "usage: asymmetric_speed [--runs N] [CLUSTER...], "
                        "N 1..%d\n", MAX_RUNS);
        return 2;
    }
    printf("# one thread, no interleaving, median of %d runs; step: the "
           "best plan's estimated step\n", runs);
    printf("# %-8s %-14s %5s %4s %12s %12s %10s %10s %7s\n", "model",
           "cluster", "gbs", "GPUs", "sym (ms)", "asym (ms)", "sym (s)",
           "asym (s)", "gain");
    int status = 0;
    for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++)
        if (wanted(&problems[i], argc - first_name, argv + first_name))
            status |= run_problem(&problems[i], runs) != 0;
    return status;
}
