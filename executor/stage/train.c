/*
 * One training step of an unsplit model: gradient accumulation over
 * micro-batches, global-norm clipping and AdamW. The pipeline runtime
 * (executor/parallel) does the same per stage with communication in
 * between, and is checked against this single-stage case
 * (tests/executor/run/test_parallel.c).
 */
#include "executor/stage/stage.h"

#include <math.h>

train_config train_config_defaults(void)
{
    train_config config = {
        .adamw = adamw_defaults(),
        .schedule = lr_schedule_defaults(),
        .max_grad_norm = 1.0f,
    };
    return config;
}

static bool holds_whole_model(const model_stage *stage)
{
    return stage->spec.has_embedding && stage->spec.has_head &&
           stage->spec.first_layer == 0 &&
           stage->spec.last_layer == stage->shape.layers;
}

int train_step(model_stage *stage, const train_config *config,
               const uint32_t *tokens, int micro_batches, int mbs,
               step_result *out, pt_error *err)
{
    if (!holds_whole_model(stage))
        return pt_fail(err, "train step: the stage holds layers [%d, %d) "
                            "of %d%s%s; a single-stage step needs the whole "
                            "model",
                       stage->spec.first_layer, stage->spec.last_layer,
                       stage->shape.layers,
                       stage->spec.has_embedding ? "" : ", no embedding",
                       stage->spec.has_head ? "" : ", no head");
    if (micro_batches < 1)
        return pt_fail(err, "train step: needs at least one micro-batch, "
                            "got %d",
                       micro_batches);
    if (lr_schedule_check(&config->schedule, err) != 0)
        return -1;
    if (stage_zero_grads(stage, err) != 0)
        return -1;
    size_t window = (size_t)stage->shape.seq + 1;
    double loss_sum = 0.0;
    for (int m = 0; m < micro_batches; m++) {
        stage_io io = {
            .mbs = mbs,
            .tokens = tokens + (size_t)m * (size_t)mbs * window,
            .loss_scale = 1.0f / (float)micro_batches,
        };
        float loss = 0.0f;
        if (stage_forward(stage, 0, &io, &loss, err) != 0 ||
            stage_backward(stage, 0, &io, err) != 0)
            return -1;
        loss_sum += loss;
    }
    double square_sum = 0.0;
    if (stage_grad_square_sum(stage, &square_sum, err) != 0)
        return -1;
    double grad_norm = sqrt(square_sum);
    if (!isfinite(grad_norm))
        return pt_fail(err, "train step %ld: gradient norm is not finite "
                            "(loss %g); the step was not applied",
                       stage->optimizer_steps, loss_sum / micro_batches);
    float learning_rate =
        (float)lr_schedule_at(&config->schedule, stage->optimizer_steps);
    float scale = clip_coefficient(grad_norm, config->max_grad_norm);
    if (stage_adamw_step(stage, &config->adamw, learning_rate, scale, err) !=
        0)
        return -1;
    out->loss = (float)(loss_sum / micro_batches);
    out->grad_norm = (float)grad_norm;
    out->learning_rate = learning_rate;
    return 0;
}
