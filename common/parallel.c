/* The degrees of a parallel_config and what follows from them alone:
 * micro-batches, the ZeRO stage, the interleaved 1F1B's order and the
 * checks of interleaving and sequence parallelism, and the ranks of a
 * stage. Apart from common/plan.c (the plan file) so that both the plan
 * reader and "stages" (common/plan_stages.c) use them without either
 * depending on the other. */
#include "common/common.h"

const char *schedule_name(schedule_kind kind)
{
    return kind == SCHEDULE_GPIPE ? "gpipe" : "1f1b";
}

const char *precision_name(precision_kind kind)
{
    switch (kind) {
    case PRECISION_FP16:
        return "fp16";
    case PRECISION_FP32:
        return "fp32";
    default:
        return "bf16";
    }
}

int precision_bytes(precision_kind kind)
{
    return kind == PRECISION_FP32 ? 4 : 2;
}

int parallel_microbatches(const parallel_config *config)
{
    long long per_microbatch = (long long)config->dp * config->mbs;
    if (per_microbatch <= 0)
        return 0;
    return (int)(config->gbs / per_microbatch);
}

int parallel_zero_stage(const parallel_config *config)
{
    if (config->zero_stage >= 2)
        return config->zero_stage;
    return config->distributed_optimizer ? 1 : 0;
}

void parallel_set_zero_stage(parallel_config *config, int stage)
{
    config->zero_stage = stage;
    config->distributed_optimizer = stage >= 1;
}

/* ------------------------------------- interleaving, sequence parallel */

/* Megatron's bounds: a chunk schedule over pp ranks needs pp >= 2, 1F1B
 * and whole groups of pp micro-batches; sequence parallelism shards the
 * sequence over tp ranks. */
int parallel_virtual_stages(const parallel_config *config)
{
    return config->virtual_stages > 1 ? config->virtual_stages : 1;
}

int parallel_chunk_warmup(int pp, int v, int stage, int microbatches)
{
    long long total = (long long)microbatches * v;
    long long warm = v == 1 ? pp - stage - 1
                            : 2LL * (pp - stage - 1) + (long long)(v - 1) * pp;
    return (int)(warm < total ? warm : total);
}

void parallel_chunk_unit(int pp, int v, int k, bool forward, int *chunk,
                         int *microbatch)
{
    int round = pp * v;
    int within = k % round;
    *chunk = forward ? within / pp : v - 1 - within / pp;
    *microbatch = (k / round) * pp + within % pp;
}

void parallel_chunk_slots(int pp, int v, int stage, int microbatches,
                          int *slots)
{
    /* walk the rank's order once, counting each chunk's forwards not yet
       matched by their backwards */
    int held[PLAN_MAX_VIRTUAL_STAGES] = {0};
    int total = microbatches * v;
    int warmup = parallel_chunk_warmup(pp, v, stage, microbatches);
    int forwards = 0, backwards = 0;
    for (int c = 0; c < v; c++)
        slots[c] = 1;
    while (backwards < total) {
        bool forward = forwards < total &&
                       (forwards < warmup || forwards - warmup == backwards);
        int c, mb;
        parallel_chunk_unit(pp, v, forward ? forwards++ : backwards++,
                            forward, &c, &mb);
        held[c] += forward ? 1 : -1;
        slots[c] = held[c] > slots[c] ? held[c] : slots[c];
    }
}

int parallel_check_schedule_levers(const parallel_config *config, int seq,
                                   pt_error *err)
{
    int v = parallel_virtual_stages(config);
    int m = parallel_microbatches(config);
    if (config->virtual_stages < 0 ||
        config->virtual_stages > PLAN_MAX_VIRTUAL_STAGES)
        return pt_fail(err, "virtual_stages: must be an integer in 1..%d, "
                       "got %d", PLAN_MAX_VIRTUAL_STAGES,
                       config->virtual_stages);
    if (v > 1 && config->pp < 2)
        return pt_fail(err, "virtual_stages: %d needs pp >= 2 (interleaving "
                       "splits each pipeline rank's layers), got pp %d", v,
                       config->pp);
    if (v > 1 && config->schedule != SCHEDULE_1F1B)
        return pt_fail(err, "virtual_stages: %d needs schedule \"1f1b\" "
                       "(the interleaved 1F1B), got \"%s\"", v,
                       schedule_name(config->schedule));
    if (v > 1 && m % config->pp != 0)
        return pt_fail(err, "virtual_stages: %d needs the micro-batches "
                       "per iteration (gbs / (dp x mbs) = %d) to be a "
                       "multiple of pp (%d), as Megatron does", v, m,
                       config->pp);
    if (config->sequence_parallel && config->tp < 2)
        return pt_fail(err, "sequence_parallel: needs tp >= 2 (it shards "
                       "over the tensor-parallel group), got tp %d",
                       config->tp);
    if (config->sequence_parallel && seq % config->tp != 0)
        return pt_fail(err, "sequence_parallel: the sequence length %d is "
                       "not divisible by tp %d", seq, config->tp);
    return 0;
}

int parallel_ranks_per_stage(const parallel_config *config)
{
    return config->tp * config->dp;
}

int parallel_stage_first_rank(const parallel_config *config, int stage)
{
    return stage * parallel_ranks_per_stage(config);
}
