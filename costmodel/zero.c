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

/* One unit's weights gathered (an all-gather of its fp32 weights, which
 * the cuda executor then converts to its bf16 copy: priced as a
 * reduce-scatter of the buffer, as ZeRO-1's) and its gradients
 * reduce-scattered (fp32). */
static double gather_s(const costmodel *cm, const parallel_config *config,
                       const stage_placement *place, double params)
{
    return costmodel_dp_reduce_seconds(cm, config, place, params * 4.0, true);
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

bool costmodel_zero_sharded_stage(const model_shape *model,
                                  const parallel_config *config, int stage)
{
    bool tied_pair = model->tied_embeddings && config->pp > 1 &&
                     (stage == 0 || stage == config->pp - 1);
    return sharding(config) && !tied_pair;
}

void costmodel_zero_memory(const model_shape *model,
                           const parallel_config *config, int stage,
                           const zero_unit_sizes *u, pt_memory_terms *fixed,
                           pt_memory_terms *per_layer)
{
    /* offload: the moments left the device in memory.c already; the
     * fp32 weights stay as the backend's working copy (DeepSpeed keeps
     * half-precision ones only: docs/cost-model.md, section 11) */
    if (!costmodel_zero_sharded_stage(model, config, stage))
        return;
    double d = config->dp;
    double ends = u->embedding + u->head;
    /* the unit buffers: two layers (the one the pass computes, the one
     * reduced or gathered), the head, the embeddings */
    double units = u->embedding + 2.0 * u->layer + u->head;
    /* the shard: runs of 64 floats, the first shards the fullest */
    double shard_fixed = ends / d + 64.0 + 1.0;
    /* gradients: the shard, and the units with the head's padding */
    fixed->bytes[PT_MEMORY_GRADIENTS] =
        4.0 * shard_fixed + 4.0 * (units + u->head_pad + 1.0);
    per_layer->bytes[PT_MEMORY_GRADIENTS] = 4.0 * u->layer / d;
    if (parallel_zero_stage(config) < 3)
        return;
    /* ZeRO-3: the fp32 weights likewise (their units gathered whole), no
     * mirror of every parameter but the units' bf16 copies, and the
     * units' conversion tables for the table of every parameter */
    fixed->bytes[PT_MEMORY_WEIGHTS] = 4.0 * shard_fixed + 4.0 * (units + 1.0);
    per_layer->bytes[PT_MEMORY_WEIGHTS] = 4.0 * u->layer / d;
    fixed->bytes[PT_MEMORY_WEIGHT_MIRROR] =
        precision_bytes(config->precision) * (units + u->head_pad + 1.0);
    per_layer->bytes[PT_MEMORY_WEIGHT_MIRROR] = 0.0;
    fixed->bytes[PT_MEMORY_OPTIMIZER] += u->unit_tables - u->every_table_fixed;
    per_layer->bytes[PT_MEMORY_OPTIMIZER] -= u->every_table_layer;
}
