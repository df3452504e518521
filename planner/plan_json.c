/*
 * plan.json: turning ranked plans into plans and plans into the JSON of
 * formats.md (common/json_write.c writes the files).
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

/* Sets obj[key] = value and takes the reference; a failed allocation
 * inside Jansson surfaces as a NULL value, which we count and report. */
static void put(json_t *obj, const char *key, json_t *value, int *failures)
{
    if (value == NULL || json_object_set_new(obj, key, value) != 0)
        (*failures)++;
}

static json_t *model_to_json(const model_shape *model, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "name", json_string(model->name), failures);
    put(obj, "layers", json_integer(model->layers), failures);
    put(obj, "hidden", json_integer(model->hidden), failures);
    put(obj, "heads", json_integer(model->heads), failures);
    put(obj, "ffn_hidden", json_integer(model->ffn_hidden), failures);
    put(obj, "seq", json_integer(model->seq), failures);
    put(obj, "vocab", json_integer(model->vocab), failures);
    put(obj, "tied_embeddings", json_boolean(model->tied_embeddings),
        failures);
    return obj;
}

static json_t *link_to_json(const link_spec *link, bool in_gigabits,
                            int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    if (in_gigabits)
        put(obj, "bandwidth_Gbps",
            json_real(link->bandwidth_bytes_per_s * 8.0 / 1e9), failures);
    else
        put(obj, "bandwidth_GBps",
            json_real(link->bandwidth_bytes_per_s / 1e9), failures);
    put(obj, "latency_us", json_real(link->latency_s * 1e6), failures);
    return obj;
}

static json_t *node_type_to_json(const node_type *type, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "name", json_string(type->name), failures);
    put(obj, "count", json_integer(type->count), failures);
    put(obj, "gpu", json_string(type->gpu), failures);
    put(obj, "gpus", json_integer(type->gpus), failures);
    put(obj, "intra_node", link_to_json(&type->intra_node, false, failures),
        failures);
    /* A single node may have no inter-node link; write none then, as the
     * reader rejects a zero bandwidth. */
    if (type->inter_node.bandwidth_bytes_per_s > 0)
        put(obj, "inter_node",
            link_to_json(&type->inter_node, true, failures), failures);
    put(obj, "price_per_hour", json_real(type->price_per_hour), failures);
    if (type->device_count > 0) {
        json_t *devices = json_array();
        for (int i = 0; devices != NULL && i < type->device_count; i++) {
            const device_spec *device = &type->devices[i];
            json_t *entry = json_object();
            if (entry == NULL) {
                (*failures)++;
                continue;
            }
            put(entry, "index", json_integer(device->index), failures);
            if (device->sm_limit > 0)
                put(entry, "sm_limit", json_integer(device->sm_limit),
                    failures);
            if (device->memory_limit_gib > 0)
                put(entry, "memory_limit_gib",
                    json_real(device->memory_limit_gib), failures);
            if (json_array_append_new(devices, entry) != 0)
                (*failures)++;
        }
        put(obj, "devices", devices, failures);
    }
    return obj;
}

static json_t *cluster_to_json(const cluster *c, int *failures)
{
    json_t *obj = json_object();
    json_t *nodes = json_array();
    if (obj == NULL || nodes == NULL) {
        json_decref(obj);
        json_decref(nodes);
        (*failures)++;
        return NULL;
    }
    put(obj, "name", json_string(c->name), failures);
    for (int i = 0; i < c->type_count; i++) {
        json_t *node = node_type_to_json(&c->types[i], failures);
        if (node == NULL || json_array_append_new(nodes, node) != 0)
            (*failures)++;
    }
    put(obj, "nodes", nodes, failures);
    return obj;
}

static json_t *events_to_json(const estimate *est, int *failures)
{
    json_t *events = json_array();
    if (events == NULL) {
        (*failures)++;
        return NULL;
    }
    for (int i = 0; i < est->event_count; i++) {
        const timeline_event *event = &est->events[i];
        json_t *obj = json_object();
        if (obj == NULL) {
            (*failures)++;
            break;
        }
        put(obj, "rank", json_integer(event->rank), failures);
        put(obj, "stage", json_integer(event->stage), failures);
        put(obj, "microbatch", json_integer(event->microbatch), failures);
        put(obj, "kind", json_string(event_kind_name(event->kind)),
            failures);
        put(obj, "start_s", json_real(event->start_s), failures);
        put(obj, "end_s", json_real(event->end_s), failures);
        if (json_array_append_new(events, obj) != 0)
            (*failures)++;
    }
    return events;
}

static json_t *stage_to_json(const stage_estimate *stage, int index,
                             int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "stage", json_integer(index), failures);
    put(obj, "layers", json_integer(stage->layers), failures);
    put(obj, "gpu", json_string(stage->gpu), failures);
    put(obj, "forward_s", json_real(stage->forward_s), failures);
    put(obj, "backward_s", json_real(stage->backward_s), failures);
    put(obj, "send_s", json_real(stage->send_s), failures);
    put(obj, "dp_allreduce_s", json_real(stage->dp_allreduce_s), failures);
    put(obj, "embedding_allreduce_s",
        json_real(stage->embedding_allreduce_s), failures);
    put(obj, "optimizer_s", json_real(stage->optimizer_s), failures);
    put(obj, "peak_memory_gib",
        json_real(stage->peak_memory_bytes / PT_GIB), failures);
    put(obj, "memory_cap_gib", json_real(stage->memory_cap_bytes / PT_GIB),
        failures);
    return obj;
}

static json_t *estimate_to_json(const estimate *est, int *failures)
{
    json_t *obj = json_object();
    json_t *stages = json_array();
    if (obj == NULL || stages == NULL) {
        json_decref(obj);
        json_decref(stages);
        (*failures)++;
        return NULL;
    }
    put(obj, "step_time_s", json_real(est->step_time_s), failures);
    put(obj, "tokens_per_s", json_real(est->tokens_per_s), failures);
    put(obj, "tflops_per_gpu", json_real(est->tflops_per_gpu), failures);
    put(obj, "bubble_fraction", json_real(est->bubble_fraction), failures);
    put(obj, "cost_per_step_usd", json_real(est->cost_per_step_usd),
        failures);
    put(obj, "fits", json_boolean(est->fits), failures);
    for (int s = 0; s < est->stage_count; s++) {
        json_t *stage = stage_to_json(&est->stages[s], s, failures);
        if (stage == NULL || json_array_append_new(stages, stage) != 0)
            (*failures)++;
    }
    put(obj, "stages", stages, failures);
    if (est->events != NULL)
        put(obj, "events", events_to_json(est, failures), failures);
    return obj;
}

static json_t *node_order_to_json(const plan *p, int *failures)
{
    json_t *order = json_array();
    if (order == NULL) {
        (*failures)++;
        return NULL;
    }
    for (int i = 0; i < p->node_order_count; i++) {
        char name[PT_NAME_MAX + 16];
        cluster_node_name(&p->cluster, p->node_order[i], name, sizeof name);
        if (json_array_append_new(order, json_string(name)) != 0)
            (*failures)++;
    }
    return order;
}

json_t *plan_to_json(const plan *p, const estimate *est, pt_error *err)
{
    int failures = 0;
    json_t *root = json_object();
    if (root == NULL) {
        pt_fail(err, "out of memory building the plan JSON");
        return NULL;
    }
    const parallel_config *config = &p->config;
    char partition[PT_MAX_STAGES * 6];
    partition_format(p->partition, config->pp, partition, sizeof partition);

    put(root, "format", json_string("partita-plan/1"), &failures);
    put(root, "model",
        p->model_ref[0] ? json_string(p->model_ref)
                        : model_to_json(&p->model, &failures),
        &failures);
    put(root, "cluster",
        p->cluster_ref[0] ? json_string(p->cluster_ref)
                          : cluster_to_json(&p->cluster, &failures),
        &failures);
    put(root, "gbs", json_integer(config->gbs), &failures);
    put(root, "mbs", json_integer(config->mbs), &failures);
    put(root, "tp", json_integer(config->tp), &failures);
    put(root, "dp", json_integer(config->dp), &failures);
    put(root, "pp", json_integer(config->pp), &failures);
    put(root, "partition", json_string(partition), &failures);
    put(root, "node_order", node_order_to_json(p, &failures), &failures);
    put(root, "schedule", json_string(schedule_name(config->schedule)),
        &failures);
    put(root, "precision", json_string(precision_name(config->precision)),
        &failures);
    put(root, "recompute", json_string(config->recompute ? "full" : "none"),
        &failures);
    put(root, "distributed_optimizer",
        json_boolean(config->distributed_optimizer), &failures);
    if (est != NULL)
        put(root, "estimate", estimate_to_json(est, &failures), &failures);
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building the plan JSON");
        return NULL;
    }
    return root;
}

int plan_from_ranked(const ranked_plan *ranked, const model_shape *model,
                     const cluster *source_cluster, const char *model_ref,
                     const char *cluster_ref, plan *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (ranked->config.pp > PT_MAX_STAGES)
        return pt_fail(err, "plan has %d stages, at most %d are supported",
                       ranked->config.pp, PT_MAX_STAGES);
    out->model = *model;
    if (cluster_copy(&out->cluster, source_cluster, err) != 0)
        return -1;
    pt_copy_string(out->model_ref, sizeof out->model_ref,
                   model_ref ? model_ref : "");
    pt_copy_string(out->cluster_ref, sizeof out->cluster_ref,
                   cluster_ref ? cluster_ref : "");
    out->config = ranked->config;
    memcpy(out->partition, ranked->partition,
           sizeof(int) * (size_t)ranked->config.pp);
    out->node_order = malloc(sizeof(int) * (size_t)ranked->node_count);
    if (out->node_order == NULL) {
        cluster_free(&out->cluster);
        return pt_fail(err, "out of memory copying the node order");
    }
    memcpy(out->node_order, ranked->node_order,
           sizeof(int) * (size_t)ranked->node_count);
    out->node_order_count = ranked->node_count;
    return 0;
}
