/*
 * A parallel plan's layout: which rank holds which stage, replica and
 * tensor-parallel shard, the stage each rank creates and the groups of
 * ranks its collectives run over (dp groups, tp groups, embedding
 * pairs). docs/executor.md ("Layout and stages").
 */
#include "executor/parallel/parallel.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- layout */

int pipeline_layout_init(pipeline_layout *out, const model_shape *shape,
                         const parallel_config *config, const int *partition,
                         int partition_count, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (config->pp < 1 || config->pp > PT_MAX_STAGES || config->dp < 1 ||
        config->tp < 1 || config->tp > PT_MAX_TP || config->mbs < 1 ||
        config->gbs < 1)
        return pt_fail(err, "pipeline runtime: pp %d, dp %d, tp %d, mbs %d, "
                            "gbs %d: each must be at least 1 (pp at most %d, "
                            "tp at most %d)",
                       config->pp, config->dp, config->tp, config->mbs,
                       config->gbs, PT_MAX_STAGES, PT_MAX_TP);
    if (config->gbs % (config->dp * config->mbs) != 0)
        return pt_fail(err, "pipeline runtime: gbs %d is not a multiple of "
                            "dp x mbs = %d",
                       config->gbs, config->dp * config->mbs);
    if (partition_count != config->pp)
        return pt_fail(err, "pipeline runtime: the partition has %d stages, "
                            "pp is %d",
                       partition_count, config->pp);
    if (parallel_check_schedule_levers(config, shape->seq, err) != 0)
        return -1;
    int v = parallel_virtual_stages(config);
    for (int s = 0; s < config->pp; s++)
        if (partition[s] % v != 0)
            return pt_fail(err, "pipeline runtime: stage %d holds %d layers, "
                                "not a multiple of virtual_stages %d",
                           s, partition[s], v);
    stage_spec spec;
    for (int s = 0; s < config->pp; s++) {
        if (stage_spec_from_partition(shape, partition, partition_count, s,
                                      &spec, err) != 0)
            return -1;
        /* the tensor-parallel split must fit the model (heads, vocab) */
        spec.tp = config->tp;
        if (stage_parameter_layout(shape, &spec, NULL, NULL, err) < 0)
            return -1;
    }
    out->shape = *shape;
    out->config = *config;
    out->stage_count = config->pp;
    memcpy(out->partition, partition, (size_t)config->pp * sizeof(int));
    out->micro_batches = config->gbs / (config->dp * config->mbs);
    out->rank_count = config->pp * config->dp * config->tp;
    return 0;
}

int pipeline_rank_stage(const pipeline_layout *layout, int rank)
{
    return rank / (layout->config.dp * layout->config.tp);
}

int pipeline_rank_replica(const pipeline_layout *layout, int rank)
{
    return rank / layout->config.tp % layout->config.dp;
}

int pipeline_rank_tp(const pipeline_layout *layout, int rank)
{
    return rank % layout->config.tp;
}

int pipeline_rank_of(const pipeline_layout *layout, int stage, int replica,
                     int tp_rank)
{
    return tp_rank +
           layout->config.tp * (replica + layout->config.dp * stage);
}

/* The spec of a rank's stage: its layers, its tensor-parallel shard, and
 * the plan's recompute and (dp > 1) optimizer shard. */
int pipeline_rank_spec(const pipeline_layout *layout, int rank,
                       stage_spec *out, pt_error *err)
{
    return pipeline_rank_chunk_spec(layout, rank, 0, out, err);
}

int pipeline_chunk_count(const pipeline_layout *layout)
{
    return parallel_virtual_stages(&layout->config);
}

/* Chunk `chunk` of stage s is virtual stage chunk x pp + s of the pp x v
 * virtual stages, each holding 1 / v of its rank's layers. */
static int chunk_layers(const pipeline_layout *layout, int chunk, int stage,
                        stage_spec *out, pt_error *err)
{
    int pp = layout->stage_count, v = pipeline_chunk_count(layout);
    if (v == 1)
        return stage_spec_from_partition(&layout->shape, layout->partition,
                                         pp, stage, out, err);
    if (chunk < 0 || chunk >= v)
        return pt_fail(err, "pipeline runtime: chunk %d of %d", chunk, v);
    int *virtual_partition = malloc((size_t)pp * v * sizeof(int));
    if (virtual_partition == NULL)
        return pt_fail(err, "pipeline runtime: out of memory");
    for (int q = 0; q < pp * v; q++)
        virtual_partition[q] = layout->partition[q % pp] / v;
    int status = stage_spec_from_partition(&layout->shape, virtual_partition,
                                           pp * v, chunk * pp + stage, out,
                                           err);
    free(virtual_partition);
    return status;
}

int pipeline_rank_chunk_spec(const pipeline_layout *layout, int rank,
                             int chunk, stage_spec *out, pt_error *err)
{
    if (chunk_layers(layout, chunk, pipeline_rank_stage(layout, rank), out,
                     err) != 0)
        return -1;
    out->tp = layout->config.tp;
    out->tp_rank = pipeline_rank_tp(layout, rank);
    out->recompute_layers = layout->config.recompute;
    out->bf16_grads = layout->config.grad_precision == GRAD_PRECISION_BF16;
    out->offload_optimizer = layout->config.offload_optimizer;
    out->sequence_parallel =
        layout->config.sequence_parallel && layout->config.tp > 1;
    if (layout->config.distributed_optimizer && layout->config.dp > 1) {
        out->optimizer_shards = layout->config.dp;
        out->optimizer_shard = pipeline_rank_replica(layout, rank);
        /* ZeRO-2/3: the shard's gradients only, where the backend can */
        out->shard_gradients = parallel_zero_stage(&layout->config) >= 2;
        out->shard_parameters = parallel_zero_stage(&layout->config) >= 3;
    }
    return 0;
}

int pipeline_stage_attach(const pipeline_layout *layout, model_stage *stage,
                          const comm *c, pt_error *err)
{
    if (layout->config.tp == 1)
        return 0;
    int group[PT_MAX_TP];
    int stage_index = pipeline_rank_stage(layout, c->rank);
    int replica = pipeline_rank_replica(layout, c->rank);
    for (int t = 0; t < layout->config.tp; t++)
        group[t] = pipeline_rank_of(layout, stage_index, replica, t);
    return model_stage_attach_tp(stage, c, group, err);
}

int pipeline_chunk_slot_count(const pipeline_layout *layout, int stage,
                              int chunk)
{
    int v = pipeline_chunk_count(layout);
    if (v == 1)
        return pipeline_slot_count(layout, stage);
    int slots[PLAN_MAX_VIRTUAL_STAGES];
    parallel_chunk_slots(layout->stage_count, v, stage,
                         layout->micro_batches, slots);
    return slots[chunk];
}

int pipeline_slot_count(const pipeline_layout *layout, int stage)
{
    int in_flight = layout->stage_count - stage;
    if (layout->config.schedule == SCHEDULE_GPIPE ||
        in_flight > layout->micro_batches)
        return layout->micro_batches;
    return in_flight;
}

int pipeline_stage_create(model_stage *out, const pipeline_layout *layout,
                          int rank, backend_kind backend, uint64_t seed,
                          pt_error *err)
{
    if (rank < 0 || rank >= layout->rank_count)
        return pt_fail(err, "pipeline runtime: rank %d is not one of the "
                            "%d",
                       rank, layout->rank_count);
    return pipeline_chunk_stage_create(out, layout, rank, 0, backend, seed,
                                       err);
}

int pipeline_chunk_stage_create(model_stage *out,
                                const pipeline_layout *layout, int rank,
                                int chunk, backend_kind backend,
                                uint64_t seed, pt_error *err)
{
    if (rank < 0 || rank >= layout->rank_count)
        return pt_fail(err, "pipeline runtime: rank %d is not one of the "
                            "%d",
                       rank, layout->rank_count);
    int stage = pipeline_rank_stage(layout, rank);
    stage_spec spec;
    if (pipeline_rank_chunk_spec(layout, rank, chunk, &spec, err) != 0)
        return -1;
    if (model_stage_create(out, &layout->shape, &spec, backend,
                           layout->config.mbs,
                           pipeline_chunk_slot_count(layout, stage, chunk),
                           err) != 0)
        return -1;
    if (model_stage_init_parameters(out, seed, err) != 0) {
        model_stage_destroy(out);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- groups */

/* Appends one group to out (room was made by the caller). */
static void add_group(comm_groups *out, const int *members, int size)
{
    int first = out->offsets[out->count];
    memcpy(out->members + first, members, (size_t)size * sizeof *members);
    out->offsets[++out->count] = first + size;
}

static bool is_world(const int *members, int size, int world_size)
{
    if (size != world_size)
        return false;
    for (int i = 0; i < size; i++) /* members are in increasing order */
        if (members[i] != i)
            return false;
    return true;
}

/* The groups are built in increasing rank order, so equal sets are equal
 * lists. */
static bool already_listed(const comm_groups *out, const int *members,
                           int size)
{
    for (int g = 0; g < out->count; g++)
        if (out->offsets[g + 1] - out->offsets[g] == size &&
            memcmp(out->members + out->offsets[g], members,
                   (size_t)size * sizeof *members) == 0)
            return true;
    return false;
}

static void add_new_group(comm_groups *out, const int *members, int size,
                          int world_size)
{
    if (size > 1 && !is_world(members, size, world_size) &&
        !already_listed(out, members, size))
        add_group(out, members, size);
}

int pipeline_layout_groups(const pipeline_layout *layout, comm_groups *out,
                           pt_error *err)
{
    const parallel_config *c = &layout->config;
    int pp = layout->stage_count, dp = c->dp, tp = c->tp;
    int ranks = layout->rank_count;
    bool embedding = pp > 1 && layout->shape.tied_embeddings;
    /* at most: pp x tp dp groups, pp x dp tp groups, dp x tp pairs */
    int most_groups = pp * tp + pp * dp + dp * tp;
    memset(out, 0, sizeof *out);
    out->offsets = calloc((size_t)most_groups + 1, sizeof *out->offsets);
    out->members = calloc((size_t)ranks * 3 + 2, sizeof *out->members);
    int *members = calloc((size_t)(dp > tp ? dp : tp) + 2, sizeof *members);
    if (out->offsets == NULL || out->members == NULL || members == NULL) {
        free(members);
        comm_groups_free(out);
        return pt_fail(err, "pipeline runtime: out of memory for the "
                            "groups of %d ranks",
                       ranks);
    }
    for (int s = 0; s < pp; s++)
        for (int t = 0; t < tp; t++) {
            for (int d = 0; d < dp; d++)
                members[d] = pipeline_rank_of(layout, s, d, t);
            add_new_group(out, members, dp, ranks);
        }
    for (int s = 0; s < pp; s++)
        for (int d = 0; d < dp; d++) {
            for (int t = 0; t < tp; t++)
                members[t] = pipeline_rank_of(layout, s, d, t);
            add_new_group(out, members, tp, ranks);
        }
    for (int d = 0; embedding && d < dp; d++)
        for (int t = 0; t < tp; t++) {
            members[0] = pipeline_rank_of(layout, 0, d, t);
            members[1] = pipeline_rank_of(layout, pp - 1, d, t);
            add_new_group(out, members, 2, ranks);
        }
    free(members);
    return 0;
}
