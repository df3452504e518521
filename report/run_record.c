/* report: the reader of run.json (the fields a report uses). */
#include "report/report.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The largest values a sane run holds; beyond them a file is corrupt. */
enum { RUN_MAX_RANKS = 1 << 20, RUN_MAX_MICROBATCHES = 1 << 24 };
#define RUN_MAX_SECONDS 1e7

static int read_plan_degrees(const json_t *root, const json_place *root_place,
                             run_record *out, pt_error *err)
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
    return 0;
}

static int read_iterations(const json_t *root, const json_place *root_place,
                           run_record *out, pt_error *err)
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
        if (json_expect_object(obj, &item, err) != 0)
            return -1;
        long long iteration = (long long)i + 1;
        run_iteration *it = &out->iterations[i];
        it->loss = NAN;
        /* run_iteration.iteration is an int */
        if (json_get_int(obj, &item, "iteration", false, 1, INT_MAX,
                         &iteration, err) != 0 ||
            json_get_number(obj, &item, "step_time_s", true, 0,
                            RUN_MAX_SECONDS, &it->step_time_s, err) != 0 ||
            json_get_number(obj, &item, "loss", false, -INFINITY, INFINITY,
                            &it->loss, err) != 0)
            return -1;
        it->iteration = (int)iteration;
        out->iteration_count++;
    }
    return 0;
}

static int read_event(const json_t *obj, const json_place *place,
                      const run_record *run, timeline_event *event,
                      pt_error *err)
{
    if (json_expect_object(obj, place, err) != 0)
        return -1;
    long long rank, stage, microbatch;
    char kind[PT_NAME_MAX];
    if (json_get_int(obj, place, "rank", true, 0, run->rank_count - 1, &rank,
                     err) != 0 ||
        json_get_int(obj, place, "stage", true, 0, run->pp - 1, &stage,
                     err) != 0 ||
        json_get_int(obj, place, "microbatch", true, -1,
                     RUN_MAX_MICROBATCHES, &microbatch, err) != 0 ||
        json_get_string(obj, place, "kind", true, kind, sizeof kind, err) !=
            0 ||
        json_get_number(obj, place, "start_s", true, 0, RUN_MAX_SECONDS,
                        &event->start_s, err) != 0 ||
        json_get_number(obj, place, "end_s", true, 0, RUN_MAX_SECONDS,
                        &event->end_s, err) != 0)
        return -1;
    int kind_index = event_kind_from_name(kind);
    if (kind_index < 0) {
        json_place at = json_place_key(place, "kind");
        return json_place_fail(&at, err, "unknown event kind '%s'", kind);
    }
    if (event->end_s < event->start_s) {
        json_place at = json_place_key(place, "end_s");
        return json_place_fail(&at, err, "ends (%g s) before it starts (%g s)",
                               event->end_s, event->start_s);
    }
    event->rank = (int)rank;
    event->stage = (int)stage;
    event->microbatch = (int)microbatch;
    event->kind = (event_kind)kind_index;
    return 0;
}

static int read_events(const json_t *root, const json_place *root_place,
                       run_record *out, pt_error *err)
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
        if (read_event(json_array_get(array, i), &item, out,
                       &out->events[i], err) != 0)
            return -1;
        out->event_count++;
    }
    return 0;
}

static int read_peak_memory(const json_t *root, const json_place *root_place,
                            run_record *out, pt_error *err)
{
    json_place place = json_place_key(root_place, "peak_memory_gib");
    const json_t *array = json_object_get(root, "peak_memory_gib");
    if (!json_is_array(array) || json_array_size(array) == 0)
        return json_place_fail(&place, err, array == NULL
                                   ? "missing"
                                   : "must be a non-empty array, one "
                                     "number per rank");
    size_t count = json_array_size(array);
    if (count > RUN_MAX_RANKS)
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
    out->rank_count = (int)count;
    return 0;
}

static int read_run_fields(const json_t *root, run_record *out, pt_error *err)
{
    json_place root_place = json_place_root(out->file);
    if (json_expect_object(root, &root_place, err) != 0)
        return -1;
    char format[PT_NAME_MAX] = "";
    if (json_get_string(root, &root_place, "format", true, format,
                        sizeof format, err) != 0)
        return -1;
    if (strcmp(format, "partita-run/1") != 0) {
        json_place at = json_place_key(&root_place, "format");
        return json_place_fail(&at, err, "is '%s', expected 'partita-run/1'",
                               format);
    }
    const json_t *training = json_object_get(root, "training");
    if (json_is_object(training)) {
        json_place at = json_place_key(&root_place, "training");
        if (json_get_string(training, &at, "backend", false, out->backend,
                            sizeof out->backend, err) != 0)
            return -1;
    }
    long long events_iteration = 0;
    if (read_plan_degrees(root, &root_place, out, err) != 0 ||
        json_get_positive_number(root, &root_place, "step_time_s", true,
                                 &out->step_time_s, err) != 0 ||
        json_get_positive_number(root, &root_place, "tokens_per_s", true,
                                 &out->tokens_per_s, err) != 0 ||
        json_get_number(root, &root_place, "tflops_per_gpu", true, 0, 1e9,
                        &out->tflops_per_gpu, err) != 0 ||
        json_get_int(root, &root_place, "events_iteration", false, 0,
                     INT_MAX, &events_iteration, err) != 0 ||
        read_iterations(root, &root_place, out, err) != 0 ||
        read_peak_memory(root, &root_place, out, err) != 0)
        return -1;
    out->events_iteration = (int)events_iteration;
    /* Each degree is at most 2^24, so the full product could overflow;
     * past RUN_MAX_RANKS it cannot match anyway. */
    long long ranks = (long long)out->tp * out->dp;
    if (ranks <= RUN_MAX_RANKS)
        ranks *= out->pp;
    if (ranks != out->rank_count) {
        json_place at = json_place_key(&root_place, "peak_memory_gib");
        return json_place_fail(&at, err,
                               "has %d entries, but the plan that ran has "
                               "tp x dp x pp = %d x %d x %d ranks",
                               out->rank_count, out->tp, out->dp, out->pp);
    }
    return read_events(root, &root_place, out, err);
}

int run_record_from_json(const json_t *root, const char *file,
                         run_record *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    pt_copy_string(out->file, sizeof out->file, file ? file : "<inline>");
    if (read_run_fields(root, out, err) != 0) {
        run_record_free(out);
        return -1;
    }
    return 0;
}

int run_record_load_file(const char *path, run_record *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    int status = run_record_from_json(root, path, out, err);
    json_decref(root);
    return status;
}

void run_record_free(run_record *run)
{
    free(run->iterations);
    free(run->events);
    free(run->peak_memory_gib);
    run->iterations = NULL;
    run->events = NULL;
    run->peak_memory_gib = NULL;
    run->iteration_count = run->event_count = run->rank_count = 0;
}

int run_record_check_plan(const run_record *run, const plan *p,
                          pt_error *err)
{
    const char *names[] = {"tp", "dp", "pp", "gbs", "mbs"};
    int ran[] = {run->tp, run->dp, run->pp, run->gbs, run->mbs};
    int planned[] = {p->config.tp, p->config.dp, p->config.pp, p->config.gbs,
                     p->config.mbs};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (ran[i] != planned[i])
            return pt_fail(err,
                           "%s: plan.%s: the run used %s %d, the plan being "
                           "reported has %d: they are not the same plan",
                           run->file, names[i], names[i], ran[i], planned[i]);
    return 0;
}
