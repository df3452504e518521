/*
 * Megatron's sequence parallelism with tp, priced (docs/cost-model.md,
 * "Sequence parallelism"): each of a layer's tensor-parallel all-reduces
 * becomes a reduce-scatter over the sequence and an all-gather, the
 * layer norms, dropouts and the residual stream between them hold s / t
 * of the rows, and the pipeline's messages (the residual stream) are the
 * sequence shard.
 */
#include "costmodel/internal.h"

double costmodel_sequence_shards(const parallel_config *config)
{
    return config->sequence_parallel && config->tp > 1 ? config->tp : 1.0;
}

double costmodel_pipeline_message_bytes(const model_shape *model,
                                        const parallel_config *config)
{
    return activation_message_bytes(model, config) /
           costmodel_sequence_shards(config);
}

double costmodel_sequence_tp_comm_s(double reduce_scatter_s,
                                    double all_gather_s)
{
    /* the reduce-scatter after the row-parallel matmul and the
     * all-gather before the next column-parallel one (together they move
     * what one ring all-reduce moves, in as many steps) */
    return reduce_scatter_s + all_gather_s;
}
