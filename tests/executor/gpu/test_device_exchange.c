/*
 * The device exchange (executor/comm/comm.h) on ONE GPU: ranks are
 * threads of this process, each in its own slice of the SMs (plain C:
 * PASS / FAIL lines, exit 77 without a GPU). Checked:
 *   1. crossing messages: two ranks each send eight 4 MB messages to the
 *      other before receiving any, overwriting the source right after
 *      each send, then once more with comm_sendrecv: every message
 *      arrives intact and in order (a sender never waits for its
 *      receiver, so crossing sends cannot deadlock); then messages to a
 *      receiver already waiting (copied straight into its buffer),
 *      paced, the first staged: intact and in order;
 *   2. blocking collectives over three ranks: all-reduce sum and max of
 *      32 MB (exact integers; one buffer misaligned and of an odd count,
 *      so the kernels' element-wise path runs too), a reduce-scatter and
 *      an all-gather of uneven chunks (one empty), the host doubles, the
 *      barrier;
 *   3. stream-ordered collectives: 16 all-reduces chained on each rank's
 *      own stream with a kernel between them that changes the buffer,
 *      waited for once at the end (exact); a member whose stream is held
 *      20 ms and then overwrites its buffer before the all-reduce (the
 *      others must wait for it on the GPU, not read the old values);
 *      bf16 sums and maxima of three ranks; reduce-scatter then
 *      all-gather on the stream;
 *   4. pacing to emulated links of 450 GB/s and 5 us: an all-reduce of
 *      64 MB over 2 and over 4 ranks, a 1 KB all-reduce, a 64 MB message
 *      posted before its receive and one whose receiver waits first
 *      (timed from the send: the staging copy runs inside the transfer),
 *      each against the closed form comm_emulated_seconds (within a
 *      tolerance: pacing makes them at least that long, the host's
 *      meetings and the launches add a little); unpaced, the same
 *      all-reduce is faster; printed only: a 64 MB copy on a slice, and
 *      a cold message with and without its sender closing meanwhile;
 *   5. failures: a rank that aborts ends another's receive and a third's
 *      stream all-reduce, each naming it; a receive nobody answers times
 *      out after the world's 2 s and the peer's waiting all-reduce ends
 *      naming the rank that timed out, both long before any hang.
 * Times are printed as NOTE lines; the pacing checks compare a
 * measurement with the time it was paced to, the one thing the exchange
 * promises about time.
 */
#include "gpu_test.h"

#include <pthread.h>
#include <time.h>

#include "executor/parallel/parallel.h"

#define PROGRAM "test_device_exchange"
#define MAX_RANKS 4
#define MESSAGES 8
#define MESSAGE_FLOATS ((size_t)1 << 20)          /* 4 MB */
#define BIG ((size_t)8 << 20)                     /* 32 MB of floats */
#define PACED_FLOATS ((size_t)16 << 20)           /* 64 MB */
#define NVLINK_BANDWIDTH 450e9
#define NVLINK_LATENCY 5e-6

/* ------------------------------------------------------------- ranks */

typedef struct rank_run rank_run;
typedef int (*rank_body)(rank_run *r);

/* One rank of a world, on its own thread and slice of GPU 0. */
struct rank_run {
    comm_exchange *world;
    comm c;
    int rank;
    int ranks;
    int sm_limit;
    rank_body body;
    cudaStream_t stream;         /* the rank's own, in its slice */
    int status;
    pt_error err;
    bool ok;                     /* the body's data check */
    double seconds;              /* what the body timed */
    double started_s, ended_s;   /* a timed span's ends on the monotonic
                                    clock (the paced message) */
    double elapsed_s;            /* the whole body */
};

static void *rank_main(void *argument)
{
    rank_run *r = argument;
    int slices[MAX_RANKS];
    for (int i = 0; i < r->ranks; i++)
        slices[i] = r->sm_limit;
    r->status = cuda_rank_device_open_slice(0, slices, r->ranks, r->rank,
                                            0.0, &r->err);
    if (r->status == 0)
        r->status = comm_exchange_rank_open(r->world, r->rank, &r->err);
    if (r->status == 0)
        r->status = cuda_rank_stream_create(&r->stream, &r->err);
    r->c = comm_exchange_rank(r->world, r->rank);
    if (r->status == 0) {
        double start = pt_monotonic_seconds();
        r->status = r->body(r);
        r->elapsed_s = pt_monotonic_seconds() - start;
    } else {
        comm_abort(&r->c, r->err.message);
    }
    if (r->stream != NULL) {
        cudaStreamSynchronize(r->stream);
        cudaStreamDestroy(r->stream);
    }
    comm_exchange_rank_close(r->world, r->rank);
    cuda_rank_device_close();
    return NULL;
}

/* Runs body on `ranks` ranks of a fresh world (links NULL: unpaced). */
static void run_world(int ranks, int sm_limit, const link_spec *links,
                      double timeout_s, rank_body body, rank_run *runs)
{
    comm_exchange *world = NULL;
    pt_error err = {{0}};
    PT_CHECK(comm_exchange_create(ranks, links, timeout_s, &world, &err),
             &err);
    pthread_t threads[MAX_RANKS];
    for (int rank = 0; rank < ranks; rank++) {
        runs[rank] = (rank_run){.world = world, .rank = rank,
                                .ranks = ranks, .sm_limit = sm_limit,
                                .body = body};
        if (pthread_create(&threads[rank], NULL, rank_main, &runs[rank]) !=
            0) {
            printf("FAIL cannot start a thread\n");
            exit(1);
        }
    }
    for (int rank = 0; rank < ranks; rank++)
        pthread_join(threads[rank], NULL);
    comm_exchange_destroy(world);
}

/* Every link between `ranks` ranks the same. */
static link_spec *uniform_links(int ranks, double bandwidth, double latency)
{
    link_spec *links = gpu_test_host((size_t)ranks * ranks * sizeof *links);
    for (int i = 0; i < ranks * ranks; i++)
        links[i] = (link_spec){bandwidth, latency};
    return links;
}

/* Whether every rank ran its body; prints the failures. */
static bool all_ran(const rank_run *runs, int ranks)
{
    bool ok = true;
    for (int rank = 0; rank < ranks; rank++)
        if (runs[rank].status != 0) {
            printf("NOTE rank %d: %s\n", rank, runs[rank].err.message);
            ok = false;
        }
    return ok;
}

static bool all_ok(const rank_run *runs, int ranks)
{
    bool ok = all_ran(runs, ranks);
    for (int rank = 0; rank < ranks; rank++)
        ok = ok && runs[rank].ok;
    return ok;
}

/* `count` floats of value(i, rank) in device memory at `device`. */
static void fill(float *device, size_t count, float (*value)(size_t, int),
                 int rank)
{
    float *host = gpu_test_host(count * sizeof *host);
    for (size_t i = 0; i < count; i++)
        host[i] = value(i, rank);
    GPU_CHECK(cudaMemcpy(device, host, count * sizeof *host,
                         cudaMemcpyHostToDevice));
    /* from pageable memory cudaMemcpy may return before its DMA lands,
     * and the exchange reads the buffer on its own stream, not ordered
     * after the default one */
    GPU_CHECK(cudaStreamSynchronize(0));
    free(host);
}

/* Every element of a device buffer against want(i). */
static bool equals(const float *device, size_t first, size_t count,
                   float (*want)(size_t, int))
{
    float *host = gpu_test_host(count * sizeof *host);
    GPU_CHECK(cudaMemcpy(host, device + first, count * sizeof *host,
                         cudaMemcpyDeviceToHost));
    bool ok = true;
    for (size_t i = 0; i < count && ok; i++)
        ok = host[i] == want(first + i, 0);
    free(host);
    return ok;
}

/* ------------------------------------------------ 1. crossing messages */

static float message_value(size_t i, int key)
{
    return (float)(key * 1000 + (int)(i % 997));
}

static int crossing_body(rank_run *r)
{
    int peer = 1 - r->rank;
    float *source = gpu_test_device(MESSAGE_FLOATS * sizeof(float));
    float *target = gpu_test_device(MESSAGE_FLOATS * sizeof(float));
    int status = 0;
    /* key: sender * 100 + message */
    for (int k = 0; k < MESSAGES && status == 0; k++) {
        fill(source, MESSAGE_FLOATS, message_value, r->rank * 100 + k);
        status = comm_send(&r->c, peer, k, source, MESSAGE_FLOATS, &r->err);
        /* the send has taken the data: overwrite at once */
        GPU_CHECK(cudaMemset(source, 0xff, MESSAGE_FLOATS * sizeof(float)));
    }
    r->ok = true;
    float *host = gpu_test_host(MESSAGE_FLOATS * sizeof *host);
    for (int k = 0; k < MESSAGES && status == 0; k++) {
        status = comm_recv(&r->c, peer, k, target, MESSAGE_FLOATS, &r->err);
        GPU_CHECK(cudaMemcpy(host, target, MESSAGE_FLOATS * sizeof *host,
                             cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < MESSAGE_FLOATS && status == 0; i++)
            r->ok = r->ok && host[i] == message_value(i, peer * 100 + k);
    }
    /* one tick as Megatron's batched p2p: a send with its receive */
    if (status == 0) {
        fill(source, MESSAGE_FLOATS, message_value, r->rank * 100 + 99);
        status = comm_sendrecv(&r->c, peer, 50, source, MESSAGE_FLOATS, peer,
                               50, target, MESSAGE_FLOATS, &r->err);
    }
    if (status == 0) {
        GPU_CHECK(cudaMemcpy(host, target, MESSAGE_FLOATS * sizeof *host,
                             cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < MESSAGE_FLOATS; i++)
            r->ok = r->ok && host[i] == message_value(i, peer * 100 + 99);
    }
    free(host);
    cudaFree(source);
    cudaFree(target);
    return status;
}

/* Rank 1 sends rank 0 MESSAGES messages: the first before rank 0's
 * receive (staged), the others after a nap, rank 0 waiting in its
 * receive (the sender copies straight into the receiver's buffer). */
static int waiting_body(rank_run *r)
{
    float *buffer = gpu_test_device(MESSAGE_FLOATS * sizeof(float));
    float *host = gpu_test_host(MESSAGE_FLOATS * sizeof *host);
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 2000000};
    int status = 0;
    r->ok = true;
    for (int k = 0; k < MESSAGES && status == 0; k++) {
        if (r->rank == 1) {
            fill(buffer, MESSAGE_FLOATS, message_value, 100 + k);
            if (k > 0)
                nanosleep(&nap, NULL);
            status = comm_send(&r->c, 0, k, buffer, MESSAGE_FLOATS, &r->err);
            GPU_CHECK(cudaMemset(buffer, 0xff,
                                 MESSAGE_FLOATS * sizeof(float)));
            continue;
        }
        if (k == 0)
            nanosleep(&nap, NULL);
        status = comm_recv(&r->c, 1, k, buffer, MESSAGE_FLOATS, &r->err);
        GPU_CHECK(cudaMemcpy(host, buffer, MESSAGE_FLOATS * sizeof *host,
                             cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < MESSAGE_FLOATS && status == 0; i++)
            r->ok = r->ok && host[i] == message_value(i, 100 + k);
    }
    free(host);
    cudaFree(buffer);
    return status;
}

static void test_crossing(gpu_test_tally *tally)
{
    rank_run runs[2];
    run_world(2, 64, NULL, 60.0, crossing_body, runs);
    gpu_test_expect(tally, all_ok(runs, 2),
                    "crossing: 8 messages of 4 MB each way sent before any "
                    "receive, sources overwritten after each send, then a "
                    "sendrecv of 4 MB each way: all intact and in order");
    link_spec *two = uniform_links(2, NVLINK_BANDWIDTH, NVLINK_LATENCY);
    run_world(2, 64, two, 60.0, waiting_body, runs);
    gpu_test_expect(tally, all_ok(runs, 2),
                    "waiting receiver: 8 paced messages of 4 MB, the first "
                    "staged, the others sent while the receiver waits "
                    "(copied straight into its buffer), sources overwritten "
                    "after each send: all intact and in order");
    free(two);
}

/* -------------------------------------------- 2. blocking collectives */

static float reduce_value(size_t i, int rank)
{
    return (float)((i % 97) * (size_t)(rank + 1));
}

static float sum_of_three(size_t i, int unused)
{
    (void)unused;
    return (float)((i % 97) * 6);
}

static float max_of_three(size_t i, int unused)
{
    (void)unused;
    return (float)((i % 97) * 3);
}

/* The misaligned, odd-sized buffer of the element-wise path: its value at
 * index i of the buffer is reduce_value(i + 1). */
static float shifted_sum(size_t i, int unused)
{
    return sum_of_three(i + 1, unused);
}

static int blocking_body(rank_run *r)
{
    static const int group[3] = {0, 1, 2};
    float *data = gpu_test_device((BIG + 8) * sizeof(float));
    bool sum_ok = false, max_ok = false, odd_ok = false, scatter_ok = false,
         gather_ok = false, host_ok = false;
    fill(data, BIG, reduce_value, r->rank);
    int status = comm_all_reduce_sum(&r->c, group, 3, data, BIG, &r->err);
    sum_ok = status == 0 && equals(data, 0, BIG, sum_of_three);
    fill(data, BIG, reduce_value, r->rank);
    if (status == 0)
        status = comm_all_reduce_max(&r->c, group, 3, data, BIG, &r->err);
    max_ok = status == 0 && equals(data, 0, BIG, max_of_three);
    size_t odd = BIG - 3;
    fill(data, odd + 1, reduce_value, r->rank);
    if (status == 0)
        status = comm_all_reduce_sum(&r->c, group, 3, data + 1, odd,
                                     &r->err);
    odd_ok = status == 0 && equals(data + 1, 0, odd, shifted_sum);
    /* chunks of 1000003, 0 and the rest */
    size_t offsets[4] = {0, 1000003, 1000003, BIG};
    fill(data, BIG, reduce_value, r->rank);
    if (status == 0)
        status = comm_reduce_scatter_sum(&r->c, group, 3, data, offsets,
                                         &r->err);
    scatter_ok = status == 0 &&
                 equals(data, offsets[r->rank],
                        offsets[r->rank + 1] - offsets[r->rank],
                        sum_of_three);
    if (status == 0)
        status = comm_all_gather(&r->c, group, 3, data, offsets, &r->err);
    gather_ok = status == 0 && equals(data, 0, BIG, sum_of_three);
    double values[2] = {r->rank + 0.5, 1e-3 * r->rank};
    if (status == 0)
        status = comm_all_reduce_host(&r->c, group, 3, values, 2, &r->err);
    host_ok = status == 0 && values[0] == 4.5 && values[1] == 1e-3 + 2e-3;
    if (status == 0)
        status = comm_barrier(&r->c, &r->err);
    cudaFree(data);
    r->ok = sum_ok && max_ok && odd_ok && scatter_ok && gather_ok &&
            host_ok;
    if (!r->ok)
        printf("NOTE rank %d: sum %d max %d odd %d scatter %d gather %d "
               "host %d\n",
               r->rank, sum_ok, max_ok, odd_ok, scatter_ok, gather_ok,
               host_ok);
    return status;
}

static void test_blocking(gpu_test_tally *tally)
{
    rank_run runs[3];
    run_world(3, 32, NULL, 60.0, blocking_body, runs);
    gpu_test_expect(tally, all_ok(runs, 3),
                    "blocking collectives over 3 ranks: all-reduce sum and "
                    "max of 32 MB exact (and of an odd, misaligned "
                    "buffer), reduce-scatter and all-gather of uneven "
                    "chunks, host doubles, barrier");
}

/* --------------------------------------- 3. stream-ordered collectives */

static float rank_plus_one(size_t i, int rank)
{
    (void)i;
    return (float)(rank + 1);
}

/* 16 rounds of x = all-reduce(x); x += (rank + 1), all enqueued, then the
 * final all-reduce, waited for once. */
static int chain_body(rank_run *r)
{
    static const int group[2] = {0, 1};
    size_t count = MESSAGE_FLOATS;
    float *x = gpu_test_device(count * sizeof(float));
    float *y = gpu_test_device(count * sizeof(float));
    fill(x, count, rank_plus_one, r->rank);
    fill(y, count, rank_plus_one, r->rank);
    int status = 0;
    for (int k = 0; k < 16 && status == 0; k++) {
        status = comm_all_reduce_on_stream(&r->c, group, 2, x, count,
                                           COMM_FLOAT32, COMM_SUM, r->stream,
                                           &r->err);
        GPU_CHECK(cuda_add_inplace(x, y, count, r->stream));
    }
    if (status == 0)
        status = comm_all_reduce_on_stream(&r->c, group, 2, x, count,
                                           COMM_FLOAT32, COMM_SUM, r->stream,
                                           &r->err);
    if (status == 0)
        status = comm_wait_stream(&r->c, r->stream, "the chain", &r->err);
    double s = 3.0;
    for (int k = 0; k < 16; k++)
        s = 2.0 * s + 3.0;
    float *host = gpu_test_host(count * sizeof *host);
    GPU_CHECK(cudaMemcpy(host, x, count * sizeof *host,
                         cudaMemcpyDeviceToHost));
    r->ok = status == 0;
    for (size_t i = 0; i < count && r->ok; i++)
        r->ok = host[i] == (float)s;
    if (!r->ok && status == 0)
        printf("NOTE rank %d: chain ends at %g, expected %g\n", r->rank,
               host[0], s);
    free(host);
    cudaFree(x);
    cudaFree(y);
    return status;
}

/* Rank 1's stream is held 20 ms, then overwrites its buffer (100 -> 2)
 * from pinned memory, then joins the all-reduce; rank 0 (buffer of 1)
 * enqueues the all-reduce at once. 3 everywhere: rank 0's GPU waited. */
static int late_member_body(rank_run *r)
{
    static const int group[2] = {0, 1};
    size_t count = MESSAGE_FLOATS;
    float *x = gpu_test_device(count * sizeof(float));
    float *pinned = NULL;
    uint64_t *stamp = NULL;
    GPU_CHECK(cudaMallocHost((void **)&pinned, count * sizeof *pinned));
    GPU_CHECK(cudaMalloc((void **)&stamp, sizeof *stamp));
    for (size_t i = 0; i < count; i++)
        pinned[i] = r->rank == 0 ? 1.0f : 100.0f;
    GPU_CHECK(cudaMemcpy(x, pinned, count * sizeof *x,
                         cudaMemcpyHostToDevice));
    if (r->rank == 1) {
        for (size_t i = 0; i < count; i++)
            pinned[i] = 2.0f;
        GPU_CHECK(cuda_exchange_stamp(stamp, r->stream));
        GPU_CHECK(cuda_exchange_pace(stamp, 20000000, r->stream));
        GPU_CHECK(cudaMemcpyAsync(x, pinned, count * sizeof *x,
                                  cudaMemcpyHostToDevice, r->stream));
    }
    int status = comm_all_reduce_on_stream(&r->c, group, 2, x, count,
                                           COMM_FLOAT32, COMM_SUM, r->stream,
                                           &r->err);
    if (status == 0)
        status = comm_wait_stream(&r->c, r->stream, "the late member",
                                  &r->err);
    GPU_CHECK(cudaMemcpy(pinned, x, count * sizeof *x,
                         cudaMemcpyDeviceToHost));
    r->ok = status == 0;
    for (size_t i = 0; i < count && r->ok; i++)
        r->ok = pinned[i] == 3.0f;
    cudaFreeHost(pinned);
    cudaFree(stamp);
    cudaFree(x);
    return status;
}

static float small_integer(size_t i, int rank)
{
    return (float)((int)(i % 13) - 6 + rank);
}

static float small_sum(size_t i, int unused)
{
    (void)unused;
    return (float)(3 * ((int)(i % 13) - 6) + 3);
}

static float small_max(size_t i, int unused)
{
    (void)unused;
    return (float)((int)(i % 13) - 6 + 2);
}

/* bf16 sums and maxima of three ranks (small integers: exact in bf16),
 * then a reduce-scatter and an all-gather on the stream, of fp32 and of
 * bf16 (sequence parallelism's; chunks at odd offsets). */
static int stream_kinds_body(rank_run *r)
{
    static const int group[3] = {0, 1, 2};
    size_t count = MESSAGE_FLOATS + 5;
    float *values = gpu_test_host(count * sizeof *values);
    for (size_t i = 0; i < count; i++)
        values[i] = small_integer(i, r->rank);
    pt_bf16 *sum = gpu_test_upload_bf16(values, count);
    pt_bf16 *max = gpu_test_upload_bf16(values, count);
    pt_bf16 *rows = gpu_test_upload_bf16(values, count);
    size_t row_offsets[4] = {0, 7, count / 2, count};
    float *data = gpu_test_device(BIG * sizeof(float));
    fill(data, BIG, reduce_value, r->rank);
    size_t offsets[4] = {0, 12345, BIG / 2, BIG};
    int status = comm_all_reduce_on_stream(&r->c, group, 3, sum, count,
                                           COMM_BFLOAT16, COMM_SUM,
                                           r->stream, &r->err);
    if (status == 0)
        status = comm_all_reduce_on_stream(&r->c, group, 3, max, count,
                                           COMM_BFLOAT16, COMM_MAX,
                                           r->stream, &r->err);
    if (status == 0)
        status = comm_reduce_scatter_on_stream(&r->c, group, 3, data,
                                               offsets, COMM_FLOAT32,
                                               r->stream, &r->err);
    if (status == 0)
        status = comm_all_gather_on_stream(&r->c, group, 3, data, offsets,
                                           COMM_FLOAT32, r->stream, &r->err);
    if (status == 0)
        status = comm_reduce_scatter_on_stream(&r->c, group, 3, rows,
                                               row_offsets, COMM_BFLOAT16,
                                               r->stream, &r->err);
    if (status == 0)
        status = comm_all_gather_on_stream(&r->c, group, 3, rows,
                                           row_offsets, COMM_BFLOAT16,
                                           r->stream, &r->err);
    if (status == 0)
        status = comm_wait_stream(&r->c, r->stream, "bf16", &r->err);
    float *got = gpu_test_host(count * sizeof *got);
    bool sum_ok = status == 0, max_ok = status == 0, rows_ok = status == 0;
    if (status == 0) {
        gpu_test_download_bf16(got, sum, count);
        for (size_t i = 0; i < count && sum_ok; i++)
            sum_ok = got[i] == small_sum(i, 0);
        gpu_test_download_bf16(got, max, count);
        for (size_t i = 0; i < count && max_ok; i++)
            max_ok = got[i] == small_max(i, 0);
        gpu_test_download_bf16(got, rows, count);
        for (size_t i = 0; i < count && rows_ok; i++)
            rows_ok = got[i] == small_sum(i, 0);
    }
    bool chunks_ok = status == 0 && equals(data, 0, BIG, sum_of_three);
    r->ok = sum_ok && max_ok && chunks_ok && rows_ok;
    if (!r->ok)
        printf("NOTE rank %d: bf16 sum %d, bf16 max %d, reduce-scatter + "
               "all-gather %d, of bf16 %d\n",
               r->rank, sum_ok, max_ok, chunks_ok, rows_ok);
    free(got);
    free(values);
    cudaFree(sum);
    cudaFree(max);
    cudaFree(rows);
    cudaFree(data);
    return status;
}

static void test_stream_ordered(gpu_test_tally *tally)
{
    rank_run runs[3];
    run_world(2, 64, NULL, 60.0, chain_body, runs);
    gpu_test_expect(tally, all_ok(runs, 2),
                    "stream-ordered: 17 all-reduces chained on each rank's "
                    "stream with a kernel between them, one wait at the "
                    "end: exact");
    run_world(2, 64, NULL, 60.0, late_member_body, runs);
    gpu_test_expect(tally, all_ok(runs, 2),
                    "stream-ordered: a member held 20 ms on its GPU and "
                    "then overwriting its buffer is waited for (the sum "
                    "uses its new values)");
    run_world(3, 32, NULL, 60.0, stream_kinds_body, runs);
    gpu_test_expect(tally, all_ok(runs, 3),
                    "stream-ordered over 3 ranks: bf16 sum and max exact, "
                    "reduce-scatter then all-gather give the sum (fp32, "
                    "and bf16 in uneven chunks)");
}

/* ------------------------------------------------------------ 4. pacing */

/* What a pacing body measures, set before the world runs. */
static size_t paced_count;
static int paced_repeats;

static int paced_all_reduce_body(rank_run *r)
{
    int group[MAX_RANKS];
    for (int i = 0; i < r->ranks; i++)
        group[i] = i;
    float *x = gpu_test_device(paced_count * sizeof(float));
    GPU_CHECK(cudaMemset(x, 0, paced_count * sizeof(float)));
    cudaEvent_t start, end;
    GPU_CHECK(cudaEventCreate(&start));
    GPU_CHECK(cudaEventCreate(&end));
    /* one untimed, then the timed run from a common moment */
    int status = comm_all_reduce_on_stream(&r->c, group, r->ranks, x,
                                           paced_count, COMM_FLOAT32,
                                           COMM_SUM, r->stream, &r->err);
    if (status == 0)
        status = comm_wait_stream(&r->c, r->stream, "warm-up", &r->err);
    if (status == 0)
        status = comm_barrier(&r->c, &r->err);
    GPU_CHECK(cudaEventRecord(start, r->stream));
    for (int k = 0; k < paced_repeats && status == 0; k++)
        status = comm_all_reduce_on_stream(&r->c, group, r->ranks, x,
                                           paced_count, COMM_FLOAT32,
                                           COMM_SUM, r->stream, &r->err);
    GPU_CHECK(cudaEventRecord(end, r->stream));
    if (status == 0)
        status = comm_wait_stream(&r->c, r->stream, "timed", &r->err);
    float ms = 0.0f;
    /* a failed comm leaves the stream unfinished: no time to read */
    if (status == 0) {
        GPU_CHECK(cudaEventSynchronize(end));
        GPU_CHECK(cudaEventElapsedTime(&ms, start, end));
    }
    r->seconds = ms * 1e-3 / paced_repeats;
    r->ok = true;
    cudaEventDestroy(start);
    cudaEventDestroy(end);
    cudaFree(x);
    return status;
}

/* How the paced message runs, set before the world runs. */
typedef struct message_pacing {
    bool warm;            /* an untimed message first (the staging buffer
                             made, the streams and kernels used) */
    bool receiver_first;  /* the receiver waits in its receive before the
                             send starts (timed from the send); else the
                             message is posted before the receive is
                             called (timed from the receive) */
    bool hold;            /* both meet again after the receive, before
                             either frees memory or closes */
} message_pacing;
static message_pacing paced_message;

/* Rank 1 sends paced_count floats to rank 0: started_s (the sender's or
 * the receiver's, as above) and the receiver's ended_s are the span. */
static int paced_message_body(rank_run *r)
{
    float *x = gpu_test_device(paced_count * sizeof(float));
    GPU_CHECK(cudaDeviceSynchronize()); /* x is set before any copy */
    int status = 0;
    r->ok = true;
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 2000000};
    for (int round = paced_message.warm ? 0 : 1; round < 2 && status == 0;
         round++) {
        bool first = paced_message.receiver_first;
        if (r->rank == 1 && !first)
            status = comm_send(&r->c, 0, round, x, paced_count, &r->err);
        if (status == 0)
            status = comm_barrier(&r->c, &r->err);
        if (status == 0 && r->rank == 1 && first) {
            nanosleep(&nap, NULL); /* the receiver is waiting by then */
            r->started_s = pt_monotonic_seconds();
            status = comm_send(&r->c, 0, round, x, paced_count, &r->err);
        }
        if (status == 0 && r->rank == 0) {
            r->started_s = pt_monotonic_seconds();
            status = comm_recv(&r->c, 1, round, x, paced_count, &r->err);
            r->ended_s = pt_monotonic_seconds();
        }
    }
    if (status == 0 && paced_message.hold)
        status = comm_barrier(&r->c, &r->err);
    cudaFree(x);
    return status;
}

/* One paced 64 MB message as `how` says: its span, or -1 when it failed. */
static double paced_message_span(message_pacing how, const link_spec *links,
                                 rank_run *runs)
{
    paced_count = PACED_FLOATS;
    paced_message = how;
    run_world(2, 64, links, 60.0, paced_message_body, runs);
    if (!all_ran(runs, 2))
        return -1.0;
    double start = how.receiver_first ? runs[1].started_s
                                      : runs[0].started_s;
    return runs[0].ended_s - start;
}

/* What a 64 MB copy takes on a rank's 64-SM slice (printed, not checked):
 * cudaMemcpyAsync, then the exchange's kernel as a copy, 5 of each. */
static int slice_copy_body(rank_run *r)
{
    r->ok = true;
    if (r->rank != 0)
        return 0;
    size_t bytes = PACED_FLOATS * sizeof(float);
    float *a = gpu_test_device(bytes), *b = gpu_test_device(bytes);
    GPU_CHECK(cudaDeviceSynchronize());
    cuda_exchange_step copy = {.inputs = {a}, .outputs = {b},
                               .input_count = 1, .output_count = 1,
                               .count = PACED_FLOATS};
    cudaEvent_t start, end;
    GPU_CHECK(cudaEventCreate(&start));
    GPU_CHECK(cudaEventCreate(&end));
    for (int kernel = 0; kernel < 2; kernel++) {
        float ms = 0.0f;
        for (int k = 0; k < 6; k++) {
            GPU_CHECK(cudaEventRecord(start, r->stream));
            GPU_CHECK(kernel ? cuda_exchange_reduce(&copy, r->stream)
                             : cudaMemcpyAsync(b, a, bytes,
                                               cudaMemcpyDeviceToDevice,
                                               r->stream));
            GPU_CHECK(cudaEventRecord(end, r->stream));
            GPU_CHECK(cudaEventSynchronize(end));
            float one = 0.0f;
            GPU_CHECK(cudaEventElapsedTime(&one, start, end));
            ms += k > 0 ? one : 0.0f; /* the first warms up */
        }
        printf("NOTE a 64 MB copy on a 64-SM slice by %s: %.1f us\n",
               kernel ? "the exchange's kernel" : "cudaMemcpyAsync",
               ms * 1e3 / 5);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(end);
    cudaFree(a);
    cudaFree(b);
    return 0;
}

/* Measured against emulated: at least `low` times it, at most `high`
 * times it plus `slack_s`. */
static void check_paced(gpu_test_tally *tally, const char *what,
                        double measured, double emulated, double low,
                        double high, double slack_s)
{
    char line[300];
    bool ok = measured >= low * emulated &&
              measured <= high * emulated + slack_s;
    snprintf(line, sizeof line,
             "pacing: %s took %.1f us, the emulated link %.1f us (ratio "
             "%.3f; allowed %.2f to %.2f, + %.0f us)",
             what, measured * 1e6, emulated * 1e6, measured / emulated, low,
             high, slack_s * 1e6);
    gpu_test_expect(tally, ok, line);
}

static double paced_all_reduce(int ranks, size_t count, int repeats,
                               const link_spec *links, rank_run *runs)
{
    paced_count = count;
    paced_repeats = repeats;
    run_world(ranks, 128 / ranks, links, 60.0, paced_all_reduce_body, runs);
    if (!all_ran(runs, ranks))
        return -1.0;
    double worst = 0.0;
    for (int rank = 0; rank < ranks; rank++)
        worst = runs[rank].seconds > worst ? runs[rank].seconds : worst;
    return worst;
}

/* A 64 MB message: first, as printed notes, the first message of a fresh
 * world with the sender freeing its memory and closing while the receive
 * runs (a host thread's cudaFree and close hold the driver, which the
 * receiver's host calls then wait for), and without that; then checked,
 * warm and with both ranks holding on: the message posted before the
 * receive (timed on the receiver's host), and the receiver waiting first
 * (timed from the send's call to the receive's return: the sender's
 * staging copy runs inside the emulated transfer). */
static void test_paced_messages(gpu_test_tally *tally, const link_spec *two)
{
    rank_run runs[MAX_RANKS];
    link_spec nvlink = two[0];
    double bytes = (double)PACED_FLOATS * sizeof(float);
    double emulated =
        comm_emulated_seconds(COMM_PATTERN_MESSAGE, bytes, 2, nvlink);
    run_world(2, 64, NULL, 60.0, slice_copy_body, runs);
    const struct {
        message_pacing how;
        const char *what;
        bool checked;
    } cases[] = {
        {{false, false, false},
         "a 64 MB message, cold, the sender closing (receive, on the host)",
         false},
        {{false, false, true}, "a 64 MB message, cold (receive, on the host)",
         false},
        {{true, false, true}, "a 64 MB message (receive, on the host)", true},
        {{true, true, true},
         "a 64 MB message, the receiver waiting (send to receive, on the "
         "host)",
         true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double span = paced_message_span(cases[i].how, two, runs);
        if (span < 0.0)
            gpu_test_expect(tally, false, "pacing: the paced message ran");
        else if (cases[i].checked)
            check_paced(tally, cases[i].what, span, emulated, 0.98, 1.2,
                        50e-6);
        else
            printf("NOTE pacing: %s took %.1f us, the emulated link %.1f "
                   "us\n",
                   cases[i].what, span * 1e6, emulated * 1e6);
    }
}

static void test_pacing(gpu_test_tally *tally)
{
    rank_run runs[MAX_RANKS];
    link_spec nvlink = {NVLINK_BANDWIDTH, NVLINK_LATENCY};
    link_spec *two = uniform_links(2, NVLINK_BANDWIDTH, NVLINK_LATENCY);
    link_spec *four = uniform_links(4, NVLINK_BANDWIDTH, NVLINK_LATENCY);
    double bytes = (double)PACED_FLOATS * sizeof(float);
    double measured = paced_all_reduce(2, PACED_FLOATS, 20, two, runs);
    double emulated = comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, bytes,
                                            2, nvlink);
    check_paced(tally, "all-reduce of 64 MB over 2 ranks", measured,
                emulated, 0.98, 1.12, 0.0);
    double unpaced = paced_all_reduce(2, PACED_FLOATS, 20, NULL, runs);
    printf("NOTE unpaced all-reduce of 64 MB over 2 slices: %.1f us (%.0f "
           "GB/s of buffer)\n",
           unpaced * 1e6, bytes / unpaced / 1e9);
    gpu_test_expect(tally, unpaced > 0.0 && unpaced < measured,
                    "pacing: unpaced, the same all-reduce is faster");
    measured = paced_all_reduce(4, PACED_FLOATS, 20, four, runs);
    emulated = comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, bytes, 4,
                                     nvlink);
    check_paced(tally, "all-reduce of 64 MB over 4 ranks", measured,
                emulated, 0.98, 1.12, 0.0);
    measured = paced_all_reduce(2, 256, 200, two, runs);
    emulated = comm_emulated_seconds(COMM_PATTERN_ALL_REDUCE, 1024.0, 2,
                                     nvlink);
    check_paced(tally, "all-reduce of 1 KB over 2 ranks", measured,
                emulated, 0.98, 1.0, 40e-6);
    test_paced_messages(tally, two);
    free(two);
    free(four);
}

/* ----------------------------------------------------------- 5. failures */

static int abort_body(rank_run *r)
{
    static const int everyone[3] = {0, 1, 2};
    float *x = gpu_test_device(1024 * sizeof(float));
    int status = 0;
    if (r->rank == 2) {
        struct timespec pause = {.tv_sec = 0, .tv_nsec = 200000000};
        nanosleep(&pause, NULL);
        comm_abort(&r->c, "rank 2 gave up on purpose");
        status = -1;
        pt_fail(&r->err, "aborted");
    } else if (r->rank == 0) {
        status = comm_recv(&r->c, 2, 4, x, 1024, &r->err);
    } else {
        status = comm_all_reduce_on_stream(&r->c, everyone, 3, x, 1024,
                                           COMM_FLOAT32, COMM_SUM, r->stream,
                                           &r->err);
    }
    cudaFree(x);
    return status;
}

/* Rank 0 waits for a message rank 1 never sends; rank 1 joins an
 * all-reduce rank 0 never joins, half a second later, so that rank 0's
 * deadline comes first. */
static int silent_peer_body(rank_run *r)
{
    static const int pair[2] = {0, 1};
    float *x = gpu_test_device(1024 * sizeof(float));
    if (r->rank == 1) {
        struct timespec pause = {.tv_sec = 0, .tv_nsec = 500000000};
        nanosleep(&pause, NULL);
    }
    int status =
        r->rank == 0
            ? comm_recv(&r->c, 1, 9, x, 1024, &r->err)
            : comm_all_reduce_on_stream(&r->c, pair, 2, x, 1024,
                                        COMM_FLOAT32, COMM_SUM, r->stream,
                                        &r->err);
    cudaFree(x);
    return status;
}

static void test_failures(gpu_test_tally *tally)
{
    rank_run runs[3];
    run_world(3, 32, NULL, 60.0, abort_body, runs);
    printf("NOTE rank 0: %s\nNOTE rank 1: %s\n", runs[0].err.message,
           runs[1].err.message);
    bool named = runs[0].status != 0 && runs[1].status != 0 &&
                 strstr(runs[0].err.message, "rank 2 failed") != NULL &&
                 strstr(runs[1].err.message, "rank 2 failed") != NULL &&
                 runs[0].elapsed_s < 10.0 && runs[1].elapsed_s < 10.0;
    gpu_test_expect(tally, named,
                    "failures: a rank's abort ends another's receive and a "
                    "third's stream all-reduce within seconds, naming it");
    run_world(2, 64, NULL, 2.0, silent_peer_body, runs);
    printf("NOTE rank 0: %s (%.1f s)\nNOTE rank 1: %s (%.1f s)\n",
           runs[0].err.message, runs[0].elapsed_s, runs[1].err.message,
           runs[1].elapsed_s);
    bool timed_out =
        runs[0].status != 0 && runs[1].status != 0 &&
        strstr(runs[0].err.message, "timed out after 2 s") != NULL &&
        strstr(runs[0].err.message, "receive from rank 1") != NULL &&
        strstr(runs[1].err.message, "rank 0 failed") != NULL &&
        runs[0].elapsed_s < 6.0 && runs[1].elapsed_s < 6.0;
    gpu_test_expect(tally, timed_out,
                    "failures: a receive nobody answers times out after the "
                    "world's 2 s naming the peer, and the peer's all-reduce "
                    "ends naming the rank that timed out");
}

int main(void)
{
    gpu_test_require_device(PROGRAM);
    gpu_test_tally tally = {0, 0};
    test_crossing(&tally);
    test_blocking(&tally);
    test_stream_ordered(&tally);
    test_pacing(&tally);
    test_failures(&tally);
    return gpu_test_finish(&tally, PROGRAM);
}
