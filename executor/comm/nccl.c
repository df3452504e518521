/*
 * The comm interface over NCCL, its operations: one process, one GPU per
 * rank, each rank on its own thread (executor/comm/comm.h states the
 * contract). The communicators are non-blocking (ncclConfig_t.blocking =
 * 0): a call that returns ncclInProgress is polled with
 * ncclCommGetAsyncError before the next one, and every wait is a poll
 * loop that also watches the world's failure flag and a deadline, so no
 * thread can be held by a dead or silent peer. A rank's first message
 * connects it to every other rank (connect_messages), so that no later
 * send waits for a peer. Besides the blocking operations: the
 * collectives enqueued on the caller's stream (comm_stream_ops) with a
 * wait for that stream under the same deadline. The world and the ranks'
 * state are comm/nccl_world.c's; the send path is comm/device.c's.
 */
#include "executor/comm/device_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* This rank failed in `operation` for `what`: records it, aborts the
 * rank's communicators, fills err. */
static int fail_here(const comm *c, const char *operation, const char *what,
                     pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    char reason[COMM_FAILURE_REASON_MAX];
    snprintf(reason, sizeof reason, "rank %d: %s: %s", c->rank, operation,
             what);
    nccl_mark_failed(world, c->rank, reason);
    nccl_abort_rank_comms(world, c->rank);
    return pt_fail(err, "%s", reason);
}

/* Another rank failed (or this one, earlier): aborts this rank's
 * communicators and says so. */
static int abort_interrupted(const comm *c, const char *operation,
                             pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_abort_rank_comms(world, c->rank);
    pthread_mutex_lock(&world->lock);
    comm_failure failure = world->failure;
    pthread_mutex_unlock(&world->lock);
    return comm_failure_interrupted(&failure, c->rank, operation, err);
}

/* Between polls: spin at first (a message usually lands within
 * microseconds), then sleep a little, then more. */
static void back_off(long polls)
{
    if (polls < 2000)
        return;
    struct timespec pause = {.tv_sec = 0,
                             .tv_nsec = polls < 200000 ? 20000 : 1000000};
    nanosleep(&pause, NULL);
}

/*
 * Waits until `event` has completed (event NULL: until the communicator's
 * state is no longer ncclInProgress, that is, the last call on it is
 * enqueued), watching the failure flag, the communicator's asynchronous
 * error and the deadline.
 */
static int wait_for(const comm *c, ncclComm_t comm, cudaEvent_t event,
                    const char *operation, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    double deadline = pt_monotonic_seconds() + world->timeout_s;
    char what[400];
    for (long polls = 0;; polls++) {
        if (polls % 1024 == 1023)
            nccl_watch_other_processes(world);
        if (atomic_load(&world->failed) || comm == NULL)
            return abort_interrupted(c, operation, err);
        if (event != NULL) {
            cudaError_t status = cudaEventQuery(event);
            if (status == cudaSuccess)
                return 0;
            if (status != cudaErrorNotReady) {
                snprintf(what, sizeof what, "CUDA error: %s",
                         cudaGetErrorString(status));
                return fail_here(c, operation, what, err);
            }
        }
        ncclResult_t state = ncclSuccess;
        ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
        if (queried != ncclSuccess)
            state = queried;
        if (state == ncclSuccess && event == NULL)
            return 0;
        if (state != ncclSuccess && state != ncclInProgress) {
            snprintf(what, sizeof what, "NCCL error: %s (%s)",
                     ncclGetErrorString(state), ncclGetLastError(comm));
            return fail_here(c, operation, what, err);
        }
        if (pt_monotonic_seconds() > deadline) {
            snprintf(what, sizeof what, "no answer within %g s (the comm "
                                        "timeout)",
                     world->timeout_s);
            return fail_here(c, operation, what, err);
        }
        back_off(polls);
    }
}

/* After a NCCL call on a non-blocking communicator: an error fails the
 * rank; ncclInProgress is polled until the operation is enqueued. */
static int settle(const comm *c, ncclComm_t comm, ncclResult_t status,
                  const char *operation, pt_error *err)
{
    if (status == ncclSuccess)
        return 0;
    if (status != ncclInProgress) {
        char what[400];
        snprintf(what, sizeof what, "NCCL error: %s (%s)",
                 ncclGetErrorString(status), ncclGetLastError(comm));
        return fail_here(c, operation, what, err);
    }
    return wait_for(c, comm, NULL, operation, err);
}

/* A CUDA call inside an operation: failure fails the rank. */
static int cuda_step(const comm *c, cudaError_t status, const char *call,
                     const char *operation, pt_error *err)
{
    if (status == cudaSuccess)
        return 0;
    char what[400];
    comm_cuda_describe(what, sizeof what, call, status);
    return fail_here(c, operation, what, err);
}

#define CUDA_STEP(call) cuda_step(c, (call), #call, operation, err)

/* The rank's handle in clique k. */
static ncclComm_t clique_comm(const comm_nccl *world, int k, int rank)
{
    const nccl_clique *q = &world->cliques[k];
    for (int i = 0; i < q->size; i++)
        if (q->members[i] == rank)
            return q->comms[i];
    return NULL;
}

/* ---------------------------------------------------------- operations */

/* A staging buffer of the lane whose last send has finished: a free one,
 * a new one, or (the ring at its size) the next one once its send is
 * done. The send path (comm/device.c) grows it to the message. */
static int take_staging(const comm *c, message_lane *lane,
                        const char *operation, staging_buffer **out,
                        pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    staging_buffer *chosen = NULL;
    for (int i = 0; i < lane->staging_count && chosen == NULL; i++) {
        staging_buffer *b =
            &lane->staging[(lane->next + i) % lane->staging_count];
        cudaError_t status = b->used ? cudaEventQuery(b->sent) : cudaSuccess;
        if (status == cudaSuccess)
            chosen = b;
        else if (status != cudaErrorNotReady)
            return CUDA_STEP(status);
    }
    if (chosen == NULL && lane->staging_count < STAGING_MAX) {
        chosen = &lane->staging[lane->staging_count++];
        if (CUDA_STEP(cudaEventCreateWithFlags(&chosen->sent,
                                               cudaEventDisableTiming)) != 0)
            return -1;
    }
    if (chosen == NULL) {
        chosen = &lane->staging[lane->next];
        ncclComm_t comm = clique_comm(world, lane->clique, c->rank);
        if (wait_for(c, comm, chosen->sent, operation, err) != 0)
            return -1;
    }
    lane->next = (int)(chosen - lane->staging + 1) % STAGING_MAX;
    if (lane->next >= lane->staging_count)
        lane->next = 0;
    *out = chosen;
    return 0;
}

/* Copies the floats of a send into a staging buffer of its lane on the
 * copy stream (the send path, comm/device.c) and waits for that copy
 * (microseconds): the caller may overwrite `data` as soon as the send
 * returns, while the lane's stream may still be held by an earlier
 * send. */
static int stage_send(const comm *c, message_lane *lane, const float *data,
                      size_t count, const char *operation,
                      staging_buffer **out, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    ncclComm_t comm = clique_comm(world, lane->clique, c->rank);
    if (take_staging(c, lane, operation, out, err) != 0)
        return -1;
    comm_cuda_failure failed;
    if (comm_staging_copy_in(&(*out)->buffer, data, count, r->copy_stream,
                             r->caller, &r->memory, &failed, err) != 0)
        return failed.call != NULL ? cuda_step(c, failed.status, failed.call,
                                               operation, err)
                                   : -1;
    if (CUDA_STEP(cudaEventRecord(r->copy_done, r->copy_stream)) != 0)
        return -1;
    return wait_for(c, comm, r->copy_done, operation, err);
}

/*
 * Connects the rank to every other rank on both message communicators,
 * one group per communicator (each rank sends one float towards every
 * rank of the lane's direction and receives one from every other), which
 * every rank joins at its first message. NCCL connects a pair at its
 * first operation on a communicator and needs both ends there; left to
 * that, an operation is not enqueued until its peer reaches the same
 * communicator, and a group holding a send on one communicator and a
 * receive on the other waits for both connections before either runs:
 * GPipe's first backward (stage 0 sends its last activation with the
 * receive of the first gradient, which stage 1 sends only after taking
 * that activation) waited on itself until the timeout. Connected up
 * front, a send only enqueues and returns, and the two directions never
 * wait on each other. The cost: every pair's buffers, on a world of one
 * machine's GPUs.
 */
static int connect_messages(const comm *c, const char *operation,
                            pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    /* the values are never read; the scratch holds 2 x HOST_REDUCE_MAX */
    float *scratch = (float *)r->device_scratch;
    for (int l = 0; l < 2; l++) {
        message_lane *lane = &r->lanes[l];
        ncclComm_t comm = clique_comm(world, lane->clique, c->rank);
        if (settle(c, comm, ncclGroupStart(), operation, err) != 0)
            return -1;
        ncclResult_t first = ncclSuccess;
        for (int peer = 0; peer < world->size; peer++) {
            if (peer == c->rank)
                continue;
            bool towards = lane->clique == CLIQUE_TO_HIGHER ? peer > c->rank
                                                            : peer < c->rank;
            float *slot = scratch + 1 + peer % (2 * HOST_REDUCE_MAX - 1);
            ncclResult_t status =
                towards ? ncclSend(scratch, 1, ncclFloat32, peer, comm,
                                   lane->stream)
                        : ncclRecv(slot, 1, ncclFloat32, peer, comm,
                                   lane->stream);
            if (status != ncclSuccess && status != ncclInProgress &&
                first == ncclSuccess)
                first = status;
        }
        ncclResult_t ended = ncclGroupEnd();
        if (settle(c, comm, first != ncclSuccess ? first : ended, operation,
                   err) != 0 ||
            CUDA_STEP(cudaEventRecord(lane->received, lane->stream)) != 0 ||
            wait_for(c, comm, lane->received, operation, err) != 0)
            return -1;
    }
    r->messages_connected = true;
    return 0;
}

/* The checks every message makes first: the world has not failed, the
 * rank is open; then, the first time, the connections. */
static int open_message(const comm *c, const char *operation, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    if (atomic_load(&world->failed))
        return abort_interrupted(c, operation, err);
    if (!r->open)
        return pt_fail(err, "rank %d: %s: the rank's comm is not open",
                       c->rank, operation);
    return r->messages_connected ? 0 : connect_messages(c, operation, err);
}

static int nccl_send(const comm *c, int peer, int tag, const float *data,
                     size_t count, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    char operation[64];
    snprintf(operation, sizeof operation, "send to rank %d (tag %d)", peer,
             tag);
    if (open_message(c, operation, err) != 0)
        return -1;
    if (count == 0)
        return 0;
    message_lane *lane = &r->lanes[peer > c->rank ? 0 : 1];
    ncclComm_t comm = clique_comm(world, lane->clique, c->rank);
    staging_buffer *staging = NULL;
    if (stage_send(c, lane, data, count, operation, &staging, err) != 0)
        return -1;
    if (settle(c, comm,
               ncclSend(staging->buffer.data, count, ncclFloat32, peer, comm,
                        lane->stream),
               operation, err) != 0 ||
        CUDA_STEP(cudaEventRecord(staging->sent, lane->stream)) != 0)
        return -1;
    staging->used = true;
    return 0;
}

static int nccl_recv(const comm *c, int peer, int tag, float *data,
                     size_t count, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    char operation[64];
    snprintf(operation, sizeof operation, "receive from rank %d (tag %d)",
             peer, tag);
    if (open_message(c, operation, err) != 0)
        return -1;
    if (count == 0)
        return 0;
    /* the peer sent it on its lane towards us */
    message_lane *lane = &r->lanes[peer < c->rank ? 0 : 1];
    ncclComm_t comm = clique_comm(world, lane->clique, c->rank);
    /* the destination may still be written by the caller's default
     * stream (comm_follow_caller) */
    if (CUDA_STEP(comm_follow_caller(lane->stream, r->caller)) != 0 ||
        settle(c, comm,
               ncclRecv(data, count, ncclFloat32, peer, comm, lane->stream),
               operation, err) != 0 ||
        CUDA_STEP(cudaEventRecord(lane->received, lane->stream)) != 0)
        return -1;
    return wait_for(c, comm, lane->received, operation, err);
}

/* The rank's handle of the communicator of `group` (lean: its lean twin
 * where one was made, else the same), or an error saying that no
 * communicator was made for it. */
static int group_comm(const comm *c, const int *group, int group_size,
                      bool lean, const char *operation, ncclComm_t *out,
                      pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    int local[64];
    int *sorted = group_size <= 64
                      ? local
                      : malloc((size_t)group_size * sizeof *sorted);
    if (sorted == NULL)
        return pt_fail(err, "rank %d: %s: out of memory", c->rank,
                       operation);
    memcpy(sorted, group, (size_t)group_size * sizeof *group);
    qsort(sorted, (size_t)group_size, sizeof *sorted, nccl_compare_ints);
    int k = lean ? nccl_find_lean_clique(world, sorted, group_size) : -1;
    if (k < 0)
        k = nccl_find_clique(world, sorted, group_size);
    if (sorted != local)
        free(sorted);
    if (k < 0)
        return pt_fail(err, "rank %d: %s: no communicator was made for this "
                            "group (comm_nccl_create's groups)",
                       c->rank, operation);
    *out = clique_comm(world, k, c->rank);
    return 0;
}

/* "all-reduce over ranks 0, 2, 4" (the first few). */
static void describe_group(const char *what, const int *group,
                           int group_size, char *out, size_t size)
{
    int used = snprintf(out, size, "%s over ranks", what);
    for (int i = 0; i < group_size && used > 0 && (size_t)used < size;
         i++) {
        if (i == 6) {
            snprintf(out + used, size - (size_t)used, ", ... (%d)",
                     group_size);
            break;
        }
        used += snprintf(out + used, size - (size_t)used, "%s%d",
                         i == 0 ? " " : ", ", group[i]);
    }
}

/* What every collective checks first: the world has not failed, the
 * rank is open, the group has a communicator (*comm). operation gets
 * the call's description for messages. */
static int open_group_call(const comm *c, const int *group, int group_size,
                           bool lean, const char *what, char *operation,
                           size_t operation_size, ncclComm_t *comm,
                           pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    describe_group(what, group, group_size, operation, operation_size);
    if (atomic_load(&world->failed))
        return abort_interrupted(c, operation, err);
    if (!world->ranks[c->rank].open)
        return pt_fail(err, "rank %d: %s: the rank's comm is not open",
                       c->rank, operation);
    return group_comm(c, group, group_size, lean, operation, comm, err);
}

/* An all-reduce of `group` on `stream` (NULL: the rank's collective
 * stream, then waited for; else only enqueued). */
static int collective(const comm *c, const int *group, int group_size,
                      bool lean, const char *what, const void *send,
                      void *receive, size_t count, ncclDataType_t type,
                      ncclRedOp_t op, cudaStream_t stream, pt_error *err)
{
    nccl_rank *r = &nccl_world(c)->ranks[c->rank];
    char operation[96];
    ncclComm_t comm = NULL;
    if (open_group_call(c, group, group_size, lean, what, operation,
                        sizeof operation, &comm, err) != 0)
        return -1;
    cudaStream_t on = stream != NULL ? stream : r->collective_stream;
    if ((stream == NULL &&
         CUDA_STEP(comm_follow_caller(on, r->caller)) != 0) ||
        settle(c, comm,
               ncclAllReduce(send, receive, count, type, op, comm, on),
               operation, err) != 0)
        return -1;
    if (stream != NULL)
        return 0;
    if (CUDA_STEP(cudaEventRecord(r->collective_done, on)) != 0)
        return -1;
    return wait_for(c, comm, r->collective_done, operation, err);
}

static int nccl_all_reduce(const comm *c, const int *group, int group_size,
                           float *data, size_t count, comm_reduce_op op,
                           pt_error *err)
{
    return collective(c, group, group_size, false,
                      op == COMM_MAX ? "all-reduce (max)" : "all-reduce",
                      data, data, count, ncclFloat32,
                      op == COMM_MAX ? ncclMax : ncclSum, NULL, err);
}

/* The rank of global rank `rank` in the clique of `group`: cliques are
 * made of the sorted members. */
static int clique_rank_of(const int *group, int group_size, int rank)
{
    int below = 0;
    for (int i = 0; i < group_size; i++)
        below += group[i] < rank;
    return below;
}

/* Whether the chunks are equal and lie in the clique's rank order (chunk
 * j is member j's, the members sorted): then NCCL's own reduce-scatter
 * and all-gather take the buffer in place. */
static bool chunks_in_clique_order(const int *group, int group_size,
                                   const size_t *offsets)
{
    size_t chunk = offsets[1] - offsets[0];
    for (int j = 0; j < group_size; j++)
        if (offsets[j + 1] - offsets[j] != chunk ||
            clique_rank_of(group, group_size, group[j]) != j)
            return false;
    return chunk > 0;
}

/* Enqueues the collective's NCCL calls on `on`: NCCL's reduce-scatter or
 * all-gather in place where the chunks allow (sequence parallelism's
 * rows, even shards: the collectives the profiler's curves time and
 * Megatron-LM calls), else one NCCL group of per-chunk calls, so chunks of
 * unequal size need no padding: chunk j reduced to (or broadcast from)
 * member j (each member sends and receives (n - 1) / n of the buffer). */
static ncclResult_t enqueue_chunks(const comm *c, const int *group,
                                   int group_size, void *data,
                                   const size_t *offsets, ncclDataType_t type,
                                   size_t element_bytes, bool gather,
                                   ncclComm_t comm, cudaStream_t on)
{
    char *base = (char *)data + offsets[0] * element_bytes;
    if (chunks_in_clique_order(group, group_size, offsets)) {
        size_t count = offsets[1] - offsets[0];
        char *mine = base + (size_t)clique_rank_of(group, group_size,
                                                   c->rank) *
                                count * element_bytes;
        return gather ? ncclAllGather(mine, base, count, type, comm, on)
                      : ncclReduceScatter(base, mine, count, type, ncclSum,
                                          comm, on);
    }
    ncclResult_t first_error = ncclGroupStart();
    if (first_error != ncclSuccess)
        return first_error;
    for (int j = 0; j < group_size; j++) {
        char *chunk = (char *)data + offsets[j] * element_bytes;
        size_t count = offsets[j + 1] - offsets[j];
        int root = clique_rank_of(group, group_size, group[j]);
        ncclResult_t status =
            gather ? ncclBroadcast(chunk, chunk, count, type, root, comm, on)
                   : ncclReduce(chunk, chunk, count, type, ncclSum, root,
                                comm, on);
        if (status != ncclSuccess && status != ncclInProgress &&
            first_error == ncclSuccess)
            first_error = status;
    }
    ncclResult_t ended = ncclGroupEnd();
    return first_error != ncclSuccess ? first_error : ended;
}

/* ZeRO-1's collectives (fp32) and sequence parallelism's (bf16 or fp32)
 * over chunks at `offsets` (enqueue_chunks), on `stream` (NULL: the
 * rank's collective stream, then waited for). */
static int chunked_collective(const comm *c, const int *group, int group_size,
                              void *data, const size_t *offsets,
                              comm_element element, bool gather,
                              cudaStream_t stream, pt_error *err)
{
    ncclDataType_t type =
        element == COMM_BFLOAT16 ? ncclBfloat16 : ncclFloat32;
    size_t element_bytes = element == COMM_BFLOAT16 ? 2 : 4;
    nccl_rank *r = &nccl_world(c)->ranks[c->rank];
    char operation[96];
    ncclComm_t comm = NULL;
    cudaStream_t on = stream != NULL ? stream : r->collective_stream;
    if (open_group_call(c, group, group_size, false,
                        gather ? "all-gather" : "reduce-scatter", operation,
                        sizeof operation, &comm, err) != 0 ||
        (stream == NULL &&
         CUDA_STEP(comm_follow_caller(on, r->caller)) != 0) ||
        settle(c, comm,
               enqueue_chunks(c, group, group_size, data, offsets, type,
                              element_bytes, gather, comm, on),
               operation, err) != 0)
        return -1;
    if (stream != NULL)
        return 0;
    if (CUDA_STEP(cudaEventRecord(r->collective_done, on)) != 0)
        return -1;
    return wait_for(c, comm, r->collective_done, operation, err);
}

static int nccl_reduce_scatter(const comm *c, const int *group,
                               int group_size, float *data,
                               const size_t *chunk_offsets, pt_error *err)
{
    return chunked_collective(c, group, group_size, data, chunk_offsets,
                              COMM_FLOAT32, false, NULL, err);
}

static int nccl_all_gather(const comm *c, const int *group, int group_size,
                           float *data, const size_t *chunk_offsets,
                           pt_error *err)
{
    return chunked_collective(c, group, group_size, data, chunk_offsets,
                              COMM_FLOAT32, true, NULL, err);
}


static int nccl_all_reduce_host(const comm *c, const int *group,
                                int group_size, double *data, size_t count,
                                pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    const char *operation = "all-reduce of host values";
    if (atomic_load(&world->failed))
        return abort_interrupted(c, operation, err);
    if (!r->open)
        return pt_fail(err, "rank %d: %s: the rank's comm is not open",
                       c->rank, operation);
    if (count > HOST_REDUCE_MAX)
        return pt_fail(err, "rank %d: %s: %zu values, at most %d at once",
                       c->rank, operation, count, HOST_REDUCE_MAX);
    size_t bytes = count * sizeof(double);
    memcpy(r->host_scratch, data, bytes);
    if (CUDA_STEP(cudaMemcpyAsync(r->device_scratch, r->host_scratch, bytes,
                                  cudaMemcpyHostToDevice,
                                  r->collective_stream)) != 0 ||
        collective(c, group, group_size, false, "all-reduce (host doubles)",
                   r->device_scratch, r->device_scratch, count, ncclFloat64,
                   ncclSum, NULL, err) != 0 ||
        CUDA_STEP(cudaMemcpyAsync(r->host_scratch, r->device_scratch, bytes,
                                  cudaMemcpyDeviceToHost,
                                  r->collective_stream)) != 0 ||
        CUDA_STEP(cudaEventRecord(r->collective_done,
                                  r->collective_stream)) != 0)
        return -1;
    ncclComm_t comm = clique_comm(world, CLIQUE_WORLD, c->rank);
    if (wait_for(c, comm, r->collective_done, operation, err) != 0)
        return -1;
    memcpy(data, r->host_scratch, bytes);
    return 0;
}

/* One double summed over the world: returns once every rank is here. */
static int nccl_barrier(const comm *c, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    int *everyone = malloc((size_t)world->size * sizeof *everyone);
    if (everyone == NULL)
        return pt_fail(err, "rank %d: barrier: out of memory", c->rank);
    for (int rank = 0; rank < world->size; rank++)
        everyone[rank] = rank;
    double token = 0.0;
    int status = nccl_all_reduce_host(c, everyone, world->size, &token, 1,
                                      err);
    free(everyone);
    return status;
}

static void nccl_abort(const comm *c, const char *reason)
{
    comm_nccl *world = nccl_world(c);
    nccl_mark_failed(world, c->rank, reason);
    nccl_abort_rank_comms(world, c->rank);
}

static int nccl_failed_rank(const comm *c, char *reason, size_t reason_size)
{
    nccl_watch_other_processes(nccl_world(c));
    return comm_nccl_failed_rank(nccl_world(c), reason, reason_size);
}

/* ------------------------------------------------ on the caller's stream */

/* An all-reduce on the caller's stream; lean: on the group's lean twin
 * (PARTITA_NCCL_LEAN_CTAS) where one was made. */
static int stream_all_reduce(const comm *c, const int *group,
                             int group_size, void *data, size_t count,
                             comm_element type, comm_reduce_op op,
                             void *stream, bool lean, pt_error *err)
{
    return collective(c, group, group_size, lean,
                      op == COMM_MAX ? "stream all-reduce (max)"
                                     : "stream all-reduce",
                      data, data, count,
                      type == COMM_BFLOAT16 ? ncclBfloat16 : ncclFloat32,
                      op == COMM_MAX ? ncclMax : ncclSum,
                      (cudaStream_t)stream, err);
}

static int nccl_all_reduce_on_stream(const comm *c, const int *group,
                                     int group_size, void *data, size_t count,
                                     comm_element type, comm_reduce_op op,
                                     void *stream, pt_error *err)
{
    return stream_all_reduce(c, group, group_size, data, count, type, op,
                             stream, false, err);
}

static int nccl_all_reduce_lean_on_stream(const comm *c, const int *group,
                                          int group_size, void *data,
                                          size_t count, comm_element type,
                                          comm_reduce_op op, void *stream,
                                          pt_error *err)
{
    return stream_all_reduce(c, group, group_size, data, count, type, op,
                             stream, true, err);
}

static int nccl_reduce_scatter_on_stream(const comm *c, const int *group,
                                         int group_size, void *data,
                                         const size_t *chunk_offsets,
                                         comm_element type, void *stream,
                                         pt_error *err)
{
    return chunked_collective(c, group, group_size, data, chunk_offsets,
                              type, false, (cudaStream_t)stream, err);
}

static int nccl_all_gather_on_stream(const comm *c, const int *group,
                                     int group_size, void *data,
                                     const size_t *chunk_offsets,
                                     comm_element type, void *stream,
                                     pt_error *err)
{
    return chunked_collective(c, group, group_size, data, chunk_offsets,
                              type, true, (cudaStream_t)stream, err);
}

/* The stream's work so far, waited for as every operation is: a NCCL
 * kernel whose peer failed would otherwise hold the host forever. */
static int nccl_wait_stream(const comm *c, void *stream,
                            const char *operation, pt_error *err)
{
    comm_nccl *world = nccl_world(c);
    nccl_rank *r = &world->ranks[c->rank];
    if (atomic_load(&world->failed))
        return abort_interrupted(c, operation, err);
    if (!r->open)
        return pt_fail(err, "rank %d: %s: the rank's comm is not open",
                       c->rank, operation);
    if (CUDA_STEP(cudaEventRecord(r->collective_done,
                                  (cudaStream_t)stream)) != 0)
        return -1;
    return wait_for(c, clique_comm(world, CLIQUE_WORLD, c->rank),
                    r->collective_done, operation, err);
}

static const comm_stream_ops nccl_stream_ops = {
    .all_reduce = nccl_all_reduce_on_stream,
    .reduce_scatter = nccl_reduce_scatter_on_stream,
    .all_gather = nccl_all_gather_on_stream,
    .wait = nccl_wait_stream,
    .all_reduce_lean = nccl_all_reduce_lean_on_stream,
};

const comm_ops nccl_ops = {
    .name = "nccl",
    .send = nccl_send,
    .recv = nccl_recv,
    .all_reduce = nccl_all_reduce,
    .all_reduce_host = nccl_all_reduce_host,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .failed_rank = nccl_failed_rank,
    .on_stream = &nccl_stream_ops,
};

comm comm_nccl_rank(comm_nccl *world, int rank)
{
    comm handle = {.ops = &nccl_ops, .shared = world, .rank = rank,
                   .size = world->size};
    return handle;
}
