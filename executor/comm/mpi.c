/*
 * The MPI implementation of the comm interface: one process per rank,
 * started by mpirun or srun, buffers in host memory (executor.h, "The MPI
 * implementation"). Built on MPI's non-blocking calls so that every wait
 * is a poll that also watches for the other ranks' abort notices and for
 * a deadline: a silent or dead peer becomes an error naming it and the
 * operation, and a rank that fails takes the others down within a poll.
 *
 * Three duplicates of MPI_COMM_WORLD keep the traffic apart: messages
 * (the caller's tags), collectives over the world, abort notices. Each
 * group the runtime runs collectives over gets its own communicator,
 * made once (MPI_Comm_split, member i of the group is its rank i, so
 * chunk i of a reduce-scatter is member i's).
 *
 * A process's MPI calls come from its rank's thread during a step and
 * from the main thread between steps, never at once: MPI_THREAD_SERIALIZED
 * is enough.
 */
#include "executor/comm/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PARTITA_HAVE_MPI

static int not_built(pt_error *err)
{
    return pt_fail(err, "this partita was built without MPI, so it cannot "
                        "run one process per rank (install Open MPI, "
                        "Debian's libopenmpi-dev, and rebuild; or run every "
                        "rank as a thread of one process: --launch "
                        "threads)");
}

bool comm_mpi_built(void) { return false; }

int comm_mpi_create(double timeout_s, comm_mpi **out, pt_error *err)
{
    (void)timeout_s;
    *out = NULL;
    return not_built(err);
}

comm comm_mpi_handle(comm_mpi *world)
{
    (void)world;
    return (comm){.ops = NULL};
}

int comm_mpi_local_rank(const comm_mpi *world)
{
    (void)world;
    return 0;
}

int comm_mpi_local_size(const comm_mpi *world)
{
    (void)world;
    return 1;
}

int comm_mpi_set_groups(comm_mpi *world, const comm_groups *groups,
                        pt_error *err)
{
    (void)world;
    (void)groups;
    return not_built(err);
}

int comm_mpi_gather(const comm *c, const void *data, size_t bytes,
                    void *gathered, pt_error *err)
{
    (void)c;
    (void)data;
    (void)bytes;
    (void)gathered;
    return not_built(err);
}

int comm_mpi_broadcast(const comm *c, void *data, size_t bytes,
                       pt_error *err)
{
    (void)c;
    (void)data;
    (void)bytes;
    return not_built(err);
}

void comm_mpi_finish(comm_mpi *world, int exit_status)
{
    (void)world;
    (void)exit_status;
}

#else /* PARTITA_HAVE_MPI */

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

/* The largest count one MPI call takes (its counts are ints). */
#define MPI_MAX_CHUNK (1 << 30)
/* The longest abort reason sent to the other ranks: what a failure
 * keeps, so that sender and receiver agree. */
#define ABORT_REASON_MAX COMM_FAILURE_REASON_MAX

/* A send the peer has not taken yet: its copy lives until MPI is done. */
typedef struct pending_send {
    MPI_Request request;
    float *copy;
} pending_send;

/* A group of ranks that runs collectives, with its communicator
 * (MPI_COMM_NULL in the processes outside it). */
typedef struct mpi_group {
    int size;
    int *members;
    MPI_Comm comm;
} mpi_group;

struct comm_mpi {
    MPI_Comm messages;
    MPI_Comm collectives;
    MPI_Comm aborts;
    int rank;
    int size;
    int local_rank;
    int local_size;
    double timeout_s;
    pending_send *sends;
    int send_count;
    int send_capacity;
    mpi_group *groups;
    int group_count;
    comm_failure failure;        /* the first rank that failed, and why */
    MPI_Request *abort_requests; /* size: our notice to each peer */
};

static comm_mpi *mpi_world(const comm *c)
{
    return (comm_mpi *)c->shared;
}

/* Spins briefly, then sleeps up to a millisecond: a wait must not eat
 * the core that a rank of the same host computes on. */
static void pause_poll(long polls)
{
    if (polls < 64) {
        sched_yield();
        return;
    }
    long micros = polls < 1000 ? 50 : 1000;
    struct timespec pause = {.tv_sec = 0, .tv_nsec = micros * 1000L};
    nanosleep(&pause, NULL);
}

static bool has_failed(const comm_mpi *w)
{
    return w->failure.rank >= 0;
}

/* Our failure to every other rank; nobody waits for these notices (the
 * peer may be dead), MPI_Abort or MPI_Finalize ends them. */
static void notify_others(comm_mpi *w)
{
    int length = (int)strlen(w->failure.reason) + 1;
    for (int peer = 0; peer < w->size; peer++)
        if (peer != w->rank &&
            w->abort_requests[peer] == MPI_REQUEST_NULL)
            MPI_Isend(w->failure.reason, length, MPI_CHAR, peer, 0,
                      w->aborts, &w->abort_requests[peer]);
}

/* Takes the abort notices that arrived; the first one names the rank
 * that failed (unless this rank failed before). */
static void poll_aborts(comm_mpi *w)
{
    for (;;) {
        int arrived = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, 0, w->aborts, &arrived, &status) !=
                MPI_SUCCESS ||
            !arrived)
            return;
        char reason[ABORT_REASON_MAX];
        MPI_Recv(reason, ABORT_REASON_MAX, MPI_CHAR, status.MPI_SOURCE, 0,
                 w->aborts, MPI_STATUS_IGNORE);
        reason[ABORT_REASON_MAX - 1] = '\0';
        comm_failure_record(&w->failure, status.MPI_SOURCE, reason);
    }
}

/* Frees the copies of sends the peers have taken. */
static void progress_sends(comm_mpi *w)
{
    for (int i = 0; i < w->send_count;) {
        int done = 0;
        MPI_Test(&w->sends[i].request, &done, MPI_STATUS_IGNORE);
        if (!done) {
            i++;
            continue;
        }
        free(w->sends[i].copy);
        w->sends[i] = w->sends[--w->send_count];
    }
}

/* This rank fails: record it, tell the others, fill err. */
static int fail_here(const comm *c, pt_error *err, const char *format,
                     const char *operation, const char *detail)
{
    comm_mpi *w = mpi_world(c);
    char reason[ABORT_REASON_MAX];
    snprintf(reason, sizeof reason, format, c->rank, operation, detail);
    comm_failure_record(&w->failure, c->rank, reason);
    notify_others(w);
    return pt_fail(err, "%s", reason);
}

static int fail_transport(const comm *c, const char *operation, int code,
                          pt_error *err)
{
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", code);
    return fail_here(c, err, "rank %d: %s: %s", operation, text);
}

static int fail_timeout(const comm *c, const char *operation,
                        pt_error *err)
{
    char detail[64];
    snprintf(detail, sizeof detail, "%g s", mpi_world(c)->timeout_s);
    return fail_here(c, err, "rank %d: %s timed out after %s", operation,
                     detail);
}

/* Polls until `ready` says the operation can finish, another rank failed
 * or the deadline passed. */
typedef int (*ready_check)(void *state, int *ready);

static int poll_until(const comm *c, ready_check ready, void *state,
                      const char *operation, pt_error *err)
{
    comm_mpi *w = mpi_world(c);
    double deadline = pt_monotonic_seconds() + w->timeout_s;
    for (long polls = 0;; polls++) {
        poll_aborts(w);
        if (has_failed(w))
            return comm_failure_interrupted(&w->failure, c->rank,
                                            operation, err);
        int done = 0;
        int code = ready(state, &done);
        if (code != MPI_SUCCESS)
            return fail_transport(c, operation, code, err);
        if (done)
            return 0;
        if (polls % 64 == 63)
            progress_sends(w);
        if (pt_monotonic_seconds() > deadline)
            return fail_timeout(c, operation, err);
        pause_poll(polls);
    }
}

static int request_done(void *state, int *done)
{
    return MPI_Test(state, done, MPI_STATUS_IGNORE);
}

/* Waits for a collective's request. One left behind after a failure is
 * never completed: the job ends with MPI_Abort then. */
static int wait_request(const comm *c, MPI_Request *request,
                        const char *operation, pt_error *err)
{
    return poll_until(c, request_done, request, operation, err);
}

/* ------------------------------------------------------ point to point */

static int check_message_count(const comm *c, const char *operation,
                               size_t count, pt_error *err)
{
    if (count > INT_MAX)
        return pt_fail(err, "rank %d: %s: %zu floats is more than one MPI "
                            "message carries (%d)",
                       c->rank, operation, count, INT_MAX);
    return 0;
}

static int grow_sends(comm_mpi *w)
{
    if (w->send_count < w->send_capacity)
        return 0;
    int capacity = w->send_capacity > 0 ? 2 * w->send_capacity : 16;
    pending_send *grown = realloc(w->sends, (size_t)capacity * sizeof *grown);
    if (grown == NULL)
        return -1;
    w->sends = grown;
    w->send_capacity = capacity;
    return 0;
}

static int mpi_send(const comm *c, int peer, int tag, const float *data,
                    size_t count, pt_error *err)
{
    comm_mpi *w = mpi_world(c);
    char operation[64];
    snprintf(operation, sizeof operation, "send to rank %d (tag %d)", peer,
             tag);
    poll_aborts(w);
    if (has_failed(w))
        return comm_failure_interrupted(&w->failure, c->rank, operation,
                                        err);
    if (check_message_count(c, operation, count, err) != 0)
        return -1;
    progress_sends(w);
    float *copy = malloc(count * sizeof *copy + 1);
    if (copy == NULL || grow_sends(w) != 0) {
        free(copy);
        return pt_fail(err, "rank %d: %s: out of memory for %zu floats",
                       c->rank, operation, count);
    }
    if (count > 0)
        memcpy(copy, data, count * sizeof *copy);
    pending_send *send = &w->sends[w->send_count];
    int code = MPI_Isend(copy, (int)count, MPI_FLOAT, peer, tag, w->messages,
                         &send->request);
    if (code != MPI_SUCCESS) {
        free(copy);
        return fail_transport(c, operation, code, err);
    }
    send->copy = copy;
    w->send_count++;
    return 0;
}

/* What a receive polls: whether the peer's message under the tag came. */
typedef struct probe_state {
    comm_mpi *w;
    int peer;
    int tag;
    MPI_Status status;
} probe_state;

static int message_arrived(void *state, int *done)
{
    probe_state *probe = state;
    return MPI_Iprobe(probe->peer, probe->tag, probe->w->messages, done,
                      &probe->status);
}

static int mpi_recv(const comm *c, int peer, int tag, float *data,
                    size_t count, pt_error *err)
{
    comm_mpi *w = mpi_world(c);
    char operation[64];
    snprintf(operation, sizeof operation, "receive from rank %d (tag %d)",
             peer, tag);
    if (check_message_count(c, operation, count, err) != 0)
        return -1;
    probe_state probe = {.w = w, .peer = peer, .tag = tag};
    if (poll_until(c, message_arrived, &probe, operation, err) != 0)
        return -1;
    int arrived = 0;
    MPI_Get_count(&probe.status, MPI_FLOAT, &arrived);
    if (arrived != (int)count) {
        char detail[96];
        snprintf(detail, sizeof detail, "expected %zu floats, got %d", count,
                 arrived);
        return fail_here(c, err, "rank %d: %s: %s", operation, detail);
    }
    int code = MPI_Recv(data, (int)count, MPI_FLOAT, peer, tag, w->messages,
                        MPI_STATUS_IGNORE);
    return code == MPI_SUCCESS ? 0 : fail_transport(c, operation, code, err);
}

/* --------------------------------------------------------- collectives */

/* "all-reduce over ranks 0, 2, 4": the operation and its group, so
 * that a timeout names the ranks one of which did not join. */
static void name_collective(char *out, size_t size, const char *what,
                            const int *group, int group_size)
{
    int shown = group_size < 8 ? group_size : 8;
    size_t used = (size_t)snprintf(out, size, "%s over ranks", what);
    for (int i = 0; i < shown && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s %d",
                                 i > 0 ? "," : "", group[i]);
    if (group_size > shown && used < size)
        snprintf(out + used, size - used, ", ... (%d in all)", group_size);
}

/* The communicator of a group: the world's for every rank in rank order,
 * else the one comm_mpi_set_groups made for exactly these members. */
static int group_comm(const comm *c, const int *group, int group_size,
                      const char *operation, MPI_Comm *out, pt_error *err)
{
    comm_mpi *w = mpi_world(c);
    bool whole_world = group_size == w->size;
    for (int i = 0; whole_world && i < group_size; i++)
        whole_world = group[i] == i;
    if (whole_world) {
        *out = w->collectives;
        return 0;
    }
    for (int g = 0; g < w->group_count; g++)
        if (w->groups[g].size == group_size &&
            memcmp(w->groups[g].members, group,
                   (size_t)group_size * sizeof *group) == 0 &&
            w->groups[g].comm != MPI_COMM_NULL) {
            *out = w->groups[g].comm;
            return 0;
        }
    return pt_fail(err, "rank %d: %s: no MPI communicator was made for "
                        "this group of %d ranks starting at rank %d (the "
                        "runtime's groups are set up once: "
                        "comm_mpi_set_groups)",
                   c->rank, operation, group_size, group[0]);
}

static int reduce_chunks(const comm *c, const int *group, int group_size,
                         void *data, size_t count, MPI_Datatype type,
                         size_t element_bytes, MPI_Op op,
                         const char *operation, pt_error *err)
{
    MPI_Comm comm;
    if (group_comm(c, group, group_size, operation, &comm, err) != 0)
        return -1;
    for (size_t done = 0; done < count;) {
        size_t chunk = count - done < MPI_MAX_CHUNK ? count - done
                                                    : MPI_MAX_CHUNK;
        MPI_Request request;
        int code = MPI_Iallreduce(MPI_IN_PLACE,
                                  (char *)data + done * element_bytes,
                                  (int)chunk, type, op, comm, &request);
        if (code != MPI_SUCCESS)
            return fail_transport(c, operation, code, err);
        if (wait_request(c, &request, operation, err) != 0)
            return -1;
        done += chunk;
    }
    return 0;
}

static int mpi_all_reduce(const comm *c, const int *group, int group_size,
                          float *data, size_t count, comm_reduce_op op,
                          pt_error *err)
{
    char operation[160];
    name_collective(operation, sizeof operation, "all-reduce", group,
                    group_size);
    return reduce_chunks(c, group, group_size, data, count, MPI_FLOAT,
                         sizeof *data, op == COMM_MAX ? MPI_MAX : MPI_SUM,
                         operation, err);
}

static int mpi_all_reduce_host(const comm *c, const int *group,
                               int group_size, double *data, size_t count,
                               pt_error *err)
{
    char operation[160];
    name_collective(operation, sizeof operation, "host all-reduce", group,
                    group_size);
    return reduce_chunks(c, group, group_size, data, count, MPI_DOUBLE,
                         sizeof *data, MPI_SUM, operation, err);
}

/* The members' chunk sizes and offsets as MPI's ints, and this rank's
 * place in the group. */
static int chunk_counts(const comm *c, const int *group, int group_size,
                        const size_t *chunk_offsets, const char *operation,
                        int *counts, int *displacements, int *member,
                        pt_error *err)
{
    *member = -1;
    if (chunk_offsets[0] != 0 || chunk_offsets[group_size] > INT_MAX)
        return pt_fail(err, "rank %d: %s: chunk offsets must start at 0 and "
                            "end at most at %d floats",
                       c->rank, operation, INT_MAX);
    for (int i = 0; i < group_size; i++) {
        if (chunk_offsets[i + 1] < chunk_offsets[i])
            return pt_fail(err, "rank %d: %s: chunk offsets decrease at "
                                "member %d",
                           c->rank, operation, i);
        counts[i] = (int)(chunk_offsets[i + 1] - chunk_offsets[i]);
        displacements[i] = (int)chunk_offsets[i];
        if (group[i] == c->rank)
            *member = i;
    }
    if (*member < 0)
        return pt_fail(err, "rank %d: %s over a group it is not in",
                       c->rank, operation);
    return 0;
}

/* Runs the chunked collective `reduce` (or else gather) over the group
 * and waits for it. */
static int chunked_collective(const comm *c, const int *group,
                              int group_size, float *data,
                              const size_t *chunk_offsets, bool reduce,
                              pt_error *err)
{
    char operation[160];
    name_collective(operation, sizeof operation,
                    reduce ? "reduce-scatter" : "all-gather", group,
                    group_size);
    int *counts = malloc(2 * (size_t)group_size * sizeof *counts);
    if (counts == NULL)
        return pt_fail(err, "rank %d: %s: out of memory", c->rank,
                       operation);
    int *displacements = counts + group_size;
    int member = -1;
    MPI_Comm comm;
    MPI_Request request;
    int status = chunk_counts(c, group, group_size, chunk_offsets, operation,
                              counts, displacements, &member, err);
    if (status == 0)
        status = group_comm(c, group, group_size, operation, &comm, err);
    if (status == 0) {
        int code = reduce ? MPI_Ireduce_scatter(MPI_IN_PLACE, data, counts,
                                                MPI_FLOAT, MPI_SUM, comm,
                                                &request)
                          : MPI_Iallgatherv(MPI_IN_PLACE, 0,
                                            MPI_DATATYPE_NULL, data, counts,
                                            displacements, MPI_FLOAT, comm,
                                            &request);
        status = code == MPI_SUCCESS
                     ? wait_request(c, &request, operation, err)
                     : fail_transport(c, operation, code, err);
    }
    /* In place, MPI leaves a member's sum at the start of the buffer; the
     * interface promises it at the member's own offset. */
    if (status == 0 && reduce && chunk_offsets[member] > 0)
        memmove(data + chunk_offsets[member], data,
                (size_t)counts[member] * sizeof *data);
    free(counts);
    return status;
}

static int mpi_reduce_scatter(const comm *c, const int *group,
                              int group_size, float *data,
                              const size_t *chunk_offsets, pt_error *err)
{
    return chunked_collective(c, group, group_size, data, chunk_offsets, true,
                              err);
}

static int mpi_all_gather(const comm *c, const int *group, int group_size,
                          float *data, const size_t *chunk_offsets,
                          pt_error *err)
{
    return chunked_collective(c, group, group_size, data, chunk_offsets,
                              false, err);
}

static int mpi_barrier(const comm *c, pt_error *err)
{
    MPI_Request request;
    int code = MPI_Ibarrier(mpi_world(c)->collectives, &request);
    if (code != MPI_SUCCESS)
        return fail_transport(c, "barrier", code, err);
    return wait_request(c, &request, "barrier", err);
}

static void mpi_abort(const comm *c, const char *reason)
{
    comm_mpi *w = mpi_world(c);
    if (has_failed(w))
        return;
    comm_failure_record(&w->failure, c->rank, reason);
    notify_others(w);
}

static int mpi_failed_rank(const comm *c, char *reason, size_t reason_size)
{
    comm_mpi *w = mpi_world(c);
    poll_aborts(w);
    return comm_failure_get(&w->failure, reason, reason_size);
}

static const comm_ops mpi_ops = {
    .name = "mpi",
    .send = mpi_send,
    .recv = mpi_recv,
    .all_reduce = mpi_all_reduce,
    .all_reduce_host = mpi_all_reduce_host,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .failed_rank = mpi_failed_rank,
};

/* --------------------------------------------------------------- world */

bool comm_mpi_built(void) { return true; }

static int mpi_failure(const char *what, int code, pt_error *err)
{
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", code);
    return pt_fail(err, "mpi comm: %s: %s", what, text);
}

/* MPI_Init_thread unless something initialised MPI already. */
static int start_mpi(pt_error *err)
{
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
        return 0;
    int provided = MPI_THREAD_SINGLE;
    int code = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (code != MPI_SUCCESS)
        return mpi_failure("MPI_Init_thread", code, err);
    if (provided < MPI_THREAD_SERIALIZED)
        return pt_fail(err, "mpi comm: this MPI does not let a process call "
                            "it from more than one thread "
                            "(MPI_THREAD_SERIALIZED); the rank's thread and "
                            "the main thread both do");
    return 0;
}

static int duplicate_world(comm_mpi *w, pt_error *err)
{
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm *copies[] = {&w->messages, &w->collectives, &w->aborts};
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++) {
        int code = MPI_Comm_dup(MPI_COMM_WORLD, copies[i]);
        if (code != MPI_SUCCESS)
            return mpi_failure("MPI_Comm_dup", code, err);
        MPI_Comm_set_errhandler(*copies[i], MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    MPI_Comm host;
    int code = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED,
                                   w->rank, MPI_INFO_NULL, &host);
    if (code != MPI_SUCCESS)
        return mpi_failure("MPI_Comm_split_type (the processes of this "
                           "host)",
                           code, err);
    MPI_Comm_rank(host, &w->local_rank);
    MPI_Comm_size(host, &w->local_size);
    MPI_Comm_free(&host);
    return 0;
}

int comm_mpi_create(double timeout_s, comm_mpi **out, pt_error *err)
{
    *out = NULL;
    if (!(timeout_s > 0.0))
        return pt_fail(err, "mpi comm: the timeout must be positive, got "
                            "%g s",
                       timeout_s);
    comm_mpi *w = calloc(1, sizeof *w);
    if (w == NULL)
        return pt_fail(err, "mpi comm: out of memory");
    w->messages = w->collectives = w->aborts = MPI_COMM_NULL;
    w->timeout_s = timeout_s;
    comm_failure_init(&w->failure);
    if (start_mpi(err) != 0 || duplicate_world(w, err) != 0) {
        free(w);
        return -1;
    }
    w->abort_requests = malloc((size_t)w->size * sizeof *w->abort_requests);
    if (w->abort_requests == NULL) {
        free(w);
        return pt_fail(err, "mpi comm: out of memory");
    }
    for (int peer = 0; peer < w->size; peer++)
        w->abort_requests[peer] = MPI_REQUEST_NULL;
    *out = w;
    return 0;
}

comm comm_mpi_handle(comm_mpi *world)
{
    return (comm){.ops = &mpi_ops, .shared = world, .rank = world->rank,
                  .size = world->size};
}

int comm_mpi_local_rank(const comm_mpi *world) { return world->local_rank; }

int comm_mpi_local_size(const comm_mpi *world) { return world->local_size; }

static int add_group(comm_mpi *w, const int *members, int size,
                     pt_error *err)
{
    mpi_group *group = &w->groups[w->group_count];
    group->members = malloc((size_t)size * sizeof *members);
    if (group->members == NULL)
        return pt_fail(err, "mpi comm: out of memory for a group");
    memcpy(group->members, members, (size_t)size * sizeof *members);
    group->size = size;
    group->comm = MPI_COMM_NULL;
    w->group_count++;
    int position = MPI_UNDEFINED;
    for (int i = 0; i < size; i++)
        if (members[i] == w->rank)
            position = i;
    int code = MPI_Comm_split(w->collectives,
                              position == MPI_UNDEFINED ? MPI_UNDEFINED : 0,
                              position == MPI_UNDEFINED ? 0 : position,
                              &group->comm);
    if (code != MPI_SUCCESS)
        return mpi_failure("MPI_Comm_split (a group's communicator)", code,
                           err);
    if (group->comm != MPI_COMM_NULL)
        MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN);
    return 0;
}

int comm_mpi_set_groups(comm_mpi *world, const comm_groups *groups,
                        pt_error *err)
{
    if (world->groups != NULL)
        return pt_fail(err, "mpi comm: the groups are already set up");
    world->groups = calloc((size_t)(groups->count > 0 ? groups->count : 1),
                           sizeof *world->groups);
    if (world->groups == NULL)
        return pt_fail(err, "mpi comm: out of memory for %d groups",
                       groups->count);
    for (int g = 0; g < groups->count; g++) {
        int first = groups->offsets[g];
        if (add_group(world, groups->members + first,
                      groups->offsets[g + 1] - first, err) != 0)
            return -1;
    }
    return 0;
}

int comm_mpi_gather(const comm *c, const void *data, size_t bytes,
                    void *gathered, pt_error *err)
{
    const char *operation = "gather to rank 0";
    if (bytes > INT_MAX)
        return pt_fail(err, "rank %d: %s: %zu bytes is more than one MPI "
                            "call carries",
                       c->rank, operation, bytes);
    MPI_Request request;
    int code = MPI_Igather(data, (int)bytes, MPI_BYTE, gathered, (int)bytes,
                           MPI_BYTE, 0, mpi_world(c)->collectives, &request);
    if (code != MPI_SUCCESS)
        return fail_transport(c, operation, code, err);
    return wait_request(c, &request, operation, err);
}

int comm_mpi_broadcast(const comm *c, void *data, size_t bytes,
                       pt_error *err)
{
    const char *operation = "broadcast from rank 0";
    if (bytes > INT_MAX)
        return pt_fail(err, "rank %d: %s: %zu bytes is more than one MPI "
                            "call carries",
                       c->rank, operation, bytes);
    MPI_Request request;
    int code = MPI_Ibcast(data, (int)bytes, MPI_BYTE, 0,
                          mpi_world(c)->collectives, &request);
    if (code != MPI_SUCCESS)
        return fail_transport(c, operation, code, err);
    return wait_request(c, &request, operation, err);
}

/* The sends of a healthy run complete before MPI_Finalize; false when a
 * peer never took one within the timeout. */
static bool complete_sends(comm_mpi *w)
{
    double deadline = pt_monotonic_seconds() + w->timeout_s;
    for (long polls = 0; w->send_count > 0; polls++) {
        progress_sends(w);
        if (pt_monotonic_seconds() > deadline)
            return false;
        if (w->send_count > 0)
            pause_poll(polls);
    }
    return true;
}

void comm_mpi_finish(comm_mpi *world, int exit_status)
{
    if (world == NULL)
        return;
    poll_aborts(world);
    if (has_failed(world) || !complete_sends(world)) {
        /* The rank that failed first prints why; the others, whose
         * messages only repeat it, give it a moment before the job ends. */
        if (world->failure.rank != world->rank)
            sleep(1);
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, exit_status != 0 ? exit_status : 1);
    }
    for (int g = 0; g < world->group_count; g++) {
        if (world->groups[g].comm != MPI_COMM_NULL)
            MPI_Comm_free(&world->groups[g].comm);
        free(world->groups[g].members);
    }
    MPI_Comm_free(&world->messages);
    MPI_Comm_free(&world->collectives);
    MPI_Comm_free(&world->aborts);
    free(world->groups);
    free(world->sends);
    free(world->abort_requests);
    free(world);
    MPI_Finalize();
}

#endif /* PARTITA_HAVE_MPI */
