/*
 * The profiler's part chain (profiler/part_chain.h): the embedding, the
 * layer stage (one layer or a stack) and the head of a model made as three
 * stages of a pipeline, with
 * GPT-2-like parameters and random tokens, and the calls that run them.
 */
#include "profiler/part_chain.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"

void chain_destroy(part_chain *chain)
{
    model_stage *stages[] = {&chain->embedding, &chain->layer, &chain->head};
    for (int i = 0; i < chain->made; i++)
        model_stage_destroy(stages[i]);
    free(chain->tokens);
    free(chain->embedding_values);
    memset(chain, 0, sizeof *chain);
}

/* xorshift64: fast enough for the hundreds of millions of values a large
 * vocabulary needs (a normal draw per value takes minutes there). */
static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* The values are drawn in chunks, each from its own stream (the seed,
 * the tensor and the chunk), so that threads can share a tensor: one
 * thread took 0.2 s for GPT-2's 38.6 million embedding values, and every
 * measuring process draws them again for each tp. */
#define FILL_CHUNK ((size_t)1 << 20)
#define FILL_THREADS 16

/* What the fill's threads share: the stage, the host values and the next
 * chunk to draw (over all tensors, counted in each tensor's chunks). */
typedef struct fill_work {
    const model_stage *stage;
    uint64_t seed;
    float *host;
    atomic_size_t next_chunk;
    size_t chunk_count;
} fill_work;

/* Chunk `index` of all tensors: its tensor and first value there. */
static const param_tensor *chunk_at(const model_stage *stage, size_t index,
                                    size_t *first)
{
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t chunks = (t->count + FILL_CHUNK - 1) / FILL_CHUNK;
        if (index < chunks) {
            *first = index * FILL_CHUNK;
            return t;
        }
        index -= chunks;
    }
    return NULL;
}

/* GPT-2-like values: norm weights 1, biases 0, everything else uniform
 * with standard deviation 0.02. Times depend on the values only through
 * power draw (zeros would run cooler, hence faster), not on their
 * distribution. */
static void fill_chunk(const fill_work *w, size_t index)
{
    size_t first = 0;
    const param_tensor *t = chunk_at(w->stage, index, &first);
    size_t end = first + FILL_CHUNK < t->count ? first + FILL_CHUNK
                                               : t->count;
    bool is_bias = strstr(t->name, "_bias") != NULL;
    bool is_norm_weight = !is_bias && t->rows == 1;
    float *values = w->host + t->offset;
    uint64_t state = (w->seed * 0x9E3779B97F4A7C15ull) ^
                     ((uint64_t)index * 0xD1B54A32D192ED03ull);
    state = state != 0 ? state : 1;
    for (size_t k = first; k < end; k++) {
        float value = is_bias ? 0.0f : 1.0f;
        if (!is_bias && !is_norm_weight) {
            double unit = (double)(next_random(&state) >> 11) * 0x1p-53;
            value = (float)((2.0 * unit - 1.0) * 1.7320508 * 0.02);
        }
        values[k] = value;
    }
}

static void *fill_worker(void *argument)
{
    fill_work *w = argument;
    for (size_t index = atomic_fetch_add(&w->next_chunk, 1);
         index < w->chunk_count;
         index = atomic_fetch_add(&w->next_chunk, 1))
        fill_chunk(w, index);
    return NULL;
}

/* Every value of the stage into host, on up to FILL_THREADS threads (a
 * thread that cannot start leaves its chunks to the others). */
static void draw_parameters(const model_stage *stage, uint64_t seed,
                            float *host)
{
    fill_work work = {.stage = stage, .seed = seed, .host = host};
    atomic_init(&work.next_chunk, 0);
    for (int i = 0; i < stage->tensor_count; i++)
        work.chunk_count +=
            (stage->tensors[i].count + FILL_CHUNK - 1) / FILL_CHUNK;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cores > 1 ? (size_t)cores : 1;
    if (threads > FILL_THREADS)
        threads = FILL_THREADS;
    if (threads > work.chunk_count)
        threads = work.chunk_count > 0 ? work.chunk_count : 1;
    pthread_t ids[FILL_THREADS];
    bool started[FILL_THREADS] = {false};
    for (size_t t = 1; t < threads; t++)
        started[t] = pthread_create(&ids[t], NULL, fill_worker, &work) == 0;
    fill_worker(&work);
    for (size_t t = 1; t < threads; t++)
        if (started[t])
            pthread_join(ids[t], NULL);
}

/* The stage's parameters: drawn from the seed, or, when *kept holds
 * values already (an embedding made again for its sets), those. With
 * kept, the values drawn are handed over in *kept (the chain frees
 * them), so a remake writes them without drawing or reading back. */
static int fill_parameters(model_stage *stage, uint64_t seed, float **kept,
                           pt_error *err)
{
    if (kept != NULL && *kept != NULL)
        return model_stage_write(stage, STAGE_PARAMS, *kept, err);
    float *host = malloc((stage->param_count + 1) * sizeof *host);
    if (host == NULL)
        return pt_fail(err, "profiler: out of host memory for %zu "
                            "parameters",
                       stage->param_count);
    draw_parameters(stage, seed, host);
    int status = model_stage_write(stage, STAGE_PARAMS, host, err);
    if (status == 0 && kept != NULL)
        *kept = host;
    else
        free(host);
    return status;
}

/* The embedding stage: no layers, no head. */
#define EMBEDDING_SPEC \
    ((stage_spec){.first_layer = 0, .last_layer = 0, .has_embedding = true})

static int make_stage(model_stage *out, const model_shape *shape,
                      stage_spec spec, int tp, const profiler_options *o,
                      int capacity, float **kept, pt_error *err)
{
    spec.tp = tp;
    spec.tp_rank = 0;
    if (model_stage_create(out, shape, &spec, o->backend, capacity, 1,
                           err) != 0)
        return -1;
    uint64_t seed = o->seed + (uint64_t)spec.first_layer;
    if ((tp > 1 && model_stage_attach_tp(out, NULL, NULL, err) != 0) ||
        fill_parameters(out, seed, kept, err) != 0) {
        model_stage_destroy(out);
        return -1;
    }
    return 0;
}

/* Fills each stage's input once, with the previous part's output at the
 * full capacity; the timed runs then read their inputs in place. */
static int chain_prime(part_chain *chain, pt_error *err)
{
    stage_io io = {.mbs = chain->capacity, .tokens = chain->tokens,
                   .loss_scale = 1.0f};
    if (stage_forward(&chain->embedding, 0, &io, NULL, err) != 0)
        return -1;
    io.input = stage_output(&chain->embedding, 0);
    if (stage_forward(&chain->layer, 0, &io, NULL, err) != 0)
        return -1;
    io.input = stage_output(&chain->layer, 0);
    return stage_forward(&chain->head, 0, &io, NULL, err);
}

int chain_create(part_chain *chain, const model_shape *shape, int tp,
                 int capacity, int layers, const profiler_options *o,
                 pt_error *err)
{
    memset(chain, 0, sizeof *chain);
    chain->capacity = capacity;
    chain->layers = layers;
    chain->shape = shape;
    chain->tp = tp;
    chain->options = o;
    size_t window = (size_t)shape->seq + 1;
    chain->tokens = malloc((size_t)capacity * window * sizeof(uint32_t));
    if (chain->tokens == NULL)
        return pt_fail(err, "profiler: out of host memory for tokens");
    uint64_t state = o->seed * 0xD1B54A32D192ED03ull + 7;
    for (size_t i = 0; i < (size_t)capacity * window; i++)
        chain->tokens[i] =
            (uint32_t)(next_random(&state) % (uint64_t)shape->vocab);
    stage_spec embedding = EMBEDDING_SPEC;
    /* layers 0..layers: each its own parameters (drawn from one seed,
     * chunk by chunk) and activations */
    stage_spec layer = {.first_layer = 0, .last_layer = layers};
    stage_spec head = {.first_layer = shape->layers,
                       .last_layer = shape->layers, .has_head = true};
    const struct {
        model_stage *stage;
        stage_spec spec;
        const char *name;
    } parts[] = {{&chain->embedding, embedding, "embedding"},
                 {&chain->layer, layer, "layer"},
                 {&chain->head, head, "head"}};
    for (int i = 0; i < 3; i++) {
        if (make_stage(parts[i].stage, shape, parts[i].spec, tp, o, capacity,
                       i == 0 ? &chain->embedding_values : NULL,
                       err) != 0) {
            pt_error_prefix(err, "the %s stage", parts[i].name);
            chain_destroy(chain);
            return -1;
        }
        chain->made++;
    }
    if (chain_prime(chain, err) != 0) {
        chain_destroy(chain);
        return -1;
    }
    /* primed: from now on each part is timed without its stage's
     * boundary (stage.h), which a pipeline stage pays once however many
     * layers it holds; the inputs keep the values the priming left */
    chain->embedding.boundary_free = true;
    chain->layer.boundary_free = true;
    chain->head.boundary_free = true;
    return 0;
}

int chain_make_whole_model(const part_chain *chain, int layers, int mbs,
                           model_stage *out, pt_error *err)
{
    /* the stage keeps a copy of the shape */
    model_shape shape = *chain->shape;
    shape.layers = layers;
    return make_stage(out, &shape, stage_spec_whole_model(&shape),
                      chain->tp, chain->options, mbs, NULL, err);
}

int chain_remake_embedding(part_chain *chain, pt_error *err)
{
    model_stage fresh;
    if (make_stage(&fresh, chain->shape, EMBEDDING_SPEC, chain->tp,
                   chain->options, chain->capacity,
                   &chain->embedding_values, err) != 0) {
        pt_error_prefix(err, "the embedding stage, made again");
        return -1;
    }
    model_stage_destroy(&chain->embedding);
    chain->embedding = fresh;
    chain->embedding.boundary_free = true;
    return 0;
}

/* One run of every call at micro-batch mbs, each timed; gradients are
 * zeroed first (untimed), as a training step would. */
int chain_run(part_chain *chain, int mbs, double seconds[CHAIN_CALLS],
              pt_error *err)
{
    model_stage *stages[] = {&chain->embedding, &chain->layer, &chain->head};
    for (int i = 0; i < 3; i++)
        if (stage_zero_grads(stages[i], err) != 0)
            return -1;
    stage_io embedding_io = {.mbs = mbs, .tokens = chain->tokens};
    stage_io layer_io = {.mbs = mbs,
                         .input = stage_input_buffer(&chain->layer, 0)};
    stage_io head_io = {.mbs = mbs, .tokens = chain->tokens,
                        .input = stage_input_buffer(&chain->head, 0),
                        .loss_scale = 1.0f};
    double start = pt_monotonic_seconds();
    for (int call = 0; call < CHAIN_CALLS; call++) {
        int status = 0;
        switch ((chain_call)call) {
        case EMBEDDING_FORWARD:
            status = stage_forward(&chain->embedding, 0, &embedding_io, NULL,
                                   err);
            break;
        case LAYER_FORWARD:
            status = stage_forward(&chain->layer, 0, &layer_io, NULL, err);
            break;
        case HEAD_FORWARD:
            status = stage_forward(&chain->head, 0, &head_io, NULL, err);
            break;
        case HEAD_BACKWARD:
            status = stage_backward(&chain->head, 0, &head_io, err);
            layer_io.output_grad = stage_input_grad(&chain->head);
            break;
        case LAYER_BACKWARD:
            status = stage_backward(&chain->layer, 0, &layer_io, err);
            embedding_io.output_grad = stage_input_grad(&chain->layer);
            break;
        case EMBEDDING_BACKWARD:
            status = stage_backward(&chain->embedding, 0, &embedding_io, err);
            break;
        case CHAIN_CALLS:
            break;
        }
        double end = pt_monotonic_seconds();
        if (status != 0)
            return -1;
        seconds[call] = end - start;
        start = end;
    }
    return 0;
}

/* The stage of one part and the io of its calls: the inputs are those
 * the last synchronous run left (the layer's input and the gradients
 * each part receives). */
model_stage *chain_part_stage(part_chain *chain, int part, int mbs,
                              stage_io *io)
{
    model_stage *stages[] = {&chain->embedding, &chain->layer, &chain->head};
    *io = (stage_io){.mbs = mbs, .loss_scale = 1.0f};
    if (part != 1)
        io->tokens = chain->tokens;
    if (part == 0)
        io->output_grad = stage_input_grad(&chain->layer);
    if (part == 1) {
        io->input = stage_input_buffer(&chain->layer, 0);
        io->output_grad = stage_input_grad(&chain->head);
    }
    if (part == 2)
        io->input = stage_input_buffer(&chain->head, 0);
    return stages[part];
}

/* The calls of one part, queued `count` times back to back and waited
 * for once: seconds per call on the host clock. */
int chain_queued_seconds(part_chain *chain, int part, bool with_backward,
                         int mbs, int count, double *out, pt_error *err)
{
    stage_io io;
    model_stage *stage = chain_part_stage(chain, part, mbs, &io);
    double start = pt_monotonic_seconds();
    if (profiler_queue_calls(stage, &io, with_backward, count, err) != 0 ||
        stage_synchronize(stage, err) != 0)
        return -1;
    *out = (pt_monotonic_seconds() - start) / count;
    return 0;
}

void chain_set_deferred(part_chain *chain, bool on)
{
    chain->embedding.defer_sync = on;
    chain->layer.defer_sync = on;
    chain->head.defer_sync = on;
}
