/*
 * The head as the partita executor runs it: where its stage fuses the
 * head (executor/cuda/buffers.c, plan_head; docs/cuda-backend.md, "The
 * fused head"), the forward computes the logits chunk by chunk and, for
 * each chunk, the loss, softmax - onehot and at once the head matrix's
 * weight and input gradient products; the backward keeps only the final
 * norm's. The cost model prices those products in the forward there, so
 * the schedule sees the phases as they run (docs/cost-model.md,
 * section 5, "The fused head's phases"), and in the backward where the
 * stage does not fuse but the profile timed the head fused.
 */
#include "costmodel/internal.h"

bool costmodel_head_fused(const model_shape *model,
                          const parallel_config *config, int stage)
{
    return stage == config->pp - 1 && config->runtime == RUNTIME_PARTITA &&
           config->tp <= 1 &&
           !costmodel_zero_sharded_stage(model, config, stage);
}

void costmodel_head_phases(const model_shape *model,
                           const parallel_config *config, int stage,
                           const type_costs *costs, double *forward_s,
                           double *backward_s)
{
    *forward_s = 0.0;
    *backward_s = 0.0;
    if (stage != config->pp - 1)
        return;
    *forward_s = costs->head_forward_s;
    *backward_s = costs->head_backward_s;
    bool fused = costmodel_head_fused(model, config, stage);
    if (fused == costs->head_timed_fused)
        return; /* timed as it runs */
    /* the products are part of the phase that was timed with them
     * (price.c), so the other phase's part never goes below zero */
    double *from = fused ? backward_s : forward_s;
    double *to = fused ? forward_s : backward_s;
    double moved = costs->head_products_s < *from ? costs->head_products_s
                                                  : *from;
    *to += moved;
    *from -= moved;
}
