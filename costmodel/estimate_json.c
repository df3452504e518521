/*
 * The "estimate" section of plan.json: the one writer of an estimate as
 * JSON (common/plan.c writes the rest of the file and attaches this
 * section; docs/formats.md describes both). The timeline is written per
 * stage, not per rank, and column-wise, and by default each kind keeps
 * only its first and last events with a count of those between: a
 * plan's size then does not grow with the batch, and one of 4,096 GPUs
 * stays under 1 MB. Every rank of a stage runs the same estimated
 * events, and the full timeline is written only when asked.
 */
#include "costmodel/costmodel.h"

#include <stdlib.h>

/* "ranks": [first, last] of a stage, or of one rank. */
static json_t *rank_range(int first, int last)
{
    return json_pack("[i, i]", first, last);
}

/* {"weights": GiB, ...}: the terms of a stage's peak memory. */
static json_t *memory_terms_to_json(const pt_memory_terms *terms,
                                    int *failures)
{
    json_t *obj = json_object();
    for (int t = 0; obj != NULL && t < PT_MEMORY_TERM_COUNT; t++)
        json_put(obj, pt_memory_term_name(t),
                 json_real(terms->bytes[t] / PT_GIB), failures);
    if (obj == NULL)
        (*failures)++;
    return obj;
}

/* A stage's ranks: as the estimate placed them, or, in an estimate
 * built without them (ranks 0), as config lays them out. */
static int stage_first_rank(const stage_estimate *stage, int index,
                            const parallel_config *config)
{
    return stage->ranks > 0 ? stage->first_rank
                            : parallel_stage_first_rank(config, index);
}

static int stage_rank_count(const stage_estimate *stage,
                            const parallel_config *config)
{
    return stage->ranks > 0 ? stage->ranks
                            : parallel_ranks_per_stage(config);
}

static json_t *stage_to_json(const stage_estimate *stage, int index,
                             const parallel_config *config, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    int first = stage_first_rank(stage, index, config);
    int last = first + stage_rank_count(stage, config) - 1;
    json_put(obj, "stage", json_integer(index), failures);
    json_put(obj, "ranks", rank_range(first, last), failures);
    /* a stage of its own degrees says them (issue 36) */
    if (stage->ranks > 0 &&
        (stage->tp != config->tp || stage->dp != config->dp)) {
        json_put(obj, "tp", json_integer(stage->tp), failures);
        json_put(obj, "dp", json_integer(stage->dp), failures);
    }
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
    json_put(obj, "memory_terms_gib",
             memory_terms_to_json(&stage->memory, failures), failures);
    return obj;
}

/* Events of a kind kept at each end of the compact timeline: the
 * warm-up and cool-down a reader looks at, a size bounded whatever the
 * batch. */
#define TIMELINE_ENDS 8

/* The events of one kind (indices into events), for the compact form. */
typedef struct kind_events {
    int count;
    int *index;
} kind_events;

/* "elided": {"after": k, "count": n}: n events left out after the
 * first k kept ones. */
static json_t *elided_to_json(const kind_events *kind, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL)
        (*failures)++;
    json_put(obj, "after", json_integer(TIMELINE_ENDS), failures);
    json_put(obj, "count", json_integer(kind->count - 2 * TIMELINE_ENDS),
             failures);
    return obj;
}

/* One kind's three parallel columns (microbatch, start_s, end_s), of
 * every event or, with `compact`, of its first and last TIMELINE_ENDS. */
static json_t *kind_to_json(const timeline_event *events,
                            const kind_events *kind, bool compact,
                            int *failures)
{
    json_t *microbatch = json_array(), *start = json_array(),
           *end = json_array(), *columns = json_object();
    if (microbatch == NULL || start == NULL || end == NULL ||
        columns == NULL)
        (*failures)++;
    bool elide = compact && kind->count > 2 * TIMELINE_ENDS;
    for (int i = 0; i < kind->count && *failures == 0; i++) {
        if (elide && i == TIMELINE_ENDS)
            i = kind->count - TIMELINE_ENDS;
        const timeline_event *e = &events[kind->index[i]];
        json_push(microbatch, json_integer(e->microbatch), failures);
        json_push(start, json_real(e->start_s), failures);
        json_push(end, json_real(e->end_s), failures);
    }
    json_put(columns, "microbatch", microbatch, failures);
    json_put(columns, "start_s", start, failures);
    json_put(columns, "end_s", end, failures);
    if (elide && *failures == 0)
        json_put(columns, "elided", elided_to_json(kind, failures),
                 failures);
    return columns;
}

/* The events of one stage, grouped by kind (in event_kind order), each
 * kind as three parallel arrays: microbatch, start_s, end_s. */
static json_t *stage_events_to_json(const timeline_event *events, int count,
                                    bool compact, int *failures)
{
    json_t *by_kind = json_object();
    int *index = malloc((size_t)(count > 0 ? count : 1) * sizeof *index);
    if (by_kind == NULL || index == NULL) {
        (*failures)++;
        free(index);
        return by_kind;
    }
    for (int k = 0; k < EVENT_KIND_COUNT && *failures == 0; k++) {
        kind_events kind = {0, index};
        for (int i = 0; i < count; i++)
            if ((int)events[i].kind == k)
                index[kind.count++] = i;
        if (kind.count > 0)
            json_put(by_kind, event_kind_name((event_kind)k),
                     kind_to_json(events, &kind, compact, failures),
                     failures);
    }
    free(index);
    return by_kind;
}

static json_t *lane_to_json(int stage, int first_rank, int last_rank,
                            json_t *events, int *failures)
{
    json_t *lane = json_object();
    if (lane == NULL) {
        (*failures)++;
        return NULL;
    }
    json_put(lane, "stage", json_integer(stage), failures);
    json_put(lane, "ranks", rank_range(first_rank, last_rank), failures);
    /* The lanes of one stage's ranks share its events object. */
    json_put(lane, "events", json_incref(events), failures);
    return lane;
}

/* One lane per stage, or per rank; est->events come grouped by stage. */
static json_t *timeline_to_json(const estimate *est,
                                const parallel_config *config,
                                unsigned flags, int *failures)
{
    bool per_rank = (flags & ESTIMATE_JSON_PER_RANK) != 0;
    bool compact = (flags & ESTIMATE_JSON_FULL_TIMELINE) == 0;
    json_t *lanes = json_array();
    if (lanes == NULL) {
        (*failures)++;
        return NULL;
    }
    int next = 0;
    for (int s = 0; s < est->stage_count && *failures == 0; s++) {
        int first = next;
        while (next < est->event_count && est->events[next].stage == s)
            next++;
        json_t *events = stage_events_to_json(&est->events[first],
                                              next - first, compact,
                                              failures);
        int first_rank = stage_first_rank(&est->stages[s], s, config);
        int ranks_per_stage = stage_rank_count(&est->stages[s], config);
        int lane_count = per_rank ? ranks_per_stage : 1;
        for (int r = 0; r < lane_count && *failures == 0; r++) {
            int low = per_rank ? first_rank + r : first_rank;
            int high = per_rank ? low : first_rank + ranks_per_stage - 1;
            if (json_array_append_new(lanes, lane_to_json(s, low, high,
                                                          events,
                                                          failures)) != 0)
                (*failures)++;
        }
        json_decref(events);
    }
    return lanes;
}

/* The entries that were not measured, one object each, and how many
 * were. */
static json_t *pricing_to_json(const estimate *est, int *measured,
                               int *failures)
{
    json_t *list = json_array();
    if (list == NULL)
        (*failures)++;
    *measured = 0;
    for (int i = 0; list && i < est->pricing_count; i++) {
        const pricing_entry *entry = &est->pricing[i];
        if (entry->method == PRICE_MEASURED) {
            (*measured)++;
            continue;
        }
        json_t *obj = json_object();
        json_put(obj, "gpu", json_string(entry->gpu), failures);
        json_put(obj, "part", json_string(entry->part), failures);
        json_put(obj, "tp", json_integer(entry->tp), failures);
        json_put(obj, "mbs", json_integer(entry->mbs), failures);
        json_put(obj, "method", json_string(price_method_name(entry->method)),
                 failures);
        json_put(obj, "how", json_string(entry->how), failures);
        json_put(obj, "forward_s", json_real(entry->forward_s), failures);
        json_put(obj, "backward_s", json_real(entry->backward_s), failures);
        json_push(list, obj, failures);
    }
    return list;
}

json_t *estimate_to_json(const estimate *est, const parallel_config *config,
                         unsigned flags, pt_error *err)
{
    int failures = 0;
    json_t *obj = json_object();
    json_t *stages = json_array();
    if (obj == NULL || stages == NULL)
        failures++;
    for (int s = 0; failures == 0 && s < est->stage_count; s++)
        if (json_array_append_new(stages, stage_to_json(&est->stages[s], s,
                                                        config,
                                                        &failures)) != 0)
            failures++;
    if (failures == 0) {
        json_put(obj, "step_time_s", json_real(est->step_time_s), &failures);
        json_put(obj, "tokens_per_s", json_real(est->tokens_per_s),
                 &failures);
        json_put(obj, "tflops_per_gpu", json_real(est->tflops_per_gpu),
                 &failures);
        json_put(obj, "parameters",
                 json_integer((json_int_t)est->parameters), &failures);
        json_put(obj, "bubble_fraction", json_real(est->bubble_fraction),
                 &failures);
        json_put(obj, "cost_per_step_usd", json_real(est->cost_per_step_usd),
                 &failures);
        json_put(obj, "fits", json_boolean(est->fits), &failures);
        json_put(obj, "stages", stages, &failures);
        stages = NULL;
    }
    if (failures == 0 && est->pricing != NULL) {
        int measured;
        json_put(obj, "not_measured", pricing_to_json(est, &measured,
                                                      &failures), &failures);
        json_put(obj, "measured_entries", json_integer(measured), &failures);
    }
    if (failures == 0 && est->events != NULL)
        json_put(obj, "timeline",
                 timeline_to_json(est, config, flags, &failures),
                 &failures);
    json_decref(stages);
    if (failures > 0) {
        json_decref(obj);
        pt_fail(err, "out of memory building the estimate JSON");
        return NULL;
    }
    return obj;
}
