/*
 * One rank's training step over model stages: the schedule's forwards
 * and backwards (1F1B or GPipe) with activations and gradients over the
 * comm, the gradient all-reduces (ZeRO-1: reduce-scatter and
 * all-gather; ZeRO-2/3: zero_step.c's parts at each micro-batch), the
 * global norm, clipping and AdamW, each phase recorded
 * as an event; the tensor-parallel sums happen inside the backend's
 * forward and backward. docs/executor.md ("One step of one rank").
 */
#include "executor/parallel/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- events */

int pipeline_events_reserve(pipeline_events *events,
                            const pipeline_layout *layout, pt_error *err)
{
    int chunks = pipeline_chunk_count(layout);
    int capacity = (6 * layout->micro_batches + 4) * chunks;
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

/* A send the rank has yet to make. It goes out with the receive that
 * follows it in the schedule, as one operation (comm_sendrecv,
 * Megatron's send_forward_recv_backward), for a comm whose send could
 * wait for its receiver (none today: two stages sending to each other at
 * once cannot wait on each other); or alone, right before the next
 * forward or backward when no receive comes first. */
typedef struct pending_send {
    bool present;
    const pipeline_boundary *boundary;  /* its parts */
    int tag;
    const float *data;           /* the buffer the parts lie in */
    const char *kind;            /* "send_fwd" or "send_bwd" */
    int micro_batch;
} pending_send;

/* What one rank's step works with. */
typedef struct rank_step {
    const pipeline_layout *layout;
    model_stage *stage;          /* the chunk being worked on (chunk 0
                                    outside the per-chunk phases) */
    model_stage *const *chunks;  /* chunk_count: the interleaved 1F1B's
                                    chunks, chunks[0] its stage */
    int chunk_count;
    int chunk;                   /* of stage */
    const comm *c;
    int stage_index;
    int replica;
    int tp, dp, mbs;             /* the stage's own degrees (issue 36) */
    const uint32_t *tokens;      /* this replica's windows */
    uint32_t *owned_tokens;      /* their copy, when they are not in the
                                    global batch's order */
    pipeline_boundary *boundaries; /* 2 x chunk_count: each chunk's with
                                    the stage before it and after it */
    size_t activation_floats;    /* mbs x seq x hidden, or the rows of
                                    this shard under sequence parallelism */
    size_t shard_offset;         /* where those rows start, in floats */
    float loss_scale;            /* 1 / (m dp), the stage's dp */
    double loss_sum;             /* of this rank's micro-batches (head) */
    double step_start_s;
    pipeline_events *events;     /* may be NULL */
    int micro_batch;             /* being worked on, for messages */
    const char *operation;       /* event kind being worked on */
    int tp_rank;
    pending_send pending;
    const pipeline_grad_sync *sync;  /* may be NULL */
    adamw_config adamw;          /* the step's AdamW, for every chunk */
    float learning_rate;
    float clip_scale;
    bool overlap_armed;          /* the dp reduction runs with the last
                                    backward */
    /* ZeRO-2 or 3 at dp > 1 (else 0; never with interleaving), with the
     * dp group and its shards' offsets (owned) */
    int zero;
    int *dp_group;
    size_t *dp_offsets;
    /* the stage's grad_sink context when its backend reduces unit by
     * unit (grads_by_unit) */
    zero_unit_group zero_units;
} rank_step;

static void record_span(rank_step *r, const char *kind, int micro_batch,
                        double start_s, double end_s)
{
    if (r->events == NULL || r->events->count >= r->events->capacity)
        return;
    run_event *event = &r->events->events[r->events->count++];
    event->rank = r->c->rank;
    event->stage = r->stage_index;
    event->microbatch = micro_batch;
    event->kind = kind;
    event->start_s = start_s - r->step_start_s;
    event->end_s = end_s - r->step_start_s;
}

static void record(rank_step *r, const char *kind, int micro_batch,
                   double start_s)
{
    record_span(r, kind, micro_batch, start_s, pt_monotonic_seconds());
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
        .mbs = r->mbs,
        .tokens = r->tokens + (size_t)micro_batch * (size_t)r->mbs * window,
        .loss_scale = r->loss_scale,
    };
    return io;
}

/* Makes the pending send alone (no receive follows it). */
static int flush_send(rank_step *r, pt_error *err)
{
    pending_send p = r->pending;
    if (!p.present)
        return 0;
    r->pending.present = false;
    double start = begin(r, p.kind, p.micro_batch);
    if (pipeline_boundary_send(r->c, p.boundary, p.tag, p.data, err) != 0)
        return -1;
    record(r, p.kind, p.micro_batch, start);
    return 0;
}

/* Whether a boundary is one message, received whole. */
static bool one_part(const pipeline_boundary *b)
{
    return b->count == 1 && !b->gather;
}

/* Receives `data` (the buffer the parts lie in) over a boundary, with
 * the pending send when there is one: one operation when both are one
 * message (comm_sendrecv), else the sends, then the receives (a grouped
 * send is recorded with no length at the group's start; the group's
 * time is the receive's event). */
static int receive(rank_step *r, const char *kind, int micro_batch,
                   const pipeline_boundary *boundary, int tag, float *data,
                   pt_error *err)
{
    pending_send p = r->pending;
    r->pending.present = false;
    double start = begin(r, kind, micro_batch);
    int status;
    if (p.present && one_part(p.boundary) && one_part(boundary)) {
        const boundary_part *out = &p.boundary->parts[0];
        const boundary_part *in = &boundary->parts[0];
        status = comm_sendrecv(r->c, out->peer, p.tag, p.data + out->offset,
                               out->count, in->peer, tag, data + in->offset,
                               in->count, err);
    } else {
        status = (p.present && pipeline_boundary_send(r->c, p.boundary,
                                                      p.tag, p.data,
                                                      err) != 0) ||
                         pipeline_boundary_recv(r->c, boundary, tag, data,
                                                err) != 0
                     ? -1
                     : 0;
    }
    if (status != 0)
        return -1;
    if (p.present)
        record_span(r, p.kind, p.micro_batch, start, start);
    record(r, kind, micro_batch, start);
    return 0;
}

/* The stages holding the virtual stages before and after chunk `chunk`
 * of this rank (chunk c of stage s is virtual stage c pp + s; -1: none)
 * and their chunks; their ranks are the boundary's (open_boundaries).
 * Without interleaving: stage s - 1 and s + 1. */
typedef struct chunk_peers {
    int previous, previous_chunk;
    int next, next_chunk;
} chunk_peers;

static chunk_peers peers_of(const rank_step *r, int chunk)
{
    int pp = r->layout->stage_count;
    int q = chunk * pp + r->stage_index, last = pp * r->chunk_count - 1;
    chunk_peers p = {-1, 0, -1, 0};
    if (q > 0) {
        p.previous = (q - 1) % pp;
        p.previous_chunk = (q - 1) / pp;
    }
    if (q < last) {
        p.next = (q + 1) % pp;
        p.next_chunk = (q + 1) / pp;
    }
    return p;
}

/* Tags: micro-batch j's activation into chunk c 2 (c m + j), the
 * gradient into chunk c 2 (c m + j) + 1 (without interleaving: 2j and
 * 2j + 1). */
static int chunk_tag(const rank_step *r, int chunk, int micro_batch)
{
    return 2 * (chunk * r->layout->micro_batches + micro_batch);
}

/* ZeRO-3's gather before a forward or backward (not recorded: the run's
 * events are the estimate's kinds, one dp_allreduce a step). */
static int gather_parameters(rank_step *r, model_stage *stage,
                             int micro_batch, pt_error *err)
{
    begin(r, "parameter all-gather", micro_batch);
    return zero_gather_parameters(r->c, r->dp_group, r->dp,
                                  r->dp_offsets, stage, err);
}

/* ZeRO-2/3 after a backward: this micro-batch's gradients reduce-scattered
 * over dp; ZeRO-3 also lets go of the gathered weights. */
static int after_zero_backward(rank_step *r, model_stage *stage,
                               int micro_batch, pt_error *err)
{
    /* a backend keeping the shard only reduced each unit as it ended */
    if (r->zero >= 2 && !stage->grads_by_unit) {
        begin(r, "dp reduce-scatter", micro_batch);
        if (zero_reduce_micro_batch(r->c, r->dp_group, r->dp,
                                    r->dp_offsets,
                                    r->sync != NULL ? r->sync->buckets
                                                    : NULL,
                                    stage, err) != 0)
            return -1;
    }
    return r->zero >= 3 ? zero_release_parameters(stage, err) : 0;
}

static int forward(rank_step *r, int chunk, int micro_batch, pt_error *err)
{
    model_stage *stage = r->chunks[chunk];
    chunk_peers peers = peers_of(r, chunk);
    int slot = micro_batch % stage->slot_count;
    stage_io io = micro_batch_io(r, micro_batch);
    if (peers.previous >= 0) {
        float *input = stage_input_buffer(stage, slot);
        if (receive(r, "recv_fwd", micro_batch, &r->boundaries[2 * chunk],
                    chunk_tag(r, chunk, micro_batch), input, err) != 0)
            return -1;
        io.input = input;
    } else if (flush_send(r, err) != 0) {
        return -1;
    }
    /* ZeRO-3: the step's closing all-gather left the weights whole for
     * the first forward */
    if (r->zero >= 3 && micro_batch > 0 &&
        gather_parameters(r, stage, micro_batch, err) != 0)
        return -1;
    double start = begin(r, "fwd", micro_batch);
    float loss = 0.0f;
    if (stage_forward(stage, slot, &io, &loss, err) != 0)
        return -1;
    record(r, "fwd", micro_batch, start);
    if (r->zero >= 3 && zero_release_parameters(stage, err) != 0)
        return -1;
    r->loss_sum += loss;
    if (peers.next >= 0)
        r->pending = (pending_send){
            .present = true,
            .boundary = &r->boundaries[2 * chunk + 1],
            .tag = chunk_tag(r, peers.next_chunk, micro_batch),
            .data = stage_output(stage, slot),
            .kind = "send_fwd",
            .micro_batch = micro_batch};
    return 0;
}

static int backward(rank_step *r, int chunk, int micro_batch, pt_error *err)
{
    model_stage *stage = r->chunks[chunk];
    chunk_peers peers = peers_of(r, chunk);
    int slot = micro_batch % stage->slot_count;
    stage_io io = micro_batch_io(r, micro_batch);
    if (peers.next >= 0) {
        float *output_grad = stage_output_grad_buffer(stage);
        if (output_grad == NULL)
            return pt_fail(err, "the stage has no buffer for its output "
                                "gradient");
        if (receive(r, "recv_bwd", micro_batch,
                    &r->boundaries[2 * chunk + 1],
                    chunk_tag(r, chunk, micro_batch) + 1, output_grad,
                    err) != 0)
            return -1;
        io.output_grad = output_grad;
    } else if (flush_send(r, err) != 0) {
        return -1;
    }
    if (r->zero >= 3 && gather_parameters(r, stage, micro_batch, err) != 0)
        return -1;
    double start = begin(r, "bwd", micro_batch);
    if (stage_backward(stage, slot, &io, err) != 0)
        return -1;
    record(r, "bwd", micro_batch, start);
    if (after_zero_backward(r, stage, micro_batch, err) != 0)
        return -1;
    if (peers.previous >= 0)
        r->pending = (pending_send){
            .present = true,
            .boundary = &r->boundaries[2 * chunk],
            .tag = chunk_tag(r, peers.previous_chunk, micro_batch) + 1,
            .data = stage_input_grad(stage),
            .kind = "send_bwd",
            .micro_batch = micro_batch};
    return 0;
}

static int arm_overlap(rank_step *r, pt_error *err);
static int for_each_chunk(rank_step *r, int (*phase)(rank_step *, pt_error *),
                          pt_error *err);

/* 1F1B: warm-up forwards, then one forward one backward, then the
 * remaining backwards; GPipe: every forward, then every backward; the
 * interleaved 1F1B: Megatron's order over the rank's chunks (common's
 * parallel_chunk_unit), its warm-up 2 (pp - s - 1) + (v - 1) pp.
 * Backwards of a chunk run in micro-batch order either way, so gradients
 * accumulate in the order of the one-stage step. */
static int run_schedule(rank_step *r, bool inject_failure, pt_error *err)
{
    int m = r->layout->micro_batches, v = r->chunk_count, total = m * v;
    int warm_up = r->layout->config.schedule == SCHEDULE_1F1B
                      ? parallel_chunk_warmup(r->layout->stage_count, v,
                                              r->stage_index, m)
                      : m;
    int forwards = 0, backwards = 0;
    while (backwards < total) {
        bool is_forward = forwards < total &&
                          (forwards < warm_up ||
                           forwards - warm_up == backwards);
        int chunk, micro_batch;
        parallel_chunk_unit(r->layout->stage_count, v,
                            is_forward ? forwards++ : backwards++,
                            is_forward, &chunk, &micro_batch);
        if (!is_forward && backwards == total && arm_overlap(r, err) != 0)
            return -1;
        if (is_forward ? forward(r, chunk, micro_batch, err)
                       : backward(r, chunk, micro_batch, err))
            return -1;
        if (inject_failure && is_forward)
            return flush_send(r, err) != 0
                       ? -1
                       : pt_fail(err, "injected failure after the forward "
                                      "of micro-batch 0 (a test asked for "
                                      "it)");
    }
    return flush_send(r, err);
}

static bool sharded_optimizer(const rank_step *r);
static int dp_shards(const rank_step *r, int **group, size_t **offsets,
                     pt_error *err);

/* Whether the tied embedding's two stages run the same degrees: then
 * shard t of replica d of the first sums with its twin on the last. */
static bool tied_twins(const rank_step *r)
{
    return pipeline_same_degrees(r->layout, 0, r->layout->stage_count - 1);
}

/* Stages of different degrees, ZeRO-1: the tied tensor gathered whole
 * over each stage's dp group after the reduce-scatter, then summed
 * (zero_tied_embedding), as ZeRO-2/3 do. */
static int tied_after_reduce_scatter(rank_step *r,
                                     const param_tensor *tensor,
                                     pt_error *err)
{
    int *group = NULL;
    size_t *offsets = NULL;
    if (dp_shards(r, &group, &offsets, err) != 0)
        return -1;
    int status = zero_tied_embedding(r->c, group, r->dp, offsets, NULL,
                                     r->layout, r->stage, tensor, err);
    free(group);
    free(offsets);
    return status;
}

/* The first stage's token-embedding gradient and the last stage's tied
 * copy, summed: they are one tensor (interleaved: in stage 0's first
 * chunk and the last stage's last). Between stages of different degrees
 * after each stage's dp reduction (parallel/tied.c). */
static int embedding_all_reduce(rank_step *r, pt_error *err)
{
    const pipeline_layout *layout = r->layout;
    int last = layout->stage_count - 1;
    if (layout->stage_count < 2 || !layout->shape.tied_embeddings ||
        (r->stage_index != 0 && r->stage_index != last) ||
        r->chunk != (r->stage_index == 0 ? 0 : r->chunk_count - 1))
        return 0;
    const param_tensor *tensor = model_stage_find_tensor(
        r->stage, r->stage_index == 0 ? "token_embedding" : "lm_head_weight");
    if (tensor == NULL || (r->stage_index == last && !tensor->tied_copy))
        return pt_fail(err, "stage %d holds no tied embedding tensor",
                       r->stage_index);
    bool twins = tied_twins(r);
    int group[2] = {pipeline_rank_of(layout, 0, r->replica, r->tp_rank),
                    pipeline_rank_of(layout, last, r->replica, r->tp_rank)};
    double start = begin(r, "embedding_allreduce", -1);
    size_t element = r->stage->grads_bf16 ? 2 : sizeof(float);
    int status;
    if (r->zero >= 2) /* each copy lies in shards over its stage's replicas */
        status = zero_tied_embedding(r->c, r->dp_group, r->dp, r->dp_offsets,
                                     twins ? group : NULL, layout, r->stage,
                                     tensor, err);
    else if (!twins && sharded_optimizer(r))
        status = tied_after_reduce_scatter(r, tensor, err);
    else if (!twins)
        status = pipeline_tied_sum(
            r->c, layout, r->stage,
            (char *)r->stage->grads + tensor->offset * element,
            r->stage->grads_bf16, err);
    else
        status = pipeline_reduce_bucket(
            r->c, group, 2, r->stage,
            (pipeline_bucket){.offset = tensor->offset,
                              .count = tensor->count},
            NULL, NULL, err);
    if (status != 0)
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
    int dp = r->dp;
    *group = strided_group(
        pipeline_rank_of(r->layout, r->stage_index, 0, r->tp_rank), dp,
        r->tp);
    *offsets = malloc(((size_t)dp + 1) * sizeof **offsets);
    if (*group == NULL || *offsets == NULL) {
        free(*group);
        free(*offsets);
        return pt_fail(err, "out of memory for a group of %d", dp);
    }
    stage_optimizer_offsets(r->stage->param_count, dp, *offsets);
    return 0;
}

/* Whether this rank's dp reduction may run with its last backward: a
 * launcher offers it, and the gradients are final when the backward ends
 * (with ZeRO-1 the tied embedding's two copies are summed first, after
 * the backward, so its pair keeps the reduction after it too). */
static bool overlap_allowed(const rank_step *r)
{
    const pipeline_layout *layout = r->layout;
    bool embedding_pair = layout->stage_count > 1 &&
                          layout->shape.tied_embeddings &&
                          (r->stage_index == 0 ||
                           r->stage_index == layout->stage_count - 1);
    return r->dp > 1 && r->chunk_count == 1 && r->sync != NULL &&
           r->sync->overlap != NULL && r->sync->overlap->begin != NULL &&
           r->sync->buckets != NULL && r->zero < 2 &&
           !(sharded_optimizer(r) && embedding_pair);
}

/* Before the last micro-batch's backward: the launcher's overlap armed,
 * when it applies. */
static int arm_overlap(rank_step *r, pt_error *err)
{
    r->overlap_armed = false;
    if (!overlap_allowed(r))
        return 0;
    int *group = NULL;
    size_t *offsets = NULL;
    if (dp_shards(r, &group, &offsets, err) != 0)
        return -1;
    const pipeline_grad_overlap *overlap = r->sync->overlap;
    int status = overlap->begin(overlap->data, r->c->rank, r->stage, r->c,
                                group, r->dp,
                                r->sync->buckets,
                                sharded_optimizer(r) ? offsets : NULL, err);
    free(group);
    free(offsets);
    r->overlap_armed = status == 0;
    return status < 0 ? -1 : 0;
}

/* Every bucket in turn, blocking (the whole buffer when there are none). */
static int reduce_buckets(rank_step *r, const int *group,
                          const size_t *offsets, pt_error *err)
{
    const pipeline_buckets *buckets =
        r->sync != NULL ? r->sync->buckets : NULL;
    pipeline_bucket whole = {.offset = 0, .count = r->stage->param_count};
    int count = buckets != NULL ? buckets->count : 1;
    for (int b = 0; b < count; b++)
        if (pipeline_reduce_bucket(r->c, group, r->dp,
                                   r->stage,
                                   buckets != NULL ? buckets->buckets[b]
                                                   : whole,
                                   sharded_optimizer(r) ? offsets : NULL,
                                   NULL, err) != 0)
            return -1;
    return 0;
}

/* Replicated optimizer: every replica gets the summed gradients. ZeRO-1:
 * replica i gets the sum of its shard only (reduce-scatter), the half of
 * the all-reduce's traffic its step needs. Bucket by bucket after the
 * backward, or what the overlap left of it. */
static int dp_reduce_gradients(rank_step *r, pt_error *err)
{
    int dp = r->dp;
    if (dp == 1)
        return 0;
    /* both halves of ZeRO-1 are "dp_allreduce" events, as the estimate
     * writes them (the run's schema is the estimate's); with the overlap
     * the event is what the backward left to wait for */
    double start = begin(r, "dp_allreduce", -1);
    if (r->overlap_armed) {
        const pipeline_grad_overlap *overlap = r->sync->overlap;
        r->overlap_armed = false;
        if (overlap->end(overlap->data, r->c->rank, r->stage, r->c, err) !=
            0)
            return -1;
        record(r, "dp_allreduce", -1, start);
        return 0;
    }
    int *group = NULL;
    size_t *offsets = NULL;
    if (dp_shards(r, &group, &offsets, err) != 0)
        return -1;
    int status = reduce_buckets(r, group, offsets, err);
    free(group);
    free(offsets);
    if (status != 0)
        return -1;
    record(r, "dp_allreduce", -1, start);
    return 0;
}

/* ZeRO-1's second half: every replica's updated shard to every replica,
 * then the backend refreshes what it derives from the parameters. */
static int dp_gather_chunk(rank_step *r, pt_error *err)
{
    int dp = r->dp;
    /* ZeRO-3 on a backend holding the shard only: the next forward
     * gathers unit by unit */
    if (dp == 1 || !sharded_optimizer(r) || r->stage->params_by_unit)
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

static int dp_gather_parameters(rank_step *r, pt_error *err)
{
    return for_each_chunk(r, dp_gather_chunk, err);
}

/* Norm and loss over the world in one all-reduce: replica 0's ranks add
 * their share of the squared norm (every replica holds the same gradients
 * now; stage_grad_norm_share counts tied and replicated tensors once),
 * the last stage's shard 0 its loss sum. */
static int reduce_norm_and_loss(rank_step *r, double *grad_norm,
                                double *loss, pt_error *err)
{
    double square_sum = 0.0;
    for (int c = 0; c < r->chunk_count; c++) {
        double chunk_sum = 0.0;
        if (stage_grad_norm_share(r->chunks[c], &chunk_sum, err) != 0)
            return -1;
        square_sum += chunk_sum;
    }
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
    /* the last stage's replicas each averaged their own micro-batches */
    *loss = totals[1] /
            ((double)r->layout->micro_batches *
             r->layout->stage_dp[r->layout->stage_count - 1]);
    return 0;
}

/* ZeRO-2/3 on a backend reducing each unit on a stream of its own (the
 * cuda one): what the last backward left of its units' reduce-scatters,
 * waited for under the comm's deadline (the run's dp_allreduce event,
 * as the estimate's exposed reduction). */
static int wait_unit_reductions(rank_step *r, pt_error *err)
{
    if (!r->stage->units_on_stream)
        return 0;
    double start = begin(r, "dp_allreduce", -1);
    if (comm_wait_stream(r->c, r->stage->unit_stream,
                         "the units' reduce-scatters", err) != 0)
        return -1;
    record(r, "dp_allreduce", -1, start);
    return 0;
}

/* The gradients every optimizer step needs. The tied embedding's two
 * copies are summed before ZeRO-1's reduce-scatter: after it, the first
 * and the last stage would hold different parts of the tensor (their
 * shards cut different buffers); between stages of different degrees
 * after it, gathering the tensor first (tied_after_reduce_scatter). */
static int reduce_chunk_gradients(rank_step *r, pt_error *err)
{
    if (r->zero >= 2) /* reduced at every micro-batch already */
        return wait_unit_reductions(r, err) != 0 ||
                       embedding_all_reduce(r, err) != 0
                   ? -1
                   : 0;
    if (sharded_optimizer(r) && tied_twins(r))
        return embedding_all_reduce(r, err) != 0 ||
                       dp_reduce_gradients(r, err) != 0
                   ? -1
                   : 0;
    return dp_reduce_gradients(r, err) != 0 ||
                   embedding_all_reduce(r, err) != 0
               ? -1
               : 0;
}

/* Runs phase on every chunk of the rank in turn (one: its stage). */
static int for_each_chunk(rank_step *r, int (*phase)(rank_step *, pt_error *),
                          pt_error *err)
{
    int status = 0;
    for (int c = 0; c < r->chunk_count && status == 0; c++) {
        r->chunk = c;
        r->stage = r->chunks[c];
        status = phase(r, err);
    }
    r->chunk = 0;
    r->stage = r->chunks[0];
    return status;
}

static int reduce_gradients(rank_step *r, pt_error *err)
{
    return for_each_chunk(r, reduce_chunk_gradients, err);
}

static int adamw_chunk(rank_step *r, pt_error *err)
{
    return stage_adamw_step(r->stage, &r->adamw, r->learning_rate,
                            r->clip_scale, err);
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
    r->adamw = config->adamw;
    r->learning_rate = learning_rate;
    r->clip_scale = scale;
    if (for_each_chunk(r, adamw_chunk, err) != 0)
        return -1;
    record(r, "optimizer", -1, start);
    out->loss = (float)loss;
    out->grad_norm = (float)grad_norm;
    out->learning_rate = learning_rate;
    return 0;
}

/* Each chunk was made for this layout: its layers, shard, ends, slots. */
static int check_rank(const pipeline_layout *layout,
                      model_stage *const *chunks, int chunk_count,
                      const comm *c, pt_error *err)
{
    if (c->size != layout->rank_count)
        return pt_fail(err, "the comm has %d ranks, the layout %d", c->size,
                       layout->rank_count);
    if (chunk_count != pipeline_chunk_count(layout))
        return pt_fail(err, "the rank holds %d chunks, the layout %d",
                       chunk_count, pipeline_chunk_count(layout));
    int stage_index = pipeline_rank_stage(layout, c->rank);
    for (int chunk = 0; chunk < chunk_count; chunk++) {
        const model_stage *stage = chunks[chunk];
        stage_spec expected;
        if (pipeline_rank_chunk_spec(layout, c->rank, chunk, &expected,
                                     err) != 0)
            return -1;
        if (expected.first_layer != stage->spec.first_layer ||
            stage_spec_tp(&expected) != stage_spec_tp(&stage->spec) ||
            expected.tp_rank != stage->spec.tp_rank ||
            expected.last_layer != stage->spec.last_layer ||
            expected.has_embedding != stage->spec.has_embedding ||
            expected.has_head != stage->spec.has_head ||
            stage->slot_count <
                pipeline_chunk_slot_count(layout, stage_index, chunk) ||
            stage->mbs_capacity < layout->stage_mbs[stage_index])
            return pt_fail(err, "its stage was not made for this layout "
                                "(make it with pipeline_stage_create)");
    }
    return 0;
}

int pipeline_rank_step(const pipeline_layout *layout, model_stage *stage,
                       const comm *c, const train_config *config,
                       const uint32_t *tokens, double step_start_s,
                       bool inject_failure, const pipeline_grad_sync *sync,
                       step_result *out, pipeline_events *events,
                       pt_error *err)
{
    model_stage *const chunks[1] = {stage};
    return pipeline_rank_step_chunks(layout, chunks, 1, c, config, tokens,
                                     step_start_s, inject_failure, sync, out,
                                     events, err);
}

/* The failed step's message names the rank and what it was doing; the
 * world is aborted so that the other ranks return too. */
static void report_failure(const rank_step *r, pt_error *err)
{
    if (r->micro_batch >= 0)
        pt_error_prefix(err, "rank %d (stage %d, replica %d, tp %d), %s of "
                             "micro-batch %d",
                        r->c->rank, r->stage_index, r->replica, r->tp_rank,
                        r->operation, r->micro_batch);
    else
        pt_error_prefix(err, "rank %d (stage %d, replica %d, tp %d), %s",
                        r->c->rank, r->stage_index, r->replica, r->tp_rank,
                        r->operation);
    comm_abort(r->c, err->message);
}

/* ZeRO-2/3 at dp > 1: the stage and the dp group's shards the step
 * keeps at hand (zero_step.c). Not with interleaving: each chunk would
 * need its own shards. */
static int open_zero(rank_step *r, pt_error *err)
{
    int zero = parallel_zero_stage(&r->layout->config);
    if (r->dp < 2 || zero < 2 ||
        r->stage->spec.optimizer_shards < 2)
        return 0;
    if (r->chunk_count > 1)
        return pt_fail(err, "ZeRO-%d with the interleaved 1F1B is not run "
                            "yet",
                       zero);
    r->zero = zero;
    if (dp_shards(r, &r->dp_group, &r->dp_offsets, err) != 0)
        return -1;
    r->zero_units = (zero_unit_group){.c = r->c,
                                      .group = r->dp_group,
                                      .dp = r->dp,
                                      .offsets = r->dp_offsets};
    if (r->stage->grads_by_unit) {
        r->stage->grad_sink = zero_reduce_unit;
        r->stage->grad_sink_context = &r->zero_units;
    }
    r->stage->units_on_stream =
        r->stage->unit_stream != NULL && comm_has_stream_ops(r->c);
    if (r->stage->params_by_unit) {
        r->stage->param_source = zero_gather_unit;
        r->stage->param_source_context = &r->zero_units;
    }
    return 0;
}

/* Each chunk's boundaries with the stages before and after it
 * (parallel/boundary.c): its twins' one message, or re-sharded. */
static int open_boundaries(rank_step *r, pt_error *err)
{
    r->boundaries = calloc(2 * (size_t)r->chunk_count, sizeof *r->boundaries);
    if (r->boundaries == NULL)
        return pt_fail(err, "out of memory for %d chunks' boundaries",
                       r->chunk_count);
    bool packed = r->chunks[0]->backend->packs_sequence_rows &&
                  r->chunks[0]->spec.sequence_parallel;
    for (int chunk = 0; chunk < r->chunk_count; chunk++) {
        chunk_peers peers = peers_of(r, chunk);
        int ends[2] = {peers.previous, peers.next};
        for (int side = 0; side < 2; side++)
            if (ends[side] >= 0 &&
                pipeline_boundary_open(&r->boundaries[2 * chunk + side],
                                       r->layout, r->c->rank, ends[side],
                                       r->shard_offset, r->activation_floats,
                                       packed, err) != 0)
                return -1;
    }
    return 0;
}

static void close_boundaries(rank_step *r)
{
    for (int i = 0; r->boundaries != NULL && i < 2 * r->chunk_count; i++)
        pipeline_boundary_close(&r->boundaries[i]);
    free(r->boundaries);
    r->boundaries = NULL;
}

static int zero_chunk_grads(rank_step *r, pt_error *err)
{
    return stage_zero_grads(r->stage, err);
}

int pipeline_rank_step_chunks(const pipeline_layout *layout,
                              model_stage *const *chunks, int chunk_count,
                              const comm *c, const train_config *config,
                              const uint32_t *tokens, double step_start_s,
                              bool inject_failure,
                              const pipeline_grad_sync *sync,
                              step_result *out, pipeline_events *events,
                              pt_error *err)
{
    if (check_rank(layout, chunks, chunk_count, c, err) != 0 ||
        lr_schedule_check(&config->schedule, err) != 0) {
        pt_error_prefix(err, "rank %d", c->rank);
        comm_abort(c, err->message);
        return -1;
    }
    int stage_index = pipeline_rank_stage(layout, c->rank);
    int dp = layout->stage_dp[stage_index];
    int replica = pipeline_rank_replica(layout, c->rank);
    rank_step r = {
        .layout = layout,
        .stage = chunks[0],
        .chunks = chunks,
        .chunk_count = chunk_count,
        .c = c,
        .stage_index = stage_index,
        .replica = replica,
        .tp = layout->stage_tp[stage_index],
        .dp = dp,
        .mbs = layout->stage_mbs[stage_index],
        .loss_scale = 1.0f / (float)(layout->micro_batches * dp),
        .step_start_s = step_start_s,
        .events = events,
        .micro_batch = -1,
        .operation = "zero_grads",
        .tp_rank = pipeline_rank_tp(layout, c->rank),
        /* the buckets are the first chunk's: interleaved, each chunk's
         * buffer is reduced whole after the backward */
        .sync = chunk_count == 1 ? sync : NULL,
    };
    /* sequence parallelism: a pipeline message is this shard's rows,
     * packed in the cuda backend's buffers, at their place in the cpu's */
    size_t first_row = 0, rows = 0;
    stage_sequence_rows(&chunks[0]->spec,
                        (size_t)r.mbs * layout->shape.seq, &first_row,
                        &rows);
    r.activation_floats = rows * (size_t)layout->shape.hidden;
    r.shard_offset = chunks[0]->backend->packs_sequence_rows
                         ? 0
                         : first_row * (size_t)layout->shape.hidden;
    r.tokens = pipeline_replica_tokens(layout, stage_index, replica, tokens,
                                       &r.owned_tokens, err);
    if (r.tokens == NULL || open_boundaries(&r, err) != 0) {
        close_boundaries(&r);
        free(r.owned_tokens);
        pt_error_prefix(err, "rank %d", c->rank);
        comm_abort(c, err->message);
        return -1;
    }
    if (events != NULL)
        events->count = 0;
    int status = -1;
    if (open_zero(&r, err) != 0 ||
        for_each_chunk(&r, zero_chunk_grads, err) != 0 ||
        run_schedule(&r, inject_failure, err) != 0 ||
        reduce_gradients(&r, err) != 0 ||
        optimizer_step(&r, config, out, err) != 0 ||
        dp_gather_parameters(&r, err) != 0)
        goto done;
    status = 0;
done:
    /* the sink's context lives in this call */
    r.stage->grad_sink = NULL;
    r.stage->grad_sink_context = NULL;
    r.stage->param_source = NULL;
    r.stage->param_source_context = NULL;
    r.stage->units_on_stream = false;
    free(r.dp_group);
    free(r.dp_offsets);
    close_boundaries(&r);
    free(r.owned_tokens);
    if (status != 0 && r.overlap_armed) {
        /* disarm the backend; the world has failed, so this ends fast */
        pt_error ignored = {{0}};
        sync->overlap->end(sync->overlap->data, c->rank, chunks[0], c,
                           &ignored);
    }
    if (status != 0)
        report_failure(&r, err);
    return status;
}
