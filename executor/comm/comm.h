/*
 * executor/comm: communication between the ranks of a parallel run,
 * behind one interface (comm_ops), with five implementations: threads
 * (comm/threads.c, the reference: ranks as threads of one process, host
 * memory), MPI (comm/mpi.c: one process per rank), NCCL (comm/nccl.c:
 * one GPU per rank), the device exchange (comm/exchange.c: ranks that
 * share one GPU, through its memory, paced to emulated links) and
 * host-staged (comm/staged.c: device buffers through pinned host memory,
 * ranks may share a GPU).
 */
#ifndef PARTITA_EXECUTOR_COMM_H
#define PARTITA_EXECUTOR_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

/* ------------------------------------------------------------ interface */

/*
 * One interface (a table of functions and the implementation's shared
 * state) so that the pipeline and data-parallel runtime
 * (executor/parallel) is written once. Buffers are in the backend's
 * memory of the rank (host memory for threads and MPI, device memory for
 * NCCL, the device exchange and host-staged); whatever wrote them must
 * have finished when the call is made (the cuda backend synchronises its
 * stream; the comms of device memory also order their own streams after
 * the caller's default streams, so a cudaMemcpy or cudaMemset just
 * before the call is safe), and a call returns with its result in
 * place.
 *
 * Every blocking wait ends: when a rank calls comm_abort (the runtime
 * does on any error), every other rank's pending and later operations
 * return -1 with a message naming the failed rank and what it was doing;
 * when a peer does not answer within the timeout, the waiting rank's
 * operation returns -1 naming the peer and the operation, and aborts the
 * others too.
 */
typedef struct comm comm;

typedef enum comm_reduce_op { COMM_SUM, COMM_MAX } comm_reduce_op;

/* Element types of the stream-ordered collectives: bf16 sums are added in
 * fp32 and rounded once (the device exchange) or as NCCL does. */
typedef enum comm_element { COMM_FLOAT32, COMM_BFLOAT16 } comm_element;

/*
 * Collectives enqueued on a CUDA stream of the caller (`stream`, a
 * cudaStream_t), for comms of device memory (NCCL, the device exchange):
 * the call returns once the operation is enqueued, after the stream's
 * earlier work and before its later work, so a GPU's kernels and its sums
 * run back to back with no host synchronisation. Every member enqueues the
 * same collectives of a group in the same order, as for the blocking ones.
 * `wait` blocks the host until the stream's work so far is done, under
 * the comm's deadline and failure flag (a stream holding a collective a
 * failed peer never joins must not hold the host forever). A comm without
 * them has comm_ops.on_stream NULL.
 */
typedef struct comm_stream_ops {
    int (*all_reduce)(const comm *c, const int *group, int group_size,
                      void *data, size_t count, comm_element type,
                      comm_reduce_op op, void *stream, pt_error *err);
    /* chunk_offsets count elements of `type` (bf16 sums as all_reduce's;
     * a bf16 all-gather moves the bits) */
    int (*reduce_scatter)(const comm *c, const int *group, int group_size,
                          void *data, const size_t *chunk_offsets,
                          comm_element type, void *stream, pt_error *err);
    int (*all_gather)(const comm *c, const int *group, int group_size,
                      void *data, const size_t *chunk_offsets,
                      comm_element type, void *stream, pt_error *err);
    int (*wait)(const comm *c, void *stream, const char *operation,
                pt_error *err);
    /* all_reduce on the group's lean communicator where the comm made
     * one (NCCL with PARTITA_NCCL_LEAN_CTAS: few CTAs, for a sum beside
     * compute that needs the SMs); NULL: all_reduce */
    int (*all_reduce_lean)(const comm *c, const int *group, int group_size,
                           void *data, size_t count, comm_element type,
                           comm_reduce_op op, void *stream, pt_error *err);
} comm_stream_ops;

/* What an implementation provides; the comm_* wrappers check arguments
 * and dispatch here. */
typedef struct comm_ops {
    const char *name;
    /* Hands `count` floats to `peer` under `tag`; may return before the
     * peer received them (the threads implementation copies). */
    int (*send)(const comm *c, int peer, int tag, const float *data,
                size_t count, pt_error *err);
    /* Waits for the message of `peer` under `tag` (messages of one peer
     * and tag arrive in the order they were sent) and copies its `count`
     * floats into data; a different count is an error. */
    int (*recv)(const comm *c, int peer, int tag, float *data, size_t count,
                pt_error *err);
    /* Optional (NULL: send, then receive): a send and a receive of one
     * pipeline tick as one operation, for a comm whose send could wait
     * for its receiver. None needs it today: every send returns before
     * its receiver took the message. */
    int (*sendrecv)(const comm *c, int send_peer, int send_tag,
                    const float *send_data, size_t send_count,
                    int recv_peer, int recv_tag, float *recv_data,
                    size_t recv_count, pt_error *err);
    /* Reduces data element-wise (sum or max) over the ranks
     * group[0..group_size), which all call it with the same group, count
     * and op; every member gets the same result, summed in group order.
     * Members of two groups must call their collectives in the same
     * order. */
    int (*all_reduce)(const comm *c, const int *group, int group_size,
                      float *data, size_t count, comm_reduce_op op,
                      pt_error *err);
    /* The same sum for a few doubles in host memory (norms, losses),
     * whatever memory the other operations use. */
    int (*all_reduce_host)(const comm *c, const int *group, int group_size,
                           double *data, size_t count, pt_error *err);
    /* Sums data over the group and leaves, on member i, chunk i of the sum,
     * data[chunk_offsets[i] .. chunk_offsets[i + 1]), in place; the rest of
     * data is undefined afterwards. chunk_offsets: group_size + 1
     * non-decreasing offsets from 0 to the buffer's count. */
    int (*reduce_scatter)(const comm *c, const int *group, int group_size,
                          float *data, const size_t *chunk_offsets,
                          pt_error *err);
    /* Member i's chunk i to every member: afterwards data holds every
     * member's chunk, in place. */
    int (*all_gather)(const comm *c, const int *group, int group_size,
                      float *data, const size_t *chunk_offsets,
                      pt_error *err);
    /* Returns once every rank has called it. */
    int (*barrier)(const comm *c, pt_error *err);
    /* Records that this rank failed (the first failure wins) and wakes
     * every waiting rank. */
    void (*abort)(const comm *c, const char *reason);
    /* The rank that failed first (called abort, timed out, or hit an
     * error of the transport) and its reason, or -1 when none has. */
    int (*failed_rank)(const comm *c, char *reason, size_t reason_size);
    /* NULL for comms of host memory. */
    const comm_stream_ops *on_stream;
} comm_ops;

/* One rank's handle: plain value, valid while its world lives. */
struct comm {
    const comm_ops *ops;
    void *shared;        /* the implementation's state, shared by ranks */
    int rank;
    int size;            /* ranks in the world */
};

/* Operation tags at or above 0 are the caller's; collectives use their
 * own. */
int comm_send(const comm *c, int peer, int tag, const float *data,
              size_t count, pt_error *err);
int comm_recv(const comm *c, int peer, int tag, float *data, size_t count,
              pt_error *err);
/* A send and a receive of one tick together (comm_ops.sendrecv); the
 * peers may be the same rank or two different ones. */
int comm_sendrecv(const comm *c, int send_peer, int send_tag,
                  const float *send_data, size_t send_count, int recv_peer,
                  int recv_tag, float *recv_data, size_t recv_count,
                  pt_error *err);
int comm_all_reduce_sum(const comm *c, const int *group, int group_size,
                        float *data, size_t count, pt_error *err);
int comm_all_reduce_max(const comm *c, const int *group, int group_size,
                        float *data, size_t count, pt_error *err);
int comm_all_reduce_host(const comm *c, const int *group, int group_size,
                         double *data, size_t count, pt_error *err);
/* ZeRO-1's two halves of an all-reduce (see comm_ops): the sum's chunk i
 * to member i, and every member's chunk to every member. */
int comm_reduce_scatter_sum(const comm *c, const int *group, int group_size,
                            float *data, const size_t *chunk_offsets,
                            pt_error *err);
int comm_all_gather(const comm *c, const int *group, int group_size,
                    float *data, const size_t *chunk_offsets, pt_error *err);
int comm_barrier(const comm *c, pt_error *err);

/* Whether c enqueues collectives on CUDA streams (comm_stream_ops). */
bool comm_has_stream_ops(const comm *c);
/* The stream-ordered collectives (comm_stream_ops), checked as the
 * blocking ones; they fail on a comm without them. */
int comm_all_reduce_on_stream(const comm *c, const int *group,
                              int group_size, void *data, size_t count,
                              comm_element type, comm_reduce_op op,
                              void *stream, pt_error *err);
/* The same on the group's lean communicator (comm_stream_ops
 * .all_reduce_lean), else as comm_all_reduce_on_stream. */
int comm_all_reduce_on_stream_lean(const comm *c, const int *group,
                                   int group_size, void *data, size_t count,
                                   comm_element type, comm_reduce_op op,
                                   void *stream, pt_error *err);
/* The two halves of an all-reduce on the stream: ZeRO's (fp32) and
 * sequence parallelism's (bf16 activations, fp32 rows); chunk_offsets
 * in elements of `type`. */
int comm_reduce_scatter_on_stream(const comm *c, const int *group,
                                  int group_size, void *data,
                                  const size_t *chunk_offsets,
                                  comm_element type, void *stream,
                                  pt_error *err);
int comm_all_gather_on_stream(const comm *c, const int *group,
                              int group_size, void *data,
                              const size_t *chunk_offsets, comm_element type,
                              void *stream, pt_error *err);
int comm_wait_stream(const comm *c, void *stream, const char *operation,
                     pt_error *err);

void comm_abort(const comm *c, const char *reason);
/* The rank of c's world that failed first, or -1; reason may be NULL. */
int comm_failed_rank(const comm *c, char *reason, size_t reason_size);

/* Groups of ranks that run collectives together, as flat lists: group g
 * is members[offsets[g] .. offsets[g + 1]). A comm that must set up each
 * group in advance (NCCL) is given these. */
typedef struct comm_groups {
    int count;
    int *offsets;        /* count + 1, owned */
    int *members;        /* offsets[count], owned */
} comm_groups;

void comm_groups_free(comm_groups *groups);

/* How long a rank waits for a peer unless told otherwise. */
#define COMM_DEFAULT_TIMEOUT_S 60.0

/* The threads implementation: a world of `size` ranks sharing memory,
 * with one mailbox per rank under a mutex and condition variable. */
typedef struct comm_threads comm_threads;

int comm_threads_create(int size, double timeout_s, comm_threads **out,
                        pt_error *err);
/* Frees the world and any message never received. No rank may be inside
 * an operation. */
void comm_threads_destroy(comm_threads *world);
/* The handle of one rank, 0 <= rank < size. */
comm comm_threads_rank(comm_threads *world, int rank);
/* The rank that failed first (called comm_abort or timed out) and its
 * reason, or -1 when none has; reason may be NULL. */
int comm_threads_failed_rank(comm_threads *world, char *reason,
                             size_t reason_size);

/*
 * The MPI implementation (executor/comm/mpi.c, built when meson finds MPI:
 * option `mpi`): one process per rank, started by mpirun or srun, host
 * memory. send copies the floats and returns (MPI_Isend, completed
 * lazily), so crossing sends cannot wait on each other; every wait polls
 * its request, the abort messages of the other ranks and a deadline (the
 * timeout), so a dead or silent peer is an error naming it, not a hang.
 * Collectives run over MPI communicators made once for the world and for
 * each group the runtime gives (comm_mpi_set_groups). Without MPI in the
 * build every function below fails, saying so.
 */
typedef struct comm_mpi comm_mpi;

/* Whether this binary was built with MPI. */
bool comm_mpi_built(void);
/* Joins the MPI job this process was started in (MPI_Init_thread) and
 * makes its world: every process of the job is a rank. */
int comm_mpi_create(double timeout_s, comm_mpi **out, pt_error *err);
/* This process's handle. */
comm comm_mpi_handle(comm_mpi *world);
/* Rank among the processes of this host (the GPU a process drives) and
 * how many processes this host runs. */
int comm_mpi_local_rank(const comm_mpi *world);
int comm_mpi_local_size(const comm_mpi *world);
/* Makes a communicator for each group; every process calls it with the
 * same groups (collective over the world). A collective over a group
 * never set up, other than the whole world in rank order, fails. */
int comm_mpi_set_groups(comm_mpi *world, const comm_groups *groups,
                        pt_error *err);
/* Every rank's `bytes` bytes of data, in rank order, into gathered on
 * rank 0 (which must hold size x bytes; NULL elsewhere). */
int comm_mpi_gather(const comm *c, const void *data, size_t bytes,
                    void *gathered, pt_error *err);
/* Rank 0's `bytes` bytes of data to every rank, in place. */
int comm_mpi_broadcast(const comm *c, void *data, size_t bytes,
                       pt_error *err);
/* Ends this process's part: after a failure of any rank (comm_failed_rank
 * >= 0) the whole job is ended (MPI_Abort with exit_status, after a
 * moment that lets the rank that failed first print its message); else
 * the pending sends complete and MPI is finalized. Frees the world. */
void comm_mpi_finish(comm_mpi *world, int exit_status);

/* ---------------------------------------------------------------- NCCL */

/*
 * The NCCL implementation (comm/nccl.c), which the GPU launcher
 * (executor/parallel) uses. Built only with the cuda backend and NCCL
 * (meson defines PARTITA_HAVE_NCCL); call it under that macro.
 * docs/executor.md ("Parallel runtime on GPUs") describes the design.
 *
 * One process, one GPU per rank, each rank driven by its own thread:
 *   - the communicators are made up front, from the calling thread: one
 *     for the world, one for each group of ranks that runs collectives
 *     (a dp group, a tp group, an embedding pair: comm_groups), and two
 *     more over the world for point-to-point messages, one carrying the
 *     messages to a higher rank (activations) and one those to a lower
 *     rank (gradients), each on its own stream, so that the crossing
 *     sends of 1F1B cannot wait on each other;
 *   - a rank's first message connects it to every other rank on both
 *     message communicators (one NCCL group per communicator, which
 *     every rank joins at its first message), so that no later send or
 *     receive waits for NCCL's lazily made connection, which needs both
 *     ends, and the two directions never wait on each other;
 *   - send returns before the peer received: the floats are copied into a
 *     staging buffer (a small ring per direction that grows when every
 *     buffer is still in flight) and ncclSend is enqueued; recv, the
 *     collectives and the barrier return with their result in place;
 *     sendrecv is a send, then a receive; the stream-ordered collectives
 *     (comm_stream_ops) enqueue on the caller's stream and return;
 *   - messages of one peer and direction arrive in the order they were
 *     sent: the tag is not transmitted, so a receiver must take them in
 *     that order (the pipeline runtime does) and with the sent count;
 *   - every wait is a poll of the operation's CUDA event, the
 *     communicator's asynchronous error and the world's failure flag,
 *     against a deadline (the timeout): on a NCCL or CUDA error, another
 *     rank's failure or the deadline, the rank records the failure (the
 *     first one wins, naming the rank and the operation), aborts its own
 *     communicators (ncclCommAbort) and returns -1, and every other rank's
 *     next wait does the same. The communicators are non-blocking, so no
 *     NCCL call can hold a thread either.
 */
typedef struct comm_nccl comm_nccl;

/* The argument checks of comm_nccl_create, without a GPU: at least two
 * ranks, devices[rank] distinct and below device_count (NCCL refuses two
 * ranks of one communicator on one device), every group of at least two
 * distinct ranks of the world. */
int comm_nccl_check_arguments(int size, const int *devices, int device_count,
                              const comm_groups *groups, pt_error *err);

/* A world of `size` ranks, rank r on CUDA device devices[r], with the
 * communicators described above for the world and for each of `groups`
 * (NULL: none; a group equal to another or to the world shares its
 * communicator). Called from one thread before any rank's thread opens.
 * timeout_s bounds every wait; setting the communicators up gets at least
 * 120 s (NCCL's threads and, the first time, the CUDA contexts start). */
int comm_nccl_create(int size, const int *devices, const comm_groups *groups,
                     double timeout_s, comm_nccl **out, pt_error *err);
/* One process per rank (mpirun, srun): this process holds rank `rank`
 * of a world of `size` ranks, on CUDA device `device`; the other ranks
 * are the other processes of the MPI world `processes` (comm_mpi, rank
 * and size the same), which must outlive the call. World rank 0 makes
 * every communicator's id and broadcasts them over MPI; each process
 * makes (ncclCommInitRankConfig, non-blocking) the communicators of the
 * cliques it is in, with the same lanes, groups and waits as above. A
 * failure of this process is sent to the others over MPI, and theirs end
 * this world's waits. Every process calls it with the same groups; the
 * handle is comm_nccl_rank(world, rank), the rank's state is opened and
 * closed on its thread as above. */
int comm_nccl_create_rank(int size, int rank, int device,
                          const comm_groups *groups, double timeout_s,
                          const comm *processes, comm_nccl **out,
                          pt_error *err);
/* Ends the world: finalizes and destroys the communicators of a healthy
 * world, aborts them after a failure. Every rank must have closed. */
void comm_nccl_destroy(comm_nccl *world);

/* The handle of one rank, 0 <= rank < size. */
comm comm_nccl_rank(comm_nccl *world, int rank);
/* On the rank's own thread, once its device is open
 * (cuda_rank_device_open): the rank's streams (in its green context when
 * it has one), events and buffers, counted against its memory cap. */
int comm_nccl_rank_open(comm_nccl *world, int rank, pt_error *err);
/* On the rank's own thread: frees what open made (after
 * comm_nccl_rank_abort_if_stuck). */
void comm_nccl_rank_close(comm_nccl *world, int rank);
/* On the rank's own thread, before it frees device memory (which waits
 * for the device): aborts its communicators when the world has failed or
 * one of its sends was never received, so that no kernel of the rank
 * waits on a peer any more. */
void comm_nccl_rank_abort_if_stuck(comm_nccl *world, int rank);

/* The rank that failed first and its reason, or -1. */
int comm_nccl_failed_rank(comm_nccl *world, char *reason,
                          size_t reason_size);
/* How many of the rank's communicators were aborted so far. */
int comm_nccl_aborted_count(comm_nccl *world, int rank);
/* The most device bytes the rank's comm buffers held (staging buffers and
 * scratch). */
double comm_nccl_rank_peak_bytes(comm_nccl *world, int rank);
/* Sets of communicators the world made: the world, the two for messages
 * and one per distinct group (for tests). */
int comm_nccl_clique_count(const comm_nccl *world);

/* ---------------------------------------------------- the device exchange */

/*
 * The device exchange (comm/exchange.c), built with the cuda backend:
 * ranks that are threads of this process on ONE GPU, each usually in its
 * own slice of the SMs (green contexts), exchanging through the GPU's
 * memory with no host round trip. Messages: to a receiver already
 * waiting (it posted its buffer), the sender copies straight into its
 * buffer; else the sender copies into a staging buffer of its own on the
 * device and returns, and the receiver's stream copies out of it; a
 * sender never waits for its receiver. Collectives: every member records an event on
 * its stream and posts its buffer; each then reduces one chunk of every
 * member's buffer and writes the result into every member's buffer (one
 * kernel), and waits for the others' events before going on. Hosts only
 * meet (a mutex and a condition variable, as the threads comm): the data
 * stays on the GPU, and the stream-ordered collectives (comm_stream_ops)
 * never wait for the device.
 *
 * Emulated links: with `links`, every transfer lasts at least what the
 * link between the ranks would take (the cost model's closed forms,
 * docs/cost-model.md: a message latency + bytes / bandwidth, a ring
 * all-reduce of n members 2 (n - 1) / n x bytes / bandwidth + 2 (n - 1)
 * latencies, a reduce-scatter or all-gather half of it, over the slowest
 * link between members), counted on the GPU from the moment every member
 * is ready (a message: the later of its two ends' stamps): a kernel
 * stamps the GPU clock before the exchange and another
 * spins after it until the stamp plus that time (docs/executor.md,
 * "Emulated links"). Sums are made in group order in fp32 (bf16
 * elements widened and rounded once), so every member gets the same bits.
 */
typedef struct comm_exchange comm_exchange;

/* The most ranks of one exchange world: a Hopper GPU's 16 slices. */
#define COMM_EXCHANGE_MAX_RANKS 16

/* What an exchange of `bytes` takes on an emulated link (the closed forms
 * above): a message (members 2), an all-reduce, or a reduce-scatter /
 * all-gather (half) over `members`. 0 for a link of no bandwidth (not
 * paced). */
typedef enum comm_pattern {
    COMM_PATTERN_MESSAGE,
    COMM_PATTERN_ALL_REDUCE,
    COMM_PATTERN_HALF_ALL_REDUCE,
} comm_pattern;
double comm_emulated_seconds(comm_pattern pattern, double bytes, int members,
                             link_spec link);

/* A world of `size` ranks (2 .. COMM_EXCHANGE_MAX_RANKS). links: size x
 * size emulated links, links[a * size + b] between ranks a and b (a
 * bandwidth of 0: not paced), or NULL for none; copied. timeout_s bounds
 * every wait on another rank. Touches no GPU. */
int comm_exchange_create(int size, const link_spec *links, double timeout_s,
                         comm_exchange **out, pt_error *err);
/* Every rank must have closed. */
void comm_exchange_destroy(comm_exchange *world);
comm comm_exchange_rank(comm_exchange *world, int rank);
/* On the rank's own thread once its device is open (cuda_rank_device_open
 * or _slice; every rank on the same GPU): its stream (in its green
 * context), events and pacing clock, counted against its memory cap. */
int comm_exchange_rank_open(comm_exchange *world, int rank, pt_error *err);
/* On the rank's own thread: frees what it made (waits for the device). */
void comm_exchange_rank_close(comm_exchange *world, int rank);
/* The most device bytes the rank's staging buffers and clock held. */
double comm_exchange_rank_peak_bytes(comm_exchange *world, int rank);

/* ---------------------------------------------------- the host-staged comm */

/*
 * The host-staged implementation (comm/staged.c), built with the cuda
 * backend: every operation copies the rank's device floats into pinned
 * host memory and runs the threads comm on them. Slow (two PCIe copies
 * per operation, nothing overlapped), but it needs neither NCCL nor a GPU
 * per rank: ranks may share a GPU, each in its own slice of its SMs. Its
 * sums are the threads comm's, made on the host in group order.
 */

typedef struct comm_staged comm_staged;

/* A world of `size` ranks, threads of this process whose buffers are
 * device memory (any GPU, several ranks on one allowed). timeout_s bounds
 * every wait, as the threads comm's does. */
int comm_staged_create(int size, double timeout_s, comm_staged **out,
                       pt_error *err);
/* Every rank must have closed. */
void comm_staged_destroy(comm_staged *world);
/* The handle of one rank, 0 <= rank < size. */
comm comm_staged_rank(comm_staged *world, int rank);
/* On the rank's own thread, once its device is open (cuda_rank_device_open
 * or _slice): its copy stream (in its green context when it has one). Its
 * pinned staging buffer is allocated at the first operation, as large as
 * the first piece needs (64 MiB at most). */
int comm_staged_rank_open(comm_staged *world, int rank, pt_error *err);
/* On the rank's own thread: frees what open made. */
void comm_staged_rank_close(comm_staged *world, int rank);

#endif
