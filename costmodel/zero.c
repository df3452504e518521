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
    double positions = m->positions == MODEL_POSITIONS_LEARNED ? m->seq : 0;
    return (zero_units){
        .layer = model_layer_parameters_per_rank(m, c->tp),
        .embedding = ((double)m->vocab + positions) * h / t,
        .head = (model_final_norm_parameter_count(m) +
                 (head_matrix ? (double)m->vocab * h : 0.0)) / t};
}

static bool sharding(const parallel_config *config)
{
    return parallel_zero_stage(config) >= 2 && config->dp > 1;
}

/* One unit's collective over the stage's dp group: its weights
 * all-gathered (fp32, which the cuda executor then converts to its bf16
 * copy) or its gradients reduce-scattered (fp32), both priced as a
 * reduce-scatter of the unit's fp32 buffer (ZeRO-1's rule). */
static double unit_collective_s(const costmodel *cm,
                                const parallel_config *config,
                                const stage_placement *place, double params)
{
    return costmodel_dp_reduce_seconds(cm, config, place, params * 4.0, true);
}

/* Bytes the SMs move per parameter of a unit, on slices of one GPU where
 * the device exchange's kernels run in the rank's own slice (the cuda
 * executor, measured 2026-11-27 on an H100's 40-SM slices): a gather
 * copies the rank's part (read and write 4 / d each), receives the
 * others' (read and write 4 (d - 1) / d each) and converts the unit to
 * bf16 (read 4, write 2): 14 bytes; a reduce-scatter reads every
 * member's part of the unit (4) and writes the rank's sum (4 / d), then
 * adds it to the shard (read 8 / d, write 4 / d): 4 (1 + 4 / d). */
#define GATHER_KERNEL_BYTES 14.0
static double reduce_kernel_bytes(const parallel_config *config)
{
    return 4.0 * (1.0 + 4.0 / config->dp);
}

/* A unit's forward and backward with its ZeRO-2/3 communication on a
 * stream of its own: the next unit's gather and the last one's reduce
 * overlap this one's compute, so the unit takes the longer of the two;
 * on slices of one GPU the collectives' kernels take the unit's SMs
 * (at the slice's streaming rate: the AdamW step's per byte), so they
 * add to its compute. The embeddings end the first stage's backward:
 * their reduce runs under what follows (the next micro-batch's forward;
 * after the last one, the step's exposed reduce_s), not under their
 * own backward (`trailing`). */
static void unit_times(const costmodel *cm, const parallel_config *config,
                       const stage_placement *place, double params,
                       double s_per_byte, bool trailing, double *forward_s,
                       double *backward_s)
{
    bool gathers = parallel_zero_stage(config) >= 3;
    double gather = gathers ? unit_collective_s(cm, config, place, params)
                            : 0.0;
    double reduce = unit_collective_s(cm, config, place, params);
    double gather_kernels = 0.0, reduce_kernels = 0.0;
    if (place->slices_of_one_gpu) {
        gather_kernels =
            gathers ? params * GATHER_KERNEL_BYTES * s_per_byte : 0.0;
        reduce_kernels = params * reduce_kernel_bytes(config) * s_per_byte;
    }
    *forward_s = fmax(*forward_s + gather_kernels, gather);
    *backward_s = fmax(*backward_s + gather_kernels + reduce_kernels,
                       gather + (trailing ? 0.0 : reduce));
}

/* The SM time of one unit's reduce-scatter and add on slices of one GPU
 * (0 elsewhere). */
static double reduce_kernels_s(const parallel_config *config,
                               const stage_placement *place,
                               const type_costs *costs, double params)
{
    return place->slices_of_one_gpu ? params * reduce_kernel_bytes(config) *
                                          costs->stream_s_per_byte
                                    : 0.0;
}

void costmodel_zero_unit_costs(const costmodel *cm,
                               const parallel_config *config,
                               const stage_placement *place,
                               type_costs *costs)
{
    if (!sharding(config))
        return;
    zero_units u = units_of(&cm->model, config);
    double s_per_byte = costs->stream_s_per_byte;
    unit_times(cm, config, place, u.layer, s_per_byte, false,
               &costs->layer_forward_s, &costs->layer_backward_s);
    unit_times(cm, config, place, u.embedding, s_per_byte, true,
               &costs->embedding_forward_s, &costs->embedding_backward_s);
    unit_times(cm, config, place, u.head, s_per_byte, false,
               &costs->head_forward_s, &costs->head_backward_s);
}

bool costmodel_zero_step_work(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *place, int stage,
                              const type_costs *slow, step_work *out)
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
    /* its transfer and, on slices, its kernels (behind the backward's
     * last kernels on the units' stream) */
    out->reduce_s = unit_collective_s(cm, config, place, last_unit) +
                    reduce_kernels_s(config, place, slow, last_unit);
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
    /* the fp32 gradients down and the fp32 weights back up (the cuda
     * executor keeps fp32 weights on the device: stage/offload.c) */
    (void)config;
    double bytes = 8.0;
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
