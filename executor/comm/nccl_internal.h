/*
 * Private to the NCCL comm (comm/nccl.c, its operations; comm/nccl_world.c,
 * its world, communicators and ranks' state): the state they share.
 */
#ifndef PARTITA_EXECUTOR_COMM_NCCL_INTERNAL_H
#define PARTITA_EXECUTOR_COMM_NCCL_INTERNAL_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "executor/comm/internal.h"

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
} nccl_clique;

/* One staging buffer of a direction. */
typedef struct staging_buffer {
    float *data;
    size_t capacity;             /* floats */
    cudaEvent_t sent;            /* recorded after its ncclSend */
    bool used;                   /* sent at least once (sent is recorded) */
    bool stream_ordered;         /* from cudaMallocAsync, else cudaMalloc */
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
    message_lane lanes[2];       /* to higher ranks, to lower ranks */
    double *device_scratch;      /* all_reduce_host's doubles */
    double *host_scratch;        /* pinned, so copies never block */
    size_t scratch_count;
    double device_bytes;         /* reserved now */
    double peak_device_bytes;
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

static inline comm_nccl *world_of(const comm *c)
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
/* Records the first failure of the world and, with one process per
 * rank, tells the other processes when it is this one's. */
void nccl_mark_failed(comm_nccl *world, int rank, const char *reason);
/* One process per rank: another process's failure, announced over MPI,
 * fails this world as well. */
void nccl_watch_other_processes(comm_nccl *world);
/* Aborts every communicator of the rank (on its own thread). */
void nccl_abort_rank_comms(comm_nccl *world, int rank);
/* Device bytes of a rank's comm buffers, counted against its cap. */
int nccl_reserve_bytes(comm_nccl *world, int rank, size_t bytes,
                       const char *what, pt_error *err);
void nccl_release_bytes(comm_nccl *world, int rank, size_t bytes);

/* The operations' table (nccl.c), for the handles of comm_nccl_rank. */
extern const comm_ops nccl_ops;

#endif
