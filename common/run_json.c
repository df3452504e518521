/*
 * run.json (formats.md, "Run"), the record of a training run: the one
 * module that writes it (for `partita exec`, through executor/run) and
 * reads it back (for `partita report`, through report/run_record.c), so
 * that the key names, the shape and the limits live here only. The
 * reader validates the fields a report uses, and refuses keys the writer
 * never writes and arrays it never leaves empty, naming them.
 */
#include "common/common.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Beyond these a file is corrupt. */
enum { RUN_MAX_MICROBATCHES = 1 << 24 };
#define RUN_MAX_SECONDS 1e7

/* --------------------------------------------------------------- writer */

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

static json_t *device_to_json(const run_json_device *device, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    json_put(obj, "rank", json_integer(device->rank), failures);
    json_put(obj, "name", json_string(device->name), failures);
    json_put(obj, "sms_used",
        device->sms_used > 0 ? json_integer(device->sms_used) : json_null(),
        failures);
    json_put(obj, "memory_cap_gib",
        device->memory_cap_bytes > 0
            ? json_real(device->memory_cap_bytes / PT_GIB)
            : json_null(),
        failures);
    json_put(obj, "driver_version", optional_string(device->driver_version),
        failures);
    json_put(obj, "cuda_version", optional_string(device->cuda_version), failures);
    return obj;
}

static json_t *software_to_json(int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    json_put(obj, "partita", json_string(PARTITA_VERSION), failures);
    json_put(obj, "compiler", json_string(compiler_description()), failures);
    json_put(obj, "jansson", json_string(jansson_version_str()), failures);
    return obj;
}

static json_t *data_to_json(const run_json *r, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    json_put(obj, "prefix", json_string(r->data_prefix), failures);
    json_put(obj, "tokens", json_integer((json_int_t)r->dataset_tokens), failures);
    json_put(obj, "documents", json_integer((json_int_t)r->dataset_documents),
        failures);
    json_put(obj, "largest_token", json_integer(r->largest_token), failures);
    return obj;
}

static json_t *training_to_json(const run_json *r, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    json_put(obj, "backend", json_string(r->backend), failures);
    json_put(obj, "seed", json_integer((json_int_t)r->seed), failures);
    json_put(obj, "gbs", json_integer(r->gbs), failures);
    json_put(obj, "mbs", json_integer(r->mbs), failures);
    json_put(obj, "micro_batches", json_integer(r->micro_batches), failures);
    json_put(obj, "tokens_per_iteration", json_integer(r->tokens_per_iteration),
        failures);
    json_put(obj, "max_lr", json_real(r->max_lr), failures);
    json_put(obj, "min_lr", json_real(r->min_lr), failures);
    json_put(obj, "warmup_iterations", json_integer(r->warmup_iterations),
        failures);
    json_put(obj, "decay_iterations", json_integer(r->decay_iterations),
        failures);
    json_put(obj, "max_grad_norm", json_real(r->max_grad_norm), failures);
    json_put(obj, "first_iteration", json_integer(r->first_iteration),
             failures);
    json_put(obj, "last_iteration", json_integer(r->last_iteration), failures);
    json_put(obj, "resumed_from", optional_string(r->resumed_from), failures);
    json_put(obj, "stopped_early", json_boolean(r->stopped_early), failures);
    json_put(obj, "stop_reason", optional_string(r->stop_reason), failures);
    json_put(obj, "interrupted_iteration",
             r->interrupted_iteration > 0
                 ? json_integer(r->interrupted_iteration)
                 : json_null(),
             failures);
    json_put(obj, "last_checkpoint_iteration",
        r->last_checkpoint_iteration > 0
            ? json_integer(r->last_checkpoint_iteration)
            : json_null(),
        failures);
    json_put(obj, "started_utc", json_string(r->started_utc), failures);
    return obj;
}

static json_t *iterations_to_json(const run_json *r, int *failures)
{
    json_t *array = json_array();
    for (long i = 0; array != NULL && i < r->iteration_count; i++) {
        const run_json_iteration *it = &r->iterations[i];
        json_t *obj = json_object();
        if (obj == NULL || json_array_append_new(array, obj) != 0) {
            (*failures)++;
            break;
        }
        json_put(obj, "iteration", json_integer(it->iteration), failures);
        json_put(obj, "step_time_s", json_real(it->step_time_s), failures);
        json_put(obj, "loss", json_real(it->loss), failures);
        json_put(obj, "grad_norm", json_real(it->grad_norm), failures);
        json_put(obj, "learning_rate", json_real(it->learning_rate), failures);
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *events_to_json(const run_json *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->event_count; i++) {
        const run_json_event *event = &r->events[i];
        json_t *obj = json_object();
        if (obj == NULL || json_array_append_new(array, obj) != 0) {
            (*failures)++;
            break;
        }
        json_put(obj, "rank", json_integer(event->rank), failures);
        json_put(obj, "stage", json_integer(event->stage), failures);
        json_put(obj, "microbatch", json_integer(event->microbatch), failures);
        json_put(obj, "kind", json_string(event->kind), failures);
        json_put(obj, "start_s", json_real(event->start_s), failures);
        json_put(obj, "end_s", json_real(event->end_s), failures);
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *devices_to_json(const run_json *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->device_count; i++)
        json_push(array, device_to_json(&r->devices[i], failures), failures);
    if (array == NULL)
        (*failures)++;
    return array;
}

/* One rank's terms, GiB ({"weights": ..., "context": null}), or null
 * when none is known. */
static json_t *terms_to_json(const pt_memory_terms *terms, int *failures)
{
    bool any = false;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        any = any || !isnan(terms->bytes[t]);
    if (!any)
        return json_null();
    json_t *obj = json_object();
    for (int t = 0; obj != NULL && t < PT_MEMORY_TERM_COUNT; t++)
        json_put(obj, pt_memory_term_name(t),
            isnan(terms->bytes[t]) ? json_null()
                                   : json_real(terms->bytes[t] / PT_GIB),
            failures);
    if (obj == NULL)
        (*failures)++;
    return obj;
}

/* Peak memory per rank, its terms, and the process's peak resident set,
 * once per rank (each rank's process: this one, for ranks that are
 * threads). */
static void put_memory(json_t *root, const run_json *r, int *failures)
{
    json_t *memory = json_array();
    for (int i = 0; memory != NULL && i < r->peak_memory_count; i++)
        json_push(memory, json_real(r->peak_memory_gib[i]), failures);
    json_put(root, "peak_memory_gib", memory, failures);
    json_put(root, "peak_memory_basis", json_string(r->peak_memory_basis),
        failures);
    if (r->memory_terms != NULL) {
        json_t *terms = json_array();
        for (int i = 0; terms != NULL && i < r->peak_memory_count; i++)
            json_push(terms, terms_to_json(&r->memory_terms[i], failures),
                failures);
        json_put(root, "memory_terms_gib", terms, failures);
    }
    json_t *rss = json_array();
    int ranks = r->rank_count > 0 ? r->rank_count : 1;
    for (int i = 0; rss != NULL && i < ranks; i++)
        json_push(rss, json_real(r->max_rss_gib), failures);
    json_put(root, "max_rss_gib", rss, failures);
}

static json_t *notes_to_json(const run_json *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->note_count; i++)
        json_push(array, json_string(r->notes[i]), failures);
    if (array == NULL)
        (*failures)++;
    return array;
}

json_t *run_json_build(const run_json *r, pt_error *err)
{
    int failures = 0;
    json_t *root = json_object();
    if (root == NULL) {
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    json_put(root, "format", json_string(RUN_JSON_FORMAT), &failures);
    json_put(root, "plan", json_incref(r->plan), &failures);
    json_put(root, "devices", devices_to_json(r, &failures), &failures);
    json_put(root, "software", software_to_json(&failures), &failures);
    json_put(root, "data", data_to_json(r, &failures), &failures);
    json_put(root, "training", training_to_json(r, &failures), &failures);
    json_put(root, "iterations", iterations_to_json(r, &failures), &failures);
    json_put(root, "events_iteration", json_integer(r->events_iteration),
        &failures);
    json_put(root, "events", events_to_json(r, &failures), &failures);
    put_memory(root, r, &failures);
    json_put(root, "step_time_s", json_real(r->step_time_s), &failures);
    json_put(root, "tokens_per_s", json_real(r->tokens_per_s), &failures);
    json_put(root, "tflops_per_gpu", json_real(r->tflops_per_gpu), &failures);
    json_put(root, "notes", notes_to_json(r, &failures), &failures);
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    return root;
}

/* --------------------------------------------------------------- reader */

/* Every key the writer above writes, object by object ("notes" is
 * allowed everywhere by json_check_keys). "plan" holds a plan, whose
 * format is the plan reader's. */
static const char *const run_keys[] = {
    "format", "plan", "devices", "software", "data", "training",
    "iterations", "events_iteration", "events", "peak_memory_gib",
    "peak_memory_basis", "max_rss_gib", "memory_terms_gib", "step_time_s",
    "tokens_per_s", "tflops_per_gpu", NULL};
static const char *const training_keys[] = {
    "backend", "seed", "gbs", "mbs", "micro_batches", "tokens_per_iteration",
    "max_lr", "min_lr", "warmup_iterations", "decay_iterations",
    "max_grad_norm", "first_iteration", "last_iteration", "resumed_from",
    "stopped_early", "stop_reason", "interrupted_iteration",
    "last_checkpoint_iteration", "started_utc", NULL};
static const char *const device_keys[] = {
    "rank", "name", "sms_used", "memory_cap_gib", "driver_version",
    "cuda_version", NULL};
static const char *const software_keys[] = {"partita", "compiler",
                                            "jansson", NULL};
static const char *const data_keys[] = {"prefix", "tokens", "documents",
                                        "largest_token", NULL};
static const char *const iteration_keys[] = {
    "iteration", "step_time_s", "loss", "grad_norm", "learning_rate", NULL};
static const char *const event_keys[] = {
    "rank", "stage", "microbatch", "kind", "start_s", "end_s", NULL};

/* The object at key, when present, holds only the allowed keys. */
static int check_object_keys(const json_t *root, const json_place *root_place,
                             const char *key, const char *const *allowed,
                             pt_error *err)
{
    const json_t *obj = json_object_get(root, key);
    json_place place = json_place_key(root_place, key);
    return obj == NULL ? 0 : json_check_keys(obj, &place, allowed, err);
}

/* An array the writer always fills (one entry per rank at least), when
 * present: a non-empty array. */
static int check_filled_array(const json_t *root, const json_place *root_place,
                              const char *key, const char *what,
                              pt_error *err)
{
    const json_t *array = json_object_get(root, key);
    json_place place = json_place_key(root_place, key);
    if (array != NULL && (!json_is_array(array) || json_array_size(array) == 0))
        return json_place_fail(&place, err, "must be a non-empty array, %s",
                               what);
    return 0;
}

/* The parts a report does not read, in the shape the writer gives them:
 * a key it never writes is a typo or another format, not to be passed
 * over in silence. */
static int check_written_shape(const json_t *root,
                               const json_place *root_place, pt_error *err)
{
    if (json_check_keys(root, root_place, run_keys, err) != 0 ||
        check_object_keys(root, root_place, "training", training_keys,
                          err) != 0 ||
        check_object_keys(root, root_place, "software", software_keys,
                          err) != 0 ||
        check_object_keys(root, root_place, "data", data_keys, err) != 0 ||
        check_filled_array(root, root_place, "devices",
                           "one device per rank", err) != 0 ||
        check_filled_array(root, root_place, "max_rss_gib",
                           "one number per rank (GiB)", err) != 0)
        return -1;
    const json_t *devices = json_object_get(root, "devices");
    json_place place = json_place_key(root_place, "devices");
    for (size_t i = 0; i < json_array_size(devices); i++) {
        json_place item = json_place_index(&place, i);
        if (json_check_keys(json_array_get(devices, i), &item, device_keys,
                            err) != 0)
            return -1;
    }
    return 0;
}

/* The ranks of the plan that ran: tp x dp x pp, or with "stages" (each
 * stage's own tp and dp; common/plan_stages.c) their tp x dp summed. */
static int read_plan_stages(const json_t *plan_obj, const json_place *place,
                            run_json *out, pt_error *err)
{
    long long ranks = (long long)out->tp * out->dp;
    if (ranks <= RUN_JSON_MAX_RANKS)
        ranks *= out->pp;
    const json_t *stages = json_object_get(plan_obj, "stages");
    if (stages == NULL) {
        out->plan_ranks = ranks > RUN_JSON_MAX_RANKS ? RUN_JSON_MAX_RANKS + 1
                                                     : (int)ranks;
        return 0;
    }
    json_place at = json_place_key(place, "stages");
    if (!json_is_array(stages) || json_array_size(stages) != (size_t)out->pp)
        return json_place_fail(&at, err, "must be an array of pp (%d) "
                                         "objects",
                               out->pp);
    ranks = 0;
    for (int s = 0; s < out->pp; s++) {
        json_place entry = json_place_index(&at, (size_t)s);
        const json_t *stage = json_array_get(stages, (size_t)s);
        long long tp = out->tp, dp = out->dp;
        if (json_expect_object(stage, &entry, err) != 0 ||
            json_get_int(stage, &entry, "tp", false, 1, 1 << 24, &tp,
                         err) != 0 ||
            json_get_int(stage, &entry, "dp", false, 1, 1 << 24, &dp,
                         err) != 0)
            return -1;
        if (ranks <= RUN_JSON_MAX_RANKS)
            ranks += tp * dp;
    }
    out->plan_ranks = ranks > RUN_JSON_MAX_RANKS ? RUN_JSON_MAX_RANKS + 1
                                                 : (int)ranks;
    return 0;
}

static int read_plan_degrees(const json_t *root, const json_place *root_place,
                             run_json *out, pt_error *err)
{
    json_place place = json_place_key(root_place, "plan");
    const json_t *plan_obj = json_object_get(root, "plan");
    if (plan_obj == NULL)
        return json_place_fail(&place, err, "missing (the plan that ran)");
    if (json_expect_object(plan_obj, &place, err) != 0)
        return -1;
    const char *keys[] = {"tp", "dp", "pp", "gbs", "mbs"};
    int *targets[] = {&out->tp, &out->dp, &out->pp, &out->gbs, &out->mbs};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        long long value = 1;
        /* tp, dp and pp default to 1 in a plan; gbs is required there. */
        bool required = strcmp(keys[i], "gbs") == 0;
        if (json_get_int(plan_obj, &place, keys[i], required, 1, 1 << 24,
                         &value, err) != 0)
            return -1;
        *targets[i] = (int)value;
    }
    return read_plan_stages(plan_obj, &place, out, err);
}

static int read_iterations(const json_t *root, const json_place *root_place,
                           run_json *out, pt_error *err)
{
    json_place place = json_place_key(root_place, "iterations");
    const json_t *array = json_object_get(root, "iterations");
    if (!json_is_array(array))
        return json_place_fail(&place, err, array == NULL
                                                ? "missing"
                                                : "must be an array");
    size_t count = json_array_size(array);
    out->iterations = calloc(count ? count : 1, sizeof *out->iterations);
    if (out->iterations == NULL)
        return pt_fail(err, "%s: out of memory", out->file);
    for (size_t i = 0; i < count; i++) {
        json_place item = json_place_index(&place, i);
        const json_t *obj = json_array_get(array, i);
        if (json_check_keys(obj, &item, iteration_keys, err) != 0)
            return -1;
        long long iteration = (long long)i + 1;
        run_json_iteration *it = &out->iterations[i];
        it->loss = NAN;
        /* a report counts iterations in an int */
        if (json_get_int(obj, &item, "iteration", false, 1, INT_MAX,
                         &iteration, err) != 0 ||
            json_get_number(obj, &item, "step_time_s", true, 0,
                            RUN_MAX_SECONDS, &it->step_time_s, err) != 0 ||
            json_get_number(obj, &item, "loss", false, -INFINITY, INFINITY,
                            &it->loss, err) != 0)
            return -1;
        /* as in a trainer's log: two runs in one file, or a hand edit */
        if (i > 0 && iteration <= out->iterations[i - 1].iteration) {
            json_place number = json_place_key(&item, "iteration");
            return json_place_fail(&number, err,
                                   "%lld after iteration %ld: iterations "
                                   "must increase",
                                   iteration, out->iterations[i - 1].iteration);
        }
        it->iteration = (long)iteration;
        out->iteration_count++;
    }
    return 0;
}

static int read_event(const json_t *obj, const json_place *place,
                      const run_json *run, run_json_kind_index kind_index,
                      run_json_event *event, pt_error *err)
{
    if (json_check_keys(obj, place, event_keys, err) != 0)
        return -1;
    long long rank, stage, microbatch;
    if (json_get_int(obj, place, "rank", true, 0, run->rank_count - 1, &rank,
                     err) != 0 ||
        json_get_int(obj, place, "stage", true, 0, run->pp - 1, &stage,
                     err) != 0 ||
        json_get_int(obj, place, "microbatch", true, -1,
                     RUN_MAX_MICROBATCHES, &microbatch, err) != 0 ||
        json_get_string(obj, place, "kind", true, event->kind,
                        sizeof event->kind, err) != 0 ||
        json_get_number(obj, place, "start_s", true, 0, RUN_MAX_SECONDS,
                        &event->start_s, err) != 0 ||
        json_get_number(obj, place, "end_s", true, 0, RUN_MAX_SECONDS,
                        &event->end_s, err) != 0)
        return -1;
    event->kind_index = kind_index(event->kind);
    if (event->kind_index < 0) {
        json_place at = json_place_key(place, "kind");
        return json_place_fail(&at, err, "unknown event kind '%s'",
                               event->kind);
    }
    if (event->end_s < event->start_s) {
        json_place at = json_place_key(place, "end_s");
        return json_place_fail(&at, err, "ends (%g s) before it starts (%g s)",
                               event->end_s, event->start_s);
    }
    event->rank = (int)rank;
    event->stage = (int)stage;
    event->microbatch = (int)microbatch;
    return 0;
}

static int read_events(const json_t *root, const json_place *root_place,
                       run_json_kind_index kind_index, run_json *out,
                       pt_error *err)
{
    json_place place = json_place_key(root_place, "events");
    const json_t *array = json_object_get(root, "events");
    if (!json_is_array(array))
        return json_place_fail(&place, err, array == NULL
                                                ? "missing"
                                                : "must be an array");
    size_t count = json_array_size(array);
    out->events = calloc(count ? count : 1, sizeof *out->events);
    if (out->events == NULL)
        return pt_fail(err, "%s: out of memory", out->file);
    for (size_t i = 0; i < count; i++) {
        json_place item = json_place_index(&place, i);
        if (read_event(json_array_get(array, i), &item, out, kind_index,
                       &out->events[i], err) != 0)
            return -1;
        out->event_count++;
    }
    return 0;
}

static int read_peak_memory(const json_t *root, const json_place *root_place,
                            run_json *out, pt_error *err)
{
    json_place place = json_place_key(root_place, "peak_memory_gib");
    const json_t *array = json_object_get(root, "peak_memory_gib");
    if (!json_is_array(array) || json_array_size(array) == 0)
        return json_place_fail(&place, err, array == NULL
                                   ? "missing"
                                   : "must be a non-empty array, one "
                                     "number per rank");
    size_t count = json_array_size(array);
    if (count > RUN_JSON_MAX_RANKS)
        return json_place_fail(&place, err, "%zu ranks is too many", count);
    out->peak_memory_gib = calloc(count, sizeof *out->peak_memory_gib);
    if (out->peak_memory_gib == NULL)
        return pt_fail(err, "%s: out of memory", out->file);
    for (size_t i = 0; i < count; i++) {
        const json_t *value = json_array_get(array, i);
        double gib = json_is_number(value) ? json_number_value(value) : NAN;
        if (!isfinite(gib) || gib < 0) {
            json_place item = json_place_index(&place, i);
            return json_place_fail(&item, err,
                                   "must be a number >= 0 (GiB)");
        }
        out->peak_memory_gib[i] = gib;
    }
    out->rank_count = out->peak_memory_count = (int)count;
    return 0;
}

/* One rank's entry of memory_terms_gib: null, or an object of known
 * terms, each a number (GiB; >= 0 but the context, a difference of two
 * measurements) or null. */
static int read_rank_terms(const json_t *value, const json_place *place,
                           pt_memory_terms *out, pt_error *err)
{
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        out->bytes[t] = NAN;
    if (json_is_null(value))
        return 0;
    if (json_expect_object(value, place, err) != 0)
        return -1;
    const char *key;
    const json_t *term_value;
    json_object_foreach((json_t *)value, key, term_value) {
        json_place at = json_place_key(place, key);
        int term = pt_memory_term_from_name(key);
        if (term < 0)
            return json_place_fail(&at, err, "is not a memory term");
        if (json_is_null(term_value))
            continue;
        double gib = json_is_number(term_value)
                         ? json_number_value(term_value)
                         : NAN;
        if (!isfinite(gib) || (gib < 0 && term != PT_MEMORY_CONTEXT))
            return json_place_fail(&at, err, "must be a number%s (GiB) or "
                                             "null",
                                   term != PT_MEMORY_CONTEXT ? " >= 0" : "");
        out->bytes[term] = gib * PT_GIB;
    }
    return 0;
}

/* memory_terms_gib (optional: older files have none), one entry per
 * rank of peak_memory_gib. */
static int read_memory_terms(const json_t *root, const json_place *root_place,
                             run_json *out, pt_error *err)
{
    const json_t *array = json_object_get(root, "memory_terms_gib");
    if (array == NULL)
        return 0;
    json_place place = json_place_key(root_place, "memory_terms_gib");
    if (!json_is_array(array) ||
        json_array_size(array) != (size_t)out->peak_memory_count)
        return json_place_fail(&place, err, "must be an array of %d "
                                            "entries, one per rank of "
                                            "peak_memory_gib",
                               out->peak_memory_count);
    out->memory_terms = calloc((size_t)out->peak_memory_count,
                               sizeof *out->memory_terms);
    if (out->memory_terms == NULL)
        return pt_fail(err, "%s: out of memory", out->file);
    for (int i = 0; i < out->peak_memory_count; i++) {
        json_place item = json_place_index(&place, (size_t)i);
        if (read_rank_terms(json_array_get(array, (size_t)i), &item,
                            &out->memory_terms[i], err) != 0)
            return -1;
    }
    return 0;
}

static int read_format_and_backend(const json_t *root,
                                   const json_place *root_place,
                                   run_json *out, pt_error *err)
{
    if (json_expect_object(root, root_place, err) != 0)
        return -1;
    char format[PT_NAME_MAX] = "";
    if (json_get_string(root, root_place, "format", true, format,
                        sizeof format, err) != 0)
        return -1;
    if (strcmp(format, RUN_JSON_FORMAT) != 0) {
        json_place at = json_place_key(root_place, "format");
        return json_place_fail(&at, err, "is '%s', expected '%s'", format,
                               RUN_JSON_FORMAT);
    }
    if (check_written_shape(root, root_place, err) != 0)
        return -1;
    const json_t *training = json_object_get(root, "training");
    if (!json_is_object(training))
        return 0;
    json_place at = json_place_key(root_place, "training");
    return json_get_string(training, &at, "backend", false, out->backend,
                           sizeof out->backend, err);
}

static int read_run_fields(const json_t *root, run_json_kind_index kind_index,
                           run_json *out, pt_error *err)
{
    json_place root_place = json_place_root(out->file);
    long long events_iteration = 0;
    if (read_format_and_backend(root, &root_place, out, err) != 0 ||
        read_plan_degrees(root, &root_place, out, err) != 0 ||
        json_get_positive_number(root, &root_place, "step_time_s", true,
                                 &out->step_time_s, err) != 0 ||
        json_get_positive_number(root, &root_place, "tokens_per_s", true,
                                 &out->tokens_per_s, err) != 0 ||
        json_get_number(root, &root_place, "tflops_per_gpu", true, 0, 1e9,
                        &out->tflops_per_gpu, err) != 0 ||
        json_get_int(root, &root_place, "events_iteration", false, 0,
                     INT_MAX, &events_iteration, err) != 0 ||
        read_iterations(root, &root_place, out, err) != 0 ||
        read_peak_memory(root, &root_place, out, err) != 0 ||
        read_memory_terms(root, &root_place, out, err) != 0)
        return -1;
    out->events_iteration = (long)events_iteration;
    /* Each degree is at most 2^24, so the full product could overflow;
     * past RUN_JSON_MAX_RANKS it cannot match anyway (read_plan_stages) */
    if (out->plan_ranks != out->rank_count) {
        json_place at = json_place_key(&root_place, "peak_memory_gib");
        if (json_object_get(json_object_get(root, "plan"), "stages") != NULL)
            return json_place_fail(&at, err,
                                   "has %d entries, but the %d stages of "
                                   "the plan that ran hold %d ranks (each "
                                   "its tp x dp)",
                                   out->rank_count, out->pp, out->plan_ranks);
        return json_place_fail(&at, err,
                               "has %d entries, but the plan that ran has "
                               "tp x dp x pp = %d x %d x %d ranks",
                               out->rank_count, out->tp, out->dp, out->pp);
    }
    return read_events(root, &root_place, kind_index, out, err);
}

int run_json_read(const json_t *root, const char *file,
                  run_json_kind_index kind_index, run_json *out,
                  pt_error *err)
{
    memset(out, 0, sizeof *out);
    pt_copy_string(out->file, sizeof out->file, file ? file : "<inline>");
    if (read_run_fields(root, kind_index, out, err) != 0) {
        run_json_free(out);
        return -1;
    }
    return 0;
}

void run_json_free(run_json *run)
{
    free(run->iterations);
    free(run->events);
    free(run->peak_memory_gib);
    free(run->memory_terms);
    run->memory_terms = NULL;
    run->iterations = NULL;
    run->events = NULL;
    run->peak_memory_gib = NULL;
    run->iteration_count = 0;
    run->event_count = run->rank_count = run->peak_memory_count = 0;
}
