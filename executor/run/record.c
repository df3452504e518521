/*
 * A run's record as run.json: what run_result holds, handed to the
 * format's owner (common/run_json.c) as a run_json. No key of the file is
 * named here.
 */
#include "executor/run/internal.h"

#include <stdlib.h>
#include <string.h>

/* The arrays the run_json points into, owned here while it is built. */
typedef struct record_arrays {
    run_json_device *devices;
    double *peak_memory_gib;
    run_json_iteration *iterations;
    run_json_event *events;
    const char *notes[RUN_MAX_NOTES];
} record_arrays;

static void free_arrays(record_arrays *a)
{
    free(a->devices);
    free(a->peak_memory_gib);
    free(a->iterations);
    free(a->events);
}

static run_json_device device_of(const run_device *device)
{
    return (run_json_device){.rank = device->rank,
                             .name = device->name,
                             .sms_used = device->sms_used,
                             .memory_cap_bytes = device->memory_cap_bytes,
                             .driver_version = device->driver_version,
                             .cuda_version = device->cuda_version};
}

/* One entry per rank. A record that never got its per-rank arrays (a
 * refusal before they were made) shows rank 0 from the scalar fields. */
static int fill_ranks(const run_result *r, run_json *out, record_arrays *a)
{
    int devices = r->devices != NULL ? r->rank_count : 1;
    int memory = r->rank_peak_memory_bytes != NULL ? r->rank_count : 1;
    a->devices = calloc((size_t)devices, sizeof *a->devices);
    a->peak_memory_gib = calloc((size_t)memory, sizeof *a->peak_memory_gib);
    if (a->devices == NULL || a->peak_memory_gib == NULL)
        return -1;
    for (int rank = 0; rank < devices; rank++)
        a->devices[rank] =
            device_of(r->devices != NULL ? &r->devices[rank] : &r->device);
    for (int rank = 0; rank < memory; rank++)
        a->peak_memory_gib[rank] = (r->rank_peak_memory_bytes != NULL
                                        ? r->rank_peak_memory_bytes[rank]
                                        : r->peak_memory_bytes) /
                                   PT_GIB;
    out->device_count = devices;
    out->devices = a->devices;
    out->peak_memory_count = memory;
    out->peak_memory_gib = a->peak_memory_gib;
    /* the terms only with the per-rank arrays (not after an early
       refusal) */
    out->memory_terms = r->rank_peak_memory_bytes != NULL
                            ? r->rank_memory_terms
                            : NULL;
    return 0;
}

static int fill_timeline(const run_result *r, run_json *out, record_arrays *a)
{
    a->iterations = calloc((size_t)r->iteration_count + 1,
                           sizeof *a->iterations);
    a->events = calloc((size_t)r->event_count + 1, sizeof *a->events);
    if (a->iterations == NULL || a->events == NULL)
        return -1;
    for (long i = 0; i < r->iteration_count; i++)
        a->iterations[i] = (run_json_iteration){
            .iteration = r->iterations[i].iteration,
            .step_time_s = r->iterations[i].step_time_s,
            .loss = r->iterations[i].loss,
            .grad_norm = r->iterations[i].grad_norm,
            .learning_rate = r->iterations[i].learning_rate};
    for (int i = 0; i < r->event_count; i++) {
        const run_event *e = &r->events[i];
        a->events[i] = (run_json_event){.rank = e->rank,
                                        .stage = e->stage,
                                        .microbatch = e->microbatch,
                                        .start_s = e->start_s,
                                        .end_s = e->end_s};
        pt_copy_string(a->events[i].kind, sizeof a->events[i].kind, e->kind);
    }
    out->iteration_count = r->iteration_count;
    out->iterations = a->iterations;
    out->event_count = r->event_count;
    out->events = a->events;
    return 0;
}

static void fill_training(const run_result *r, run_json *out)
{
    pt_copy_string(out->backend, sizeof out->backend,
                   backend_name(r->backend));
    pt_copy_string(out->data_prefix, sizeof out->data_prefix,
                   r->data_prefix);
    out->dataset_tokens = r->dataset_tokens;
    out->dataset_documents = r->dataset_documents;
    out->largest_token = r->largest_token;
    out->seed = r->seed;
    out->gbs = r->gbs;
    out->mbs = r->mbs;
    out->micro_batches = r->micro_batches;
    out->tokens_per_iteration = r->tokens_per_iteration;
    out->max_lr = r->schedule.max_lr;
    out->min_lr = r->schedule.min_lr;
    out->warmup_iterations = r->schedule.warmup_steps;
    out->decay_iterations = r->schedule.decay_steps;
    out->max_grad_norm = r->max_grad_norm;
    out->first_iteration = r->first_iteration;
    out->last_iteration = r->last_iteration;
    pt_copy_string(out->resumed_from, sizeof out->resumed_from,
                   r->resumed_from);
    out->stopped_early = r->stopped;
    pt_copy_string(out->stop_reason, sizeof out->stop_reason,
                   r->stop_reason);
    out->interrupted_iteration = r->interrupted_iteration;
    out->last_checkpoint_iteration = r->last_checkpoint_iteration;
    pt_copy_string(out->started_utc, sizeof out->started_utc,
                   r->started_utc);
}

json_t *run_to_json(const run_result *r, json_t *plan_json,
                    double flops_per_iteration, pt_error *err)
{
    run_json *record = calloc(1, sizeof *record);
    record_arrays arrays = {0};
    if (record == NULL || fill_ranks(r, record, &arrays) != 0 ||
        fill_timeline(r, record, &arrays) != 0) {
        free_arrays(&arrays);
        free(record);
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    record->plan = plan_json;
    record->rank_count = r->rank_count;
    fill_training(r, record);
    record->events_iteration = r->events_iteration;
    record->peak_memory_basis = r->peak_memory_basis;
    record->max_rss_gib = r->max_rss_bytes / PT_GIB;
    record->step_time_s = r->step_time_s;
    record->tokens_per_s = r->tokens_per_s;
    int gpus = r->rank_count > 0 ? r->rank_count : 1;
    record->tflops_per_gpu =
        r->step_time_s > 0
            ? flops_per_iteration / r->step_time_s / 1e12 / gpus
            : 0.0;
    for (int i = 0; i < r->note_count; i++)
        arrays.notes[i] = r->notes[i];
    record->note_count = r->note_count;
    record->notes = arrays.notes;
    json_t *root = run_json_build(record, err);
    free_arrays(&arrays);
    free(record);
    return root;
}
