/*
 * The partition problem shared by every solver: pricing a stage, the
 * step-time surrogate and the validation of a problem.
 */
#include "planner/planner.h"

#include <math.h>

double partition_stage_time(const partition_stage *stage, int layers)
{
    return stage->fixed_s + stage->per_layer_s * (double)layers;
}

double partition_surrogate(const partition_problem *problem,
                           const int *layers)
{
    double sum_s = 0.0;
    double bottleneck_s = 0.0;
    for (int s = 0; s < problem->pp; s++) {
        double time_s = partition_stage_time(&problem->stages[s], layers[s]);
        sum_s += time_s;
        if (time_s > bottleneck_s)
            bottleneck_s = time_s;
    }
    return sum_s + (double)(problem->microbatches - 1) * bottleneck_s;
}

int partition_problem_check(const partition_problem *problem,
                            const int *layers_out, pt_error *err)
{
    if (problem == NULL || layers_out == NULL)
        return pt_fail(err, "partition: no problem or no output given");
    if (problem->pp < 1 || problem->pp > PT_MAX_STAGES)
        return pt_fail(err, "partition: pp must be within 1..%d, got %d",
                       PT_MAX_STAGES, problem->pp);
    if (problem->layers < 0)
        return pt_fail(err, "partition: layers must be >= 0, got %d",
                       problem->layers);
    if (problem->microbatches < 1)
        return pt_fail(err, "partition: micro-batches must be >= 1, got %d",
                       problem->microbatches);
    if (problem->stages == NULL)
        return pt_fail(err, "partition: no stages given");
    for (int s = 0; s < problem->pp; s++) {
        const partition_stage *stage = &problem->stages[s];
        if (!isfinite(stage->fixed_s) || stage->fixed_s < 0.0)
            return pt_fail(err, "partition: stage %d: fixed time must be a "
                           "finite number >= 0 s, got %g s", s,
                           stage->fixed_s);
        if (!isfinite(stage->per_layer_s) || stage->per_layer_s < 0.0)
            return pt_fail(err, "partition: stage %d: per-layer time must "
                           "be a finite number >= 0 s, got %g s", s,
                           stage->per_layer_s);
        if (stage->max_layers < -1)
            return pt_fail(err, "partition: stage %d: max_layers must be "
                           ">= -1, got %d", s, stage->max_layers);
    }
    return 0;
}
