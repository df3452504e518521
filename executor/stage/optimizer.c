/*
 * AdamW's hyper-parameters, gradient-norm clipping and the learning-rate
 * schedule: plain arithmetic that every backend shares. The element-wise
 * AdamW update itself is each backend's (the cpu reference:
 * cpu_adamw_update, executor/cpu/ops_cpu.c).
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
