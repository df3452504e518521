/*
 * Private to executor/comm's comms of device memory: the send path they
 * share (comm/device.c), then the state the files of the device exchange
 * (exchange.c, exchange_waits.c, exchange_collectives.c) and of NCCL
 * (nccl.c, nccl_world.c) share. The public interface and the designs are
 * in executor/comm/comm.h; what every comm shares is in internal.h.
 */
#ifndef PARTITA_EXECUTOR_COMM_DEVICE_INTERNAL_H
#define PARTITA_EXECUTOR_COMM_DEVICE_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "executor/comm/internal.h"
#include "executor/cuda/cuda_backend.h"

/* ====================================================== the send path */

/* Device bytes a rank's comm buffers hold, each counted against the
 * rank's memory cap (cuda_rank_memory_reserve) before it is allocated. */
typedef struct comm_device_bytes {
    double held;
    double peak;
} comm_device_bytes;

int comm_device_reserve(comm_device_bytes *bytes, size_t count,
                        const char *what, pt_error *err);
void comm_device_release(comm_device_bytes *bytes, size_t count);

/* The CUDA call that failed in a step of the send path, for the comm to
 * report as its own failure (call NULL: nothing failed in CUDA). */
typedef struct comm_cuda_failure {
    const char *call;
    cudaError_t status;
} comm_cuda_failure;

/* "CALL failed: the error's text" into what (for a rank's failure), and
 * the error cleared from the thread's last error. */
void comm_cuda_describe(char *what, size_t size, const char *call,
                        cudaError_t status);

/*
 * Makes `stream` wait, on the device, for the work the calling thread has
 * enqueued so far on the default streams (the legacy one and its
 * per-thread one), through the rank's `scratch` event. The comms' streams
 * are non-blocking (green contexts allow no other kind), so nothing else
 * orders them after a caller's cudaMemcpy or cudaMemset: a cudaMemcpy from
 * pageable memory returns before its last bytes have landed, and a
 * cudaMemset returns at once. Without this a send could copy, and a
 * receive overwrite, a buffer the caller is still writing.
 */
cudaError_t comm_follow_caller(cudaStream_t stream, cudaEvent_t scratch);

/* A device buffer that a send's floats are copied into, so that the
 * caller may overwrite its own buffer once the copy has run while the
 * message itself waits for its receiver. */
typedef struct comm_staging {
    float *data;
    size_t capacity;             /* floats */
    bool stream_ordered;         /* from cudaMallocAsync, else cudaMalloc */
} comm_staging;

/*
 * The one send path of the comms of device memory: on `stream`, after
 * the caller's default-stream work (comm_follow_caller), grows b to
 * `count` floats when it is smaller (stream-ordered cudaMallocAsync, which
 * never waits for the device, whereas cudaMalloc and cudaFree may, and
 * the device may be running a send that waits on a peer; cudaMalloc where
 * the stream cannot) and copies data into it. The buffer must be free on
 * the device once `stream` reaches this point (the caller's policy: a
 * ring of sent events, a receiver's release). Returns 0 with the copy
 * enqueued (the caller waits for it as its comm waits); -1 with *failed
 * naming the CUDA call, or, the memory cap refusing, failed->call NULL
 * and err filled.
 */
int comm_staging_copy_in(comm_staging *b, const float *data, size_t count,
                         cudaStream_t stream, cudaEvent_t scratch,
                         comm_device_bytes *bytes, comm_cuda_failure *failed,
                         pt_error *err);
/* Frees b (cudaFree waits for the device: at a rank's close only). */
void comm_staging_free(comm_staging *b, comm_device_bytes *bytes);

/* ================================================ the device exchange */

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
    comm_staging buffer;
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
    cudaEvent_t caller;          /* comm_follow_caller's */
    exchange_staging staging[EXCHANGE_STAGING_MAX];
    int staging_count;
    comm_device_bytes memory;
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

/* exchange_waits.c: failures and waits, the messages' and the
 * collectives' alike. */
/* Records a failure of `rank` (the first one wins) and wakes every
 * waiting rank; lock not held. */
void exchange_mark_failed(comm_exchange *world, int rank,
                          const char *reason);
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

/* ============================================================= NCCL */

#ifdef PARTITA_HAVE_NCCL
#include <nccl.h>

/* The world's cliques: the world itself, the two point-to-point ones,
 * then one per distinct group. */
enum { CLIQUE_WORLD, CLIQUE_TO_HIGHER, CLIQUE_TO_LOWER, FIXED_CLIQUES };

/* Staging buffers per direction: the ring grows up to this many when
 * every buffer is still in flight (more than a step's messages in flight
 * means a peer is not receiving; then a send waits, within the timeout). */
#define STAGING_MAX 256

/* The communicators of one set of ranks: members[i] is NCCL rank i. */
typedef struct nccl_clique {
    char name[32];               /* for messages: "world", "group 2" */
    int size;
    int *members;                /* increasing world ranks */
    ncclComm_t *comms;           /* by member index; NULL once aborted or
                                    destroyed */
    int max_ctas;                /* NCCL's maxCTAs, 0: its default; more:
                                    a group's lean twin
                                    (PARTITA_NCCL_LEAN_CTAS) */
} nccl_clique;

/* One staging buffer of a direction. */
typedef struct staging_buffer {
    comm_staging buffer;
    cudaEvent_t sent;            /* recorded after its ncclSend */
    bool used;                   /* sent at least once (sent is recorded) */
} staging_buffer;

/* One direction of a rank's messages: its communicator, stream and
 * staging ring. */
typedef struct message_lane {
    int clique;                  /* CLIQUE_TO_HIGHER or CLIQUE_TO_LOWER */
    cudaStream_t stream;
    cudaEvent_t received;
    staging_buffer staging[STAGING_MAX];
    int staging_count;
    int next;                    /* where the search for a free one starts */
} message_lane;

/* What one rank holds; touched only by the rank's own thread (and by
 * comm_nccl_destroy once every rank has closed). */
typedef struct nccl_rank {
    bool open;
    int device;
    cudaStream_t collective_stream;
    cudaStream_t copy_stream;    /* staging copies: never behind a send */
    cudaEvent_t collective_done;
    cudaEvent_t copy_done;
    cudaEvent_t caller;          /* comm_follow_caller's */
    bool messages_connected;     /* connect_messages has run */
    message_lane lanes[2];       /* to higher ranks, to lower ranks */
    double *device_scratch;      /* all_reduce_host's doubles */
    double *host_scratch;        /* pinned, so copies never block */
    size_t scratch_count;
    comm_device_bytes memory;
    int aborted;                 /* communicators aborted */
} nccl_rank;

struct comm_nccl {
    int size;
    double timeout_s;
    int *devices;
    int clique_count;
    nccl_clique *cliques;
    nccl_rank *ranks;
    atomic_bool failed;          /* read in every poll without the lock */
    pthread_mutex_t lock;        /* guards failure */
    comm_failure failure;        /* the first rank that failed, and why */
    /* One process per rank (comm_nccl_create_rank): this process holds
     * only process_rank; its failures go to the other processes, and
     * theirs come back, over `processes` (the MPI world). */
    bool has_processes;
    int process_rank;
    comm processes;
};

static inline comm_nccl *nccl_world(const comm *c)
{
    return (comm_nccl *)c->shared;
}

/* Doubles all_reduce_host takes at once: its buffers are made when the
 * rank opens (allocating pinned memory later could wait for the device). */
#define HOST_REDUCE_MAX 256

/* For qsort of ranks. */
static inline int nccl_compare_ints(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The world's clique of these sorted ranks, or -1 (nccl_world.c). */
int nccl_find_clique(const comm_nccl *world, const int *sorted, int count);
/* The lean twin of that clique, or -1 where none was made. */
int nccl_find_lean_clique(const comm_nccl *world, const int *sorted,
                          int count);
/* Records the first failure of the world and, with one process per
 * rank, tells the other processes when it is this one's. */
void nccl_mark_failed(comm_nccl *world, int rank, const char *reason);
/* One process per rank: another process's failure, announced over MPI,
 * fails this world as well. */
void nccl_watch_other_processes(comm_nccl *world);
/* Aborts every communicator of the rank (on its own thread). */
void nccl_abort_rank_comms(comm_nccl *world, int rank);

/* The operations' table (nccl.c), for the handles of comm_nccl_rank. */
extern const comm_ops nccl_ops;

#endif /* PARTITA_HAVE_NCCL */

#endif
