/*
 * The device exchange (executor/comm/comm.h): ranks that are threads of
 * this process on one GPU exchange through its memory. This file holds
 * the world, each rank's stream, events, clock slots and staging buffers,
 * the messages and the operations' table, on top of the two files below
 * it: the rendezvous and the collectives (comm/exchange_collectives.c),
 * and the failures and waits both use (comm/exchange_waits.c; every wait
 * watches the failure flag and a deadline).
 *
 * A message: a receive that finds none waiting posts its buffer; a send
 * to such a receiver copies straight into that buffer on its stream,
 * waits for the copy and wakes the receiver (a rendezvous). Otherwise the
 * sender copies into a staging buffer of its own on the device (its
 * stream; the host waits for that copy only, microseconds, so the caller
 * may overwrite its buffer), posts it to the receiver's mailbox and
 * returns; the receiver takes it, copies out on its stream, records the
 * buffer's release event behind its copy and waits for it. A sender never
 * waits for its receiver, so crossing sends cannot deadlock; a staging
 * buffer is reused behind its release event, on the device. Paced, both
 * ends stamp the GPU clock when ready (the sender's stream before its
 * copy, into a slot of the receiver's or of the staging buffer; the
 * receiver's when the receive is called) and the receiver's pacing
 * kernel ends at the later stamp plus the link's time: the copies run
 * inside the one emulated transfer.
 */
#include "executor/comm/device_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --------------------------------------------------------- staging */

/* A staging buffer of the rank not in flight, preferring one that holds
 * `count` floats; a new one while fewer than EXCHANGE_STAGING_MAX exist;
 * else waits (host) until a receiver releases one. Lock not held. */
static int free_staging(const comm *c, size_t count, const char *operation,
                        exchange_staging **out, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_rank *r = &world->ranks[c->rank];
    struct timespec deadline = exchange_deadline(world);
    pthread_mutex_lock(&world->lock);
    exchange_staging *chosen = NULL;
    while (chosen == NULL) {
        for (int i = 0; i < r->staging_count; i++) {
            exchange_staging *b = &r->staging[i];
            if (!b->in_flight && (chosen == NULL ||
                                  (chosen->buffer.capacity < count &&
                                   b->buffer.capacity >
                                       chosen->buffer.capacity)))
                chosen = b;
        }
        if ((chosen == NULL || chosen->buffer.capacity < count) &&
            r->staging_count < EXCHANGE_STAGING_MAX)
            chosen = &r->staging[r->staging_count++];
        if (chosen != NULL)
            break;
        if (atomic_load(&world->failed) ||
            exchange_wait_change(c, &deadline, operation, err) != 0) {
            pthread_mutex_unlock(&world->lock);
            return atomic_load(&world->failed)
                       ? exchange_interrupted(c, operation, err)
                       : -1;
        }
    }
    pthread_mutex_unlock(&world->lock);
    if (chosen->released == NULL &&
        EXCHANGE_CUDA(cudaEventCreateWithFlags(&chosen->released,
                                               cudaEventDisableTiming)) != 0)
        return -1;
    *out = chosen;
    return 0;
}

/* ----------------------------------------------------------- messages */

/* What the emulated link from `source` to `destination` adds to a
 * message of `count` floats (0: not paced). */
static double message_seconds(const comm_exchange *world, int source,
                              int destination, size_t count)
{
    if (world->links == NULL)
        return 0.0;
    return comm_emulated_seconds(
        COMM_PATTERN_MESSAGE, (double)count * sizeof(float), 2,
        world->links[source * world->size + destination]);
}

/* Copies a message into staging buffer b on the rank's stream (the send
 * path, comm/device.c), behind the buffer's last release, and waits for
 * that copy; `ready_stamp` (paced, else NULL) takes the GPU clock first:
 * the moment the sender is ready. */
static int stage_message(const comm *c, exchange_staging *b,
                         const float *data, size_t count,
                         uint64_t *ready_stamp, const char *operation,
                         pt_error *err)
{
    exchange_rank *r = &exchange_world(c)->ranks[c->rank];
    if ((b->release_recorded &&
         EXCHANGE_CUDA(cudaStreamWaitEvent(r->stream, b->released, 0)) !=
             0) ||
        (ready_stamp != NULL &&
         EXCHANGE_CUDA(cuda_exchange_stamp(ready_stamp, r->stream)) != 0))
        return -1;
    comm_cuda_failure failed;
    if (comm_staging_copy_in(&b->buffer, data, count, r->stream, r->caller,
                             &r->memory, &failed, err) != 0)
        return failed.call != NULL ? exchange_cuda(c, failed.status,
                                                   failed.call, operation,
                                                   err)
                                   : -1;
    return exchange_wait_stream(c, r->stream, operation, err);
}

/* Whether a staged message of (source, tag) waits in the mailbox (lock
 * held): a later one must not overtake it. */
static bool staged_waiting(const comm_mailbox *box, int source, int tag)
{
    for (const comm_envelope *m = box->head; m != NULL; m = m->next)
        if (m->source == source && m->tag == tag)
            return true;
    return false;
}

/* The receive of `peer` waiting for this message, claimed (NULL: none
 * posted, of another count, or behind a staged message; the message is
 * staged). */
static exchange_posted *claim_posted(const comm *c, int peer, int tag,
                                     size_t count)
{
    comm_exchange *world = exchange_world(c);
    exchange_posted *p = &world->ranks[peer].posted;
    pthread_mutex_lock(&world->lock);
    bool match = p->state == EXCHANGE_POSTED_WAITING &&
                 p->source == c->rank && p->tag == tag &&
                 p->count == count &&
                 !staged_waiting(&world->mailboxes[peer], c->rank, tag);
    if (match)
        p->state = EXCHANGE_POSTED_CLAIMED;
    pthread_mutex_unlock(&world->lock);
    return match ? p : NULL;
}

/* The rendezvous: copies straight into the waiting receiver's buffer on
 * the rank's stream (stamping the receiver's slot first when paced: the
 * sender is ready) and waits for the copy; then the receiver paces. A
 * failed copy is waited out before the receiver learns of it, so it
 * never frees a buffer still written. */
static int deliver(const comm *c, exchange_posted *p, const float *data,
                   const char *operation, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_rank *r = &world->ranks[c->rank];
    int status =
        (p->sent_stamp != NULL &&
         EXCHANGE_CUDA(cuda_exchange_stamp(p->sent_stamp, r->stream)) !=
             0) ||
                EXCHANGE_CUDA(comm_follow_caller(r->stream, r->caller)) !=
                    0 ||
                EXCHANGE_CUDA(cudaMemcpyAsync(p->data, data,
                                              p->count * sizeof(float),
                                              cudaMemcpyDeviceToDevice,
                                              r->stream)) != 0 ||
                exchange_wait_stream(c, r->stream, operation, err) != 0
            ? -1
            : 0;
    if (status != 0) {
        cudaStreamSynchronize(r->stream);
        cudaGetLastError();
    }
    pthread_mutex_lock(&world->lock);
    p->state = status == 0 ? EXCHANGE_POSTED_DELIVERED
                           : EXCHANGE_POSTED_FAILED;
    pthread_cond_broadcast(&world->changed);
    pthread_mutex_unlock(&world->lock);
    return status;
}

static int exchange_send(const comm *c, int peer, int tag, const float *data,
                         size_t count, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_rank *r = &world->ranks[c->rank];
    char operation[64];
    snprintf(operation, sizeof operation, "send to rank %d (tag %d)", peer,
             tag);
    if (atomic_load(&world->failed))
        return exchange_interrupted(c, operation, err);
    if (!r->open)
        return pt_fail(err, "rank %d: %s: the rank's exchange is not open",
                       c->rank, operation);
    exchange_posted *posted =
        count > 0 ? claim_posted(c, peer, tag, count) : NULL;
    if (posted != NULL)
        return deliver(c, posted, data, operation, err);
    exchange_message *message = calloc(1, sizeof *message);
    if (message == NULL)
        return pt_fail(err, "rank %d: %s: out of memory", c->rank,
                       operation);
    *message = (exchange_message){
        .envelope = {.source = c->rank, .tag = tag}, .count = count};
    exchange_staging *b = NULL;
    if (count > 0) {
        bool paced = message_seconds(world, c->rank, peer, count) > 0.0;
        if (free_staging(c, count, operation, &b, err) != 0) {
            free(message);
            return -1;
        }
        /* the buffer's own slot: read by the receiver's pacing kernel
         * before the buffer's release, so never overwritten first */
        uint64_t *stamp = paced ? r->stamps + EXCHANGE_STAMPS +
                                      (b - r->staging)
                                : NULL;
        if (stage_message(c, b, data, count, stamp, operation, err) != 0) {
            free(message);
            return -1;
        }
        message->staging = b;
        message->sent_stamp = stamp;
    }
    pthread_mutex_lock(&world->lock);
    if (b != NULL)
        b->in_flight = true;
    comm_mailbox_append(&world->mailboxes[peer], &message->envelope);
    pthread_cond_broadcast(&world->changed);
    pthread_mutex_unlock(&world->lock);
    return 0;
}

/* Waits for the message `want` describes: a staged one from the mailbox
 * (*out), or, once none was waiting and `want` is posted, the sender's
 * copy straight into its buffer (*out NULL). A receive that fails while
 * a sender's copy is under way waits for that copy to end first: the
 * caller may free the buffer at once. */
static int wait_message(const comm *c, const exchange_posted *want,
                        const char *operation, exchange_message **out,
                        pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_posted *posted = &world->ranks[c->rank].posted;
    struct timespec deadline = exchange_deadline(world);
    int status = 0;
    pthread_mutex_lock(&world->lock);
    exchange_message *message = NULL;
    for (bool first = true;; first = false) {
        /* the envelope is the message's first member */
        message = (exchange_message *)comm_mailbox_take(
            &world->mailboxes[c->rank], want->source, want->tag);
        if (message != NULL ||
            posted->state == EXCHANGE_POSTED_DELIVERED)
            break;
        if (first && want->count > 0)
            *posted = *want;
        if (atomic_load(&world->failed)) {
            status = -2;
            break;
        }
        if (exchange_wait_change(c, &deadline, operation, err) != 0) {
            status = -1;
            break;
        }
    }
    while (posted->state == EXCHANGE_POSTED_CLAIMED)
        pthread_cond_wait(&world->changed, &world->lock);
    posted->state = EXCHANGE_POSTED_NONE;
    pthread_mutex_unlock(&world->lock);
    *out = message;
    return status == -2 ? exchange_interrupted(c, operation, err) : status;
}

/* Gives the sender its buffer back, after `released` was recorded. */
static void release_staging(comm_exchange *world, exchange_staging *b,
                            bool recorded)
{
    pthread_mutex_lock(&world->lock);
    b->in_flight = false;
    b->release_recorded = b->release_recorded || recorded;
    pthread_cond_broadcast(&world->changed);
    pthread_mutex_unlock(&world->lock);
}

/* Copies the message out on the rank's stream and, paced (ready_stamp,
 * the receiver's, not NULL), waits on the GPU until the later of the
 * two ends' stamps plus the link's time; records the staging buffer's
 * release behind it. */
static int copy_out(const comm *c, const exchange_message *m, float *data,
                    const uint64_t *ready_stamp, const char *operation,
                    pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_rank *r = &world->ranks[c->rank];
    double seconds =
        message_seconds(world, m->envelope.source, c->rank, m->count);
    int status =
        EXCHANGE_CUDA(comm_follow_caller(r->stream, r->caller)) != 0 ||
                EXCHANGE_CUDA(cudaMemcpyAsync(data, m->staging->buffer.data,
                                              m->count * sizeof(float),
                                              cudaMemcpyDeviceToDevice,
                                              r->stream)) != 0 ||
                (ready_stamp != NULL &&
                 EXCHANGE_CUDA(cuda_exchange_pace_after(
                     ready_stamp, m->sent_stamp,
                     exchange_pace_nanoseconds(seconds), r->stream)) != 0)
            ? -1
            : 0;
    bool recorded =
        status == 0 &&
        EXCHANGE_CUDA(cudaEventRecord(m->staging->released, r->stream)) == 0;
    if (!recorded) {
        /* the sender may not reuse a buffer a copy may still read */
        cudaStreamSynchronize(r->stream);
        cudaGetLastError();
    }
    release_staging(world, m->staging, recorded);
    return recorded ? 0 : -1;
}

static int exchange_recv(const comm *c, int peer, int tag, float *data,
                         size_t count, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_rank *r = &world->ranks[c->rank];
    char operation[64];
    snprintf(operation, sizeof operation, "receive from rank %d (tag %d)",
             peer, tag);
    if (atomic_load(&world->failed))
        return exchange_interrupted(c, operation, err);
    if (!r->open)
        return pt_fail(err, "rank %d: %s: the rank's exchange is not open",
                       c->rank, operation);
    /* ready from now on: the transfer may start once the sender is too */
    double seconds = message_seconds(world, peer, c->rank, count);
    uint64_t *ready_stamp = NULL;
    exchange_posted want = {.state = EXCHANGE_POSTED_WAITING,
                            .source = peer, .tag = tag, .data = data,
                            .count = count};
    if (seconds > 0.0) {
        ready_stamp = exchange_next_stamp(r);
        want.sent_stamp = exchange_next_stamp(r);
        if (EXCHANGE_CUDA(cuda_exchange_stamp(ready_stamp, r->stream)) != 0)
            return -1;
    }
    exchange_message *m = NULL;
    if (wait_message(c, &want, operation, &m, err) != 0)
        return -1;
    int status = 0;
    if (m == NULL) {
        /* delivered into data: the transfer ends at the later stamp
         * plus the link's time */
        return (ready_stamp != NULL &&
                EXCHANGE_CUDA(cuda_exchange_pace_after(
                    ready_stamp, want.sent_stamp,
                    exchange_pace_nanoseconds(seconds), r->stream)) != 0) ||
                       exchange_wait_stream(c, r->stream, operation, err) !=
                           0
                   ? -1
                   : 0;
    }
    if (m->count != count) {
        if (m->staging != NULL)
            release_staging(world, m->staging, false);
        status = pt_fail(err, "rank %d: %s: expected %zu floats, got %zu",
                         c->rank, operation, count, m->count);
    } else if (count > 0) {
        status = copy_out(c, m, data, ready_stamp, operation, err) != 0 ||
                         exchange_wait_stream(c, r->stream, operation,
                                              err) != 0
                     ? -1
                     : 0;
    }
    free(m);
    return status;
}

/* ------------------------------------------- blocking collectives, table */

/* A blocking collective runs on the rank's own stream, behind what the
 * caller left on the default streams (comm_follow_caller). */
static int follow_caller(const comm *c, const char *operation,
                         pt_error *err)
{
    exchange_rank *r = &exchange_world(c)->ranks[c->rank];
    return EXCHANGE_CUDA(comm_follow_caller(r->stream, r->caller));
}

/* A blocking collective: the stream-ordered one on the rank's own stream,
 * waited for. */
static int exchange_all_reduce(const comm *c, const int *group,
                               int group_size, float *data, size_t count,
                               comm_reduce_op op, pt_error *err)
{
    exchange_rank *r = &exchange_world(c)->ranks[c->rank];
    if (!r->open)
        return pt_fail(err, "rank %d: all-reduce: the rank's exchange is "
                            "not open",
                       c->rank);
    if (follow_caller(c, "all-reduce", err) != 0 ||
        exchange_all_reduce_on_stream(c, group, group_size, data, count,
                                      COMM_FLOAT32, op, r->stream,
                                      err) != 0)
        return -1;
    return exchange_wait_stream(c, r->stream, "all-reduce", err);
}

static int exchange_reduce_scatter(const comm *c, const int *group,
                                   int group_size, float *data,
                                   const size_t *chunk_offsets, pt_error *err)
{
    exchange_rank *r = &exchange_world(c)->ranks[c->rank];
    if (!r->open)
        return pt_fail(err, "rank %d: reduce-scatter: the rank's exchange "
                            "is not open",
                       c->rank);
    if (follow_caller(c, "reduce-scatter", err) != 0 ||
        exchange_reduce_scatter_on_stream(c, group, group_size, data,
                                          chunk_offsets, COMM_FLOAT32,
                                          r->stream, err) != 0)
        return -1;
    return exchange_wait_stream(c, r->stream, "reduce-scatter", err);
}

static int exchange_all_gather(const comm *c, const int *group,
                               int group_size, float *data,
                               const size_t *chunk_offsets, pt_error *err)
{
    exchange_rank *r = &exchange_world(c)->ranks[c->rank];
    if (!r->open)
        return pt_fail(err, "rank %d: all-gather: the rank's exchange is "
                            "not open",
                       c->rank);
    if (follow_caller(c, "all-gather", err) != 0 ||
        exchange_all_gather_on_stream(c, group, group_size, data,
                                      chunk_offsets, COMM_FLOAT32, r->stream,
                                      err) != 0)
        return -1;
    return exchange_wait_stream(c, r->stream, "all-gather", err);
}

static int exchange_wait(const comm *c, void *stream, const char *operation,
                         pt_error *err)
{
    if (!exchange_world(c)->ranks[c->rank].open)
        return pt_fail(err, "rank %d: %s: the rank's exchange is not open",
                       c->rank, operation);
    return exchange_wait_stream(c, (cudaStream_t)stream, operation, err);
}

static void exchange_abort(const comm *c, const char *reason)
{
    exchange_mark_failed(exchange_world(c), c->rank, reason);
}

static int exchange_failed_rank(const comm *c, char *reason,
                                size_t reason_size)
{
    comm_exchange *world = exchange_world(c);
    pthread_mutex_lock(&world->lock);
    int rank = comm_failure_get(&world->failure, reason, reason_size);
    pthread_mutex_unlock(&world->lock);
    return rank;
}

static const comm_stream_ops exchange_stream_ops = {
    .all_reduce = exchange_all_reduce_on_stream,
    .reduce_scatter = exchange_reduce_scatter_on_stream,
    .all_gather = exchange_all_gather_on_stream,
    .wait = exchange_wait,
};

static const comm_ops exchange_ops = {
    .name = "device exchange",
    .send = exchange_send,
    .recv = exchange_recv,
    .all_reduce = exchange_all_reduce,
    .all_reduce_host = exchange_all_reduce_host,
    .reduce_scatter = exchange_reduce_scatter,
    .all_gather = exchange_all_gather,
    .barrier = exchange_barrier,
    .abort = exchange_abort,
    .failed_rank = exchange_failed_rank,
    .on_stream = &exchange_stream_ops,
};

/* -------------------------------------------------------------- world */

static int check_links(int size, const link_spec *links, pt_error *err)
{
    for (int a = 0; links != NULL && a < size; a++)
        for (int b = 0; b < size; b++) {
            link_spec l = links[a * size + b];
            if (!(l.bandwidth_bytes_per_s >= 0.0) || !(l.latency_s >= 0.0) ||
                !isfinite(l.bandwidth_bytes_per_s) || !isfinite(l.latency_s))
                return pt_fail(err, "device exchange: the link between "
                                    "ranks %d and %d has bandwidth %g B/s "
                                    "and latency %g s; both must be finite "
                                    "and not negative",
                               a, b, l.bandwidth_bytes_per_s, l.latency_s);
        }
    return 0;
}

static void free_world(comm_exchange *world)
{
    for (int rank = 0; world->mailboxes != NULL && rank < world->size; rank++)
        for (comm_envelope *m = world->mailboxes[rank].head; m != NULL;) {
            comm_envelope *next = m->next;
            free(m);
            m = next;
        }
    exchange_free_channels(world);
    free(world->mailboxes);
    free(world->ranks);
    free(world->links);
    pthread_cond_destroy(&world->changed);
    pthread_mutex_destroy(&world->lock);
    free(world);
}

int comm_exchange_create(int size, const link_spec *links, double timeout_s,
                         comm_exchange **out, pt_error *err)
{
    *out = NULL;
    if (size < 2 || size > COMM_EXCHANGE_MAX_RANKS || !(timeout_s > 0.0))
        return pt_fail(err, "device exchange: needs 2 to %d ranks and a "
                            "positive timeout, got %d ranks and %g s",
                       COMM_EXCHANGE_MAX_RANKS, size, timeout_s);
    if (check_links(size, links, err) != 0)
        return -1;
    comm_exchange *world = calloc(1, sizeof *world);
    if (world == NULL)
        return pt_fail(err, "device exchange: out of memory");
    pthread_mutex_init(&world->lock, NULL);
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&world->changed, &attributes);
    pthread_condattr_destroy(&attributes);
    comm_failure_init(&world->failure);
    atomic_init(&world->failed, false);
    world->size = size;
    world->timeout_s = timeout_s;
    world->device = -1;
    size_t pairs = (size_t)size * (size_t)size;
    world->ranks = calloc((size_t)size, sizeof *world->ranks);
    world->mailboxes = calloc((size_t)size, sizeof *world->mailboxes);
    if (links != NULL) {
        world->links = malloc(pairs * sizeof *world->links);
        if (world->links != NULL)
            memcpy(world->links, links, pairs * sizeof *links);
    }
    if (world->ranks == NULL || world->mailboxes == NULL ||
        (links != NULL && world->links == NULL)) {
        free_world(world);
        return pt_fail(err, "device exchange: out of memory for %d ranks",
                       size);
    }
    *out = world;
    return 0;
}

void comm_exchange_destroy(comm_exchange *world)
{
    if (world != NULL)
        free_world(world);
}

comm comm_exchange_rank(comm_exchange *world, int rank)
{
    return (comm){.ops = &exchange_ops, .shared = world, .rank = rank,
                  .size = world->size};
}

#define OPEN_TRY(call)                                                       \
    do {                                                                     \
        cudaError_t open_status_ = (call);                                   \
        if (open_status_ != cudaSuccess)                                     \
            return pt_fail(err, "rank %d: device exchange: %s failed: %s",   \
                           rank, #call, cudaGetErrorString(open_status_));   \
    } while (0)

/* Every rank of the world works on one GPU: the first to open sets it. */
static int claim_device(comm_exchange *world, int rank, int device,
                        pt_error *err)
{
    pthread_mutex_lock(&world->lock);
    int first = world->device;
    if (first < 0)
        world->device = device;
    pthread_mutex_unlock(&world->lock);
    if (first >= 0 && first != device)
        return pt_fail(err, "rank %d: device exchange: the rank is on cuda "
                            "device %d, the others on device %d; the "
                            "exchange joins ranks of one GPU",
                       rank, device, first);
    return 0;
}

int comm_exchange_rank_open(comm_exchange *world, int rank, pt_error *err)
{
    if (rank < 0 || rank >= world->size)
        return pt_fail(err, "device exchange: no rank %d in a world of %d",
                       rank, world->size);
    exchange_rank *r = &world->ranks[rank];
    if (r->open)
        return 0;
    int device = -1;
    OPEN_TRY(cudaGetDevice(&device));
    if (claim_device(world, rank, device, err) != 0)
        return -1;
    r->device = device;
    r->open = true; /* from here on, close frees what was made */
    if (cuda_rank_stream_create(&r->stream, err) != 0)
        return -1;
    OPEN_TRY(cudaEventCreateWithFlags(&r->host_wait, cudaEventDisableTiming));
    OPEN_TRY(cudaEventCreateWithFlags(&r->caller, cudaEventDisableTiming));
    size_t bytes = EXCHANGE_STAMP_SLOTS * sizeof *r->stamps;
    if (comm_device_reserve(&r->memory, bytes, "the exchange's clock slots",
                            err) != 0)
        return -1;
    OPEN_TRY(cudaMalloc((void **)&r->stamps, bytes));
    return 0;
}

/* A sender that finishes first must not free what a receiver still
 * reads: waits (at most the comm timeout, and not once the world failed)
 * until every message of the rank was taken and its copy out enqueued,
 * then until those copies ran. */
static void drain_staging(comm_exchange *world, exchange_rank *r)
{
    struct timespec deadline = exchange_deadline(world);
    pthread_mutex_lock(&world->lock);
    for (;;) {
        bool busy = false;
        for (int i = 0; i < r->staging_count; i++)
            busy = busy || r->staging[i].in_flight;
        if (!busy || atomic_load(&world->failed) ||
            pthread_cond_timedwait(&world->changed, &world->lock,
                                   &deadline) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&world->lock);
    for (int i = 0; i < r->staging_count; i++)
        if (r->staging[i].release_recorded)
            cudaEventSynchronize(r->staging[i].released);
}

void comm_exchange_rank_close(comm_exchange *world, int rank)
{
    if (rank < 0 || rank >= world->size || !world->ranks[rank].open)
        return;
    exchange_rank *r = &world->ranks[rank];
    cudaSetDevice(r->device);
    drain_staging(world, r);
    for (int i = 0; i < r->staging_count; i++) {
        exchange_staging *b = &r->staging[i];
        comm_staging_free(&b->buffer, &r->memory);
        if (b->released != NULL)
            cudaEventDestroy(b->released);
    }
    exchange_close_channels(world, rank);
    if (r->stamps != NULL) {
        cudaFree(r->stamps);
        comm_device_release(&r->memory,
                            EXCHANGE_STAMP_SLOTS * sizeof *r->stamps);
    }
    if (r->host_wait != NULL)
        cudaEventDestroy(r->host_wait);
    if (r->caller != NULL)
        cudaEventDestroy(r->caller);
    if (r->stream != NULL)
        cudaStreamDestroy(r->stream);
    cudaGetLastError(); /* what failed here was already reported */
    exchange_rank closed = {.device = r->device,
                            .memory.peak = r->memory.peak};
    *r = closed;
}

double comm_exchange_rank_peak_bytes(comm_exchange *world, int rank)
{
    return rank >= 0 && rank < world->size
               ? world->ranks[rank].memory.peak
               : 0.0;
}
