/*
 * The profiler's stepped rounds (`--timing step`, docs/profiles.md,
 * "Stepped timing"): the layer stage timed inside training steps of the
 * whole part chain -- the embedding's forward, the layer stage's, the
 * head's forward and backward, the layer stage's and the embedding's
 * backward, then every stage's AdamW step -- captured once as a CUDA graph
 * with marks around the layer's and the head's calls
 * (the three stages' streams ordered by events, as one stream would run
 * them) and replayed back to back. A whole H200 training GPT-2 1.5B at
 * micro-batch 8 holds its 700 W cap at 1,500-1,800 MHz, and its layers
 * ran 4-12 % slower than the same layer timed in rounds of its own calls,
 * which held 1,965 MHz at 667 W even after 1.5 s of back-to-back load
 * (docs/records/gpu-runs.md, tenth session): the steps' mix (the head's
 * large products, AdamW's traffic) sets the clock the layers run at.
 */
#include "profiler/part_chain.h"

#include <math.h>

#include "common/common.h"

#ifdef PARTITA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "executor/cuda/cuda_backend.h"

/* The AdamW step's learning rate: small, so that repeated steps leave the
 * parameters (and so the data the kernels see) about as drawn. */
#define STEP_LEARNING_RATE 1e-6f
/* The most steps queued to warm the device (profiler_options.hold_s, at
 * the pace of one step). */
#define STEP_WARM_MAX 5000
/* Without a hold asked for, the steps run this long before the timed
 * ones: the clock under the 700 W cap settled within 0.3-0.5 s of load
 * in the samples of the tenth session. */
#define STEP_WARM_DEFAULT_S 1.0

/* The marks of a step: event record nodes around the layer's and the
 * head's forward and backward. */
enum { LAYER_MARKS = 0, HEAD_MARKS = 4, STEP_MARKS = 8 };

/* One step's graph, its stream (the embedding's, where the capture
 * begins and ends) and its marks. */
typedef struct step_graph {
    cudaStream_t stream;
    cudaGraphExec_t exec;
    cudaEvent_t order;           /* a call's end, for the next stage */
    cudaEvent_t marks[STEP_MARKS]; /* of each part: forward start, end,
                                      backward start, end */
} step_graph;

static void step_graph_destroy(step_graph *g)
{
    if (g->exec != NULL)
        cudaGraphExecDestroy(g->exec);
    if (g->order != NULL)
        cudaEventDestroy(g->order);
    for (int i = 0; i < STEP_MARKS; i++)
        if (g->marks[i] != NULL)
            cudaEventDestroy(g->marks[i]);
    *g = (step_graph){0};
}

/* Makes the next call, on `stage`, wait for the last one, made on
 * *last (NULL: none yet), as one stream would. */
static bool follow(step_graph *g, cudaStream_t *last, model_stage *stage)
{
    cudaStream_t stream = cuda_stage_stream(stage);
    bool ok = true;
    if (*last != NULL && *last != stream)
        ok = cudaEventRecord(g->order, *last) == cudaSuccess &&
             cudaStreamWaitEvent(stream, g->order, 0) == cudaSuccess;
    *last = stream;
    return ok;
}

static bool mark(step_graph *g, model_stage *stage, int which)
{
    return cudaEventRecordWithFlags(g->marks[which], cuda_stage_stream(stage),
                                    cudaEventRecordExternal) == cudaSuccess;
}

/* The calls of one step into the capture begun on the embedding's
 * stream; they end on it again (the capture must rejoin there). */
static bool queue_step(part_chain *chain, int mbs, step_graph *g)
{
    pt_error ignored = {{0}};
    adamw_config config = adamw_defaults();
    model_stage *embedding = &chain->embedding, *layer = &chain->layer,
                *head = &chain->head;
    stage_io embedding_io = {.mbs = mbs, .tokens = chain->tokens};
    stage_io layer_io = {.mbs = mbs,
                         .input = stage_input_buffer(layer, 0),
                         .output_grad = stage_input_grad(head)};
    stage_io head_io = {.mbs = mbs, .tokens = chain->tokens,
                        .input = stage_input_buffer(head, 0),
                        .loss_scale = 1.0f};
    embedding_io.output_grad = stage_input_grad(layer);
    cudaStream_t last = NULL;
    model_stage *stages[] = {embedding, layer, head};
    for (int i = 0; i < 3; i++)
        if (!follow(g, &last, stages[i]) ||
            stage_zero_grads(stages[i], &ignored) != 0)
            return false;
    bool ok =
        follow(g, &last, embedding) &&
        stage_forward(embedding, 0, &embedding_io, NULL, &ignored) == 0 &&
        follow(g, &last, layer) && mark(g, layer, LAYER_MARKS) &&
        stage_forward(layer, 0, &layer_io, NULL, &ignored) == 0 &&
        mark(g, layer, LAYER_MARKS + 1) && follow(g, &last, head) &&
        mark(g, head, HEAD_MARKS) &&
        stage_forward(head, 0, &head_io, NULL, &ignored) == 0 &&
        mark(g, head, HEAD_MARKS + 1) && mark(g, head, HEAD_MARKS + 2) &&
        stage_backward(head, 0, &head_io, &ignored) == 0 &&
        mark(g, head, HEAD_MARKS + 3) && follow(g, &last, layer) &&
        mark(g, layer, LAYER_MARKS + 2) &&
        stage_backward(layer, 0, &layer_io, &ignored) == 0 &&
        mark(g, layer, LAYER_MARKS + 3) && follow(g, &last, embedding) &&
        stage_backward(embedding, 0, &embedding_io, &ignored) == 0;
    for (int i = 0; ok && i < 3; i++)
        ok = follow(g, &last, stages[i]) &&
             stage_adamw_step(stages[i], &config, STEP_LEARNING_RATE, 1.0f,
                              &ignored) == 0;
    return ok && follow(g, &last, embedding);
}

/* Captures one step and runs it once (the first launch uploads it);
 * false, the error cleared, when it cannot be captured. */
static bool step_graph_capture(part_chain *chain, int mbs, step_graph *out)
{
    *out = (step_graph){.stream = cuda_stage_stream(&chain->embedding)};
    bool ok = cudaEventCreateWithFlags(&out->order,
                                       cudaEventDisableTiming) ==
              cudaSuccess;
    for (int i = 0; ok && i < STEP_MARKS; i++)
        ok = cudaEventCreate(&out->marks[i]) == cudaSuccess;
    ok = ok && cudaStreamBeginCapture(out->stream,
                                      cudaStreamCaptureModeThreadLocal) ==
                   cudaSuccess;
    if (ok) {
        bool queued = queue_step(chain, mbs, out);
        cudaGraph_t graph = NULL;
        ok = cudaStreamEndCapture(out->stream, &graph) == cudaSuccess &&
             queued && graph != NULL &&
             cudaGraphInstantiate(&out->exec, graph, 0) == cudaSuccess &&
             cudaGraphLaunch(out->exec, out->stream) == cudaSuccess &&
             cudaStreamSynchronize(out->stream) == cudaSuccess;
        if (graph != NULL)
            cudaGraphDestroy(graph);
    }
    if (!ok) {
        (void)cudaGetLastError();
        step_graph_destroy(out);
    }
    return ok;
}

/* One replay, waited for: the forward and backward times of the part
 * whose marks begin at `first`. */
static int step_seconds(const step_graph *g, int first, double *forward,
                        double *backward, pt_error *err)
{
    float ms[2] = {0.0f, 0.0f};
    cudaError_t status = cudaGraphLaunch(g->exec, g->stream);
    if (status == cudaSuccess)
        status = cudaStreamSynchronize(g->stream);
    if (status == cudaSuccess)
        status = cudaEventElapsedTime(&ms[0], g->marks[first],
                                      g->marks[first + 1]);
    if (status == cudaSuccess)
        status = cudaEventElapsedTime(&ms[1], g->marks[first + 2],
                                      g->marks[first + 3]);
    if (status != cudaSuccess)
        return pt_fail(err, "profiler: a stepped round: %s",
                       cudaGetErrorString(status));
    *forward = ms[0] * 1e-3;
    *backward = ms[1] * 1e-3;
    return 0;
}

int chain_step_rounds(part_chain *chain, int part, int mbs, double warm_s,
                      int rounds, double *forward, double *pair,
                      pt_error *err)
{
    step_graph g;
    if ((part != 1 && part != 2) || !step_graph_capture(chain, mbs, &g))
        return 1;
    int first = part == 1 ? LAYER_MARKS : HEAD_MARKS;
    double f = 0.0, b = 0.0;
    double start = pt_monotonic_seconds();
    int status = step_seconds(&g, first, &f, &b, err);
    /* the warm steps queued back to back, not waited for: the first
     * timed step follows them without a pause */
    double pace = fmax(pt_monotonic_seconds() - start, 1e-4);
    double wanted = ceil((warm_s > 0.0 ? warm_s : STEP_WARM_DEFAULT_S) / pace);
    int warm = wanted > STEP_WARM_MAX ? STEP_WARM_MAX : (int)wanted;
    for (int i = 0; i < warm && status == 0; i++)
        if (cudaGraphLaunch(g.exec, g.stream) != cudaSuccess)
            status = pt_fail(err, "profiler: queueing a warm step");
    for (int r = 0; r < rounds && status == 0; r++) {
        status = step_seconds(&g, first, &forward[r], &b, err);
        pair[r] = forward[r] + b;
    }
    step_graph_destroy(&g);
    return status;
}
#else
int chain_step_rounds(part_chain *chain, int part, int mbs, double warm_s,
                      int rounds, double *forward, double *pair,
                      pt_error *err)
{
    (void)chain, (void)part, (void)mbs, (void)warm_s, (void)rounds;
    (void)forward, (void)pair, (void)err;
    return 1;
}
#endif
