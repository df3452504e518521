/*
 * The bottom of the device exchange (executor/comm/comm.h): how its
 * operations fail and wait. A failure is recorded once for the world
 * (the first wins) and wakes every waiting rank; every wait watches the
 * failure flag and a deadline (the comm timeout), on the host (the
 * world's condition variable) or on the GPU (a polled event). Also the
 * GPU clock slots and the emulated links' times that pacing uses. The
 * messages and the world are comm/exchange.c's, the collectives
 * comm/exchange_collectives.c's; both build on this file.
 */
#include "executor/comm/device_internal.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

/* ------------------------------------------------------ failures, waits */

void exchange_mark_failed(comm_exchange *world, int rank,
                          const char *reason)
{
    pthread_mutex_lock(&world->lock);
    comm_failure_mark(&world->failure, &world->failed, &world->changed, rank,
                      reason);
    pthread_mutex_unlock(&world->lock);
}

int exchange_fail(const comm *c, const char *operation, const char *what,
                  pt_error *err)
{
    char reason[COMM_FAILURE_REASON_MAX];
    snprintf(reason, sizeof reason, "rank %d: %s: %s", c->rank, operation,
             what);
    exchange_mark_failed(exchange_world(c), c->rank, reason);
    return pt_fail(err, "%s", reason);
}

int exchange_interrupted(const comm *c, const char *operation,
                         pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    pthread_mutex_lock(&world->lock);
    comm_failure failure = world->failure;
    pthread_mutex_unlock(&world->lock);
    return comm_failure_interrupted(&failure, c->rank, operation, err);
}

int exchange_cuda(const comm *c, cudaError_t status, const char *call,
                  const char *operation, pt_error *err)
{
    if (status == cudaSuccess)
        return 0;
    char what[400];
    comm_cuda_describe(what, sizeof what, call, status);
    return exchange_fail(c, operation, what, err);
}

struct timespec exchange_deadline(const comm_exchange *world)
{
    return comm_deadline_after(world->timeout_s);
}

int exchange_wait_change(const comm *c, const struct timespec *deadline,
                         const char *operation, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    if (pthread_cond_timedwait(&world->changed, &world->lock, deadline) !=
        ETIMEDOUT)
        return 0;
    char reason[COMM_FAILURE_REASON_MAX];
    snprintf(reason, sizeof reason, "rank %d: %s timed out after %g s (the "
                                    "comm timeout)",
             c->rank, operation, world->timeout_s);
    comm_failure_mark(&world->failure, &world->failed, &world->changed,
                      c->rank, reason);
    return pt_fail(err, "%s", reason);
}

/* Between polls of an event: spin at first (most exchanges end within
 * microseconds), then nap. */
static void back_off(long polls)
{
    if (polls < 2000)
        return;
    struct timespec pause = {.tv_sec = 0,
                             .tv_nsec = polls < 100000 ? 20000 : 1000000};
    nanosleep(&pause, NULL);
}

int exchange_wait_stream(const comm *c, cudaStream_t stream,
                         const char *operation, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    exchange_rank *r = &world->ranks[c->rank];
    if (EXCHANGE_CUDA(cudaEventRecord(r->host_wait, stream)) != 0)
        return -1;
    double deadline = pt_monotonic_seconds() + world->timeout_s;
    for (long polls = 0;; polls++) {
        cudaError_t status = cudaEventQuery(r->host_wait);
        if (status == cudaSuccess)
            return 0;
        if (status != cudaErrorNotReady)
            return EXCHANGE_CUDA(status);
        if (atomic_load(&world->failed))
            return exchange_interrupted(c, operation, err);
        if (pt_monotonic_seconds() > deadline) {
            char what[120];
            snprintf(what, sizeof what, "the GPU did not finish within %g s "
                                        "(the comm timeout)",
                     world->timeout_s);
            return exchange_fail(c, operation, what, err);
        }
        back_off(polls);
    }
}

uint64_t *exchange_next_stamp(exchange_rank *r)
{
    uint64_t *slot = r->stamps + r->next_stamp;
    r->next_stamp = (r->next_stamp + 1) % EXCHANGE_STAMPS;
    return slot;
}

uint64_t exchange_pace_nanoseconds(double seconds)
{
    if (!(seconds > 0.0))
        return 0;
    double ns = seconds * 1e9 + 0.5;
    return ns >= 1.8e19 ? UINT64_MAX : (uint64_t)ns;
}

double comm_emulated_seconds(comm_pattern pattern, double bytes, int members,
                             link_spec link)
{
    if (bytes <= 0.0 || members < 2 || !(link.bandwidth_bytes_per_s > 0.0))
        return 0.0;
    double n = members, transfer = bytes / link.bandwidth_bytes_per_s;
    switch (pattern) {
    case COMM_PATTERN_MESSAGE:
        return link.latency_s + transfer;
    case COMM_PATTERN_ALL_REDUCE:
        return 2.0 * (n - 1.0) / n * transfer + 2.0 * (n - 1.0) *
                                                    link.latency_s;
    case COMM_PATTERN_HALF_ALL_REDUCE:
        return (n - 1.0) / n * transfer + (n - 1.0) * link.latency_s;
    }
    return 0.0;
}

