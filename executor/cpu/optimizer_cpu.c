/*
 * The cpu backend's optimizer ops (its table in model_cpu.c points
 * here): the gradient square sums and AdamW over the optimizer's range,
 * on host memory, with the gradients and parameters whole or, under
 * ZeRO-2/3, a shard starting at grad_first / params_first.
 */
#include "executor/cpu/cpu.h"

/* The part [*first, *first + *count) of tensor t the optimizer steps;
 * false when none of it. */
static bool optimizer_part(const model_stage *stage, const param_tensor *t,
                           size_t *first, size_t *count)
{
    size_t lo = stage->optimizer_first;
    size_t hi = lo + stage->optimizer_count;
    size_t start = t->offset > lo ? t->offset : lo;
    size_t end = t->offset + t->count < hi ? t->offset + t->count : hi;
    *first = start;
    *count = end > start ? end - start : 0;
    return end > start;
}

/* The gradient of parameter `index` of the optimizer's range (grads may
 * start at grad_first: ZeRO-2/3). */
static float *grad_at(const model_stage *stage, size_t index)
{
    return stage->grads + (index - stage->grad_first);
}

static double square_sum(const float *values, size_t count)
{
    double sum = 0.0;
    for (size_t k = 0; k < count; k++)
        sum += (double)values[k] * values[k];
    return sum;
}

int cpu_backend_grad_square_sum(const model_stage *stage, double *out,
                                pt_error *err)
{
    (void)err;
    *out = square_sum(grad_at(stage, stage->optimizer_first),
                      stage->optimizer_count);
    return 0;
}

int cpu_backend_grad_square_sums(const model_stage *stage,
                                 double *per_tensor, pt_error *err)
{
    (void)err;
    for (int i = 0; i < stage->tensor_count; i++) {
        size_t first = 0, count = 0;
        per_tensor[i] = optimizer_part(stage, &stage->tensors[i], &first,
                                       &count)
                            ? square_sum(grad_at(stage, first), count)
                            : 0.0;
    }
    return 0;
}

/* Only the optimizer's range: the whole stage, or its ZeRO-1 shard, whose
 * moments start at adam_m[0]. */
int cpu_backend_adamw_step(model_stage *stage, const adamw_config *config,
                          float learning_rate, float grad_scale,
                          pt_error *err)
{
    (void)err;
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t first = 0, count = 0;
        if (!optimizer_part(stage, t, &first, &count))
            continue;
        size_t moment = first - stage->optimizer_first;
        cpu_adamw_update(stage->params + (first - stage->params_first),
                         grad_at(stage, first),
                         stage->adam_m + moment, stage->adam_v + moment,
                         count, config, learning_rate, grad_scale,
                         stage->optimizer_steps, t->weight_decay);
    }
    return 0;
}
