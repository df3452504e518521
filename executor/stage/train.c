/*
 * One training step of an unsplit model: gradient accumulation over
 * micro-batches, global-norm clipping and AdamW. The pipeline runtime
 * (executor/parallel) does the same per stage with communication in
 * between, and is checked against this single-stage case
 * (tests/executor/run/test_parallel.c).
 */
#include "executor/stage/stage.h"

#include <math.h>
#include <string.h>

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

/* Whether the step of this stage may stay on its backend: a backend
 * that can, and a stage that holds the whole model on one rank. The
 * parallel layouts (tp, ZeRO's shards, pipelines over several ranks)
 * reduce gradients and sum the norm's shares over ranks between the
 * backward and the update, through the host (executor/parallel), and the
 * offload steps on the host: they keep the host path. */
static bool step_stays_on_backend(const model_stage *stage)
{
    const stage_spec *spec = &stage->spec;
    return stage->backend->step_apply != NULL &&
           stage->backend->step_totals != NULL && holds_whole_model(stage) &&
           stage_spec_tp(spec) == 1 && spec->optimizer_shards <= 1 &&
           !stage->grads_by_unit && !stage->params_by_unit &&
           stage->offload == NULL && !stage->defer_sync;
}

/* Mark `mark` of a step that marks its device's progress. */
static int mark_progress(model_stage *stage, int mark, pt_error *err)
{
    if (!stage->step.marked)
        return 0;
    return stage->backend->step_mark(stage, mark, err);
}

int stage_step_begin(model_stage *stage, pt_error *err)
{
    memset(&stage->step, 0, sizeof stage->step);
    stage->step.on_device = step_stays_on_backend(stage);
    stage->step.marked = stage->step.on_device &&
                         stage->backend->step_mark != NULL &&
                         stage->backend->step_mark_seconds != NULL;
    if (mark_progress(stage, 0, err) != 0 ||
        stage_zero_grads(stage, err) != 0) {
        stage_step_abandon(stage);
        return -1;
    }
    return 0;
}

int stage_step_forward(model_stage *stage, const stage_io *io,
                       pt_error *err)
{
    float loss = 0.0f;
    if (stage_forward(stage, 0, io, &loss, err) != 0 ||
        mark_progress(stage, 2 * stage->step.micro_batches + 1, err) != 0) {
        stage_step_abandon(stage);
        return -1;
    }
    stage->step.micro_batches++;
    stage->step.host.loss_sum += loss; /* 0 on the device path */
    return 0;
}

int stage_step_backward(model_stage *stage, const stage_io *io,
                        pt_error *err)
{
    if (stage_backward(stage, 0, io, err) != 0 ||
        mark_progress(stage, 2 * stage->step.micro_batches, err) != 0) {
        stage_step_abandon(stage);
        return -1;
    }
    return 0;
}

/* The host path: the norm read back, then the check and clipping that
 * refuse or scale the update. */
static int apply_on_host(model_stage *stage, const train_config *config,
                         float learning_rate, pt_error *err)
{
    stage_step_totals *host = &stage->step.host;
    double square_sum = 0.0;
    if (stage_grad_square_sum(stage, &square_sum, err) != 0)
        return -1;
    host->grad_norm = sqrt(square_sum);
    host->applied = isfinite(host->loss_sum) && isfinite(host->grad_norm);
    if (!host->applied)
        return 0;
    float scale = clip_coefficient(host->grad_norm, config->max_grad_norm);
    return stage_adamw_step(stage, &config->adamw, learning_rate, scale,
                            err);
}

int stage_step_apply(model_stage *stage, const train_config *config,
                     float learning_rate, pt_error *err)
{
    if (!stage->step.on_device)
        return apply_on_host(stage, config, learning_rate, err);
    if (stage_adamw_check(&config->adamw, err) != 0)
        return -1;
    /* counted before, for the bias correction, as stage_adamw_step does;
     * taken back by stage_step_end if the backend skipped the update */
    stage->optimizer_steps++;
    if (stage->backend->step_apply(stage, &config->adamw, learning_rate,
                                   config->max_grad_norm, err) != 0 ||
        mark_progress(stage, 2 * stage->step.micro_batches + 1, err) != 0) {
        stage->optimizer_steps--;
        stage_step_abandon(stage);
        return -1;
    }
    return 0;
}

int stage_step_end(model_stage *stage, stage_step_totals *out,
                   pt_error *err)
{
    if (!stage->step.on_device) {
        *out = stage->step.host;
        return 0;
    }
    stage->step.on_device = false;
    if (stage->backend->step_totals(stage, out, err) != 0) {
        stage->step.marked = false;
        return -1;
    }
    if (!out->applied)
        stage->optimizer_steps--;
    return 0;
}

void stage_step_abandon(model_stage *stage)
{
    stage->step.on_device = false;
    stage->step.marked = false;
}

int stage_step_mark_seconds(const model_stage *stage, int mark,
                            double *seconds, pt_error *err)
{
    if (!stage->step.marked || stage->step.on_device)
        return pt_fail(err, "stage step: no device marks to read (a step "
                            "on the host, or not ended)");
    if (mark < 0 || mark > 2 * stage->step.micro_batches + 1)
        return pt_fail(err, "stage step: mark %d of a step of %d "
                            "micro-batches",
                       mark, stage->step.micro_batches);
    return stage->backend->step_mark_seconds(stage, mark, seconds, err);
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
    if (stage_step_begin(stage, err) != 0)
        return -1;
    size_t window = (size_t)stage->shape.seq + 1;
    for (int m = 0; m < micro_batches; m++) {
        stage_io io = {
            .mbs = mbs,
            .tokens = tokens + (size_t)m * (size_t)mbs * window,
            .loss_scale = 1.0f / (float)micro_batches,
        };
        if (stage_step_forward(stage, &io, err) != 0 ||
            stage_step_backward(stage, &io, err) != 0)
            return -1;
        /* the next micro-batch's host work while the device runs these */
        stage_io next = io;
        next.tokens += (size_t)mbs * window;
        if (m + 1 < micro_batches &&
            stage_prepare_tokens(stage, &next, err) != 0)
            return -1;
    }
    float learning_rate =
        (float)lr_schedule_at(&config->schedule, stage->optimizer_steps);
    stage_step_totals totals;
    if (stage_step_apply(stage, config, learning_rate, err) != 0 ||
        stage_step_end(stage, &totals, err) != 0)
        return -1;
    double mean_loss = totals.loss_sum / micro_batches;
    if (!totals.applied)
        return pt_fail(err, "train step %ld: the gradient norm (%g) or the "
                            "loss (%g) is not finite; the step was not "
                            "applied",
                       stage->optimizer_steps, totals.grad_norm, mean_loss);
    out->loss = (float)mean_loss;
    out->grad_norm = (float)totals.grad_norm;
    out->learning_rate = learning_rate;
    return 0;
}
