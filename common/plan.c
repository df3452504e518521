/* plan.json: the degrees, partition and node order of a training run.
 * This file is the one owner of the format: it reads plans (checking
 * everything that can be checked without a cost model) and writes them.
 *
 * The plan lives in common/ because every layer reads it (the executor
 * too, which sits beside costmodel, not above it). What plan.json carries
 * beside the plan proper, the estimate above all, is content of higher
 * layers: each is built by its owner (the estimate by costmodel's
 * estimate_to_json) and handed to plan_to_json as a JSON section, so no
 * layer includes one above it. The reader accepts those sections and
 * does not read them: an estimate is always made afresh. */
#include "common/common.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_FORMAT "partita-plan/1"

/* `estimate` and `alternatives` are output of `plan` / `estimate`; a plan
 * that carries them is still a plan. */
static const char *const plan_keys[] = {
    "format", "model", "cluster", "gbs", "mbs", "tp", "dp", "pp",
    "partition", "stages", "node_order", "schedule", "precision", "recompute",
    "distributed_optimizer", "zero", "offload_optimizer", "virtual_stages",
    "sequence_parallel", "runtime", "attention", "overlap_grad_reduce",
    "overlap_param_gather", "tf32", "deterministic",
    "grad_precision", "origin", "estimate", "alternatives", "pareto", NULL};
static const char *const origin_keys[] = {"model", "cluster", NULL};

/* In enum order. */
static const char *const schedule_names[] = {"1f1b", "gpipe", NULL};
static const char *const precision_names[] = {"bf16", "fp16", "fp32", NULL};
static const char *const recompute_names[] = {"none", "full", "selective",
                                              NULL};
static const char *const runtime_names[] = {"partita", "megatron",
                                            "deepspeed", NULL};
static const char *const attention_names[] = {"default", "flash",
                                              "unfused", NULL};
static const char *const grad_precision_names[] = {"fp32", "bf16", NULL};

const char *grad_precision_name(grad_precision_kind kind)
{
    return kind == GRAD_PRECISION_BF16 ? "bf16" : "fp32";
}

int grad_precision_parse(const char *name, grad_precision_kind *out,
                         pt_error *err)
{
    for (int i = 0; grad_precision_names[i] != NULL; i++)
        if (strcmp(name, grad_precision_names[i]) == 0) {
            *out = (grad_precision_kind)i;
            return 0;
        }
    return pt_fail(err, "grad precision '%s': expected fp32 or bf16", name);
}

int parallel_check_grad_precision(const parallel_config *config,
                                  pt_error *err)
{
    if (config->grad_precision == GRAD_PRECISION_BF16 &&
        config->precision != PRECISION_BF16)
        return pt_fail(err, "bf16 gradients only with precision bf16 (the "
                            "plan's precision is %s)",
                       precision_name(config->precision));
    return 0;
}

const char *runtime_name(runtime_kind kind)
{
    return kind >= RUNTIME_PARTITA && kind <= RUNTIME_DEEPSPEED
               ? runtime_names[kind]
               : "partita";
}

const char *attention_name(attention_kind kind)
{
    return kind >= ATTENTION_DEFAULT && kind <= ATTENTION_UNFUSED
               ? attention_names[kind]
               : "default";
}

attention_kind parallel_attention(const parallel_config *config)
{
    if (config->attention != ATTENTION_DEFAULT)
        return config->attention;
    return config->runtime == RUNTIME_DEEPSPEED ? ATTENTION_UNFUSED
                                                : ATTENTION_FLASH;
}

int parallel_residual_bytes(const parallel_config *config)
{
    /* every runtime keeps it in the activations' precision (the partita
     * cuda backend's bf16 stream, Megatron-LM without
     * --fp32-residual-connection) */
    return precision_bytes(config->precision);
}

int parallel_gradient_bytes(const parallel_config *config)
{
    if (config->grad_precision == GRAD_PRECISION_BF16)
        return 2;
    if (config->runtime != RUNTIME_PARTITA &&
        config->precision == PRECISION_FP16)
        return 2;
    return 4;
}

bool parallel_overlaps_grad_reduce(const parallel_config *config)
{
    /* Partita's executor sums the buckets of a rank's one chunk as its
     * last backward goes; interleaved, each chunk's buffer is summed whole
     * after the backward (executor/parallel/step.c) */
    if (config->runtime == RUNTIME_PARTITA)
        return parallel_virtual_stages(config) == 1;
    return config->overlap_grad_reduce;
}

/* "virtual_stages" and "sequence_parallel", after the degrees and the
 * model; absent in older plans: 1 and false. */
static int schedule_levers_part(const json_t *obj, const json_place *place,
                                plan *out, pt_error *err)
{
    long long virtual_stages = 1;
    if (json_get_int(obj, place, "virtual_stages", false, 1,
                     PLAN_MAX_VIRTUAL_STAGES, &virtual_stages, err) != 0 ||
        json_get_bool(obj, place, "sequence_parallel", false,
                      &out->config.sequence_parallel, err) != 0)
        return -1;
    out->config.virtual_stages = (int)virtual_stages;
    if (parallel_check_schedule_levers(&out->config, out->model.seq, err) !=
        0) {
        pt_error_prefix(err, "%s", place->file);
        return -1;
    }
    return 0;
}

/* Megatron splits each rank's layers evenly over its chunks: every stage
 * of an interleaved plan holds a multiple of virtual_stages layers. */
static int interleave_partition_part(const plan *p, const json_place *place,
                                     pt_error *err)
{
    int v = parallel_virtual_stages(&p->config);
    for (int s = 0; s < p->config.pp && v > 1; s++)
        if (p->partition[s] % v != 0) {
            json_place where = json_place_key(place, "partition");
            return json_place_fail(&where, err,
                                   "stage %d holds %d layers, not a multiple "
                                   "of virtual_stages %d (each rank's "
                                   "layers are split evenly over its chunks)",
                                   s, p->partition[s], v);
        }
    return 0;
}

/* ------------------------------------------------------------ partition */

int partition_parse(const char *text, int *out, int max_stages,
                    int *out_count, pt_error *err)
{
    *out_count = 0;
    if (text == NULL || text[0] == '\0')
        return pt_fail(err, "partition \"\" is empty: write layers per "
                            "stage as \"a-b-c\"");
    int count = 0;
    const char *cursor = text;
    for (;;) {
        if (!isdigit((unsigned char)*cursor))
            return pt_fail(err,
                           "partition \"%.80s\": expected a layer count at "
                           "character %td, found %s",
                           text, cursor - text + 1,
                           *cursor == '\0' ? "the end" : "something else");
        long long layers = 0;
        while (isdigit((unsigned char)*cursor)) {
            layers = layers * 10 + (*cursor - '0');
            if (layers > INT_MAX)
                return pt_fail(err,
                               "partition \"%.80s\": stage %d (counted "
                               "from 0) has more than %d layers",
                               text, count, INT_MAX);
            cursor++;
        }
        if (count == max_stages)
            return pt_fail(err,
                           "partition \"%.80s\": more than %d stages", text,
                           max_stages);
        out[count++] = (int)layers;
        if (*cursor == '\0')
            break;
        if (*cursor != '-')
            return pt_fail(err,
                           "partition \"%.80s\": unexpected '%c' at "
                           "character %td (stages are separated by '-')",
                           text, *cursor, cursor - text + 1);
        cursor++;
    }
    *out_count = count;
    return 0;
}

void partition_format(const int *layers, int count, char *out, size_t size)
{
    if (size == 0)
        return;
    out[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < count && used < size; i++) {
        int written = snprintf(out + used, size - used, "%s%d",
                               i > 0 ? "-" : "", layers[i]);
        if (written < 0)
            break;
        used += (size_t)written;
    }
}

void partition_even(int layers, int stages, int *out)
{
    if (stages <= 0)
        return;
    for (int stage = 0; stage < stages; stage++)
        out[stage] = layers / stages + (stage < layers % stages ? 1 : 0);
}

/* ---------------------------------------------------------- plan reader */

/* The origin of a model or cluster read by path: the file's canonical
 * path (path as resolved when realpath cannot tell). */
static void remember_origin(const char *path, char *origin, size_t size)
{
    char canonical[PATH_MAX];
    pt_copy_string(origin, size,
                   realpath(path, canonical) != NULL ? canonical : path);
}

/* model / cluster: a path (resolved against the plan's directory) or an
 * inline object. */
static int model_part(const json_t *obj, const json_place *place, plan *out,
                      pt_error *err)
{
    json_place where = json_place_key(place, "model");
    const json_t *value = json_object_get(obj, "model");
    if (value == NULL)
        return json_place_fail(&where, err, "missing (required)");
    if (json_is_object(value))
        return model_from_json(value, &where, &out->model, err);
    if (!json_is_string(value))
        return json_place_fail(&where, err,
                               "must be a path or an inline model object");
    if (json_get_string(obj, place, "model", true, out->model_ref,
                        sizeof out->model_ref, err) != 0)
        return -1;
    char path[PT_PATH_MAX];
    pt_resolve_path(out->source_dir, out->model_ref, path, sizeof path);
    if (model_load_file(path, &out->model, err) != 0) {
        pt_error_prefix(err, "%s: model", place->file);
        return -1;
    }
    remember_origin(path, out->model_origin, sizeof out->model_origin);
    return 0;
}

static int cluster_part(const json_t *obj, const json_place *place,
                        plan *out, pt_error *err)
{
    json_place where = json_place_key(place, "cluster");
    const json_t *value = json_object_get(obj, "cluster");
    if (value == NULL)
        return json_place_fail(&where, err, "missing (required)");
    if (json_is_object(value)) {
        if (cluster_from_json(value, &where, &out->cluster, err) != 0)
            return -1;
        pt_copy_string(out->cluster.source_dir,
                       sizeof out->cluster.source_dir, out->source_dir);
        return 0;
    }
    if (!json_is_string(value))
        return json_place_fail(&where, err,
                               "must be a path or an inline cluster object");
    if (json_get_string(obj, place, "cluster", true, out->cluster_ref,
                        sizeof out->cluster_ref, err) != 0)
        return -1;
    char path[PT_PATH_MAX];
    pt_resolve_path(out->source_dir, out->cluster_ref, path, sizeof path);
    if (cluster_load_file(path, &out->cluster, err) != 0) {
        pt_error_prefix(err, "%s: cluster", place->file);
        return -1;
    }
    remember_origin(path, out->cluster_origin, sizeof out->cluster_origin);
    return 0;
}

/* "origin": where an inline model and cluster came from; informative, so
 * only its shape is checked. */
static int origin_part(const json_t *obj, const json_place *place,
                       plan *out, pt_error *err)
{
    const json_t *value = json_object_get(obj, "origin");
    if (value == NULL)
        return 0;
    json_place where = json_place_key(place, "origin");
    if (json_expect_object(value, &where, err) != 0 ||
        json_check_keys(value, &where, origin_keys, err) != 0)
        return -1;
    /* A model or cluster given by path keeps the path it was read from. */
    if (out->model_ref[0] == '\0' &&
        json_get_string(value, &where, "model", false, out->model_origin,
                        sizeof out->model_origin, err) != 0)
        return -1;
    if (out->cluster_ref[0] == '\0' &&
        json_get_string(value, &where, "cluster", false, out->cluster_origin,
                        sizeof out->cluster_origin, err) != 0)
        return -1;
    return 0;
}

/* "zero" (0..3, DeepSpeed's stages) generalises "distributed_optimizer"
 * (ZeRO-1), which older plans write alone; given both, they must agree.
 * "offload_optimizer": ZeRO-Offload. Called after distributed_optimizer
 * is read. */
static int zero_part(const json_t *obj, const json_place *place,
                     parallel_config *config, pt_error *err)
{
    long long stage = config->distributed_optimizer ? 1 : 0;
    if (json_get_int(obj, place, "zero", false, 0, 3, &stage, err) != 0 ||
        json_get_bool(obj, place, "offload_optimizer", false,
                      &config->offload_optimizer, err) != 0)
        return -1;
    const json_t *flag = json_object_get(obj, "distributed_optimizer");
    if (flag != NULL && json_is_true(flag) != (stage >= 1)) {
        json_place where = json_place_key(place, "zero");
        return json_place_fail(&where, err,
                               "%lld %s the optimizer state over dp, but "
                               "distributed_optimizer is %s",
                               stage, stage >= 1 ? "shards" : "does not shard",
                               json_is_true(flag) ? "true" : "false");
    }
    parallel_set_zero_stage(config, (int)stage);
    return 0;
}

static int degrees_part(const json_t *obj, const json_place *place,
                        plan *out, pt_error *err)
{
    parallel_config *config = &out->config;
    long long gbs = 0, mbs = 0, tp = 0, dp = 0, pp = 0;
    int schedule = SCHEDULE_1F1B, precision = PRECISION_BF16, recompute = 0;
    int runtime = RUNTIME_PARTITA, attention = ATTENTION_DEFAULT;
    int grad_precision = GRAD_PRECISION_FP32;
    if (json_get_int(obj, place, "gbs", true, 1, INT_MAX, &gbs, err) != 0 ||
        json_get_int(obj, place, "mbs", true, 1, INT_MAX, &mbs, err) != 0 ||
        json_get_int(obj, place, "tp", true, 1, 65536, &tp, err) != 0 ||
        json_get_int(obj, place, "dp", true, 1, 1 << 20, &dp, err) != 0 ||
        json_get_int(obj, place, "pp", true, 1, PT_MAX_STAGES, &pp, err) !=
            0 ||
        json_get_choice(obj, place, "schedule", false, schedule_names,
                        &schedule, err) != 0 ||
        json_get_choice(obj, place, "precision", false, precision_names,
                        &precision, err) != 0 ||
        json_get_choice(obj, place, "recompute", false, recompute_names,
                        &recompute, err) != 0 ||
        json_get_choice(obj, place, "runtime", false, runtime_names,
                        &runtime, err) != 0 ||
        json_get_choice(obj, place, "attention", false, attention_names,
                        &attention, err) != 0 ||
        json_get_bool(obj, place, "overlap_grad_reduce", false,
                      &config->overlap_grad_reduce, err) != 0 ||
        json_get_bool(obj, place, "overlap_param_gather", false,
                      &config->overlap_param_gather, err) != 0 ||
        json_get_bool(obj, place, "tf32", false, &config->tf32, err) != 0 ||
        json_get_bool(obj, place, "deterministic", false,
                      &config->deterministic, err) != 0 ||
        json_get_choice(obj, place, "grad_precision", false,
                        grad_precision_names, &grad_precision, err) != 0 ||
        json_get_bool(obj, place, "distributed_optimizer", false,
                      &config->distributed_optimizer, err) != 0 ||
        zero_part(obj, place, config, err) != 0)
        return -1;
    config->gbs = (int)gbs;
    config->mbs = (int)mbs;
    config->tp = (int)tp;
    config->dp = (int)dp;
    config->pp = (int)pp;
    config->schedule = (schedule_kind)schedule;
    config->precision = (precision_kind)precision;
    config->recompute = recompute == 1;
    config->selective_recompute = recompute == 2;
    config->runtime = (runtime_kind)runtime;
    config->attention = (attention_kind)attention;
    config->grad_precision = (grad_precision_kind)grad_precision;
    if (parallel_check_grad_precision(config, err) != 0) {
        char reason[sizeof err->message];
        pt_copy_string(reason, sizeof reason, err->message);
        json_place where = json_place_key(place, "grad_precision");
        return json_place_fail(&where, err, "%s", reason);
    }
    if (config->overlap_param_gather &&
        (!config->distributed_optimizer ||
         config->runtime == RUNTIME_PARTITA)) {
        json_place where = json_place_key(place, "overlap_param_gather");
        return json_place_fail(&where, err, "only with distributed_optimizer "
                               "under runtime megatron or deepspeed (the "
                               "parameters are gathered only when the "
                               "optimizer is sharded, and Partita's "
                               "executor gathers them after the step)");
    }
    if (config->tf32 && config->precision != PRECISION_FP32) {
        json_place where = json_place_key(place, "tf32");
        return json_place_fail(&where, err, "only with precision fp32 (TF32 "
                               "is how fp32 matmuls may run; the plan's "
                               "precision is %s)",
                               precision_name(config->precision));
    }
    if (gbs % (dp * mbs) != 0) {
        json_place where = json_place_key(place, "gbs");
        return json_place_fail(&where, err,
                               "%lld is not divisible by dp x mbs = %lld x "
                               "%lld = %lld",
                               gbs, dp, mbs, dp * mbs);
    }
    return 0;
}

static int partition_array(const json_t *array, const json_place *where,
                           int *out, int *count, pt_error *err)
{
    size_t size = json_array_size(array);
    if (size == 0)
        return json_place_fail(where, err, "must not be empty");
    if (size > PT_MAX_STAGES)
        return json_place_fail(where, err, "more than %d stages",
                               PT_MAX_STAGES);
    for (size_t i = 0; i < size; i++) {
        const json_t *entry = json_array_get(array, i);
        json_place entry_place = json_place_index(where, i);
        if (!json_is_integer(entry) || json_integer_value(entry) < 0 ||
            json_integer_value(entry) > INT_MAX)
            return json_place_fail(&entry_place, err,
                                   "must be a non-negative integer (layers "
                                   "of the stage)");
        out[i] = (int)json_integer_value(entry);
    }
    *count = (int)size;
    return 0;
}

static int partition_part(const json_t *obj, const json_place *place,
                          plan *out, pt_error *err)
{
    json_place where = json_place_key(place, "partition");
    const json_t *value = json_object_get(obj, "partition");
    int pp = out->config.pp;
    if (value == NULL) {
        partition_even(out->model.layers, pp, out->partition);
        return 0;
    }
    int count = 0;
    if (json_is_string(value)) {
        if (partition_parse(json_string_value(value), out->partition,
                            PT_MAX_STAGES, &count, err) != 0) {
            pt_error_prefix(err, "%s: partition", where.file);
            return -1;
        }
    } else if (json_is_array(value)) {
        if (partition_array(value, &where, out->partition, &count, err) != 0)
            return -1;
    } else {
        return json_place_fail(&where, err,
                               "must be a string \"a-b-c\" or an array of "
                               "layer counts");
    }
    if (count != pp)
        return json_place_fail(&where, err,
                               "has %d stages, but pp is %d", count, pp);
    long long sum = 0;
    for (int stage = 0; stage < count; stage++)
        sum += out->partition[stage];
    if (sum != out->model.layers)
        return json_place_fail(&where, err,
                               "stages hold %lld layers in all, but model "
                               "%s has %d",
                               sum, out->model.name, out->model.layers);
    return 0;
}

/* Lists the cluster's node names for an "unknown node" message. */
static void list_node_names(const cluster *c, char *out, size_t size)
{
    out[0] = '\0';
    size_t used = 0;
    for (int type = 0; type < c->type_count && used < size; type++) {
        const node_type *node = &c->types[type];
        int written =
            node->count == 1
                ? snprintf(out + used, size - used, "%s%s[0]",
                           type > 0 ? ", " : "", node->name)
                : snprintf(out + used, size - used, "%s%s[0]..%s[%d]",
                           type > 0 ? ", " : "", node->name, node->name,
                           node->count - 1);
        if (written < 0)
            break;
        used += (size_t)written;
    }
}

static int node_order_part(const json_t *obj, const json_place *place,
                           plan *out, pt_error *err)
{
    json_place where = json_place_key(place, "node_order");
    const json_t *value = json_object_get(obj, "node_order");
    const cluster *c = &out->cluster;
    size_t count = value != NULL ? json_array_size(value)
                                 : (size_t)c->node_count;
    if (value != NULL && (!json_is_array(value) || count == 0))
        return json_place_fail(&where, err,
                               "must be a non-empty array of node names "
                               "such as \"a10[3]\"");
    out->node_order = calloc(count, sizeof *out->node_order);
    if (out->node_order == NULL)
        return json_place_fail(&where, err, "out of memory");
    out->node_order_count = (int)count;
    for (size_t i = 0; i < count; i++) {
        if (value == NULL) {
            out->node_order[i] = (int)i;
            continue;
        }
        json_place entry_place = json_place_index(&where, i);
        const json_t *entry = json_array_get(value, i);
        if (!json_is_string(entry))
            return json_place_fail(&entry_place, err,
                                   "must be a node name such as \"a10[3]\"");
        int node = cluster_find_node(c, json_string_value(entry));
        if (node < 0) {
            char names[256];
            list_node_names(c, names, sizeof names);
            return json_place_fail(&entry_place, err,
                                   "unknown node \"%.64s\" (cluster %s has "
                                   "%s)",
                                   json_string_value(entry), c->name, names);
        }
        for (size_t j = 0; j < i; j++)
            if (out->node_order[j] == node)
                return json_place_fail(&entry_place, err,
                                       "node \"%.64s\" is listed twice (also "
                                       "at node_order[%zu])",
                                       json_string_value(entry), j);
        out->node_order[i] = node;
    }
    return 0;
}

/* tp x dp x pp must fill the ordered nodes exactly, and no tensor-parallel
 * group may straddle two nodes. */
static int check_placement(const json_place *place, plan *out, pt_error *err)
{
    const parallel_config *config = &out->config;
    long long needed = (long long)config->tp * config->dp * config->pp;
    long long held = plan_gpu_count(out);
    if (needed != held)
        return json_place_fail(place, err,
                               "tp x dp x pp = %d x %d x %d = %lld GPUs, but "
                               "the %d nodes of node_order hold %lld GPUs",
                               config->tp, config->dp, config->pp, needed,
                               out->node_order_count, held);
    /* a tensor-parallel group may span nodes (the cost model prices its
       all-reduces over the link between them) */
    return 0;
}

static int plan_parts(const json_t *obj, const json_place *place, plan *out,
                      pt_error *err)
{
    char format[64] = PLAN_FORMAT;
    if (json_check_keys(obj, place, plan_keys, err) != 0 ||
        json_get_string(obj, place, "format", false, format, sizeof format,
                        err) != 0)
        return -1;
    if (strcmp(format, PLAN_FORMAT) != 0) {
        json_place where = json_place_key(place, "format");
        return json_place_fail(&where, err, "must be \"%s\", got \"%s\"",
                               PLAN_FORMAT, format);
    }
    if (degrees_part(obj, place, out, err) != 0 ||
        model_part(obj, place, out, err) != 0 ||
        schedule_levers_part(obj, place, out, err) != 0 ||
        cluster_part(obj, place, out, err) != 0 ||
        origin_part(obj, place, out, err) != 0 ||
        partition_part(obj, place, out, err) != 0 ||
        interleave_partition_part(out, place, err) != 0 ||
        node_order_part(obj, place, out, err) != 0 ||
        (json_object_get(obj, "stages") == NULL
             ? check_placement(place, out, err)
             : plan_stages_part(obj, place, plan_gpu_count(out), out,
                                err)) != 0)
        return -1;
    return 0;
}

int plan_from_json(const json_t *obj, const char *file, plan *out,
                   pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_place place = json_place_root(file);
    if (file != NULL)
        pt_directory_of(file, out->source_dir, sizeof out->source_dir);
    else
        pt_copy_string(out->source_dir, sizeof out->source_dir, ".");
    if (plan_parts(obj, &place, out, err) != 0) {
        plan_free(out);
        return -1;
    }
    return 0;
}

int plan_load_file(const char *path, plan *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    int status = plan_from_json(root, path, out, err);
    json_decref(root);
    return status;
}

void plan_free(plan *p)
{
    if (p == NULL)
        return;
    cluster_free(&p->cluster);
    free(p->node_order);
    p->node_order = NULL;
    p->node_order_count = 0;
}

int plan_gpu_count(const plan *p)
{
    int gpus = 0;
    for (int i = 0; i < p->node_order_count; i++)
        gpus += cluster_node_gpus(&p->cluster, p->node_order[i]);
    return gpus;
}

int plan_rank_node(const plan *p, int rank)
{
    if (rank < 0)
        return -1;
    for (int i = 0; i < p->node_order_count; i++) {
        int gpus = cluster_node_gpus(&p->cluster, p->node_order[i]);
        if (rank < gpus)
            return p->node_order[i];
        rank -= gpus;
    }
    return -1;
}

/* ----------------------------------------------------------- plan writer */

static json_t *node_order_to_json(const plan *p)
{
    json_t *order = json_array();
    for (int i = 0; order != NULL && i < p->node_order_count; i++) {
        char name[PT_NAME_MAX + 16];
        cluster_node_name(&p->cluster, p->node_order[i], name, sizeof name);
        if (json_array_append_new(order, json_string(name)) != 0) {
            json_decref(order);
            return NULL;
        }
    }
    return order;
}

static json_t *origin_to_json(const plan *p)
{
    json_t *origin = json_object();
    int failures = origin == NULL;
    if (failures == 0 && p->model_origin[0] != '\0')
        json_put(origin, "model", json_string(p->model_origin), &failures);
    if (failures == 0 && p->cluster_origin[0] != '\0')
        json_put(origin, "cluster", json_string(p->cluster_origin),
                 &failures);
    if (failures > 0) {
        json_decref(origin);
        return NULL;
    }
    return origin;
}

static void put_section(json_t *root, const char *key, json_t *section,
                        int *failures)
{
    if (section != NULL)
        json_put(root, key, json_incref(section), failures);
}

json_t *plan_to_json(const plan *p, const plan_json_sections *sections,
                     pt_error *err)
{
    json_t *root = json_object();
    if (root == NULL) {
        pt_fail(err, "out of memory building the plan JSON");
        return NULL;
    }
    int failures = 0;
    const parallel_config *config = &p->config;
    char partition[PT_MAX_STAGES * 12];
    partition_format(p->partition, config->pp, partition, sizeof partition);
    json_put(root, "format", json_string(PLAN_FORMAT), &failures);
    json_put(root, "model", model_to_json(&p->model), &failures);
    json_put(root, "cluster", cluster_to_json(&p->cluster), &failures);
    if (p->model_origin[0] != '\0' || p->cluster_origin[0] != '\0')
        json_put(root, "origin", origin_to_json(p), &failures);
    json_put(root, "gbs", json_integer(config->gbs), &failures);
    json_put(root, "mbs", json_integer(config->mbs), &failures);
    json_put(root, "tp", json_integer(config->tp), &failures);
    json_put(root, "dp", json_integer(config->dp), &failures);
    json_put(root, "pp", json_integer(config->pp), &failures);
    json_put(root, "partition", json_string(partition), &failures);
    bool stages_failed = false;
    json_t *stages = stage_degrees_to_json(&p->config, p->stages,
                                           &stages_failed);
    failures += stages_failed;
    if (stages != NULL)
        json_put(root, "stages", stages, &failures);
    json_put(root, "node_order", node_order_to_json(p), &failures);
    json_put(root, "schedule", json_string(schedule_name(config->schedule)),
             &failures);
    json_put(root, "precision",
             json_string(precision_name(config->precision)), &failures);
    json_put(root, "grad_precision",
             json_string(grad_precision_name(config->grad_precision)),
             &failures);
    json_put(root, "recompute",
             json_string(config->recompute             ? "full"
                         : config->selective_recompute ? "selective"
                                                       : "none"),
             &failures);
    json_put(root, "distributed_optimizer",
             json_boolean(config->distributed_optimizer), &failures);
    /* written when they say more than distributed_optimizer does, so a
     * plan without them reads as it always did */
    if (parallel_zero_stage(config) >= 2)
        json_put(root, "zero", json_integer(parallel_zero_stage(config)),
                 &failures);
    if (config->offload_optimizer)
        json_put(root, "offload_optimizer", json_true(), &failures);
    json_put(root, "virtual_stages",
             json_integer(parallel_virtual_stages(config)), &failures);
    json_put(root, "sequence_parallel",
             json_boolean(config->sequence_parallel), &failures);
    /* written when they say more than the defaults, so a plan without
     * them reads as it always did */
    if (config->runtime != RUNTIME_PARTITA)
        json_put(root, "runtime", json_string(runtime_name(config->runtime)),
                 &failures);
    if (config->attention != ATTENTION_DEFAULT)
        json_put(root, "attention",
                 json_string(attention_name(config->attention)), &failures);
    if (config->overlap_grad_reduce)
        json_put(root, "overlap_grad_reduce", json_true(), &failures);
    if (config->overlap_param_gather)
        json_put(root, "overlap_param_gather", json_true(), &failures);
    if (config->tf32)
        json_put(root, "tf32", json_true(), &failures);
    if (config->deterministic)
        json_put(root, "deterministic", json_true(), &failures);
    if (sections != NULL) {
        put_section(root, "estimate", sections->estimate, &failures);
        put_section(root, "alternatives", sections->alternatives, &failures);
        put_section(root, "pareto", sections->pareto, &failures);
    }
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building the plan JSON");
        return NULL;
    }
    return root;
}

int plan_write_file(const plan *p, const plan_json_sections *sections,
                    const char *path, pt_error *err)
{
    json_t *root = plan_to_json(p, sections, err);
    if (root == NULL)
        return -1;
    int status = json_write_file_atomic(root, path, err);
    json_decref(root);
    return status;
}
