/*
 * The GPU launcher of parallel plans (declared in executor/comm_nccl.h):
 * a NCCL world over the ranks' GPUs and the generic launcher
 * (pipeline_threads_start) with hooks that put each rank's thread on its
 * GPU (green context, memory cap) and open its comm streams before the
 * thread makes its cuda stage.
 */
#include "executor/comm_nccl.h"

#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_backend.h"

static int open_rank(void *data, int rank, pt_error *err)
{
    pipeline_gpu *g = data;
    const device_spec *device = &g->devices[rank];
    if (cuda_rank_device_open(device->index, device->sm_limit,
                              device->memory_limit_gib * PT_GIB, err) != 0)
        return -1;
    return comm_nccl_rank_open(g->world, rank, err);
}

static void close_rank(void *data, int rank)
{
    pipeline_gpu *g = data;
    comm_nccl_rank_close(g->world, rank);
    cuda_rank_device_close();
}

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

int pipeline_gpu_start(pipeline_gpu *out, const pipeline_layout *layout,
                       const device_spec *devices, uint64_t seed,
                       double timeout_s, pt_error *err)
{
    memset(out, 0, sizeof *out);
    int ranks = layout->rank_count;
    out->devices = malloc((size_t)ranks * sizeof *out->devices);
    out->comms = malloc((size_t)ranks * sizeof *out->comms);
    int *indices = malloc((size_t)ranks * sizeof *indices);
    if (out->devices == NULL || out->comms == NULL || indices == NULL) {
        free(indices);
        pipeline_gpu_stop(out);
        return pt_fail(err, "gpu launcher: out of memory for %d ranks",
                       ranks);
    }
    memcpy(out->devices, devices, (size_t)ranks * sizeof *devices);
    for (int rank = 0; rank < ranks; rank++)
        indices[rank] = devices[rank].index;
    comm_groups groups;
    int status = pipeline_layout_groups(layout, &groups, err);
    if (status == 0) {
        status = comm_nccl_create(ranks, indices, &groups, timeout_s,
                                  &out->world, err);
        comm_groups_free(&groups);
    }
    free(indices);
    if (status != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    for (int rank = 0; rank < ranks; rank++)
        out->comms[rank] = comm_nccl_rank(out->world, rank);
    pipeline_launch launch = {
        .backend = BACKEND_CUDA,
        .seed = seed,
        .timeout_s = timeout_s,
        .comms = out->comms,
        .hooks = {.open = open_rank, .close = close_rank, .data = out},
    };
    if (pipeline_threads_start(&out->threads, layout, &launch, err) != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    return 0;
}

int pipeline_gpu_start_rank(pipeline_gpu *out, const pipeline_layout *layout,
                            const device_spec *device, const comm *processes,
                            uint64_t seed, double timeout_s, pt_error *err)
{
    memset(out, 0, sizeof *out);
    int ranks = layout->rank_count, rank = processes->rank;
    if (rank < 0 || rank >= ranks)
        return pt_fail(err, "gpu launcher: this process is rank %d, the "
                            "layout has %d ranks",
                       rank, ranks);
    /* open_rank finds the rank's device by rank */
    out->devices = calloc((size_t)ranks, sizeof *out->devices);
    out->comms = malloc(sizeof *out->comms);
    if (out->devices == NULL || out->comms == NULL) {
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
    };
    if (pipeline_threads_start(&out->threads, layout, &launch, err) != 0) {
        pipeline_gpu_stop(out);
        return -1;
    }
    return 0;
}

void pipeline_gpu_stop(pipeline_gpu *g)
{
    if (g->world != NULL && g->threads.workers != NULL) {
        pt_error ignored = {{0}};
        for (int rank = g->threads.first_local_rank;
             rank < g->threads.first_local_rank +
                        g->threads.local_rank_count;
             rank++)
            pipeline_threads_on_rank(&g->threads, rank, abort_if_stuck,
                                     g->world, &ignored);
    }
    pipeline_threads_destroy(&g->threads);
    comm_nccl_destroy(g->world);
    free(g->devices);
    free(g->comms);
    memset(g, 0, sizeof *g);
}
