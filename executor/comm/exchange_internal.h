/*
 * Private to the device exchange (comm/exchange.c: its world, ranks,
 * waits and messages; comm/exchange_collectives.c: its rendezvous and
 * collectives): the state they share. The public interface and the
 * design are in executor/comm/comm.h ("the device exchange").
 */
#ifndef PARTITA_EXECUTOR_COMM_EXCHANGE_INTERNAL_H
#define PARTITA_EXECUTOR_COMM_EXCHANGE_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "executor/comm/internal.h"
#include "executor/cuda/cuda_ops.h"

/* Staging buffers a rank keeps for messages in flight; a send waits for
 * one to come back when all are out (a receiver is then far behind). */
#define EXCHANGE_STAGING_MAX 64
/* Clock stamps of paced exchanges in flight on a rank's streams: the
 * ring wraps after this many exchanges, far more than a micro-batch
 * enqueues before the host waits for it. Behind the ring, one slot per
 * staging buffer: the moment its message's sender was ready, read by the
 * receiver's pacing kernel before the buffer's release. */
#define EXCHANGE_STAMPS 4096
#define EXCHANGE_STAMP_SLOTS (EXCHANGE_STAMPS + EXCHANGE_STAGING_MAX)

/* A rank's device buffer for one message in flight. `in_flight` and
 * `release_recorded` change under the world's lock: the receiver clears
 * the first after recording `released` on its stream behind its copy. */
typedef struct exchange_staging {
    float *data;
    size_t capacity;             /* floats */
    bool stream_ordered;         /* from cudaMallocAsync */
    bool in_flight;
    bool release_recorded;
    cudaEvent_t released;        /* made by the sender, recorded by the
                                    receiver after its copy */
} exchange_staging;

/* A message waiting in a rank's mailbox: the sender's staging buffer
 * (its copy there is finished when the message is posted). */
typedef struct exchange_message {
    comm_envelope envelope;      /* first: the mailbox links it */
    size_t count;
    exchange_staging *staging;   /* NULL when count is 0 */
    const uint64_t *sent_stamp;  /* the GPU clock when the sender's stream
                                    began the message (its staging
                                    buffer's slot), NULL unpaced */
} exchange_message;

/* Where a rank's receive stands when no message was waiting for it: it
 * posts its destination, and a sender of the same source, tag and count
 * then copies straight into it (no staging). Changed under the world's
 * lock. */
typedef enum exchange_posted_state {
    EXCHANGE_POSTED_NONE,        /* no receive posted */
    EXCHANGE_POSTED_WAITING,     /* posted, no sender yet */
    EXCHANGE_POSTED_CLAIMED,     /* a sender's copy is under way */
    EXCHANGE_POSTED_DELIVERED,   /* the copy has finished */
    EXCHANGE_POSTED_FAILED,      /* the sender failed; its copy has ended */
} exchange_posted_state;

/* A receive a rank's host waits in, as its senders see it. */
typedef struct exchange_posted {
    exchange_posted_state state;
    int source;
    int tag;
    float *data;                 /* the receiver's destination */
    size_t count;
    uint64_t *sent_stamp;        /* a clock slot of the receiver's that the
                                    sender stamps when ready; NULL unpaced */
} exchange_posted;

/* What one member posts at a rendezvous. */
typedef struct exchange_post {
    void *data;                  /* its buffer (device, or host doubles) */
    cudaEvent_t event;           /* recorded before posting, or NULL */
} exchange_post;

/*
 * The rendezvous of one group (its members in group order): each
 * collective meets twice, generation by generation; posts of generation
 * g sit in posts[g % 2], so a member already at g + 1 cannot overwrite
 * what a slower one still reads (g + 2 needs everyone at g + 1). Changed
 * under the world's lock; `generation` is also read without it while a
 * member spins.
 */
typedef struct exchange_channel {
    struct exchange_channel *next;
    int size;
    int members[COMM_EXCHANGE_MAX_RANKS];
    link_spec link;              /* the slowest between two members */
    atomic_long generation;
    int arrived;
    exchange_post posts[2][COMM_EXCHANGE_MAX_RANKS];
    /* each member's own events (made and destroyed on its thread):
     * its buffer is ready; its part of the collective is done */
    cudaEvent_t ready[COMM_EXCHANGE_MAX_RANKS];
    cudaEvent_t done[COMM_EXCHANGE_MAX_RANKS];
} exchange_channel;

/* What one rank holds; its fields other than the staging flags and
 * `posted` are touched only by the rank's own thread. */
typedef struct exchange_rank {
    bool open;
    int device;
    cudaStream_t stream;         /* staging copies, receives, blocking
                                    collectives (in the rank's slice) */
    cudaEvent_t host_wait;       /* recorded where the host waits */
    uint64_t *stamps;            /* EXCHANGE_STAMP_SLOTS device clock
                                    slots: the ring, then one per staging
                                    buffer */
    unsigned next_stamp;
    exchange_posted posted;      /* its receive in wait (world's lock) */
    exchange_staging staging[EXCHANGE_STAGING_MAX];
    int staging_count;
    double device_bytes;
    double peak_device_bytes;
} exchange_rank;

struct comm_exchange {
    int size;
    double timeout_s;
    link_spec *links;            /* size x size, or NULL: not paced */
    pthread_mutex_t lock;        /* guards everything below and the
                                    staging flags */
    pthread_cond_t changed;      /* a message, an arrival, a release, a
                                    failure (on CLOCK_MONOTONIC) */
    comm_failure failure;
    atomic_bool failed;          /* read in polls without the lock */
    int device;                  /* the GPU of the ranks, -1 before */
    exchange_rank *ranks;
    comm_mailbox *mailboxes;     /* per receiving rank */
    exchange_channel *channels;
};

static inline comm_exchange *exchange_world(const comm *c)
{
    return (comm_exchange *)c->shared;
}

/* exchange.c: failures and waits, shared with the collectives. */
/* Records this rank's failure (the first one wins), fills err; -1. */
int exchange_fail(const comm *c, const char *operation, const char *what,
                  pt_error *err);
/* The error of an operation cut short by a failure; -1. */
int exchange_interrupted(const comm *c, const char *operation,
                         pt_error *err);
/* A CUDA call of an operation: its failure fails the rank. */
int exchange_cuda(const comm *c, cudaError_t status, const char *call,
                  const char *operation, pt_error *err);
/* Waits on the host until the stream's work so far is done, watching
 * the failure flag and the deadline. */
int exchange_wait_stream(const comm *c, cudaStream_t stream,
                         const char *operation, pt_error *err);
/* Waits for a change of the world (lock held) until the deadline; on
 * timeout fails the rank. */
int exchange_wait_change(const comm *c, const struct timespec *deadline,
                         const char *operation, pt_error *err);
/* The monotonic-clock moment the world's timeout from now. */
struct timespec exchange_deadline(const comm_exchange *world);
/* The next clock slot of the rank (paced exchanges). */
uint64_t *exchange_next_stamp(exchange_rank *r);
/* Nanoseconds an emulated link adds, rounded. */
uint64_t exchange_pace_nanoseconds(double seconds);

#define EXCHANGE_CUDA(call) exchange_cuda(c, (call), #call, operation, err)

/* exchange_collectives.c: the operations over groups. */
int exchange_all_reduce_on_stream(const comm *c, const int *group,
                                  int group_size, void *data, size_t count,
                                  comm_element type, comm_reduce_op op,
                                  void *stream, pt_error *err);
int exchange_reduce_scatter_on_stream(const comm *c, const int *group,
                                      int group_size, void *data,
                                      const size_t *chunk_offsets,
                                      comm_element type, void *stream,
                                      pt_error *err);
int exchange_all_gather_on_stream(const comm *c, const int *group,
                                  int group_size, void *data,
                                  const size_t *chunk_offsets,
                                  comm_element type, void *stream,
                                  pt_error *err);
int exchange_all_reduce_host(const comm *c, const int *group, int group_size,
                             double *data, size_t count, pt_error *err);
int exchange_barrier(const comm *c, pt_error *err);
/* Destroys the rank's events in every channel (on its thread). */
void exchange_close_channels(comm_exchange *world, int rank);
void exchange_free_channels(comm_exchange *world);

#endif
