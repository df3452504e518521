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

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
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

/* What the GPU threads of one GPU count share. */
typedef struct comm_bench {
    const profiler_options *options;
    int gpus;                    /* GPUs 0 .. gpus - 1 */
    ncclComm_t comms[COMM_MAX_GPUS];
    pthread_barrier_t barrier;
    size_t max_bytes;
    /* the run being timed, set by thread 0 between barriers */
    comm_kind kind;
    size_t bytes;
    int operations;
    bool stop;                   /* a thread failed: all leave */
    double starts[COMM_MAX_GPUS];
    double ends[COMM_MAX_GPUS];
    int status[COMM_MAX_GPUS];
    pt_error errors[COMM_MAX_GPUS];
} comm_bench;

typedef struct comm_thread {
    comm_bench *bench;
    int gpu;
    cudaStream_t stream;
    float *buffer;
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

static int enqueue(comm_thread *t, pt_error *err)
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
static void *comm_thread_main(void *argument)
{
    comm_thread *t = argument;
    comm_bench *bench = t->bench;
    int gpu = t->gpu;
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
    for (int gpu = 0; gpu < bench->gpus; gpu++)
        if (bench->status[gpu] != 0) {
            *err = bench->errors[gpu];
            return -1;
        }
    *out = timing_summarize(runs, timed);
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
    return 0;
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
    comm_thread threads[COMM_MAX_GPUS];
    pthread_t ids[COMM_MAX_GPUS];
    for (int gpu = 0; gpu < gpus; gpu++) {
        threads[gpu] = (comm_thread){.bench = &bench, .gpu = gpu};
        pthread_create(&ids[gpu], NULL, comm_thread_main, &threads[gpu]);
    }
    set->gpus = gpus;
    int status = measure_sizes(&bench, min_bytes, set, out, done, total,
                               err);
    /* 0 operations: the threads leave their loop */
    bench.operations = 0;
    if (!bench.stop)
        meet(&bench);
    for (int gpu = 0; gpu < gpus; gpu++)
        pthread_join(ids[gpu], NULL);
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
