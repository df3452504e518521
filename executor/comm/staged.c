/*
 * The host-staged comm (executor/parallel/parallel.h): GPU ranks that are
 * threads of this process, on any GPUs, several on one allowed. Every
 * operation copies the rank's device floats into its pinned staging
 * buffer, runs the same operation of a threads comm world on the host
 * copy, and copies the result back; so a message is matched, a sum is
 * ordered and a failure is reported exactly as the cpu reference's
 * threads comm does it. Buffers larger than the staging buffer go in
 * pieces, each piece one operation of the threads world; every member of
 * a collective cuts the same pieces, since they pass the same counts.
 *
 * Why not peer copies between the ranks' device buffers: the threads comm
 * already owns matching, timeouts and aborts, and the point of this comm
 * is to check the cuda backend's parallel runtime on one GPU, not speed.
 */
#include "executor/comm/device_internal.h"

#include <stdlib.h>
#include <string.h>

/* Floats staged at once: 64 MiB of pinned memory per rank at most. */
enum { STAGED_PIECE_FLOATS = 16 * 1024 * 1024 };

typedef struct staged_rank {
    comm inner;              /* this rank's handle of the threads world */
    cudaStream_t stream;     /* copies, in the rank's green context */
    cudaEvent_t caller;      /* comm_follow_caller's */
    float *host;             /* pinned staging buffer */
    size_t capacity;         /* floats in host */
    bool open;
} staged_rank;

struct comm_staged {
    comm_threads *threads;
    staged_rank *ranks;
    int size;
};

static staged_rank *rank_of(const comm *c)
{
    comm_staged *world = c->shared;
    return &world->ranks[c->rank];
}

/* A CUDA error ends the world as any failure does: the rank records it
 * and wakes the others. */
static int cuda_failed(const comm *c, const char *what, cudaError_t status,
                       pt_error *err)
{
    pt_fail(err, "rank %d: %s: %s", c->rank, what,
            cudaGetErrorString(status));
    cudaGetLastError();
    comm_abort(&rank_of(c)->inner, err->message);
    return -1;
}

/* The staging buffer holds at least `count` floats (at most a piece). */
static int ensure_capacity(const comm *c, size_t count, pt_error *err)
{
    staged_rank *r = rank_of(c);
    if (!r->open)
        return pt_fail(err, "rank %d: the host-staged comm was used before "
                            "comm_staged_rank_open on the rank's thread",
                       c->rank);
    if (count <= r->capacity)
        return 0;
    if (r->host != NULL)
        cudaFreeHost(r->host);
    r->host = NULL;
    r->capacity = 0;
    cudaError_t status = cudaHostAlloc((void **)&r->host,
                                       count * sizeof(float),
                                       cudaHostAllocPortable);
    if (status != cudaSuccess)
        return cuda_failed(c, "pinned staging buffer", status, err);
    r->capacity = count;
    return 0;
}

/* Copies between the rank's device buffer and its staging buffer and
 * waits: the threads comm reads or has written the host copy. */
static int copy_and_wait(const comm *c, void *to, const void *from,
                         size_t count, pt_error *err)
{
    staged_rank *r = rank_of(c);
    /* behind what the caller left on the default streams, whichever way
     * the copy goes (a result must not land under a pending write) */
    cudaError_t status = comm_follow_caller(r->stream, r->caller);
    if (status == cudaSuccess)
        status = cudaMemcpyAsync(to, from, count * sizeof(float),
                                 cudaMemcpyDefault, r->stream);
    if (status == cudaSuccess)
        status = cudaStreamSynchronize(r->stream);
    if (status != cudaSuccess)
        return cuda_failed(c, "copy through the staging buffer", status,
                           err);
    return 0;
}

static size_t piece_of(size_t count, size_t done)
{
    size_t left = count - done;
    return left < STAGED_PIECE_FLOATS ? left : STAGED_PIECE_FLOATS;
}

/* ---------------------------------------------------------- messages */

/* A message piece by piece: a sender stages each piece out of the device
 * and hands it on, a receiver takes each piece and stages it in. */
static int staged_message(const comm *c, int peer, int tag, float *data,
                          size_t count, bool sending, pt_error *err)
{
    staged_rank *r = rank_of(c);
    if (ensure_capacity(c, piece_of(count, 0), err) != 0)
        return -1;
    size_t done = 0;
    do {
        size_t piece = piece_of(count, done);
        int status =
            sending
                ? copy_and_wait(c, r->host, data + done, piece, err) != 0 ||
                      comm_send(&r->inner, peer, tag, r->host, piece, err)
                : comm_recv(&r->inner, peer, tag, r->host, piece, err) != 0 ||
                      copy_and_wait(c, data + done, r->host, piece, err);
        if (status != 0)
            return -1;
        done += piece;
    } while (done < count);
    return 0;
}

static int staged_send(const comm *c, int peer, int tag, const float *data,
                       size_t count, pt_error *err)
{
    /* read only: the sender's copies go out of data */
    return staged_message(c, peer, tag, (float *)data, count, true, err);
}

static int staged_recv(const comm *c, int peer, int tag, float *data,
                       size_t count, pt_error *err)
{
    return staged_message(c, peer, tag, data, count, false, err);
}

/* -------------------------------------------------------- collectives */

/* The collectives the staged comm runs piece by piece. */
typedef enum staged_kind {
    STAGED_SUM,
    STAGED_MAX,
    STAGED_REDUCE_SCATTER,
    STAGED_ALL_GATHER,
} staged_kind;

/* The threads comm's collective on the host copy of one piece;
 * piece_offsets (group_size + 1) are the chunks cut to the piece. */
static int host_collective(const comm *inner, staged_kind kind,
                           const int *group, int group_size, float *host,
                           size_t count, const size_t *piece_offsets,
                           pt_error *err)
{
    switch (kind) {
    case STAGED_SUM:
        return comm_all_reduce_sum(inner, group, group_size, host, count,
                                   err);
    case STAGED_MAX:
        return comm_all_reduce_max(inner, group, group_size, host, count,
                                   err);
    case STAGED_REDUCE_SCATTER:
        return comm_reduce_scatter_sum(inner, group, group_size, host,
                                       piece_offsets, err);
    case STAGED_ALL_GATHER:
        return comm_all_gather(inner, group, group_size, host,
                               piece_offsets, err);
    }
    return pt_fail(err, "host-staged comm: unknown collective %d",
                   (int)kind);
}

/* Runs a collective over the buffer piece by piece: stage in, operate,
 * stage out. chunk_offsets (NULL for the all-reduces) are cut to each
 * piece, so a member's chunk is the part of it inside the piece. */
static int staged_collective(const comm *c, staged_kind kind,
                             const int *group, int group_size, float *data,
                             size_t count, const size_t *chunk_offsets,
                             pt_error *err)
{
    staged_rank *r = rank_of(c);
    size_t *piece_offsets = NULL;
    if (chunk_offsets != NULL) {
        piece_offsets = malloc((size_t)(group_size + 1) *
                               sizeof *piece_offsets);
        if (piece_offsets == NULL)
            return pt_fail(err, "rank %d: out of host memory", c->rank);
    }
    int status = ensure_capacity(c, piece_of(count, 0), err);
    for (size_t done = 0; status == 0 && done < count;) {
        size_t piece = piece_of(count, done);
        for (int i = 0; piece_offsets != NULL && i <= group_size; i++) {
            size_t at = chunk_offsets[i];
            at = at < done ? done : at > done + piece ? done + piece : at;
            piece_offsets[i] = at - done;
        }
        status = copy_and_wait(c, r->host, data + done, piece, err) != 0 ||
                         host_collective(&r->inner, kind, group, group_size,
                                         r->host, piece, piece_offsets,
                                         err) != 0 ||
                         copy_and_wait(c, data + done, r->host, piece,
                                       err) != 0
                     ? -1
                     : 0;
        done += piece;
    }
    free(piece_offsets);
    return status;
}

static int staged_all_reduce(const comm *c, const int *group, int group_size,
                             float *data, size_t count, comm_reduce_op op,
                             pt_error *err)
{
    return staged_collective(c, op == COMM_MAX ? STAGED_MAX : STAGED_SUM,
                             group, group_size, data, count, NULL, err);
}

static int staged_reduce_scatter(const comm *c, const int *group,
                                 int group_size, float *data,
                                 const size_t *chunk_offsets, pt_error *err)
{
    return staged_collective(c, STAGED_REDUCE_SCATTER, group, group_size,
                             data, chunk_offsets[group_size], chunk_offsets,
                             err);
}

static int staged_all_gather(const comm *c, const int *group, int group_size,
                             float *data, const size_t *chunk_offsets,
                             pt_error *err)
{
    return staged_collective(c, STAGED_ALL_GATHER, group, group_size, data,
                             chunk_offsets[group_size], chunk_offsets, err);
}

/* ------------------------------------------------- host data, failures */

static int staged_all_reduce_host(const comm *c, const int *group,
                                  int group_size, double *data, size_t count,
                                  pt_error *err)
{
    return comm_all_reduce_host(&rank_of(c)->inner, group, group_size, data,
                                count, err);
}

static int staged_barrier(const comm *c, pt_error *err)
{
    return comm_barrier(&rank_of(c)->inner, err);
}

static void staged_abort(const comm *c, const char *reason)
{
    comm_abort(&rank_of(c)->inner, reason);
}

static int staged_failed_rank(const comm *c, char *reason,
                              size_t reason_size)
{
    return comm_failed_rank(&rank_of(c)->inner, reason, reason_size);
}

static const comm_ops staged_ops = {
    .name = "host-staged",
    .send = staged_send,
    .recv = staged_recv,
    .all_reduce = staged_all_reduce,
    .all_reduce_host = staged_all_reduce_host,
    .reduce_scatter = staged_reduce_scatter,
    .all_gather = staged_all_gather,
    .barrier = staged_barrier,
    .abort = staged_abort,
    .failed_rank = staged_failed_rank,
};

/* -------------------------------------------------------------- world */

int comm_staged_create(int size, double timeout_s, comm_staged **out,
                       pt_error *err)
{
    *out = NULL;
    comm_staged *world = calloc(1, sizeof *world);
    if (world == NULL)
        return pt_fail(err, "host-staged comm: out of memory");
    world->size = size;
    world->ranks = calloc((size_t)(size > 0 ? size : 1),
                          sizeof *world->ranks);
    if (world->ranks == NULL ||
        comm_threads_create(size, timeout_s, &world->threads, err) != 0) {
        if (world->ranks == NULL)
            pt_fail(err, "host-staged comm: out of memory for %d ranks",
                    size);
        free(world->ranks);
        free(world);
        return -1;
    }
    for (int rank = 0; rank < size; rank++)
        world->ranks[rank].inner = comm_threads_rank(world->threads, rank);
    *out = world;
    return 0;
}

void comm_staged_destroy(comm_staged *world)
{
    if (world == NULL)
        return;
    comm_threads_destroy(world->threads);
    free(world->ranks);
    free(world);
}

comm comm_staged_rank(comm_staged *world, int rank)
{
    return (comm){.ops = &staged_ops, .shared = world, .rank = rank,
                  .size = world->size};
}

int comm_staged_rank_open(comm_staged *world, int rank, pt_error *err)
{
    staged_rank *r = &world->ranks[rank];
    if (cuda_rank_stream_create(&r->stream, err) != 0)
        return -1;
    cudaError_t status =
        cudaEventCreateWithFlags(&r->caller, cudaEventDisableTiming);
    if (status != cudaSuccess) {
        cudaStreamDestroy(r->stream);
        return pt_fail(err, "rank %d: host-staged comm: an event: %s", rank,
                       cudaGetErrorString(status));
    }
    r->open = true;
    return 0;
}

void comm_staged_rank_close(comm_staged *world, int rank)
{
    staged_rank *r = &world->ranks[rank];
    if (r->host != NULL)
        cudaFreeHost(r->host);
    if (r->open) {
        cudaEventDestroy(r->caller);
        cudaStreamDestroy(r->stream);
    }
    comm inner = r->inner;
    *r = (staged_rank){.inner = inner};
}
