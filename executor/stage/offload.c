/*
 * ZeRO-Offload for one stage (stage_spec.offload_optimizer): the fp32
 * master weights and AdamW's two moments of the optimizer's range (all
 * parameters, or the ZeRO shard) in host memory the backend copies from
 * fastest (pinned on the cuda backend), and the AdamW step on the CPU:
 * the range's gradients come down, the CPU updates the master weights
 * (the cpu reference's own AdamW, cpu_adamw_update), the weights go back
 * up. docs/executor.md, "Optimizer offload". Also the two rates the
 * profiler measures for the cost model: the host's AdamW and the copies.
 */
#include "executor/cpu/cpu.h"
#include "executor/stage/stage.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The host side of one stage's offloaded optimizer. */
typedef struct stage_offload {
    size_t count;        /* floats: the optimizer's range */
    float *master;       /* fp32 weights of the range */
    float *m, *v;        /* AdamW's moments */
    float *grads;        /* the range's gradients, as they came down */
    bool master_stale;   /* the backend's params were written since */
} stage_offload;

static float *host_floats(const model_stage *stage, size_t count)
{
    size_t bytes = (count > 0 ? count : 1) * sizeof(float);
    void *memory = stage->backend->host_alloc != NULL
                       ? stage->backend->host_alloc(bytes)
                       : malloc(bytes);
    if (memory != NULL)
        memset(memory, 0, bytes);
    return memory;
}

static void host_release(const model_stage *stage, float *memory)
{
    if (memory == NULL)
        return;
    if (stage->backend->host_free != NULL)
        stage->backend->host_free(memory);
    else
        free(memory);
}

void stage_offload_close(model_stage *stage)
{
    stage_offload *o = stage->offload;
    if (o == NULL)
        return;
    host_release(stage, o->master);
    host_release(stage, o->m);
    host_release(stage, o->v);
    host_release(stage, o->grads);
    free(o);
    stage->offload = NULL;
}

int stage_offload_open(model_stage *stage, pt_error *err)
{
    stage_offload *o = calloc(1, sizeof *o);
    if (o == NULL)
        return pt_fail(err, "optimizer offload: out of memory");
    stage->offload = o;
    o->count = stage->optimizer_count;
    o->master = host_floats(stage, o->count);
    o->m = host_floats(stage, o->count);
    o->v = host_floats(stage, o->count);
    o->grads = host_floats(stage, o->count);
    o->master_stale = true;
    if (o->master == NULL || o->m == NULL || o->v == NULL ||
        o->grads == NULL) {
        stage_offload_close(stage);
        return pt_fail(err, "optimizer offload: out of host memory for 4 x "
                            "%zu floats",
                       stage->optimizer_count);
    }
    return 0;
}

void stage_offload_params_written(model_stage *stage)
{
    if (stage->offload != NULL)
        stage->offload->master_stale = true;
}

int stage_offload_copy(const model_stage *stage, stage_buffer which,
                       float *host, bool to_host, pt_error *err)
{
    stage_offload *o = stage->offload;
    float *moment = which == STAGE_ADAM_M   ? o->m
                    : which == STAGE_ADAM_V ? o->v
                                            : NULL;
    if (moment == NULL)
        return pt_fail(err, "optimizer offload: buffer %d is not a moment",
                       (int)which);
    size_t bytes = o->count * sizeof(float);
    if (to_host)
        memcpy(host, moment, bytes);
    else
        memcpy(moment, host, bytes);
    return 0;
}

/* One thread's part of the host step: floats [lo, hi) of the buffer. */
typedef struct adamw_part {
    const model_stage *stage;
    const adamw_config *config;
    float learning_rate, grad_scale;
    size_t lo, hi;
} adamw_part;

/* AdamW over the part, tensor by tensor (weight decay is per tensor), on
 * the host copies; the arithmetic of the cpu backend's step, element by
 * element, so the cut into parts changes no value. */
static void *adamw_part_main(void *argument)
{
    const adamw_part *p = argument;
    const model_stage *stage = p->stage;
    stage_offload *o = stage->offload;
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        size_t start = t->offset > p->lo ? t->offset : p->lo;
        size_t end = t->offset + t->count < p->hi ? t->offset + t->count
                                                  : p->hi;
        if (end <= start)
            continue;
        size_t at = start - stage->optimizer_first;
        cpu_adamw_update(o->master + at, o->grads + at, o->m + at, o->v + at,
                         end - start, p->config, p->learning_rate,
                         p->grad_scale, stage->optimizer_steps,
                         t->weight_decay);
    }
    return NULL;
}

/* The host's AdamW runs at about 1.5e8 parameters a second on one core
 * (GPT-2 350M on an H100 machine's host, docs/records/gpu-runs.md): a
 * large range is cut over up to OFFLOAD_THREADS cores (a thread that
 * cannot start leaves its part to this one). PARTITA_OFFLOAD_THREADS
 * (1..8) sets the count, for tests of the cut. */
#define OFFLOAD_THREADS 8
#define OFFLOAD_FLOATS_PER_THREAD (4u << 20)

/* The threads a range of `count` parameters is cut over. */
static int offload_threads(size_t count)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t wanted = count / OFFLOAD_FLOATS_PER_THREAD + 1;
    int threads = (int)(wanted < OFFLOAD_THREADS ? wanted : OFFLOAD_THREADS);
    if (cores > 0 && threads > cores)
        threads = (int)cores;
    const char *forced = getenv("PARTITA_OFFLOAD_THREADS");
    if (forced != NULL && atoi(forced) >= 1)
        threads = atoi(forced) < OFFLOAD_THREADS ? atoi(forced)
                                                 : OFFLOAD_THREADS;
    return threads;
}

/* Runs part_main on each of `threads` parts (part t at parts + t x
 * size), each on a thread of its own but the first, which runs on this
 * one (a part whose thread cannot start runs here too). */
static void run_parts(void *(*part_main)(void *), void *parts, size_t size,
                      int threads)
{
    pthread_t ids[OFFLOAD_THREADS];
    bool started[OFFLOAD_THREADS] = {false};
    char *base = parts;
    for (int t = 1; t < threads; t++)
        started[t] =
            pthread_create(&ids[t], NULL, part_main, base + t * size) == 0;
    part_main(base);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            part_main(base + t * size);
    }
}

static void host_adamw(model_stage *stage, const adamw_config *config,
                       float learning_rate, float grad_scale)
{
    size_t count = stage->offload->count;
    int threads = offload_threads(count);
    adamw_part parts[OFFLOAD_THREADS];
    size_t lo = stage->optimizer_first, share = count / (size_t)threads + 1;
    for (int t = 0; t < threads; t++) {
        size_t from = lo + (size_t)t * share, to = from + share;
        parts[t] = (adamw_part){stage, config, learning_rate, grad_scale,
                                from < lo + count ? from : lo + count,
                                to < lo + count ? to : lo + count};
    }
    run_parts(adamw_part_main, parts, sizeof parts[0], threads);
}

/* The optimizer's range of params or grads to or from the host, through
 * the backend's table (stage.c, which calls this file, checks nothing
 * here: the range is the stage's own). */
static int copy_range(model_stage *stage, stage_buffer which, float *host,
                      bool to_host, pt_error *err)
{
    if (stage->backend->copy_range == NULL)
        return pt_fail(err, "optimizer offload: the %s backend moves no "
                            "part of a buffer",
                       stage->backend->name);
    size_t count = stage->offload->count;
    return count == 0 ? 0
                      : stage->backend->copy_range(stage, which,
                                                   stage->optimizer_first,
                                                   count, host, to_host, err);
}

int stage_offload_step(model_stage *stage, const adamw_config *config,
                       float learning_rate, float grad_scale, pt_error *err)
{
    stage_offload *o = stage->offload;
    /* the master starts as the backend's weights (initialised or
     * restored there), fp32 on both sides */
    if (o->master_stale &&
        copy_range(stage, STAGE_PARAMS, o->master, true, err) != 0)
        return -1;
    o->master_stale = false;
    if (copy_range(stage, STAGE_GRADS, o->grads, true, err) != 0)
        return -1;
    host_adamw(stage, config, learning_rate, grad_scale);
    return copy_range(stage, STAGE_PARAMS, o->master, false, err);
}

/* ----------------------------------------------------- the host's rate */

/* One thread's share of the rate's flat range (one tensor, decayed). */
typedef struct rate_part {
    float *master, *grads, *m, *v;
    size_t count;
    const adamw_config *config;
} rate_part;

static void *rate_part_main(void *argument)
{
    const rate_part *p = argument;
    cpu_adamw_update(p->master, p->grads, p->m, p->v, p->count, p->config,
                     1e-6f, 1.0f, 1, true);
    return NULL;
}

/* One AdamW pass over the four arrays, cut as host_adamw cuts a range. */
static void rate_pass(float *arrays[4], size_t count,
                      const adamw_config *config)
{
    int threads = offload_threads(count);
    rate_part parts[OFFLOAD_THREADS];
    size_t share = count / (size_t)threads + 1;
    for (int t = 0; t < threads; t++) {
        size_t from = (size_t)t * share < count ? (size_t)t * share : count;
        size_t to = from + share < count ? from + share : count;
        parts[t] = (rate_part){arrays[0] + from, arrays[1] + from,
                               arrays[2] + from, arrays[3] + from,
                               to - from, config};
    }
    run_parts(rate_part_main, parts, sizeof parts[0], threads);
}

#define RATE_PASSES_MAX 15

/* The median of n pass times (sorted in place). */
static double median_pass(double *took, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && took[j] < took[j - 1]; j--) {
            double swap = took[j];
            took[j] = took[j - 1];
            took[j - 1] = swap;
        }
    return took[n / 2];
}

int stage_offload_host_rate(size_t count, int passes, double *s_per_param,
                            pt_error *err)
{
    if (count == 0 || passes < 1)
        return pt_fail(err, "host AdamW rate: %zu parameters, %d passes",
                       count, passes);
    float *arrays[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++)
        arrays[i] = malloc(count * sizeof(float));
    int status = 0;
    if (arrays[0] == NULL || arrays[1] == NULL || arrays[2] == NULL ||
        arrays[3] == NULL) {
        status = pt_fail(err, "host AdamW rate: out of host memory for "
                              "%zu parameters",
                         count);
    } else {
        /* values that are not trivial: weights and gradients of a few
         * hundredths, moments from zero, as after the first step */
        for (size_t k = 0; k < count; k++) {
            float x = (float)((k * 2654435761u) % 1000u) * 4e-5f - 0.02f;
            arrays[0][k] = x;
            arrays[1][k] = -x;
            arrays[2][k] = 0.0f;
            arrays[3][k] = 0.0f;
        }
        adamw_config config = adamw_defaults();
        rate_pass(arrays, count, &config); /* pages touched, threads made */
        double took[RATE_PASSES_MAX];
        int n = passes < RATE_PASSES_MAX ? passes : RATE_PASSES_MAX;
        for (int p = 0; p < n; p++) {
            double start = pt_monotonic_seconds();
            rate_pass(arrays, count, &config);
            took[p] = pt_monotonic_seconds() - start;
        }
        /* the median pass: a training run steps again and again */
        *s_per_param = median_pass(took, n) / (double)count;
    }
    for (int i = 0; i < 4; i++)
        free(arrays[i]);
    return status;
}

/* ------------------------------------------------- the host link's rate */

int stage_offload_copy_rate(model_stage *stage, int passes,
                            double *s_per_param, pt_error *err)
{
    /* the backend's own table, as copy_range above (stage.c calls this
     * file, not the reverse) */
    const stage_backend *backend = stage->backend;
    size_t count = stage->params_count;
    if (count == 0 || passes < 1)
        return pt_fail(err, "host copy rate: %zu parameters, %d passes",
                       count, passes);
    if (backend->copy_range == NULL)
        return pt_fail(err, "host copy rate: the %s backend moves no part "
                            "of a buffer",
                       backend->name);
    float *host = host_floats(stage, count);
    if (host == NULL)
        return pt_fail(err, "host copy rate: out of host memory for %zu "
                            "parameters",
                       count);
    /* a pass moves what an offloaded step moves per parameter: 4 bytes
     * down and 4 back up, the weights written back refreshing the
     * backend's mirror as the step's do; the values go back unchanged */
    double took[RATE_PASSES_MAX];
    int n = passes < RATE_PASSES_MAX ? passes : RATE_PASSES_MAX;
    int status = 0;
    for (int p = -1; p < n && status == 0; p++) { /* -1: the warm-up */
        double start = pt_monotonic_seconds();
        status = backend->copy_range(stage, STAGE_PARAMS, stage->params_first,
                                     count, host, true, err);
        if (status == 0)
            status = backend->copy_range(stage, STAGE_PARAMS,
                                         stage->params_first, count, host,
                                         false, err);
        if (status == 0 && backend->synchronize != NULL)
            status = backend->synchronize(stage, err);
        if (p >= 0)
            took[p] = pt_monotonic_seconds() - start;
    }
    host_release(stage, host);
    if (status != 0) {
        pt_error_prefix(err, "host copy rate");
        return -1;
    }
    *s_per_param = median_pass(took, n) / (double)count;
    return 0;
}
