/*
 * AdamW, gradient-norm clipping and the learning-rate schedule. The
 * element-wise AdamW update is the CPU reference the backends' steps are
 * held to; the schedule and the clipping factor are plain arithmetic that
 * every backend shares.
 */
#include "executor/stage/stage.h"

#include <math.h>

adamw_config adamw_defaults(void)
{
    adamw_config config = {
        .beta1 = 0.9f,
        .beta2 = 0.95f,
        .eps = 1e-8f,
        .weight_decay = 0.1f,
    };
    return config;
}

/* Decoupled weight decay (Loshchilov and Hutter): the decay shrinks the
 * parameter directly, scaled by the learning rate, instead of entering the
 * gradient and being rescaled by the second moment. */
void cpu_adamw_update(float *params, const float *grads, float *m, float *v,
                      size_t count, const adamw_config *config,
                      float learning_rate, float grad_scale, long step,
                      bool decay)
{
    float first_correction = (float)(1.0 - pow(config->beta1, (double)step));
    float second_correction = (float)(1.0 - pow(config->beta2, (double)step));
    float weight_decay = decay ? config->weight_decay : 0.0f;
    for (size_t i = 0; i < count; i++) {
        float g = grads[i] * grad_scale;
        m[i] = config->beta1 * m[i] + (1.0f - config->beta1) * g;
        v[i] = config->beta2 * v[i] + (1.0f - config->beta2) * g * g;
        float m_hat = m[i] / first_correction;
        float v_hat = v[i] / second_correction;
        params[i] -= learning_rate *
                     (m_hat / (sqrtf(v_hat) + config->eps) +
                      weight_decay * params[i]);
    }
}

/* The 1e-6 keeps the factor finite for a zero norm and just below 1 at
 * the threshold, as Megatron and PyTorch's clip_grad_norm_ do. */
float clip_coefficient(double grad_norm, float max_norm)
{
    if (max_norm <= 0.0f || !(grad_norm > max_norm))
        return 1.0f;
    return (float)(max_norm / (grad_norm + 1e-6));
}

lr_schedule lr_schedule_defaults(void)
{
    lr_schedule schedule = {
        .max_lr = 6e-4,
        .min_lr = 6e-5,
        .warmup_steps = 2000,
        .decay_steps = 600000,
    };
    return schedule;
}

int lr_schedule_check(const lr_schedule *schedule, pt_error *err)
{
    if (!(schedule->max_lr >= 0.0) || !isfinite(schedule->max_lr))
        return pt_fail(err, "lr schedule: max_lr must be a finite number "
                            ">= 0, got %g",
                       schedule->max_lr);
    if (!(schedule->min_lr >= 0.0) || schedule->min_lr > schedule->max_lr)
        return pt_fail(err, "lr schedule: min_lr must lie in [0, max_lr = "
                            "%g], got %g",
                       schedule->max_lr, schedule->min_lr);
    if (schedule->warmup_steps < 0)
        return pt_fail(err, "lr schedule: warmup_steps must be >= 0, got %ld",
                       schedule->warmup_steps);
    if (schedule->decay_steps < schedule->warmup_steps)
        return pt_fail(err, "lr schedule: decay_steps (%ld) must be >= "
                            "warmup_steps (%ld)",
                       schedule->decay_steps, schedule->warmup_steps);
    return 0;
}

double lr_schedule_at(const lr_schedule *schedule, long step)
{
    if (step < schedule->warmup_steps)
        return schedule->max_lr * (double)(step + 1) /
               (double)schedule->warmup_steps;
    if (step >= schedule->decay_steps)
        return schedule->min_lr;
    double progress = (double)(step - schedule->warmup_steps) /
                      (double)(schedule->decay_steps - schedule->warmup_steps);
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));
    return schedule->min_lr + cosine * (schedule->max_lr - schedule->min_lr);
}
