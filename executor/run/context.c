/*
 * What every file of run/ asks of a run_context: the ranks this process
 * runs and their stages' (chunks') sizes, and the notes of the record. Calls
 * nothing else of run/, so that the files above it call in one direction.
 */
#include "executor/run/internal.h"

#include "executor/cuda/buffers.h"

#include <string.h>

void run_add_note(run_result *out, const char *text)
{
    if (out->note_count < RUN_MAX_NOTES)
        pt_copy_string(out->notes[out->note_count++], sizeof out->notes[0],
                       text);
}

#ifdef PARTITA_HAVE_CUDA
/* Removes the notes that start with prefix (a guess made before the
 * stage could say better). */
void run_drop_note(run_result *out, const char *prefix)
{
    int kept = 0;
    for (int i = 0; i < out->note_count; i++)
        if (strncmp(out->notes[i], prefix, strlen(prefix)) != 0)
            memmove(out->notes[kept++], out->notes[i], sizeof out->notes[0]);
    out->note_count = kept;
}
#endif

/* The ranks this process runs, [local_first, local_end): every rank, or
 * its own one under one process per rank. */
int run_local_first(const run_context *ctx)
{
    return ctx->processes ? ctx->world.rank : 0;
}

int run_local_end(const run_context *ctx)
{
    if (ctx->processes)
        return ctx->world.rank + 1;
    return ctx->parallel ? ctx->layout.rank_count : 1;
}

/* The chunks each rank holds: the interleaved 1F1B's virtual_stages, 1
 * otherwise (and for a one-stage run). */
int run_chunk_count(const run_context *ctx)
{
    return ctx->parallel ? pipeline_chunk_count(&ctx->layout) : 1;
}

/* The stage spec of a chunk of a rank of a parallel run (chunk 0: the
 * rank's stage). */
int run_chunk_spec(const run_context *ctx, int rank, int chunk,
                   stage_spec *out, pt_error *err)
{
    return pipeline_rank_chunk_spec(&ctx->layout, rank, chunk, out, err);
}

int run_chunk_param_count(const run_context *ctx, int rank, int chunk,
                          size_t *out, pt_error *err)
{
    if (!ctx->parallel) {
        *out = ctx->param_count;
        return 0;
    }
    stage_spec spec;
    if (run_chunk_spec(ctx, rank, chunk, &spec, err) != 0 ||
        stage_parameter_layout(&ctx->shape, &spec, NULL, out, err) < 0)
        return -1;
    return 0;
}

/* Floats of a chunk's buffer `which`: its parameters (under ZeRO-3 on
 * the cpu backend, its optimizer's range), or for the AdamW moments its
 * optimizer's range (a ZeRO shard of them). */
int run_chunk_buffer_count(const run_context *ctx, int rank, int chunk,
                           stage_buffer which, size_t *out, pt_error *err)
{
    size_t params = 0, first = 0;
    if (run_chunk_param_count(ctx, rank, chunk, &params, err) != 0)
        return -1;
    *out = params;
    if (!ctx->parallel || which == STAGE_GRADS)
        return 0;
    stage_spec spec;
    if (run_chunk_spec(ctx, rank, chunk, &spec, err) != 0)
        return -1;
    /* the parameters are the optimizer's shard only under ZeRO-3: on
     * the cpu backend (model_cpu.c), and on the cuda one but on a
     * pipeline's tied embedding pair (buffers.c) */
    bool sharded = spec.shard_parameters &&
                   (ctx->options->backend == BACKEND_CPU ||
                    buffer_grads_by_unit(&ctx->shape, &spec));
    if (which == STAGE_PARAMS && !sharded)
        return 0;
    stage_optimizer_range(params, spec.optimizer_shards,
                          spec.optimizer_shard, &first, out);
    return 0;
}
