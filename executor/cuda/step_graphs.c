/*
 * The one-stage step's forward and backward replayed as CUDA graphs
 * (cuda_stage.h, cuda_pass_graphs), and a pipeline stage's by slot. A
 * step kept on the device enqueues
 * the same 400 to 1,000 kernels with the same pointers every step; one
 * launched at a time, each costs the host a few microseconds and leaves
 * the GPU a gap of about 2 us behind the last one, and the GPU waits for
 * the host at every step's start. Replayed from a graph, the host
 * launches a pass at once and the device runs its kernels back to back.
 * The graphs change no kernel, so a step gives the same bits with or
 * without them (tests/executor/gpu/test_cuda_training.c). A pipeline
 * stage's passes use the same fixed buffers for every call of one
 * activation slot (its input, kept activations, output), so each slot
 * has a graph of its forward and one of its backward; the wait for the
 * stream and the head's loss read, which end such a pass, come after
 * the replay (GPT-2 774M at micro-batch 2 stepped 3.8 % slower without
 * graphs on one H200: docs/records/gpu-runs.md, thirteenth session).
 * Also the side zeroing of such a step's gradients (cuda_side_zero),
 * with the ranges its first products write left out.
 */
#include <stdlib.h>

#include "executor/cuda/cuda_stage.h"

#include "executor/cuda/cuda_check.h"

/* Whether this call may go through a graph: a step kept on the device
 * (whole model, one rank, no units, no offload, not the profiler's
 * back-to-back calls: train.c) with nothing hooked on the gradients, or
 * the forward of a dp rank (its hook enqueues the buckets' sums from the
 * host as the backward goes; a forward calls none) that has a GPU to
 * itself: beside other ranks' slices of one H200 such forwards stepped
 * 3-4 % slower from graphs (docs/records/gpu-runs.md, thirteenth session,
 * call 8). */
static bool graphable(const model_stage *stage, bool backward)
{
    const cuda_stage_state *state = state_of(stage);
    return state->graphs.enabled && stage->step.on_device &&
           (state->grad_hook == NULL ||
            (!backward && !cuda_rank_shares_device()));
}

static bool same_key(const cuda_pass_graph *graph, int slot,
                     const stage_io *io)
{
    return graph->slot == slot && graph->mbs == io->mbs &&
           graph->loss_scale == io->loss_scale;
}

static void graph_forget(cuda_pass_graph *graph)
{
    if (graph->exec != NULL)
        cudaGraphExecDestroy(graph->exec);
    graph->exec = NULL;
    graph->plain_calls = 0;
}

/* Captures the body into graph->exec and launches it; on a failed
 * capture (an operation a capture refuses) the graphs go off and the
 * body runs plainly, the capture having run nothing. */
static int capture_and_launch(model_stage *stage, cuda_pass_graph *graph,
                              int slot, const stage_io *io,
                              cuda_pass_body body, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (cudaStreamBeginCapture(state->stream,
                               cudaStreamCaptureModeThreadLocal) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        state->graphs.enabled = false;
        return body(stage, slot, io, err);
    }
    pt_error capture_err;
    int body_status = body(stage, slot, io, &capture_err);
    cudaGraph_t captured = NULL;
    bool ok = cudaStreamEndCapture(state->stream, &captured) ==
                  cudaSuccess &&
              body_status == 0 && captured != NULL &&
              cudaGraphInstantiate(&graph->exec, captured, 0) ==
                  cudaSuccess;
    if (captured != NULL)
        cudaGraphDestroy(captured);
    if (!ok) {
        (void)cudaGetLastError();
        graph->exec = NULL;
        state->graphs.enabled = false;
        return body(stage, slot, io, err);
    }
    CUDA_TRY(cudaGraphLaunch(graph->exec, state->stream));
    state->graphs.replays++;
    return 0;
}

/* A graphable call through `graph`: replayed, captured, or run plainly
 * at its key's first call. */
static int run_through(model_stage *stage, cuda_pass_graph *graph, int slot,
                       const stage_io *io, cuda_pass_body body,
                       pt_error *err)
{
    if (!same_key(graph, slot, io)) {
        graph_forget(graph);
        graph->slot = slot;
        graph->mbs = io->mbs;
        graph->loss_scale = io->loss_scale;
    }
    if (graph->exec != NULL) {
        CUDA_TRY(cudaGraphLaunch(graph->exec, state_of(stage)->stream));
        state_of(stage)->graphs.replays++;
        return 0;
    }
    /* the key's first call plainly: what it allocates or plans lazily
     * (cuDNN's workspace and plans) is then in place for the capture */
    if (graph->plain_calls < 1) {
        graph->plain_calls++;
        return body(stage, slot, io, err);
    }
    return capture_and_launch(stage, graph, slot, io, body, err);
}

int cuda_pass_run(model_stage *stage, cuda_pass_graph *graph, int slot,
                  const stage_io *io, cuda_pass_body body, pt_error *err)
{
    const cuda_pass_graphs *graphs = &state_of(stage)->graphs;
    if (!graphable(stage, graph == &graphs->backward[0] ||
                              graph == &graphs->backward[1]))
        return body(stage, slot, io, err);
    return run_through(stage, graph, slot, io, body, err);
}

bool cuda_slot_graphable(const model_stage *stage, bool backward)
{
    const cuda_stage_state *state = state_of(stage);
    /* not beside other ranks' slices of one GPU: a GPipe pipeline there
       stepped 6-9 % slower from slot graphs (call 8 of the thirteenth
       session's records) */
    return state->graphs.enabled && !stage->step.on_device &&
           !stage->defer_sync && !cuda_rank_shares_device() &&
           (!backward || state->grad_hook == NULL) &&
           stage_spec_tp(&stage->spec) == 1 && !stage->params_by_unit &&
           !stage->grads_by_unit && stage->offload == NULL;
}

int cuda_slot_pass_run(model_stage *stage, bool backward, int slot,
                       const stage_io *io, cuda_pass_body body,
                       pt_error *err)
{
    cuda_pass_graphs *graphs = &state_of(stage)->graphs;
    if (!cuda_slot_graphable(stage, backward) || slot < 0 ||
        slot >= stage->slot_count)
        return body(stage, slot, io, err);
    if (graphs->slot_forward == NULL) {
        graphs->slot_forward =
            calloc((size_t)stage->slot_count, sizeof *graphs->slot_forward);
        graphs->slot_backward =
            calloc((size_t)stage->slot_count, sizeof *graphs->slot_backward);
        if (graphs->slot_forward == NULL || graphs->slot_backward == NULL) {
            free(graphs->slot_forward);
            free(graphs->slot_backward);
            graphs->slot_forward = graphs->slot_backward = NULL;
            return pt_fail(err, "cuda backend: out of host memory for %d "
                                "slots' pass graphs",
                           stage->slot_count);
        }
        graphs->slot_graphs = stage->slot_count;
    }
    cuda_pass_graph *graph = backward ? &graphs->slot_backward[slot]
                                      : &graphs->slot_forward[slot];
    graphs->in_slot_pass = true;
    int status = run_through(stage, graph, slot, io, body, err);
    graphs->in_slot_pass = false;
    return status;
}

void cuda_pass_graphs_close(cuda_pass_graphs *graphs)
{
    graph_forget(&graphs->forward[0]);
    graph_forget(&graphs->forward[1]);
    graph_forget(&graphs->backward[0]);
    graph_forget(&graphs->backward[1]);
    for (int s = 0; s < graphs->slot_graphs; s++) {
        graph_forget(&graphs->slot_forward[s]);
        graph_forget(&graphs->slot_backward[s]);
    }
    free(graphs->slot_forward);
    free(graphs->slot_backward);
    graphs->slot_forward = graphs->slot_backward = NULL;
    graphs->slot_graphs = 0;
}

/* ------------------------------------------------- the side zeroing */

/* Whether the weight at `offset` takes its gradient from one product a
 * micro-batch, which may write it: a layer's linear weight, or the head's
 * when it is not the token embedding and comes last (its product's Vp - V
 * padding rows then write zeros into the buffer's slack, not over a
 * gradient that follows: model_cuda.c). */
static bool written_by_product(const model_stage *stage, size_t offset)
{
    const stage_offsets *o = &state_of(stage)->offsets;
    int layers = stage->spec.last_layer - stage->spec.first_layer;
    for (int l = 0; l < layers; l++) {
        const layer_offsets *layer = &o->layers[l];
        if (offset == layer->qkv_weight ||
            offset == layer->attn_proj_weight ||
            offset == layer->fc_weight || offset == layer->mlp_proj_weight)
            return true;
    }
    return stage->spec.has_head && offset == o->head_weight &&
           !(stage->spec.has_embedding && offset == o->token_embedding) &&
           stage->tensor_count > 0 &&
           stage->tensors[stage->tensor_count - 1].offset == offset;
}

int cuda_side_zero_plan(model_stage *stage, size_t element_bytes,
                        pt_error *err)
{
    cuda_side_zero *zero = &state_of(stage)->side_zero;
    zero->element_bytes = element_bytes;
    if (stage->grads_by_unit)
        return 0;
    zero->rest = calloc((size_t)stage->tensor_count + 1, sizeof *zero->rest);
    if (zero->rest == NULL)
        return pt_fail(err, "cuda backend: out of host memory");
    size_t first = 0; /* of what is not yet a range or a product's */
    for (int t = 0; t < stage->tensor_count; t++) {
        const param_tensor *tensor = &stage->tensors[t];
        if (!written_by_product(stage, tensor->offset))
            continue;
        if (tensor->offset > first)
            zero->rest[zero->rest_count++] =
                (cuda_grad_range){first, tensor->offset - first};
        first = tensor->offset + tensor->count;
    }
    if (first < stage->grad_count)
        zero->rest[zero->rest_count++] =
            (cuda_grad_range){first, stage->grad_count - first};
    return 0;
}

int cuda_side_zero_settle_all(const model_stage *stage, pt_error *err)
{
    if (cuda_side_zero_settle(stage, err) != 0)
        return -1;
    cuda_stage_state *state = state_of(stage);
    cuda_side_zero *zero = &state->side_zero;
    if (!zero->products_write)
        return 0;
    /* the first forward ran (settle found nothing pending): a fused head
     * wrote its gradient there; the backward's products have not */
    bool head_written = state->layout.head_rows > 0;
    for (int t = 0; t < stage->tensor_count; t++) {
        const param_tensor *tensor = &stage->tensors[t];
        if (!written_by_product(stage, tensor->offset) ||
            (head_written && tensor->offset == state->offsets.head_weight))
            continue;
        CUDA_TRY(cudaMemsetAsync(
            (char *)stage->grads + tensor->offset * zero->element_bytes, 0,
            tensor->count * zero->element_bytes, state->stream));
    }
    zero->products_write = false;
    return 0;
}

bool cuda_grad_written(const model_stage *stage, size_t offset)
{
    return state_of(stage)->side_zero.products_write &&
           written_by_product(stage, offset);
}

int cuda_side_zero_defer(model_stage *stage, size_t bytes, bool *deferred,
                         pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_side_zero *zero = &state->side_zero;
    /* a step kept on the device has one buffer of gradients (train.c) */
    *deferred = stage->step.on_device && !zero->forked;
    zero->products_write = false;
    if (!*deferred) {
        zero->pending = false;
        return 0;
    }
    if (zero->stream == NULL) {
        if (cuda_rank_stream_create(&zero->stream, err) != 0)
            return -1;
        CUDA_TRY(cudaEventCreateWithFlags(&zero->fork,
                                          cudaEventDisableTiming));
        CUDA_TRY(cudaEventCreateWithFlags(&zero->done,
                                          cudaEventDisableTiming));
    }
    zero->pending = true;
    zero->bytes = bytes;
    zero->products_write = zero->rest != NULL;
    return 0;
}

int cuda_side_zero_fork(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_side_zero *zero = &state->side_zero;
    if (!zero->pending)
        return 0;
    /* behind whatever the stage's stream did before (the last step's
     * AdamW read these gradients) */
    CUDA_TRY(cudaEventRecord(zero->fork, state->stream));
    CUDA_TRY(cudaStreamWaitEvent(zero->stream, zero->fork, 0));
    if (!zero->products_write)
        CUDA_TRY(cudaMemsetAsync(stage->grads, 0, zero->bytes, zero->stream));
    for (int r = 0; zero->products_write && r < zero->rest_count; r++)
        CUDA_TRY(cudaMemsetAsync(
            (char *)stage->grads + zero->rest[r].first * zero->element_bytes,
            0, zero->rest[r].count * zero->element_bytes, zero->stream));
    CUDA_TRY(cudaEventRecord(zero->done, zero->stream));
    zero->pending = false;
    zero->forked = true;
    return 0;
}

int cuda_side_zero_join(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_side_zero *zero = &state->side_zero;
    if (!zero->forked)
        return 0;
    CUDA_TRY(cudaStreamWaitEvent(state->stream, zero->done, 0));
    zero->forked = false;
    return 0;
}

int cuda_side_zero_settle(const model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_side_zero *zero = &state->side_zero;
    if (zero->pending) {
        CUDA_TRY(cudaMemsetAsync(stage->grads, 0, zero->bytes,
                                 state->stream));
        zero->products_write = false;
    }
    zero->pending = false;
    return cuda_side_zero_join((model_stage *)stage, err);
}

void cuda_side_zero_close(cuda_side_zero *zero)
{
    if (zero->stream != NULL) {
        cudaStreamSynchronize(zero->stream);
        cudaStreamDestroy(zero->stream);
    }
    if (zero->fork != NULL)
        cudaEventDestroy(zero->fork);
    if (zero->done != NULL)
        cudaEventDestroy(zero->done);
    free(zero->rest);
    *zero = (cuda_side_zero){0};
}

long cuda_stage_graph_replays(const model_stage *stage)
{
    return state_of(stage)->graphs.replays;
}
