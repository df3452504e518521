/*
 * DeepSpeed's ZeRO stages 2 and 3 and ZeRO-Offload in the cost model
 * (docs/cost-model.md, section 11): what they add to a stage's layer,
 * embedding and head times (the per-unit reduce-scatter of gradients
 * and all-gather of weights, hidden behind compute as far as it goes),
 * to its per-step work, and what they take off its memory terms. Kept
 * apart from ZeRO-1 (memory.c, stage.c), which these build on: every
 * ZeRO stage >= 1 shards the optimizer state as ZeRO-1 does.
 */
#include <math.h>

#include "costmodel/internal.h"

/* A rank's units of parameters (they are gathered and reduced whole):
 * one transformer layer, the embeddings, the head. */
typedef struct zero_units {
    double layer, embedding, head;
} zero_units;

static zero_units units_of(const model_shape *m, const parallel_config *c)
{
    double t = c->tp, h = m->hidden;
    bool head_matrix = !m->tied_embeddings || c->pp > 1;
    return (zero_units){
        .layer = model_layer_parameter_count(m) / t,
        .embedding = ((double)m->vocab + m->seq) * h / t,
        .head = (2.0 * h + (head_matrix ? (double)m->vocab * h : 0.0)) / t};
}

static bool sharding(const parallel_config *config)
{
    return parallel_zero_stage(config) >= 2 && config->dp > 1;
}

/* One unit's weights gathered (all-gather of its half-precision copy,
 * priced as a reduce-scatter of the buffer, as ZeRO-1's) and its
 * gradients reduce-scattered (fp32). */
static double gather_s(const costmodel *cm, const parallel_config *config,
                       const stage_placement *place, double params)
{
    return costmodel_dp_reduce_seconds(
        cm, config, place, params * precision_bytes(config->precision), true);
}

static double scatter_s(const costmodel *cm, const parallel_config *config,
                        const stage_placement *place, double params)
{
    return costmodel_dp_reduce_seconds(cm, config, place, params * 4.0, true);
}

/* A unit's forward and backward with its ZeRO-2/3 communication on a
 * stream of its own: the next unit's gather and the last one's reduce
 * overlap this one's compute, so the unit takes the longer of the two. */
static void unit_times(const costmodel *cm, const parallel_config *config,
                       const stage_placement *place, double params,
                       double *forward_s, double *backward_s)
{
    int zero = parallel_zero_stage(config);
    double gather = zero >= 3 ? gather_s(cm, config, place, params) : 0.0;
    double reduce = scatter_s(cm, config, place, params);
    *forward_s = fmax(*forward_s, gather);
    *backward_s = fmax(*backward_s, gather + reduce);
}

void costmodel_zero_unit_costs(const costmodel *cm,
                               const parallel_config *config,
                               const stage_placement *place,
                               type_costs *costs)
{
    if (!sharding(config))
        return;
    zero_units u = units_of(&cm->model, config);
    unit_times(cm, config, place, u.layer, &costs->layer_forward_s,
               &costs->layer_backward_s);
    unit_times(cm, config, place, u.embedding, &costs->embedding_forward_s,
               &costs->embedding_backward_s);
    unit_times(cm, config, place, u.head, &costs->head_forward_s,
               &costs->head_backward_s);
}

bool costmodel_zero_step_work(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *place, int stage,
                              step_work *out)
{
    if (!sharding(config))
        return false;
    /* the unit the backward completes last: the embedding on the first
     * stage, else a layer or (a stage of no layers) the head, whichever
     * is smaller, so the figure does not depend on the layer count */
    zero_units u = units_of(&cm->model, config);
    double last_unit = stage == 0 ? u.embedding
                       : stage == config->pp - 1 ? fmin(u.layer, u.head)
                                                 : u.layer;
    out->reduce_s = scatter_s(cm, config, place, last_unit);
    out->exposed_s = out->reduce_s;
    out->tail_fraction = 1.0;
    /* ZeRO-2 gathers the updated parameters once, as ZeRO-1; ZeRO-3
     * keeps them sharded until the next forward gathers them */
    if (parallel_zero_stage(config) >= 3)
        out->gather_s = 0.0;
    return true;
}

double costmodel_offload_s_per_param(const parallel_config *config)
{
    double bytes = 4.0 + precision_bytes(config->precision);
    return bytes / COSTMODEL_HOST_LINK_BYTES_PER_S +
           1.0 / COSTMODEL_CPU_ADAMW_PARAMS_PER_S;
}

/* The largest unit a rank of stage `stage` gathers or reduces. */
static double largest_unit(const model_shape *model,
                           const parallel_config *config, int stage)
{
    zero_units u = units_of(model, config);
    double largest = model->layers > 0 ? u.layer : 0.0;
    if (stage == 0)
        largest = fmax(largest, u.embedding);
    if (stage == config->pp - 1)
        largest = fmax(largest, u.head);
    return largest;
}

void costmodel_zero_memory(const model_shape *model,
                           const parallel_config *config, int stage,
                           pt_memory_terms *fixed, pt_memory_terms *per_layer)
{
    int zero = parallel_zero_stage(config);
    double d = config->dp;
    double in_flight = 2.0 * largest_unit(model, config, stage);
    if (zero >= 2 && d > 1) {
        /* the shard of the summed gradients, and two units' worth: the
         * one the backward fills, the one being reduce-scattered */
        fixed->bytes[PT_MEMORY_GRADIENTS] =
            fixed->bytes[PT_MEMORY_GRADIENTS] / d + 4.0 * in_flight;
        per_layer->bytes[PT_MEMORY_GRADIENTS] /= d;
    }
    if (zero >= 3 && d > 1) {
        /* the master weights' shard; the half-precision copy's shard and
         * two units gathered: the one computing, the one prefetched */
        fixed->bytes[PT_MEMORY_WEIGHTS] /= d;
        per_layer->bytes[PT_MEMORY_WEIGHTS] /= d;
        fixed->bytes[PT_MEMORY_WEIGHT_MIRROR] =
            fixed->bytes[PT_MEMORY_WEIGHT_MIRROR] / d +
            precision_bytes(config->precision) * in_flight;
        per_layer->bytes[PT_MEMORY_WEIGHT_MIRROR] /= d;
    }
    /* offload: the moments left the device in memory.c already; the
     * fp32 weights stay as the backend's working copy (DeepSpeed keeps
     * half-precision ones only: docs/cost-model.md, section 11) */
}
