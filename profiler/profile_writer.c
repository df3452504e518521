/*
 * The profile a measurement writes (partita-profile/1, docs/formats.md
 * "Profile"): source "measured", the points of every model, the AdamW
 * figure, the curves, and the provenance of it all. Built here and
 * checked by the reader that will load it (common/profile.c), so that a
 * profile the reader refuses is never written; `partita profile` writes
 * the checked object atomically.
 */
#include "profiler/profiler.h"

#include "executor/run/run.h"

#include <stdio.h>
#include <string.h>

/* Memory the measurement cannot see taken before the model: cuBLAS
 * workspaces and NCCL buffers, on top of the measured CUDA context. */
#define WORKSPACE_ALLOWANCE_GIB 0.5

/* The profile's name for a device: its first word with a digit, cut at
 * a '-' ("NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" ->
 * "A100"), and "-<N>SM" under an SM limit. */
void profiler_default_gpu_name(const profiled_device *device,
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

static json_t *device_provenance(const profiler_writeup *ctx, int *failures)
{
    const profiled_device *d = &ctx->results[0].device;
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
    if (ctx->sm_limit > 0)
        put(obj, "sm_limit", json_integer(ctx->sm_limit), failures);
    if (ctx->memory_limit_gib > 0)
        put(obj, "memory_limit_gib", json_real(ctx->memory_limit_gib),
            failures);
    return obj;
}

/* The models' names, "gpt2-xl, gpt2-xl-26h". */
static void join_model_names(const profiler_writeup *ctx, char *out,
                             size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < ctx->model_count && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s",
                                 i > 0 ? ", " : "", ctx->shapes[i].name);
}

/* Every model's notes, named by model when there are several. */
static json_t *skipped_json(const profiler_writeup *ctx, int *failures)
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

double profiler_measured_seconds(const profiler_writeup *ctx)
{
    double seconds = ctx->comm != NULL ? ctx->comm->elapsed_s : 0.0;
    for (int m = 0; m < ctx->model_count; m++)
        seconds += ctx->results[m].elapsed_s;
    return seconds;
}

static json_t *provenance_json(const profiler_writeup *ctx, int *failures)
{
    const profiler_result *r = &ctx->results[0];
    json_t *obj = device_provenance(ctx, failures);
    put(obj, "date_utc", json_string(ctx->date_utc), failures);
    put(obj, "command", json_string(ctx->command_line), failures);
    put(obj, "partita_version", json_string(PARTITA_VERSION), failures);
    char models[PROFILER_MAX_MODELS * (PT_NAME_MAX + 2)];
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
                 ctx->sm_limit > 0 ? ", both in the SM limit" : "");
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
    put(obj, "elapsed_s", json_real(profiler_measured_seconds(ctx)),
        failures);
    return obj;
}

static json_t *efficiency_json(const profiler_writeup *ctx, int *failures)
{
    const profiled_device *d = &ctx->results[0].device;
    const gpu_spec_row *row = find_spec_row(d->name);
    if (ctx->options->backend != BACKEND_CUDA || row == NULL)
        return NULL;
    json_t *obj = json_object();
    put(obj, "peak_tflops", json_real(row->peak_tflops), failures);
    put(obj, "flops_efficiency", json_real(0.0), failures);
    put(obj, "memory_bandwidth_GBps", json_real(row->memory_bandwidth_GBps),
        failures);
    put(obj, "sms", json_integer(d->sms), failures);
    if (ctx->sm_limit > 0)
        put(obj, "sm_limit", json_integer(ctx->sm_limit), failures);
    return obj;
}

static json_t *profile_json(const profiler_writeup *ctx)
{
    int failures = 0;
    const profiler_result *r = &ctx->results[0];
    const profiled_device *d = &r->device;
    double memory_gib = ctx->memory_limit_gib > 0
                            ? ctx->memory_limit_gib
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

json_t *profiler_profile_json(const profiler_writeup *writeup,
                              const char *output, pt_error *err)
{
    json_t *root = profile_json(writeup);
    if (root == NULL) {
        pt_fail(err, "out of memory building the profile");
        return NULL;
    }
    profile loaded;
    json_place place = json_place_root(output);
    if (profile_from_json(root, &place, &loaded, err) != 0) {
        pt_error_prefix(err, "the measured profile does not pass its own "
                             "reader, nothing written");
        json_decref(root);
        return NULL;
    }
    profile_free(&loaded);
    return root;
}
