/*
 * The memory a run needs, computed before anything is allocated: on the
 * cpu backend the bytes every stage will allocate (checked against the
 * machine's memory), on GPUs the check of the plan against this
 * machine's devices (devices.c).
 */
#include "executor/cpu/cpu.h"
#include "executor/run/internal.h"

#include <stdlib.h>

/* The cpu stage's gradient or parameter bytes: every parameter's, or
 * when `sharded` (spec.shard_gradients / shard_parameters, as
 * model_cpu.c honours them) the optimizer shard's and one buffer per
 * unit kind (cpu/units.c). */
static double run_cpu_shard_bytes(const model_shape *shape,
                                  const stage_spec *spec, bool sharded,
                                  int tensors, size_t params, size_t shard)
{
    if (!sharded || spec->optimizer_shards < 2 || tensors <= 0)
        return 4.0 * (double)params;
    param_tensor *table = calloc((size_t)tensors, sizeof *table);
    if (table == NULL)
        return 4.0 * (double)params; /* the whole buffer: an upper bound */
    cpu_units units;
    double bytes = 4.0 * (double)params;
    pt_error ignored = {{0}};
    if (stage_parameter_layout(shape, spec, table, NULL, &ignored) >= 0)
        bytes = 4.0 * (double)shard +
                (double)cpu_units_layout(spec, table, tensors, params,
                                              &units);
    free(table);
    return bytes;
}

/* The activations of one slot and the backward scratch, as model_cpu.c
 * carves them, for a whole-model stage at micro-batch mbs. */
double run_cpu_stage_bytes(const model_shape *shape, int mbs, bool recompute,
                           double *activation_bytes)
{
    stage_spec spec = stage_spec_whole_model(shape);
    spec.recompute_layers = recompute;
    double activations =
        (double)cpu_stage_activation_bytes_of(shape, &spec, mbs, 1);
    if (activation_bytes != NULL)
        *activation_bytes = activations;
    return 16.0 * model_parameter_count(shape) + activations;
}

double run_cpu_partial_stage_bytes(const model_shape *shape,
                                   const stage_spec *spec, int mbs,
                                   int slot_count, double *activation_bytes)
{
    /* slot_count activation slots and one backward scratch */
    double activations =
        (double)cpu_stage_activation_bytes_of(shape, spec, mbs, slot_count);
    if (activation_bytes != NULL)
        *activation_bytes = activations;
    size_t params = 0, first = 0, moments = 0;
    pt_error ignored = {{0}};
    int tensors = stage_parameter_layout(shape, spec, NULL, &params,
                                         &ignored);
    if (tensors < 0)
        params = 0;
    stage_optimizer_range(params, spec->optimizer_shards,
                          spec->optimizer_shard, &first, &moments);
    /* AdamW's two moments of the optimizer's range; params and grads */
    double bytes = 8.0 * (double)moments + activations;
    return bytes +
           run_cpu_shard_bytes(shape, spec, spec->shard_parameters, tensors,
                               params, moments) +
           run_cpu_shard_bytes(shape, spec, spec->shard_gradients, tensors,
                               params, moments);
}

/* A parallel run's ranks all live in this process: each rank's figure is
 * its own stage, and the check is of their sum (and the checkpoint
 * buffer) against the machine; on GPUs, device_check_plan's checks. */
static int check_parallel_memory(const run_context *ctx, run_result *out,
                                 pt_error *err)
{
    double total = 0.0, largest_activations = 0.0;
    int largest_rank = run_local_first(ctx);
    int largest_mbs = out->mbs;
    for (int rank = run_local_first(ctx); rank < run_local_end(ctx); rank++) {
        int stage = pipeline_rank_stage(&ctx->layout, rank);
        double activations = 0.0, bytes = 0.0;
        /* the interleaved 1F1B's chunks are stages of their own */
        for (int c = 0; c < pipeline_chunk_count(&ctx->layout); c++) {
            stage_spec spec;
            double chunk_activations = 0.0;
            if (pipeline_rank_chunk_spec(&ctx->layout, rank, c, &spec, err) !=
                0)
                return -1;
            bytes += run_cpu_partial_stage_bytes(
                &ctx->shape, &spec, ctx->layout.stage_mbs[stage],
                pipeline_chunk_slot_count(&ctx->layout, stage, c),
                &chunk_activations);
            activations += chunk_activations;
        }
        out->rank_peak_memory_bytes[rank] = bytes;
        total += bytes;
        if (bytes > out->rank_peak_memory_bytes[largest_rank] ||
            rank == run_local_first(ctx)) {
            largest_rank = rank;
            largest_activations = activations;
            largest_mbs = ctx->layout.stage_mbs[stage];
        }
    }
    out->peak_memory_bytes = out->rank_peak_memory_bytes[largest_rank];
    if (ctx->options->backend != BACKEND_CPU)
        return run_check_gpu_devices(ctx, err);
    if (ctx->options->save_dir != NULL || ctx->options->load_dir != NULL)
        total += 4.0 * (double)ctx->largest_rank_params;
    double available = ctx->options->memory_available_bytes > 0
                           ? ctx->options->memory_available_bytes
                           : out->device.memory_cap_bytes;
    if (available <= 0 || total <= available)
        return 0;
    char total_text[32], have_text[32], rank_text[32], act_text[32];
    pt_format_bytes(total, total_text, sizeof total_text);
    pt_format_bytes(available, have_text, sizeof have_text);
    pt_format_bytes(out->peak_memory_bytes, rank_text, sizeof rank_text);
    pt_format_bytes(largest_activations, act_text, sizeof act_text);
    if (ctx->processes)
        return pt_fail(err, "not enough memory: rank %d of this plan needs "
                            "%s on the cpu backend (activations %s at "
                            "micro-batch %d), its machine has %s",
                       largest_rank, total_text, act_text, largest_mbs,
                       have_text);
    return pt_fail(err, "not enough memory: the %d ranks of this plan run "
                        "as threads of one process and need %s in all on "
                        "the cpu backend (rank %d the most: %s, of which "
                        "activations %s at micro-batch %d), the machine has "
                        "%s",
                   out->rank_count, total_text, largest_rank, rank_text,
                   act_text, largest_mbs, have_text);
}

int run_check_memory(const run_context *ctx, run_result *out,
                     pt_error *err)
{
    if (ctx->parallel)
        return check_parallel_memory(ctx, out, err);
    double activations = 0.0;
    double needed = run_cpu_stage_bytes(&ctx->shape, ctx->plan->config.mbs,
                                        ctx->plan->config.recompute,
                                        &activations);
    double state = needed - activations;
    if (ctx->options->save_dir != NULL || ctx->options->load_dir != NULL)
        needed += 4.0 * (double)ctx->param_count; /* checkpoint buffer */
    out->peak_memory_bytes = needed;
    out->rank_peak_memory_bytes[0] = needed;
    if (ctx->options->backend != BACKEND_CPU)
        return 0; /* a GPU backend's allocation reports its own shortage */
    double available = ctx->options->memory_available_bytes > 0
                           ? ctx->options->memory_available_bytes
                           : out->device.memory_cap_bytes;
    if (available <= 0 || needed <= available)
        return 0;
    char need_text[32], have_text[32], state_text[32], act_text[32];
    pt_format_bytes(needed, need_text, sizeof need_text);
    pt_format_bytes(available, have_text, sizeof have_text);
    pt_format_bytes(state, state_text, sizeof state_text);
    pt_format_bytes(activations, act_text, sizeof act_text);
    return pt_fail(err, "not enough memory: the cpu backend needs %s "
                        "(parameters, gradients and AdamW moments %s at 16 "
                        "bytes per parameter, activations %s at micro-batch "
                        "%d), the machine has %s",
                   need_text, state_text, act_text, ctx->plan->config.mbs,
                   have_text);
}
