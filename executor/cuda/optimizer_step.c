/*
 * The optimizer step of a cuda stage, host side (declared in
 * cuda_stage.h): the gradient norms and AdamW of stage_backend, and the
 * one-stage step kept on the device (stage.h's stage_step_state
 * .on_device): the micro-batches' losses summed in device memory, the
 * global norm, the clipping coefficient and the refusal of a step whose
 * loss or norm is not finite computed there, AdamW reading the
 * coefficient from there, and one read-back into pinned memory at the
 * end, so the host never waits inside a step and the GPU never idles for
 * it (docs/cuda-backend.md, "A step without host waits"). The same
 * arithmetic as the host path (stage/train.c), so the same numbers. Also
 * the event that lets a forward's token upload run behind the device.
 */
#include "executor/cuda/cuda_stage.h"

#include <math.h>
#include <stdlib.h>

#include "executor/cuda/cuda_check.h"

/* -------------------------------------------------- norms and AdamW */

/* The gradients' buffer as the kernels read it (fp32 or bf16). */
static cuda_grad stage_grads(const model_stage *stage)
{
    cuda_grad grads = {stage->grads, stage->grads_bf16};
    return grads;
}

/* The same moved back by grad_first elements: the chunk tables' offsets
 * are the whole buffer's, a ZeRO-2/3 shard starts at grad_first of them
 * (never reached below it). */
static cuda_grad grads_from_start(const model_stage *stage)
{
    cuda_grad grads = stage_grads(stage);
    size_t size = stage->grads_bf16 ? sizeof(pt_bf16) : sizeof(float);
    grads.data = (char *)grads.data - stage->grad_first * size;
    return grads;
}

/* The sum of squares of the optimizer's gradients into device_out
 * (device memory), queued. */
static int enqueue_square_sum(const model_stage *stage, double *device_out,
                              pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (cuda_grad_units_settle(stage, err) != 0)
        return -1;
    CUDA_TRY(cuda_square_sum(
        device_out,
        cuda_grad_offset(stage_grads(stage),
                         stage->optimizer_first - stage->grad_first),
        stage->optimizer_count, state->scratch.square_partials,
        state->stream));
    return 0;
}

int cuda_grad_square_sum(const model_stage *stage, double *out,
                         pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    CUDA_TRY(cudaSetDevice(state->device));
    if (enqueue_square_sum(stage, s->reduced, err) != 0)
        return -1;
    CUDA_TRY(cudaMemcpyAsync(out, s->reduced, sizeof *out,
                             cudaMemcpyDeviceToHost, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

int cuda_grad_square_sums(const model_stage *stage, double *per_tensor,
                          pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    if (stage->tensor_count == 0)
        return 0;
    CUDA_TRY(cudaSetDevice(state->device));
    if (cuda_grad_units_settle(stage, err) != 0)
        return -1;
    /* the chunks' offsets are the whole buffer's; a ZeRO-2/3 shard of the
     * gradients starts at grad_first of them */
    CUDA_TRY(cuda_square_sums_per_tensor(
        s->tensor_squares, grads_from_start(stage),
        state->optimizer_chunks.chunks,
        state->optimizer_chunks.count, state->optimizer_chunks.tensor_starts,
        stage->tensor_count, s->chunk_squares, state->stream));
    CUDA_TRY(cudaMemcpyAsync(per_tensor, s->tensor_squares,
                             (size_t)stage->tensor_count * sizeof(double),
                             cudaMemcpyDeviceToHost, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

/* AdamW with grad_scale or, when device_step is not NULL, the
 * coefficient it holds (and nothing when it flags the step), queued. */
static int enqueue_adamw(model_stage *stage, const adamw_config *config,
                         float learning_rate, float grad_scale,
                         const cuda_step_values *device_step, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    double step = (double)stage->optimizer_steps;
    adamw_args args = {
        .learning_rate = learning_rate,
        .beta1 = config->beta1,
        .beta2 = config->beta2,
        .eps = config->eps,
        .weight_decay = config->weight_decay,
        .grad_scale = grad_scale,
        .first_correction = (float)(1.0 - pow(config->beta1, step)),
        .second_correction = (float)(1.0 - pow(config->beta2, step)),
        .step = device_step,
    };
    if (cuda_grad_units_settle(stage, err) != 0)
        return -1;
    /* ZeRO-3: the units gathered before the update are stale */
    if (stage->params_by_unit)
        cuda_param_units_changed(state);
    /* the chunks' offsets are the whole buffer's: the shards' bases
     * moved back by their first float; ZeRO-3 keeps no mirror */
    CUDA_TRY(cuda_adamw(stage->params - stage->params_first,
                        grads_from_start(stage), stage->adam_m,
                        stage->adam_v,
                        stage->params_by_unit ? NULL : state->mirror,
                        state->optimizer_chunks.chunks,
                        state->optimizer_chunks.count, &args, state->stream));
    return 0;
}

int cuda_adamw_step(model_stage *stage, const adamw_config *config,
                    float learning_rate, float grad_scale, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    if (enqueue_adamw(stage, config, learning_rate, grad_scale, NULL,
                      err) != 0)
        return -1;
    if (!stage->defer_sync)
        CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

/* ------------------------------------------ the step kept on the device */

int cuda_device_step_open(cuda_device_step *step, pt_error *err)
{
    CUDA_TRY(cudaEventCreateWithFlags(&step->tokens_sent,
                                      cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&step->done, cudaEventDisableTiming));
    CUDA_TRY(cudaMallocHost((void **)&step->host, sizeof *step->host));
    return 0;
}

void cuda_device_step_close(cuda_device_step *step)
{
    if (step->tokens_sent != NULL)
        cudaEventDestroy(step->tokens_sent);
    if (step->done != NULL)
        cudaEventDestroy(step->done);
    if (step->host != NULL)
        cudaFreeHost(step->host);
    for (int i = 0; i < step->mark_count; i++)
        cudaEventDestroy(step->marks[i]);
    free(step->marks);
    *step = (cuda_device_step){0};
}

/* The host block of the tokens is read by the copy the last forward
 * enqueued; while the host runs ahead of the device that copy may not
 * have run yet. The wait ends once the device starts that micro-batch,
 * with its forward and backward still queued behind, so the device does
 * not idle for it. */
int cuda_tokens_writable(cuda_stage_state *state, pt_error *err)
{
    cuda_device_step *step = &state->device_step;
    if (!step->tokens_in_flight)
        return 0;
    CUDA_TRY(cudaEventSynchronize(step->tokens_sent));
    step->tokens_in_flight = false;
    return 0;
}

int cuda_tokens_sent(cuda_stage_state *state, pt_error *err)
{
    cuda_device_step *step = &state->device_step;
    /* An upload captured into a graph (the profiler's graphed rounds)
     * runs nothing now, and an event recorded in a capture cannot be
     * waited on from the host afterwards (cudaEventSynchronize says
     * "invalid argument"): nothing is in flight. */
    enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_TRY(cudaStreamIsCapturing(state->stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)
        return 0;
    CUDA_TRY(cudaEventRecord(step->tokens_sent, state->stream));
    step->tokens_in_flight = true;
    return 0;
}

int cuda_step_loss_add(model_stage *stage, const float *losses, int count,
                       pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cuda_mean_add(&state->scratch.step->loss_sum, losses, count,
                           state->stream));
    return 0;
}

/* Square sum, norm and coefficient, AdamW behind them, and the values'
 * copy to the pinned block: all queued, nothing waited for. */
int cuda_step_apply(model_stage *stage, const adamw_config *config,
                    float learning_rate, float max_grad_norm, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_step_values *values = state->scratch.step;
    CUDA_TRY(cudaSetDevice(state->device));
    if (enqueue_square_sum(stage, &values->square_sum, err) != 0)
        return -1;
    CUDA_TRY(cuda_step_clip(values, max_grad_norm, state->stream));
    if (enqueue_adamw(stage, config, learning_rate, 1.0f, values, err) !=
        0)
        return -1;
    CUDA_TRY(cudaMemcpyAsync(state->device_step.host, values,
                             sizeof *values, cudaMemcpyDeviceToHost,
                             state->stream));
    CUDA_TRY(cudaEventRecord(state->device_step.done, state->stream));
    return 0;
}

/* The step's one wait: for the update and the values' copy behind it. */
int cuda_step_totals(model_stage *stage, stage_step_totals *out,
                     pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    CUDA_TRY(cudaEventSynchronize(state->device_step.done));
    const cuda_step_values *values = state->device_step.host;
    out->loss_sum = values->loss_sum;
    out->grad_norm = values->grad_norm;
    out->applied = values->non_finite == 0;
    return 0;
}

/* Timed events, made as a step first needs them (a run's micro-batches
 * fix how many: 2 M + 2), recorded on the stage's stream. */
int cuda_step_mark(model_stage *stage, int mark, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_device_step *step = &state->device_step;
    if (mark >= step->mark_count) {
        cudaEvent_t *grown =
            realloc(step->marks, (size_t)(mark + 1) * sizeof *grown);
        if (grown == NULL)
            return pt_fail(err, "cuda backend: out of host memory for %d "
                                "step marks",
                           mark + 1);
        step->marks = grown;
        while (step->mark_count <= mark) {
            CUDA_TRY(cudaEventCreate(&step->marks[step->mark_count]));
            step->mark_count++;
        }
    }
    CUDA_TRY(cudaEventRecord(step->marks[mark], state->stream));
    return 0;
}

int cuda_step_mark_seconds(const model_stage *stage, int mark,
                           double *seconds, pt_error *err)
{
    const cuda_device_step *step = &state_of(stage)->device_step;
    if (mark >= step->mark_count)
        return pt_fail(err, "cuda backend: step mark %d was never made",
                       mark);
    /* the update's mark follows the copy step_totals waited for */
    CUDA_TRY(cudaEventSynchronize(step->marks[mark]));
    float milliseconds = 0.0f;
    CUDA_TRY(cudaEventElapsedTime(&milliseconds, step->marks[0],
                                  step->marks[mark]));
    *seconds = 1e-3 * milliseconds;
    return 0;
}
