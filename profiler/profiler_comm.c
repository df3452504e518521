/*
 * The communication half of `partita profile`: NCCL all-reduce,
 * reduce-scatter and all-gather over GPUs 0 .. n - 1 of this machine for
 * n = 2, 4 and 8 as far as it has them, and send/recv from GPU 0 to GPU
 * 1; one thread per GPU (as `partita exec` runs its ranks), message
 * sizes in powers of two. Built
 * only with the cuda backend and NCCL (PARTITA_HAVE_NCCL); otherwise
 * profiler_comm_available says why not. profiler/profiler.h states
 * the measurement.
 *
 * Timing: the GPUs' threads meet at a barrier, each notes its start,
 * enqueues a few operations back to back and waits for its stream; a
 * run's time is from the earlier start to the later end, over the
 * operations. Small messages take several operations per run so that
 * the barrier's wake-up skew and launch jitter average out.
 */
#include "profiler/profiler.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(PARTITA_HAVE_CUDA) && defined(PARTITA_HAVE_NCCL)

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "executor/cuda/cuda_backend.h"

/* The most GPUs measured together (PROFILER_MAX_COMM_COUNTS counts: 2,
 * 4, 8). */
#define COMM_MAX_GPUS 8
/* Bytes that one run should move at least: below it, operations are
 * repeated back to back (at most COMM_MAX_OPERATIONS of them: a 4 KiB
 * all-reduce takes about 8 us, so a run of 1024 lasts about 8 ms, and the
 * threads' wake-up skew of tens of microseconds stays under 1 %; with 32
 * it was 10-30 %, and two profiles differed by that much). */
#define COMM_RUN_BYTES (64.0 * 1024 * 1024)
#define COMM_MAX_OPERATIONS 1024
/* Timed runs per size at most: each is already an average of many
 * operations. */
#define COMM_MAX_TIMED_RUNS 50

typedef enum comm_kind {
    COMM_ALLREDUCE,
    COMM_SENDRECV,
    COMM_REDUCE_SCATTER, /* in place: each GPU keeps its half */
    COMM_ALL_GATHER      /* in place: each GPU's half gathered */
} comm_kind;

/* What a run beside products enqueues (comm_bench.beside). */
typedef enum beside_mode {
    BESIDE_OFF,         /* the collectives alone, host-timed (the curves) */
    BESIDE_PRODUCTS,    /* the products alone */
    BESIDE_COLLECTIVES, /* the collectives alone, device-timed */
    BESIDE_BOTH         /* both at once, on two streams */
} beside_mode;

/* The products beside the collectives: bf16, fp32 accumulate, square. */
#define BESIDE_PRODUCT_SIZE 4096
/* Seconds the collectives of one beside run take together; the products
 * run twice as long, so that they outlast the collectives. */
#define BESIDE_COLLECTIVES_S 0.015
#define BESIDE_PROBE_PRODUCTS 16

/* What the GPU threads of one GPU count share. */
typedef struct comm_bench {
    const profiler_options *options;
    int gpus;                    /* GPUs 0 .. gpus - 1 */
    ncclComm_t comms[COMM_MAX_GPUS];
    /* the start gate (gate_wait): 0 closed, 1 open, -1 leave at once (a
       thread could not be started; the barrier would wait for it) */
    pthread_mutex_t gate_lock;
    pthread_cond_t gate_changed;
    int gate;
    pthread_barrier_t barrier;
    size_t max_bytes;
    /* the run being timed, set by thread 0 between barriers */
    comm_kind kind;
    size_t bytes;
    int operations;
    bool stop;                   /* a thread failed: all leave */
    beside_mode beside;
    int products;                /* products of a beside run */
    double starts[COMM_MAX_GPUS];
    double ends[COMM_MAX_GPUS];
    /* a beside run's device times, seconds (0: not enqueued) */
    double products_s[COMM_MAX_GPUS];
    double collectives_s[COMM_MAX_GPUS];
    int status[COMM_MAX_GPUS];
    pt_error errors[COMM_MAX_GPUS];
} comm_bench;

typedef struct comm_thread {
    comm_bench *bench;
    int gpu;
    cudaStream_t stream;
    float *buffer;
    /* the products beside (products_open, at the first beside run) */
    cudaStream_t product_stream;
    cublasHandle_t blas;
    void *matrices;              /* A, B, C: bf16 squares */
    cudaEvent_t marks[4];        /* products' start, end; collectives' */
} comm_thread;

#define COMM_CUDA_TRY(call)                                                  \
    do {                                                                     \
        cudaError_t status_ = (call);                                        \
        if (status_ != cudaSuccess)                                          \
            return pt_fail(err, "profiler: GPU %d: %s failed: %s", gpu,      \
                           #call, cudaGetErrorString(status_));              \
    } while (0)

#define COMM_NCCL_TRY(call)                                                  \
    do {                                                                     \
        ncclResult_t status_ = (call);                                       \
        if (status_ != ncclSuccess)                                          \
            return pt_fail(err, "profiler: GPU %d: %s failed: %s", gpu,      \
                           #call, ncclGetErrorString(status_));              \
    } while (0)

/* The run's collectives on the thread's stream, not waited for. */
static int enqueue_collectives(comm_thread *t, pt_error *err)
{
    comm_bench *bench = t->bench;
    int gpu = t->gpu;
    size_t count = bench->bytes / sizeof(float);
    ncclComm_t comm = bench->comms[gpu];
    size_t part = count / (size_t)bench->gpus;
    float *mine = t->buffer + (size_t)gpu * part;
    for (int i = 0; i < bench->operations; i++) {
        if (bench->kind == COMM_ALLREDUCE)
            COMM_NCCL_TRY(ncclAllReduce(t->buffer, t->buffer, count,
                                        ncclFloat, ncclSum, comm,
                                        t->stream));
        else if (bench->kind == COMM_REDUCE_SCATTER)
            COMM_NCCL_TRY(ncclReduceScatter(t->buffer, mine, part, ncclFloat,
                                            ncclSum, comm, t->stream));
        else if (bench->kind == COMM_ALL_GATHER)
            COMM_NCCL_TRY(ncclAllGather(mine, t->buffer, part, ncclFloat,
                                        comm, t->stream));
        else if (gpu == 0) /* send/recv: GPU 0 to GPU 1, the others idle */
            COMM_NCCL_TRY(
                ncclSend(t->buffer, count, ncclFloat, 1, comm, t->stream));
        else if (gpu == 1)
            COMM_NCCL_TRY(
                ncclRecv(t->buffer, count, ncclFloat, 0, comm, t->stream));
    }
    return 0;
}

#define COMM_BLAS_TRY(call)                                                  \
    do {                                                                     \
        cublasStatus_t status_ = (call);                                     \
        if (status_ != CUBLAS_STATUS_SUCCESS)                                \
            return pt_fail(err, "profiler: GPU %d: %s failed: status %d",    \
                           gpu, #call, (int)status_);                        \
    } while (0)

/* The products' stream, cuBLAS handle, matrices (a constant non-zero
 * bit pattern: zeros would draw less power than a layer's values) and
 * events, at the thread's first beside run. */
static int products_open(comm_thread *t, pt_error *err)
{
    int gpu = t->gpu;
    size_t square = (size_t)BESIDE_PRODUCT_SIZE * BESIDE_PRODUCT_SIZE * 2;
    if (cuda_rank_stream_create(&t->product_stream, err) != 0)
        return -1;
    COMM_BLAS_TRY(cublasCreate(&t->blas));
    COMM_BLAS_TRY(cublasSetStream(t->blas, t->product_stream));
    COMM_CUDA_TRY(cudaMalloc(&t->matrices, 3 * square));
    COMM_CUDA_TRY(cudaMemset(t->matrices, 0x3c, 3 * square));
    for (int i = 0; i < 4; i++)
        COMM_CUDA_TRY(cudaEventCreate(&t->marks[i]));
    return 0;
}

static void products_close(comm_thread *t)
{
    for (int i = 0; i < 4; i++)
        if (t->marks[i] != NULL)
            cudaEventDestroy(t->marks[i]);
    if (t->blas != NULL)
        cublasDestroy(t->blas);
    if (t->matrices != NULL)
        cudaFree(t->matrices);
    if (t->product_stream != NULL)
        cudaStreamDestroy(t->product_stream);
}

static int enqueue_products(comm_thread *t, pt_error *err)
{
    int gpu = t->gpu, n = BESIDE_PRODUCT_SIZE;
    size_t square = (size_t)n * n;
    const uint16_t *a = t->matrices; /* bf16 bits */
    const uint16_t *b = a + square;
    uint16_t *c = (uint16_t *)t->matrices + 2 * square;
    float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < t->bench->products; i++)
        COMM_BLAS_TRY(cublasGemmEx(t->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n,
                                   n, &one, a, CUDA_R_16BF, n, b,
                                   CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* Seconds between two events of the thread. */
static int elapsed_s(comm_thread *t, int from, double *out, pt_error *err)
{
    int gpu = t->gpu;
    float ms = 0.0f;
    COMM_CUDA_TRY(cudaEventElapsedTime(&ms, t->marks[from],
                                       t->marks[from + 1]));
    *out = ms * 1e-3;
    return 0;
}

/* A beside run: the products, the collectives or both, each between two
 * events of its stream, then both streams waited for. */
static int enqueue_beside(comm_thread *t, pt_error *err)
{
    comm_bench *bench = t->bench;
    int gpu = t->gpu;
    bool products = bench->beside != BESIDE_COLLECTIVES;
    bool collectives = bench->beside != BESIDE_PRODUCTS;
    if (t->blas == NULL && products_open(t, err) != 0)
        return -1;
    if (products) {
        COMM_CUDA_TRY(cudaEventRecord(t->marks[0], t->product_stream));
        if (enqueue_products(t, err) != 0)
            return -1;
        COMM_CUDA_TRY(cudaEventRecord(t->marks[1], t->product_stream));
    }
    if (collectives) {
        COMM_CUDA_TRY(cudaEventRecord(t->marks[2], t->stream));
        if (enqueue_collectives(t, err) != 0)
            return -1;
        COMM_CUDA_TRY(cudaEventRecord(t->marks[3], t->stream));
    }
    COMM_CUDA_TRY(cudaStreamSynchronize(t->product_stream));
    COMM_CUDA_TRY(cudaStreamSynchronize(t->stream));
    bench->products_s[gpu] = bench->collectives_s[gpu] = 0.0;
    return (products && elapsed_s(t, 0, &bench->products_s[gpu], err) != 0) ||
                   (collectives &&
                    elapsed_s(t, 2, &bench->collectives_s[gpu], err) != 0)
               ? -1
               : 0;
}

static int enqueue(comm_thread *t, pt_error *err)
{
    if (t->bench->beside != BESIDE_OFF)
        return enqueue_beside(t, err);
    int gpu = t->gpu;
    if (enqueue_collectives(t, err) != 0)
        return -1;
    COMM_CUDA_TRY(cudaStreamSynchronize(t->stream));
    return 0;
}

static int setup_thread(comm_thread *t, pt_error *err)
{
    comm_bench *bench = t->bench;
    int gpu = t->gpu;
    if (cuda_rank_device_open(gpu, bench->options->sm_limit, 0.0, err) != 0 ||
        cuda_rank_stream_create(&t->stream, err) != 0)
        return -1;
    COMM_CUDA_TRY(cudaMalloc((void **)&t->buffer, bench->max_bytes));
    COMM_CUDA_TRY(cudaMemset(t->buffer, 0, bench->max_bytes));
    return 0;
}

/* Every thread (and the controller) waits here; true when all may go
 * on. */
static bool meet(comm_bench *bench)
{
    pthread_barrier_wait(&bench->barrier);
    bool go_on = !bench->stop;
    pthread_barrier_wait(&bench->barrier);
    return go_on;
}

/* The loop of one GPU's thread: set up, then for every run thread 0
 * has prepared (bench->operations > 0), run it; 0 operations end it. */
/* Waits until the controller opens the gate (true) or sends every
 * thread away (false: one could not be started). */
static bool gate_wait(comm_bench *bench)
{
    pthread_mutex_lock(&bench->gate_lock);
    while (bench->gate == 0)
        pthread_cond_wait(&bench->gate_changed, &bench->gate_lock);
    bool open = bench->gate > 0;
    pthread_mutex_unlock(&bench->gate_lock);
    return open;
}

static void gate_set(comm_bench *bench, int gate)
{
    pthread_mutex_lock(&bench->gate_lock);
    bench->gate = gate;
    pthread_cond_broadcast(&bench->gate_changed);
    pthread_mutex_unlock(&bench->gate_lock);
}

static void *comm_thread_main(void *argument)
{
    comm_thread *t = argument;
    comm_bench *bench = t->bench;
    int gpu = t->gpu;
    if (!gate_wait(bench))
        return NULL;
    bench->status[gpu] = setup_thread(t, &bench->errors[gpu]);
    if (bench->status[gpu] != 0)
        bench->stop = true;
    for (;;) {
        /* thread 0's controller prepares the next run meanwhile */
        if (!meet(bench) || bench->operations == 0)
            break;
        bench->starts[gpu] = pt_monotonic_seconds();
        if (enqueue(t, &bench->errors[gpu]) != 0) {
            bench->status[gpu] = -1;
            bench->stop = true;
        }
        bench->ends[gpu] = pt_monotonic_seconds();
        if (!meet(bench))
            break;
    }
    products_close(t);
    if (t->buffer != NULL)
        cudaFree(t->buffer);
    if (t->stream != NULL)
        cudaStreamDestroy(t->stream);
    cuda_rank_device_close();
    return NULL;
}

#endif /* PARTITA_HAVE_CUDA && PARTITA_HAVE_NCCL */

bool profiler_comm_available(char *reason, size_t reason_size)
{
#if defined(PARTITA_HAVE_CUDA) && defined(PARTITA_HAVE_NCCL)
    int gpus = cuda_device_count();
    if (gpus >= 2)
        return true;
    if (reason != NULL)
        snprintf(reason, reason_size,
                 "%d GPU%s visible, the curves need 2", gpus,
                 gpus == 1 ? "" : "s");
    return false;
#else
    if (reason != NULL)
        snprintf(reason, reason_size,
                 "this build has no NCCL (it needs the cuda backend and "
                 "libnccl)");
    return false;
#endif
}

#if defined(PARTITA_HAVE_CUDA) && defined(PARTITA_HAVE_NCCL)

/* -1 with the first failed thread's error, or 0 when none failed. */
static int thread_failure(const comm_bench *bench, pt_error *err)
{
    for (int gpu = 0; gpu < bench->gpus; gpu++)
        if (bench->status[gpu] != 0) {
            *err = bench->errors[gpu];
            return -1;
        }
    return 0;
}

/* Seconds per operation of every timed run of one (kind, size): the
 * controller half, on the calling thread, which drives every GPU's
 * thread through the barrier. */
static int time_size(comm_bench *bench, comm_kind kind, size_t bytes,
                     int operations, timing_summary *out, pt_error *err)
{
    const profiler_options *o = bench->options;
    double runs[COMM_MAX_TIMED_RUNS];
    int timed = o->timed_runs < COMM_MAX_TIMED_RUNS ? o->timed_runs
                                                    : COMM_MAX_TIMED_RUNS;
    for (int i = 0; i < o->warmup_runs + timed; i++) {
        bench->kind = kind;
        bench->bytes = bytes;
        bench->operations = operations;
        if (!meet(bench) || !meet(bench))
            break;
        if (i >= o->warmup_runs) {
            double start = bench->starts[0], end = bench->ends[0];
            for (int gpu = 1; gpu < bench->gpus; gpu++) {
                start = fmin(start, bench->starts[gpu]);
                end = fmax(end, bench->ends[gpu]);
            }
            runs[i - o->warmup_runs] = (end - start) / operations;
        }
    }
    if (thread_failure(bench, err) != 0)
        return -1;
    *out = timing_summarize(runs, timed);
    return 0;
}

/* One beside run of every GPU's thread (mode, products, and the kind,
 * size and operations already set); -1 with the failed thread's error. */
static int beside_run(comm_bench *bench, beside_mode mode, int products,
                      pt_error *err)
{
    bench->beside = mode;
    bench->products = products;
    bool ran = meet(bench) && meet(bench);
    bench->beside = BESIDE_OFF;
    if (ran)
        return 0;
    return thread_failure(bench, err) != 0
               ? -1
               : pt_fail(err, "profiler: a GPU's thread stopped during the "
                              "runs beside products");
}

static double largest(const double *values, int count)
{
    double most = values[0];
    for (int i = 1; i < count; i++)
        most = fmax(most, values[i]);
    return most;
}

/* compute_lost of one (kind, size), whose curve time per operation is
 * known (profiler.h): the products' step time is probed, then the
 * collectives alone, the products alone and both at once, twice (the
 * first a warm-up), on the device's clock. */
static int measure_beside(comm_bench *bench, comm_kind kind, size_t bytes,
                          double seconds_per_operation, double *lost,
                          pt_error *err)
{
    bench->kind = kind;
    bench->bytes = bytes;
    bench->operations = (int)fmin(
        COMM_MAX_OPERATIONS,
        fmax(2.0, ceil(BESIDE_COLLECTIVES_S /
                       fmax(seconds_per_operation, 1e-6))));
    double alone[COMM_MAX_GPUS], collectives[COMM_MAX_GPUS];
    if (beside_run(bench, BESIDE_PRODUCTS, BESIDE_PROBE_PRODUCTS, err) != 0)
        return -1;
    double product_s =
        largest(bench->products_s, bench->gpus) / BESIDE_PROBE_PRODUCTS;
    for (int round = 0; round < 2; round++) {
        if (beside_run(bench, BESIDE_COLLECTIVES, 0, err) != 0)
            return -1;
        memcpy(collectives, bench->collectives_s, sizeof collectives);
        int products = (int)fmin(
            1e5, ceil(2.0 * largest(collectives, bench->gpus) /
                      fmax(product_s, 1e-7)));
        if (beside_run(bench, BESIDE_PRODUCTS, products, err) != 0)
            return -1;
        memcpy(alone, bench->products_s, sizeof alone);
        if (beside_run(bench, BESIDE_BOTH, products, err) != 0)
            return -1;
    }
    double sum = 0.0;
    for (int gpu = 0; gpu < bench->gpus; gpu++)
        sum += (bench->products_s[gpu] - alone[gpu]) /
               fmax(collectives[gpu], 1e-9);
    /* a measured share is kept as at least 0.001 (0 means unmeasured) */
    *lost = fmin(10.0, fmax(1e-3, sum / bench->gpus));
    return 0;
}

/* compute_lost at PROFILER_BESIDE_SIZES inside the measured range, for
 * the all-reduce, the reduce-scatter and the all-gather. */
static int measure_beside_sizes(comm_bench *bench, profiled_comm_curves *set,
                                int sizes, pt_error *err)
{
    static const double beside_bytes[PROFILER_BESIDE_SIZES] = {
        16.0 * 1048576, 64.0 * 1048576, 256.0 * 1048576};
    for (int i = 0; i < sizes; i++)
        for (int b = 0; b < PROFILER_BESIDE_SIZES; b++) {
            if (set->allreduce[i].bytes != beside_bytes[b])
                continue;
            profiled_comm_sample *samples[3] = {&set->allreduce[i],
                                                &set->reduce_scatter[i],
                                                &set->all_gather[i]};
            comm_kind kinds[3] = {COMM_ALLREDUCE, COMM_REDUCE_SCATTER,
                                  COMM_ALL_GATHER};
            for (int k = 0; k < 3; k++)
                if (measure_beside(bench, kinds[k], (size_t)beside_bytes[b],
                                   samples[k]->time.median_s,
                                   &samples[k]->compute_lost, err) != 0)
                    return -1;
        }
    return 0;
}

static int operations_for(size_t bytes)
{
    double wanted = ceil(COMM_RUN_BYTES / (double)bytes);
    return wanted > COMM_MAX_OPERATIONS ? COMM_MAX_OPERATIONS
                                        : (int)fmax(1.0, wanted);
}

static void report_size(const profiler_options *o, int gpus, int done,
                        int total, double bytes)
{
    if (o->progress == NULL)
        return;
    char size[32], label[128];
    pt_format_bytes(bytes, size, sizeof size);
    snprintf(label, sizeof label,
             "%d GPUs: all-reduce, %sreduce-scatter, all-gather of %s", gpus,
             gpus == 2 ? "send/recv, " : "", size);
    o->progress(done, total, label, NULL, o->progress_data);
}

/* Every size's curves of the bench's GPU count into *set (send/recv at 2
 * GPUs only); the sizes and their operations into out. done counts the
 * sizes measured so far over every count, of total. */
static int measure_sizes(comm_bench *bench, double min_bytes,
                         profiled_comm_curves *set, profiler_comm_result *out,
                         int *done, int total, pt_error *err)
{
    int i = 0;
    for (double bytes = min_bytes; bytes <= (double)bench->max_bytes;
         bytes *= 2, i++) {
        int operations = operations_for((size_t)bytes);
        if (time_size(bench, COMM_ALLREDUCE, (size_t)bytes, operations,
                      &set->allreduce[i].time, err) != 0 ||
            (bench->gpus == 2 &&
             time_size(bench, COMM_SENDRECV, (size_t)bytes, operations,
                       &set->sendrecv[i].time, err) != 0) ||
            time_size(bench, COMM_REDUCE_SCATTER, (size_t)bytes, operations,
                      &set->reduce_scatter[i].time, err) != 0 ||
            time_size(bench, COMM_ALL_GATHER, (size_t)bytes, operations,
                      &set->all_gather[i].time, err) != 0)
            return -1;
        set->allreduce[i].bytes = set->sendrecv[i].bytes = bytes;
        set->reduce_scatter[i].bytes = set->all_gather[i].bytes = bytes;
        out->operations_per_run[i] = operations;
        report_size(bench->options, bench->gpus, ++*done, total, bytes);
    }
    out->sample_count = i;
    return measure_beside_sizes(bench, set, i, err);
}

static bool is_power_of_two(double value)
{
    int exponent = 0;
    return value >= 1.0 && frexp(value, &exponent) == 0.5;
}

static int check_sizes(double min_bytes, double max_bytes, pt_error *err)
{
    if (!is_power_of_two(min_bytes) || !is_power_of_two(max_bytes) ||
        min_bytes < 4.0 || max_bytes < min_bytes)
        return pt_fail(err, "profiler: message sizes %g to %g bytes: both "
                            "must be powers of two, 4 <= min <= max",
                       min_bytes, max_bytes);
    int sizes = (int)round(log2(max_bytes / min_bytes)) + 1;
    if (sizes > PROFILER_MAX_COMM_SIZES)
        return pt_fail(err, "profiler: %d message sizes, at most %d", sizes,
                       PROFILER_MAX_COMM_SIZES);
    return 0;
}

/* The curves of GPUs 0 .. gpus - 1 into *set: their communicator, a
 * thread per GPU, every size, then all torn down. */
static int measure_count(const profiler_options *options, int gpus,
                         double min_bytes, double max_bytes,
                         profiled_comm_curves *set,
                         profiler_comm_result *out, int *done, int total,
                         pt_error *err)
{
    comm_bench bench = {.options = options, .gpus = gpus,
                        .max_bytes = (size_t)max_bytes};
    int devices[COMM_MAX_GPUS] = {0};
    for (int gpu = 0; gpu < gpus; gpu++)
        devices[gpu] = gpu;
    ncclResult_t made = ncclCommInitAll(bench.comms, gpus, devices);
    if (made != ncclSuccess)
        return pt_fail(err, "profiler: ncclCommInitAll over GPUs 0 to %d "
                            "failed: %s",
                       gpus - 1, ncclGetErrorString(made));
    pthread_barrier_init(&bench.barrier, NULL, (unsigned)gpus + 1);
    pthread_mutex_init(&bench.gate_lock, NULL);
    pthread_cond_init(&bench.gate_changed, NULL);
    comm_thread threads[COMM_MAX_GPUS];
    pthread_t ids[COMM_MAX_GPUS];
    int started = 0, status = 0;
    for (; started < gpus; started++) {
        threads[started] = (comm_thread){.bench = &bench, .gpu = started};
        if (pthread_create(&ids[started], NULL, comm_thread_main,
                           &threads[started]) != 0)
            break;
    }
    /* a thread that could not start would leave the others waiting at
       the barrier for it: the gate sends those started away first */
    gate_set(&bench, started == gpus ? 1 : -1);
    if (started < gpus) {
        status = pt_fail(err, "profiler: could not start the thread of GPU "
                              "%d of %d",
                         started, gpus);
    } else {
        set->gpus = gpus;
        status = measure_sizes(&bench, min_bytes, set, out, done, total,
                               err);
        /* 0 operations: the threads leave their loop */
        bench.operations = 0;
        if (!bench.stop)
            meet(&bench);
    }
    for (int gpu = 0; gpu < started; gpu++)
        pthread_join(ids[gpu], NULL);
    pthread_cond_destroy(&bench.gate_changed);
    pthread_mutex_destroy(&bench.gate_lock);
    pthread_barrier_destroy(&bench.barrier);
    for (int gpu = 0; gpu < gpus; gpu++)
        ncclCommDestroy(bench.comms[gpu]);
    return status;
}

int profiler_measure_comm(const profiler_options *options, double min_bytes,
                          double max_bytes, profiler_comm_result *out,
                          pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (check_sizes(min_bytes, max_bytes, err) != 0 ||
        !profiler_comm_available(err->message, sizeof err->message))
        return -1;
    double started = pt_monotonic_seconds();
    int version = 0;
    ncclGetVersion(&version);
    snprintf(out->nccl_version, sizeof out->nccl_version, "%d.%d.%d",
             version / 10000, version / 100 % 100, version % 100);
    int visible = cuda_device_count(), counts = 0;
    for (int gpus = 2; gpus <= visible && gpus <= COMM_MAX_GPUS &&
                       counts < PROFILER_MAX_COMM_COUNTS;
         gpus *= 2)
        counts++;
    int sizes = (int)round(log2(max_bytes / min_bytes)) + 1, done = 0;
    int status = 0;
    for (int c = 0, gpus = 2; c < counts && status == 0; c++, gpus *= 2) {
        status = measure_count(options, gpus, min_bytes, max_bytes,
                               &out->curves[c], out, &done, counts * sizes,
                               err);
        if (status == 0)
            out->count_sets = c + 1;
    }
    out->elapsed_s = pt_monotonic_seconds() - started;
    return status;
}

#else

int profiler_measure_comm(const profiler_options *options, double min_bytes,
                          double max_bytes, profiler_comm_result *out,
                          pt_error *err)
{
    (void)options;
    (void)min_bytes;
    (void)max_bytes;
    memset(out, 0, sizeof *out);
    char reason[160];
    profiler_comm_available(reason, sizeof reason);
    return pt_fail(err, "profiler: no communication curves: %s", reason);
}

#endif
