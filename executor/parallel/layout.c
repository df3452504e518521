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
    return pipeline_layout_init_stages(out, shape, config, partition,
                                       partition_count, NULL, err);
}

/* Stage s's own degrees (config's where stages is NULL or says 0),
 * checked: its dp shares the pipeline micro-batch, its tp splits the
 * model and, under sequence parallelism, the sequence. */
static int stage_degrees_check(pipeline_layout *out, const int *partition,
                               const stage_degrees *stages, int s,
                               pt_error *err)
{
    const parallel_config *config = &out->config;
    parallel_config own = parallel_stage_config(config, stages, s);
    long long samples = (long long)config->dp * config->mbs;
    if (own.tp < 1 || own.tp > PT_MAX_TP || own.dp < 1 ||
        samples % own.dp != 0)
        return pt_fail(err, "pipeline runtime: stage %d: tp %d, dp %d: tp "
                            "must be 1 to %d and dp divide the micro-batch's "
                            "dp x mbs = %lld samples",
                       s, own.tp, own.dp, PT_MAX_TP, samples);
    if (parallel_check_schedule_levers(&own, out->shape.seq, err) != 0) {
        pt_error_prefix(err, "pipeline runtime: stage %d", s);
        return -1;
    }
    stage_spec spec;
    if (stage_spec_from_partition(&out->shape, partition, config->pp, s,
                                  &spec, err) != 0)
        return -1;
    /* the tensor-parallel split must fit the model (heads, vocab) */
    spec.tp = own.tp;
    if (stage_parameter_layout(&out->shape, &spec, NULL, NULL, err) < 0)
        return -1;
    out->stage_tp[s] = own.tp;
    out->stage_dp[s] = own.dp;
    out->stage_mbs[s] = own.mbs;
    out->first_rank[s + 1] = out->first_rank[s] + own.tp * own.dp;
    return 0;
}

int pipeline_layout_init_stages(pipeline_layout *out,
                                const model_shape *shape,
                                const parallel_config *config,
                                const int *partition, int partition_count,
                                const stage_degrees *stages, pt_error *err)
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
    int own = stage_degrees_first_own(config, stages);
    if (own >= 0 && v > 1)
        return pt_fail(err, "pipeline runtime: stage %d runs its own tp or "
                            "dp, which the interleaved 1F1B (virtual_stages "
                            "%d) does not take",
                       own, v);
    out->shape = *shape;
    out->config = *config;
    for (int s = 0; s < config->pp; s++)
        if (stage_degrees_check(out, partition, stages, s, err) != 0)
            return -1;
    out->asymmetric = own >= 0;
    out->stage_count = config->pp;
    memcpy(out->partition, partition, (size_t)config->pp * sizeof(int));
    out->micro_batches = config->gbs / (config->dp * config->mbs);
    out->rank_count = out->first_rank[config->pp];
    return 0;
}

int pipeline_rank_stage(const pipeline_layout *layout, int rank)
{
    /* the last stage whose first rank is at most rank */
    int low = 0, high = layout->stage_count - 1;
    while (low < high) {
        int middle = (low + high + 1) / 2;
        if (layout->first_rank[middle] <= rank)
            low = middle;
        else
            high = middle - 1;
    }
    return low;
}

int pipeline_rank_replica(const pipeline_layout *layout, int rank)
{
    int s = pipeline_rank_stage(layout, rank);
    return (rank - layout->first_rank[s]) / layout->stage_tp[s];
}

int pipeline_rank_tp(const pipeline_layout *layout, int rank)
{
    int s = pipeline_rank_stage(layout, rank);
    return (rank - layout->first_rank[s]) % layout->stage_tp[s];
}

int pipeline_rank_of(const pipeline_layout *layout, int stage, int replica,
                     int tp_rank)
{
    return layout->first_rank[stage] + tp_rank +
           layout->stage_tp[stage] * replica;
}

bool pipeline_same_degrees(const pipeline_layout *layout, int a, int b)
{
    return layout->stage_tp[a] == layout->stage_tp[b] &&
           layout->stage_dp[a] == layout->stage_dp[b];
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
    int stage = pipeline_rank_stage(layout, rank);
    int tp = layout->stage_tp[stage], dp = layout->stage_dp[stage];
    out->tp = tp;
    out->tp_rank = pipeline_rank_tp(layout, rank);
    out->recompute_layers = layout->config.recompute;
    out->bf16_grads = layout->config.grad_precision == GRAD_PRECISION_BF16;
    out->offload_optimizer = layout->config.offload_optimizer;
    out->deterministic = layout->config.deterministic;
    out->sequence_parallel = layout->config.sequence_parallel && tp > 1;
    if (layout->config.distributed_optimizer && dp > 1) {
        out->optimizer_shards = dp;
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
    int stage_index = pipeline_rank_stage(layout, c->rank);
    if (layout->stage_tp[stage_index] == 1)
        return 0;
    int group[PT_MAX_TP];
    int replica = pipeline_rank_replica(layout, c->rank);
    for (int t = 0; t < layout->stage_tp[stage_index]; t++)
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
                           layout->stage_mbs[stage],
                           pipeline_chunk_slot_count(layout, stage, chunk),
                           err) != 0)
        return -1;
    if (model_stage_init_parameters(out, seed, err) != 0) {
        model_stage_destroy(out);
        return -1;
    }
    return 0;
}

/* ------------------------------------------- stages of their own degrees */

void pipeline_tied_segment(const pipeline_layout *layout, int t, int u,
                           int *first, int *count)
{
    int last = layout->stage_count - 1, vocab = layout->shape.vocab;
    int first_t = 0, count_t = 0, first_u = 0, count_u = 0;
    stage_vocab_shard(vocab, layout->stage_tp[0], t, &first_t, &count_t);
    stage_vocab_shard(vocab, layout->stage_tp[last], u, &first_u, &count_u);
    int lo = first_t > first_u ? first_t : first_u;
    int hi_t = first_t + count_t, hi_u = first_u + count_u;
    int hi = hi_t < hi_u ? hi_t : hi_u;
    *first = lo;
    *count = hi > lo ? hi - lo : 0;
}

void pipeline_boundary_rows(const pipeline_layout *layout, int rank,
                            size_t *first, size_t *count)
{
    int s = pipeline_rank_stage(layout, rank);
    size_t rows = (size_t)layout->stage_mbs[s] * (size_t)layout->shape.seq;
    size_t tp = (size_t)layout->stage_tp[s];
    size_t t = (size_t)pipeline_rank_tp(layout, rank);
    size_t lo = rows * t / tp, hi = rows * (t + 1) / tp;
    *first = (size_t)pipeline_rank_replica(layout, rank) * rows + lo;
    *count = hi - lo;
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

/* The tied embedding's pairs: shard t of replica d of the first stage
 * with its twin on the last (stages of the same degrees), or else, for
 * each replica d that both stages have, their shards whose vocabulary
 * rows meet (pipeline_tied_segment); the other replicas get the sums
 * over their stage's dp group. */
static void add_embedding_pairs(const pipeline_layout *layout,
                                comm_groups *out, int *members)
{
    int last = layout->stage_count - 1;
    if (layout->stage_count < 2 || !layout->shape.tied_embeddings)
        return;
    if (pipeline_same_degrees(layout, 0, last)) {
        for (int d = 0; d < layout->stage_dp[0]; d++)
            for (int t = 0; t < layout->stage_tp[0]; t++) {
                members[0] = pipeline_rank_of(layout, 0, d, t);
                members[1] = pipeline_rank_of(layout, last, d, t);
                add_new_group(out, members, 2, layout->rank_count);
            }
        return;
    }
    int twins = layout->stage_dp[0] < layout->stage_dp[last]
                    ? layout->stage_dp[0]
                    : layout->stage_dp[last];
    for (int d = 0; d < twins; d++)
        for (int t = 0; t < layout->stage_tp[0]; t++)
            for (int u = 0; u < layout->stage_tp[last]; u++) {
                int first = 0, count = 0;
                pipeline_tied_segment(layout, t, u, &first, &count);
                if (count == 0)
                    continue;
                members[0] = pipeline_rank_of(layout, 0, d, t);
                members[1] = pipeline_rank_of(layout, last, d, u);
                add_new_group(out, members, 2, layout->rank_count);
            }
}

int pipeline_layout_groups(const pipeline_layout *layout, comm_groups *out,
                           pt_error *err)
{
    int pp = layout->stage_count, ranks = layout->rank_count;
    int widest = 2, most_groups = 0;
    for (int s = 0; s < pp; s++) {
        int dp = layout->stage_dp[s], tp = layout->stage_tp[s];
        widest = dp > widest ? dp : tp > widest ? tp : widest;
        /* tp dp groups, dp tp groups, and at most dp x tp pairs */
        most_groups += tp + dp + dp * tp;
    }
    memset(out, 0, sizeof *out);
    out->offsets = calloc((size_t)most_groups + 1, sizeof *out->offsets);
    out->members = calloc((size_t)ranks * 4 + 2, sizeof *out->members);
    int *members = calloc((size_t)widest + 2, sizeof *members);
    if (out->offsets == NULL || out->members == NULL || members == NULL) {
        free(members);
        comm_groups_free(out);
        return pt_fail(err, "pipeline runtime: out of memory for the "
                            "groups of %d ranks",
                       ranks);
    }
    for (int s = 0; s < pp; s++)
        for (int t = 0; t < layout->stage_tp[s]; t++) {
            for (int d = 0; d < layout->stage_dp[s]; d++)
                members[d] = pipeline_rank_of(layout, s, d, t);
            add_new_group(out, members, layout->stage_dp[s], ranks);
        }
    for (int s = 0; s < pp; s++)
        for (int d = 0; d < layout->stage_dp[s]; d++) {
            for (int t = 0; t < layout->stage_tp[s]; t++)
                members[t] = pipeline_rank_of(layout, s, d, t);
            add_new_group(out, members, layout->stage_tp[s], ranks);
        }
    add_embedding_pairs(layout, out, members);
    free(members);
    return 0;
}
