/*
 * Derived profiles: the spec table (profiles/specs.json, from
 * shared/reference/gpu-specs.md) and the profile a spec row and a fitted
 * roofline make (docs/profiles.md), written by the format's owner,
 * common/profile.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

#define SPECS_FORMAT "partita-gpu-specs/1"

static const char *const table_keys[] = {"format", "source", "gpus", NULL};
static const char *const spec_keys[] = {
    "gpu", "row", "tensor_tflops", "tensor_precision", "fp32_tflops",
    "tf32_tflops",
    "memory_GB", "memory_kind", "usable_memory_gib", "usable_memory_from",
    "memory_bandwidth_GBps", "sms", "l2_MB", "link", NULL};
static const char *const precision_names[] = {"bf16", "fp16", NULL};

static int spec_from_json(const json_t *obj, const json_place *place,
                          gpu_spec *out, pt_error *err)
{
    long long sms = 0;
    int precision = 0;
    double l2_MB = 0.0;
    char memory_kind[32] = "";
    if (json_check_keys(obj, place, spec_keys, err) != 0 ||
        json_get_string(obj, place, "gpu", true, out->gpu, sizeof out->gpu,
                        err) != 0 ||
        json_get_string(obj, place, "row", true, out->row, sizeof out->row,
                        err) != 0 ||
        json_get_positive_number(obj, place, "tensor_tflops", true,
                                 &out->tensor_tflops, err) != 0 ||
        json_get_choice(obj, place, "tensor_precision", true,
                        precision_names, &precision, err) != 0 ||
        json_get_positive_number(obj, place, "fp32_tflops", false,
                                 &out->fp32_tflops, err) != 0 ||
        json_get_positive_number(obj, place, "tf32_tflops", false,
                                 &out->tf32_tflops, err) != 0 ||
        json_get_positive_number(obj, place, "memory_GB", true,
                                 &out->memory_GB, err) != 0 ||
        json_get_string(obj, place, "memory_kind", false, memory_kind,
                        sizeof memory_kind, err) != 0 ||
        json_get_positive_number(obj, place, "usable_memory_gib", true,
                                 &out->usable_memory_gib, err) != 0 ||
        json_get_string(obj, place, "usable_memory_from", true,
                        out->usable_memory_from,
                        sizeof out->usable_memory_from, err) != 0 ||
        json_get_positive_number(obj, place, "memory_bandwidth_GBps", true,
                                 &out->memory_bandwidth_GBps, err) != 0 ||
        json_get_int(obj, place, "sms", true, 1, 100000, &sms, err) != 0 ||
        json_get_positive_number(obj, place, "l2_MB", false, &l2_MB, err) !=
            0 ||
        json_get_string(obj, place, "link", true, out->link, sizeof out->link,
                        err) != 0)
        return -1;
    out->sms = (int)sms;
    pt_copy_string(out->tensor_precision, sizeof out->tensor_precision,
                   precision_names[precision]);
    if (out->gpu[0] == '\0' || strchr(out->gpu, '/') != NULL) {
        json_place where = json_place_key(place, "gpu");
        return json_place_fail(&where, err,
                               "must be a non-empty name without '/'");
    }
    /* usable memory is the nameplate less what the driver keeps (a
     * data sheet's "GB" of GPU memory are in fact about GiB) */
    if (out->usable_memory_gib > out->memory_GB) {
        json_place where = json_place_key(place, "usable_memory_gib");
        return json_place_fail(&where, err,
                               "%g GiB is more than the nameplate %g GB",
                               out->usable_memory_gib, out->memory_GB);
    }
    return 0;
}

static int specs_from_json(const json_t *root, const json_place *place,
                           gpu_spec_table *out, pt_error *err)
{
    char format[64] = "";
    if (json_check_keys(root, place, table_keys, err) != 0 ||
        json_get_string(root, place, "format", true, format, sizeof format,
                        err) != 0 ||
        json_get_string(root, place, "source", true, out->source,
                        sizeof out->source, err) != 0)
        return -1;
    if (strcmp(format, SPECS_FORMAT) != 0) {
        json_place where = json_place_key(place, "format");
        return json_place_fail(&where, err, "must be \"%s\", got \"%s\"",
                               SPECS_FORMAT, format);
    }
    json_place where = json_place_key(place, "gpus");
    const json_t *gpus = json_object_get(root, "gpus");
    if (!json_is_array(gpus) || json_array_size(gpus) == 0)
        return json_place_fail(&where, err,
                               "must be a non-empty array of GPU rows");
    size_t count = json_array_size(gpus);
    out->specs = calloc(count, sizeof *out->specs);
    if (out->specs == NULL)
        return json_place_fail(&where, err, "out of memory");
    out->count = (int)count;
    for (size_t i = 0; i < count; i++) {
        json_place row_place = json_place_index(&where, i);
        if (spec_from_json(json_array_get(gpus, i), &row_place,
                           &out->specs[i], err) != 0)
            return -1;
        for (size_t j = 0; j < i; j++)
            if (strcmp(out->specs[j].gpu, out->specs[i].gpu) == 0)
                return json_place_fail(&row_place, err,
                                       "gpu \"%s\" is already gpus[%zu]",
                                       out->specs[i].gpu, j);
    }
    return 0;
}

int gpu_spec_table_load(const char *path, gpu_spec_table *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    json_place place = json_place_root(path);
    int status = specs_from_json(root, &place, out, err);
    json_decref(root);
    if (status != 0)
        gpu_spec_table_free(out);
    return status;
}

void gpu_spec_table_free(gpu_spec_table *table)
{
    if (table == NULL)
        return;
    free(table->specs);
    memset(table, 0, sizeof *table);
}

const gpu_spec *gpu_spec_find(const gpu_spec_table *table, const char *gpu)
{
    for (int i = 0; i < table->count; i++)
        if (strcmp(table->specs[i].gpu, gpu) == 0)
            return &table->specs[i];
    return NULL;
}

/* ------------------------------------------- completing a source */

/* The row named like the profile's GPU: the same name, or the longest
 * row name it starts with followed by '-' ("H200-40SM" -> "H200"). */
static const gpu_spec *spec_named_like(const gpu_spec_table *table,
                                       const char *gpu)
{
    const gpu_spec *exact = gpu_spec_find(table, gpu);
    if (exact != NULL)
        return exact;
    const gpu_spec *best = NULL;
    size_t best_length = 0;
    for (int i = 0; i < table->count; i++) {
        size_t length = strlen(table->specs[i].gpu);
        if (strncmp(gpu, table->specs[i].gpu, length) == 0 &&
            gpu[length] == '-' && length > best_length) {
            best_length = length;
            best = &table->specs[i];
        }
    }
    return best;
}

/* An SM limit written where the measuring tool may have put it:
 * provenance.sm_limit or provenance.sms_used, else a "-<n>SM" suffix of
 * the GPU's name; 0 when none. */
static int recorded_sm_limit(const profile *p)
{
    static const char *const keys[] = {"sm_limit", "sms_used"};
    for (int i = 0; p->provenance != NULL && i < 2; i++) {
        const json_t *value = json_object_get(p->provenance, keys[i]);
        if (json_is_integer(value) && json_integer_value(value) > 0 &&
            json_integer_value(value) < 100000)
            return (int)json_integer_value(value);
    }
    const char *dash = strrchr(p->gpu, '-');
    int sms = 0, consumed = 0;
    if (dash != NULL && sscanf(dash + 1, "%dSM%n", &sms, &consumed) == 1 &&
        dash[1 + consumed] == '\0' && sms > 0)
        return sms;
    return 0;
}

int gpu_spec_complete_source(const gpu_spec_table *table, profile *p,
                             char *said, size_t said_size, pt_error *err)
{
    size_t used = 0;
    if (said_size > 0)
        said[0] = '\0';
    if (!(p->peak_tflops > 0.0) || !(p->memory_bandwidth_GBps > 0.0) ||
        p->sms <= 0) {
        const gpu_spec *spec = spec_named_like(table, p->gpu);
        if (spec == NULL)
            return pt_fail(err,
                           "profile %s: efficiency.peak_tflops, "
                           "memory_bandwidth_GBps and sms are needed to fit "
                           "on it, and no row of the spec table is named like "
                           "it",
                           p->gpu);
        if (!(p->peak_tflops > 0.0))
            p->peak_tflops = spec->tensor_tflops;
        if (!(p->memory_bandwidth_GBps > 0.0))
            p->memory_bandwidth_GBps = spec->memory_bandwidth_GBps;
        if (p->sms <= 0)
            p->sms = spec->sms;
        used += (size_t)snprintf(said, said_size,
                                 "%s: spec figures from row %s (%g TFLOP/s, "
                                 "%g GB/s, %d SMs)",
                                 p->gpu, spec->gpu, p->peak_tflops,
                                 p->memory_bandwidth_GBps, p->sms);
    }
    if (p->sm_limit == 0)
        p->sm_limit = recorded_sm_limit(p);
    if (p->sm_limit > p->sms)
        return pt_fail(err, "profile %s: sm_limit %d is more than the GPU's "
                       "%d SMs", p->gpu, p->sm_limit, p->sms);
    if (p->sm_limit > 0 && used < said_size)
        snprintf(said + used, said_size - used, "%s%s: measured on %d of %d "
                 "SMs", used > 0 ? "; " : "", p->gpu, p->sm_limit, p->sms);
    return 0;
}

/* ------------------------------------------------------ the profile */

/* Numbers as the file shows them: a few significant digits. */
static json_t *rounded_real(double x, int digits)
{
    return json_real(pt_round_significant(x, digits));
}

/* Builds an object from key / value pairs, dropping the whole object when
 * any value is NULL (out of memory). */
static json_t *set_all(json_t *obj, const char *const *keys,
                       json_t *const *values, int count)
{
    bool failed = obj == NULL;
    for (int i = 0; i < count; i++) {
        if (values[i] == NULL || failed) {
            failed = true;
            json_decref(values[i]);
            continue;
        }
        if (json_object_set_new(obj, keys[i], values[i]) != 0)
            failed = true;
    }
    if (failed) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

static json_t *fit_error_json(const roofline_fit_error *e)
{
    const char *keys[] = {"gpu", "times_fitted", "times_left_out",
                          "rms_log_error", "max_error_percent"};
    json_t *values[] = {
        json_string(e->gpu), json_integer(e->points),
        json_integer(e->left_out), rounded_real(e->rms_log_error, 3),
        /* rounded up, so that it is a bound */
        json_real(ceil(e->max_error * 1000.0) / 10.0)};
    return set_all(json_object(), keys, values, 5);
}

static json_t *fit_json(const roofline_fit_result *fit)
{
    json_t *per_source = json_array();
    for (int i = 0; per_source != NULL && i < fit->source_count; i++)
        if (json_array_append_new(per_source,
                                  fit_error_json(&fit->sources[i])) != 0) {
            json_decref(per_source);
            per_source = NULL;
        }
    json_t *all = fit_error_json(&fit->all);
    if (all == NULL || per_source == NULL) {
        json_decref(all);
        json_decref(per_source);
        return NULL;
    }
    json_object_del(all, "gpu");
    if (json_object_set_new(all, "per_source", per_source) != 0) {
        json_decref(all);
        return NULL;
    }
    return all;
}

static json_t *string_list(const char *const *items, int count)
{
    json_t *list = json_array();
    for (int i = 0; list != NULL && i < count; i++)
        if (json_array_append_new(list, json_string(items[i])) != 0) {
            json_decref(list);
            return NULL;
        }
    return list;
}

static json_t *fitted_on_json(const derive_request *r)
{
    const char *names[ROOFLINE_MAX_SOURCES];
    for (int i = 0; i < r->source_count && i < ROOFLINE_MAX_SOURCES; i++)
        names[i] = r->sources[i].gpu;
    return string_list(names, r->source_count);
}

static json_t *provenance_json(const derive_request *r,
                               const roofline_fit_result *fit)
{
    const gpu_spec *s = r->spec;
    char spec_text[768], precision[512], memory[512];
    snprintf(spec_text, sizeof spec_text,
             "%s, gpu \"%s\", from %s, row \"%s\": %g TFLOP/s dense %s "
             "tensor, %g GB/s, %d SMs, %g GB; link: %s",
             r->spec_file, s->gpu, r->spec_source, s->row, s->tensor_tflops,
             s->tensor_precision, s->memory_bandwidth_GBps, s->sms,
             s->memory_GB, s->link);
    if (strcmp(s->tensor_precision, "bf16") == 0)
        snprintf(precision, sizeof precision,
                 "bf16 at the dense tensor peak; the fit's sources are "
                 "half-precision (fp16 or bf16) measurements");
    else
        snprintf(precision, sizeof precision,
                 "%s has no bf16: this profile assumes %s at the same "
                 "tensor peak (%g TFLOP/s) for bf16 plans",
                 s->gpu, s->tensor_precision, s->tensor_tflops);
    snprintf(memory, sizeof memory,
             "memory_gib %g: %s; workspace_gib 0.5 is our allowance for the "
             "CUDA context, cuBLAS and NCCL buffers",
             s->usable_memory_gib, s->usable_memory_from);
    const char *keys[] = {"spec", "efficiency_model", "fitted_on",
                          "source_files", "fit", "precision", "memory",
                          "optimizer_model", "communication", "date",
                          "command"};
    json_t *values[] = {
        json_string(spec_text),
        json_string("per-kernel roofline (costmodel/roofline.c, "
                    "docs/profiles.md): each kernel of the embedding, a "
                    "transformer layer and the head takes max(FLOPs / (peak "
                    "x efficiency(work per SM)), bytes / (bandwidth x "
                    "bandwidth_efficiency)) + kernel overhead; parameters "
                    "fitted by least squares in log-time on fitted_on"),
        fitted_on_json(r),
        string_list(r->source_files, r->source_count),
        fit_json(fit),
        json_string(precision),
        json_string(memory),
        json_string("AdamW moves about 32 bytes per parameter (fp32 weight, "
                    "gradient, two moments, read and written) at "
                    "bandwidth x bandwidth_efficiency"),
        json_string("no measured curves: the cost model uses the cluster "
                    "file's link figures"),
        json_string(r->date),
        json_string(r->command)};
    return set_all(json_object(), keys, values, 11);
}

json_t *derive_profile_json(const derive_request *request,
                            const roofline_fit_result *fit, pt_error *err)
{
    const gpu_spec *s = request->spec;
    const roofline_params *p = &fit->params;
    profile derived = {
        .memory_gib = s->usable_memory_gib,
        .source = PROFILE_DERIVED,
        .provenance = provenance_json(request, fit),
        .mbs_scaling = MBS_SCALING_MEASURED,
        .workspace_gib = 0.5,
        .optimizer_s_per_param = pt_round_significant(
            32.0 / (s->memory_bandwidth_GBps * 1e9 * p->bandwidth_efficiency),
            4),
        .peak_tflops = s->tensor_tflops,
        .fp32_tflops = s->fp32_tflops,
        .tf32_tflops = s->tf32_tflops,
        .memory_bandwidth_GBps = s->memory_bandwidth_GBps,
        .sms = s->sms,
        .roofline = *p,
        .notes = json_string(
            "Derived from the spec sheet, not measured: every layer shape, "
            "tp and micro-batch is priced by the roofline in "
            "efficiency.roofline; the cost model adds the tensor-parallel "
            "all-reduces from the cluster's links. Re-derive when the "
            "profiles it was fitted on change (provenance.command).")};
    pt_copy_string(derived.gpu, sizeof derived.gpu, s->gpu);
    derived.roofline.present = true;
    json_t *root = NULL;
    if (derived.provenance == NULL || derived.notes == NULL)
        pt_fail(err, "derive: out of memory building the profile of %s",
                s->gpu);
    else
        root = profile_to_json(&derived, s->gpu, err);
    profile_free(&derived);
    return root;
}
