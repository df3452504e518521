/*
 * The threads implementation of the comm interface: the ranks of a world
 * are threads of one process; a send copies the floats into a message
 * appended to the receiver's mailbox, a receive waits for the first
 * message of that peer and tag. One mutex and one condition variable
 * guard the whole world: the CPU reference moves little data and wants
 * simplicity over throughput. Collectives are built on the mailboxes
 * (gather to the group's first rank, sum in group order, send back), so
 * every member gets the same bits.
 */
#include "executor/comm/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tags of the collectives: below 0, out of the callers' range. */
enum { TAG_REDUCE = -1, TAG_BROADCAST = -2, TAG_SCATTER = -3,
       TAG_GATHER = -4 };

/* -------------------------------------------------------------- threads */

/* One message waiting in a mailbox. */
typedef struct comm_message {
    comm_envelope envelope;      /* first: the mailbox links it */
    size_t count;
    float data[];
} comm_message;

/* The shared state of a world. */
struct comm_threads {
    pthread_mutex_t lock;
    pthread_cond_t changed;      /* a message, a barrier arrival, a failure */
    int size;
    double timeout_s;
    comm_mailbox *mailboxes;     /* per receiving rank */
    comm_failure failure;        /* the first rank that failed, and why */
    int barrier_arrived;
    long barrier_generation;
};

static comm_threads *threads_world(const comm *c)
{
    return (comm_threads *)c->shared;
}

static bool has_failed(const comm_threads *world)
{
    return world->failure.rank >= 0;
}

/* Waits for a change until the deadline; on timeout marks the world
 * failed by this rank and fills err. Lock held. */
static int wait_for_change(const comm *c, const struct timespec *deadline,
                           const char *operation, pt_error *err)
{
    comm_threads *world = threads_world(c);
    int status = pthread_cond_timedwait(&world->changed, &world->lock,
                                        deadline);
    if (status != ETIMEDOUT)
        return 0;
    char reason[300];
    snprintf(reason, sizeof reason, "rank %d: %s timed out after %g s",
             c->rank, operation, world->timeout_s);
    comm_failure_mark(&world->failure, NULL, &world->changed, c->rank,
                      reason);
    return pt_fail(err, "%s", reason);
}

static int threads_post(const comm *c, int peer, int tag, const float *data,
                        size_t count, pt_error *err)
{
    comm_threads *world = threads_world(c);
    comm_message *message = malloc(sizeof *message + count * sizeof(float));
    if (message == NULL)
        return pt_fail(err, "rank %d: send to rank %d: out of memory for "
                            "%zu floats",
                       c->rank, peer, count);
    message->envelope = (comm_envelope){.source = c->rank, .tag = tag};
    message->count = count;
    if (count > 0)
        memcpy(message->data, data, count * sizeof(float));
    pthread_mutex_lock(&world->lock);
    if (has_failed(world)) {
        char operation[64];
        snprintf(operation, sizeof operation, "send to rank %d (tag %d)",
                 peer, tag);
        int status = comm_failure_interrupted(&world->failure, c->rank,
                                              operation, err);
        pthread_mutex_unlock(&world->lock);
        free(message);
        return status;
    }
    comm_mailbox_append(&world->mailboxes[peer], &message->envelope);
    pthread_cond_broadcast(&world->changed);
    pthread_mutex_unlock(&world->lock);
    return 0;
}

/* The oldest message of (peer, tag) in this rank's mailbox, unlinked, or
 * NULL; lock held. */
static comm_message *take_message(comm_threads *world, int rank, int peer,
                                  int tag)
{
    /* the envelope is the message's first member */
    return (comm_message *)comm_mailbox_take(&world->mailboxes[rank], peer,
                                             tag);
}

/* Waits for the message of (peer, tag); the caller frees it. */
static int threads_wait_message(const comm *c, int peer, int tag,
                                size_t count, comm_message **out,
                                pt_error *err)
{
    comm_threads *world = threads_world(c);
    char operation[64];
    snprintf(operation, sizeof operation, "receive from rank %d (tag %d)",
             peer, tag);
    struct timespec deadline = comm_deadline_after(world->timeout_s);
    pthread_mutex_lock(&world->lock);
    comm_message *message = NULL;
    while (message == NULL) {
        if (has_failed(world)) {
            int status = comm_failure_interrupted(&world->failure,
                                                  c->rank, operation, err);
            pthread_mutex_unlock(&world->lock);
            return status;
        }
        message = take_message(world, c->rank, peer, tag);
        if (message == NULL &&
            wait_for_change(c, &deadline, operation, err) != 0) {
            pthread_mutex_unlock(&world->lock);
            return -1;
        }
    }
    pthread_mutex_unlock(&world->lock);
    if (message->count != count) {
        size_t got = message->count;
        free(message);
        return pt_fail(err, "rank %d: %s: expected %zu floats, got %zu",
                       c->rank, operation, count, got);
    }
    *out = message;
    return 0;
}

static int threads_recv(const comm *c, int peer, int tag, float *data,
                        size_t count, pt_error *err)
{
    comm_message *message = NULL;
    if (threads_wait_message(c, peer, tag, count, &message, err) != 0)
        return -1;
    if (count > 0)
        memcpy(data, message->data, count * sizeof(float));
    free(message);
    return 0;
}

/* Gathers to group[0], which reduces in group order and sends the result
 * back to every member. Payloads travel as floats; a double is two. */
typedef enum payload_kind { PAYLOAD_FLOAT_SUM, PAYLOAD_FLOAT_MAX,
                            PAYLOAD_DOUBLE_SUM } payload_kind;

static void reduce_into(void *data, const float *incoming, size_t count,
                        payload_kind kind)
{
    if (kind == PAYLOAD_DOUBLE_SUM) {
        double *sum = data;
        for (size_t k = 0; k < count; k++) {
            double value;
            memcpy(&value, incoming + 2 * k, sizeof value);
            sum[k] += value;
        }
        return;
    }
    float *values = data;
    for (size_t k = 0; k < count; k++) {
        if (kind == PAYLOAD_FLOAT_SUM)
            values[k] += incoming[k];
        else if (incoming[k] > values[k])
            values[k] = incoming[k];
    }
}

static int threads_reduce(const comm *c, const int *group, int group_size,
                          void *data, size_t count, payload_kind kind,
                          pt_error *err)
{
    size_t floats = kind == PAYLOAD_DOUBLE_SUM ? 2 * count : count;
    float *payload = data; /* doubles are sent as their bytes */
    int root = group[0];
    if (c->rank != root)
        return threads_post(c, root, TAG_REDUCE, payload, floats, err) != 0 ||
                       threads_recv(c, root, TAG_BROADCAST, payload, floats,
                                    err) != 0
                   ? -1
                   : 0;
    for (int i = 1; i < group_size; i++) {
        comm_message *message = NULL;
        if (threads_wait_message(c, group[i], TAG_REDUCE, floats, &message,
                                 err) != 0)
            return -1;
        reduce_into(data, message->data, count, kind);
        free(message);
    }
    for (int i = 1; i < group_size; i++)
        if (threads_post(c, group[i], TAG_BROADCAST, payload, floats, err) !=
            0)
            return -1;
    return 0;
}

static int threads_all_reduce(const comm *c, const int *group, int group_size,
                              float *data, size_t count, comm_reduce_op op,
                              pt_error *err)
{
    return threads_reduce(c, group, group_size, data, count,
                          op == COMM_MAX ? PAYLOAD_FLOAT_MAX
                                         : PAYLOAD_FLOAT_SUM,
                          err);
}

static int threads_all_reduce_host(const comm *c, const int *group,
                                   int group_size, double *data, size_t count,
                                   pt_error *err)
{
    return threads_reduce(c, group, group_size, data, count,
                          PAYLOAD_DOUBLE_SUM, err);
}

/* This rank's index in the group (checked to be a member). */
static int member_index(const comm *c, const int *group, int group_size)
{
    for (int i = 0; i < group_size; i++)
        if (group[i] == c->rank)
            return i;
    return -1;
}

/* Every member sends chunk j to member j, which sums the chunks in group
 * order: the same additions, in the same order, as the all-reduce, so
 * ZeRO-1 gives bit for bit the gradients a replicated optimizer sees. */
static int threads_reduce_scatter(const comm *c, const int *group,
                                  int group_size, float *data,
                                  const size_t *offsets, pt_error *err)
{
    int me = member_index(c, group, group_size);
    for (int j = 0; j < group_size; j++)
        if (j != me && threads_post(c, group[j], TAG_SCATTER, data + offsets[j],
                                    offsets[j + 1] - offsets[j], err) != 0)
            return -1;
    size_t count = offsets[me + 1] - offsets[me];
    float *mine = data + offsets[me];
    float *own = malloc((count + 1) * sizeof *own);
    if (own == NULL)
        return pt_fail(err, "rank %d: reduce-scatter: out of memory for "
                            "%zu floats",
                       c->rank, count);
    memcpy(own, mine, count * sizeof *own);
    int status = 0;
    for (int i = 0; i < group_size && status == 0; i++) {
        const float *incoming = own;
        comm_message *message = NULL;
        if (i != me) {
            status = threads_wait_message(c, group[i], TAG_SCATTER, count,
                                          &message, err);
            if (status != 0)
                break;
            incoming = message->data;
        }
        if (i == 0)
            memcpy(mine, incoming, count * sizeof *mine);
        else
            reduce_into(mine, incoming, count, PAYLOAD_FLOAT_SUM);
        free(message);
    }
    free(own);
    return status;
}

static int threads_all_gather(const comm *c, const int *group,
                              int group_size, float *data,
                              const size_t *offsets, pt_error *err)
{
    int me = member_index(c, group, group_size);
    size_t count = offsets[me + 1] - offsets[me];
    for (int j = 0; j < group_size; j++)
        if (j != me && threads_post(c, group[j], TAG_GATHER,
                                    data + offsets[me], count, err) != 0)
            return -1;
    for (int i = 0; i < group_size; i++)
        if (i != me && threads_recv(c, group[i], TAG_GATHER,
                                    data + offsets[i],
                                    offsets[i + 1] - offsets[i], err) != 0)
            return -1;
    return 0;
}

static int threads_barrier(const comm *c, pt_error *err)
{
    comm_threads *world = threads_world(c);
    struct timespec deadline = comm_deadline_after(world->timeout_s);
    pthread_mutex_lock(&world->lock);
    long generation = world->barrier_generation;
    if (!has_failed(world) && ++world->barrier_arrived == world->size) {
        world->barrier_arrived = 0;
        world->barrier_generation++;
        pthread_cond_broadcast(&world->changed);
    }
    while (world->barrier_generation == generation) {
        if (has_failed(world)) {
            int status = comm_failure_interrupted(&world->failure,
                                                  c->rank, "barrier", err);
            pthread_mutex_unlock(&world->lock);
            return status;
        }
        if (wait_for_change(c, &deadline, "barrier", err) != 0) {
            pthread_mutex_unlock(&world->lock);
            return -1;
        }
    }
    pthread_mutex_unlock(&world->lock);
    return 0;
}

static void threads_abort(const comm *c, const char *reason)
{
    comm_threads *world = threads_world(c);
    pthread_mutex_lock(&world->lock);
    comm_failure_mark(&world->failure, NULL, &world->changed, c->rank,
                      reason);
    pthread_mutex_unlock(&world->lock);
}

static int threads_failed_rank(const comm *c, char *reason,
                               size_t reason_size)
{
    return comm_threads_failed_rank(threads_world(c), reason, reason_size);
}

static const comm_ops threads_ops = {
    .name = "threads",
    .send = threads_post,
    .recv = threads_recv,
    .all_reduce = threads_all_reduce,
    .all_reduce_host = threads_all_reduce_host,
    .reduce_scatter = threads_reduce_scatter,
    .all_gather = threads_all_gather,
    .barrier = threads_barrier,
    .abort = threads_abort,
    .failed_rank = threads_failed_rank,
};

int comm_threads_create(int size, double timeout_s, comm_threads **out,
                        pt_error *err)
{
    *out = NULL;
    if (size < 1 || !(timeout_s > 0.0))
        return pt_fail(err, "threads comm: needs at least 1 rank and a "
                            "positive timeout, got %d ranks and %g s",
                       size, timeout_s);
    comm_threads *world = calloc(1, sizeof *world);
    if (world == NULL)
        return pt_fail(err, "threads comm: out of memory");
    world->size = size;
    world->timeout_s = timeout_s;
    world->mailboxes = calloc((size_t)size, sizeof *world->mailboxes);
    pthread_condattr_t attributes;
    bool ready = world->mailboxes != NULL &&
                 pthread_condattr_init(&attributes) == 0;
    if (ready) {
        /* timed waits count on the monotonic clock, as deadline_after */
        ready = pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC) ==
                    0 &&
                pthread_cond_init(&world->changed, &attributes) == 0;
        pthread_condattr_destroy(&attributes);
    }
    if (!ready) {
        free(world->mailboxes);
        free(world);
        return pt_fail(err, "threads comm: cannot set up %d ranks", size);
    }
    pthread_mutex_init(&world->lock, NULL);
    comm_failure_init(&world->failure);
    *out = world;
    return 0;
}

void comm_threads_destroy(comm_threads *world)
{
    if (world == NULL)
        return;
    for (int rank = 0; rank < world->size; rank++) {
        comm_envelope *m = world->mailboxes[rank].head;
        while (m != NULL) {
            comm_envelope *next = m->next;
            free(m);
            m = next;
        }
    }
    free(world->mailboxes);
    pthread_cond_destroy(&world->changed);
    pthread_mutex_destroy(&world->lock);
    free(world);
}

comm comm_threads_rank(comm_threads *world, int rank)
{
    comm handle = {.ops = &threads_ops, .shared = world, .rank = rank,
                   .size = world->size};
    return handle;
}

int comm_threads_failed_rank(comm_threads *world, char *reason,
                             size_t reason_size)
{
    pthread_mutex_lock(&world->lock);
    int rank = comm_failure_get(&world->failure, reason, reason_size);
    pthread_mutex_unlock(&world->lock);
    return rank;
}
