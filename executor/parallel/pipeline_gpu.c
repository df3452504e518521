/*
 * The GPU launcher of parallel plans (executor/parallel/parallel.h): a comm
 * world over the ranks' GPUs (NCCL, the device exchange or the
 * host-staged comm) and the
 * generic launcher (pipeline_threads_start) with hooks that put each
 * rank's thread on its GPU (green context, memory cap) and open its comm
 * streams before the thread makes its cuda stage.
 */
#include "executor/parallel/parallel.h"

#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_backend.h"
#ifdef PARTITA_HAVE_NCCL
#include "executor/comm/comm.h"
#endif

static int open_rank(void *data, int rank, pt_error *err)
{
    pipeline_gpu *g = data;
    const device_spec *device = &g->devices[rank];
    int first = g->sm_before_offset[rank];
    int status =
        g->sliced[rank]
            ? cuda_rank_device_open_slice(
                  device->index, g->sm_before + first,
                  g->sm_before_offset[rank + 1] - first, device->sm_limit,
                  device->memory_limit_gib * PT_GIB, err)
            : cuda_rank_device_open(device->index, device->sm_limit,
                                    device->memory_limit_gib * PT_GIB, err);
    if (status != 0)
        return -1;
    if (g->kind == GPU_COMM_HOST)
        return comm_staged_rank_open(g->staged, rank, err);
#ifdef PARTITA_HAVE_NCCL
    if (g->kind == GPU_COMM_NCCL &&
        comm_nccl_rank_open(g->world, rank, err) != 0)
        return -1;
#endif
    if (g->kind == GPU_COMM_DEVICE &&
        comm_exchange_rank_open(g->exchange, rank, err) != 0)
        return -1;
    /* the comm has streams: the dp reduction overlaps the backward */
    return gpu_grad_overlap_open(&g->overlaps[rank], err);
}

static void close_rank(void *data, int rank)
{
    pipeline_gpu *g = data;
    gpu_grad_overlap_close(g->overlaps[rank]);
    g->overlaps[rank] = NULL;
#ifdef PARTITA_HAVE_NCCL
    if (g->kind == GPU_COMM_NCCL)
        comm_nccl_rank_close(g->world, rank);
#endif
    if (g->kind == GPU_COMM_HOST)
        comm_staged_rank_close(g->staged, rank);
    if (g->kind == GPU_COMM_DEVICE)
        comm_exchange_rank_close(g->exchange, rank);
    cuda_rank_device_close();
}

#ifdef PARTITA_HAVE_NCCL
/* Runs on each rank's thread before it frees its stage: after a failure
 * a rank's kernels may still wait on a dead peer, and freeing device
 * memory would wait for them. */
static int abort_if_stuck(void *data, int rank, model_stage *stage,
                          pt_error *err)
{
    (void)stage;
    (void)err;
    comm_nccl_rank_abort_if_stuck(data, rank);
    return 0;
}
#endif

/* Two ranks with an sm_limit on one GPU. */
static bool limited_on_same_gpu(const device_spec *a, const device_spec *b)
{
    return a->index == b->index && a->sm_limit > 0 && b->sm_limit > 0;
}

/* For each rank with an sm_limit that shares its GPU with another such
 * rank: sliced, and the sm_limits of those before it, whose slices its
 * own follows. A rank without sm_limit uses the whole GPU, over
 * everyone's slices. */
static int plan_sm_slices(pipeline_gpu *g, int ranks, pt_error *err)
{
    g->sm_before = malloc((size_t)ranks * (size_t)ranks *
                          sizeof *g->sm_before);
    g->sm_before_offset = malloc((size_t)(ranks + 1) *
                                 sizeof *g->sm_before_offset);
    g->sliced = calloc((size_t)ranks, sizeof *g->sliced);
    if (g->sm_before == NULL || g->sm_before_offset == NULL ||
        g->sliced == NULL)
        return pt_fail(err, "gpu launcher: out of memory for %d ranks",
                       ranks);
    int used = 0;
    for (int rank = 0; rank < ranks; rank++) {
        g->sm_before_offset[rank] = used;
        for (int other = 0; other < ranks; other++) {
            if (other == rank ||
                !limited_on_same_gpu(&g->devices[other], &g->devices[rank]))
                continue;
            g->sliced[rank] = true;
            if (other < rank)
                g->sm_before[used++] = g->devices[other].sm_limit;
        }
    }
    g->sm_before_offset[ranks] = used;
    return 0;
}

/* The device exchange's world: every rank on one GPU. */
static int make_exchange(pipeline_gpu *g, int ranks, const link_spec *links,
                         double timeout_s, pt_error *err)
{
    for (int rank = 1; rank < ranks; rank++)
        if (g->devices[rank].index != g->devices[0].index)
            return pt_fail(err, "gpu launcher: the device exchange joins "
                                "ranks of one GPU, but rank 0 is on cuda "
                                "device %d and rank %d on device %d",
                           g->devices[0].index, rank,
                           g->devices[rank].index);
    if (comm_exchange_create(ranks, links, timeout_s, &g->exchange, err) != 0)
        return -1;
    for (int rank = 0; rank < ranks; rank++)
        g->comms[rank] = comm_exchange_rank(g->exchange, rank);
    return 0;
}

static int make_world(pipeline_gpu *g, const pipeline_layout *layout,
                      const link_spec *links, double timeout_s,
                      pt_error *err)
{
    int ranks = layout->rank_count;
    if (g->kind == GPU_COMM_DEVICE)
        return make_exchange(g, ranks, links, timeout_s, err);
    if (g->kind == GPU_COMM_HOST) {
        if (comm_staged_create(ranks, timeout_s, &g->staged, err) != 0)
            return -1;
        for (int rank = 0; rank < ranks; rank++)
            g->comms[rank] = comm_staged_rank(g->staged, rank);
        return 0;
    }
#ifdef PARTITA_HAVE_NCCL
    int *indices = malloc((size_t)ranks * sizeof *indices);
    if (indices == NULL)
        return pt_fail(err, "gpu launcher: out of memory for %d ranks",
                       ranks);
    for (int rank = 0; rank < ranks; rank++)
        indices[rank] = g->devices[rank].index;
    comm_groups groups;
    int status = pipeline_layout_groups(layout, &groups, err);
    if (status == 0) {
        status = comm_nccl_create(ranks, indices, &groups, timeout_s,
                                  &g->world, err);
        comm_groups_free(&groups);
    }
    free(indices);
    if (status != 0)
        return -1;
    for (int rank = 0; rank < ranks; rank++)
        g->comms[rank] = comm_nccl_rank(g->world, rank);
    return 0;
#else
    return pt_fail(err, "parallel plans on the cuda backend over NCCL need "
                        "a build with NCCL (nccl.h and libnccl were not "
                        "found); --gpu-comm host runs them without it");
#endif
}

int pipeline_gpu_start(pipeline_gpu *out, const pipeline_layout *layout,
                       const device_spec *devices, gpu_comm_kind kind,
                       const link_spec *links, uint64_t seed,
                       double timeout_s, pt_error *err)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    int ranks = layout->rank_count;
    out->devices = malloc((size_t)ranks * sizeof *out->devices);
    out->comms = malloc((size_t)ranks * sizeof *out->comms);
    out->overlaps = calloc((size_t)ranks, sizeof *out->overlaps);
    if (out->devices == NULL || out->comms == NULL ||
        out->overlaps == NULL) {
        pipeline_gpu_stop(out);
        return pt_fail(err, "gpu launcher: out of memory for %d ranks",
                       ranks);
    }
    memcpy(out->devices, devices, (size_t)ranks * sizeof *devices);
    if (plan_sm_slices(out, ranks, err) != 0 ||
        make_world(out, layout, links, timeout_s, err) != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    pipeline_launch launch = {
        .backend = BACKEND_CUDA,
        .seed = seed,
        .timeout_s = timeout_s,
        .comms = out->comms,
        .hooks = {.open = open_rank, .close = close_rank, .data = out},
    };
    if (kind != GPU_COMM_HOST)
        launch.overlap = pipeline_gpu_overlap(out);
    if (pipeline_threads_start(&out->threads, layout, &launch, err) != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    return 0;
}

#ifdef PARTITA_HAVE_NCCL
int pipeline_gpu_start_rank(pipeline_gpu *out, const pipeline_layout *layout,
                            const device_spec *device, const comm *processes,
                            uint64_t seed, double timeout_s, pt_error *err)
{
    memset(out, 0, sizeof *out);
    out->kind = GPU_COMM_NCCL;
    int ranks = layout->rank_count, rank = processes->rank;
    if (rank < 0 || rank >= ranks)
        return pt_fail(err, "gpu launcher: this process is rank %d, the "
                            "layout has %d ranks",
                       rank, ranks);
    /* open_rank finds the rank's device by rank; one process per GPU, so
     * no rank shares its GPU with another of this process */
    out->devices = calloc((size_t)ranks, sizeof *out->devices);
    out->comms = malloc(sizeof *out->comms);
    out->sm_before_offset = calloc((size_t)ranks + 1,
                                   sizeof *out->sm_before_offset);
    out->sm_before = malloc(sizeof *out->sm_before);
    out->sliced = calloc((size_t)ranks, sizeof *out->sliced);
    out->overlaps = calloc((size_t)ranks, sizeof *out->overlaps);
    if (out->devices == NULL || out->comms == NULL ||
        out->sm_before_offset == NULL || out->sm_before == NULL ||
        out->sliced == NULL || out->overlaps == NULL) {
        pipeline_gpu_stop(out);
        return pt_fail(err, "gpu launcher: out of memory");
    }
    out->devices[rank] = *device;
    comm_groups groups;
    int status = pipeline_layout_groups(layout, &groups, err);
    if (status == 0) {
        status = comm_nccl_create_rank(ranks, rank, device->index, &groups,
                                       timeout_s, processes, &out->world,
                                       err);
        comm_groups_free(&groups);
    }
    if (status != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    out->comms[0] = comm_nccl_rank(out->world, rank);
    pipeline_launch launch = {
        .backend = BACKEND_CUDA,
        .seed = seed,
        .timeout_s = timeout_s,
        .comms = out->comms,
        .this_rank_only = true,
        .hooks = {.open = open_rank, .close = close_rank, .data = out},
        .overlap = pipeline_gpu_overlap(out),
    };
    if (pipeline_threads_start(&out->threads, layout, &launch, err) != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    return 0;
}
#else
int pipeline_gpu_start_rank(pipeline_gpu *out, const pipeline_layout *layout,
                            const device_spec *device, const comm *processes,
                            uint64_t seed, double timeout_s, pt_error *err)
{
    (void)layout;
    (void)device;
    (void)processes;
    (void)seed;
    (void)timeout_s;
    memset(out, 0, sizeof *out);
    return pt_fail(err, "one process per rank on the cuda backend needs a "
                        "build with NCCL (nccl.h and libnccl were not "
                        "found)");
}
#endif

double pipeline_gpu_comm_device_bytes(const pipeline_gpu *g, int rank)
{
    if (g->kind == GPU_COMM_DEVICE && g->exchange != NULL)
        return comm_exchange_rank_peak_bytes(g->exchange, rank);
#ifdef PARTITA_HAVE_NCCL
    if (g->kind == GPU_COMM_NCCL && g->world != NULL)
        return comm_nccl_rank_peak_bytes(g->world, rank);
#else
    (void)g;
    (void)rank;
#endif
    return 0.0;
}

void pipeline_gpu_stop(pipeline_gpu *g)
{
#ifdef PARTITA_HAVE_NCCL
    if (g->world != NULL && g->threads.workers != NULL) {
        pt_error ignored = {{0}};
        for (int rank = g->threads.first_local_rank;
             rank < g->threads.first_local_rank +
                        g->threads.local_rank_count;
             rank++)
            pipeline_threads_on_rank(&g->threads, rank, abort_if_stuck,
                                     g->world, &ignored);
    }
#endif
    pipeline_threads_destroy(&g->threads);
#ifdef PARTITA_HAVE_NCCL
    comm_nccl_destroy(g->world);
#endif
    comm_staged_destroy(g->staged);
    comm_exchange_destroy(g->exchange);
    free(g->devices);
    free(g->comms);
    free(g->sm_before);
    free(g->sm_before_offset);
    free(g->sliced);
    free(g->overlaps);
    memset(g, 0, sizeof *g);
}
