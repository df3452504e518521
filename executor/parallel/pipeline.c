/*
 * The pipeline, data- and tensor-parallel runtime over model stages: one
 * rank's training step (schedule, activations and gradients over the
 * comm, gradient all-reduces, global norm, AdamW; the tensor-parallel
 * sums happen inside the backend's forward and backward), the groups a
 * layout's collectives run over, and a launcher that runs every rank of a
 * layout on a thread of its own in this process, over the threads comm or
 * a comm the caller made (NCCL). docs/executor.md ("Parallel runtime")
 * describes it.
 */
#include "executor/parallel/parallel.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    if (stage_spec_from_partition(&layout->shape, layout->partition,
                                  layout->stage_count,
                                  pipeline_rank_stage(layout, rank), out,
                                  err) != 0)
        return -1;
    out->tp = layout->config.tp;
    out->tp_rank = pipeline_rank_tp(layout, rank);
    out->recompute_layers = layout->config.recompute;
    if (layout->config.distributed_optimizer && layout->config.dp > 1) {
        out->optimizer_shards = layout->config.dp;
        out->optimizer_shard = pipeline_rank_replica(layout, rank);
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
    int stage = pipeline_rank_stage(layout, rank);
    stage_spec spec;
    if (pipeline_rank_spec(layout, rank, &spec, err) != 0)
        return -1;
    if (model_stage_create(out, &layout->shape, &spec, backend,
                           layout->config.mbs,
                           pipeline_slot_count(layout, stage), err) != 0)
        return -1;
    if (model_stage_init_parameters(out, seed, err) != 0) {
        model_stage_destroy(out);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- events */

int pipeline_events_reserve(pipeline_events *events,
                            const pipeline_layout *layout, pt_error *err)
{
    int capacity = 6 * layout->micro_batches + 4;
    if (events->capacity >= capacity)
        return 0;
    run_event *grown = realloc(events->events,
                               (size_t)capacity * sizeof *grown);
    if (grown == NULL)
        return pt_fail(err, "pipeline runtime: out of memory for %d events",
                       capacity);
    events->events = grown;
    events->capacity = capacity;
    return 0;
}

void pipeline_events_free(pipeline_events *events)
{
    free(events->events);
    memset(events, 0, sizeof *events);
}

/* ------------------------------------------------------- one rank's step */

/* What one rank's step works with. */
typedef struct rank_step {
    const pipeline_layout *layout;
    model_stage *stage;
    const comm *c;
    int stage_index;
    int replica;
    int previous_rank;           /* stage s - 1 of this replica, or -1 */
    int next_rank;               /* stage s + 1 of this replica, or -1 */
    const uint32_t *tokens;      /* this replica's windows */
    size_t activation_floats;    /* mbs x seq x hidden */
    float *output_grad;          /* receives d loss / d output (no head) */
    float loss_scale;            /* 1 / (m dp) */
    double loss_sum;             /* of this rank's micro-batches (head) */
    double step_start_s;
    pipeline_events *events;     /* may be NULL */
    int micro_batch;             /* being worked on, for messages */
    const char *operation;       /* event kind being worked on */
    int tp_rank;
} rank_step;

static void record(rank_step *r, const char *kind, int micro_batch,
                   double start_s)
{
    if (r->events == NULL || r->events->count >= r->events->capacity)
        return;
    run_event *event = &r->events->events[r->events->count++];
    event->rank = r->c->rank;
    event->stage = r->stage_index;
    event->microbatch = micro_batch;
    event->kind = kind;
    event->start_s = start_s - r->step_start_s;
    event->end_s = pt_monotonic_seconds() - r->step_start_s;
}

/* Marks what the rank starts now (for the error message) and returns the
 * time. */
static double begin(rank_step *r, const char *operation, int micro_batch)
{
    r->operation = operation;
    r->micro_batch = micro_batch;
    return pt_monotonic_seconds();
}

static stage_io micro_batch_io(const rank_step *r, int micro_batch)
{
    size_t window = (size_t)r->layout->shape.seq + 1;
    stage_io io = {
        .mbs = r->layout->config.mbs,
        .tokens = r->tokens +
                  (size_t)micro_batch * (size_t)r->layout->config.mbs * window,
        .loss_scale = r->loss_scale,
    };
    return io;
}

/* Tags: micro-batch j's activation 2j, its gradient 2j + 1. */
static int forward(rank_step *r, int micro_batch, pt_error *err)
{
    int slot = micro_batch % r->stage->slot_count;
    stage_io io = micro_batch_io(r, micro_batch);
    if (r->previous_rank >= 0) {
        double start = begin(r, "recv_fwd", micro_batch);
        float *input = stage_input_buffer(r->stage, slot);
        if (comm_recv(r->c, r->previous_rank, 2 * micro_batch, input,
                      r->activation_floats, err) != 0)
            return -1;
        record(r, "recv_fwd", micro_batch, start);
        io.input = input;
    }
    double start = begin(r, "fwd", micro_batch);
    float loss = 0.0f;
    if (stage_forward(r->stage, slot, &io, &loss, err) != 0)
        return -1;
    record(r, "fwd", micro_batch, start);
    r->loss_sum += loss;
    if (r->next_rank >= 0) {
        start = begin(r, "send_fwd", micro_batch);
        if (comm_send(r->c, r->next_rank, 2 * micro_batch,
                      stage_output(r->stage, slot), r->activation_floats,
                      err) != 0)
            return -1;
        record(r, "send_fwd", micro_batch, start);
    }
    return 0;
}

static int backward(rank_step *r, int micro_batch, pt_error *err)
{
    int slot = micro_batch % r->stage->slot_count;
    stage_io io = micro_batch_io(r, micro_batch);
    if (r->next_rank >= 0) {
        double start = begin(r, "recv_bwd", micro_batch);
        if (comm_recv(r->c, r->next_rank, 2 * micro_batch + 1,
                      r->output_grad, r->activation_floats, err) != 0)
            return -1;
        record(r, "recv_bwd", micro_batch, start);
        io.output_grad = r->output_grad;
    }
    double start = begin(r, "bwd", micro_batch);
    if (stage_backward(r->stage, slot, &io, err) != 0)
        return -1;
    record(r, "bwd", micro_batch, start);
    if (r->previous_rank >= 0) {
        start = begin(r, "send_bwd", micro_batch);
        if (comm_send(r->c, r->previous_rank, 2 * micro_batch + 1,
                      stage_input_grad(r->stage), r->activation_floats,
                      err) != 0)
            return -1;
        record(r, "send_bwd", micro_batch, start);
    }
    return 0;
}

/* 1F1B: warm-up forwards, then one forward one backward, then the
 * remaining backwards; GPipe: every forward, then every backward.
 * Backwards run in micro-batch order either way, so gradients accumulate
 * in the order of the one-stage step. */
static int run_schedule(rank_step *r, bool inject_failure, pt_error *err)
{
    int m = r->layout->micro_batches;
    int warm_up = m;
    if (r->layout->config.schedule == SCHEDULE_1F1B) {
        warm_up = r->layout->stage_count - r->stage_index - 1;
        if (warm_up > m)
            warm_up = m;
    }
    int forwards = 0, backwards = 0;
    while (forwards < m || backwards < m) {
        bool in_warm_up = forwards < warm_up;
        if (forwards < m) {
            if (forward(r, forwards++, err) != 0)
                return -1;
            if (inject_failure)
                return pt_fail(err, "injected failure after the forward of "
                                    "micro-batch 0 (a test asked for it)");
        }
        if (!in_warm_up && backward(r, backwards++, err) != 0)
            return -1;
    }
    return 0;
}

/* The first stage's token-embedding gradient and the last stage's tied
 * copy, summed: they are one tensor. */
static int embedding_all_reduce(rank_step *r, pt_error *err)
{
    const pipeline_layout *layout = r->layout;
    int last = layout->stage_count - 1;
    if (layout->stage_count < 2 || !layout->shape.tied_embeddings ||
        (r->stage_index != 0 && r->stage_index != last))
        return 0;
    const param_tensor *tensor = model_stage_find_tensor(
        r->stage, r->stage_index == 0 ? "token_embedding" : "lm_head_weight");
    if (tensor == NULL || (r->stage_index == last && !tensor->tied_copy))
        return pt_fail(err, "stage %d holds no tied embedding tensor",
                       r->stage_index);
    int group[2] = {pipeline_rank_of(layout, 0, r->replica, r->tp_rank),
                    pipeline_rank_of(layout, last, r->replica, r->tp_rank)};
    double start = begin(r, "embedding_allreduce", -1);
    if (comm_all_reduce_sum(r->c, group, 2, r->stage->grads + tensor->offset,
                            tensor->count, err) != 0)
        return -1;
    record(r, "embedding_allreduce", -1, start);
    return 0;
}

/* The group of ranks first, first + stride, ... (count of them): a dp
 * group, or the world. NULL when out of memory. */
static int *strided_group(int first, int count, int stride)
{
    int *group = malloc((size_t)count * sizeof *group);
    if (group != NULL)
        for (int i = 0; i < count; i++)
            group[i] = first + i * stride;
    return group;
}

static bool sharded_optimizer(const rank_step *r)
{
    return r->stage->spec.optimizer_shards > 1;
}

/* The dp group of this rank's stage and tp shard, in replica order, and
 * where each replica's optimizer shard starts (dp + 1 offsets); the
 * caller frees both. */
static int dp_shards(const rank_step *r, int **group, size_t **offsets,
                     pt_error *err)
{
    int dp = r->layout->config.dp;
    *group = strided_group(
        pipeline_rank_of(r->layout, r->stage_index, 0, r->tp_rank), dp,
        r->layout->config.tp);
    *offsets = malloc(((size_t)dp + 1) * sizeof **offsets);
    if (*group == NULL || *offsets == NULL) {
        free(*group);
        free(*offsets);
        return pt_fail(err, "out of memory for a group of %d", dp);
    }
    stage_optimizer_offsets(r->stage->param_count, dp, *offsets);
    return 0;
}

/* Replicated optimizer: every replica gets the summed gradients. ZeRO-1:
 * replica i gets the sum of its shard only (reduce-scatter), the half of
 * the all-reduce's traffic its step needs. */
static int dp_reduce_gradients(rank_step *r, pt_error *err)
{
    int dp = r->layout->config.dp;
    if (dp == 1)
        return 0;
    int *group = NULL;
    size_t *offsets = NULL;
    if (dp_shards(r, &group, &offsets, err) != 0)
        return -1;
    /* both halves of ZeRO-1 are "dp_allreduce" events, as the estimate
     * writes them (the run's schema is the estimate's) */
    double start = begin(r, "dp_allreduce", -1);
    int status;
    if (sharded_optimizer(r)) {
        status = comm_reduce_scatter_sum(r->c, group, dp, r->stage->grads,
                                         offsets, err);
    } else {
        status = comm_all_reduce_sum(r->c, group, dp, r->stage->grads,
                                     r->stage->param_count, err);
    }
    free(group);
    free(offsets);
    if (status != 0)
        return -1;
    record(r, "dp_allreduce", -1, start);
    return 0;
}

/* ZeRO-1's second half: every replica's updated shard to every replica,
 * then the backend refreshes what it derives from the parameters. */
static int dp_gather_parameters(rank_step *r, pt_error *err)
{
    int dp = r->layout->config.dp;
    if (dp == 1 || !sharded_optimizer(r))
        return 0;
    int *group = NULL;
    size_t *offsets = NULL;
    if (dp_shards(r, &group, &offsets, err) != 0)
        return -1;
    double start = begin(r, "dp_allreduce", -1);
    int status = comm_all_gather(r->c, group, dp, r->stage->params, offsets,
                                 err);
    free(group);
    free(offsets);
    if (status != 0 || stage_params_changed(r->stage, err) != 0)
        return -1;
    record(r, "dp_allreduce", -1, start);
    return 0;
}

/* Norm and loss over the world in one all-reduce: replica 0's ranks add
 * their share of the squared norm (every replica holds the same gradients
 * now; stage_grad_norm_share counts tied and replicated tensors once),
 * the last stage's shard 0 its loss sum. */
static int reduce_norm_and_loss(rank_step *r, double *grad_norm,
                                double *loss, pt_error *err)
{
    double square_sum = 0.0;
    if (stage_grad_norm_share(r->stage, &square_sum, err) != 0)
        return -1;
    /* ZeRO-1: each replica holds the summed gradients of its shard only,
     * so every replica adds its share */
    bool counts = r->replica == 0 || sharded_optimizer(r);
    double totals[2] = {counts ? square_sum : 0.0,
                        r->tp_rank == 0 ? r->loss_sum : 0.0};
    int world = r->layout->rank_count;
    int *group = strided_group(0, world, 1);
    if (group == NULL)
        return pt_fail(err, "out of memory for a group of %d", world);
    r->operation = "norm and loss all-reduce";
    r->micro_batch = -1;
    int status = comm_all_reduce_host(r->c, group, world, totals, 2, err);
    free(group);
    if (status != 0)
        return -1;
    *grad_norm = sqrt(totals[0] > 0.0 ? totals[0] : 0.0);
    *loss = totals[1] /
            ((double)r->layout->micro_batches * r->layout->config.dp);
    return 0;
}

/* The gradients every optimizer step needs. The tied embedding's two
 * copies are summed before ZeRO-1's reduce-scatter: after it, the first
 * and the last stage would hold different parts of the tensor (their
 * shards cut different buffers). */
static int reduce_gradients(rank_step *r, pt_error *err)
{
    if (sharded_optimizer(r))
        return embedding_all_reduce(r, err) != 0 ||
                       dp_reduce_gradients(r, err) != 0
                   ? -1
                   : 0;
    return dp_reduce_gradients(r, err) != 0 ||
                   embedding_all_reduce(r, err) != 0
               ? -1
               : 0;
}

static int optimizer_step(rank_step *r, const train_config *config,
                          step_result *out, pt_error *err)
{
    double grad_norm = 0.0, loss = 0.0;
    if (reduce_norm_and_loss(r, &grad_norm, &loss, err) != 0)
        return -1;
    if (!isfinite(grad_norm))
        return pt_fail(err, "step %ld: gradient norm is not finite (loss "
                            "%g); the step was not applied",
                       r->stage->optimizer_steps, loss);
    double start = begin(r, "optimizer", -1);
    float learning_rate = (float)lr_schedule_at(&config->schedule,
                                                r->stage->optimizer_steps);
    float scale = clip_coefficient(grad_norm, config->max_grad_norm);
    if (stage_adamw_step(r->stage, &config->adamw, learning_rate, scale,
                         err) != 0)
        return -1;
    record(r, "optimizer", -1, start);
    out->loss = (float)loss;
    out->grad_norm = (float)grad_norm;
    out->learning_rate = learning_rate;
    return 0;
}

static int check_rank(const pipeline_layout *layout, const model_stage *stage,
                      const comm *c, pt_error *err)
{
    if (c->size != layout->rank_count)
        return pt_fail(err, "the comm has %d ranks, the layout %d", c->size,
                       layout->rank_count);
    stage_spec expected;
    if (pipeline_rank_spec(layout, c->rank, &expected, err) != 0)
        return -1;
    if (expected.first_layer != stage->spec.first_layer ||
        stage_spec_tp(&expected) != stage_spec_tp(&stage->spec) ||
        expected.tp_rank != stage->spec.tp_rank ||
        expected.last_layer != stage->spec.last_layer ||
        expected.has_embedding != stage->spec.has_embedding ||
        expected.has_head != stage->spec.has_head ||
        stage->slot_count < pipeline_slot_count(
                                layout, pipeline_rank_stage(layout, c->rank)) ||
        stage->mbs_capacity < layout->config.mbs)
        return pt_fail(err, "its stage was not made for this layout (make "
                            "it with pipeline_stage_create)");
    return 0;
}

int pipeline_rank_step(const pipeline_layout *layout, model_stage *stage,
                       const comm *c, const train_config *config,
                       const uint32_t *tokens, double step_start_s,
                       bool inject_failure, step_result *out,
                       pipeline_events *events, pt_error *err)
{
    if (check_rank(layout, stage, c, err) != 0 ||
        lr_schedule_check(&config->schedule, err) != 0) {
        pt_error_prefix(err, "rank %d", c->rank);
        comm_abort(c, err->message);
        return -1;
    }
    int dp = layout->config.dp;
    int hop = dp * layout->config.tp; /* ranks between adjacent stages */
    int stage_index = pipeline_rank_stage(layout, c->rank);
    int replica = pipeline_rank_replica(layout, c->rank);
    size_t window = (size_t)layout->shape.seq + 1;
    size_t replica_windows = (size_t)(layout->config.gbs / dp);
    rank_step r = {
        .layout = layout,
        .stage = stage,
        .c = c,
        .stage_index = stage_index,
        .replica = replica,
        .previous_rank = stage_index > 0 ? c->rank - hop : -1,
        .next_rank = stage_index < layout->stage_count - 1 ? c->rank + hop
                                                           : -1,
        .tokens = tokens + (size_t)replica * replica_windows * window,
        .activation_floats = (size_t)layout->config.mbs *
                             (size_t)layout->shape.seq *
                             (size_t)layout->shape.hidden,
        .loss_scale = 1.0f / (float)(layout->micro_batches * dp),
        .step_start_s = step_start_s,
        .events = events,
        .micro_batch = -1,
        .operation = "zero_grads",
        .tp_rank = pipeline_rank_tp(layout, c->rank),
    };
    if (events != NULL)
        events->count = 0;
    int status = -1;
    if (r.next_rank >= 0) {
        r.output_grad = stage_output_grad_buffer(stage);
        if (r.output_grad == NULL) {
            pt_fail(err, "the stage has no buffer for its output gradient");
            goto done;
        }
    }
    if (stage_zero_grads(stage, err) != 0 ||
        run_schedule(&r, inject_failure, err) != 0 ||
        reduce_gradients(&r, err) != 0 ||
        optimizer_step(&r, config, out, err) != 0 ||
        dp_gather_parameters(&r, err) != 0)
        goto done;
    status = 0;
done:
    if (status != 0) {
        if (r.micro_batch >= 0)
            pt_error_prefix(err, "rank %d (stage %d, replica %d, tp %d), %s "
                                 "of micro-batch %d",
                            c->rank, stage_index, replica, r.tp_rank,
                            r.operation, r.micro_batch);
        else
            pt_error_prefix(err, "rank %d (stage %d, replica %d, tp %d), %s",
                            c->rank, stage_index, replica, r.tp_rank,
                            r.operation);
        comm_abort(c, err->message);
    }
    return status;
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

/* -------------------------------------------------------------- launcher */

typedef enum worker_command {
    COMMAND_STEP,
    COMMAND_TASK,
    COMMAND_EXIT
} worker_command;

/* What the rank threads are told to do; each copies it under the lock
 * when it sees a new generation, so the next order cannot change it under
 * a slow reader. */
typedef struct worker_order {
    worker_command command;
    /* COMMAND_STEP */
    const train_config *config;
    const uint32_t *tokens;
    double step_start_s;
    int inject_failure_rank;
    /* COMMAND_TASK: one rank runs it */
    int task_rank;
    pipeline_rank_task task;
    void *task_data;
    pt_error *task_err;
} worker_order;

/* One rank's thread. */
typedef struct rank_worker {
    struct pipeline_workers *all;
    int rank;
    pthread_t thread;
    bool started;
    step_result result;          /* of the last step */
} rank_worker;

/* The rank threads and the order they are given. The main thread posts
 * an order (bumping generation) and waits until `pending` ranks have
 * carried it out; everything here is read and written under lock. */
struct pipeline_workers {
    pipeline_threads *owner;
    pipeline_launch launch;
    pthread_mutex_t lock;
    pthread_cond_t posted;       /* a new order */
    pthread_cond_t done;         /* pending went down */
    long generation;
    worker_order order;
    int pending;
    int task_status;             /* of the last COMMAND_TASK */
    rank_worker *ranks;          /* rank_count */
};

/* A rank's part of pipeline_threads_start, on its own thread: the open
 * hook, its stage, its events, its comm. */
static int set_up_rank(rank_worker *w, pt_error *err)
{
    struct pipeline_workers *all = w->all;
    pipeline_threads *p = all->owner;
    const pipeline_launch *launch = &all->launch;
    if (launch->hooks.open != NULL &&
        launch->hooks.open(launch->hooks.data, w->rank, err) != 0)
        return -1;
    if (pipeline_stage_create(&p->stages[w->rank], &p->layout, w->rank,
                              launch->backend, launch->seed, err) != 0)
        return -1;
    if (pipeline_events_reserve(&p->events[w->rank], &p->layout, err) != 0 ||
        pipeline_stage_attach(&p->layout, &p->stages[w->rank],
                              &p->comms[w->rank], err) != 0) {
        model_stage_destroy(&p->stages[w->rank]);
        return -1;
    }
    return 0;
}

/* Counts one rank's part of the current command as done; lock held. */
static void finish_part(struct pipeline_workers *all)
{
    if (--all->pending == 0)
        pthread_cond_broadcast(&all->done);
}

static void run_order(rank_worker *w, const worker_order *order)
{
    struct pipeline_workers *all = w->all;
    pipeline_threads *p = all->owner;
    int task_status = 0;
    if (order->command == COMMAND_TASK) {
        if (order->task_rank != w->rank)
            return;
        task_status = order->task(order->task_data, w->rank,
                                  &p->stages[w->rank], order->task_err);
    } else {
        p->rank_errors[w->rank].message[0] = '\0';
        p->rank_status[w->rank] = pipeline_rank_step(
            &p->layout, &p->stages[w->rank], &p->comms[w->rank],
            order->config, order->tokens, order->step_start_s,
            w->rank == order->inject_failure_rank, &w->result,
            &p->events[w->rank], &p->rank_errors[w->rank]);
    }
    pthread_mutex_lock(&all->lock);
    if (order->command == COMMAND_TASK)
        all->task_status = task_status;
    finish_part(all);
    pthread_mutex_unlock(&all->lock);
}

static void *worker_main(void *argument)
{
    rank_worker *w = argument;
    struct pipeline_workers *all = w->all;
    pipeline_threads *p = all->owner;
    int status = set_up_rank(w, &p->rank_errors[w->rank]);
    pthread_mutex_lock(&all->lock);
    p->rank_status[w->rank] = status;
    long seen = all->generation;
    finish_part(all);
    for (;;) {
        while (all->generation == seen)
            pthread_cond_wait(&all->posted, &all->lock);
        seen = all->generation;
        worker_order order = all->order;
        if (order.command == COMMAND_EXIT)
            break;
        pthread_mutex_unlock(&all->lock);
        run_order(w, &order);
        pthread_mutex_lock(&all->lock);
    }
    pthread_mutex_unlock(&all->lock);
    if (status == 0)
        model_stage_destroy(&p->stages[w->rank]);
    if (all->launch.hooks.close != NULL)
        all->launch.hooks.close(all->launch.hooks.data, w->rank);
    return NULL;
}

/* Posts an order that `parts` ranks carry out and waits for them. */
static void post_order(struct pipeline_workers *all,
                       const worker_order *order, int parts)
{
    pthread_mutex_lock(&all->lock);
    all->order = *order;
    all->pending = parts;
    all->generation++;
    pthread_cond_broadcast(&all->posted);
    while (all->pending > 0)
        pthread_cond_wait(&all->done, &all->lock);
    pthread_mutex_unlock(&all->lock);
}

static int allocate_launcher(pipeline_threads *out, int ranks, pt_error *err)
{
    out->stages = calloc((size_t)ranks, sizeof *out->stages);
    out->events = calloc((size_t)ranks, sizeof *out->events);
    out->rank_errors = calloc((size_t)ranks, sizeof *out->rank_errors);
    out->rank_status = calloc((size_t)ranks, sizeof *out->rank_status);
    out->comms = calloc((size_t)ranks, sizeof *out->comms);
    struct pipeline_workers *all = calloc(1, sizeof *all);
    if (all != NULL)
        all->ranks = calloc((size_t)ranks, sizeof *all->ranks);
    if (out->stages == NULL || out->events == NULL ||
        out->rank_errors == NULL || out->rank_status == NULL ||
        out->comms == NULL || all == NULL || all->ranks == NULL) {
        if (all != NULL)
            free(all->ranks);
        free(all);
        return pt_fail(err, "pipeline runtime: out of memory for %d ranks",
                       ranks);
    }
    pthread_mutex_init(&all->lock, NULL);
    pthread_cond_init(&all->posted, NULL);
    pthread_cond_init(&all->done, NULL);
    all->owner = out;
    out->workers = all;
    return 0;
}

/* Each rank's handle: the caller's, or of a threads world made here. */
static int set_up_comms(pipeline_threads *out, const pipeline_launch *launch,
                        pt_error *err)
{
    int ranks = out->layout.rank_count;
    out->first_local_rank = 0;
    out->local_rank_count = ranks;
    if (launch->comms != NULL && launch->this_rank_only) {
        const comm *own = &launch->comms[0];
        if (own->size != ranks || own->rank < 0 || own->rank >= ranks)
            return pt_fail(err, "pipeline runtime: this process is rank %d "
                                "of %d, the layout has %d ranks",
                           own->rank, own->size, ranks);
        out->comms[own->rank] = *own;
        out->first_local_rank = own->rank;
        out->local_rank_count = 1;
        return 0;
    }
    if (launch->comms != NULL) {
        memcpy(out->comms, launch->comms, (size_t)ranks * sizeof *out->comms);
        for (int rank = 0; rank < ranks; rank++)
            if (out->comms[rank].rank != rank ||
                out->comms[rank].size != ranks)
                return pt_fail(err, "pipeline runtime: comm %d is rank %d "
                                    "of %d, the layout has %d ranks",
                               rank, out->comms[rank].rank,
                               out->comms[rank].size, ranks);
        return 0;
    }
    if (comm_threads_create(ranks, launch->timeout_s, &out->world, err) != 0)
        return -1;
    for (int rank = 0; rank < ranks; rank++)
        out->comms[rank] = comm_threads_rank(out->world, rank);
    return 0;
}

/* Starts every local rank's thread and waits until each has set itself
 * up. */
static void start_workers(pipeline_threads *out)
{
    struct pipeline_workers *all = out->workers;
    int first = out->first_local_rank;
    pthread_mutex_lock(&all->lock);
    all->pending = out->local_rank_count;
    pthread_mutex_unlock(&all->lock);
    for (int rank = first; rank < first + out->local_rank_count; rank++) {
        rank_worker *w = &all->ranks[rank];
        w->all = all;
        w->rank = rank;
        w->started = pthread_create(&w->thread, NULL, worker_main, w) == 0;
        if (w->started)
            continue;
        pthread_mutex_lock(&all->lock);
        out->rank_status[rank] = -1;
        pt_fail(&out->rank_errors[rank], "cannot start its thread");
        finish_part(all);
        pthread_mutex_unlock(&all->lock);
    }
    pthread_mutex_lock(&all->lock);
    while (all->pending > 0)
        pthread_cond_wait(&all->done, &all->lock);
    pthread_mutex_unlock(&all->lock);
}

int pipeline_threads_start(pipeline_threads *out,
                           const pipeline_layout *layout,
                           const pipeline_launch *launch, pt_error *err)
{
    memset(out, 0, sizeof *out);
    out->layout = *layout;
    out->inject_failure_rank = -1;
    int ranks = layout->rank_count;
    if (allocate_launcher(out, ranks, err) != 0 ||
        set_up_comms(out, launch, err) != 0) {
        pipeline_threads_destroy(out);
        return -1;
    }
    out->workers->launch = *launch;
    start_workers(out);
    for (int rank = out->first_local_rank;
         rank < out->first_local_rank + out->local_rank_count; rank++)
        if (out->rank_status[rank] != 0) {
            pt_fail(err, "rank %d: %s", rank,
                    out->rank_errors[rank].message);
            pipeline_threads_destroy(out);
            return -1;
        }
    return 0;
}

int pipeline_threads_create(pipeline_threads *out,
                            const pipeline_layout *layout,
                            backend_kind backend, uint64_t seed,
                            double timeout_s, pt_error *err)
{
    pipeline_launch launch = {.backend = backend, .seed = seed,
                              .timeout_s = timeout_s};
    return pipeline_threads_start(out, layout, &launch, err);
}

int pipeline_threads_step(pipeline_threads *p, const train_config *config,
                          const uint32_t *tokens, step_result *out,
                          pt_error *err)
{
    struct pipeline_workers *all = p->workers;
    int first = p->first_local_rank;
    const comm *local = &p->comms[first];
    if (comm_failed_rank(local, NULL, 0) >= 0)
        return pt_fail(err, "pipeline runtime: a rank failed in an earlier "
                            "step; the world is unusable");
    worker_order order = {.command = COMMAND_STEP,
                          .config = config,
                          .tokens = tokens,
                          .step_start_s = pt_monotonic_seconds(),
                          .inject_failure_rank = p->inject_failure_rank};
    post_order(all, &order, p->local_rank_count);
    char reason[sizeof err->message];
    if (comm_failed_rank(local, reason, sizeof reason) >= 0)
        return pt_fail(err, "%s", reason);
    for (int rank = first; rank < first + p->local_rank_count; rank++)
        if (p->rank_status[rank] != 0)
            return pt_fail(err, "%s", p->rank_errors[rank].message);
    *out = all->ranks[first].result;
    return 0;
}

int pipeline_threads_on_rank(pipeline_threads *p, int rank,
                             pipeline_rank_task task, void *data,
                             pt_error *err)
{
    struct pipeline_workers *all = p->workers;
    if (all == NULL || rank < p->first_local_rank ||
        rank >= p->first_local_rank + p->local_rank_count)
        return pt_fail(err, "pipeline runtime: no rank %d to run a task on",
                       rank);
    worker_order order = {.command = COMMAND_TASK,
                          .task_rank = rank,
                          .task = task,
                          .task_data = data,
                          .task_err = err};
    post_order(all, &order, 1);
    pthread_mutex_lock(&all->lock);
    int status = all->task_status;
    pthread_mutex_unlock(&all->lock);
    return status;
}

void pipeline_threads_destroy(pipeline_threads *p)
{
    struct pipeline_workers *all = p->workers;
    if (all != NULL) {
        pthread_mutex_lock(&all->lock);
        all->order = (worker_order){.command = COMMAND_EXIT};
        all->generation++;
        pthread_cond_broadcast(&all->posted);
        pthread_mutex_unlock(&all->lock);
        for (int rank = 0; rank < p->layout.rank_count; rank++)
            if (all->ranks[rank].started)
                pthread_join(all->ranks[rank].thread, NULL);
        pthread_cond_destroy(&all->posted);
        pthread_cond_destroy(&all->done);
        pthread_mutex_destroy(&all->lock);
        free(all->ranks);
        free(all);
    }
    if (p->events != NULL)
        for (int rank = 0; rank < p->layout.rank_count; rank++)
            pipeline_events_free(&p->events[rank]);
    comm_threads_destroy(p->world);
    free(p->stages);
    free(p->events);
    free(p->rank_errors);
    free(p->rank_status);
    free(p->comms);
    memset(p, 0, sizeof *p);
}
