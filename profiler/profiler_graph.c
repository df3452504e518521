/*
 * The profiler's rounds of calls (docs/profiles.md, "Measuring"): a part's
 * calls queued back to back; on the cuda backend the same calls queued
 * behind a gate the host opens once the round is queued (gated rounds,
 * the stream's time without the host's pace), or captured once as a CUDA
 * graph and replayed, the forward's share of a pair read off events
 * inside the pairs. Both are timed on the device, so that a call's host
 * work (the embedding's token plan and upload, the launches) does not set
 * its time when the host is slower than the GPU.
 */
#include "profiler/profiler.h"

#include <stdlib.h>

#ifdef PARTITA_HAVE_CUDA
#include <errno.h>
#include <pthread.h>
#include <time.h>

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

/* Begins a thread-local capture on the stream; false (the error cleared)
 * when it cannot. */
static bool capture_begin(cudaStream_t stream)
{
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) ==
        cudaSuccess)
        return true;
    (void)cudaGetLastError();
    return false;
}

/* Ends the capture on g->stream and, when the calls went in (`queued`),
 * instantiates the graph into g->exec and replays it once (the first
 * launch uploads it). false, the error cleared, when any of it fails. */
static bool capture_end_and_run(graph_round *g, bool queued)
{
    cudaGraph_t graph = NULL;
    bool ok = cudaStreamEndCapture(g->stream, &graph) == cudaSuccess &&
              queued && graph != NULL &&
              cudaGraphInstantiate(&g->exec, graph, 0) == cudaSuccess &&
              cudaGraphLaunch(g->exec, g->stream) == cudaSuccess &&
              cudaStreamSynchronize(g->stream) == cudaSuccess;
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (!ok)
        (void)cudaGetLastError();
    return ok;
}

/* Captures `count` forward + backward pairs and replays them once. false
 * when the calls cannot be captured (a call that synchronises, a library
 * that refuses the capture); the caller queues them instead. */
static bool graph_round_capture(model_stage *stage, const stage_io *io,
                                int count, graph_round *out)
{
    pt_error ignored = {{0}};
    *out = (graph_round){.stream = cuda_stage_stream(stage)};
    bool ok = cudaEventCreate(&out->start) == cudaSuccess &&
              cudaEventCreate(&out->end) == cudaSuccess &&
              capture_begin(out->stream);
    if (ok)
        ok = capture_end_and_run(
            out, profiler_queue_calls(stage, io, true, count, &ignored) == 0);
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

/* The pairs again, each forward between two marks: events recorded as
 * nodes of the graph (cudaEventRecordExternal; an event recorded in a
 * capture is otherwise only a dependency), 2 count + 1 of them. A replay
 * says what share of a pair its forward takes inside the pairs. A graph of
 * forwards alone did not say it: its time per call moved by up to 40 %
 * from one set of buffers to the next while the pairs' held within 2 %
 * (docs/profiles.md, "Repeatable entries"). */
typedef struct marked_round {
    graph_round graph;  /* its start and end events unused */
    cudaEvent_t *marks;
    int count;
} marked_round;

static void marked_round_destroy(marked_round *m)
{
    for (int i = 0; m->marks != NULL && i <= 2 * m->count; i++)
        if (m->marks[i] != NULL)
            cudaEventDestroy(m->marks[i]);
    free(m->marks);
    graph_round_destroy(&m->graph);
    *m = (marked_round){0};
}

/* Queues the marked pairs into a capture: cudaEventRecordExternal makes
 * each mark an event record node of the graph. */
static bool marked_calls(model_stage *stage, const stage_io *io,
                         const marked_round *m)
{
    const unsigned flags = cudaEventRecordExternal;
    pt_error ignored = {{0}};
    cudaStream_t stream = m->graph.stream;
    for (int i = 0; i < m->count; i++)
        if (cudaEventRecordWithFlags(m->marks[2 * i], stream, flags) !=
                cudaSuccess ||
            stage_forward(stage, 0, io, NULL, &ignored) != 0 ||
            cudaEventRecordWithFlags(m->marks[2 * i + 1], stream, flags) !=
                cudaSuccess ||
            stage_backward(stage, 0, io, &ignored) != 0)
            return false;
    return cudaEventRecordWithFlags(m->marks[2 * m->count], stream, flags) ==
           cudaSuccess;
}

/* The marks of `count` pairs on the stage's stream, nothing captured. */
static bool marks_create(model_stage *stage, int count, marked_round *out)
{
    *out = (marked_round){.graph = {.stream = cuda_stage_stream(stage)},
                          .count = count};
    out->marks = calloc((size_t)(2 * count + 1), sizeof *out->marks);
    bool ok = out->marks != NULL;
    for (int i = 0; ok && i <= 2 * count; i++)
        ok = cudaEventCreate(&out->marks[i]) == cudaSuccess;
    if (!ok)
        marked_round_destroy(out);
    return ok;
}

/* The forwards' share of the marked pairs' time, once they have run. */
static int marks_share(const marked_round *m, double *share, pt_error *err)
{
    cudaError_t status = cudaSuccess;
    double forwards_ms = 0.0;
    for (int i = 0; i < m->count && status == cudaSuccess; i++) {
        float ms = 0.0f;
        status = cudaEventElapsedTime(&ms, m->marks[2 * i],
                                      m->marks[2 * i + 1]);
        forwards_ms += ms;
    }
    float whole_ms = 0.0f;
    if (status == cudaSuccess)
        status = cudaEventElapsedTime(&whole_ms, m->marks[0],
                                      m->marks[2 * m->count]);
    if (status != cudaSuccess)
        return pt_fail(err, "profiler: reading the marks of a round: %s",
                       cudaGetErrorString(status));
    *share = whole_ms > 0.0f ? forwards_ms / whole_ms : 0.5;
    return 0;
}

/* Captures the marked pairs and replays them once; false when they
 * cannot be captured (the error cleared). */
static bool marked_round_capture(model_stage *stage, const stage_io *io,
                                 int count, marked_round *out)
{
    bool ok = marks_create(stage, count, out);
    if (ok && capture_begin(out->graph.stream))
        ok = capture_end_and_run(
            &out->graph,
            marked_calls(stage, io, out));
    else
        ok = false;
    if (!ok)
        marked_round_destroy(out);
    return ok;
}

/* One replay of the marked pairs: the forwards' share of their time. */
static int marked_round_share(const marked_round *m, double *share,
                              pt_error *err)
{
    cudaError_t status = cudaGraphLaunch(m->graph.exec, m->graph.stream);
    if (status == cudaSuccess)
        status = cudaStreamSynchronize(m->graph.stream);
    if (status != cudaSuccess)
        return pt_fail(err, "profiler: replaying a marked CUDA graph: %s",
                       cudaGetErrorString(status));
    return marks_share(m, share, err);
}

int profiler_graph_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err)
{
    graph_round pairs;
    marked_round marked;
    if (!graph_round_capture(stage, io, count, &pairs))
        return 1;
    if (!marked_round_capture(stage, io, count, &marked)) {
        graph_round_destroy(&pairs);
        return 1;
    }
    /* one replay of the marked pairs: the share is a ratio over `count`
     * pairs already, and a replay in every round took half the
     * embedding's measuring time (profile_repeat.sh says whether the
     * forwards still repeat) */
    double share = 0.0;
    int status = marked_round_share(&marked, &share, err);
    for (int r = 0; r < rounds && status == 0; r++) {
        if (graph_round_seconds(&pairs, count, &pair[r], err) != 0)
            status = -1;
        else
            forward[r] = share * pair[r];
    }
    graph_round_destroy(&pairs);
    marked_round_destroy(&marked);
    return status;
}

/* ------------------------------------------------------------ gated */

/* The most kernels and copies a gated round queues: the stream holds its
 * launches while the gate is shut, and a launch blocks once the stream's
 * queue is full (about a thousand entries), which would wait for the gate
 * the host opens only after its last launch. */
#define GATED_NODES_MAX 256
/* A round holds one pair at least: a pair of more kernels and copies than
 * this (a deep layer stack's) is not gated, three quarters of the queue
 * being as far as its launches may go behind a shut gate; the caller
 * times it otherwise (profiler.c: a stack as a CUDA graph). */
#define GATED_PAIR_NODES_MAX 768
/* A gate the host failed to open in this time opens itself (the round is
 * then refused and the part queued on the host clock). */
#define GATE_TIMEOUT_S 10

/* A host function on the stream that holds it until the host opens it. */
typedef struct stream_gate {
    pthread_mutex_t lock;
    pthread_cond_t opened;
    bool open;
    bool timed_out;
} stream_gate;

static void CUDART_CB gate_hold(void *data)
{
    stream_gate *gate = data;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += GATE_TIMEOUT_S;
    pthread_mutex_lock(&gate->lock);
    while (!gate->open && !gate->timed_out)
        if (pthread_cond_timedwait(&gate->opened, &gate->lock, &deadline) ==
            ETIMEDOUT)
            gate->timed_out = true;
    pthread_mutex_unlock(&gate->lock);
}

static void gate_open(stream_gate *gate)
{
    pthread_mutex_lock(&gate->lock);
    gate->open = true;
    pthread_cond_signal(&gate->opened);
    pthread_mutex_unlock(&gate->lock);
}

/* The kernels and copies of one forward + backward pair, from a capture
 * of it (not run); 0 when it cannot be captured. */
static int pair_nodes(model_stage *stage, const stage_io *io)
{
    cudaStream_t stream = cuda_stage_stream(stage);
    if (!capture_begin(stream))
        return 0;
    pt_error ignored = {{0}};
    int queued = profiler_queue_calls(stage, io, true, 1, &ignored);
    cudaGraph_t graph = NULL;
    size_t nodes = 0;
    bool ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
              queued == 0 && graph != NULL &&
              cudaGraphGetNodes(graph, NULL, &nodes) == cudaSuccess;
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (!ok)
        (void)cudaGetLastError();
    return ok ? (int)nodes : 0;
}

/* One gated round: `count` forwards (with_backward: forward + backward
 * pairs) queued behind a shut gate, timed by events from its opening to
 * the end; seconds per call. 1 when the gate opened itself (the host was
 * held up). Forwards alone, not a share of the pairs as in a graph: gated
 * forwards held within 3 % between processes where the share moved 4 %
 * (docs/profiles.md, "Repeatable entries"). */
static int gated_round(model_stage *stage, const stage_io *io,
                       bool with_backward, int count, const graph_round *g,
                       double *seconds, pt_error *err)
{
    stream_gate gate = {.open = false};
    pthread_mutex_init(&gate.lock, NULL);
    pthread_cond_init(&gate.opened, NULL);
    cudaError_t status = cudaLaunchHostFunc(g->stream, gate_hold, &gate);
    bool queued =
        status == cudaSuccess &&
        cudaEventRecord(g->start, g->stream) == cudaSuccess &&
        profiler_queue_calls(stage, io, with_backward, count, err) == 0 &&
        cudaEventRecord(g->end, g->stream) == cudaSuccess;
    gate_open(&gate);
    /* whatever failed, the stream drains before the gate goes away */
    cudaError_t drained = cudaStreamSynchronize(g->stream);
    pthread_cond_destroy(&gate.opened);
    pthread_mutex_destroy(&gate.lock);
    if (status != cudaSuccess || drained != cudaSuccess)
        return pt_fail(err, "profiler: a gated round: %s",
                       cudaGetErrorString(status != cudaSuccess ? status
                                                                : drained));
    float elapsed_ms = 0.0f;
    if (!queued ||
        cudaEventElapsedTime(&elapsed_ms, g->start, g->end) != cudaSuccess)
        return pt_fail(err, "profiler: queueing or timing a gated round "
                            "failed");
    *seconds = elapsed_ms * 1e-3 / count;
    return gate.timed_out ? 1 : 0;
}

int profiler_gated_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err)
{
    int nodes = pair_nodes(stage, io);
    if (nodes < 1 || nodes > GATED_PAIR_NODES_MAX)
        return 1;
    int fit = GATED_NODES_MAX / nodes;
    if (count > fit)
        count = fit > 1 ? fit : 1;
    graph_round g = {.stream = cuda_stage_stream(stage)};
    if (cudaEventCreate(&g.start) != cudaSuccess ||
        cudaEventCreate(&g.end) != cudaSuccess) {
        graph_round_destroy(&g);
        return pt_fail(err, "profiler: creating CUDA events");
    }
    int status = 0;
    for (int r = 0; r < rounds && status == 0; r++) {
        status = gated_round(stage, io, false, count, &g, &forward[r], err);
        if (status == 0)
            status = gated_round(stage, io, true, count, &g, &pair[r], err);
    }
    graph_round_destroy(&g);
    return status;
}

#else
int profiler_gated_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err)
{
    (void)stage, (void)io, (void)count, (void)rounds;
    (void)forward, (void)pair, (void)err;
    return 1;
}

int profiler_graph_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err)
{
    (void)stage, (void)io, (void)count, (void)rounds;
    (void)forward, (void)pair, (void)err;
    return 1;
}
#endif
