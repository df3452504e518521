/*
 * partita profile, measuring (in partita-exec, the executable that loads
 * the GPU stack): measures what the parts of a model cost on the GPU at
 * hand (executor's profiler) and writes profiles/<gpu>.json, source
 * "measured", with its provenance. `partita` itself parses the arguments
 * first and runs --derive and --compare (cli/cmd_profile.c).
 * docs/profiles.md ("Measuring") describes the measurement.
 */
#include "cli/cli.h"
#include "executor/executor.h"
#include "profiler/profiler.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NCCL curves: 4 KiB to 1 GiB, every power of two. */
#define COMM_MIN_BYTES 4096.0
#define COMM_MAX_BYTES (1024.0 * 1024.0 * 1024.0)
/* Memory the measurement cannot see taken before the model: cuBLAS
 * workspaces and NCCL buffers, on top of the measured CUDA context. */
#define WORKSPACE_ALLOWANCE_GIB 0.5

/* "1,2,4" into values; -1 (printed) on anything else. */
static int parse_list(const char *option, const char *text, int *values,
                      int *count)
{
    *count = 0;
    const char *at = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long value = strtol(at, &end, 10);
        if (errno != 0 || end == at || value < 1 || value > 1024 ||
            *count == PROFILER_MAX_VALUES || (*end != ',' && *end != '\0') ||
            at[0] == '+' || at[0] == ' ')
            return profile_bad_argument(option, "a comma-separated list of integers "
                                        "from 1 to 1024 (at most 16)",
                                text);
        values[(*count)++] = (int)value;
        if (*end == '\0')
            return 0;
        at = end + 1;
    }
}

/* ------------------------------------------------------------ progress */

static void print_progress(int done, int total, const char *label,
                           const profiled_point *point, void *data)
{
    (void)data;
    enum { WIDTH = 20 };
    char bar[WIDTH + 1];
    int filled = total > 0 ? WIDTH * done / total : WIDTH;
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "[%s] %3d/%-3d %s", bar, done, total, label);
    if (point != NULL) {
        const profiled_part *parts[] = {&point->embedding, &point->layer,
                                        &point->head};
        static const char *const names[] = {"embedding", "layer", "head"};
        double spread = 0.0;
        for (int i = 0; i < 3; i++) {
            fprintf(stderr, "%s %s %.3f / %.3f ms", i == 0 ? ":" : ",",
                    names[i], parts[i]->forward.median_s * 1e3,
                    parts[i]->backward.median_s * 1e3);
            spread = fmax(spread, fmax(parts[i]->forward.spread,
                                       parts[i]->backward.spread));
        }
        fprintf(stderr, " (forward / backward; spread up to %.1f %%)",
                100.0 * spread);
    }
    fputc('\n', stderr);
    fflush(stderr);
}

/* ---------------------------------------------------------- the device */

/* The profile's name for a device: its first word with a digit, cut at
 * a '-' ("NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" ->
 * "A100"), and "-<N>SM" under an SM limit. */
static void default_gpu_name(const profiled_device *device,
                             backend_kind backend, int sm_limit, char *out,
                             size_t size)
{
    if (backend == BACKEND_CPU) {
        pt_copy_string(out, size, "cpu");
        return;
    }
    char words[256];
    pt_copy_string(words, sizeof words, device->name);
    char *save = NULL, *chosen = NULL;
    for (char *word = strtok_r(words, " ", &save); word != NULL;
         word = strtok_r(NULL, " ", &save))
        if (strpbrk(word, "0123456789") != NULL) {
            chosen = word;
            break;
        }
    if (chosen == NULL)
        chosen = "GPU";
    chosen[strcspn(chosen, "-/")] = '\0';
    if (sm_limit > 0)
        snprintf(out, size, "%s-%dSM", chosen, sm_limit);
    else
        pt_copy_string(out, size, chosen);
}

/* Spec-sheet figures (shared/reference/gpu-specs.md) of the GPUs whose
 * profiles carry an efficiency block. */
typedef struct gpu_spec_row {
    const char *model;
    double peak_tflops;          /* dense BF16 tensor */
    double memory_bandwidth_GBps;
} gpu_spec_row;

static const gpu_spec_row gpu_spec_rows[] = {
    {"H100", 989.0, 3350.0},
    {"H200", 989.0, 4800.0},
};

static const gpu_spec_row *find_spec_row(const char *device_name)
{
    for (size_t i = 0; i < sizeof gpu_spec_rows / sizeof *gpu_spec_rows; i++)
        if (gpu_name_matches(gpu_spec_rows[i].model, device_name))
            return &gpu_spec_rows[i];
    return NULL;
}

/* --------------------------------------------------------------- JSON */

/* Collects failures of json_object_set_new so a profile is either whole
 * or not written. */
static void put(json_t *obj, const char *key, json_t *value, int *failures)
{
    if (value == NULL || json_object_set_new(obj, key, value) != 0)
        (*failures)++;
}

static void push(json_t *array, json_t *value, int *failures)
{
    if (value == NULL || json_array_append_new(array, value) != 0)
        (*failures)++;
}

static json_t *part_json(const profiled_part *part, int *failures)
{
    json_t *obj = json_object();
    put(obj, "forward_s", json_real(part->forward.median_s), failures);
    put(obj, "backward_s", json_real(part->backward.median_s), failures);
    put(obj, "forward_spread", json_real(part->forward.spread), failures);
    put(obj, "backward_spread", json_real(part->backward.spread), failures);
    return obj;
}

static json_t *shape_json(const model_shape *shape, const profiler_result *r,
                          int *failures)
{
    json_t *obj = json_object();
    put(obj, "hidden", json_integer(shape->hidden), failures);
    put(obj, "heads", json_integer(shape->heads), failures);
    put(obj, "ffn_hidden", json_integer(shape->ffn_hidden), failures);
    put(obj, "seq", json_integer(shape->seq), failures);
    put(obj, "vocab", json_integer(shape->vocab), failures);
    json_t *costs = json_array();
    for (int i = 0; i < r->point_count; i++) {
        const profiled_point *point = &r->points[i];
        json_t *entry = json_object();
        put(entry, "tp", json_integer(point->tp), failures);
        put(entry, "mbs", json_integer(point->mbs), failures);
        put(entry, "embedding", part_json(&point->embedding, failures),
            failures);
        put(entry, "layer", part_json(&point->layer, failures), failures);
        put(entry, "head", part_json(&point->head, failures), failures);
        push(costs, entry, failures);
    }
    put(obj, "costs", costs, failures);
    return obj;
}

static json_t *curve_json(const profiled_comm_sample *samples, int count,
                          int gpus, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; i < count; i++) {
        json_t *entry = json_object();
        put(entry, "gpus", json_integer(gpus), failures);
        put(entry, "bytes", json_real(samples[i].bytes), failures);
        put(entry, "time_s", json_real(samples[i].time.median_s), failures);
        put(entry, "spread", json_real(samples[i].time.spread), failures);
        push(array, entry, failures);
    }
    return array;
}

/* The models of --model, each measured into a shape of the profile. */
#define MAX_MODELS 8

/* What the measurement ran and how the numbers were reduced. The first
 * model's result gives the device and the optimizer figure. */
typedef struct profile_context {
    const profile_arguments *args;
    int model_count;
    const model_shape *shapes;          /* model_count */
    const profiler_options *options;
    const profiler_result *results;     /* model_count */
    const profiler_result *result;      /* results[0] */
    const profiler_comm_result *comm;   /* NULL: no curves */
    const char *comm_reason;            /* why none, when comm is NULL */
    const char *gpu;
    const char *command_line;
    char date_utc[32];
} profile_context;

static json_t *optimizer_provenance(const profiler_result *r, int *failures)
{
    json_t *obj = json_object();
    put(obj, "layer_step_s", json_real(r->optimizer_layer.median_s),
        failures);
    put(obj, "layer_parameters", json_real(r->layer_parameters), failures);
    put(obj, "embedding_step_s", json_real(r->optimizer_embedding.median_s),
        failures);
    put(obj, "embedding_parameters", json_real(r->embedding_parameters),
        failures);
    put(obj, "used",
        json_string("the layer stage's step per parameter: real stages are "
                    "mostly layers"),
        failures);
    return obj;
}

static json_t *runs_provenance(const profiler_options *o,
                               const profiler_result *r, int *failures)
{
    json_t *obj = json_object();
    put(obj, "warmup", json_integer(r->runs_warmup), failures);
    put(obj, "timed_max", json_integer(r->runs_timed_max), failures);
    put(obj, "timed_min", json_integer(r->runs_timed_min), failures);
    put(obj, "point_budget_s", json_real(o->point_budget_s), failures);
    put(obj, "device_warmup_s", json_real(o->device_warmup_s), failures);
    return obj;
}

static json_t *device_provenance(const profile_context *ctx, int *failures)
{
    const profiled_device *d = &ctx->result->device;
    json_t *obj = json_object();
    put(obj, "device", json_string(d->name), failures);
    put(obj, "backend", json_string(backend_name(ctx->options->backend)),
        failures);
    if (ctx->options->backend == BACKEND_CUDA) {
        put(obj, "sms", json_integer(d->sms), failures);
        put(obj, "sms_used", json_integer(d->sms_used), failures);
        put(obj, "driver", json_string(d->driver_version[0] != '\0'
                                           ? d->driver_version
                                           : "unknown"),
            failures);
        put(obj, "driver_cuda", json_string(d->driver_cuda_version),
            failures);
        put(obj, "cuda_runtime", json_string(d->runtime_cuda_version),
            failures);
        put(obj, "context_gib", json_real(d->context_bytes / PT_GIB),
            failures);
    }
    if (ctx->args->sm_limit > 0)
        put(obj, "sm_limit", json_integer(ctx->args->sm_limit), failures);
    if (ctx->args->memory_limit_gib > 0)
        put(obj, "memory_limit_gib", json_real(ctx->args->memory_limit_gib),
            failures);
    return obj;
}

/* The models' names, "gpt2-xl, gpt2-xl-26h". */
static void join_model_names(const profile_context *ctx, char *out,
                             size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < ctx->model_count && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s",
                                 i > 0 ? ", " : "", ctx->shapes[i].name);
}

/* Every model's notes, named by model when there are several. */
static json_t *skipped_json(const profile_context *ctx, int *failures)
{
    json_t *skipped = json_array();
    for (int m = 0; m < ctx->model_count; m++)
        for (int i = 0; i < ctx->results[m].note_count; i++) {
            char note[PT_NAME_MAX + 340];
            snprintf(note, sizeof note, "%s%s%s",
                     ctx->model_count > 1 ? ctx->shapes[m].name : "",
                     ctx->model_count > 1 ? ": " : "",
                     ctx->results[m].notes[i]);
            push(skipped, json_string(note), failures);
        }
    return skipped;
}

static double measured_seconds(const profile_context *ctx)
{
    double seconds = ctx->comm != NULL ? ctx->comm->elapsed_s : 0.0;
    for (int m = 0; m < ctx->model_count; m++)
        seconds += ctx->results[m].elapsed_s;
    return seconds;
}

static json_t *provenance_json(const profile_context *ctx, int *failures)
{
    const profiler_result *r = ctx->result;
    json_t *obj = device_provenance(ctx, failures);
    put(obj, "date_utc", json_string(ctx->date_utc), failures);
    put(obj, "command", json_string(ctx->command_line), failures);
    put(obj, "partita_version", json_string(PARTITA_VERSION), failures);
    char models[MAX_MODELS * (PT_NAME_MAX + 2)];
    join_model_names(ctx, models, sizeof models);
    put(obj, "model", json_string(models), failures);
    put(obj, "timing",
        json_string("host clock around each synchronous call of the stage "
                    "(the call returns with its work finished); tp > 1: "
                    "shard 0 computed alone, without the tp all-reduces"),
        failures);
    put(obj, "statistic", json_string("median of the timed runs"), failures);
    put(obj, "spread",
        json_string("forward_spread, backward_spread, spread: interquartile "
                    "range of the timed runs over their median"),
        failures);
    put(obj, "runs", runs_provenance(ctx->options, r, failures), failures);
    put(obj, "optimizer", optimizer_provenance(r, failures), failures);
    char comm_text[512];
    if (ctx->comm != NULL)
        snprintf(comm_text, sizeof comm_text,
                 "NCCL %s between GPUs 0 and 1, one thread per GPU%s; "
                 "all-reduce: fp32 sum in place; send/recv: GPU 0 to GPU 1",
                 ctx->comm->nccl_version,
                 ctx->args->sm_limit > 0 ? ", both in the SM limit" : "");
    else
        snprintf(comm_text, sizeof comm_text,
                 "not measured (%s): the cluster file's link figures apply",
                 ctx->comm_reason);
    put(obj, "communication", json_string(comm_text), failures);
    char workspace[200];
    snprintf(workspace, sizeof workspace,
             "the CUDA context as measured plus %.1f GiB for cuBLAS "
             "workspaces and NCCL buffers",
             WORKSPACE_ALLOWANCE_GIB);
    if (ctx->options->backend == BACKEND_CUDA)
        put(obj, "workspace", json_string(workspace), failures);
    put(obj, "skipped", skipped_json(ctx, failures), failures);
    put(obj, "elapsed_s", json_real(measured_seconds(ctx)), failures);
    return obj;
}

static json_t *efficiency_json(const profile_context *ctx, int *failures)
{
    const profiled_device *d = &ctx->result->device;
    const gpu_spec_row *row = find_spec_row(d->name);
    if (ctx->options->backend != BACKEND_CUDA || row == NULL)
        return NULL;
    json_t *obj = json_object();
    put(obj, "peak_tflops", json_real(row->peak_tflops), failures);
    put(obj, "flops_efficiency", json_real(0.0), failures);
    put(obj, "memory_bandwidth_GBps", json_real(row->memory_bandwidth_GBps),
        failures);
    put(obj, "sms", json_integer(d->sms), failures);
    if (ctx->args->sm_limit > 0)
        put(obj, "sm_limit", json_integer(ctx->args->sm_limit), failures);
    return obj;
}

static json_t *profile_json(const profile_context *ctx)
{
    int failures = 0;
    const profiler_result *r = ctx->result;
    const profiled_device *d = &r->device;
    double memory_gib = ctx->args->memory_limit_gib > 0
                            ? ctx->args->memory_limit_gib
                            : d->memory_bytes / PT_GIB;
    double workspace_gib = ctx->options->backend == BACKEND_CUDA
                               ? d->context_bytes / PT_GIB +
                                     WORKSPACE_ALLOWANCE_GIB
                               : 0.0;
    json_t *root = json_object();
    put(root, "format", json_string("partita-profile/1"), &failures);
    put(root, "gpu", json_string(ctx->gpu), &failures);
    put(root, "memory_gib", json_real(memory_gib), &failures);
    put(root, "source", json_string("measured"), &failures);
    put(root, "provenance", provenance_json(ctx, &failures), &failures);
    json_t *assumptions = json_object();
    put(assumptions, "backward_over_forward", json_real(0.0), &failures);
    put(assumptions, "microbatch_scaling", json_string("measured"),
        &failures);
    put(assumptions, "layer_times_include_tp_comm", json_false(), &failures);
    /* the cuda backend's fused attention keeps no scores (memory model) */
    put(assumptions, "flash_attention", json_true(), &failures);
    put(root, "assumptions", assumptions, &failures);
    put(root, "workspace_gib", json_real(workspace_gib), &failures);
    put(root, "optimizer_s_per_param", json_real(r->optimizer_s_per_param),
        &failures);
    json_t *efficiency = efficiency_json(ctx, &failures);
    if (efficiency != NULL)
        put(root, "efficiency", efficiency, &failures);
    json_t *shapes = json_array();
    for (int m = 0; m < ctx->model_count; m++)
        push(shapes, shape_json(&ctx->shapes[m], &ctx->results[m], &failures),
             &failures);
    put(root, "shapes", shapes, &failures);
    if (ctx->comm != NULL) {
        json_t *communication = json_object();
        put(communication, "allreduce",
            curve_json(ctx->comm->allreduce, ctx->comm->sample_count,
                       ctx->comm->gpus, &failures),
            &failures);
        put(communication, "sendrecv",
            curve_json(ctx->comm->sendrecv, ctx->comm->sample_count,
                       ctx->comm->gpus, &failures),
            &failures);
        put(root, "communication", communication, &failures);
    }
    if (failures > 0) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* ------------------------------------------------------------ command */

static void join_command_line(int argc, char **argv, char *out, size_t size)
{
    size_t used = (size_t)snprintf(out, size, "partita");
    for (int i = 0; i < argc && used < size; i++) {
        bool plain = argv[i][0] != '\0' &&
                     strpbrk(argv[i], " \t'\"$\\") == NULL;
        used += (size_t)snprintf(out + used, size - used,
                                 plain ? " %s" : " '%s'", argv[i]);
    }
}

static void format_date_utc(char *out, size_t size)
{
    time_t now = time(NULL);
    struct tm utc;
    out[0] = '\0';
    if (gmtime_r(&now, &utc) != NULL)
        strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

/* A missing or read-only output directory is found before measuring. */
static int check_output_writable(const char *output)
{
    char dir[PT_PATH_MAX];
    pt_directory_of(output, dir, sizeof dir);
    if (access(dir, W_OK) == 0)
        return 0;
    fprintf(stderr, "partita profile: %s: cannot write there: directory "
                    "%s: %s\n",
            output, dir, strerror(errno));
    return -1;
}

/* The options the arguments ask for; -1 (printed) when they are bad. */
static int build_options(const profile_arguments *a,
                         profiler_options *options)
{
    pt_error err = {{0}};
    backend_kind backend = BACKEND_CUDA;
    if (backend_parse(a->backend, &backend, &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    *options = profiler_options_defaults(backend);
    if (a->quick)
        profiler_options_quick(options);
    options->sm_limit = a->sm_limit;
    options->memory_limit_bytes = a->memory_limit_gib * PT_GIB;
    if (parse_list("--tp", a->tp_list, options->tp_values,
                   &options->tp_count) != 0 ||
        parse_list("--mbs", a->mbs_list, options->mbs_values,
                   &options->mbs_count) != 0)
        return -1;
    if (profiler_options_check(options, &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    options->progress = print_progress;
    return 0;
}

/* The NCCL curves, when asked for and possible; NULL with the reason in
 * reason otherwise. -1 when measuring them failed. */
static int measure_curves(const profile_arguments *a,
                          const profiler_options *options,
                          profiler_comm_result *comm, bool *measured,
                          char *reason, size_t reason_size)
{
    *measured = false;
    if (a->no_comm) {
        pt_copy_string(reason, reason_size, "--no-comm");
        return 0;
    }
    if (options->backend != BACKEND_CUDA) {
        pt_copy_string(reason, reason_size, "cpu backend");
        return 0;
    }
    if (!profiler_comm_available(reason, reason_size))
        return 0;
    pt_error err = {{0}};
    if (profiler_measure_comm(options, COMM_MIN_BYTES, COMM_MAX_BYTES, comm,
                              &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    *measured = true;
    return 0;
}

static void print_points(const model_shape *shape, const profiler_result *r)
{
    printf("# %s: %d points\n", shape->name, r->point_count);
    printf("# %3s %4s  %21s  %21s  %21s\n", "tp", "mbs",
           "embedding fwd/bwd ms", "layer fwd/bwd ms", "head fwd/bwd ms");
    for (int i = 0; i < r->point_count; i++) {
        const profiled_point *p = &r->points[i];
        printf("  %3d %4d  %10.4f %10.4f  %10.4f %10.4f  %10.4f %10.4f\n",
               p->tp, p->mbs, p->embedding.forward.median_s * 1e3,
               p->embedding.backward.median_s * 1e3,
               p->layer.forward.median_s * 1e3,
               p->layer.backward.median_s * 1e3,
               p->head.forward.median_s * 1e3,
               p->head.backward.median_s * 1e3);
    }
    for (int i = 0; i < r->note_count; i++)
        printf("# note: %s: %s\n", shape->name, r->notes[i]);
}

static void print_summary(const profile_context *ctx)
{
    const profiler_result *r = ctx->result;
    printf("# profile %s on %s", ctx->gpu, r->device.name);
    if (r->device.sms_used > 0)
        printf(" (%d of its %d SMs used)", r->device.sms_used,
               r->device.sms);
    printf("\n");
    for (int m = 0; m < ctx->model_count; m++)
        print_points(&ctx->shapes[m], &ctx->results[m]);
    printf("# optimizer: %.3g s per parameter (AdamW step of one layer, "
           "%.0f parameters, %.3f ms)\n",
           r->optimizer_s_per_param, r->layer_parameters,
           r->optimizer_layer.median_s * 1e3);
    if (ctx->comm == NULL)
        printf("# communication: not measured (%s)\n", ctx->comm_reason);
    for (int i = 0; ctx->comm != NULL && i < ctx->comm->sample_count; i++) {
        char size[32];
        pt_format_bytes(ctx->comm->allreduce[i].bytes, size, sizeof size);
        printf("# %10s  all-reduce %10.2f us  send/recv %10.2f us\n", size,
               ctx->comm->allreduce[i].time.median_s * 1e6,
               ctx->comm->sendrecv[i].time.median_s * 1e6);
    }
    char elapsed[32];
    pt_format_seconds(measured_seconds(ctx), elapsed, sizeof elapsed);
    printf("# measured in %s; written to %s\n", elapsed, ctx->args->output);
}

/* Checks the profile with the reader that will load it, then writes it
 * atomically: a profile the reader refuses is never written. */
static int check_and_write(const profile_context *ctx, json_t *root)
{
    pt_error err = {{0}};
    profile loaded;
    json_place place = json_place_root(ctx->args->output);
    if (profile_from_json(root, &place, &loaded, &err) != 0) {
        fprintf(stderr, "partita profile: the measured profile does not "
                        "pass its own reader, nothing written: %s\n",
                err.message);
        return -1;
    }
    profile_free(&loaded);
    if (json_write_file_atomic(root, ctx->args->output, &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    return 0;
}

/* The models of --model (a comma-separated list of files or bundled
 * names); -1 (printed) when one does not load or two share a shape key
 * (a profile holds one shape per key). */
static int load_models(const char *list, model_shape *shapes, int *count)
{
    char names[PT_PATH_MAX * 2];
    pt_copy_string(names, sizeof names, list);
    *count = 0;
    char *save = NULL;
    for (char *name = strtok_r(names, ",", &save); name != NULL;
         name = strtok_r(NULL, ",", &save)) {
        pt_error err = {{0}};
        char path[PT_PATH_MAX];
        if (*count == MAX_MODELS) {
            fprintf(stderr, "partita profile: --model: at most %d models\n",
                    MAX_MODELS);
            return -1;
        }
        model_shape *shape = &shapes[*count];
        if (cli_locate("models", name, path, sizeof path, &err) != 0 ||
            model_load_file(path, shape, &err) != 0) {
            cli_error("profile", err.message);
            return -1;
        }
        for (int i = 0; i < *count; i++)
            if (shapes[i].hidden == shape->hidden &&
                shapes[i].ffn_hidden == shape->ffn_hidden &&
                shapes[i].seq == shape->seq && shapes[i].vocab == shape->vocab) {
                fprintf(stderr, "partita profile: --model: %s and %s have "
                                "the same hidden, ffn_hidden, seq and vocab "
                                "(one shape of the profile)\n",
                        shapes[i].name, shape->name);
                return -1;
            }
        (*count)++;
    }
    if (*count == 0)
        return profile_bad_argument("--model", "a model file or name", list);
    return 0;
}

/* Measures every model, then the curves; results[0]'s device and
 * optimizer speak for the profile. 0, or -1 (printed). */
static int measure_all(const profile_arguments *a,
                       const profiler_options *options,
                       const model_shape *shapes, int model_count,
                       profiler_result *results, profiler_comm_result *comm,
                       bool *has_curves, char *reason, size_t reason_size)
{
    for (int m = 0; m < model_count; m++) {
        pt_error err = {{0}};
        if (model_count > 1)
            fprintf(stderr, "# model %s\n", shapes[m].name);
        if (profiler_measure(&shapes[m], options, &results[m], &err) != 0) {
            fprintf(stderr, "partita profile: %s: %s\n", shapes[m].name,
                    err.message);
            return -1;
        }
    }
    return measure_curves(a, options, comm, has_curves, reason, reason_size);
}

static int write_profile(profile_context *ctx)
{
    format_date_utc(ctx->date_utc, sizeof ctx->date_utc);
    json_t *root = profile_json(ctx);
    int status = -1;
    if (root == NULL)
        cli_error("profile", "out of memory building the profile");
    else if (check_and_write(ctx, root) == 0) {
        print_summary(ctx);
        status = 0;
    }
    json_decref(root);
    return status;
}

static int check_gpu_name(const char *name)
{
    if (name == NULL || (name[0] != '\0' && strchr(name, '/') == NULL &&
                         strlen(name) < PT_NAME_MAX))
        return 0;
    return profile_bad_argument("--gpu-name", "a name without '/' (under 64 bytes)",
                        name);
}

static int measure_and_write(profile_arguments *a, int argc, char **argv)
{
    model_shape shapes[MAX_MODELS];
    int model_count = 0;
    profiler_options options;
    if (load_models(a->model, shapes, &model_count) != 0 ||
        build_options(a, &options) != 0 || check_gpu_name(a->gpu_name) != 0 ||
        (a->output != NULL && check_output_writable(a->output) != 0))
        return EXIT_BAD_INPUT;
    profiler_result *results = calloc((size_t)model_count, sizeof *results);
    profiler_comm_result *comm = calloc(1, sizeof *comm);
    int status = EXIT_FAILURE_RUN;
    char gpu[PT_NAME_MAX], output[PT_PATH_MAX], reason[256] = "";
    char command_line[2048];
    bool has_curves = false;
    if (results == NULL || comm == NULL) {
        cli_error("profile", "out of memory");
    } else if (measure_all(a, &options, shapes, model_count, results, comm,
                           &has_curves, reason, sizeof reason) == 0) {
        default_gpu_name(&results[0].device, options.backend, a->sm_limit,
                         gpu, sizeof gpu);
        if (a->gpu_name != NULL)
            pt_copy_string(gpu, sizeof gpu, a->gpu_name);
        if (a->output == NULL) {
            snprintf(output, sizeof output, "%s.json", gpu);
            a->output = output;
        }
        join_command_line(argc, argv, command_line, sizeof command_line);
        profile_context ctx = {.args = a, .model_count = model_count,
                               .shapes = shapes, .options = &options,
                               .results = results, .result = &results[0],
                               .comm = has_curves ? comm : NULL,
                               .comm_reason = reason, .gpu = gpu,
                               .command_line = command_line};
        if (write_profile(&ctx) == 0)
            status = EXIT_OK;
    }
    free(results);
    free(comm);
    return status;
}

int command_profile_measure(int argc, char **argv)
{
    profile_arguments args;
    int status = profile_run_unless_measuring(argc, argv, &args);
    if (status != PROFILE_MEASURE)
        return status;
    return measure_and_write(&args, argc, argv);
}
