/*
 * The profiler's rounds of calls (docs/profiles.md, "Measuring"): a part's
 * calls queued back to back, and on the cuda backend the same calls
 * captured once as a CUDA graph and replayed, timed on the device, so that
 * a call's host work (the embedding's token plan and upload, the
 * launches) does not set its time when the host is slower than the GPU.
 */
#include "profiler/profiler.h"

#ifdef PARTITA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "executor/cuda/cuda_backend.h"
#endif

int profiler_queue_calls(model_stage *stage, const stage_io *io,
                         bool with_backward, int count, pt_error *err)
{
    for (int i = 0; i < count; i++)
        if (stage_forward(stage, 0, io, NULL, err) != 0 ||
            (with_backward && stage_backward(stage, 0, io, err) != 0))
            return -1;
    return 0;
}

#ifdef PARTITA_HAVE_CUDA
/* A round of one part's calls captured once as a CUDA graph, and the
 * events that time its replays on the stage's stream: the device's time
 * for the calls' work, whatever the host's pace (the host work of a call
 * is done once, at the capture; a replay re-reads the pinned host block
 * the capture's uploads came from, which holds the same tokens). */
typedef struct graph_round {
    cudaStream_t stream;
    cudaGraphExec_t exec;
    cudaEvent_t start, end;
} graph_round;

static void graph_round_destroy(graph_round *g)
{
    if (g->exec != NULL)
        cudaGraphExecDestroy(g->exec);
    if (g->start != NULL)
        cudaEventDestroy(g->start);
    if (g->end != NULL)
        cudaEventDestroy(g->end);
    *g = (graph_round){0};
}

/* Captures `count` calls and replays them once (the first launch uploads
 * the graph). false when the calls cannot be captured (a call that
 * synchronises, a library that refuses the capture); the error is
 * cleared and the caller queues them instead. */
static bool graph_round_capture(model_stage *stage, const stage_io *io,
                                bool with_backward, int count,
                                graph_round *out)
{
    pt_error ignored = {{0}};
    *out = (graph_round){.stream = cuda_stage_stream(stage)};
    if (cudaStreamBeginCapture(out->stream,
                               cudaStreamCaptureModeThreadLocal) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    int queued =
        profiler_queue_calls(stage, io, with_backward, count, &ignored);
    cudaGraph_t graph = NULL;
    bool ok = cudaStreamEndCapture(out->stream, &graph) == cudaSuccess &&
              queued == 0 && graph != NULL &&
              cudaGraphInstantiate(&out->exec, graph, 0) == cudaSuccess &&
              cudaEventCreate(&out->start) == cudaSuccess &&
              cudaEventCreate(&out->end) == cudaSuccess &&
              cudaGraphLaunch(out->exec, out->stream) == cudaSuccess &&
              cudaStreamSynchronize(out->stream) == cudaSuccess;
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (!ok) {
        (void)cudaGetLastError();
        graph_round_destroy(out);
    }
    return ok;
}

/* One replay of the round: device seconds per call. */
static int graph_round_seconds(const graph_round *g, int count, double *out,
                               pt_error *err)
{
    float elapsed_ms = 0.0f;
    cudaError_t status = cudaEventRecord(g->start, g->stream);
    if (status == cudaSuccess)
        status = cudaGraphLaunch(g->exec, g->stream);
    if (status == cudaSuccess)
        status = cudaEventRecord(g->end, g->stream);
    if (status == cudaSuccess)
        status = cudaEventSynchronize(g->end);
    if (status == cudaSuccess)
        status = cudaEventElapsedTime(&elapsed_ms, g->start, g->end);
    if (status != cudaSuccess)
        return pt_fail(err, "profiler: replaying a CUDA graph: %s",
                       cudaGetErrorString(status));
    *out = elapsed_ms * 1e-3 / count;
    return 0;
}

int profiler_graph_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err)
{
    graph_round forwards, pairs;
    if (!graph_round_capture(stage, io, false, count, &forwards))
        return 1;
    if (!graph_round_capture(stage, io, true, count, &pairs)) {
        graph_round_destroy(&forwards);
        return 1;
    }
    int status = 0;
    for (int r = 0; r < rounds && status == 0; r++)
        if (graph_round_seconds(&forwards, count, &forward[r], err) != 0 ||
            graph_round_seconds(&pairs, count, &pair[r], err) != 0)
            status = -1;
    graph_round_destroy(&forwards);
    graph_round_destroy(&pairs);
    return status;
}
#else
int profiler_graph_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err)
{
    (void)stage, (void)io, (void)count, (void)rounds;
    (void)forward, (void)pair, (void)err;
    return 1;
}
#endif
