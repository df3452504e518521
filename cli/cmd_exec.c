/* partita exec: train under a plan (one stage on one device, or
 * with pipeline, data and tensor parallelism) and write
 * run.json. */
#include "cli/cli.h"
#include "executor/executor.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Set by the signal handler, read by the run between iterations: a signal
 * handler cannot take arguments, so this one flag lives at file scope. */
static volatile sig_atomic_t stop_requested;
static volatile sig_atomic_t stop_signal;

static const char *signal_name(int signal_number)
{
    return signal_number == SIGINT    ? "SIGINT"
           : signal_number == SIGTERM ? "SIGTERM"
                                      : "a signal";
}

/* Says at once that the signal was seen (write(2) is safe in a handler,
 * stdio is not); the run says later which iteration it interrupted. */
static void request_stop(int signal_number)
{
    stop_requested = 1;
    stop_signal = signal_number;
    static const char message[] =
        "\npartita exec: %s received: stopping (a one-stage run abandons "
        "the iteration in progress, a parallel one finishes its step), "
        "then saving what finished; a second signal ends at once, "
        "without run.json\n";
    const char *name = signal_name(signal_number);
    const char *percent = strchr(message, '%');
    ssize_t ignored = write(STDERR_FILENO, message,
                            (size_t)(percent - message));
    ignored = write(STDERR_FILENO, name, strlen(name));
    ignored = write(STDERR_FILENO, percent + 2, strlen(percent + 2));
    (void)ignored;
}

/* SA_RESETHAND: a second Ctrl-C kills at once, for a user who will not
 * wait for the run to stop. SA_RESTART: a checkpoint being written when
 * the signal comes is not cut short by EINTR. */
static void install_stop_handlers(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = request_stop;
    action.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
}

static void print_exec_help(void)
{
    printf(
        "usage: partita exec PLAN --data PREFIX [options]\n"
        "\n"
        "Trains the plan's model on a Megatron dataset (PREFIX.bin /\n"
        "PREFIX.idx, see 'partita prep') and writes run.json: the plan, the\n"
        "device, every iteration's loss, gradient norm and time, the phase\n"
        "events of the median iteration and the measured step time.\n"
        "Plans with pp, dp or tp > 1 run their ranks as threads of this\n"
        "process: on the cpu backend over shared memory, on the cuda\n"
        "backend one GPU per rank over NCCL (or, --gpu-comm host, ranks\n"
        "sharing GPUs through host memory). Started by mpirun or srun,\n"
        "one process per rank instead (the process count must equal the\n"
        "plan's tp x dp x pp): rank 0 prints the log and writes run.json.\n"
        "\n"
        "  --data PREFIX        the dataset (required)\n"
        "  --backend NAME       cpu (default) or cuda\n"
        "  --iters N            iterations of the run, counted from the start\n"
        "                       of training (a resumed run continues to N);\n"
        "                       default 100\n"
        "  --log-interval K     print a log line every K iterations (10)\n"
        "  --seed S             initialisation and data order (1234; a\n"
        "                       resumed run takes the checkpoint's)\n"
        "  --lr X               peak learning rate (6e-4)\n"
        "  --warmup N           warm-up iterations (10%% of --iters)\n"
        "  --min-lr X           learning rate at the end of the cosine decay\n"
        "                       (--lr / 10)\n"
        "  --grad-precision G   the main gradients: fp32 (Megatron-LM's bf16\n"
        "                       recipe) or bf16 (llm.c's; precision bf16\n"
        "                       only); default: the plan's grad_precision\n"
        "  --deterministic      the same bits on every run (Megatron-LM's\n"
        "                       --deterministic-mode; or the plan's\n"
        "                       \"deterministic\": true): cuDNN's attention\n"
        "                       backward without atomics, 1-2 %% slower and\n"
        "                       its workspace larger; default: dQ summed in\n"
        "                       fp32 with atomics, as Megatron-LM does\n"
        "  --save DIR           write checkpoints here: every\n"
        "                       --save-interval iterations and at the end;\n"
        "                       one run at a time saves into a DIR\n"
        "  --save-interval N    iterations between checkpoints (0: at the\n"
        "                       end only)\n"
        "  --keep-checkpoints N generations of checkpoints kept in DIR, the\n"
        "                       newest included (2); an older one loads\n"
        "                       from its folder, --load DIR/gen-NNNNNN\n"
        "  --overwrite          --save into a DIR that holds a checkpoint\n"
        "                       this run does not --load (else refused;\n"
        "                       never into another program's folder)\n"
        "  --load DIR           resume from the checkpoint in DIR\n"
        "  --comm-timeout S     parallel runs: seconds a rank waits for a\n"
        "                       peer before the run fails (3600 on cpu,\n"
        "                       300 on cuda)\n"
        "  --gpu-comm KIND      cuda backend, ranks as threads: nccl (a GPU\n"
        "                       per rank), host (through host memory: slow,\n"
        "                       but ranks may share a GPU, each in its own\n"
        "                       slice of SMs), or auto (default: nccl when\n"
        "                       built and no two ranks share a GPU)\n"
        "  --launch MODE        auto (default): one process per rank when\n"
        "                       started by mpirun or srun with more than one\n"
        "                       process, else threads; threads; or mpi\n"
        "  -o, --output FILE    run record (default run.json; - for standard\n"
        "                       output, the log then on standard error)\n"
        "\n"
        "SIGINT or SIGTERM stops the run: a one-stage run abandons the\n"
        "iteration in progress, a parallel one finishes its step; the\n"
        "checkpoint (with --save) and run.json of the iterations that\n"
        "finished are written, exit status 128 + the signal (130, 143).\n"
        "Exit status 2 for bad input (plan, dataset, checkpoint, options,\n"
        "memory), 1 when training fails part-way (a NaN or infinite loss,\n"
        "say): run.json then holds the iterations done and the reason.\n");
}

/* The command line, parsed. */
typedef struct exec_arguments {
    const char *plan_path;
    const char *data_prefix;
    const char *backend;
    const char *output;
    const char *save_dir;
    const char *load_dir;
    const char *launch;       /* auto, threads or mpi */
    const char *gpu_comm;     /* auto, nccl or host */
    const char *grad_precision; /* NULL: the plan's */
    long iterations;
    long log_interval;
    long save_interval;
    long checkpoint_keep;
    long warmup;              /* -1: 10% of the iterations */
    double lr;
    double min_lr;            /* < 0: lr / 10 */
    double comm_timeout_s;    /* 0: the run's default */
    unsigned long long seed;
    bool seed_given;
    bool save_interval_given;
    bool checkpoint_keep_given;
    bool overwrite;
    bool deterministic;       /* false: the plan's */
} exec_arguments;

/* Whole-string integer in [min, max]; prints its own message. */
static int parse_count(const char *option, const char *text, long min,
                       long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min ||
        value > max) {
        fprintf(stderr, "partita exec: --%s: expected an integer from %ld to "
                        "%ld, got '%s'\n",
                option, min, max, text);
        return -1;
    }
    *out = value;
    return 0;
}

static int parse_rate(const char *option, const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) ||
        value < 0.0 || value > 1.0) {
        fprintf(stderr, "partita exec: --%s: expected a learning rate from 0 "
                        "to 1, got '%s'\n",
                option, text);
        return -1;
    }
    *out = value;
    return 0;
}

static int parse_seed(const char *text, exec_arguments *args)
{
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' ||
        value > (unsigned long long)INT64_MAX) {
        fprintf(stderr, "partita exec: --seed: expected an integer from 0 to "
                        "2^63 - 1, got '%s'\n",
                text);
        return -1;
    }
    args->seed = value;
    args->seed_given = true;
    return 0;
}

enum {
    OPT_DATA = 256, OPT_BACKEND, OPT_ITERS, OPT_LOG_INTERVAL, OPT_SEED,
    OPT_LR, OPT_WARMUP, OPT_MIN_LR, OPT_SAVE, OPT_LOAD, OPT_SAVE_INTERVAL,
    OPT_COMM_TIMEOUT, OPT_LAUNCH, OPT_GPU_COMM, OPT_KEEP_CHECKPOINTS,
    OPT_OVERWRITE, OPT_GRAD_PRECISION, OPT_DETERMINISTIC, OPT_HELP
};

/* Seconds, positive and finite; prints its own message. */
static int parse_seconds(const char *option, const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) ||
        !(value > 0.0)) {
        fprintf(stderr, "partita exec: --%s: expected a positive number of "
                        "seconds, got '%s'\n",
                option, text);
        return -1;
    }
    *out = value;
    return 0;
}

/* One option's value into args; -1 on a bad value (already printed). */
static int apply_option(int option, const char *value, exec_arguments *args)
{
    switch (option) {
    case OPT_DATA: args->data_prefix = value; return 0;
    case OPT_BACKEND: args->backend = value; return 0;
    case 'o': args->output = value; return 0;
    case OPT_SAVE: args->save_dir = value; return 0;
    case OPT_LOAD: args->load_dir = value; return 0;
    case OPT_LAUNCH: args->launch = value; return 0;
    case OPT_GPU_COMM: args->gpu_comm = value; return 0;
    case OPT_GRAD_PRECISION: args->grad_precision = value; return 0;
    case OPT_ITERS:
        return parse_count("iters", value, 1, 1000000000L, &args->iterations);
    case OPT_LOG_INTERVAL:
        return parse_count("log-interval", value, 1, 1000000000L,
                           &args->log_interval);
    case OPT_SAVE_INTERVAL:
        args->save_interval_given = true;
        return parse_count("save-interval", value, 0, 1000000000L,
                           &args->save_interval);
    case OPT_WARMUP:
        return parse_count("warmup", value, 0, 1000000000L, &args->warmup);
    case OPT_KEEP_CHECKPOINTS:
        args->checkpoint_keep_given = true;
        return parse_count("keep-checkpoints", value, 1, 1000,
                           &args->checkpoint_keep);
    case OPT_OVERWRITE: args->overwrite = true; return 0;
    case OPT_DETERMINISTIC: args->deterministic = true; return 0;
    case OPT_SEED: return parse_seed(value, args);
    case OPT_LR: return parse_rate("lr", value, &args->lr);
    case OPT_MIN_LR: return parse_rate("min-lr", value, &args->min_lr);
    case OPT_COMM_TIMEOUT:
        return parse_seconds("comm-timeout", value, &args->comm_timeout_s);
    default: return -1;
    }
}

static bool one_of(const char *value, const char *a, const char *b,
                   const char *c)
{
    return strcmp(value, a) == 0 || strcmp(value, b) == 0 ||
           strcmp(value, c) == 0;
}

/* Checks between options, once all are read. */
static int check_arguments(const exec_arguments *args)
{
    const char *problem = NULL;
    char text[160];
    if (args->data_prefix == NULL)
        problem = "--data PREFIX is required (the dataset to train on; "
                  "'partita prep' makes one)";
    else if (!one_of(args->launch, "auto", "threads", "mpi")) {
        snprintf(text, sizeof text, "--launch: expected auto, threads or "
                                    "mpi, got '%.60s'",
                 args->launch);
        problem = text;
    } else if (args->grad_precision != NULL &&
               !one_of(args->grad_precision, "fp32", "bf16", "fp32")) {
        snprintf(text, sizeof text, "--grad-precision: expected fp32 or "
                                    "bf16, got '%.60s'",
                 args->grad_precision);
        problem = text;
    } else if (!one_of(args->gpu_comm, "auto", "nccl", "host")) {
        snprintf(text, sizeof text, "--gpu-comm: expected auto, nccl or "
                                    "host, got '%.60s'",
                 args->gpu_comm);
        problem = text;
    }
    else if (args->save_interval_given && args->save_dir == NULL)
        problem = "--save-interval needs --save DIR";
    else if (args->checkpoint_keep_given && args->save_dir == NULL)
        problem = "--keep-checkpoints needs --save DIR";
    else if (args->overwrite && args->save_dir == NULL)
        problem = "--overwrite needs --save DIR (it lets a save replace "
                  "the checkpoint there)";
    else if (args->warmup > args->iterations) {
        snprintf(text, sizeof text, "--warmup %ld is more than the %ld "
                                    "iterations of the run (--iters)",
                 args->warmup, args->iterations);
        problem = text;
    } else if (args->min_lr > args->lr) {
        snprintf(text, sizeof text, "--min-lr %g is above --lr %g",
                 args->min_lr, args->lr);
        problem = text;
    }
    if (problem != NULL) {
        fprintf(stderr, "partita exec: %s\n", problem);
        return -1;
    }
    return 0;
}

/* 0 to run, 1 when help was printed, -1 on bad arguments. */
static int parse_exec_arguments(int argc, char **argv, exec_arguments *args)
{
    static const struct option options[] = {
        {"data", required_argument, NULL, OPT_DATA},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"iters", required_argument, NULL, OPT_ITERS},
        {"log-interval", required_argument, NULL, OPT_LOG_INTERVAL},
        {"seed", required_argument, NULL, OPT_SEED},
        {"lr", required_argument, NULL, OPT_LR},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"min-lr", required_argument, NULL, OPT_MIN_LR},
        {"save", required_argument, NULL, OPT_SAVE},
        {"load", required_argument, NULL, OPT_LOAD},
        {"save-interval", required_argument, NULL, OPT_SAVE_INTERVAL},
        {"keep-checkpoints", required_argument, NULL, OPT_KEEP_CHECKPOINTS},
        {"overwrite", no_argument, NULL, OPT_OVERWRITE},
        {"deterministic", no_argument, NULL, OPT_DETERMINISTIC},
        {"comm-timeout", required_argument, NULL, OPT_COMM_TIMEOUT},
        {"launch", required_argument, NULL, OPT_LAUNCH},
        {"gpu-comm", required_argument, NULL, OPT_GPU_COMM},
        {"grad-precision", required_argument, NULL, OPT_GRAD_PRECISION},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    *args = (exec_arguments){.backend = "cpu", .output = "run.json",
                             .launch = "auto", .gpu_comm = "auto",
                             .iterations = 100, .log_interval = 10,
                             .warmup = -1, .lr = 6e-4, .min_lr = -1.0,
                             .seed = 1234, .checkpoint_keep = 2};
    optind = 1;
    int option;
    while ((option = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        if (option == OPT_HELP || option == 'h') {
            print_exec_help();
            return 1;
        }
        if (option == '?' || apply_option(option, optarg, args) != 0)
            return -1;
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "partita exec: expected one plan file "
                        "(see 'partita exec --help')\n");
        return -1;
    }
    args->plan_path = argv[optind];
    if (args->min_lr < 0)
        args->min_lr = args->lr / 10.0;
    if (args->warmup < 0)
        args->warmup = args->iterations / 10;
    return check_arguments(args);
}

/* What the per-iteration printer remembers between calls. */
typedef struct exec_printer {
    long log_interval;
    double flops_per_iteration;
    long logged_count;          /* iterations covered by earlier lines */
    long reported_checkpoint;   /* last checkpoint iteration announced */
    const char *save_dir;
    bool progress;              /* stderr is a terminal: draw a bar */
    double started_s;
    double load_line_s;         /* when the last checking line came */
} exec_printer;

static void clear_progress(const exec_printer *printer)
{
    if (printer->progress)
        fputs("\r\033[K", stderr);
}

/* While --load checks the checkpoint and restores from it: a line every
 * 5 s and after the last blob of each, so a batch log shows the wait
 * going on (GPT-2 1.5B's tp 2 checkpoint is 18 GB). */
static void observe_load(const char *what, uint64_t bytes_done,
                         uint64_t bytes_total, int blobs_done, int blob_count,
                         void *data)
{
    exec_printer *printer = data;
    double now = pt_monotonic_seconds();
    if (blobs_done < blob_count && now - printer->load_line_s < 5.0)
        return;
    printer->load_line_s = now;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("checkpoint: %s %.1f of %.1f GiB (%d of %d blobs) in %.0f s\n",
           what, (double)bytes_done / gib, (double)bytes_total / gib,
           blobs_done, blob_count, now - printer->started_s);
    fflush(stdout);
}

/* Megatron's line: averages over the interval for time and loss, the last
 * iteration's norm and rate. */
static void print_log_line(exec_printer *printer, const run_result *r)
{
    const run_iteration *latest = &r->iterations[r->iteration_count - 1];
    double time_sum = 0.0, loss_sum = 0.0;
    long count = r->iteration_count - printer->logged_count;
    for (long i = printer->logged_count; i < r->iteration_count; i++) {
        time_sum += r->iterations[i].step_time_s;
        loss_sum += r->iterations[i].loss;
    }
    double step_s = time_sum / (double)count;
    clear_progress(printer);
    printf("iteration %8ld/%8ld | elapsed time per iteration (ms): %.1f | "
           "tokens/s: %.0f | TFLOP/s per GPU: %.3g | lm loss: %.3E | "
           "grad norm: %.3f | learning rate: %.3E | memory (GiB): %.3g\n",
           latest->iteration, r->last_iteration, step_s * 1e3,
           step_s > 0 ? (double)r->tokens_per_iteration / step_s : 0.0,
           step_s > 0 ? printer->flops_per_iteration / step_s / 1e12 /
                            (r->rank_count > 0 ? r->rank_count : 1)
                      : 0.0,
           loss_sum / (double)count, latest->grad_norm,
           latest->learning_rate, r->peak_memory_bytes / PT_GIB);
    fflush(stdout);
    printer->logged_count = r->iteration_count;
}

static void print_progress(const exec_printer *printer, const run_result *r)
{
    const run_iteration *latest = &r->iterations[r->iteration_count - 1];
    long total = r->last_iteration - r->first_iteration + 1;
    long done = r->iteration_count;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int filled = (int)(WIDTH * done / total);
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    double elapsed = pt_monotonic_seconds() - printer->started_s;
    char left[32];
    pt_format_seconds(elapsed / (double)done * (double)(total - done), left,
                      sizeof left);
    fprintf(stderr, "\r\033[K[%s] iteration %ld/%ld, loss %.3f, %s left",
            bar, latest->iteration, r->last_iteration, latest->loss, left);
    fflush(stderr);
}

static void observe_iteration(const run_result *r, void *data)
{
    exec_printer *printer = data;
    const run_iteration *latest = &r->iterations[r->iteration_count - 1];
    if (latest->iteration % printer->log_interval == 0 ||
        latest->iteration == r->last_iteration || stop_requested)
        print_log_line(printer, r);
    if (r->last_checkpoint_iteration > printer->reported_checkpoint) {
        clear_progress(printer);
        printf("checkpoint: iteration %ld saved to %s\n",
               r->last_checkpoint_iteration, printer->save_dir);
        fflush(stdout);
        printer->reported_checkpoint = r->last_checkpoint_iteration;
    }
    if (printer->progress && latest->iteration < r->last_iteration &&
        !stop_requested)
        print_progress(printer, r);
}

/* Outputs that cannot be written are found before training, not after
 * an hour of it: run.json's folder, and --save's. */
static int check_outputs(const exec_arguments *args)
{
    if (cli_check_output("exec", args->output, false) != 0)
        return -1;
    if (args->save_dir != NULL &&
        cli_check_output("exec", args->save_dir, true) != 0)
        return -1;
    return 0;
}

static int build_run_options(const exec_arguments *args, run_options *out)
{
    pt_error err = {{0}};
    *out = run_options_defaults(args->iterations);
    if (backend_parse(args->backend, &out->backend, &err) != 0) {
        cli_error("exec", err.message);
        return -1;
    }
    out->data_prefix = args->data_prefix;
    out->seed = args->seed;
    out->seed_given = args->seed_given;
    out->train.schedule.max_lr = args->lr;
    out->train.schedule.min_lr = args->min_lr;
    out->train.schedule.warmup_steps = args->warmup;
    out->train.schedule.decay_steps = args->iterations;
    out->save_dir = args->save_dir;
    out->save_interval = args->save_interval;
    out->checkpoint_keep = (int)args->checkpoint_keep;
    out->overwrite_checkpoint = args->overwrite;
    out->load_dir = args->load_dir;
    out->comm_timeout_s = args->comm_timeout_s;
    out->gpu_comm = strcmp(args->gpu_comm, "nccl") == 0   ? RUN_GPU_COMM_NCCL
                    : strcmp(args->gpu_comm, "host") == 0 ? RUN_GPU_COMM_HOST
                                                          : RUN_GPU_COMM_AUTO;
    out->stop = &stop_requested;
    return 0;
}

/* run.json: the plan with model and cluster inline, and the record. */
static int write_run_record(const exec_arguments *args, const plan *p,
                            const run_result *result,
                            double flops_per_iteration)
{
    pt_error err = {{0}};
    json_t *plan_json = plan_to_json(p, NULL, &err);
    json_t *root = plan_json != NULL
                       ? run_to_json(result, plan_json, flops_per_iteration,
                                     &err)
                       : NULL;
    json_decref(plan_json);
    return cli_write_json("exec", root, args->output, &err);
}

static void print_summary(const exec_arguments *args, const plan *p,
                          const run_result *r, double flops_per_iteration)
{
    char step[32], memory[32];
    pt_format_seconds(r->step_time_s, step, sizeof step);
    pt_format_bytes(r->peak_memory_bytes, memory, sizeof memory);
    if (r->stopped)
        printf("exec: stopped early: %s\n", r->stop_reason);
    int ranks = r->rank_count > 0 ? r->rank_count : 1;
    char where[PT_NAME_MAX * 2 + 64];
    if (ranks > 1 && plan_first_asymmetric_stage(p) >= 0)
        snprintf(where, sizeof where,
                 "%d ranks (pp %d, each stage its tp x dp) of %s", ranks,
                 r->pp, r->device.name);
    else if (ranks > 1)
        snprintf(where, sizeof where,
                 "%d ranks (pp %d x dp %d x tp %d) of %s", ranks, r->pp,
                 r->dp, r->tp, r->device.name);
    else
        snprintf(where, sizeof where, "%s", r->device.name);
    printf("exec: %ld iterations on %s, median step time %s, %.0f tokens/s, "
           "%.3g TFLOP/s per GPU, memory %s%s\n",
           r->iteration_count, where, step, r->tokens_per_s,
           r->step_time_s > 0
               ? flops_per_iteration / r->step_time_s / 1e12 / ranks
               : 0.0,
           memory, ranks > 1 ? " (largest rank)" : "");
    if (r->last_checkpoint_iteration > 0)
        printf("exec: checkpoint of iteration %ld in %s\n",
               r->last_checkpoint_iteration, args->save_dir);
    for (int i = 0; i < r->note_count; i++)
        printf("exec: note: %s\n", r->notes[i]);
    printf("exec: wrote %s\n", cli_output_name(args->output));
}

/* The stop by a signal, for the log and the record: the iteration it
 * came during and what became of that iteration. */
static void describe_stop(run_result *r)
{
    long last = r->iteration_count > 0
                    ? r->iterations[r->iteration_count - 1].iteration
                    : r->first_iteration - 1;
    if (stop_signal == 0) { /* one process per rank: another's signal */
        snprintf(r->stop_reason, sizeof r->stop_reason,
                 "stopped by a signal to another rank's process after "
                 "iteration %ld of %ld",
                 last, r->last_iteration);
        return;
    }
    const char *name = signal_name((int)stop_signal);
    if (r->interrupted_iteration > 0)
        snprintf(r->stop_reason, sizeof r->stop_reason,
                 "%s during iteration %ld of %ld: that iteration was "
                 "abandoned (nothing of it applied); the last that "
                 "finished is %ld",
                 name, r->interrupted_iteration, r->last_iteration, last);
    else
        snprintf(r->stop_reason, sizeof r->stop_reason,
                 "%s during iteration %ld of %ld: that iteration finished, "
                 "then the run stopped",
                 name, last, r->last_iteration);
}

/* One process per rank: say which process speaks, unless the message (a
 * comm's) already begins with its rank. */
static void print_failure(const pt_error *err, bool processes, int rank)
{
    char message[sizeof err->message + 32];
    if (processes && strncmp(err->message, "rank ", 5) != 0)
        snprintf(message, sizeof message, "rank %d: %s", rank, err->message);
    else
        snprintf(message, sizeof message, "%s", err->message);
    cli_error("exec", message);
}

/* run.json of the iterations that finished, after a full run, a stop or
 * a failure part-way (whose reason it keeps), and the summary; nothing
 * when no iteration finished. -1 when run.json could not be written. */
static int record_what_finished(const exec_arguments *args, const plan *p,
                                run_result *r, double flops)
{
    if (r->iteration_count == 0 || r->events == NULL) {
        if (r->stopped)
            printf("exec: %s; no iteration %s, so no run.json was "
                   "written\n",
                   r->stop_reason,
                   r->iteration_count == 0 ? "of this run finished"
                                           : "could be summarised");
        return 0;
    }
    if (write_run_record(args, p, r, flops) != 0)
        return -1;
    print_summary(args, p, r, flops);
    return 0;
}

/* run.json must not replace an input: the plan (and the files it
 * names) or the dataset's two files. */
static int check_output_not_input(const exec_arguments *args, const plan *p)
{
    if (cli_check_not_plan_input("exec", args->output, args->plan_path,
                                 p) != 0)
        return -1;
    const char *const suffixes[] = {".bin", ".idx"};
    for (int i = 0; i < 2; i++) {
        char path[PT_PATH_MAX + 8];
        snprintf(path, sizeof path, "%s%s", args->data_prefix, suffixes[i]);
        if (cli_check_not_input("exec", args->output, path, "dataset") != 0)
            return -1;
    }
    return 0;
}

/* --grad-precision in place of the plan's grad_precision, checked
 * against its precision as the plan's own field is. */
static int override_grad_precision(const exec_arguments *args, plan *p)
{
    if (args->grad_precision == NULL)
        return 0;
    pt_error err = {{0}};
    if (grad_precision_parse(args->grad_precision,
                             &p->config.grad_precision, &err) != 0 ||
        parallel_check_grad_precision(&p->config, &err) != 0) {
        char message[sizeof err.message + 64];
        snprintf(message, sizeof message, "--grad-precision %s: %s",
                 args->grad_precision, err.message);
        cli_error_in("exec", args->plan_path, message);
        return -1;
    }
    return 0;
}

static int load_exec_plan(const exec_arguments *args, plan *p)
{
    pt_error err = {{0}};
    if (plan_load_file(args->plan_path, p, &err) != 0) {
        cli_error_in("exec", args->plan_path, err.message);
        plan_free(p);
        return -1;
    }
    if (override_grad_precision(args, p) != 0) {
        plan_free(p);
        return -1;
    }
    if (args->deterministic)
        p->config.deterministic = true;
    if (run_check_plan(p, &err) != 0) {
        cli_error_in("exec", args->plan_path, err.message);
        plan_free(p);
        return -1;
    }
    if (check_output_not_input(args, p) != 0) {
        plan_free(p);
        return -1;
    }
    return 0;
}

/* How many processes the launcher that started this one started: Open
 * MPI's mpirun, a PMI launcher (MPICH's, srun --mpi=pmi2) or Slurm's
 * srun each tell their processes; 1 when none did. */
static long launched_process_count(void)
{
    const char *const variables[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                     "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof variables / sizeof variables[0]; i++) {
        const char *value = getenv(variables[i]);
        /* an sbatch script has SLURM_NTASKS too, but only srun's tasks
         * have a step */
        if (i == 2 && getenv("SLURM_STEP_ID") == NULL)
            continue;
        if (value != NULL && atol(value) > 0)
            return atol(value);
    }
    return 1;
}

/* --launch: the MPI world of one process per rank, or NULL for threads.
 * -1 when MPI was asked for (or detected) and cannot start. */
static int start_processes(const exec_arguments *args,
                           const run_options *options, comm_mpi **out)
{
    *out = NULL;
    long launched = launched_process_count();
    bool wanted = strcmp(args->launch, "mpi") == 0 ||
                  (strcmp(args->launch, "auto") == 0 && launched > 1);
    if (!wanted)
        return 0;
    pt_error err = {{0}};
    if (comm_mpi_create(run_comm_timeout(options), out, &err) == 0)
        return 0;
    char message[1300];
    snprintf(message, sizeof message, "%s%s", err.message,
             launched > 1 && !comm_mpi_built()
                 ? " (started as one of several processes: each would "
                   "otherwise run every rank)"
                 : "");
    cli_error("exec", message);
    return -1;
}

int command_exec(int argc, char **argv)
{
    install_stop_handlers();
    exec_arguments args;
    int parsed = parse_exec_arguments(argc, argv, &args);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    run_options options;
    if (build_run_options(&args, &options) != 0 ||
        check_outputs(&args) != 0)
        return EXIT_BAD_INPUT;
    if (strcmp(args.output, "-") == 0)
        cli_text_to_stderr();
    plan p;
    if (load_exec_plan(&args, &p) != 0)
        return EXIT_BAD_INPUT;
    comm_mpi *processes = NULL;
    if (start_processes(&args, &options, &processes) != 0) {
        plan_free(&p);
        return EXIT_BAD_INPUT;
    }
    options.processes = processes;
    int rank = processes != NULL ? comm_mpi_handle(processes).rank : 0;
    double flops = model_flops_per_iteration(&p.model, p.config.gbs, false);
    exec_printer printer = {
        .log_interval = args.log_interval,
        .flops_per_iteration = flops,
        .save_dir = args.save_dir,
        .progress = isatty(STDERR_FILENO) != 0,
        .started_s = pt_monotonic_seconds(),
    };
    printer.load_line_s = printer.started_s;
    /* one process per rank: rank 0 speaks for the run */
    if (rank == 0) {
        options.observer = observe_iteration;
        options.load_observer = observe_load;
        options.observer_data = &printer;
    }
    /* a large checkpoint is read whole and checked against its crc32s
     * before the first iteration's line: say what the run waits on (the
     * two ranks of a 1.5B model's tp 2 hold 18 GB) */
    if (rank == 0 && args.load_dir != NULL) {
        printf("checkpoint: loading %s (every blob read and checked "
               "against its crc32 before the first iteration)\n",
               args.load_dir);
        fflush(stdout);
    }
    pt_error err = {{0}};
    run_result result;
    int status = run_training(&p, &options, &result, &err);
    clear_progress(&printer);
    if (status != 0)
        print_failure(&err, processes != NULL, rank);
    else if (result.stopped)
        describe_stop(&result);
    int exit_status = status == -1 ? EXIT_BAD_INPUT
                      : status != 0 ? EXIT_FAILURE_RUN
                      : stop_signal != 0 ? 128 + (int)stop_signal
                                         : EXIT_OK;
    if (status != -1 && rank == 0 &&
        record_what_finished(&args, &p, &result, flops) != 0 &&
        exit_status == EXIT_OK)
        exit_status = EXIT_FAILURE_RUN;
    run_result_free(&result);
    plan_free(&p);
    fflush(stdout);
    comm_mpi_finish(processes, exit_status);
    return exit_status;
}
