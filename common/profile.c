/* profiles/<gpu>.json: what one GPU type costs, and where the numbers come
 * from. The format's one owner: it reads a profile and writes one for
 * every writer (measured, derived). docs/formats.md describes every
 * field. */
#include "common/common.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROFILE_FORMAT "partita-profile/1"
/* Unit mistakes (ms written as s): no layer of any real model takes a
 * minute per micro-batch, no AdamW step of a billion parameters over
 * 1000 s (real ones take 1e-11 to 1e-10 s per parameter). */
#define PROFILE_MAX_PART_SECONDS 60.0
#define PROFILE_MAX_OPTIMIZER_S_PER_PARAM 1e-6
/* Beyond physical sense, and far enough inside a double that the cost
 * model's sums stay finite: memories from 1 MiB to 100 TiB, 1 GFLOP/s to
 * 1 EFLOP/s of tensor peak, 1 MB/s to 1 PB/s of memory bandwidth,
 * messages up to 1 PB. */
#define PROFILE_MIN_GIB 1e-3
#define PROFILE_MAX_GIB 1e5
#define PROFILE_MIN_RATE 1e-3
#define PROFILE_MAX_TFLOPS 1e6
#define PROFILE_MAX_BANDWIDTH_GBPS 1e6
#define PROFILE_MAX_HALF_WORK_GFLOP 1e6
#define PROFILE_MAX_MESSAGE_BYTES 1e15
/* Measured noise: a larger micro-batch may come out faster than a smaller
 * one by at most this share; times below PROFILE_MBS_NOISE_FLOOR_S
 * (launch-bound kernels, a busy CPU) are not compared. */
#define PROFILE_MBS_NOISE 0.10
#define PROFILE_MBS_NOISE_FLOOR_S 1e-3

static const char *const profile_keys[] = {
    "format", "gpu", "memory_gib", "source", "provenance", "assumptions",
    "workspace_gib", "optimizer_s_per_param", "host_adamw_s_per_param",
    "host_copy_s_per_param", "efficiency", "shapes", "communication", NULL};
static const char *const assumption_keys[] = {
    "backward_over_forward", "microbatch_scaling",
    "layer_times_include_tp_comm", "flash_attention", NULL};
static const char *const efficiency_keys[] = {
    "peak_tflops", "fp32_tflops", "tf32_tflops", "flops_efficiency",
    "memory_bandwidth_GBps", "sms", "sm_limit", "roofline", NULL};
static const char *const roofline_keys[] = {
    "gemm_efficiency", "gemm_half_work_gflop_per_sm", "attention_efficiency",
    "bandwidth_efficiency", "kernel_overhead_us",
    "bandwidth_saturation_sm_fraction", NULL};
/* kv_heads to qkv_bias: the layer's architecture as a model file spells
 * it (absent: GPT-2's); compute_lost: comm_sample's */
static const char *const shape_keys[] = {
    "hidden", "heads", "ffn_hidden", "seq", "vocab", "kv_heads", "norm",
    "mlp", "positions", "bias", "qkv_bias", "costs", NULL};
static const char *const point_keys[] = {"tp", "mbs", "embedding", "layer",
                                         "head", NULL};
/* The spreads are written by `partita profile` (interquartile range over
 * the median of the timed runs): checked, kept for people, not priced. */
static const char *const part_keys[] = {
    "forward_s", "backward_s", "forward_spread", "backward_spread", NULL};
/* The head's, and `fused`: true when timed as the cuda backend's fused
 * head (its backward products in the forward); absent: unfused. */
static const char *const head_keys[] = {"forward_s", "backward_s",
                                        "forward_spread", "backward_spread",
                                        "fused", NULL};
static const char *const communication_keys[] = {
    "allreduce", "sendrecv", "reducescatter", "allgather", NULL};
static const char *const sample_keys[] = {"gpus", "bytes", "time_s",
                                          "spread", "compute_lost", NULL};

static const char *const source_names[] = {"measured", "published",
                                           "derived", NULL};
/* Index order of microbatch_scaling enum values. */
static const char *const scaling_names[] = {"measured", "linear", NULL};

const char *profile_source_name(profile_source source)
{
    switch (source) {
    case PROFILE_MEASURED:
        return "measured";
    case PROFILE_PUBLISHED:
        return "published";
    case PROFILE_DERIVED:
        return "derived";
    }
    return "unknown";
}

static int get_int(const json_t *obj, const json_place *place,
                   const char *key, bool required, long long min,
                   long long max, int *out, pt_error *err)
{
    long long value = *out;
    if (json_get_int(obj, place, key, required, min, max, &value, err) != 0)
        return -1;
    *out = (int)value;
    return 0;
}

static int assumptions_from_json(const json_t *root, const json_place *place,
                                 profile *out, pt_error *err)
{
    json_place where = json_place_key(place, "assumptions");
    const json_t *obj = json_object_get(root, "assumptions");
    if (obj == NULL)
        return json_place_fail(&where, err, "missing (required)");
    int scaling = 0;
    if (json_check_keys(obj, &where, assumption_keys, err) != 0 ||
        json_get_number(obj, &where, "backward_over_forward", false, 0.0,
                        100.0, &out->backward_over_forward, err) != 0 ||
        json_get_choice(obj, &where, "microbatch_scaling", true,
                        scaling_names, &scaling, err) != 0 ||
        json_get_bool(obj, &where, "layer_times_include_tp_comm", true,
                      &out->layer_times_include_tp_comm, err) != 0 ||
        json_get_bool(obj, &where, "flash_attention", false,
                      &out->flash_attention, err) != 0)
        return -1;
    out->mbs_scaling =
        scaling == 1 ? MBS_SCALING_LINEAR : MBS_SCALING_MEASURED;
    return 0;
}

/* efficiency.roofline: every parameter is required, each in the range
 * the model gives it meaning (docs/profiles.md). */
static int roofline_from_json(const json_t *efficiency,
                              const json_place *place, profile *out,
                              pt_error *err)
{
    json_place where = json_place_key(place, "roofline");
    const json_t *obj = json_object_get(efficiency, "roofline");
    if (obj == NULL)
        return 0;
    roofline_params *r = &out->roofline;
    double half_work_gflop = 0.0, overhead_us = 0.0;
    if (json_check_keys(obj, &where, roofline_keys, err) != 0 ||
        json_get_number(obj, &where, "gemm_efficiency", true, 1e-6, 1.0,
                        &r->gemm_efficiency, err) != 0 ||
        json_get_number(obj, &where, "gemm_half_work_gflop_per_sm", true,
                        1e-9, PROFILE_MAX_HALF_WORK_GFLOP, &half_work_gflop,
                        err) != 0 ||
        json_get_number(obj, &where, "attention_efficiency", true, 1e-6, 2.0,
                        &r->attention_efficiency, err) != 0 ||
        json_get_number(obj, &where, "bandwidth_efficiency", true, 1e-6, 1.0,
                        &r->bandwidth_efficiency, err) != 0 ||
        json_get_number(obj, &where, "kernel_overhead_us", true, 0.0,
                        PROFILE_MAX_PART_SECONDS * 1e6, &overhead_us,
                        err) != 0 ||
        json_get_number(obj, &where, "bandwidth_saturation_sm_fraction", true,
                        1e-6, 1.0, &r->bandwidth_saturation_sm_fraction,
                        err) != 0)
        return -1;
    r->gemm_half_work_flop = half_work_gflop * 1e9;
    r->kernel_overhead_s = overhead_us * 1e-6;
    r->present = true;
    if (out->sms == 0) {
        json_place sms_place = json_place_key(place, "sms");
        return json_place_fail(&sms_place, err,
                               "missing (required with a roofline: its "
                               "GEMM efficiency depends on the work per SM)");
    }
    return 0;
}

static int efficiency_from_json(const json_t *root, const json_place *place,
                                profile *out, pt_error *err)
{
    json_place where = json_place_key(place, "efficiency");
    const json_t *obj = json_object_get(root, "efficiency");
    if (obj == NULL)
        return 0;
    if (json_check_keys(obj, &where, efficiency_keys, err) != 0 ||
        json_get_number(obj, &where, "peak_tflops", true, PROFILE_MIN_RATE,
                        PROFILE_MAX_TFLOPS, &out->peak_tflops, err) != 0 ||
        json_get_number(obj, &where, "fp32_tflops", false, PROFILE_MIN_RATE,
                        PROFILE_MAX_TFLOPS, &out->fp32_tflops, err) != 0 ||
        json_get_number(obj, &where, "tf32_tflops", false, PROFILE_MIN_RATE,
                        PROFILE_MAX_TFLOPS, &out->tf32_tflops, err) != 0 ||
        json_get_number(obj, &where, "flops_efficiency", false, 0.0, 1.0,
                        &out->flops_efficiency, err) != 0 ||
        json_get_number(obj, &where, "memory_bandwidth_GBps", true,
                        PROFILE_MIN_RATE, PROFILE_MAX_BANDWIDTH_GBPS,
                        &out->memory_bandwidth_GBps, err) != 0 ||
        get_int(obj, &where, "sms", false, 1, 100000, &out->sms, err) != 0 ||
        get_int(obj, &where, "sm_limit", false, 1, 100000, &out->sm_limit,
                err) != 0)
        return -1;
    if (out->sm_limit > 0 && out->sms == 0) {
        json_place sms_place = json_place_key(&where, "sms");
        return json_place_fail(&sms_place, err,
                               "missing (required with sm_limit: the limit "
                               "is a share of the GPU's SMs)");
    }
    if (out->sm_limit > out->sms) {
        json_place limit_place = json_place_key(&where, "sm_limit");
        return json_place_fail(&limit_place, err,
                               "%d is more than the GPU's %d SMs",
                               out->sm_limit, out->sms);
    }
    return roofline_from_json(obj, &where, out, err);
}

/* fused: NULL for a part without the key (the embedding, the layer). */
static int part_from_json(const json_t *point, const json_place *place,
                          const char *key, double backward_over_forward,
                          part_cost *out, bool *fused, pt_error *err)
{
    json_place where = json_place_key(place, key);
    const json_t *obj = json_object_get(point, key);
    if (obj == NULL)
        return json_place_fail(&where, err, "missing (required)");
    bool backward_required = !(backward_over_forward > 0.0);
    out->backward_s = 0.0;
    if (fused)
        *fused = false;
    if (json_check_keys(obj, &where, fused ? head_keys : part_keys, err) !=
            0 ||
        (fused && json_get_bool(obj, &where, "fused", false, fused, err) !=
                      0) ||
        json_get_positive_number(obj, &where, "forward_s", true,
                                 &out->forward_s, err) != 0 ||
        json_get_number(obj, &where, "forward_spread", false, 0.0, 1000.0,
                        &out->forward_spread, err) != 0 ||
        json_get_number(obj, &where, "backward_spread", false, 0.0, 1000.0,
                        &out->backward_spread, err) != 0)
        return -1;
    if (backward_required && json_object_get(obj, "backward_s") == NULL) {
        json_place backward_place = json_place_key(&where, "backward_s");
        return json_place_fail(&backward_place, err,
                               "missing (required unless "
                               "assumptions.backward_over_forward > 0)");
    }
    if (json_get_positive_number(obj, &where, "backward_s", false,
                                 &out->backward_s, err) != 0)
        return -1;
    if (out->backward_s == 0.0)
        out->backward_s = backward_over_forward * out->forward_s;
    if (out->forward_s > PROFILE_MAX_PART_SECONDS ||
        out->backward_s > PROFILE_MAX_PART_SECONDS)
        return json_place_fail(&where, err,
                               "%g s forward / %g s backward is more than "
                               "%g s per micro-batch: a unit mistake?",
                               out->forward_s, out->backward_s,
                               PROFILE_MAX_PART_SECONDS);
    return 0;
}

static bool is_power_of_two(int value)
{
    return value > 0 && (value & (value - 1)) == 0;
}

static int point_from_json(const json_t *obj, const json_place *place,
                           const profile_shape *shape,
                           double backward_over_forward, profile_point *out,
                           pt_error *err)
{
    if (json_check_keys(obj, place, point_keys, err) != 0 ||
        get_int(obj, place, "tp", true, 1, 1024, &out->tp, err) != 0 ||
        get_int(obj, place, "mbs", true, 1, 1 << 20, &out->mbs, err) != 0)
        return -1;
    json_place tp_place = json_place_key(place, "tp");
    if (!is_power_of_two(out->tp))
        return json_place_fail(&tp_place, err,
                               "must be a power of two, got %d", out->tp);
    if (shape->hidden % out->tp != 0 || shape->ffn_hidden % out->tp != 0 ||
        shape->heads % out->tp != 0)
        return json_place_fail(&tp_place, err,
                               "%d does not divide hidden %d, ffn_hidden %d "
                               "and heads %d",
                               out->tp, shape->hidden, shape->ffn_hidden,
                               shape->heads);
    /* grouped-query attention: whole key/value heads a rank, or one
       copied (as model_check_tp allows) */
    int kv = shape->kv_heads > 0 ? shape->kv_heads : shape->heads;
    if (kv % out->tp != 0 && out->tp % kv != 0)
        return json_place_fail(&tp_place, err,
                               "%d neither divides the %d key/value heads "
                               "nor is a multiple of them",
                               out->tp, kv);
    if (part_from_json(obj, place, "embedding", backward_over_forward,
                       &out->embedding, NULL, err) != 0 ||
        part_from_json(obj, place, "layer", backward_over_forward,
                       &out->layer, NULL, err) != 0 ||
        part_from_json(obj, place, "head", backward_over_forward, &out->head,
                       &out->head_fused, err) != 0)
        return -1;
    return 0;
}

static int compare_points(const void *a, const void *b)
{
    const profile_point *left = a, *right = b;
    if (left->tp != right->tp)
        return left->tp < right->tp ? -1 : 1;
    return (left->mbs > right->mbs) - (left->mbs < right->mbs);
}

/* A part that takes clearly less time at a larger micro-batch than at a
 * smaller one (same tp) is a mislabelled or broken measurement. Points
 * are sorted, so each point is compared with the one before it. */
static int check_micro_batch_order(const profile_shape *shape,
                                   const json_place *costs_place,
                                   pt_error *err)
{
    static const char *const part_names[] = {"embedding", "layer", "head"};
    for (int i = 1; i < shape->point_count; i++) {
        const profile_point *small = &shape->points[i - 1];
        const profile_point *large = &shape->points[i];
        if (small->tp != large->tp)
            continue;
        const part_cost *small_parts[] = {&small->embedding, &small->layer,
                                          &small->head};
        const part_cost *large_parts[] = {&large->embedding, &large->layer,
                                          &large->head};
        for (int part = 0; part < 3; part++) {
            double before = small_parts[part]->forward_s;
            double after = large_parts[part]->forward_s;
            if (after >= (1.0 - PROFILE_MBS_NOISE) * before ||
                before < PROFILE_MBS_NOISE_FLOOR_S)
                continue;
            return json_place_fail(
                costs_place, err,
                "inconsistent: at tp %d the %s forward takes %g s at mbs "
                "%d but only %g s at mbs %d (a larger micro-batch cannot "
                "be more than %.0f%% faster)",
                large->tp, part_names[part], before, small->mbs, after,
                large->mbs, 100.0 * PROFILE_MBS_NOISE);
        }
    }
    return 0;
}

static int costs_from_json(const json_t *obj, const json_place *place,
                           double backward_over_forward, profile_shape *out,
                           pt_error *err)
{
    json_place where = json_place_key(place, "costs");
    const json_t *costs = json_object_get(obj, "costs");
    if (costs == NULL)
        return json_place_fail(&where, err, "missing (required)");
    if (!json_is_array(costs) || json_array_size(costs) == 0)
        return json_place_fail(&where, err,
                               "must be a non-empty array of cost points");
    size_t count = json_array_size(costs);
    out->points = calloc(count, sizeof *out->points);
    if (out->points == NULL)
        return json_place_fail(&where, err, "out of memory");
    out->point_count = (int)count;
    for (size_t i = 0; i < count; i++) {
        json_place point_place = json_place_index(&where, i);
        if (point_from_json(json_array_get(costs, i), &point_place, out,
                            backward_over_forward, &out->points[i],
                            err) != 0)
            return -1;
        for (size_t j = 0; j < i; j++)
            if (out->points[j].tp == out->points[i].tp &&
                out->points[j].mbs == out->points[i].mbs)
                return json_place_fail(&point_place, err,
                                       "tp %d, mbs %d is already given in "
                                       "costs[%zu]",
                                       out->points[i].tp, out->points[i].mbs,
                                       j);
    }
    qsort(out->points, count, sizeof *out->points, compare_points);
    return check_micro_batch_order(out, &where, err);
}

static int shape_from_json(const json_t *obj, const json_place *place,
                           double backward_over_forward, profile_shape *out,
                           pt_error *err)
{
    if (json_check_keys(obj, place, shape_keys, err) != 0 ||
        get_int(obj, place, "hidden", true, 1, 1000000, &out->hidden, err) !=
            0 ||
        get_int(obj, place, "heads", true, 1, 1000000, &out->heads, err) !=
            0)
        return -1;
    out->ffn_hidden = 4 * out->hidden;
    if (get_int(obj, place, "ffn_hidden", false, 1, 4000000,
                &out->ffn_hidden, err) != 0 ||
        get_int(obj, place, "seq", true, 1, 10000000, &out->seq, err) != 0 ||
        get_int(obj, place, "vocab", true, 1, 100000000, &out->vocab, err) !=
            0)
        return -1;
    if (out->hidden % out->heads != 0) {
        json_place heads_place = json_place_key(place, "heads");
        return json_place_fail(&heads_place, err,
                               "%d does not divide hidden %d (every head "
                               "has hidden / heads dimensions)",
                               out->heads, out->hidden);
    }
    model_shape layer = {.hidden = out->hidden, .heads = out->heads};
    if (model_architecture_from_json(obj, place, &layer, err) != 0)
        return -1;
    out->kv_heads = layer.kv_heads != layer.heads ? layer.kv_heads : 0;
    out->norm = layer.norm;
    out->mlp = layer.mlp;
    out->positions = layer.positions;
    out->bias = layer.bias;
    return costs_from_json(obj, place, backward_over_forward, out, err);
}

static bool same_shape_key(const profile_shape *a, const profile_shape *b)
{
    model_shape key = profile_shape_model(a);
    return profile_shape_prices(b, &key);
}

static int shapes_from_json(const json_t *root, const json_place *place,
                            profile *out, pt_error *err)
{
    json_place where = json_place_key(place, "shapes");
    const json_t *shapes = json_object_get(root, "shapes");
    if (shapes == NULL)
        return 0;
    if (!json_is_array(shapes))
        return json_place_fail(&where, err, "must be an array of shapes");
    size_t count = json_array_size(shapes);
    if (count == 0)
        return 0;
    out->shapes = calloc(count, sizeof *out->shapes);
    if (out->shapes == NULL)
        return json_place_fail(&where, err, "out of memory");
    out->shape_count = (int)count;
    for (size_t i = 0; i < count; i++) {
        json_place shape_place = json_place_index(&where, i);
        if (shape_from_json(json_array_get(shapes, i), &shape_place,
                            out->backward_over_forward, &out->shapes[i],
                            err) != 0)
            return -1;
        for (size_t j = 0; j < i; j++)
            if (same_shape_key(&out->shapes[j], &out->shapes[i]))
                return json_place_fail(&shape_place, err,
                                       "same hidden, ffn_hidden, seq, vocab "
                                       "and layer architecture as "
                                       "shapes[%zu]",
                                       j);
    }
    return 0;
}

static int compare_samples(const void *a, const void *b)
{
    const comm_sample *left = a, *right = b;
    if (left->gpus != right->gpus)
        return left->gpus < right->gpus ? -1 : 1;
    return (left->bytes > right->bytes) - (left->bytes < right->bytes);
}

static int curve_from_json(const json_t *communication,
                           const json_place *place, const char *key,
                           comm_curve *out, pt_error *err)
{
    json_place where = json_place_key(place, key);
    const json_t *samples = json_object_get(communication, key);
    if (samples == NULL)
        return 0;
    if (!json_is_array(samples))
        return json_place_fail(&where, err, "must be an array of samples");
    size_t count = json_array_size(samples);
    if (count == 0)
        return 0;
    out->samples = calloc(count, sizeof *out->samples);
    if (out->samples == NULL)
        return json_place_fail(&where, err, "out of memory");
    out->sample_count = (int)count;
    for (size_t i = 0; i < count; i++) {
        json_place sample_place = json_place_index(&where, i);
        const json_t *obj = json_array_get(samples, i);
        comm_sample *sample = &out->samples[i];
        if (json_check_keys(obj, &sample_place, sample_keys, err) != 0 ||
            get_int(obj, &sample_place, "gpus", true, 2, 1 << 20,
                    &sample->gpus, err) != 0 ||
            json_get_number(obj, &sample_place, "bytes", true, 1.0,
                            PROFILE_MAX_MESSAGE_BYTES, &sample->bytes,
                            err) != 0 ||
            json_get_positive_number(obj, &sample_place, "time_s", true,
                                     &sample->time_s, err) != 0 ||
            json_get_number(obj, &sample_place, "spread", false, 0.0, 1000.0,
                            &sample->spread, err) != 0 ||
            json_get_number(obj, &sample_place, "compute_lost", false, 1e-3,
                            10.0, &sample->compute_lost, err) != 0)
            return -1;
        if (sample->time_s > PROFILE_MAX_PART_SECONDS)
            return json_place_fail(&sample_place, err,
                                   "%g s for one collective is more than "
                                   "%g s: a unit mistake?",
                                   sample->time_s, PROFILE_MAX_PART_SECONDS);
        for (size_t j = 0; j < i; j++)
            if (out->samples[j].gpus == sample->gpus &&
                out->samples[j].bytes == sample->bytes)
                return json_place_fail(&sample_place, err,
                                       "%d GPUs, %g bytes is already given "
                                       "in %s[%zu]",
                                       sample->gpus, sample->bytes, key, j);
    }
    qsort(out->samples, count, sizeof *out->samples, compare_samples);
    return 0;
}

static int communication_from_json(const json_t *root,
                                   const json_place *place, profile *out,
                                   pt_error *err)
{
    json_place where = json_place_key(place, "communication");
    const json_t *obj = json_object_get(root, "communication");
    if (obj == NULL)
        return 0;
    if (json_check_keys(obj, &where, communication_keys, err) != 0 ||
        curve_from_json(obj, &where, "allreduce", &out->allreduce, err) !=
            0 ||
        curve_from_json(obj, &where, "sendrecv", &out->sendrecv, err) != 0 ||
        curve_from_json(obj, &where, "reducescatter", &out->reduce_scatter,
                        err) != 0 ||
        curve_from_json(obj, &where, "allgather", &out->all_gather, err) !=
            0)
        return -1;
    return 0;
}

/* A time per parameter no optimizer takes: a unit mistake. */
static int per_param_bounded(const json_place *place, const char *key,
                             double value, pt_error *err)
{
    if (value <= PROFILE_MAX_OPTIMIZER_S_PER_PARAM)
        return 0;
    json_place where = json_place_key(place, key);
    return json_place_fail(&where, err,
                           "%g s per parameter is more than %g: a unit "
                           "mistake?",
                           value, PROFILE_MAX_OPTIMIZER_S_PER_PARAM);
}

static int header_from_json(const json_t *obj, const json_place *place,
                            profile *out, pt_error *err)
{
    char format[64] = PROFILE_FORMAT;
    int source = 0;
    if (json_check_keys(obj, place, profile_keys, err) != 0 ||
        json_get_string(obj, place, "format", false, format, sizeof format,
                        err) != 0)
        return -1;
    if (strcmp(format, PROFILE_FORMAT) != 0) {
        json_place where = json_place_key(place, "format");
        return json_place_fail(&where, err, "must be \"%s\", got \"%s\"",
                               PROFILE_FORMAT, format);
    }
    if (json_get_string(obj, place, "gpu", true, out->gpu, sizeof out->gpu,
                        err) != 0 ||
        json_get_number(obj, place, "memory_gib", true, PROFILE_MIN_GIB,
                        PROFILE_MAX_GIB, &out->memory_gib, err) != 0 ||
        json_get_choice(obj, place, "source", true, source_names, &source,
                        err) != 0 ||
        json_get_number(obj, place, "workspace_gib", true, 0.0,
                        PROFILE_MAX_GIB, &out->workspace_gib, err) != 0 ||
        json_get_positive_number(obj, place, "optimizer_s_per_param", true,
                                 &out->optimizer_s_per_param, err) != 0 ||
        json_get_positive_number(obj, place, "host_adamw_s_per_param", false,
                                 &out->host_adamw_s_per_param, err) != 0 ||
        json_get_positive_number(obj, place, "host_copy_s_per_param", false,
                                 &out->host_copy_s_per_param, err) != 0)
        return -1;
    out->source = (profile_source)source;
    if (per_param_bounded(place, "optimizer_s_per_param",
                          out->optimizer_s_per_param, err) != 0 ||
        per_param_bounded(place, "host_adamw_s_per_param",
                          out->host_adamw_s_per_param, err) != 0 ||
        per_param_bounded(place, "host_copy_s_per_param",
                          out->host_copy_s_per_param, err) != 0)
        return -1;
    if (out->gpu[0] == '\0' || strchr(out->gpu, '/') != NULL) {
        json_place where = json_place_key(place, "gpu");
        return json_place_fail(&where, err,
                               "must be a non-empty name without '/'");
    }
    if (out->workspace_gib >= out->memory_gib) {
        json_place where = json_place_key(place, "workspace_gib");
        return json_place_fail(&where, err,
                               "%g GiB leaves nothing of memory_gib %g GiB",
                               out->workspace_gib, out->memory_gib);
    }
    json_place provenance_place = json_place_key(place, "provenance");
    const json_t *provenance = json_object_get(obj, "provenance");
    if (provenance == NULL)
        return json_place_fail(&provenance_place, err,
                               "missing (required: say where the numbers "
                               "come from)");
    if (json_expect_object(provenance, &provenance_place, err) != 0)
        return -1;
    if (json_object_size(provenance) == 0)
        return json_place_fail(&provenance_place, err,
                               "must not be empty: say where the numbers "
                               "come from");
    out->provenance = json_deep_copy(provenance);
    if (out->provenance == NULL)
        return json_place_fail(&provenance_place, err, "out of memory");
    const json_t *notes = json_object_get(obj, "notes");
    if (notes != NULL && (out->notes = json_deep_copy(notes)) == NULL) {
        json_place where = json_place_key(place, "notes");
        return json_place_fail(&where, err, "out of memory");
    }
    return 0;
}

/* Rules that tie fields together: something must price the layers. */
static int check_profile_whole(const profile *p, const json_place *place,
                               pt_error *err)
{
    bool has_efficiency = p->peak_tflops > 0.0;
    if (p->shape_count == 0 && !has_efficiency)
        return json_place_fail(place, err,
                               "has no shapes and no efficiency model: "
                               "nothing prices a layer");
    if (p->shape_count == 0 && p->flops_efficiency == 0.0 &&
        !p->roofline.present) {
        json_place where = json_place_key(place, "efficiency");
        return json_place_fail(&where, err,
                               "flops_efficiency 0 means \"fit it on the "
                               "shapes\", but there are no shapes: give a "
                               "fraction in (0, 1] or a roofline");
    }
    if (p->source == PROFILE_DERIVED && !has_efficiency) {
        json_place where = json_place_key(place, "efficiency");
        return json_place_fail(&where, err,
                               "missing (required when source is "
                               "\"derived\")");
    }
    return 0;
}

int profile_from_json(const json_t *obj, const json_place *place,
                      profile *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (header_from_json(obj, place, out, err) != 0 ||
        assumptions_from_json(obj, place, out, err) != 0 ||
        efficiency_from_json(obj, place, out, err) != 0 ||
        shapes_from_json(obj, place, out, err) != 0 ||
        communication_from_json(obj, place, out, err) != 0 ||
        check_profile_whole(out, place, err) != 0) {
        profile_free(out);
        return -1;
    }
    return 0;
}

int profile_load_file(const char *path, profile *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    json_place place = json_place_root(path);
    int status = profile_from_json(root, &place, out, err);
    json_decref(root);
    return status;
}

/* ------------------------------------------------------------- writing */

/* A reference to a kept object (provenance, notes): NULL counts as a
 * failure in json_put. */
static json_t *kept(json_t *value)
{
    return value != NULL ? json_incref(value) : NULL;
}

static json_t *assumptions_to_json(const profile *p, int *failures)
{
    json_t *obj = json_object();
    if (p->backward_over_forward > 0.0)
        json_put(obj, "backward_over_forward",
                 json_real(p->backward_over_forward), failures);
    json_put(obj, "microbatch_scaling",
             json_string(scaling_names[p->mbs_scaling == MBS_SCALING_LINEAR
                                           ? 1
                                           : 0]),
             failures);
    json_put(obj, "layer_times_include_tp_comm",
             json_boolean(p->layer_times_include_tp_comm), failures);
    if (p->flash_attention)
        json_put(obj, "flash_attention", json_true(), failures);
    return obj;
}

/* The roofline to 4 significant digits: a fit is known no finer. */
static json_t *roofline_to_json(const roofline_params *r, int *failures)
{
    json_t *obj = json_object();
    json_put(obj, "gemm_efficiency",
             json_real(pt_round_significant(r->gemm_efficiency, 4)),
             failures);
    json_put(obj, "gemm_half_work_gflop_per_sm",
             json_real(pt_round_significant(r->gemm_half_work_flop / 1e9, 4)),
             failures);
    json_put(obj, "attention_efficiency",
             json_real(pt_round_significant(r->attention_efficiency, 4)),
             failures);
    json_put(obj, "bandwidth_efficiency",
             json_real(pt_round_significant(r->bandwidth_efficiency, 4)),
             failures);
    json_put(obj, "kernel_overhead_us",
             json_real(pt_round_significant(r->kernel_overhead_s * 1e6, 4)),
             failures);
    json_put(obj, "bandwidth_saturation_sm_fraction",
             json_real(pt_round_significant(
                 r->bandwidth_saturation_sm_fraction, 4)),
             failures);
    return obj;
}

/* flops_efficiency is written only without a roofline (with one, the
 * roofline prices every shape and the figure means nothing). */
static json_t *efficiency_to_json(const profile *p, int *failures)
{
    json_t *obj = json_object();
    json_put(obj, "peak_tflops", json_real(p->peak_tflops), failures);
    if (p->fp32_tflops > 0.0)
        json_put(obj, "fp32_tflops", json_real(p->fp32_tflops), failures);
    if (p->tf32_tflops > 0.0)
        json_put(obj, "tf32_tflops", json_real(p->tf32_tflops), failures);
    if (!p->roofline.present)
        json_put(obj, "flops_efficiency", json_real(p->flops_efficiency),
                 failures);
    json_put(obj, "memory_bandwidth_GBps",
             json_real(p->memory_bandwidth_GBps), failures);
    if (p->sms > 0)
        json_put(obj, "sms", json_integer(p->sms), failures);
    if (p->sm_limit > 0)
        json_put(obj, "sm_limit", json_integer(p->sm_limit), failures);
    if (p->roofline.present)
        json_put(obj, "roofline", roofline_to_json(&p->roofline, failures),
                 failures);
    return obj;
}

/* Spreads are written for measured profiles, which always have them. */
static json_t *part_to_json(const part_cost *part, bool spreads,
                            int *failures)
{
    json_t *obj = json_object();
    json_put(obj, "forward_s", json_real(part->forward_s), failures);
    json_put(obj, "backward_s", json_real(part->backward_s), failures);
    if (spreads) {
        json_put(obj, "forward_spread", json_real(part->forward_spread),
                 failures);
        json_put(obj, "backward_spread", json_real(part->backward_spread),
                 failures);
    }
    return obj;
}

static json_t *shape_to_json(const profile_shape *shape, bool spreads,
                             int *failures)
{
    json_t *obj = json_object();
    json_put(obj, "hidden", json_integer(shape->hidden), failures);
    json_put(obj, "heads", json_integer(shape->heads), failures);
    json_put(obj, "ffn_hidden", json_integer(shape->ffn_hidden), failures);
    json_put(obj, "seq", json_integer(shape->seq), failures);
    json_put(obj, "vocab", json_integer(shape->vocab), failures);
    model_shape layer = profile_shape_model(shape);
    model_architecture_to_json(&layer, false, obj, failures);
    json_t *costs = json_array();
    for (int i = 0; i < shape->point_count; i++) {
        const profile_point *point = &shape->points[i];
        json_t *entry = json_object();
        json_put(entry, "tp", json_integer(point->tp), failures);
        json_put(entry, "mbs", json_integer(point->mbs), failures);
        json_put(entry, "embedding",
                 part_to_json(&point->embedding, spreads, failures), failures);
        json_put(entry, "layer", part_to_json(&point->layer, spreads, failures),
                 failures);
        json_t *head = part_to_json(&point->head, spreads, failures);
        if (point->head_fused) /* absent: unfused, as every older file */
            json_put(head, "fused", json_true(), failures);
        json_put(entry, "head", head, failures);
        json_push(costs, entry, failures);
    }
    json_put(obj, "costs", costs, failures);
    return obj;
}

static json_t *curve_to_json(const comm_curve *curve, bool spreads,
                             int *failures)
{
    json_t *array = json_array();
    for (int i = 0; i < curve->sample_count; i++) {
        const comm_sample *sample = &curve->samples[i];
        json_t *entry = json_object();
        json_put(entry, "gpus", json_integer(sample->gpus), failures);
        json_put(entry, "bytes", json_real(sample->bytes), failures);
        json_put(entry, "time_s", json_real(sample->time_s), failures);
        if (spreads)
            json_put(entry, "spread", json_real(sample->spread), failures);
        if (sample->compute_lost > 0.0) /* measured at a few sizes */
            json_put(entry, "compute_lost", json_real(sample->compute_lost),
                     failures);
        json_push(array, entry, failures);
    }
    return array;
}

static json_t *profile_build_json(const profile *p, int *failures)
{
    bool spreads = p->source == PROFILE_MEASURED;
    json_t *root = json_object();
    json_put(root, "format", json_string(PROFILE_FORMAT), failures);
    json_put(root, "gpu", json_string(p->gpu), failures);
    json_put(root, "memory_gib", json_real(p->memory_gib), failures);
    json_put(root, "source", json_string(profile_source_name(p->source)),
             failures);
    json_put(root, "provenance", kept(p->provenance), failures);
    json_put(root, "assumptions", assumptions_to_json(p, failures), failures);
    json_put(root, "workspace_gib", json_real(p->workspace_gib), failures);
    json_put(root, "optimizer_s_per_param",
             json_real(p->optimizer_s_per_param), failures);
    if (p->host_adamw_s_per_param > 0.0)
        json_put(root, "host_adamw_s_per_param",
                 json_real(p->host_adamw_s_per_param), failures);
    if (p->host_copy_s_per_param > 0.0)
        json_put(root, "host_copy_s_per_param",
                 json_real(p->host_copy_s_per_param), failures);
    if (p->peak_tflops > 0.0)
        json_put(root, "efficiency", efficiency_to_json(p, failures),
                 failures);
    if (p->shape_count > 0) {
        json_t *shapes = json_array();
        for (int i = 0; i < p->shape_count; i++)
            json_push(shapes, shape_to_json(&p->shapes[i], spreads, failures),
                 failures);
        json_put(root, "shapes", shapes, failures);
    }
    if (p->allreduce.sample_count > 0 || p->sendrecv.sample_count > 0) {
        json_t *communication = json_object();
        json_put(communication, "allreduce",
                 curve_to_json(&p->allreduce, spreads, failures), failures);
        json_put(communication, "sendrecv",
                 curve_to_json(&p->sendrecv, spreads, failures), failures);
        /* measured since 2026-11-29: profiles before hold neither */
        if (p->reduce_scatter.sample_count > 0)
            json_put(communication, "reducescatter",
                     curve_to_json(&p->reduce_scatter, spreads, failures),
                     failures);
        if (p->all_gather.sample_count > 0)
            json_put(communication, "allgather",
                     curve_to_json(&p->all_gather, spreads, failures),
                     failures);
        json_put(root, "communication", communication, failures);
    }
    if (p->notes != NULL)
        json_put(root, "notes", kept(p->notes), failures);
    return root;
}

json_t *profile_to_json(const profile *p, const char *label, pt_error *err)
{
    int failures = 0;
    json_t *root = profile_build_json(p, &failures);
    if (root == NULL || failures > 0) {
        json_decref(root);
        pt_fail(err, "%s: out of memory writing the profile", label);
        return NULL;
    }
    profile loaded;
    json_place place = json_place_root(label);
    if (profile_from_json(root, &place, &loaded, err) != 0) {
        json_decref(root);
        return NULL;
    }
    profile_free(&loaded);
    return root;
}

int profile_copy(profile *dst, const profile *src, pt_error *err)
{
    *dst = *src;
    dst->shapes = NULL;
    dst->shape_count = 0;
    dst->allreduce = (comm_curve){0, NULL};
    dst->sendrecv = (comm_curve){0, NULL};
    dst->reduce_scatter = (comm_curve){0, NULL};
    dst->all_gather = (comm_curve){0, NULL};
    dst->provenance = src->provenance ? json_deep_copy(src->provenance)
                                      : NULL;
    dst->notes = src->notes ? json_deep_copy(src->notes) : NULL;
    if ((src->provenance && !dst->provenance) || (src->notes && !dst->notes))
        goto out_of_memory;
    if (src->shape_count > 0) {
        dst->shapes = calloc((size_t)src->shape_count, sizeof *dst->shapes);
        if (!dst->shapes)
            goto out_of_memory;
    }
    for (int i = 0; i < src->shape_count; i++) {
        const profile_shape *from = &src->shapes[i];
        profile_shape *to = &dst->shapes[i];
        *to = *from;
        to->points = NULL;
        to->point_count = 0;
        if (from->point_count > 0) {
            to->points = malloc((size_t)from->point_count *
                                sizeof *to->points);
            if (!to->points)
                goto out_of_memory;
            memcpy(to->points, from->points,
                   (size_t)from->point_count * sizeof *to->points);
            to->point_count = from->point_count;
        }
        dst->shape_count = i + 1;
    }
    const comm_curve *curves_from[4] = {&src->allreduce, &src->sendrecv,
                                        &src->reduce_scatter,
                                        &src->all_gather};
    comm_curve *curves_to[4] = {&dst->allreduce, &dst->sendrecv,
                                &dst->reduce_scatter, &dst->all_gather};
    for (int c = 0; c < 4; c++) {
        if (curves_from[c]->sample_count <= 0)
            continue;
        size_t size = (size_t)curves_from[c]->sample_count *
                      sizeof(comm_sample);
        curves_to[c]->samples = malloc(size);
        if (!curves_to[c]->samples)
            goto out_of_memory;
        memcpy(curves_to[c]->samples, curves_from[c]->samples, size);
        curves_to[c]->sample_count = curves_from[c]->sample_count;
    }
    return 0;

out_of_memory:
    profile_free(dst);
    return pt_fail(err, "profile %s: out of memory while copying it",
                   src->gpu);
}

void profile_free(profile *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->shape_count; i++)
        free(p->shapes[i].points);
    free(p->shapes);
    free(p->allreduce.samples);
    free(p->sendrecv.samples);
    free(p->reduce_scatter.samples);
    free(p->all_gather.samples);
    json_decref(p->provenance);
    json_decref(p->notes);
    memset(p, 0, sizeof *p);
}

/* The shape of p with from's key (widths and architecture); -1. */
static int find_same_shape(const profile *p, const profile_shape *from)
{
    model_shape key = profile_shape_model(from);
    return profile_find_shape(p, &key);
}

int profile_add_points(profile *into, const profile *from, int *added,
                       pt_error *err)
{
    *added = 0;
    for (int i = 0; i < from->shape_count; i++) {
        const profile_shape *source = &from->shapes[i];
        int at = find_same_shape(into, source);
        if (at < 0) {
            profile_shape *grown = realloc(into->shapes,
                                           (size_t)(into->shape_count + 1) *
                                               sizeof *grown);
            if (!grown)
                return pt_fail(err, "profile: out of memory");
            into->shapes = grown;
            at = into->shape_count++;
            into->shapes[at] = *source;
            into->shapes[at].point_count = 0;
            into->shapes[at].points = NULL;
        }
        profile_shape *target = &into->shapes[at];
        size_t room = (size_t)(target->point_count + source->point_count);
        profile_point *points = realloc(target->points,
                                        (room > 0 ? room : 1) *
                                            sizeof *points);
        if (!points)
            return pt_fail(err, "profile: out of memory");
        target->points = points;
        for (int j = 0; j < source->point_count; j++) {
            const profile_point *point = &source->points[j];
            if (profile_find_point(target, point->tp, point->mbs) >= 0)
                continue;
            target->points[target->point_count++] = *point;
            (*added)++;
        }
        qsort(target->points, (size_t)target->point_count,
              sizeof *target->points, compare_points);
    }
    return 0;
}

int profile_find_point(const profile_shape *shape, int tp, int mbs)
{
    for (int i = 0; i < shape->point_count; i++)
        if (shape->points[i].tp == tp && shape->points[i].mbs == mbs)
            return i;
    return -1;
}
