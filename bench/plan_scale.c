/*
 * plan_speed's second table: issue 14's cases run as a user runs them,
 * each `partita` command a whole process (the binary built beside this
 * benchmark), timed with its peak resident memory (GNU time), against
 * the limits. One row per command: the median wall time of a few
 * runs, the largest peak memory, whether the search was exact, the best
 * step time. FASOP cannot plan these clusters (its search enumerates
 * node orders and refuses or runs for hours): the peer of these rows is
 * the target, and for the 160-GPU case, with --with-exhaustive, the
 * enumeration of every node order measured in the same run.
 */
#include "bench/plan_speed.h"

#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* One command of the table and its limits. */
typedef struct scale_case {
    const char *label;
    const char *arguments;  /* after `partita`; {root} and {out} expanded */
    double limit_s;         /* 0: no limit */
    double limit_mb;        /* 0: no limit */
} scale_case;

/* What the runs of one command gave. */
typedef struct scale_result {
    double median_s;
    double peak_mb;
    int status;
    char exact[16];
    char best[160];
} scale_result;

static double now_s(void)
{
    return pt_monotonic_seconds();
}

/* Expands {root} and {out} in a template into out. */
static void expand(const char *template, const char *root, const char *dir,
                   char *out, size_t size)
{
    size_t used = 0;
    for (const char *p = template; *p && used + 1 < size; p++) {
        const char *with = NULL;
        if (strncmp(p, "{root}", 6) == 0)
            with = root, p += 5;
        else if (strncmp(p, "{out}", 5) == 0)
            with = dir, p += 4;
        if (with != NULL)
            used += (size_t)snprintf(out + used, size - used, "%s", with);
        else
            out[used++] = *p;
    }
    out[used < size ? used : size - 1] = '\0';
}

/* Runs `partita arguments` with stdout to log; wall seconds and peak
 * resident megabytes; its exit status. The peak comes from GNU time's
 * own wait4 on partita: a process spawned from this one starts sharing
 * this one's memory, which wait4 here would count. */
static int run_partita(const char *partita, const char *arguments,
                       const char *log, double *wall_s, double *peak_mb)
{
    char command[8192], peak_file[PT_PATH_MAX + 64];
    snprintf(peak_file, sizeof peak_file, "%s.peak", log);
    snprintf(command, sizeof command,
             "exec /usr/bin/time -f %%M -o %s %s %s >%s 2>&1", peak_file,
             partita, arguments, log);
    char *argv[] = {"sh", "-c", command, NULL};
    double start = now_s();
    pid_t pid;
    if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0)
        return -1;
    int status = 0;
    struct rusage usage;
    while (wait4(pid, &status, 0, &usage) < 0)
        if (errno != EINTR)
            return -1;
    *wall_s = now_s() - start;
    *peak_mb = 0.0;
    FILE *peak = fopen(peak_file, "r");
    double kilobytes = 0.0;
    if (peak != NULL) {
        /* GNU time writes a line about a non-zero exit first */
        char line[256];
        while (fgets(line, sizeof line, peak) != NULL)
            if (sscanf(line, "%lf", &kilobytes) == 1)
                *peak_mb = kilobytes / 1024.0;
        fclose(peak);
    }
    (void)usage;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* From a plan's log: exact or the gap, and the best step time. */
static void read_log(const char *log, scale_result *out)
{
    snprintf(out->exact, sizeof out->exact, "-");
    out->best[0] = '\0';
    FILE *file = fopen(log, "r");
    if (file == NULL)
        return;
    char line[4096];
    bool table = false;
    while (fgets(line, sizeof line, file) != NULL) {
        if (strncmp(line, "# scored", 8) == 0)
            snprintf(out->exact, sizeof out->exact, "yes");
        const char *gap = strstr(line, "(gap ");
        if (strncmp(line, "# NOT EXACT", 11) == 0 && gap != NULL)
            snprintf(out->exact, sizeof out->exact, "gap %.5s", gap + 5);
        if (strncmp(line, "# rank", 6) == 0)
            table = true;
        int rank, tp, dp, pp, mbs;
        char levers[32];
        if (table && out->best[0] == '\0' &&
            sscanf(line, " %d %d %d %d %d %31s", &rank, &tp, &dp, &pp, &mbs,
                   levers) == 6 && rank == 1) {
            /* the step time is the first number after the partition */
            char *fields[32];
            int count = 0;
            for (char *token = strtok(line, " \n"); token && count < 32;
                 token = strtok(NULL, " \n"))
                fields[count++] = token;
            for (int i = 7; i < count; i++)
                if (strchr(fields[i], '.') && !strchr(fields[i], '-')) {
                    snprintf(out->best, sizeof out->best,
                             "tp %d dp %d pp %d mbs %d %.16s, %.16s s", tp,
                             dp, pp, mbs, levers, fields[i]);
                    break;
                }
        }
        if (strncmp(line, "# step time", 11) == 0 && out->best[0] == '\0') {
            line[strcspn(line, "|")] = '\0';
            snprintf(out->best, sizeof out->best, "%.100s", line + 2);
        }
    }
    fclose(file);
}

static int compare_times(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run_case(const scale_arguments *args, const scale_case *c,
                     const char *dir, scale_result *out)
{
    char arguments[4096], log[PT_PATH_MAX + 32];
    expand(c->arguments, args->root, dir, arguments, sizeof arguments);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    double times[16];
    int runs = args->scale_runs < 16 ? args->scale_runs : 16;
    out->peak_mb = 0.0;
    for (int r = 0; r < runs; r++) {
        double peak = 0.0;
        out->status = run_partita(args->partita, arguments, log, &times[r],
                                  &peak);
        out->peak_mb = fmax(out->peak_mb, peak);
        if (out->status != 0)
            break;
    }
    qsort(times, (size_t)runs, sizeof times[0], compare_times);
    out->median_s = times[runs / 2];
    read_log(log, out);
}

static void print_case(const scale_case *c, const scale_result *r)
{
    char limit[48] = "-";
    if (c->limit_s > 0 && c->limit_mb > 0)
        snprintf(limit, sizeof limit, "%g s, %g MB", c->limit_s, c->limit_mb);
    else if (c->limit_s > 0)
        snprintf(limit, sizeof limit, "%g s", c->limit_s);
    bool met = r->status == 0 && (c->limit_s == 0 || r->median_s < c->limit_s) &&
               (c->limit_mb == 0 || r->peak_mb < c->limit_mb);
    printf("%-50.50s %9.3f %9.1f %-16s %-4s %-10s %s\n", c->label, r->median_s,
           r->peak_mb, limit, r->status != 0 ? "FAIL" : met ? "met" : "MISS",
           r->exact, r->best);
}

/* Writes n random clusters of 20 nodes of 2 to 4 types (the node kinds
 * of mixed-derived.json: A10, RTX 3090, A100-40GB, V100-32GB at 2, 4 or
 * 8 GPUs a node, random links) into dir; a fixed seed, so every run
 * times the same clusters. */
static int write_random_clusters(const char *dir, int n)
{
    static const char *const gpus[] = {"A10", "RTX3090", "A100-40GB",
                                       "V100-32GB"};
    static const int sizes[] = {2, 4, 8};
    uint64_t state = 0x2545f4914f6cdd1dULL;
    for (int i = 0; i < n; i++) {
        char path[PT_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/random-%d.json", dir, i);
        FILE *file = fopen(path, "w");
        if (file == NULL)
            return -1;
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        int types = 2 + (int)(state % 3), left = 20;
        fprintf(file, "{\"name\": \"random-20-%d\", \"nodes\": [", i);
        for (int t = 0; t < types; t++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            int count = t == types - 1
                            ? left
                            : 1 + (int)(state % (uint64_t)(left - (types - 1 - t)));
            left -= count;
            fprintf(file, "%s{\"name\": \"t%d\", \"count\": %d, \"gpu\": "
                    "\"%s\", \"gpus\": %d, \"intra_node\": {\"bandwidth_GBps\""
                    ": %d, \"latency_us\": 5}, \"inter_node\": "
                    "{\"bandwidth_Gbps\": %d, \"latency_us\": 20}}",
                    t ? ", " : "", t, count, gpus[(state >> 8) % 4],
                    sizes[(state >> 16) % 3], 16 + (int)((state >> 24) % 285),
                    25 + (int)((state >> 40) % 376));
        }
        fprintf(file, "]}\n");
        fclose(file);
    }
    return 0;
}

static const scale_case fixed_cases[] = {
    {"plan GPT-2 XL, hetero (32 GPUs), gbs 64",
     "plan --model gpt2-xl --cluster hetero --gbs 64 --quiet -o {out}/p.json",
     0.020, 50},
    {"estimate of that 32-GPU plan", "estimate {out}/p.json", 0.020, 50},
    {"plan GPT 13B, mixed-96 (96 GPUs), gbs 512",
     "plan --model gpt-13b --cluster mixed-96 --gbs 512 --quiet -o {out}/p.json",
     1.0, 300},
    {"plan GPT 13B, mixed-160 (160 GPUs), gbs 512",
     "plan --model gpt-13b --cluster mixed-160 --gbs 512 --quiet -o {out}/p.json",
     1.0, 300},
    {"plan GPT 175B, mixed-1024 (1,024 GPUs), gbs 1536",
     "plan --model gpt-175b --cluster mixed-1024 --gbs 1536 --quiet -o {out}/p1024.json",
     10.0, 1024},
    {"estimate of that 1,024-GPU plan", "estimate {out}/p1024.json", 2.0, 0},
    {"report of that 1,024-GPU plan",
     "report {out}/p1024.json -o {out}/report", 2.0, 0},
    {"plan GPT 175B, h100-4096 (4,096 GPUs), gbs 2048",
     "plan --model gpt-175b --cluster h100-4096 --gbs 2048 --quiet -o {out}/p.json",
     10.0, 0},
    {"estimate GPT 175B on a100-384, tp 8 across nodes",
     "estimate {root}/docs/examples/plan-megatron-175b-a100.json", 2.0, 0},
};

int scale_table(const scale_arguments *args, pt_error *err)
{
    char dir[] = "/tmp/plan-scale-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return pt_fail(err, "plan_speed: cannot make a scratch folder");
    printf("#\n# issue 14's cases, each a whole `partita` process (%s); "
           "time: median of %d runs,\n# memory: peak resident (GNU time)\n",
           args->partita, args->scale_runs);
    printf("%-50s %9s %9s %-16s %-4s %-10s %s\n", "# command", "time (s)",
           "peak (MB)", "limit", "", "exact", "best plan");
    size_t count = sizeof fixed_cases / sizeof fixed_cases[0];
    for (size_t i = 0; i < count; i++) {
        scale_result r;
        run_case(args, &fixed_cases[i], dir, &r);
        print_case(&fixed_cases[i], &r);
    }
    if (args->with_exhaustive) {
        scale_case old = {"  the same, --search exhaustive (every order)",
                          "plan --model gpt-13b --cluster mixed-160 --gbs 512 "
                          "--quiet --search exhaustive -o {out}/p.json",
                          0, 0};
        scale_result r;
        run_case(args, &old, dir, &r);
        print_case(&old, &r);
    }
    int random = args->random_clusters;
    if (random > 0 && write_random_clusters(dir, random) != 0)
        return pt_fail(err, "plan_speed: cannot write the random clusters");
    double worst = 0.0, worst_mb = 0.0;
    int exact = 0, planned = 0;
    for (int i = 0; i < random; i++) {
        for (int m = 0; m < 2; m++) {
            char arguments[PT_PATH_MAX * 2];
            snprintf(arguments, sizeof arguments,
                     "plan --model %s --cluster {out}/random-%d.json --gbs %d "
                     "--quiet -o {out}/p.json",
                     m ? "gpt-13b" : "gpt2-xl", i, m ? 512 : 64);
            scale_case c = {"", arguments, 1.0, 300};
            scale_result r;
            run_case(args, &c, dir, &r);
            char label[64];
            snprintf(label, sizeof label, "random 20-node cluster %d, %s", i,
                     m ? "GPT 13B" : "GPT-2 XL");
            c.label = label;
            print_case(&c, &r);
            worst = fmax(worst, r.median_s);
            worst_mb = fmax(worst_mb, r.peak_mb);
            planned += r.status == 0;
            exact += strcmp(r.exact, "yes") == 0;
        }
    }
    if (random > 0)
        printf("# %d random 20-node clusters x 2 models: %d planned (others "
               "fit no plan), %d exact, slowest %.2f s, largest %.0f MB\n",
               random, planned, exact, worst, worst_mb);
    char command[PT_PATH_MAX + 16];
    snprintf(command, sizeof command, "rm -rf %s", dir);
    if (system(command) != 0)
        fprintf(stderr, "plan_speed: could not remove %s\n", dir);
    return 0;
}
