/*
 * Deterministic parameter initialisation and the small generator behind
 * it. Each tensor draws from its own stream, derived from the seed and
 * the tensor's global name, so the values of a tensor do not depend on
 * which stage holds it or on what else that stage holds.
 */
#include "executor/stage/stage.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define INIT_STD 0.02
#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* ------------------------------------------------------------------ rng */

void model_rng_seed(model_rng *rng, uint64_t seed)
{
    rng->state = seed;
    rng->has_spare = false;
    rng->spare = 0.0;
}

/* splitmix64: Steele, Lea and Flood's mixer of a Weyl sequence (the
 * constants are the published ones). */
uint64_t model_rng_next(model_rng *rng)
{
    rng->state += GOLDEN_GAMMA;
    uint64_t z = rng->state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double model_rng_uniform(model_rng *rng)
{
    return (double)(model_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* Box-Muller: two uniforms give two independent normals; the second is
 * kept for the next call. 1 - u lies in (0, 1], so the log is finite. */
double model_rng_normal(model_rng *rng)
{
    if (rng->has_spare) {
        rng->has_spare = false;
        return rng->spare;
    }
    double radius = sqrt(-2.0 * log(1.0 - model_rng_uniform(rng)));
    double angle = 2.0 * M_PI * model_rng_uniform(rng);
    rng->spare = radius * sin(angle);
    rng->has_spare = true;
    return radius * cos(angle);
}

/* ----------------------------------------------------------------- init */

/* FNV-1a, to turn a tensor's name into part of its stream's seed. */
static uint64_t name_hash(const char *name)
{
    uint64_t hash = 0xCBF29CE484222325ull;
    for (const char *c = name; *c != '\0'; c++) {
        hash ^= (unsigned char)*c;
        hash *= 0x100000001B3ull;
    }
    return hash;
}

static bool ends_with(const char *text, const char *suffix)
{
    size_t text_length = strlen(text);
    size_t suffix_length = strlen(suffix);
    return text_length >= suffix_length &&
           strcmp(text + text_length - suffix_length, suffix) == 0;
}

/* Where full index `full` (a row or column of the whole tensor) lands in
 * a shard cut in `parts` parts of which it keeps `count` / parts from
 * part_offset in each; -1 when the shard does not hold it. */
static int shard_index(int full, int full_count, int parts, int part_offset,
                       int count)
{
    int part_size = full_count / parts;
    int kept = count / parts;
    int part = full / part_size, within = full % part_size - part_offset;
    if (within < 0 || within >= kept)
        return -1;
    return part * kept + within;
}

/* Draws the whole tensor's normals in order and keeps the shard's: every
 * tensor-parallel split then holds a slice of the unsplit model's values.
 * Stops after the last row the shard holds. */
static void draw_shard(const param_tensor *t, double std, model_rng *rng,
                       float *values)
{
    if (t->rows == t->full_rows && t->cols == t->full_cols) {
        for (size_t i = 0; i < t->count; i++)
            values[i] = (float)(std * model_rng_normal(rng));
        return;
    }
    for (int r = 0; r < t->full_rows; r++) {
        int row = shard_index(r, t->full_rows, t->row_parts,
                              t->part_row_offset, t->rows);
        bool last_part = r / (t->full_rows / t->row_parts) ==
                         t->row_parts - 1;
        if (row < 0 && last_part && r % (t->full_rows / t->row_parts) >=
                                        t->part_row_offset)
            return; /* past the shard's last row */
        for (int c = 0; c < t->full_cols; c++) {
            float value = (float)(std * model_rng_normal(rng));
            int col = shard_index(c, t->full_cols, t->col_parts,
                                  t->part_col_offset, t->cols);
            if (row >= 0 && col >= 0)
                values[(size_t)row * (size_t)t->cols + (size_t)col] = value;
        }
    }
}

/* Fills one tensor: constants for biases and norms, GPT-2's normals for
 * the rest. The projections that write into the residual stream get a
 * smaller spread, 1 / sqrt(2 x layers) of the others, because each layer
 * adds two of them to the stream and its variance would otherwise grow
 * with depth. */
static void init_tensor(const param_tensor *tensor, int total_layers,
                        uint64_t seed, float *values)
{
    bool is_norm = strstr(tensor->name, "ln1_") != NULL ||
                   strstr(tensor->name, "ln2_") != NULL ||
                   strncmp(tensor->name, "final_norm", 10) == 0;
    if (ends_with(tensor->name, "_bias") || is_norm) {
        float constant = is_norm && ends_with(tensor->name, "_weight") ? 1.0f
                                                                       : 0.0f;
        for (size_t i = 0; i < tensor->count; i++)
            values[i] = constant;
        return;
    }
    double std = INIT_STD;
    if (ends_with(tensor->name, "attn_proj_weight") ||
        ends_with(tensor->name, "mlp_proj_weight"))
        std = INIT_STD / sqrt(2.0 * (total_layers > 0 ? total_layers : 1));
    /* A tied copy must equal the embedding, so it uses the embedding's
     * stream. */
    const char *stream_name =
        tensor->tied_copy ? "token_embedding" : tensor->name;
    model_rng rng;
    model_rng_seed(&rng, seed ^ name_hash(stream_name));
    draw_shard(tensor, std, &rng, values);
}

/* The tensors a worker fills: every tensor_count-th from `first`. Each
 * tensor has its own stream, so the split changes no value. */
typedef struct init_worker {
    const model_stage *stage;
    uint64_t seed;
    float *host;
    int first;
    int stride;
} init_worker;

static void *init_worker_main(void *argument)
{
    const init_worker *w = argument;
    for (int i = w->first; i < w->stage->tensor_count; i += w->stride) {
        const param_tensor *tensor = &w->stage->tensors[i];
        init_tensor(tensor, w->stage->shape.layers, w->seed,
                    w->host + tensor->offset);
    }
    return NULL;
}

/* Drawing normals one by one takes about 50 ns each: a 1.5B model would
 * wait over a minute on one core, so big stages use up to INIT_THREADS
 * (a thread that cannot start leaves its share to this one). */
#define INIT_THREADS 16
#define INIT_FLOATS_PER_THREAD (16u << 20)

static void init_tensors_in_parallel(const model_stage *stage, uint64_t seed,
                                     float *host)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t wanted = stage->param_count / INIT_FLOATS_PER_THREAD + 1;
    int threads = (int)(wanted < (size_t)INIT_THREADS ? wanted
                                                     : (size_t)INIT_THREADS);
    if (cores > 0 && threads > cores)
        threads = (int)cores;
    if (threads < 1)
        threads = 1;
    init_worker workers[INIT_THREADS];
    pthread_t ids[INIT_THREADS];
    bool started[INIT_THREADS] = {false};
    for (int t = 0; t < threads; t++) {
        workers[t] = (init_worker){stage, seed, host, t, threads};
        if (t > 0)
            started[t] = pthread_create(&ids[t], NULL, init_worker_main,
                                        &workers[t]) == 0;
    }
    init_worker_main(&workers[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            init_worker_main(&workers[t]);
    }
}

int model_stage_init_parameters(model_stage *stage, uint64_t seed,
                                 pt_error *err)
{
    float *host = calloc(stage->param_count + 1, sizeof *host);
    if (host == NULL)
        return pt_fail(err, "init: out of memory for %zu parameters",
                       stage->param_count);
    int status = 0;
    /* zeros first: gradients and both AdamW moments */
    if (model_stage_write(stage, STAGE_GRADS, host, err) != 0 ||
        model_stage_write(stage, STAGE_ADAM_M, host, err) != 0 ||
        model_stage_write(stage, STAGE_ADAM_V, host, err) != 0) {
        status = -1;
    } else {
        init_tensors_in_parallel(stage, seed, host);
        /* ZeRO-3 on the cpu backend: the rank's shard only (the
         * offload's master, if any, then reads it again) */
        if (stage->params_by_unit)
            stage_offload_params_written(stage);
        status = stage->params_by_unit
                     ? model_stage_write_range(
                           stage, STAGE_PARAMS, stage->params_first,
                           stage->params_count, host + stage->params_first,
                           err)
                     : model_stage_write(stage, STAGE_PARAMS, host, err);
    }
    stage->optimizer_steps = 0;
    free(host);
    return status;
}
