/*
 * The measuring half of `partita profile`: times the embedding, one
 * transformer layer (the mean layer of a stage of options->layer_stack
 * layers) and the head of a model, forward and backward, per
 * tensor-parallel shard and micro-batch, the AdamW step per parameter and
 * the host's rates for an offloaded optimizer (alone: --host-rates).
 * profiler/profiler.h states what is measured; docs/profiles.md
 * ("Measuring") how and why.
 *
 * The three parts are three stages run as a pipeline would run them
 * (profiler/part_chain.c), so every part sees realistic data: the
 * embedding's output feeds the layer, the layer's the head; the head's
 * input gradient feeds the layer's backward, the layer's the embedding's.
 * Each stage's input buffer is
 * filled once (a copy) and then read in place, as a pipeline stage reads
 * the activation it received: the timed calls copy nothing a real stage
 * would not. Here: the device, the sets of stages and their
 * rounds (profiler_graph.c times them on cuda), the busy neighbours.
 */
#include "profiler/profiler.h"
#include "profiler/part_chain.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#ifdef PARTITA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "executor/cuda/cuda_backend.h"
#endif

/* The AdamW learning rate while timing: small, so that the repeated
 * steps leave the parameters (and so the timings) as they were. */
#define PROFILER_LEARNING_RATE 1e-6f

static void add_note(profiler_result *out, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

static void add_note(profiler_result *out, const char *format, ...)
{
    if (out->note_count >= PROFILER_MAX_NOTES)
        return;
    va_list args;
    va_start(args, format);
    vsnprintf(out->notes[out->note_count++], sizeof out->notes[0], format,
              args);
    va_end(args);
}

/* -------------------------------------------------------------- device */

static void describe_cpu(profiled_device *device)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(device->name, sizeof device->name, "cpu (%ld cores)",
             cores > 0 ? cores : 1);
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGESIZE);
    device->memory_bytes = pages > 0 && page_size > 0
                               ? (double)pages * (double)page_size
                               : 0.0;
}

#ifdef PARTITA_HAVE_CUDA
/* The kernel driver's version, "580.95.05", from the line
 * "NVRM version: NVIDIA UNIX ... Kernel Module  580.95.05  ...": the
 * first word after "Module" that starts with a digit. */
static void read_driver_version(char *out, size_t size)
{
    out[0] = '\0';
    FILE *file = fopen("/proc/driver/nvidia/version", "r");
    if (file == NULL)
        return;
    char line[512];
    if (fgets(line, sizeof line, file) != NULL) {
        const char *after = strstr(line, "Module");
        char *save = NULL;
        for (char *word = after != NULL ? strtok_r(line + (after - line),
                                                   " \t\n", &save)
                                        : NULL;
             word != NULL; word = strtok_r(NULL, " \t\n", &save))
            if (word[0] >= '0' && word[0] <= '9' && strchr(word, '.')) {
                pt_copy_string(out, size, word);
                break;
            }
    }
    fclose(file);
}

/* The split of the GPU under --beside: the neighbours in order, the
 * measured slice at its place among them; the number of slices. */
static int device_split(const profiler_options *o,
                        int slices[PROFILER_MAX_VALUES + 1])
{
    int count = 0;
    for (int i = 0; i <= o->beside_count; i++) {
        if (i == o->beside_place)
            slices[count++] = o->sm_limit;
        if (i < o->beside_count)
            slices[count++] = o->beside_sms[i];
    }
    return count;
}

/* The index in the split of neighbour i (0-based, in beside_sms order). */
static int neighbour_slice(const profiler_options *o, int i)
{
    return i < o->beside_place ? i : i + 1;
}

/* The calling thread's device: slice `index` of the split under
 * --beside, else the SM limit alone. */
static int open_rank_device(const profiler_options *o, int index,
                            pt_error *err)
{
    if (o->beside_count == 0)
        return cuda_rank_device_open(o->device, o->sm_limit,
                                     o->memory_limit_bytes, err);
    int slices[PROFILER_MAX_VALUES + 1];
    int count = device_split(o, slices);
    return cuda_rank_device_open_slice(o->device, slices, count, index,
                                       o->memory_limit_bytes, err);
}

static int open_cuda_device(const profiler_options *options,
                            profiled_device *device, pt_error *err)
{
    if (open_rank_device(options, options->beside_place, err) != 0)
        return -1;
    cuda_device_info info;
    if (cuda_device_describe(&info) != 0)
        return pt_fail(err, "profiler: cannot describe cuda device %d",
                       options->device);
    pt_copy_string(device->name, sizeof device->name, info.name);
    device->sms = info.multiprocessors;
    device->sms_used = cuda_rank_sm_count();
    device->memory_bytes = info.memory_bytes;
    pt_copy_string(device->driver_cuda_version,
                   sizeof device->driver_cuda_version,
                   info.driver_cuda_version);
    pt_copy_string(device->runtime_cuda_version,
                   sizeof device->runtime_cuda_version,
                   info.runtime_cuda_version);
    read_driver_version(device->driver_version,
                        sizeof device->driver_version);
    /* cudaFree(0) makes the context, so what it costs shows below. */
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaFree(NULL) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
        return pt_fail(err, "profiler: cuda device %d does not answer",
                       options->device);
    device->context_bytes = (double)(total_bytes - free_bytes);
    return 0;
}
#endif

static int open_device(const profiler_options *options,
                       profiled_device *device, pt_error *err)
{
    if (options->backend == BACKEND_CPU) {
        describe_cpu(device);
        return 0;
    }
#ifdef PARTITA_HAVE_CUDA
    return open_cuda_device(options, device, err);
#else
    return pt_fail(err, "profiler: this build has no cuda backend "
                        "(meson option cuda, needs nvcc)");
#endif
}

static void close_device(const profiler_options *options)
{
#ifdef PARTITA_HAVE_CUDA
    if (options->backend == BACKEND_CUDA)
        cuda_rank_device_close();
#else
    (void)options;
#endif
}

/* ---------------------------------------------------------- measuring */

/* Calls a round of one part queues: enough for round_s at the part's
 * synchronous pace (call_s, forward plus backward), 1..PROFILER_MAX_QUEUED. */
static int calls_per_round(const profiler_options *o, double call_s)
{
    double wanted = call_s > 0.0 ? ceil(o->round_s / call_s) : 1.0;
    if (wanted < 1.0)
        return 1;
    return wanted > PROFILER_MAX_QUEUED ? PROFILER_MAX_QUEUED : (int)wanted;
}

/* The rounds of every part of one point, pooled over the sets of stages
 * (measure_tp): each set adds options->timing_rounds of each. */
typedef struct point_rounds {
    double forward[3][PROFILER_MAX_RUNS];
    double backward[3][PROFILER_MAX_RUNS];
    int count[3];                /* of each part: the embedding's sets may
                                    be more */
} point_rounds;

/* How a part's rounds are timed: the cpu queues them on the host clock;
 * cuda times the embedding's as CUDA graphs (its queued time was the
 * host's work, the token check, the plan of its gradient and the upload,
 * which a training step does while the GPU runs earlier kernels; gated,
 * its entries moved more between processes) and the others as
 * options->timing says. */
static profiler_timing part_timing(const profiler_options *o, int part)
{
    if (o->backend != BACKEND_CUDA)
        return PROFILER_TIMING_HOST;
    if (part == 0 && o->timing != PROFILER_TIMING_HOST)
        return PROFILER_TIMING_GRAPH;
    return o->timing;
}

/* The most a head taken from the executor's steps may spread (the
 * interquartile range of its rounds' forward + backward over their
 * median): what a whole model leaves once its layers are taken off is a
 * difference of two large times; where the head is a few percent of the
 * model (GPT-2's) its spread ran to 100 % and more (twelfth session),
 * where it is a third (Llama's 128k-token vocabularies at 8,192
 * positions) it is a few percent. */
#define EXEC_HEAD_SPREAD_MAX 0.05

/* Whether the executed rounds' rest (chain_exec_rounds) can stand for
 * the head: timed on the device this point, and its rounds agree. */
static bool executed_rest_agrees(const part_chain *chain, int rounds)
{
    if (chain->exec_rest_rounds != rounds)
        return false;
    double pair[PROFILER_MAX_RUNS];
    for (int r = 0; r < rounds; r++)
        pair[r] = chain->exec_rest_forward[r] + chain->exec_rest_backward[r];
    timing_summary summary = timing_summarize(pair, rounds);
    return summary.median_s > 0.0 && summary.spread <= EXEC_HEAD_SPREAD_MAX;
}

/* One part's rounds timed on the device, as *timed says (gated or
 * graphed): 0, 1 when they cannot be (nothing timed), -1 on a failure. A
 * layer stack's pair can hold more kernels than a gated round may queue
 * (profiler_gated_rounds refuses it): it is graphed instead, *timed
 * saying so, since a graph has no such bound. */
static int device_rounds(part_chain *chain, int part, int mbs,
                         model_stage *stage, const stage_io *io, int count,
                         const profiler_options *o, double *forward,
                         double *pair, profiler_timing *timed, pt_error *err)
{
    int status = 1;
    if (*timed == PROFILER_TIMING_EXEC && part == 1) {
        status = chain_exec_rounds(chain, mbs, o->hold_s, o->timing_rounds,
                                   forward, pair, err);
        if (status == 1)
            *timed = PROFILER_TIMING_STEP;
    }
    if (*timed == PROFILER_TIMING_EXEC && part == 2) {
        if (!executed_rest_agrees(chain, o->timing_rounds)) {
            *timed = PROFILER_TIMING_STEP;
        } else {
            for (int r = 0; r < o->timing_rounds; r++) {
                forward[r] = chain->exec_rest_forward[r];
                pair[r] = chain->exec_rest_forward[r] +
                          chain->exec_rest_backward[r];
            }
            return 0; /* the embedding is taken off in time_part */
        }
    }
    if (*timed == PROFILER_TIMING_STEP) {
        status = chain_step_rounds(chain, part, mbs, o->hold_s,
                                   o->timing_rounds, forward, pair, err);
        if (status == 1)
            *timed = PROFILER_TIMING_GATED;
    }
    if (*timed == PROFILER_TIMING_GATED)
        status = profiler_gated_rounds(stage, io, count, o->timing_rounds,
                                       forward, pair, err);
    if (status == 1 && *timed == PROFILER_TIMING_GATED && part == 1 &&
        chain->layers > 1)
        *timed = PROFILER_TIMING_GRAPH;
    if (status == 1 && *timed == PROFILER_TIMING_GRAPH)
        status = profiler_graph_rounds(stage, io, count, o->timing_rounds,
                                       forward, pair, err);
    return status;
}

/* The most pairs a hold queues: a hold of a launch-bound part (tens of
 * microseconds a pair) stays a few seconds of host launches. */
#define HOLD_PAIRS_MAX 20000

/* The hold before a part's rounds (profiler_options.hold_s): its pairs
 * queued back to back at the pace call_s says, not waited for, so that
 * the first round's gate finds the device still busy with them. The
 * embedding is not held: its calls draw little power, and its rounds are
 * graphed, microseconds each. */
static int hold_part(part_chain *chain, int part, int mbs, double call_s,
                     const profiler_options *o, pt_error *err)
{
    if (o->backend != BACKEND_CUDA || o->hold_s <= 0.0 || part == 0 ||
        o->timing == PROFILER_TIMING_STEP || o->timing == PROFILER_TIMING_EXEC)
        return 0; /* stepped: the steps warm the device themselves */
    double wanted = call_s > 0.0 ? ceil(o->hold_s / call_s) : 1.0;
    int pairs = wanted > HOLD_PAIRS_MAX ? HOLD_PAIRS_MAX : (int)wanted;
    stage_io io;
    model_stage *stage = chain_part_stage(chain, part, mbs, &io);
    return profiler_queue_calls(stage, &io, true, pairs, err);
}

/* One part's rounds, added to the pool: forwards, then forward +
 * backward pairs (graphed: the pairs, and the forward's share of them);
 * the backward of a round is its pair less its forward. Where the calls
 * cannot be gated or graphed, they are queued on the host clock; *timed
 * says how they were. */
static int time_part(part_chain *chain, int part, int mbs, int count,
                     const profiler_options *o, point_rounds *pool,
                     profiler_timing *timed, pt_error *err)
{
    double forward[PROFILER_MAX_RUNS], pair[PROFILER_MAX_RUNS];
    stage_io io;
    model_stage *stage = chain_part_stage(chain, part, mbs, &io);
    *timed = part_timing(o, part);
    int status = device_rounds(chain, part, mbs, stage, &io, count, o,
                               forward, pair, timed, err);
    if (status == 1)
        *timed = PROFILER_TIMING_HOST;
    for (int r = 0; status == 1 && r < o->timing_rounds; r++)
        if (chain_queued_seconds(chain, part, false, mbs, count, &forward[r],
                           err) != 0 ||
            chain_queued_seconds(chain, part, true, mbs, count, &pair[r], err) != 0)
            return -1;
    if (status == -1)
        return -1;
    /* an executed head is the rest of the executor's steps: the
     * embedding's medians (timed just before, graphed) taken off it */
    if (part == 2 && *timed == PROFILER_TIMING_EXEC) {
        int n = pool->count[0];
        timing_summary f = timing_summarize(pool->forward[0], n);
        timing_summary b = timing_summarize(pool->backward[0], n);
        for (int r = 0; r < o->timing_rounds; r++) {
            forward[r] = fmax(forward[r] - f.median_s, 1e-9);
            pair[r] = fmax(pair[r] - f.median_s - b.median_s, forward[r]);
        }
    }
    /* the layer stage's calls run every layer it holds: a layer entry is
     * their mean (executed rounds are a layer's already) */
    for (int r = 0; part == 1 && *timed != PROFILER_TIMING_EXEC &&
                    r < o->timing_rounds;
         r++) {
        forward[r] /= chain->layers;
        pair[r] /= chain->layers;
    }
    memcpy(pool->forward[part] + pool->count[part], forward,
           (size_t)o->timing_rounds * sizeof *forward);
    double *backward = pool->backward[part] + pool->count[part];
    profiler_backward_rounds(forward, pair, o->timing_rounds, backward);
    /* the executed head's backward is the step's own backward phase, not
     * a pair less a forward timed apart: no floor but a positive time
     * (a fused head's is a few percent of its pair) */
    for (int r = 0; part == 2 && *timed == PROFILER_TIMING_EXEC &&
                    r < o->timing_rounds;
         r++)
        backward[r] = fmax(pair[r] - forward[r], 1e-9);
    pool->count[part] += o->timing_rounds;
    return 0;
}

/* Warm-up runs of the whole chain, synchronous (they leave every part's
 * inputs in place and say how long each call takes), then each part's
 * rounds, back to back, added to the point's pool (docs/profiles.md,
 * "Measuring"). The first set of stages says how many calls a round
 * holds and how each part was timed. */
static int measure_point(part_chain *chain, int mbs,
                         const profiler_options *o, profiled_point *out,
                         point_rounds *pool, pt_error *err)
{
    double seconds[CHAIN_CALLS] = {0};
    int runs = o->warmup_runs > 0 ? o->warmup_runs : 1;
    for (int i = 0; i < runs; i++)
        if (chain_run(chain, mbs, seconds, err) != 0)
            return -1;
    const double call_s[3] = {
        seconds[EMBEDDING_FORWARD] + seconds[EMBEDDING_BACKWARD],
        seconds[LAYER_FORWARD] + seconds[LAYER_BACKWARD],
        seconds[HEAD_FORWARD] + seconds[HEAD_BACKWARD]};
    bool first_set = pool->count[1] == 0;
    out->head_fused = chain->head.head_fused;
    chain_set_deferred(chain, true);
    int status = 0;
    for (int part = 0; part < 3 && status == 0; part++) {
        int count = first_set ? calls_per_round(o, call_s[part])
                              : out->calls_per_round[part];
        profiler_timing timed = PROFILER_TIMING_HOST;
        status = hold_part(chain, part, mbs, call_s[part], o, err);
        if (status == 0)
            status = time_part(chain, part, mbs, count, o, pool, &timed,
                               err);
        out->calls_per_round[part] = count;
        /* a set that fell back to the host clock marks the point so */
        if (first_set || timed == PROFILER_TIMING_HOST)
            out->timed[part] = timed;
    }
    chain_set_deferred(chain, false);
    return status;
}

/* The point's entries: medians over its pooled rounds. */
static void summarize_point(const point_rounds *pool, profiled_point *out)
{
    profiled_part *parts[3] = {&out->embedding, &out->layer, &out->head};
    for (int part = 0; part < 3; part++) {
        parts[part]->forward =
            timing_summarize(pool->forward[part], pool->count[part]);
        parts[part]->backward =
            timing_summarize(pool->backward[part], pool->count[part]);
    }
}

/* Repeats runs at the chain's capacity until warmup_s has passed, so that
 * the first timings do not see the clocks of an idle device. */
static int warm_device(part_chain *chain, double warmup_s, pt_error *err)
{
    double seconds[CHAIN_CALLS];
    double until = pt_monotonic_seconds() + warmup_s;
    do {
        if (chain_run(chain, chain->capacity, seconds, err) != 0)
            return -1;
    } while (pt_monotonic_seconds() < until);
    return 0;
}

/* The AdamW step, back to back like the parts: rounds of steps queued
 * without synchronising (enough for round_s at the pace of the warm-up
 * steps), median over the rounds. */
static int time_adamw(model_stage *stage, const profiler_options *o,
                      timing_summary *out, pt_error *err)
{
    adamw_config config = adamw_defaults();
    double step_s = 0.0, rounds[PROFILER_MAX_RUNS];
    int warmup = o->warmup_runs > 0 ? o->warmup_runs : 1;
    for (int i = 0; i < warmup; i++) {
        double start = pt_monotonic_seconds();
        if (stage_adamw_step(stage, &config, PROFILER_LEARNING_RATE, 1.0f,
                             err) != 0)
            return -1;
        step_s = pt_monotonic_seconds() - start;
    }
    int count = calls_per_round(o, step_s);
    stage->defer_sync = true;
    int status = 0;
    for (int r = 0; r < o->timing_rounds && status == 0; r++) {
        double start = pt_monotonic_seconds();
        for (int i = 0; i < count && status == 0; i++)
            status = stage_adamw_step(stage, &config, PROFILER_LEARNING_RATE,
                                      1.0f, err);
        if (status == 0)
            status = stage_synchronize(stage, err);
        rounds[r] = (pt_monotonic_seconds() - start) / count;
    }
    stage->defer_sync = false;
    *out = timing_summarize(rounds, o->timing_rounds);
    return status;
}

/* The host's AdamW and the host link's copies of the chain's layer stage,
 * the rates an offloaded optimizer is priced at. */
static int measure_host(part_chain *chain, const profiler_options *o,
                        profiler_result *out, pt_error *err)
{
    if (stage_offload_host_rate(o->host_adamw_params, o->timing_rounds,
                                &out->host_adamw_s_per_param, err) != 0 ||
        stage_offload_copy_rate(&chain->layer, o->timing_rounds,
                                &out->host_copy_s_per_param, err) != 0) {
        pt_error_prefix(err, "profiler");
        return -1;
    }
    return 0;
}

static int measure_optimizer(part_chain *chain, const profiler_options *o,
                             profiler_result *out, pt_error *err)
{
    if (time_adamw(&chain->layer, o, &out->optimizer_layer, err) != 0 ||
        time_adamw(&chain->embedding, o, &out->optimizer_embedding, err) !=
            0) {
        pt_error_prefix(err, "profiler: AdamW step");
        return -1;
    }
    out->layer_parameters = (double)chain->layer.param_count;
    out->embedding_parameters = (double)chain->embedding.param_count;
    out->optimizer_s_per_param =
        out->optimizer_layer.median_s / out->layer_parameters;
    return measure_host(chain, o, out, err);
}

/* ------------------------------------------------ busy neighbours */

/* What the neighbour slices run (--beside): the layer's forward and
 * backward, the layer's AdamW step, or nothing more (they end). */
typedef enum neighbour_phase {
    NEIGHBOURS_LAYER,
    NEIGHBOURS_ADAMW,
    NEIGHBOURS_STOP
} neighbour_phase;

/* One neighbour slice's thread and its chain of the measured shape. */
typedef struct neighbour {
    pthread_t thread;
    int slice;                   /* its index in the device's split */
    const model_shape *shape;
    int tp;
    int capacity;
    int layers;                  /* of its layer stage: the measured one's */
    const profiler_options *options;
    atomic_int *phase;           /* shared: neighbour_phase */
    atomic_int *mbs;             /* shared: the micro-batch to run */
    atomic_int state;            /* 0 starting, 1 busy, -1 failed */
    pt_error err;
} neighbour;

/* The neighbours of one tp of one shape, all busy until stopped. */
typedef struct neighbour_set {
    int count;
    neighbour members[PROFILER_MAX_VALUES];
    atomic_int phase;
    atomic_int mbs;
} neighbour_set;

#ifdef PARTITA_HAVE_CUDA
/* Runs the neighbour's load until told to stop: chains of a few calls
 * queued back to back and waited for, so that the slice is as busy as a
 * rank's stage, and the phase is read between them. */
static int neighbour_loop(neighbour *n, part_chain *chain)
{
    adamw_config config = adamw_defaults();
    double seconds[CHAIN_CALLS], unused;
    if (chain_run(chain, atomic_load(n->mbs), seconds, &n->err) != 0)
        return -1;
    chain_set_deferred(chain, true);
    atomic_store(&n->state, 1);
    int status = 0;
    for (int phase = atomic_load(n->phase);
         phase != NEIGHBOURS_STOP && status == 0;
         phase = atomic_load(n->phase)) {
        if (phase == NEIGHBOURS_ADAMW) {
            for (int i = 0; i < 4 && status == 0; i++)
                status = stage_adamw_step(&chain->layer, &config,
                                          PROFILER_LEARNING_RATE, 1.0f,
                                          &n->err);
            if (status == 0)
                status = stage_synchronize(&chain->layer, &n->err);
        } else {
            status = chain_queued_seconds(chain, 1, true, atomic_load(n->mbs), 4,
                                    &unused, &n->err);
        }
    }
    chain_set_deferred(chain, false);
    return status;
}

static void *neighbour_main(void *argument)
{
    neighbour *n = argument;
    part_chain chain;
    int status = open_rank_device(n->options, n->slice, &n->err);
    if (status == 0) {
        status = chain_create(&chain, n->shape, n->tp, n->capacity,
                              n->layers, n->options, &n->err);
        if (status == 0) {
            status = neighbour_loop(n, &chain);
            chain_destroy(&chain);
        }
        cuda_rank_device_close();
    }
    if (status != 0)
        atomic_store(&n->state, -1);
    return NULL;
}
#endif

/* Ends the neighbours (each finishes its chain of calls) and says whether
 * every one stayed busy to the end; -1 with err when one failed. */
static int neighbours_stop(neighbour_set *set, pt_error *err)
{
    atomic_store(&set->phase, NEIGHBOURS_STOP);
    int status = 0;
    for (int i = 0; i < set->count; i++) {
        neighbour *n = &set->members[i];
        pthread_join(n->thread, NULL);
        if (atomic_load(&n->state) < 0 && status == 0)
            status = pt_fail(err, "profiler: the busy neighbour on slice %d "
                                  "failed: %s",
                             n->slice, n->err.message);
    }
    set->count = 0;
    return status;
}

/* Starts one thread per neighbour slice of the options (none without
 * --beside, or with its neighbours idle), each with a chain of the shape
 * at this tp and capacity, its layer stage as deep as the measured
 * chain's, and waits until every one is busy. */
static int neighbours_start(neighbour_set *set, const model_shape *shape,
                            int tp, const part_chain *measured,
                            const profiler_options *o, pt_error *err)
{
    int capacity = measured->capacity;
    set->count = 0;
    atomic_init(&set->phase, NEIGHBOURS_LAYER);
    atomic_init(&set->mbs, capacity);
#ifdef PARTITA_HAVE_CUDA
    for (int i = 0; i < o->beside_count && !o->neighbours_idle; i++) {
        neighbour *n = &set->members[set->count];
        *n = (neighbour){.slice = neighbour_slice(o, i), .shape = shape,
                         .tp = tp, .capacity = capacity,
                         .layers = measured->layers, .options = o,
                         .phase = &set->phase, .mbs = &set->mbs};
        atomic_init(&n->state, 0);
        if (pthread_create(&n->thread, NULL, neighbour_main, n) != 0) {
            pt_error ignored = {{0}};
            neighbours_stop(set, &ignored);
            return pt_fail(err, "profiler: cannot start the thread of "
                                "neighbour slice %d",
                           i + 1);
        }
        set->count++;
    }
    for (int i = 0; i < set->count; i++)
        while (atomic_load(&set->members[i].state) == 0)
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    for (int i = 0; i < set->count; i++)
        if (atomic_load(&set->members[i].state) < 0)
            return neighbours_stop(set, err);
#else
    (void)shape, (void)tp, (void)measured, (void)o, (void)err;
#endif
    return 0;
}

const char *profiler_tp_refusal(const model_shape *shape, int tp)
{
    if (shape->heads % tp != 0)
        return "it does not divide the heads";
    /* grouped-query attention: the executors split whole key/value
       heads (Megatron-LM asks the same), none copied on several ranks */
    if (model_kv_heads(shape) % tp != 0)
        return "it does not divide the key/value heads";
    if (shape->ffn_hidden % tp != 0 || shape->hidden % tp != 0)
        return "it does not divide hidden and ffn_hidden";
    if (shape->vocab < tp)
        return "the vocabulary has fewer rows than shards";
    return NULL;
}

/* The layers of the layer stage asked for, cut to the model's. */
static int wanted_layers(const model_shape *shape, const profiler_options *o)
{
    return o->layer_stack < shape->layers ? o->layer_stack : shape->layers;
}

/* The chain at this capacity whose layer stage is the deepest that fits:
 * the layers asked for, halved after each failure down to one. A stack
 * also runs once at the capacity, forward and backward, so that what its
 * calls allocate fits too (a lone layer's failure there ends the tp's
 * larger micro-batches, as before stacks). A cut stack is noted. 0, or -1
 * with err the one layer's failure. */
static int stacked_chain(part_chain *chain, const model_shape *shape, int tp,
                         int capacity, const profiler_options *o,
                         profiler_result *out, pt_error *err)
{
    int wanted = wanted_layers(shape, o), failed = 0;
    double seconds[CHAIN_CALLS];
    for (int layers = wanted; layers >= 1; failed = layers, layers /= 2) {
        if (chain_create(chain, shape, tp, capacity, layers, o, err) != 0)
            continue;
        if (layers > 1 && chain_run(chain, capacity, seconds, err) != 0) {
            chain_destroy(chain);
            continue;
        }
        if (layers < wanted)
            add_note(out, "tp %d: a layer stack of %d layers, not %d: %d "
                          "did not fit at micro-batch %d: %s",
                     tp, layers, wanted, failed, capacity, err->message);
        return 0;
    }
    return -1;
}

/* The chain of the largest micro-batch of the list that fits at this tp
 * (stacked_chain: with the deepest layer stage that fits there): tries
 * them from the largest down. Returns the index of that micro-batch in
 * the list, or -1 (err holds the smallest's failure). */
static int largest_chain(part_chain *chain, const model_shape *shape, int tp,
                         const profiler_options *o, profiler_result *out,
                         pt_error *err)
{
    pt_error failure = {{0}};
    for (int i = o->mbs_count - 1; i >= 0; i--) {
        if (stacked_chain(chain, shape, tp, o->mbs_values[i], o, out,
                          err) == 0) {
            if (i < o->mbs_count - 1)
                add_note(out, "tp %d: micro-batch %d and up not measured: "
                              "%s",
                         tp, o->mbs_values[i + 1], failure.message);
            return i;
        }
        failure = *err; /* the smallest micro-batch that failed so far */
    }
    return -1;
}

typedef struct measure_progress {
    int done;
    int total;
} measure_progress;

static void report(const profiler_options *o, measure_progress *progress,
                   int steps, const char *label, const profiled_point *point)
{
    progress->done += steps;
    if (o->progress != NULL)
        o->progress(progress->done, progress->total, label, point,
                    o->progress_data);
}

/* One tp's measurement across its sets of stages: the points it fills
 * (out->points from out->point_count on), their pooled rounds, how many
 * of them fit, and the neighbours that run beside them. */
typedef struct tp_measurement {
    int tp;
    part_chain chain;
    neighbour_set neighbours;
    profiled_point *points;
    point_rounds *pools;
    int measured;                /* points measurable: cut by a failure */
    int layers;                  /* of the layer stage, in every set */
} tp_measurement;

/* The embedding's sets beyond the sets of stages (options->embedding_sets,
 * spread over them): after set `set`, its stage made again in fresh
 * memory, warmed up, and its rounds at every point added to the pools. */
static int measure_embedding_sets(tp_measurement *m, int set,
                                  const profiler_options *o,
                                  measure_progress *progress, pt_error *err)
{
    int extra_total = o->embedding_sets - o->stage_sets;
    if (extra_total <= 0 || m->measured == 0)
        return 0;
    int extra = (set + 1) * extra_total / o->stage_sets -
                set * extra_total / o->stage_sets;
    int warmups = o->warmup_runs > 0 ? o->warmup_runs : 1;
    char label[400];
    for (int k = 0; k < extra; k++) {
        if (chain_remake_embedding(&m->chain, err) != 0)
            return -1;
        for (int i = 0; i < m->measured; i++) {
            int mbs = o->mbs_values[i];
            double unused = 0.0;
            profiler_timing timed = PROFILER_TIMING_HOST;
            atomic_store(&m->neighbours.mbs, mbs);
            if (chain_queued_seconds(&m->chain, 0, true, mbs, warmups,
                                     &unused, err) != 0)
                return -1;
            chain_set_deferred(&m->chain, true);
            int status = time_part(&m->chain, 0, mbs,
                                   m->points[i].calls_per_round[0], o,
                                   &m->pools[i], &timed, err);
            chain_set_deferred(&m->chain, false);
            if (status != 0)
                return -1;
            if (timed == PROFILER_TIMING_HOST)
                m->points[i].timed[0] = timed;
        }
        snprintf(label, sizeof label, "tp %d: the embedding made again (%d "
                                      "of %d sets)",
                 m->tp, m->pools[0].count[0] / o->timing_rounds,
                 o->embedding_sets);
        report(o, progress, 0, label, NULL);
    }
    return 0;
}

/* One set of stages: the device warmed up (2 s before the profile's first
 * point; an eighth of that after the device idled a moment while the
 * host made a set or a tp's stages, or before a later process), then every point measurable, then the embedding's extra sets.
 * A point that fails in the first set ends the tp there (larger
 * micro-batches would fail too); in a later set it is an error. After the
 * last set the points are summed up and reported. */
static int measure_set(tp_measurement *m, int set, const profiler_options *o,
                       profiler_result *out, measure_progress *progress,
                       pt_error *err)
{
    pt_error failure = {{0}};
    char label[400];
    bool last_set = set == o->stage_sets - 1;
    double warmup_s = out->point_count == 0 && set == 0 &&
                              !o->device_was_busy
                          ? o->device_warmup_s
                          : o->device_warmup_s / 8.0;
    if (warmup_s > 0.0 && warm_device(&m->chain, warmup_s, &failure) != 0)
        return pt_fail(err, "%s", failure.message);
    for (int i = 0; i < m->measured; i++) {
        int mbs = o->mbs_values[i];
        atomic_store(&m->neighbours.mbs, mbs);
        if (measure_point(&m->chain, mbs, o, &m->points[i], &m->pools[i],
                          &failure) != 0) {
            if (set > 0)
                return pt_fail(err, "set %d of stages, micro-batch %d: %s",
                               set + 1, mbs, failure.message);
            add_note(out, "tp %d: micro-batch %d and up not measured: %s",
                     m->tp, mbs, failure.message);
            m->measured = i;
            break;
        }
        if (last_set)
            continue;
        snprintf(label, sizeof label, "tp %d, micro-batch %d, set %d of %d",
                 m->tp, mbs, set + 1, o->stage_sets);
        report(o, progress, 1, label, NULL);
    }
    if (measure_embedding_sets(m, set, o, progress, err) != 0)
        return -1;
    for (int i = 0; last_set && i < m->measured; i++) {
        if (o->timing == PROFILER_TIMING_EXEC &&
            m->points[i].timed[1] == PROFILER_TIMING_STEP)
            add_note(out, "tp %d, micro-batch %d: the layer stepped, not "
                          "executed: %s",
                     m->tp, o->mbs_values[i],
                     m->layers < 2 ? "a stack of one layer has no second "
                                     "depth"
                                   : "the executor's whole models did not "
                                     "fit beside the part chain");
        summarize_point(&m->pools[i], &m->points[i]);
        out->point_count++;
        snprintf(label, sizeof label, "tp %d, micro-batch %d", m->tp,
                 o->mbs_values[i]);
        report(o, progress, 1, label, &m->points[i]);
    }
    return 0;
}

/* The sets of stages of one tp, one after the other, each made in fresh
 * memory; the AdamW step is timed on the first. */
static int measure_sets(tp_measurement *m, const model_shape *shape,
                        const profiler_options *o, bool *optimizer_done,
                        profiler_result *out, measure_progress *progress,
                        pt_error *err)
{
    int last = m->measured - 1, status = 0;
    for (int set = 0; set < o->stage_sets && status == 0 && m->measured > 0;
         set++) {
        if (set > 0 && chain_create(&m->chain, shape, m->tp,
                                    o->mbs_values[last], m->layers, o,
                                    err) != 0)
            return -1;
        status = measure_set(m, set, o, out, progress, err);
        if (status == 0 && set == 0 && m->measured > 0 && !*optimizer_done) {
            atomic_store(&m->neighbours.phase, NEIGHBOURS_ADAMW);
            status = measure_optimizer(&m->chain, o, out, err);
            *optimizer_done = status == 0;
            if (status == 0)
                report(o, progress, 1, "optimizer", NULL);
            atomic_store(&m->neighbours.phase, NEIGHBOURS_LAYER);
        }
        chain_destroy(&m->chain);
    }
    return status;
}

/* Every micro-batch of the list up to the chain's capacity, in each of
 * the sets of stages; a run that fails in the first set ends the tp
 * (larger micro-batches would fail too). `later_list`: the list is the
 * rest of a longer one whose smaller micro-batches were measured
 * (measure_tp_each_mbs), so a chain that does not fit ends the list from
 * its first micro-batch on, not the tp. */
static int measure_tp(const model_shape *shape, int tp,
                      const profiler_options *o, bool later_list,
                      bool *optimizer_done, profiler_result *out,
                      measure_progress *progress, pt_error *err)
{
    char label[400];
    int steps = o->mbs_count * o->stage_sets, done_before = progress->done;
    bool optimizer_before = *optimizer_done;
    const char *refusal = profiler_tp_refusal(shape, tp);
    if (refusal != NULL) {
        char kv[48] = "";
        if (model_kv_heads(shape) != shape->heads)
            snprintf(kv, sizeof kv, " of which %d for keys and values",
                     model_kv_heads(shape));
        add_note(out, "tp %d skipped: %s (%d heads%s, hidden %d, ffn_hidden "
                      "%d)",
                 tp, refusal, shape->heads, kv, shape->hidden,
                 shape->ffn_hidden);
        snprintf(label, sizeof label, "tp %d skipped: %s", tp, refusal);
        report(o, progress, steps, label, NULL);
        return 0;
    }
    tp_measurement m = {.tp = tp, .points = &out->points[out->point_count]};
    pt_error failure = {{0}};
    int last = largest_chain(&m.chain, shape, tp, o, out, &failure);
    if (last < 0) {
        if (later_list)
            add_note(out, "tp %d: micro-batch %d and up not measured: %s",
                     tp, o->mbs_values[0], failure.message);
        else
            add_note(out, "tp %d skipped: %s", tp, failure.message);
        snprintf(label, sizeof label, "tp %d skipped: %.300s", tp,
                 failure.message);
        report(o, progress, steps, label, NULL);
        return 0;
    }
    m.measured = last + 1;
    m.layers = m.chain.layers;
    m.pools = calloc((size_t)m.measured, sizeof *m.pools);
    if (m.pools == NULL ||
        neighbours_start(&m.neighbours, shape, tp, &m.chain, o, err) != 0) {
        free(m.pools);
        chain_destroy(&m.chain);
        return m.pools == NULL ? pt_fail(err, "profiler: out of host memory "
                                              "for the rounds")
                               : -1;
    }
    for (int i = 0; i < m.measured; i++)
        m.points[i] = (profiled_point){.tp = tp, .mbs = o->mbs_values[i],
                                       .layers_stacked = m.layers};
    int status =
        measure_sets(&m, shape, o, optimizer_done, out, progress, err);
    free(m.pools);
    /* a neighbour that failed leaves the times without their load */
    if (neighbours_stop(&m.neighbours, status == 0 ? err : &failure) != 0)
        status = -1;
    /* the steps of the micro-batches and sets not measured (the
     * optimizer's step is its own) */
    int optimizer_step = *optimizer_done && !optimizer_before ? 1 : 0;
    if (progress->done < done_before + steps + optimizer_step)
        progress->done = done_before + steps + optimizer_step;
    return status;
}

/* Executed timing on the cuda backend: a part chain for each micro-batch
 * of the list in turn, each made for that micro-batch alone, so that the
 * executor's whole models (chain_exec_rounds) fit beside it. A chain
 * made for the list's largest micro-batch left Llama-3-8B at 8,192
 * positions no room for them at any micro-batch, and every point was
 * stepped (nineteenth session). A micro-batch that does not fit ends the
 * list, as measure_tp's one chain would. */
static int measure_tp_each_mbs(const model_shape *shape, int tp,
                               const profiler_options *o,
                               bool *optimizer_done, profiler_result *out,
                               measure_progress *progress, pt_error *err)
{
    profiler_options one = *o;
    one.mbs_count = 1;
    for (int i = 0; i < o->mbs_count; i++) {
        one.mbs_values[0] = o->mbs_values[i];
        int points = out->point_count;
        if (measure_tp(shape, tp, &one, i > 0, optimizer_done, out, progress,
                       err) != 0)
            return -1;
        if (out->point_count > points)
            continue;
        progress->done += (o->mbs_count - i - 1) * o->stage_sets;
        break;
    }
    return 0;
}

int profiler_measure_host_rates(const model_shape *shape,
                                const profiler_options *options,
                                profiler_result *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (profiler_options_check(options, err) != 0)
        return -1;
    double started = pt_monotonic_seconds();
    if (open_device(options, &out->device, err) != 0)
        return -1;
    part_chain chain;
    int status = chain_create(&chain, shape, 1, options->mbs_values[0],
                              wanted_layers(shape, options), options, err);
    if (status == 0) {
        status = measure_host(&chain, options, out, err);
        chain_destroy(&chain);
    }
    close_device(options);
    out->elapsed_s = pt_monotonic_seconds() - started;
    return status;
}

int profiler_measure(const model_shape *shape,
                     const profiler_options *options, profiler_result *out,
                     pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (profiler_options_check(options, err) != 0)
        return -1;
    double started = pt_monotonic_seconds();
    out->runs_warmup = options->warmup_runs;
    out->runs_timed_max = options->timed_runs;
    out->runs_timed_min = options->min_timed_runs;
    if (open_device(options, &out->device, err) != 0)
        return -1;
    measure_progress progress = {
        .total = options->tp_count * options->mbs_count *
                     options->stage_sets +
                 1};
    if (wanted_layers(shape, options) < options->layer_stack)
        add_note(out, "a layer stack of the model's %d layers, not %d",
                 shape->layers, options->layer_stack);
    bool optimizer_done = false;
    int status = 0;
    bool each_mbs = options->timing == PROFILER_TIMING_EXEC &&
                    options->backend == BACKEND_CUDA &&
                    options->mbs_count > 1;
    for (int i = 0; i < options->tp_count && status == 0; i++) {
        int tp = options->tp_values[i];
        if (each_mbs && profiler_tp_refusal(shape, tp) == NULL)
            status = measure_tp_each_mbs(shape, tp, options, &optimizer_done,
                                         out, &progress, err);
        else
            status = measure_tp(shape, tp, options, false, &optimizer_done,
                                out, &progress, err);
    }
    close_device(options);
    out->elapsed_s = pt_monotonic_seconds() - started;
    if (status != 0)
        return -1;
    if (out->point_count == 0 || !optimizer_done)
        return pt_fail(err, "profiler: nothing could be measured: %s",
                       out->note_count > 0 ? out->notes[0]
                                           : "no tp and micro-batch given");
    return 0;
}
