/*
 * Parallel plans on the GPUs of this machine (executor/pipeline_gpu.c),
 * built with the cuda backend: one process, one thread per rank, each
 * rank on the GPU (and green context, and memory cap) its plan entry
 * names, over one of two comms:
 *   - NCCL (executor/comm_nccl.h, built when NCCL is found): one GPU per
 *     rank, the fast path;
 *   - host-staged (executor/comm_staged.c, below): every operation copies
 *     the rank's device floats into pinned host memory and runs the
 *     threads comm on them. Slow (two PCIe copies per operation, nothing
 *     overlapped), but it needs neither NCCL nor a GPU per rank: ranks may
 *     share a GPU, each in its own slice of its SMs, so one GPU runs a
 *     real pipeline, tensor- or data-parallel plan, a heterogeneous one
 *     included (a full-speed slice and a throttled slice). Its sums are
 *     the threads comm's, made on the host in group order.
 * Include under PARTITA_HAVE_CUDA. docs/executor.md ("Parallel runtime on
 * GPUs", "Ranks sharing a GPU") describes both.
 */
#ifndef PARTITA_EXECUTOR_PIPELINE_GPU_H
#define PARTITA_EXECUTOR_PIPELINE_GPU_H

#include "executor/executor.h"

/* ------------------------------------------------ the host-staged comm */

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

/* ---------------------------------------------------------- the launcher */

typedef enum gpu_comm_kind {
    GPU_COMM_NCCL,    /* one GPU per rank; needs a build with NCCL */
    GPU_COMM_HOST,    /* staged through host memory; ranks may share GPUs */
} gpu_comm_kind;

struct comm_nccl;

/*
 * Every rank of a layout on this machine's GPUs, one thread per rank
 * (pipeline_threads over the chosen comm). devices[rank] gives the rank's
 * GPU (index), its sm_limit (run in a CUDA green context of that many
 * SMs; 0: all) and memory_limit_gib (a cap on what the rank allocates; 0:
 * none). Ranks with an sm_limit that share a GPU get consecutive,
 * non-overlapping slices of its SMs in rank order. Each rank's thread
 * opens its device, its comm's streams and its cuda stage; the close runs
 * on the same thread.
 */
typedef struct pipeline_gpu {
    pipeline_threads threads;        /* stages, events, errors by rank */
    gpu_comm_kind kind;
    struct comm_nccl *world;         /* owned, GPU_COMM_NCCL */
    comm_staged *staged;             /* owned, GPU_COMM_HOST */
    comm *comms;                     /* rank_count, owned */
    device_spec *devices;            /* rank_count, owned copy */
    bool *sliced;                    /* rank_count: shares its GPU with
                                        other ranks that have sm_limits */
    int *sm_before;                  /* the sm_limits of the ranks before
                                        each sliced rank on its GPU, in
                                        rank order (sm_before_offset) */
    int *sm_before_offset;           /* rank_count + 1 offsets into it */
} pipeline_gpu;

int pipeline_gpu_start(pipeline_gpu *out, const pipeline_layout *layout,
                       const device_spec *devices, gpu_comm_kind kind,
                       uint64_t seed, double timeout_s, pt_error *err);
/* One process per rank (NCCL only): only this process's rank
 * (processes->rank), on `device`, over a NCCL world of
 * comm_nccl_create_rank; devices[] then holds that rank's entry only. */
int pipeline_gpu_start_rank(pipeline_gpu *out, const pipeline_layout *layout,
                            const device_spec *device, const comm *processes,
                            uint64_t seed, double timeout_s, pt_error *err);
/* Device bytes the rank's comm holds (NCCL's staging buffers and scratch;
 * 0 for the host-staged comm, whose buffers are host memory). */
double pipeline_gpu_comm_device_bytes(const pipeline_gpu *g, int rank);
/* Stops the rank threads (after a failure, each aborts its NCCL
 * communicators before its stage is freed) and ends the world. Safe on a
 * zeroed or failed launcher. */
void pipeline_gpu_stop(pipeline_gpu *g);

#endif
