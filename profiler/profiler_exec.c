/*
 * The profiler's executed rounds (`--timing exec`, docs/profiles.md,
 * "Executed timing"): the layer timed inside the executor's own training
 * steps. A whole model is made as one stage, as `partita exec` makes a
 * one-GPU plan, and stepped through stage_step_* (zero the gradients,
 * two micro-batches' forward and backward, norm, clipping, AdamW) as
 * the executor steps it; the second micro-batch's forward and backward
 * are read on the device's clock (a tp shard's, compute only as the
 * chain's, on the host's around its waiting calls). Done at two depths
 * (the chain's stack and half of it), the difference over the layers
 * between them is the layer; the embedding and the head stay timed in
 * the chain (profiler.c). Why not the chain's own stepped rounds
 * (profiler_step.c): on a whole H200 the executor's steps of GPT-2 1.5B
 * at micro-batch 8 held about 1,700 MHz from their first 100 ms, the
 * chain's steps of the same kernels about 1,930 MHz, and the chain's
 * layer came out 10 % faster than the executor's (docs/records/
 * gpu-runs.md, twelfth session); the cause is not found, and a profile
 * that prices the executor should time what the executor runs.
 */
#include "profiler/part_chain.h"

#include <math.h>

#include "common/common.h"

/* As the stepped rounds': small, so that the steps leave the parameters
 * about as drawn. */
#define EXEC_LEARNING_RATE 1e-6f
/* Without a hold asked for, the steps run this long before the timed
 * ones (the executor's clock settled within its first steps). */
#define EXEC_WARM_DEFAULT_S 1.0
#define EXEC_WARM_MAX 2000
/* Micro-batches a step: the timed one is the last, past the first's
 * zeroing of the gradients beside it. */
#define EXEC_MICRO_BATCHES 2

/* One step; when `times` is not NULL, the last micro-batch's forward
 * and backward seconds into times[0] and times[1]: on the device's
 * clock where the step stays on the device (tp 1), else on the host's
 * around the calls, which then wait for the device (the host path of a
 * tp shard; their fixed costs are the same at both depths, so the
 * difference leaves them out). */
static int exec_step(model_stage *stage, const stage_io *io,
                     const train_config *config, double *times,
                     bool *on_device, pt_error *err)
{
    stage_step_totals totals;
    if (stage_step_begin(stage, err) != 0)
        return -1;
    bool marked = stage->step.marked;
    double host[2] = {0.0, 0.0};
    for (int m = 0; m < EXEC_MICRO_BATCHES; m++) {
        double start = pt_monotonic_seconds();
        if (stage_step_forward(stage, io, err) != 0)
            return -1;
        double forward_end = pt_monotonic_seconds();
        if (stage_step_backward(stage, io, err) != 0)
            return -1;
        host[0] = forward_end - start;
        host[1] = pt_monotonic_seconds() - forward_end;
    }
    if (stage_step_apply(stage, config, EXEC_LEARNING_RATE, err) != 0 ||
        stage_step_end(stage, &totals, err) != 0)
        return -1;
    if (times == NULL)
        return 0;
    *on_device = marked;
    if (!marked) {
        times[0] = host[0];
        times[1] = host[1];
        return 0;
    }
    /* mark 2m + 1 ends micro-batch m's forward, 2m + 2 its backward */
    int last = EXEC_MICRO_BATCHES - 1;
    double marks[3];
    for (int i = 0; i < 3; i++)
        if (stage_step_mark_seconds(stage, 2 * last + i, &marks[i], err) !=
            0)
            return -1;
    times[0] = marks[1] - marks[0];
    times[1] = marks[2] - marks[1];
    return 0;
}

/* A stage's steps: warm ones for warm_s at the pace of the second step
 * (the first captures its graphs), then `rounds` timed ones. */
static int exec_stage_rounds(model_stage *stage, const uint32_t *tokens,
                             int mbs, double warm_s, int rounds,
                             double *forward, double *backward,
                             bool *on_device, pt_error *err)
{
    stage_io io = {.mbs = mbs, .tokens = tokens, .loss_scale = 1.0f};
    train_config config = train_config_defaults();
    int status = exec_step(stage, &io, &config, NULL, NULL, err);
    double start = pt_monotonic_seconds();
    if (status == 0)
        status = exec_step(stage, &io, &config, NULL, NULL, err);
    double pace = fmax(pt_monotonic_seconds() - start, 1e-4);
    double wanted =
        ceil((warm_s > 0.0 ? warm_s : EXEC_WARM_DEFAULT_S) / pace);
    int warm = wanted > EXEC_WARM_MAX ? EXEC_WARM_MAX : (int)wanted;
    for (int i = 0; i < warm && status == 0; i++)
        status = exec_step(stage, &io, &config, NULL, NULL, err);
    for (int r = 0; r < rounds && status == 0; r++) {
        double times[2];
        status = exec_step(stage, &io, &config, times, on_device, err);
        forward[r] = times[0];
        backward[r] = times[1];
    }
    return status;
}

int chain_exec_rounds(part_chain *chain, int mbs, double warm_s, int rounds,
                      double *layer_forward, double *layer_pair,
                      pt_error *err)
{
    int depths[2] = {chain->layers, chain->layers / 2};
    if (chain->options->backend != BACKEND_CUDA || depths[1] < 1)
        return 1;
    double forward[2][PROFILER_MAX_RUNS], backward[2][PROFILER_MAX_RUNS];
    bool on_device[2] = {false, false};
    chain->exec_rest_rounds = 0;
    for (int d = 0; d < 2; d++) {
        /* a model that does not fit beside the chain (a large shape at
         * its largest micro-batch) is timed stepped instead */
        model_stage stage;
        if (chain_make_whole_model(chain, depths[d], mbs, &stage, err) != 0) {
            *err = (pt_error){{0}};
            return 1;
        }
        int status = exec_stage_rounds(&stage, chain->tokens, mbs, warm_s,
                                       rounds, forward[d], backward[d],
                                       &on_device[d], err);
        model_stage_destroy(&stage);
        if (status != 0)
            return status;
    }
    /* a round whose difference noise took to nothing counts as a
     * nanosecond: a time is positive */
    double between = depths[0] - depths[1];
    for (int r = 0; r < rounds; r++) {
        double f = fmax((forward[0][r] - forward[1][r]) / between, 1e-9);
        double b = fmax((backward[0][r] - backward[1][r]) / between, 1e-9);
        layer_forward[r] = f;
        layer_pair[r] = f + b;
        /* the shallower model less its layers, from the round's own
         * difference (not the floored one): at that depth the two sum to
         * what the executor's step took */
        chain->exec_rest_forward[r] =
            forward[1][r] - depths[1] * (forward[0][r] - forward[1][r]) /
                                between;
        chain->exec_rest_backward[r] =
            backward[1][r] - depths[1] * (backward[0][r] - backward[1][r]) /
                                 between;
    }
    /* host-timed steps (a tp shard) hold fixed host costs the difference
     * cancels and the rest does not */
    if (on_device[0] && on_device[1])
        chain->exec_rest_rounds = rounds;
    return 0;
}
