/*
 * The comm interface (executor/comm/comm.h): the comm_* wrappers, which
 * check their arguments and dispatch to an implementation's table, and
 * what the implementations share (comm/internal.h): mailboxes of
 * messages and the record of a world's first failure.
 */
#include "executor/comm/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ interface */

static int check_peer(const comm *c, int peer, const char *what,
                      pt_error *err)
{
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return pt_fail(err, "rank %d: %s: peer %d is not another rank of "
                            "the %d",
                       c->rank, what, peer, c->size);
    return 0;
}

int comm_send(const comm *c, int peer, int tag, const float *data,
              size_t count, pt_error *err)
{
    if (check_peer(c, peer, "send", err) != 0)
        return -1;
    if (tag < 0 || (data == NULL && count > 0))
        return pt_fail(err, "rank %d: send to rank %d: tag %d must be >= 0 "
                            "and data given",
                       c->rank, peer, tag);
    return c->ops->send(c, peer, tag, data, count, err);
}

int comm_recv(const comm *c, int peer, int tag, float *data, size_t count,
              pt_error *err)
{
    if (check_peer(c, peer, "receive", err) != 0)
        return -1;
    if (tag < 0 || (data == NULL && count > 0))
        return pt_fail(err, "rank %d: receive from rank %d: tag %d must be "
                            ">= 0 and data given",
                       c->rank, peer, tag);
    return c->ops->recv(c, peer, tag, data, count, err);
}

int comm_sendrecv(const comm *c, int send_peer, int send_tag,
                  const float *send_data, size_t send_count, int recv_peer,
                  int recv_tag, float *recv_data, size_t recv_count,
                  pt_error *err)
{
    if (check_peer(c, send_peer, "send", err) != 0 ||
        check_peer(c, recv_peer, "receive", err) != 0)
        return -1;
    if (send_tag < 0 || recv_tag < 0 ||
        (send_data == NULL && send_count > 0) ||
        (recv_data == NULL && recv_count > 0))
        return pt_fail(err, "rank %d: send to rank %d (tag %d) with receive "
                            "from rank %d (tag %d): tags must be >= 0 and "
                            "data given",
                       c->rank, send_peer, send_tag, recv_peer, recv_tag);
    if (c->ops->sendrecv == NULL)
        return c->ops->send(c, send_peer, send_tag, send_data, send_count,
                            err) != 0 ||
                       c->ops->recv(c, recv_peer, recv_tag, recv_data,
                                    recv_count, err) != 0
                   ? -1
                   : 0;
    return c->ops->sendrecv(c, send_peer, send_tag, send_data, send_count,
                            recv_peer, recv_tag, recv_data, recv_count, err);
}

static int check_group(const comm *c, const int *group, int group_size,
                       pt_error *err)
{
    bool member = false;
    for (int i = 0; i < group_size; i++) {
        if (group[i] < 0 || group[i] >= c->size)
            return pt_fail(err, "rank %d: all-reduce: group member %d is "
                                "not a rank of the %d",
                           c->rank, group[i], c->size);
        for (int j = 0; j < i; j++)
            if (group[j] == group[i])
                return pt_fail(err, "rank %d: all-reduce: rank %d appears "
                                    "twice in the group",
                               c->rank, group[i]);
        member = member || group[i] == c->rank;
    }
    if (!member)
        return pt_fail(err, "rank %d: all-reduce over a group of %d ranks "
                            "it is not in",
                       c->rank, group_size);
    return 0;
}

/* The checks every all-reduce wrapper makes: 1 when there is nothing to
 * reduce (a group of one, no elements), 0 to go on, -1 on bad input. */
static int check_reduce(const comm *c, const int *group, int group_size,
                        bool has_data, size_t count, pt_error *err)
{
    if (check_group(c, group, group_size, err) != 0)
        return -1;
    if (!has_data && count > 0)
        return pt_fail(err, "rank %d: all-reduce without data", c->rank);
    return group_size == 1 || count == 0 ? 1 : 0;
}

static int all_reduce(const comm *c, const int *group, int group_size,
                      float *data, size_t count, comm_reduce_op op,
                      pt_error *err)
{
    int checked = check_reduce(c, group, group_size, data != NULL, count, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    return c->ops->all_reduce(c, group, group_size, data, count, op, err);
}

int comm_all_reduce_sum(const comm *c, const int *group, int group_size,
                        float *data, size_t count, pt_error *err)
{
    return all_reduce(c, group, group_size, data, count, COMM_SUM, err);
}

int comm_all_reduce_max(const comm *c, const int *group, int group_size,
                        float *data, size_t count, pt_error *err)
{
    return all_reduce(c, group, group_size, data, count, COMM_MAX, err);
}

int comm_all_reduce_host(const comm *c, const int *group, int group_size,
                         double *data, size_t count, pt_error *err)
{
    int checked = check_reduce(c, group, group_size, data != NULL, count, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    return c->ops->all_reduce_host(c, group, group_size, data, count, err);
}

/* The wrappers' checks for the chunked collectives: offsets run from 0,
 * never decrease. 1: nothing to move; 0: go on; -1: bad input. */
static int check_chunked(const comm *c, const char *what, const int *group,
                         int group_size, const void *data,
                         const size_t *chunk_offsets, pt_error *err)
{
    if (check_group(c, group, group_size, err) != 0)
        return -1;
    if (chunk_offsets == NULL || chunk_offsets[0] != 0)
        return pt_fail(err, "rank %d: %s: chunk offsets must start at 0",
                       c->rank, what);
    for (int i = 0; i < group_size; i++)
        if (chunk_offsets[i + 1] < chunk_offsets[i])
            return pt_fail(err, "rank %d: %s: chunk %d ends (%zu) before it "
                                "starts (%zu)",
                           c->rank, what, i, chunk_offsets[i + 1],
                           chunk_offsets[i]);
    size_t count = chunk_offsets[group_size];
    if (data == NULL && count > 0)
        return pt_fail(err, "rank %d: %s without data", c->rank, what);
    return group_size == 1 || count == 0 ? 1 : 0;
}

int comm_reduce_scatter_sum(const comm *c, const int *group, int group_size,
                            float *data, const size_t *chunk_offsets,
                            pt_error *err)
{
    int checked = check_chunked(c, "reduce-scatter", group, group_size, data,
                                chunk_offsets, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    return c->ops->reduce_scatter(c, group, group_size, data, chunk_offsets,
                                  err);
}

int comm_all_gather(const comm *c, const int *group, int group_size,
                    float *data, const size_t *chunk_offsets, pt_error *err)
{
    int checked = check_chunked(c, "all-gather", group, group_size, data,
                                chunk_offsets, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    return c->ops->all_gather(c, group, group_size, data, chunk_offsets,
                              err);
}

int comm_barrier(const comm *c, pt_error *err)
{
    return c->ops->barrier(c, err);
}

bool comm_has_stream_ops(const comm *c)
{
    return c->ops->on_stream != NULL;
}

/* 0 when c has stream-ordered collectives and a stream was given. */
static int check_stream(const comm *c, const void *stream, const char *what,
                        pt_error *err)
{
    if (c->ops->on_stream == NULL)
        return pt_fail(err, "rank %d: %s on a stream: the %s comm has no "
                            "stream-ordered collectives",
                       c->rank, what, c->ops->name);
    if (stream == NULL)
        return pt_fail(err, "rank %d: %s on a stream: no stream given",
                       c->rank, what);
    return 0;
}

/* A stream all-reduce, checked; lean: on the group's lean communicator
 * where the comm has one. */
static int all_reduce_on_stream(const comm *c, const int *group,
                                int group_size, void *data, size_t count,
                                comm_element type, comm_reduce_op op,
                                void *stream, bool lean, pt_error *err)
{
    if (check_stream(c, stream, "all-reduce", err) != 0)
        return -1;
    int checked = check_reduce(c, group, group_size, data != NULL, count, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    const comm_stream_ops *ops = c->ops->on_stream;
    return (lean && ops->all_reduce_lean != NULL ? ops->all_reduce_lean
                                                 : ops->all_reduce)(
        c, group, group_size, data, count, type, op, stream, err);
}

int comm_all_reduce_on_stream(const comm *c, const int *group,
                              int group_size, void *data, size_t count,
                              comm_element type, comm_reduce_op op,
                              void *stream, pt_error *err)
{
    return all_reduce_on_stream(c, group, group_size, data, count, type, op,
                                stream, false, err);
}

int comm_all_reduce_on_stream_lean(const comm *c, const int *group,
                                   int group_size, void *data, size_t count,
                                   comm_element type, comm_reduce_op op,
                                   void *stream, pt_error *err)
{
    return all_reduce_on_stream(c, group, group_size, data, count, type, op,
                                stream, true, err);
}

int comm_reduce_scatter_on_stream(const comm *c, const int *group,
                                  int group_size, void *data,
                                  const size_t *chunk_offsets,
                                  comm_element type, void *stream,
                                  pt_error *err)
{
    if (check_stream(c, stream, "reduce-scatter", err) != 0)
        return -1;
    int checked = check_chunked(c, "reduce-scatter", group, group_size, data,
                                chunk_offsets, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    return c->ops->on_stream->reduce_scatter(c, group, group_size, data,
                                             chunk_offsets, type, stream,
                                             err);
}

int comm_all_gather_on_stream(const comm *c, const int *group,
                              int group_size, void *data,
                              const size_t *chunk_offsets, comm_element type,
                              void *stream, pt_error *err)
{
    if (check_stream(c, stream, "all-gather", err) != 0)
        return -1;
    int checked = check_chunked(c, "all-gather", group, group_size, data,
                                chunk_offsets, err);
    if (checked != 0)
        return checked < 0 ? -1 : 0;
    return c->ops->on_stream->all_gather(c, group, group_size, data,
                                         chunk_offsets, type, stream, err);
}

int comm_wait_stream(const comm *c, void *stream, const char *operation,
                     pt_error *err)
{
    if (check_stream(c, stream, "wait", err) != 0)
        return -1;
    return c->ops->on_stream->wait(c, stream, operation, err);
}

void comm_abort(const comm *c, const char *reason)
{
    c->ops->abort(c, reason);
}

int comm_failed_rank(const comm *c, char *reason, size_t reason_size)
{
    return c->ops->failed_rank(c, reason, reason_size);
}

void comm_groups_free(comm_groups *groups)
{
    free(groups->offsets);
    free(groups->members);
    memset(groups, 0, sizeof *groups);
}

/* ------------------------------------------------------------ mailboxes */

struct timespec comm_deadline_after(double seconds)
{
    double at = pt_monotonic_seconds() + seconds;
    double whole = (double)(long)at;
    struct timespec when = {.tv_sec = (time_t)whole,
                            .tv_nsec = (long)((at - whole) * 1e9)};
    if (when.tv_nsec >= 1000000000L) {
        when.tv_sec += 1;
        when.tv_nsec -= 1000000000L;
    }
    return when;
}

void comm_mailbox_append(comm_mailbox *box, comm_envelope *message)
{
    message->next = NULL;
    if (box->tail == NULL)
        box->head = message;
    else
        box->tail->next = message;
    box->tail = message;
}

comm_envelope *comm_mailbox_take(comm_mailbox *box, int source, int tag)
{
    comm_envelope *previous = NULL;
    for (comm_envelope *m = box->head; m != NULL; previous = m, m = m->next) {
        if (m->source != source || m->tag != tag)
            continue;
        if (previous == NULL)
            box->head = m->next;
        else
            previous->next = m->next;
        if (box->tail == m)
            box->tail = previous;
        return m;
    }
    return NULL;
}

/* ------------------------------------------------------ the first failure */

void comm_failure_init(comm_failure *failure)
{
    failure->rank = -1;
    failure->reason[0] = '\0';
}

bool comm_failure_record(comm_failure *failure, int rank, const char *reason)
{
    if (failure->rank >= 0)
        return false;
    failure->rank = rank;
    snprintf(failure->reason, sizeof failure->reason, "%s", reason);
    return true;
}

bool comm_failure_mark(comm_failure *failure, atomic_bool *failed,
                       pthread_cond_t *changed, int rank, const char *reason)
{
    if (!comm_failure_record(failure, rank, reason))
        return false;
    if (failed != NULL)
        atomic_store(failed, true);
    if (changed != NULL)
        pthread_cond_broadcast(changed);
    return true;
}

int comm_failure_get(const comm_failure *failure, char *reason,
                     size_t reason_size)
{
    if (reason != NULL && reason_size > 0)
        snprintf(reason, reason_size, "%s",
                 failure->rank >= 0 ? failure->reason : "");
    return failure->rank;
}

int comm_failure_interrupted(const comm_failure *failure, int rank,
                             const char *operation, pt_error *err)
{
    if (failure->rank == rank)
        return pt_fail(err, "rank %d: %s: this rank already failed: %s",
                       rank, operation, failure->reason);
    return pt_fail(err, "rank %d: %s interrupted: rank %d failed: %s", rank,
                   operation, failure->rank, failure->reason);
}
