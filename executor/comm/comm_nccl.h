/*
 * The NCCL implementation of the comm interface (executor/comm_nccl.c),
 * which the GPU launcher (executor/pipeline_gpu.h) uses. Built only
 * with the cuda backend and NCCL (meson defines PARTITA_HAVE_NCCL); include
 * this header under that macro. docs/executor.md ("Parallel runtime on
 * GPUs") describes the design.
 *
 * One process, one GPU per rank, each rank driven by its own thread:
 *   - the communicators are made up front, from the calling thread: one
 *     for the world, one for each group of ranks that runs collectives
 *     (a dp group, a tp group, an embedding pair: comm_groups), and two
 *     more over the world for point-to-point messages, one carrying the
 *     messages to a higher rank (activations) and one those to a lower
 *     rank (gradients), each on its own stream, so that the crossing
 *     sends of 1F1B cannot wait on each other;
 *   - send returns before the peer received: the floats are copied into a
 *     staging buffer (a small ring per direction that grows when every
 *     buffer is still in flight) and ncclSend is enqueued; recv, the
 *     collectives and the barrier return with their result in place;
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
#ifndef PARTITA_EXECUTOR_COMM_NCCL_H
#define PARTITA_EXECUTOR_COMM_NCCL_H

#include "executor/executor.h"
#include "executor/parallel/pipeline_gpu.h"

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

/* The GPU launcher over this comm (and the host-staged one) is declared
 * in executor/pipeline_gpu.h. */

#endif
