/*
 * A run's checkpoints, the one owner of their contents: meta.json (format
 * RUN_CHECKPOINT_FORMAT: the model, the layout, the seed), each rank's
 * parameters and AdamW moments (of each of its chunks under the
 * interleaved 1F1B), the optimizer step, the data position and the seed, written into the atomic store of run/checkpoint_store.c, and
 * read back and checked against the plan before a resumed run allocates
 * anything. With one process per rank every process writes its own
 * blobs into the generation rank 0 begins and commits.
 */
#include "executor/run/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model fields a checkpoint must agree on, in the order checked. */
static const char *const shape_fields[] = {
    "layers", "hidden", "heads", "ffn_hidden", "seq", "vocab",
};

static int shape_field(const model_shape *shape, size_t index)
{
    const int values[] = {shape->layers,     shape->hidden, shape->heads,
                          shape->ffn_hidden, shape->seq,    shape->vocab};
    return values[index];
}

/* Chunk `chunk` of a rank (chunk 0: its stage). */
static model_stage *rank_chunk(run_context *ctx, int rank, int chunk)
{
    return ctx->parallel ? pipeline_threads_chunk(ctx->launcher, rank, chunk)
                         : &ctx->stage;
}

static int rank_total(const run_context *ctx)
{
    return ctx->parallel ? ctx->layout.rank_count : 1;
}

/* A state blob's name: "params" for a one-stage run, "params.rank3" for
 * rank 3 of a parallel one (its stage, or chunk 0 of the interleaved
 * 1F1B), "params.rank3.chunk1" for its chunk 1: checkpoints written
 * before chunks were saved keep their names. */
static void blob_name(const run_context *ctx, const char *base, int rank,
                      int chunk, char *out, size_t size)
{
    if (ctx->parallel && chunk > 0)
        snprintf(out, size, "%s.rank%d.chunk%d", base, rank, chunk);
    else if (ctx->parallel)
        snprintf(out, size, "%s.rank%d", base, rank);
    else
        snprintf(out, size, "%s", base);
}

/* Whether a plan's ranks keep ZeRO-1 shards of the AdamW state (the
 * plan asks and a stage runs dp > 1): the checkpoint's moment blobs are
 * shards then (of the stages of dp > 1). */
static bool plan_shards_optimizer(const plan *p)
{
    if (!p->config.distributed_optimizer)
        return false;
    for (int s = 0; s < p->config.pp; s++)
        if (parallel_stage_config(&p->config, p->stages, s).dp > 1)
            return true;
    return false;
}

static bool sharded_optimizer(const run_context *ctx)
{
    return ctx->parallel && plan_shards_optimizer(ctx->plan);
}

/* meta.json: what a person (or a resume) needs to know about the
 * checkpoint (pp, dp, virtual_stages and the partition say which stage
 * or chunk each rank's blobs hold). The blobs hold the state itself. */
static char *checkpoint_meta_text(run_context *ctx, long iteration,
                                  uint64_t seed)
{
    json_t *model = json_object();
    json_t *meta = json_object();
    if (model == NULL || meta == NULL) {
        json_decref(model);
        json_decref(meta);
        return NULL;
    }
    json_object_set_new(model, "name", json_string(ctx->shape.name));
    for (size_t i = 0; i < sizeof shape_fields / sizeof shape_fields[0]; i++)
        json_object_set_new(model, shape_fields[i],
                            json_integer(shape_field(&ctx->shape, i)));
    json_object_set_new(model, "tied_embeddings",
                        json_boolean(ctx->shape.tied_embeddings));
    json_object_set_new(meta, "format", json_string(RUN_CHECKPOINT_FORMAT));
    json_object_set_new(meta, "iteration", json_integer(iteration));
    json_object_set_new(
        meta, "optimizer_steps",
        json_integer(rank_chunk(ctx, run_local_first(ctx), 0)->optimizer_steps));
    json_t *partition = json_array();
    for (int s = 0; partition != NULL && s < ctx->plan->config.pp; s++)
        json_array_append_new(partition,
                              json_integer(ctx->parallel
                                               ? ctx->layout.partition[s]
                                               : ctx->shape.layers));
    json_object_set_new(meta, "pp", json_integer(ctx->plan->config.pp));
    json_object_set_new(meta, "dp", json_integer(ctx->plan->config.dp));
    json_object_set_new(meta, "tp", json_integer(ctx->plan->config.tp));
    json_object_set_new(meta, "virtual_stages",
                        json_integer(run_chunk_count(ctx)));
    json_object_set_new(meta, "distributed_optimizer",
                        json_boolean(sharded_optimizer(ctx)));
    json_object_set_new(meta, "partition", partition);
    /* stages of their own degrees: theirs, as plan.json writes them */
    bool failed = false;
    json_t *stages = stage_degrees_to_json(&ctx->plan->config,
                                           ctx->plan->stages, &failed);
    if (stages != NULL)
        json_object_set_new(meta, "stages", stages);
    json_object_set_new(meta, "seed", json_integer((json_int_t)seed));
    json_object_set_new(meta, "backend",
                        json_string(backend_name(ctx->options->backend)));
    /* the recipe that wrote it (issue 34): resumed only under the same */
    json_object_set_new(
        meta, "precision",
        json_string(precision_name(ctx->plan->config.precision)));
    json_object_set_new(
        meta, "grad_precision",
        json_string(grad_precision_name(ctx->plan->config.grad_precision)));
    json_object_set_new(meta, "gbs", json_integer(ctx->plan->config.gbs));
    json_object_set_new(meta, "mbs", json_integer(ctx->plan->config.mbs));
    json_object_set_new(meta, "param_count",
                        json_integer((json_int_t)ctx->param_count));
    json_object_set_new(meta, "model", model);
    char *text = json_dumps(meta, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(meta);
    return text;
}

/* One buffer of a rank's chunk to or from ctx->host_buffer. */
typedef struct buffer_copy {
    float *host;
    model_stage *chunk;
    stage_buffer which;
    bool to_host;
} buffer_copy;

/* The launcher hands the rank's stage (chunk 0); the copy names its
 * chunk itself. */
static int copy_buffer_task(void *data, int rank, model_stage *stage,
                            pt_error *err)
{
    (void)rank;
    (void)stage;
    const buffer_copy *copy = data;
    return copy->to_host ? model_stage_read(copy->chunk, copy->which,
                                            copy->host, err)
                         : model_stage_write(copy->chunk, copy->which,
                                             copy->host, err);
}

/* The copy runs on the rank's own thread in a parallel run, where the
 * rank's device (and green context) is current. */
static int copy_stage_buffer(run_context *ctx, int rank, int chunk,
                             stage_buffer which, bool to_host,
                             pt_error *err)
{
    buffer_copy copy = {.host = ctx->host_buffer,
                        .chunk = rank_chunk(ctx, rank, chunk),
                        .which = which,
                        .to_host = to_host};
    if (!ctx->parallel)
        return copy_buffer_task(&copy, 0, &ctx->stage, err);
    return pipeline_threads_on_rank(ctx->launcher, rank, copy_buffer_task,
                                    &copy, err);
}

static int write_state_blob(checkpoint_writer *w, run_context *ctx,
                            int rank, int chunk, stage_buffer which,
                            const char *base, pt_error *err)
{
    model_stage *stage = rank_chunk(ctx, rank, chunk);
    char name[64];
    blob_name(ctx, base, rank, chunk, name, sizeof name);
    if (copy_stage_buffer(ctx, rank, chunk, which, true, err) != 0)
        return -1;
    size_t count = model_stage_buffer_count(stage, which);
    /* a state that went to NaN or inf would replace the last good
       checkpoint with one that cannot train: it is not saved */
    for (size_t i = 0; i < count; i++)
        if (!isfinite(ctx->host_buffer[i]))
            return pt_fail(err, "%s: %s holds a value that is not finite "
                                "(%g at index %zu): this state was not "
                                "saved, the checkpoint before it stays",
                           ctx->options->save_dir, name,
                           (double)ctx->host_buffer[i], i);
    return checkpoint_write_blob(w, name, ctx->host_buffer,
                                 count * sizeof(float), err);
}

/* Each local rank's chunks in order, each's parameters and moments: the
 * order commit_for_all lists the other processes' blobs in. */
static int write_rank_blobs(checkpoint_writer *w, run_context *ctx,
                            pt_error *err)
{
    for (int rank = run_local_first(ctx); rank < run_local_end(ctx); rank++)
        for (int chunk = 0; chunk < run_chunk_count(ctx); chunk++)
            if (write_state_blob(w, ctx, rank, chunk, STAGE_PARAMS,
                                 BLOB_PARAMS, err) != 0 ||
                write_state_blob(w, ctx, rank, chunk, STAGE_ADAM_M,
                                 BLOB_ADAM_M, err) != 0 ||
                write_state_blob(w, ctx, rank, chunk, STAGE_ADAM_V,
                                 BLOB_ADAM_V, err) != 0)
                return -1;
    return 0;
}

static int write_checkpoint_blobs(checkpoint_writer *w, run_context *ctx,
                                  long iteration, uint64_t seed,
                                  pt_error *err)
{
    unsigned char steps[8], rng[8], position[DATA_POSITION_BYTES];
    long steps_taken = rank_chunk(ctx, run_local_first(ctx), 0)->optimizer_steps;
    pt_store_le(steps, (uint64_t)steps_taken, 8);
    pt_store_le(rng, seed, 8);
    gpt_sampler_encode_position(&ctx->sampler, &ctx->position, position);
    if ((!ctx->processes && write_rank_blobs(w, ctx, err) != 0) ||
        checkpoint_write_blob(w, BLOB_STEPS, steps, sizeof steps, err) != 0 ||
        checkpoint_write_blob(w, BLOB_POSITION, position, sizeof position,
                              err) != 0 ||
        checkpoint_write_blob(w, BLOB_RNG, rng, sizeof rng, err) != 0)
        return -1;
    char *meta = checkpoint_meta_text(ctx, iteration, seed);
    if (meta == NULL)
        return pt_fail(err, "%s: out of memory writing %s",
                       ctx->options->save_dir, BLOB_META);
    int status = checkpoint_write_blob(w, BLOB_META, meta, strlen(meta), err);
    free(meta);
    return status;
}

static int save_checkpoint_processes(run_context *ctx, long iteration,
                                     uint64_t seed, pt_error *err);

int run_save_checkpoint(run_context *ctx, long iteration, uint64_t seed,
                        pt_error *err)
{
    if (ctx->processes)
        return save_checkpoint_processes(ctx, iteration, seed, err);
    checkpoint_writer writer;
    if (checkpoint_writer_begin(&writer, ctx->options->save_dir, err) != 0)
        return -1;
    writer.keep = ctx->options->checkpoint_keep;
    if (write_checkpoint_blobs(&writer, ctx, iteration, seed, err) != 0 ||
        checkpoint_writer_commit(&writer, err) != 0) {
        checkpoint_writer_abort(&writer);
        return -1;
    }
    return 0;
}

/* An integer field of meta.json; a missing one is `missing` (checkpoints
 * of one-stage runs written before pp and dp were recorded). */
static int meta_integer(const json_t *meta, const char *key, int missing,
                        long long *out)
{
    const json_t *value = json_object_get(meta, key);
    if (value == NULL) {
        *out = missing;
        return 0;
    }
    if (!json_is_integer(value))
        return -1;
    *out = json_integer_value(value);
    return 0;
}

/* Stages of their own degrees: the checkpoint's "stages" (none: every
 * stage at pp, dp, tp) against the plan's. */
static int check_checkpoint_stages(const char *dir, const json_t *meta,
                                   const plan *p, pt_error *err)
{
    bool failed = false;
    json_t *expected = stage_degrees_to_json(&p->config, p->stages, &failed);
    if (failed)
        return pt_fail(err, "out of memory");
    const json_t *held = json_object_get(meta, "stages");
    bool same = held == NULL ? expected == NULL
                             : expected != NULL && json_equal(held, expected);
    json_decref(expected);
    if (same)
        return 0;
    return pt_fail(err, "%s: the checkpoint is of another layout: %s: "
                        "stages %s, the plan's %s (a checkpoint resumes "
                        "under the layout that saved it)",
                   dir, BLOB_META,
                   held == NULL ? "are the plan-wide tp and dp"
                                : "have their own tp and dp",
                   plan_first_asymmetric_stage(p) < 0
                       ? "run the plan-wide ones"
                       : "have their own, or other ones");
}

/* A checkpoint holds one set of blobs per rank of the layout that saved
 * it: refuse another layout, naming the first field that differs. */
static int check_checkpoint_layout(const char *dir, const json_t *meta,
                                   const plan *p, pt_error *err)
{
    /* virtual_stages is missing from checkpoints written before the
       interleaved 1F1B saved its chunks: theirs is 1 */
    const char *const keys[] = {"pp", "dp", "tp", "virtual_stages"};
    const int expected[] = {p->config.pp, p->config.dp, p->config.tp,
                            parallel_virtual_stages(&p->config)};
    for (int i = 0; i < 4; i++) {
        long long value = 0;
        if (meta_integer(meta, keys[i], 1, &value) != 0)
            return pt_fail(err, "%s: %s: %s is not an integer", dir,
                           BLOB_META, keys[i]);
        if (value != expected[i])
            return pt_fail(err, "%s: the checkpoint is of another layout: "
                                "%s: %s is %lld, the plan has %s %d (a "
                                "checkpoint resumes under the layout that "
                                "saved it)",
                           dir, BLOB_META, keys[i], value, keys[i],
                           expected[i]);
    }
    if (check_checkpoint_stages(dir, meta, p, err) != 0)
        return -1;
    const json_t *sharded = json_object_get(meta, "distributed_optimizer");
    bool expected_sharded = plan_shards_optimizer(p);
    if (sharded != NULL && !json_is_boolean(sharded))
        return pt_fail(err, "%s: %s: distributed_optimizer is not a boolean",
                       dir, BLOB_META);
    if ((sharded != NULL && json_is_true(sharded)) != expected_sharded)
        return pt_fail(err, "%s: the checkpoint is of another layout: %s: "
                            "distributed_optimizer is %s, the plan's is %s "
                            "(ZeRO-1 checkpoints hold each replica's shard "
                            "of the AdamW state)",
                       dir, BLOB_META, expected_sharded ? "false" : "true",
                       expected_sharded ? "true" : "false");
    const json_t *partition = json_object_get(meta, "partition");
    if (partition == NULL)
        return p->config.pp == 1 ? 0
                                 : pt_fail(err, "%s: %s: partition is "
                                                "missing",
                                           dir, BLOB_META);
    for (int s = 0; s < p->config.pp; s++) {
        const json_t *layers = json_array_get(partition, (size_t)s);
        if (!json_is_array(partition) ||
            json_array_size(partition) != (size_t)p->config.pp ||
            !json_is_integer(layers))
            return pt_fail(err, "%s: %s: partition is not an array of %d "
                                "layer counts",
                           dir, BLOB_META, p->config.pp);
        if (json_integer_value(layers) != p->partition[s])
            return pt_fail(err, "%s: the checkpoint is of another layout: "
                                "%s: partition[%d] is %lld layers, the "
                                "plan's stage %d holds %d",
                           dir, BLOB_META, s,
                           (long long)json_integer_value(layers), s,
                           p->partition[s]);
    }
    return 0;
}

/* The precision recipe that wrote the checkpoint against the plan's:
 * resuming under another would change the run's arithmetic part-way.
 * A checkpoint written before the fields were has fp32 gradients (the
 * only ones then) and any precision. */
static int check_checkpoint_recipe(const char *dir, const json_t *meta,
                                   const plan *p, pt_error *err)
{
    const char *const keys[] = {"precision", "grad_precision"};
    const char *const expected[] = {
        precision_name(p->config.precision),
        grad_precision_name(p->config.grad_precision)};
    const char *const missing[] = {NULL, "fp32"};
    for (int i = 0; i < 2; i++) {
        const json_t *value = json_object_get(meta, keys[i]);
        if (value != NULL && !json_is_string(value))
            return pt_fail(err, "%s: %s: %s is not a string", dir,
                           BLOB_META, keys[i]);
        const char *held = value != NULL ? json_string_value(value)
                                         : missing[i];
        if (held != NULL && strcmp(held, expected[i]) != 0)
            return pt_fail(err, "%s: the checkpoint is of another precision "
                                "recipe: %s: %s is %s, the run's is %s (a "
                                "checkpoint resumes under the recipe that "
                                "wrote it)",
                           dir, BLOB_META, keys[i], held, expected[i]);
    }
    return 0;
}

/* meta.json's counts against the blobs they describe. Each blob's CRC
 * can be right while the parts disagree (a blob of another save copied
 * in, a hand edit): resuming would then start from a state that never
 * existed, such as iteration 4's weights with the warm-up of step 1. */
static int check_checkpoint_counts(const char *dir, const json_t *meta,
                                   run_context *ctx, pt_error *err)
{
    const char *const keys[] = {"iteration", "optimizer_steps", "seed",
                                "param_count"};
    const char *const holders[] = {BLOB_STEPS, BLOB_STEPS, BLOB_RNG,
                                   "the plan's model"};
    const unsigned long long expected[] = {
        (unsigned long long)ctx->resume.optimizer_steps,
        (unsigned long long)ctx->resume.optimizer_steps,
        (unsigned long long)ctx->resume.seed,
        (unsigned long long)ctx->param_count};
    for (int i = 0; i < 4; i++) {
        const json_t *value = json_object_get(meta, keys[i]);
        if (value == NULL)
            continue;  /* written before the field was */
        if (!json_is_integer(value) || json_integer_value(value) < 0)
            return pt_fail(err, "%s: %s: %s is not a count", dir, BLOB_META,
                           keys[i]);
        unsigned long long held =
            (unsigned long long)json_integer_value(value);
        if (held != expected[i])
            return pt_fail(err, "%s: the checkpoint disagrees with itself: "
                                "%s: %s is %llu, but %s holds %llu (parts "
                                "of different saves?)",
                           dir, BLOB_META, keys[i], held, holders[i],
                           expected[i]);
    }
    long long gbs = ctx->plan->config.gbs;
    if (meta_integer(meta, "gbs", ctx->plan->config.gbs, &gbs) != 0 ||
        gbs < 1)
        return pt_fail(err, "%s: %s: gbs is not a positive integer", dir,
                       BLOB_META);
    ctx->resume.samples_per_step = (long)gbs;
    return 0;
}

/* Reads meta.json and refuses a checkpoint of another model or layout,
 * naming the first field that differs, or one whose counts disagree
 * with its blobs. */
static int check_checkpoint_model(const char *dir, run_context *ctx,
                                  pt_error *err)
{
    const model_shape *shape = &ctx->shape;
    const plan *p = ctx->plan;
    uint64_t bytes = 0;
    if (checkpoint_blob_size(dir, BLOB_META, &bytes, err) != 0)
        return -1;
    char *text = malloc((size_t)bytes + 1);
    if (text == NULL)
        return pt_fail(err, "%s: out of memory reading %s", dir, BLOB_META);
    if (checkpoint_read_blob(dir, BLOB_META, text, (size_t)bytes, err) != 0) {
        free(text);
        return -1;
    }
    json_error_t json_err;
    json_t *meta = json_loadb(text, (size_t)bytes, 0, &json_err);
    free(text);
    json_t *model = json_object_get(meta, "model");
    const char *format = json_string_value(json_object_get(meta, "format"));
    if (meta == NULL || !json_is_object(model) || format == NULL ||
        strcmp(format, RUN_CHECKPOINT_FORMAT) != 0) {
        json_decref(meta);
        return pt_fail(err, "%s: %s: not a run checkpoint (expected format "
                            "\"%s\" and a \"model\" object)",
                       dir, BLOB_META, RUN_CHECKPOINT_FORMAT);
    }
    int status = 0;
    for (size_t i = 0; i < sizeof shape_fields / sizeof shape_fields[0];
         i++) {
        json_t *value = json_object_get(model, shape_fields[i]);
        int expected = shape_field(shape, i);
        if (!json_is_integer(value)) {
            status = pt_fail(err, "%s: %s: model.%s is missing or not an "
                                  "integer",
                             dir, BLOB_META, shape_fields[i]);
            break;
        }
        if (json_integer_value(value) != expected) {
            status = pt_fail(err, "%s: the checkpoint is of another model: "
                                  "%s: model.%s is %lld, the plan's model %s "
                                  "has %d",
                             dir, BLOB_META, shape_fields[i],
                             (long long)json_integer_value(value),
                             shape->name, expected);
            break;
        }
    }
    json_t *tied = json_object_get(model, "tied_embeddings");
    if (status == 0 && (!json_is_boolean(tied) ||
                        json_is_true(tied) != shape->tied_embeddings))
        status = pt_fail(err, "%s: the checkpoint is of another model: %s: "
                              "model.tied_embeddings differs from the plan's "
                              "model %s (%s)",
                         dir, BLOB_META, shape->name,
                         shape->tied_embeddings ? "true" : "false");
    if (status == 0)
        status = check_checkpoint_layout(dir, meta, p, err);
    if (status == 0)
        status = check_checkpoint_recipe(dir, meta, p, err);
    if (status == 0)
        status = check_checkpoint_counts(dir, meta, ctx, err);
    json_decref(meta);
    return status;
}

static int check_state_blob_size(const char *dir, const char *base,
                                 stage_buffer which, int rank, int chunk,
                                 const run_context *ctx, pt_error *err)
{
    char name[64];
    blob_name(ctx, base, rank, chunk, name, sizeof name);
    size_t floats = 0;
    if (run_chunk_buffer_count(ctx, rank, chunk, which, &floats, err) != 0)
        return -1;
    uint64_t bytes = 0;
    if (checkpoint_blob_size(dir, name, &bytes, err) != 0)
        return -1;
    uint64_t expected = (uint64_t)floats * sizeof(float);
    if (bytes != expected)
        return pt_fail(err, "%s: %s holds %llu bytes, the plan's model %s "
                            "needs %llu (%zu parameters)",
                       dir, name, (unsigned long long)bytes, ctx->shape.name,
                       (unsigned long long)expected, floats);
    return 0;
}

static int check_rank_blob_sizes(const char *dir, const run_context *ctx,
                                 pt_error *err)
{
    for (int rank = 0; rank < rank_total(ctx); rank++)
        for (int chunk = 0; chunk < run_chunk_count(ctx); chunk++)
            if (check_state_blob_size(dir, BLOB_PARAMS, STAGE_PARAMS, rank,
                                      chunk, ctx, err) != 0 ||
                check_state_blob_size(dir, BLOB_ADAM_M, STAGE_ADAM_M, rank,
                                      chunk, ctx, err) != 0 ||
                check_state_blob_size(dir, BLOB_ADAM_V, STAGE_ADAM_V, rank,
                                      chunk, ctx, err) != 0)
                return -1;
    return 0;
}

/* Checks the whole checkpoint (checksums, model, sizes) and reads its
 * small blobs: after this only the big buffers remain to be copied. */
int run_read_resume_state(run_context *ctx, pt_error *err)
{
    const char *dir = ctx->options->load_dir;
    if (checkpoint_verify_observed(dir, ctx->options->load_observer,
                                   ctx->options->observer_data, err) != 0)
        return -1;
    unsigned char steps[8], rng[8];
    if (checkpoint_read_blob(dir, BLOB_STEPS, steps, sizeof steps, err) != 0 ||
        checkpoint_read_blob(dir, BLOB_RNG, rng, sizeof rng, err) != 0 ||
        checkpoint_read_blob(dir, BLOB_POSITION, ctx->resume.position,
                             DATA_POSITION_BYTES, err) != 0)
        return -1;
    uint64_t step_count = pt_load_le(steps, 8);
    if (step_count > (uint64_t)INT32_MAX)
        return pt_fail(err, "%s: %s: %llu steps is not a plausible count",
                       dir, BLOB_STEPS, (unsigned long long)step_count);
    ctx->resume.optimizer_steps = (long)step_count;
    ctx->resume.seed = pt_load_le(rng, 8);
    ctx->resume.active = true;
    if (check_checkpoint_model(dir, ctx, err) != 0 ||
        check_rank_blob_sizes(dir, ctx, err) != 0)
        return -1;
    const run_options *options = ctx->options;
    if (options->seed_given && options->seed != ctx->resume.seed)
        return pt_fail(err, "%s: the checkpoint was saved by a run with seed "
                            "%llu, this run asks for seed %llu (resuming "
                            "would draw other samples; leave the seed out "
                            "to continue with %llu)",
                       dir, (unsigned long long)ctx->resume.seed,
                       (unsigned long long)options->seed,
                       (unsigned long long)ctx->resume.seed);
    if (ctx->resume.optimizer_steps >= options->iterations)
        return pt_fail(err, "%s: the checkpoint is at iteration %ld and the "
                            "run ends at iteration %ld: nothing left to run "
                            "(raise the iteration count)",
                       dir, ctx->resume.optimizer_steps, options->iterations);
    return 0;
}

/* The three state blobs of each chunk of a rank, in the order
 * write_rank_blobs writes them, and their buffers. */
static const char *const rank_blob_bases[] = {BLOB_PARAMS, BLOB_ADAM_M,
                                              BLOB_ADAM_V};
static const stage_buffer rank_blob_buffers[] = {STAGE_PARAMS, STAGE_ADAM_M,
                                                 STAGE_ADAM_V};
enum { RANK_BLOBS = 3 };

/* Bytes of state blob b (rank_blob_buffers) of a local rank's chunk. */
static uint64_t local_blob_bytes(run_context *ctx, int rank, int chunk, int b)
{
    return (uint64_t)model_stage_buffer_count(rank_chunk(ctx, rank, chunk),
                                              rank_blob_buffers[b]) *
           sizeof(float);
}

static int restore_state_blob(run_context *ctx, int rank, int chunk, int b,
                              pt_error *err)
{
    char name[64];
    blob_name(ctx, rank_blob_bases[b], rank, chunk, name, sizeof name);
    if (checkpoint_read_blob(ctx->options->load_dir, name, ctx->host_buffer,
                             local_blob_bytes(ctx, rank, chunk, b), err) != 0)
        return -1;
    return copy_stage_buffer(ctx, rank, chunk, rank_blob_buffers[b], false,
                             err);
}

/* Every chunk keeps its own step count: AdamW's bias correction reads
 * it. The load observer hears of each blob restored. */
int run_restore_checkpoint(run_context *ctx, pt_error *err)
{
    const run_options *options = ctx->options;
    uint64_t total = 0, done = 0;
    int blob_count = 0, blobs_done = 0;
    for (int rank = run_local_first(ctx); rank < run_local_end(ctx); rank++)
        for (int chunk = 0; chunk < run_chunk_count(ctx); chunk++)
            for (int b = 0; b < RANK_BLOBS; b++, blob_count++)
                total += local_blob_bytes(ctx, rank, chunk, b);
    for (int rank = run_local_first(ctx); rank < run_local_end(ctx); rank++)
        for (int chunk = 0; chunk < run_chunk_count(ctx); chunk++) {
            for (int b = 0; b < RANK_BLOBS; b++) {
                if (restore_state_blob(ctx, rank, chunk, b, err) != 0)
                    return -1;
                done += local_blob_bytes(ctx, rank, chunk, b);
                if (options->load_observer != NULL)
                    options->load_observer("restored", done, total,
                                           ++blobs_done, blob_count,
                                           options->observer_data);
            }
            rank_chunk(ctx, rank, chunk)->optimizer_steps =
                ctx->resume.optimizer_steps;
        }
    return 0;
}

/* A rank's slots in the report of a save of one process per rank: a
 * failure flag, then the CRC of each blob of each of its chunks. */
static int report_slots(const run_context *ctx)
{
    return 1 + RANK_BLOBS * run_chunk_count(ctx);
}

/* Rank 0: the others' blobs (their CRCs in report), then the shared
 * blobs, then the commit. */
static int commit_for_all(checkpoint_writer *w, run_context *ctx,
                          const double *report, long iteration,
                          uint64_t seed, pt_error *err)
{
    int slots = report_slots(ctx), chunks = run_chunk_count(ctx);
    for (int rank = 1; rank < ctx->world.size; rank++)
        for (int chunk = 0; chunk < chunks; chunk++)
            for (int b = 0; b < RANK_BLOBS; b++) {
                size_t floats = 0;
                if (run_chunk_buffer_count(ctx, rank, chunk,
                                           rank_blob_buffers[b], &floats,
                                           err) != 0) {
                    checkpoint_writer_abort(w);
                    return -1;
                }
                checkpoint_blob blob = {
                    .bytes = floats * sizeof(float),
                    .crc32 = (uint32_t)report[rank * slots + 1 +
                                              chunk * RANK_BLOBS + b]};
                blob_name(ctx, rank_blob_bases[b], rank, chunk, blob.name,
                          sizeof blob.name);
                if (checkpoint_writer_add(w, &blob, err) != 0)
                    return -1;
            }
    if (write_checkpoint_blobs(w, ctx, iteration, seed, err) != 0)
        return -1;
    if (checkpoint_writer_commit(w, err) != 0) {
        checkpoint_writer_abort(w);
        return -1;
    }
    return 0;
}

/* Every rank's own blobs into the generation rank 0 began; report gets
 * this rank's slot: a failure flag and its blobs' CRCs. */
static int write_own_blobs(checkpoint_writer *w, run_context *ctx,
                           uint64_t generation, double *report,
                           pt_error *err)
{
    int blobs = report_slots(ctx) - 1;
    double *slot = report + ctx->world.rank * report_slots(ctx);
    slot[0] = 1.0;
    if (ctx->world.rank != 0 &&
        checkpoint_writer_join(w, ctx->options->save_dir, generation,
                               err) != 0)
        return -1;
    if (write_rank_blobs(w, ctx, err) != 0)
        return -1;
    slot[0] = 0.0;
    for (int b = 0; b < blobs; b++)
        slot[1 + b] = w->blobs[w->blob_count - blobs + b].crc32;
    return 0;
}

static int save_checkpoint_processes(run_context *ctx, long iteration,
                                     uint64_t seed, pt_error *err)
{
    const comm *world = &ctx->world;
    bool root = world->rank == 0;
    checkpoint_writer writer;
    memset(&writer, 0, sizeof writer);
    pt_error local = {{0}};
    double generation = 0.0, committed = 0.0;
    if (root && checkpoint_writer_begin(&writer, ctx->options->save_dir,
                                        &local) == 0) {
        writer.keep = ctx->options->checkpoint_keep;
        generation = (double)writer.generation;
    }
    size_t report_size = (size_t)world->size * report_slots(ctx);
    double *report = calloc(report_size, sizeof *report);
    if (report == NULL ||
        comm_all_reduce_host(world, ctx->world_members, world->size,
                             &generation, 1, err) != 0) {
        free(report);
        checkpoint_writer_abort(&writer);
        return report == NULL ? pt_fail(err, "out of memory saving") : -1;
    }
    int written = generation > 0.0
                      ? write_own_blobs(&writer, ctx, (uint64_t)generation,
                                        report, &local)
                      : -1;
    int failed_rank = -1;
    if (comm_all_reduce_host(world, ctx->world_members, world->size, report,
                             report_size, err) != 0) {
        free(report);
        checkpoint_writer_abort(&writer);
        return -1;
    }
    for (int rank = world->size - 1; rank >= 0; rank--)
        if (report[rank * report_slots(ctx)] != 0.0)
            failed_rank = rank;
    if (root && generation > 0.0 && failed_rank < 0)
        committed = commit_for_all(&writer, ctx, report, iteration, seed,
                                   &local) == 0
                        ? 1.0
                        : 0.0;
    free(report);
    if (comm_all_reduce_host(world, ctx->world_members, world->size,
                             &committed, 1, err) != 0)
        return -1;
    if (committed > 0.0)
        return 0;
    checkpoint_writer_abort(&writer);
    if (local.message[0] != '\0')
        return pt_fail(err, "%s", local.message);
    if (generation == 0.0)
        return pt_fail(err, "%s: rank 0 could not begin the checkpoint",
                       ctx->options->save_dir);
    if (written == 0 && failed_rank >= 0)
        return pt_fail(err, "%s: rank %d could not write its blobs",
                       ctx->options->save_dir, failed_rank);
    return pt_fail(err, "%s: rank 0 could not commit the checkpoint",
                   ctx->options->save_dir);
}
