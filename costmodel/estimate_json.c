/*
 * The "estimate" section of plan.json: the one writer of an estimate as
 * JSON (common/plan.c writes the rest of the file and attaches this
 * section; docs/formats.md describes both).
 */
#include "costmodel/costmodel.h"

#include <stdlib.h>

static json_t *stage_to_json(const stage_estimate *stage, int index,
                             int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    json_put(obj, "stage", json_integer(index), failures);
    json_put(obj, "layers", json_integer(stage->layers), failures);
    json_put(obj, "gpu", json_string(stage->gpu), failures);
    json_put(obj, "forward_s", json_real(stage->forward_s), failures);
    json_put(obj, "backward_s", json_real(stage->backward_s), failures);
    json_put(obj, "send_s", json_real(stage->send_s), failures);
    json_put(obj, "dp_allreduce_s", json_real(stage->dp_allreduce_s),
             failures);
    json_put(obj, "embedding_allreduce_s",
             json_real(stage->embedding_allreduce_s), failures);
    json_put(obj, "optimizer_s", json_real(stage->optimizer_s), failures);
    json_put(obj, "peak_memory_gib",
             json_real(stage->peak_memory_bytes / PT_GIB), failures);
    json_put(obj, "memory_cap_gib",
             json_real(stage->memory_cap_bytes / PT_GIB), failures);
    return obj;
}

/* The events, one object each, as the estimate holds them. */
static json_t *events_to_json(const estimate *est, int *failures)
{
    json_t *events = json_array();
    if (events == NULL) {
        (*failures)++;
        return NULL;
    }
    for (int i = 0; i < est->event_count && *failures == 0; i++) {
        const timeline_event *event = &est->events[i];
        json_t *obj = json_object();
        if (obj == NULL) {
            (*failures)++;
            break;
        }
        json_put(obj, "rank", json_integer(event->rank), failures);
        json_put(obj, "stage", json_integer(event->stage), failures);
        json_put(obj, "microbatch", json_integer(event->microbatch),
                 failures);
        json_put(obj, "kind", json_string(event_kind_name(event->kind)),
                 failures);
        json_put(obj, "start_s", json_real(event->start_s), failures);
        json_put(obj, "end_s", json_real(event->end_s), failures);
        if (json_array_append_new(events, obj) != 0)
            (*failures)++;
    }
    return events;
}

json_t *estimate_to_json(const estimate *est, pt_error *err)
{
    int failures = 0;
    json_t *obj = json_object();
    json_t *stages = json_array();
    if (obj == NULL || stages == NULL)
        failures++;
    for (int s = 0; failures == 0 && s < est->stage_count; s++)
        if (json_array_append_new(stages, stage_to_json(&est->stages[s], s,
                                                        &failures)) != 0)
            failures++;
    if (failures == 0) {
        json_put(obj, "step_time_s", json_real(est->step_time_s), &failures);
        json_put(obj, "tokens_per_s", json_real(est->tokens_per_s),
                 &failures);
        json_put(obj, "tflops_per_gpu", json_real(est->tflops_per_gpu),
                 &failures);
        json_put(obj, "bubble_fraction", json_real(est->bubble_fraction),
                 &failures);
        json_put(obj, "cost_per_step_usd", json_real(est->cost_per_step_usd),
                 &failures);
        json_put(obj, "fits", json_boolean(est->fits), &failures);
        json_put(obj, "stages", stages, &failures);
        stages = NULL;
    }
    if (failures == 0 && est->events != NULL)
        json_put(obj, "events", events_to_json(est, &failures), &failures);
    json_decref(stages);
    if (failures > 0) {
        json_decref(obj);
        pt_fail(err, "out of memory building the estimate JSON");
        return NULL;
    }
    return obj;
}
