/*
 * The data-parallel reduction overlapped with the backward on GPUs
 * (executor/parallel/parallel.h: pipeline_grad_overlap), for the GPU
 * launcher over a comm with stream-ordered collectives (NCCL, the device
 * exchange). Armed for the last micro-batch's backward, the cuda stage
 * calls back as it enqueues each layer (cuda_stage_set_grad_hook); every
 * bucket whose gradients are then all enqueued gets an event on the
 * stage's stream, and its sum is enqueued on the rank's reduction stream
 * behind that event, so it runs while the backward goes on with the
 * layers below. After the backward the buckets left (the embedding's)
 * follow, the stage's stream waits for the reduction stream (the
 * optimizer reads the sums), and the host waits for the reductions under
 * the comm's deadline.
 */
#include "executor/parallel/parallel.h"

#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_backend.h"

/* One rank's reduction stream and what an armed backward works with;
 * touched by the rank's thread only. */
struct gpu_grad_overlap {
    cudaStream_t stream;         /* in the rank's slice */
    cudaEvent_t produced;        /* the stage's stream, before a bucket */
    cudaEvent_t reduced;         /* the reduction stream, after all */
    bool armed;
    model_stage *stage;
    const comm *c;
    int *group;                  /* owned while armed */
    int group_size;
    size_t *runs;                /* owned while armed; NULL: all-reduce */
    const pipeline_buckets *buckets;
    int launched;                /* buckets enqueued, in order */
    int status;                  /* the first failure inside the hook */
    pt_error err;
};

int gpu_grad_overlap_open(gpu_grad_overlap **out, pt_error *err)
{
    gpu_grad_overlap *o = calloc(1, sizeof *o);
    *out = o;
    if (o == NULL)
        return pt_fail(err, "gradient overlap: out of memory");
    if (cuda_rank_stream_create(&o->stream, err) != 0)
        return -1;
    cudaError_t status =
        cudaEventCreateWithFlags(&o->produced, cudaEventDisableTiming);
    if (status == cudaSuccess)
        status = cudaEventCreateWithFlags(&o->reduced, cudaEventDisableTiming);
    if (status != cudaSuccess)
        return pt_fail(err, "gradient overlap: cudaEventCreate: %s",
                       cudaGetErrorString(status));
    return 0;
}

void gpu_grad_overlap_close(gpu_grad_overlap *o)
{
    if (o == NULL)
        return;
    if (o->stream != NULL) {
        cudaStreamSynchronize(o->stream);
        cudaStreamDestroy(o->stream);
    }
    if (o->produced != NULL)
        cudaEventDestroy(o->produced);
    if (o->reduced != NULL)
        cudaEventDestroy(o->reduced);
    cudaGetLastError();
    free(o->group);
    free(o->runs);
    free(o);
}

/* A bucket's sum on the reduction stream, behind the stage's work so far. */
static int launch_bucket(gpu_grad_overlap *o, pipeline_bucket bucket)
{
    cudaStream_t stage_stream = cuda_stage_stream(o->stage);
    cudaError_t status = cudaEventRecord(o->produced, stage_stream);
    if (status == cudaSuccess)
        status = cudaStreamWaitEvent(o->stream, o->produced, 0);
    if (status != cudaSuccess)
        return pt_fail(&o->err, "rank %d: gradient bucket at float %zu: %s",
                       o->c->rank, bucket.offset,
                       cudaGetErrorString(status));
    return pipeline_reduce_bucket(o->c, o->group, o->group_size,
                                  o->stage, bucket, o->runs,
                                  o->stream, &o->err);
}

/* The stage's hook: every bucket that lies wholly from ready_from on. */
static void launch_ready(void *data, size_t ready_from)
{
    gpu_grad_overlap *o = data;
    while (o->status == 0 && o->launched < o->buckets->count &&
           o->buckets->buckets[o->launched].offset >= ready_from)
        o->status = launch_bucket(o, o->buckets->buckets[o->launched++]);
}

static void disarm(gpu_grad_overlap *o)
{
    cuda_stage_set_grad_hook(o->stage, NULL, NULL);
    free(o->group);
    free(o->runs);
    o->group = NULL;
    o->runs = NULL;
    o->armed = false;
}

static int overlap_begin(void *data, int rank, model_stage *stage,
                         const comm *c, const int *group, int group_size,
                         const pipeline_buckets *buckets,
                         const size_t *run_offsets, pt_error *err)
{
    gpu_grad_overlap *o = ((pipeline_gpu *)data)->overlaps[rank];
    if (o == NULL || !comm_has_stream_ops(c))
        return 1;
    size_t runs_bytes = ((size_t)group_size + 1) * sizeof *o->runs;
    o->stage = stage;
    o->group = malloc((size_t)group_size * sizeof *o->group);
    o->runs = run_offsets != NULL ? malloc(runs_bytes) : NULL;
    if (o->group == NULL || (run_offsets != NULL && o->runs == NULL)) {
        disarm(o);
        return pt_fail(err, "gradient overlap: out of memory");
    }
    memcpy(o->group, group, (size_t)group_size * sizeof *group);
    if (run_offsets != NULL)
        memcpy(o->runs, run_offsets, runs_bytes);
    o->group_size = group_size;
    o->c = c;
    o->buckets = buckets;
    o->launched = 0;
    o->status = 0;
    o->armed = true;
    cuda_stage_set_grad_hook(stage, launch_ready, o);
    return 0;
}

static int overlap_end(void *data, int rank, model_stage *stage,
                       const comm *c, pt_error *err)
{
    (void)stage;
    gpu_grad_overlap *o = ((pipeline_gpu *)data)->overlaps[rank];
    if (o == NULL || !o->armed)
        return 0;
    launch_ready(o, 0);
    int status = o->status;
    if (status != 0)
        pt_fail(err, "%s", o->err.message);
    cudaError_t cuda = cudaSuccess;
    if (status == 0) {
        cuda = cudaEventRecord(o->reduced, o->stream);
        if (cuda == cudaSuccess)
            cuda = cudaStreamWaitEvent(cuda_stage_stream(o->stage),
                                       o->reduced, 0);
        if (cuda != cudaSuccess)
            status = pt_fail(err, "rank %d: gradient overlap: %s", rank,
                             cudaGetErrorString(cuda));
    }
    if (status == 0)
        status = comm_wait_stream(c, o->stream,
                                  "the data-parallel reduction", err);
    disarm(o);
    return status;
}

pipeline_grad_overlap pipeline_gpu_overlap(pipeline_gpu *g)
{
    return (pipeline_grad_overlap){.begin = overlap_begin,
                                   .end = overlap_end, .data = g};
}
