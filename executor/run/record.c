/*
 * run.json (formats.md, "Run"): the record of a run as one JSON object.
 */
#include "executor/run/internal.h"

#include <stdlib.h>

/* Sets obj[key] = value, counting a failed allocation. */
static void put(json_t *obj, const char *key, json_t *value, int *failures)
{
    if (value == NULL || json_object_set_new(obj, key, value) != 0)
        (*failures)++;
}

static json_t *optional_string(const char *text)
{
    return text[0] != '\0' ? json_string(text) : json_null();
}

static const char *compiler_description(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown C compiler";
#endif
}

static json_t *device_to_json(const run_device *device, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "rank", json_integer(device->rank), failures);
    put(obj, "name", json_string(device->name), failures);
    put(obj, "sms_used",
        device->sms_used > 0 ? json_integer(device->sms_used) : json_null(),
        failures);
    put(obj, "memory_cap_gib",
        device->memory_cap_bytes > 0
            ? json_real(device->memory_cap_bytes / PT_GIB)
            : json_null(),
        failures);
    put(obj, "driver_version", optional_string(device->driver_version),
        failures);
    put(obj, "cuda_version", optional_string(device->cuda_version), failures);
    return obj;
}

static json_t *software_to_json(int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "partita", json_string(PARTITA_VERSION), failures);
    put(obj, "compiler", json_string(compiler_description()), failures);
    put(obj, "jansson", json_string(jansson_version_str()), failures);
    return obj;
}

static json_t *data_to_json(const run_result *r, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "prefix", json_string(r->data_prefix), failures);
    put(obj, "tokens", json_integer((json_int_t)r->dataset_tokens), failures);
    put(obj, "documents", json_integer((json_int_t)r->dataset_documents),
        failures);
    put(obj, "largest_token", json_integer(r->largest_token), failures);
    return obj;
}

static json_t *training_to_json(const run_result *r, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "backend", json_string(backend_name(r->backend)), failures);
    put(obj, "seed", json_integer((json_int_t)r->seed), failures);
    put(obj, "gbs", json_integer(r->gbs), failures);
    put(obj, "mbs", json_integer(r->mbs), failures);
    put(obj, "micro_batches", json_integer(r->micro_batches), failures);
    put(obj, "tokens_per_iteration", json_integer(r->tokens_per_iteration),
        failures);
    put(obj, "max_lr", json_real(r->schedule.max_lr), failures);
    put(obj, "min_lr", json_real(r->schedule.min_lr), failures);
    put(obj, "warmup_iterations", json_integer(r->schedule.warmup_steps),
        failures);
    put(obj, "decay_iterations", json_integer(r->schedule.decay_steps),
        failures);
    put(obj, "max_grad_norm", json_real(r->max_grad_norm), failures);
    put(obj, "first_iteration", json_integer(r->first_iteration), failures);
    put(obj, "last_iteration", json_integer(r->last_iteration), failures);
    put(obj, "resumed_from", optional_string(r->resumed_from), failures);
    put(obj, "stopped_early", json_boolean(r->stopped), failures);
    put(obj, "last_checkpoint_iteration",
        r->last_checkpoint_iteration > 0
            ? json_integer(r->last_checkpoint_iteration)
            : json_null(),
        failures);
    put(obj, "started_utc", json_string(r->started_utc), failures);
    return obj;
}

static json_t *iterations_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    for (long i = 0; array != NULL && i < r->iteration_count; i++) {
        const run_iteration *it = &r->iterations[i];
        json_t *obj = json_object();
        if (obj == NULL || json_array_append_new(array, obj) != 0) {
            (*failures)++;
            break;
        }
        put(obj, "iteration", json_integer(it->iteration), failures);
        put(obj, "step_time_s", json_real(it->step_time_s), failures);
        put(obj, "loss", json_real(it->loss), failures);
        put(obj, "grad_norm", json_real(it->grad_norm), failures);
        put(obj, "learning_rate", json_real(it->learning_rate), failures);
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *events_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->event_count; i++) {
        const run_event *event = &r->events[i];
        json_t *obj = json_object();
        if (obj == NULL || json_array_append_new(array, obj) != 0) {
            (*failures)++;
            break;
        }
        put(obj, "rank", json_integer(event->rank), failures);
        put(obj, "stage", json_integer(event->stage), failures);
        put(obj, "microbatch", json_integer(event->microbatch), failures);
        put(obj, "kind", json_string(event->kind), failures);
        put(obj, "start_s", json_real(event->start_s), failures);
        put(obj, "end_s", json_real(event->end_s), failures);
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

/* One entry per rank. A record that never got its per-rank arrays (a
 * refusal before they were made) shows rank 0 from the scalar fields. */
static json_t *devices_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    int ranks = r->devices != NULL ? r->rank_count : 1;
    for (int rank = 0; array != NULL && rank < ranks; rank++)
        if (json_array_append_new(
                array, device_to_json(r->devices != NULL ? &r->devices[rank]
                                                         : &r->device,
                                      failures)) != 0)
            (*failures)++;
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *memory_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    int ranks = r->rank_peak_memory_bytes != NULL ? r->rank_count : 1;
    for (int rank = 0; array != NULL && rank < ranks; rank++) {
        double bytes = r->rank_peak_memory_bytes != NULL
                           ? r->rank_peak_memory_bytes[rank]
                           : r->peak_memory_bytes;
        if (json_array_append_new(array, json_real(bytes / PT_GIB)) != 0)
            (*failures)++;
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

/* The process's peak resident set, once per rank: the ranks are threads
 * of this one process. */
static json_t *rss_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    int ranks = r->rank_count > 0 ? r->rank_count : 1;
    for (int rank = 0; array != NULL && rank < ranks; rank++)
        if (json_array_append_new(array,
                                  json_real(r->max_rss_bytes / PT_GIB)) != 0)
            (*failures)++;
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *notes_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->note_count; i++)
        if (json_array_append_new(array, json_string(r->notes[i])) != 0)
            (*failures)++;
    if (array == NULL)
        (*failures)++;
    return array;
}

json_t *run_to_json(const run_result *r, json_t *plan_json,
                    double flops_per_iteration, pt_error *err)
{
    int failures = 0;
    json_t *root = json_object();
    if (root == NULL) {
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    put(root, "format", json_string("partita-run/1"), &failures);
    put(root, "plan", json_incref(plan_json), &failures);
    put(root, "devices", devices_to_json(r, &failures), &failures);
    put(root, "software", software_to_json(&failures), &failures);
    put(root, "data", data_to_json(r, &failures), &failures);
    put(root, "training", training_to_json(r, &failures), &failures);
    put(root, "iterations", iterations_to_json(r, &failures), &failures);
    put(root, "events_iteration", json_integer(r->events_iteration),
        &failures);
    put(root, "events", events_to_json(r, &failures), &failures);
    put(root, "peak_memory_gib", memory_to_json(r, &failures), &failures);
    put(root, "peak_memory_basis", json_string(r->peak_memory_basis),
        &failures);
    put(root, "max_rss_gib", rss_to_json(r, &failures), &failures);
    put(root, "step_time_s", json_real(r->step_time_s), &failures);
    put(root, "tokens_per_s", json_real(r->tokens_per_s), &failures);
    int gpus = r->rank_count > 0 ? r->rank_count : 1;
    double tflops = r->step_time_s > 0
                        ? flops_per_iteration / r->step_time_s / 1e12 / gpus
                        : 0.0;
    put(root, "tflops_per_gpu", json_real(tflops), &failures);
    put(root, "notes", notes_to_json(r, &failures), &failures);
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    return root;
}
