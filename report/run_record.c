/* report: the run a report compares with its estimate, read from run.json
 * by the format's owner (common/run_json.c) and given the cost model's
 * event kinds. */
#include "report/report.h"

#include <stdlib.h>
#include <string.h>

/* The record's fields a report uses; the arrays of `in` are copied, but
 * peak_memory_gib and memory_terms are taken over. */
static int take_record(run_json *in, run_record *out, pt_error *err)
{
    pt_copy_string(out->backend, sizeof out->backend, in->backend);
    out->rank_count = in->rank_count;
    out->tp = in->tp;
    out->dp = in->dp;
    out->pp = in->pp;
    out->gbs = in->gbs;
    out->mbs = in->mbs;
    out->step_time_s = in->step_time_s;
    out->tokens_per_s = in->tokens_per_s;
    out->tflops_per_gpu = in->tflops_per_gpu;
    out->events_iteration = (int)in->events_iteration;
    out->peak_memory_gib = in->peak_memory_gib;
    in->peak_memory_gib = NULL;
    out->memory_terms = in->memory_terms;
    in->memory_terms = NULL;
    out->iterations = calloc((size_t)in->iteration_count + 1,
                             sizeof *out->iterations);
    out->events = calloc((size_t)in->event_count + 1, sizeof *out->events);
    if (out->iterations == NULL || out->events == NULL)
        return pt_fail(err, "%s: out of memory", out->file);
    for (long i = 0; i < in->iteration_count; i++)
        out->iterations[i] = (run_iteration){
            .iteration = (int)in->iterations[i].iteration,
            .step_time_s = in->iterations[i].step_time_s,
            .loss = in->iterations[i].loss};
    out->iteration_count = (int)in->iteration_count;
    for (int i = 0; i < in->event_count; i++)
        out->events[i] = (timeline_event){
            .rank = in->events[i].rank,
            .stage = in->events[i].stage,
            .microbatch = in->events[i].microbatch,
            .kind = (event_kind)in->events[i].kind_index,
            .start_s = in->events[i].start_s,
            .end_s = in->events[i].end_s};
    out->event_count = in->event_count;
    return 0;
}

int run_record_from_json(const json_t *root, const char *file,
                         run_record *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    pt_copy_string(out->file, sizeof out->file, file ? file : "<inline>");
    run_json in;
    if (run_json_read(root, file, event_kind_from_name, &in, err) != 0)
        return -1;
    int status = take_record(&in, out, err);
    run_json_free(&in);
    out->plan_json = json_incref(json_object_get(root, "plan"));
    if (status != 0)
        run_record_free(out);
    return status;
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
    free(run->memory_terms);
    json_decref(run->plan_json);
    run->plan_json = NULL;
    run->iterations = NULL;
    run->events = NULL;
    run->peak_memory_gib = NULL;
    run->memory_terms = NULL;
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

/* Keys of a plan that say where it came from, not what it is. */
static bool describes_origin(const char *key)
{
    return strcmp(key, "origin") == 0 || strcmp(key, "notes") == 0;
}

/* Where two plans' JSON first differ. */
typedef struct plan_difference {
    char path[512];          /* "plan.model.hidden" */
    const json_t *ran, *reported;  /* the values there; NULL: absent */
} plan_difference;

/* Whether a and b differ below the place in d->path; d then names the
 * first place and its two values. */
static bool first_difference(const json_t *a, const json_t *b,
                             plan_difference *d)
{
    size_t length = strlen(d->path), size = sizeof d->path;
    if (json_is_object(a) && json_is_object(b)) {
        const json_t *sides[] = {a, b};
        for (int side = 0; side < 2; side++) {
            const char *key;
            const json_t *value;
            json_object_foreach((json_t *)sides[side], key, value) {
                if (describes_origin(key))
                    continue;
                snprintf(d->path + length, size - length, ".%s", key);
                if (first_difference(json_object_get(a, key),
                                     json_object_get(b, key), d))
                    return true;
            }
        }
        d->path[length] = '\0';
        return false;
    }
    if (json_is_array(a) && json_is_array(b) &&
        json_array_size(a) == json_array_size(b)) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            snprintf(d->path + length, size - length, "[%zu]", i);
            if (first_difference(json_array_get(a, i), json_array_get(b, i),
                                 d))
                return true;
        }
        d->path[length] = '\0';
        return false;
    }
    d->ran = a;
    d->reported = b;
    return !json_equal((json_t *)a, (json_t *)b);
}

/* A value for a message: compact JSON, "absent", cut to fit. */
static void show_value(const json_t *value, char *out, size_t size)
{
    char *text = value != NULL
                     ? json_dumps(value, JSON_ENCODE_ANY | JSON_COMPACT)
                     : NULL;
    pt_copy_string(out, size, text != NULL ? text : "absent");
    free(text);
}

int run_record_check_same_plan(const run_record *run, const plan *p,
                               pt_error *err)
{
    if (run->plan_json == NULL)
        return 0;
    plan ran;
    if (plan_from_json(run->plan_json, run->file, &ran, err) != 0) {
        pt_error_prefix(err, "%s: plan", run->file);
        return -1;
    }
    json_t *ran_json = plan_to_json(&ran, NULL, err);
    json_t *reported_json = plan_to_json(p, NULL, err);
    plan_free(&ran);
    int status = 0;
    plan_difference d = {.path = "plan"};
    if (ran_json == NULL || reported_json == NULL)
        status = -1;
    else if (first_difference(ran_json, reported_json, &d)) {
        char ran_value[96], reported_value[96];
        show_value(d.ran, ran_value, sizeof ran_value);
        show_value(d.reported, reported_value, sizeof reported_value);
        status = pt_fail(err, "%s: %s: the run's plan has %s, the plan "
                              "being reported has %s: they are not the "
                              "same plan",
                         run->file, d.path, ran_value, reported_value);
    }
    json_decref(ran_json);
    json_decref(reported_json);
    return status;
}

bool run_record_on_plan_devices(const run_record *run, const plan *p,
                                char *why, size_t why_size)
{
    why[0] = '\0';
    if (strcmp(run->backend, "cpu") != 0)
        return true;
    char types[256] = "";
    for (int t = 0; t < p->cluster.type_count; t++) {
        size_t used = strlen(types);
        snprintf(types + used, sizeof types - used, "%s%s",
                 t > 0 ? ", " : "", p->cluster.types[t].gpu);
    }
    snprintf(why, why_size, "it ran on the cpu reference backend, the plan "
             "is for %s GPUs: its times say nothing of the estimate's",
             types);
    return false;
}
