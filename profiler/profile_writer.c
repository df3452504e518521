/*
 * The profile a measurement makes (partita-profile/1, docs/formats.md
 * "Profile"): source "measured", the points of every model, the AdamW
 * figure, the curves, and the provenance of it all. Filled here as a
 * `profile` and written by the format's owner, common/profile.c, which
 * checks it with its reader, so that a profile the reader refuses is
 * never written; `partita profile` writes the checked object atomically.
 */
#include "profiler/profiler.h"

#include "executor/run/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The profile's name for a device: its first word with a digit, cut at
 * a '-' ("NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" ->
 * "A100"), "-<N>SM" under an SM limit, "-place-<P>" when the measured
 * slice is not the first of the split, "-beside-" with the neighbours'
 * SMs ("H200-16SM-beside-16-16-16") and "-idle" when they rest. */
void profiler_default_gpu_name(const profiled_device *device,
                               const profiler_options *options, char *out,
                               size_t size)
{
    if (options->backend == BACKEND_CPU) {
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
    if (options->sm_limit <= 0) {
        pt_copy_string(out, size, chosen);
        return;
    }
    size_t used = (size_t)snprintf(out, size, "%s-%dSM", chosen,
                                   options->sm_limit);
    if (options->beside_place > 0 && used < size)
        used += (size_t)snprintf(out + used, size - used, "-place-%d",
                                 options->beside_place);
    if (options->beside_count > 0 && used < size)
        used += (size_t)snprintf(out + used, size - used, "-beside");
    for (int i = 0; i < options->beside_count && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "-%d",
                                 options->beside_sms[i]);
    if (options->neighbours_idle && used < size)
        snprintf(out + used, size - used, "-idle");
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

/* ---------------------------------------------------------- provenance */

static json_t *optimizer_provenance(const profiler_result *r, int *failures)
{
    json_t *obj = json_object();
    json_put(obj, "layer_step_s", json_real(r->optimizer_layer.median_s),
        failures);
    json_put(obj, "layer_parameters", json_real(r->layer_parameters), failures);
    json_put(obj, "embedding_step_s", json_real(r->optimizer_embedding.median_s),
        failures);
    json_put(obj, "embedding_parameters", json_real(r->embedding_parameters),
        failures);
    json_put(obj, "used",
        json_string("the layer stage's step per parameter (every layer of "
                    "its stack: runs.layer_stack): real stages are mostly "
                    "layers"),
        failures);
    return obj;
}

/* Parts of every point of every model timed each way. */
static void count_timed(const profiler_writeup *ctx,
                        int counts[PROFILER_TIMINGS])
{
    for (int t = 0; t < PROFILER_TIMINGS; t++)
        counts[t] = 0;
    for (int m = 0; m < ctx->model_count; m++)
        for (int p = 0; p < ctx->results[m].point_count; p++)
            for (int part = 0; part < 3; part++)
                counts[ctx->results[m].points[p].timed[part]]++;
}

/* How many layers each point's layer entries are the mean of: one
 * object per point of every model. */
static json_t *stacked_json(const profiler_writeup *ctx, int *failures)
{
    json_t *array = json_array();
    for (int m = 0; m < ctx->model_count; m++)
        for (int p = 0; p < ctx->results[m].point_count; p++) {
            const profiled_point *point = &ctx->results[m].points[p];
            json_t *obj = json_object();
            json_put(obj, "model", json_string(ctx->shapes[m].name),
                     failures);
            json_put(obj, "tp", json_integer(point->tp), failures);
            json_put(obj, "mbs", json_integer(point->mbs), failures);
            json_put(obj, "layers", json_integer(point->layers_stacked),
                     failures);
            json_push(array, obj, failures);
        }
    return array;
}

static json_t *runs_provenance(const profiler_writeup *ctx, int *failures)
{
    const profiler_options *o = ctx->options;
    const profiler_result *r = &ctx->results[0];
    int counts[PROFILER_TIMINGS];
    count_timed(ctx, counts);
    json_t *obj = json_object();
    json_put(obj, "gated_parts", json_integer(counts[PROFILER_TIMING_GATED]),
             failures);
    json_put(obj, "graph_parts", json_integer(counts[PROFILER_TIMING_GRAPH]),
             failures);
    json_put(obj, "queued_parts", json_integer(counts[PROFILER_TIMING_HOST]),
             failures);
    if (counts[PROFILER_TIMING_STEP] > 0)
        json_put(obj, "stepped_parts",
                 json_integer(counts[PROFILER_TIMING_STEP]), failures);
    if (counts[PROFILER_TIMING_EXEC] > 0)
        json_put(obj, "executed_parts",
                 json_integer(counts[PROFILER_TIMING_EXEC]), failures);
    json_put(obj, "warmup", json_integer(r->runs_warmup), failures);
    json_put(obj, "timed_max", json_integer(r->runs_timed_max), failures);
    json_put(obj, "timed_min", json_integer(r->runs_timed_min), failures);
    json_put(obj, "rounds", json_integer(o->timing_rounds), failures);
    json_put(obj, "processes", json_integer(o->processes), failures);
    json_put(obj, "stage_sets", json_integer(o->stage_sets), failures);
    json_put(obj, "embedding_sets",
             json_integer(o->embedding_sets > o->stage_sets
                              ? o->embedding_sets
                              : o->stage_sets),
             failures);
    json_put(obj, "round_s", json_real(o->round_s), failures);
    json_put(obj, "calls_per_round_max", json_integer(PROFILER_MAX_QUEUED),
             failures);
    json_put(obj, "device_warmup_s", json_real(o->device_warmup_s), failures);
    json_put(obj, "hold_s", json_real(o->hold_s), failures);
    json_put(obj, "layer_stack", json_integer(o->layer_stack), failures);
    /* one layer asked: every point stacked one */
    if (o->layer_stack > 1)
        json_put(obj, "layers_stacked", stacked_json(ctx, failures),
                 failures);
    return obj;
}

static json_t *device_provenance(const profiler_writeup *ctx, int *failures)
{
    const profiled_device *d = &ctx->results[0].device;
    json_t *obj = json_object();
    json_put(obj, "device", json_string(d->name), failures);
    json_put(obj, "backend", json_string(backend_name(ctx->options->backend)),
        failures);
    if (ctx->options->backend == BACKEND_CUDA) {
        json_put(obj, "sms", json_integer(d->sms), failures);
        json_put(obj, "sms_used", json_integer(d->sms_used), failures);
        json_put(obj, "driver", json_string(d->driver_version[0] != '\0'
                                           ? d->driver_version
                                           : "unknown"),
            failures);
        json_put(obj, "driver_cuda", json_string(d->driver_cuda_version),
            failures);
        json_put(obj, "cuda_runtime", json_string(d->runtime_cuda_version),
            failures);
        json_put(obj, "context_gib", json_real(d->context_bytes / PT_GIB),
            failures);
    }
    if (ctx->sm_limit > 0)
        json_put(obj, "sm_limit", json_integer(ctx->sm_limit), failures);
    if (ctx->options->beside_count > 0) {
        json_t *beside = json_array();
        for (int i = 0; i < ctx->options->beside_count; i++)
            json_array_append_new(beside,
                                  json_integer(ctx->options->beside_sms[i]));
        json_put(obj, "beside_sms", beside, failures);
        json_put(obj, "beside_place", json_integer(ctx->options->beside_place),
                 failures);
        json_put(obj, "beside_load",
                 json_string(ctx->options->neighbours_idle
                                 ? "every other slice of the GPU's split "
                                   "made and left idle"
                                 : "every other slice of the GPU's split "
                                   "busy, each in a thread of its own: the "
                                   "same model's layer forward and backward "
                                   "at the measured tp and micro-batch, its "
                                   "AdamW step while the optimizer is timed"),
                 failures);
    }
    if (ctx->memory_limit_gib > 0)
        json_put(obj, "memory_limit_gib", json_real(ctx->memory_limit_gib),
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
            json_push(skipped, json_string(note), failures);
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
    json_put(obj, "date_utc", json_string(ctx->date_utc), failures);
    json_put(obj, "command", json_string(ctx->command_line), failures);
    json_put(obj, "partita_version", json_string(PARTITA_VERSION), failures);
    char models[PROFILER_MAX_MODELS * (PT_NAME_MAX + 2)];
    join_model_names(ctx, models, sizeof models);
    json_put(obj, "model", json_string(models), failures);
    json_put(obj, "timing",
        json_string("back to back: a round is each part's calls (enough "
                    "for runs.round_s, at most runs.calls_per_round_max); "
                    "a round of forwards, then of forward + backward "
                    "pairs (backward = pair - forward); over the calls. "
                    "cuda, the layer and the head by default: queued on "
                    "the stage's stream behind a gate the host opens once "
                    "every call of the round is queued (at most 256 "
                    "kernels and copies), timed by events from the gate "
                    "to the end: the stream's time, launch gaps included, "
                    "not the host's pace (runs.gated_parts); the embedding, "
                    "and every part under --timing graph: a CUDA graph of "
                    "the pairs replayed and timed by events, the forward's "
                    "share read off events around each forward in a second "
                    "graph, replayed once per point and set of stages "
                    "(runs.graph_parts); the cpu, and --timing host: "
                    "queued as they come, host clock from the first call "
                    "to the end of the stage's stream "
                    "(runs.queued_parts). The stage's per-call "
                    "synchronisation is not counted; tp > 1: shard 0 "
                    "computed alone, without the tp all-reduces. A head "
                    "entry with fused: true was timed as the cuda "
                    "backend's fused head (tp 1): its forward holds the "
                    "head matrix's backward products, its backward the "
                    "final norm's alone"),
        failures);
    json_put(obj, "statistic",
             json_string("mean over runs.processes processes, made one "
                         "after the other, of each one's median over the "
                         "runs.rounds rounds of each of runs.stage_sets "
                         "sets of stages, made one after the other in "
                         "fresh memory (the embedding: of "
                         "runs.embedding_sets, its stage made again for "
                         "the sets beyond; the AdamW step: its runs.rounds "
                         "rounds on the first set; a curve: its timed "
                         "runs, in this process)"),
             failures);
    json_put(obj, "layer",
             json_string(ctx->options->layer_stack > 1
                             ? "a layer entry: the time of a call of a stage "
                               "of runs.layers_stacked layers (each its own "
                               "parameters and activations; "
                               "runs.layer_stack asked) over that many "
                               "layers, forward and backward alike: the "
                               "mean layer of a stack"
                             : "a layer entry: one transformer layer in a "
                               "stage of its own (runs.layer_stack 1)"),
             failures);
    json_put(obj, "spread",
        json_string("forward_spread, backward_spread, spread: interquartile "
                    "range of the rounds (of a curve: its timed runs) over "
                    "their median, the largest of the processes'"),
        failures);
    json_put(obj, "runs", runs_provenance(ctx, failures), failures);
    json_put(obj, "optimizer", optimizer_provenance(r, failures), failures);
    char comm_text[768];
    if (ctx->comm != NULL)
        snprintf(comm_text, sizeof comm_text,
                 "NCCL %s over GPUs 0 to %d (every power of two of them "
                 "from 2), one thread per GPU%s; all-reduce: fp32 sum in "
                 "place; send/recv: GPU 0 to GPU 1; reduce-scatter and "
                 "all-gather: fp32 in place, each GPU keeping or giving "
                 "its share (bytes: the whole tensor); compute_lost (16, "
                 "64 and 256 MiB): how much longer bf16 products of "
                 "4096-square matrices on a second stream of each GPU took "
                 "beside the collectives than alone, over the "
                 "collectives' own time (device clock, the mean of the "
                 "GPUs)",
                 ctx->comm->nccl_version,
                 ctx->comm->count_sets > 0
                     ? ctx->comm->curves[ctx->comm->count_sets - 1].gpus - 1
                     : 1,
                 ctx->sm_limit > 0 ? ", both in the SM limit" : "");
    else
        snprintf(comm_text, sizeof comm_text,
                 "not measured (%s): the cluster file's link figures apply",
                 ctx->comm_reason);
    json_put(obj, "communication", json_string(comm_text), failures);
    char workspace[200];
    snprintf(workspace, sizeof workspace,
             "the CUDA context as measured plus %.1f GiB for cuBLAS "
             "workspaces and NCCL buffers",
             PROFILE_WORKSPACE_ALLOWANCE_GIB);
    if (ctx->options->backend == BACKEND_CUDA)
        json_put(obj, "workspace", json_string(workspace), failures);
    json_put(obj, "skipped", skipped_json(ctx, failures), failures);
    json_put(obj, "elapsed_s", json_real(profiler_measured_seconds(ctx)),
        failures);
    return obj;
}

static part_cost part_of(const profiled_part *part)
{
    return (part_cost){.forward_s = part->forward.median_s,
                       .backward_s = part->backward.median_s,
                       .forward_spread = part->forward.spread,
                       .backward_spread = part->backward.spread};
}

static int shape_of(const model_shape *model, const profiler_result *r,
                    profile_shape *out)
{
    /* keyed by the model's widths and its layer's architecture */
    *out = profile_shape_of_model(model);
    out->points = calloc((size_t)r->point_count + 1, sizeof *out->points);
    if (out->points == NULL)
        return -1;
    out->point_count = r->point_count;
    for (int i = 0; i < r->point_count; i++) {
        const profiled_point *point = &r->points[i];
        out->points[i] = (profile_point){
            .tp = point->tp, .mbs = point->mbs,
            .embedding = part_of(&point->embedding),
            .layer = part_of(&point->layer), .head = part_of(&point->head),
            .head_fused = point->head_fused};
    }
    return 0;
}

/* The four curves of a GPU count. */
typedef enum curve_kind {
    CURVE_ALLREDUCE,
    CURVE_SENDRECV,
    CURVE_REDUCE_SCATTER,
    CURVE_ALL_GATHER
} curve_kind;

static const profiled_comm_sample *
curve_samples(const profiled_comm_curves *set, curve_kind kind)
{
    switch (kind) {
    case CURVE_SENDRECV:
        return set->sendrecv;
    case CURVE_REDUCE_SCATTER:
        return set->reduce_scatter;
    case CURVE_ALL_GATHER:
        return set->all_gather;
    default:
        return set->allreduce;
    }
}

/* One kind of curve over every GPU count measured, counts whose curve
 * was not measured (send/recv beyond 2 GPUs: bytes 0) left out; sorted
 * by GPUs, then bytes, as the profile keeps a curve. */
static int curve_of(const profiler_comm_result *comm, curve_kind kind,
                    comm_curve *out)
{
    int most = comm->count_sets * comm->sample_count;
    out->samples = calloc((size_t)most + 1, sizeof *out->samples);
    if (out->samples == NULL)
        return -1;
    out->sample_count = 0;
    for (int c = 0; c < comm->count_sets; c++) {
        const profiled_comm_sample *samples =
            curve_samples(&comm->curves[c], kind);
        for (int i = 0; i < comm->sample_count; i++)
            if (samples[i].bytes > 0.0)
                out->samples[out->sample_count++] = (comm_sample){
                    .gpus = comm->curves[c].gpus,
                    .bytes = samples[i].bytes,
                    .time_s = samples[i].time.median_s,
                    .spread = samples[i].time.spread,
                    .compute_lost = samples[i].compute_lost};
    }
    return 0;
}

/* The efficiency block, where the device is a GPU of the spec table. */
static void efficiency_of(const profiler_writeup *ctx, profile *out)
{
    const profiled_device *d = &ctx->results[0].device;
    const gpu_spec_row *row = find_spec_row(d->name);
    if (ctx->options->backend != BACKEND_CUDA || row == NULL)
        return;
    out->peak_tflops = row->peak_tflops;
    out->flops_efficiency = 0.0; /* fit it on the shapes */
    out->memory_bandwidth_GBps = row->memory_bandwidth_GBps;
    out->sms = d->sms;
    out->sm_limit = ctx->sm_limit > 0 ? ctx->sm_limit : 0;
}

/* The measured profile: every field but the provenance is a measured
 * figure or a fact of the backend (fused attention keeps no scores). */
static int measured_profile(const profiler_writeup *ctx, profile *out)
{
    const profiler_result *r = &ctx->results[0];
    const profiled_device *d = &r->device;
    int failures = 0;
    *out = (profile){
        .memory_gib = ctx->memory_limit_gib > 0 ? ctx->memory_limit_gib
                                                : d->memory_bytes / PT_GIB,
        .source = PROFILE_MEASURED,
        .provenance = provenance_json(ctx, &failures),
        .mbs_scaling = MBS_SCALING_MEASURED,
        .flash_attention = true,
        .workspace_gib = ctx->options->backend == BACKEND_CUDA
                             ? d->context_bytes / PT_GIB +
                                   PROFILE_WORKSPACE_ALLOWANCE_GIB
                             : 0.0,
        .optimizer_s_per_param = r->optimizer_s_per_param,
        .host_adamw_s_per_param = r->host_adamw_s_per_param,
        .host_copy_s_per_param = r->host_copy_s_per_param};
    pt_copy_string(out->gpu, sizeof out->gpu, ctx->gpu);
    efficiency_of(ctx, out);
    out->shapes = calloc((size_t)ctx->model_count + 1, sizeof *out->shapes);
    if (out->shapes == NULL || failures > 0)
        return -1;
    for (int m = 0; m < ctx->model_count; m++, out->shape_count++)
        if (shape_of(&ctx->shapes[m], &ctx->results[m],
                     &out->shapes[m]) != 0)
            return -1;
    if (ctx->comm != NULL &&
        (curve_of(ctx->comm, CURVE_ALLREDUCE, &out->allreduce) != 0 ||
         curve_of(ctx->comm, CURVE_SENDRECV, &out->sendrecv) != 0 ||
         curve_of(ctx->comm, CURVE_REDUCE_SCATTER, &out->reduce_scatter) !=
             0 ||
         curve_of(ctx->comm, CURVE_ALL_GATHER, &out->all_gather) != 0))
        return -1;
    return 0;
}

json_t *profiler_profile_json(const profiler_writeup *writeup,
                              const char *output, pt_error *err)
{
    profile measured;
    json_t *root = NULL;
    if (measured_profile(writeup, &measured) != 0)
        pt_fail(err, "out of memory building the profile");
    else if ((root = profile_to_json(&measured, output, err)) == NULL)
        pt_error_prefix(err, "the measured profile does not pass its own "
                             "reader, nothing written");
    profile_free(&measured);
    return root;
}
