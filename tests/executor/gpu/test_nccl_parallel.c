/*
 * The NCCL comm and the GPU launcher on two GPUs, some checks on four
 * when there are (plain C: the GPU machines have no cmocka; PASS / FAIL
 * lines, exit 77 with fewer than two GPUs). Checked:
 *   - crossing sends: both ranks send 4 MB to each other at once, eight
 *     times, each send made with its receive (comm_sendrecv, as the
 *     pipeline step makes them), the source written with a plain
 *     cudaMemcpy right before (the comm's streams must wait for it) and
 *     overwritten with cudaMemset right after (the staging copy must have
 *     taken it), and every message arrives intact and in order;
 *   - all-reduce sum and max on device floats, the host doubles, barrier;
 *   - a silent peer: rank 0 waits for a message rank 1 never sends; with
 *     a 3 s timeout rank 0 fails naming the peer and the operation, rank 1
 *     (in a barrier it enters 1.5 s late) returns naming rank 0, both
 *     well before any hang, and both aborted their communicators;
 *   - green contexts: a rank opened with sm_limit 40 gets 40 SMs (rounded
 *     up to the device's granularity at most to 48) and streams in them;
 *     an sm_limit above the device's SMs is refused with the numbers;
 *   - the GPU launcher: a pp = 2 pipeline whose rank 1 fails after its
 *     first forward ends every rank with a message naming rank 1, each
 *     rank's communicators aborted, long before the comm timeout;
 *   - every schedule over NCCL: GPipe, 1F1B and the interleaved 1F1B on
 *     pp = 2 (pp = 4 with four GPUs) run two steps each, with the same
 *     losses (the schedules differ in order only; GPipe hung until the
 *     comm timeout on 2026-11-28, issue 38).
 * Times are printed (NOTE lines), never compared with a measurement of
 * speed; the timeout checks only say the failure did not wait for it.
 */
#include "gpu_test.h"

#include <math.h>
#include <pthread.h>
#include <time.h>

#include "executor/parallel/parallel.h"

#define PROGRAM "test_nccl_parallel"
#define MESSAGES 8
#define MESSAGE_FLOATS ((size_t)1 << 20)
#define SILENT_TIMEOUT_S 3.0
#define PIPELINE_TIMEOUT_S 120.0

/* One rank of a two-rank world, on its own thread and GPU. */
typedef struct rank_run {
    comm_nccl *world;
    int rank;
    int (*body)(struct rank_run *r);
    int status;
    pt_error err;
    double seconds;
    bool data_ok;
} rank_run;

static void *rank_main(void *argument)
{
    rank_run *r = argument;
    double start = pt_monotonic_seconds();
    if (cuda_rank_device_open(r->rank, 0, 0.0, &r->err) != 0 ||
        comm_nccl_rank_open(r->world, r->rank, &r->err) != 0) {
        r->status = -1;
        comm c = comm_nccl_rank(r->world, r->rank);
        comm_abort(&c, r->err.message);
    } else {
        r->status = r->body(r);
    }
    r->seconds = pt_monotonic_seconds() - start;
    comm_nccl_rank_close(r->world, r->rank);
    cuda_rank_device_close();
    return NULL;
}

/* Runs body on ranks 0 and 1 of a fresh world; NULL when the world could
 * not be made (reported). */
static comm_nccl *run_pair(int (*body)(rank_run *), double timeout_s,
                           rank_run runs[2], gpu_test_tally *tally)
{
    static const int devices[] = {0, 1};
    comm_nccl *world = NULL;
    pt_error err = {{0}};
    if (comm_nccl_create(2, devices, NULL, timeout_s, &world, &err) != 0) {
        gpu_test_expect(tally, false, err.message);
        return NULL;
    }
    pthread_t threads[2];
    for (int rank = 0; rank < 2; rank++) {
        runs[rank] = (rank_run){.world = world, .rank = rank, .body = body};
        if (pthread_create(&threads[rank], NULL, rank_main, &runs[rank]) !=
            0) {
            printf("FAIL cannot start a thread\n");
            exit(1);
        }
    }
    for (int rank = 0; rank < 2; rank++)
        pthread_join(threads[rank], NULL);
    return world;
}

/* ------------------------------------------------------------- messages */

static float message_value(int sender, int index)
{
    return (float)(sender * 100 + index);
}

/* Crossing messages as the pipeline makes them: each tick, a send and a
 * receive in one NCCL group (comm_sendrecv). Sent alone, a send to a peer
 * that is itself sending waits for NCCL's lazy connection, which needs
 * the peer's receive: the test that did so deadlocked until the timeout
 * (docs/records/gpu-runs.md, 2026-11-22). */
static int crossing_body(rank_run *r)
{
    comm c = comm_nccl_rank(r->world, r->rank);
    int peer = 1 - r->rank;
    float *host = gpu_test_host(MESSAGE_FLOATS * sizeof *host);
    float *source = NULL, *target = NULL;
    GPU_CHECK(cudaMalloc((void **)&source, MESSAGE_FLOATS * sizeof(float)));
    GPU_CHECK(cudaMalloc((void **)&target, MESSAGE_FLOATS * sizeof(float)));
    int status = 0;
    r->data_ok = true;
    for (int k = 0; k < MESSAGES && status == 0; k++) {
        for (size_t i = 0; i < MESSAGE_FLOATS; i++)
            host[i] = message_value(r->rank, k);
        GPU_CHECK(cudaMemcpy(source, host, MESSAGE_FLOATS * sizeof(float),
                             cudaMemcpyHostToDevice));
        status = comm_sendrecv(&c, peer, k, source, MESSAGE_FLOATS, peer, k,
                               target, MESSAGE_FLOATS, &r->err);
        /* the send has taken the data: overwrite at once */
        GPU_CHECK(cudaMemset(source, 0xff, MESSAGE_FLOATS * sizeof(float)));
        if (status != 0)
            break;
        GPU_CHECK(cudaMemcpy(host, target, MESSAGE_FLOATS * sizeof(float),
                             cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < MESSAGE_FLOATS; i++)
            r->data_ok = r->data_ok && host[i] == message_value(peer, k);
    }
    cudaFree(source);
    cudaFree(target);
    free(host);
    return status;
}

static void test_crossing_sends(gpu_test_tally *tally)
{
    rank_run runs[2];
    comm_nccl *world = run_pair(crossing_body, 60.0, runs, tally);
    if (world == NULL)
        return;
    for (int rank = 0; rank < 2; rank++) {
        char what[1200];
        snprintf(what, sizeof what, "rank %d: %d grouped crossing messages "
                 "of %zu floats each way arrive intact and in order (%s)",
                 rank, MESSAGES, MESSAGE_FLOATS,
                 runs[rank].status == 0 ? "ok" : runs[rank].err.message);
        gpu_test_expect(tally, runs[rank].status == 0 && runs[rank].data_ok,
                        what);
        printf("NOTE rank %d: staging buffers peaked at %.1f MiB\n", rank,
               comm_nccl_rank_peak_bytes(world, rank) / (1024.0 * 1024.0));
    }
    comm_nccl_destroy(world);
}

/* ---------------------------------------------------------- collectives */

static int collectives_body(rank_run *r)
{
    comm c = comm_nccl_rank(r->world, r->rank);
    static const int everyone[] = {0, 1};
    enum { COUNT = 4096 };
    float host[COUNT];
    float *data = NULL;
    GPU_CHECK(cudaMalloc((void **)&data, sizeof host));
    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(r->rank + 1);
    GPU_CHECK(cudaMemcpy(data, host, sizeof host, cudaMemcpyHostToDevice));
    r->data_ok = true;
    int status = comm_all_reduce_sum(&c, everyone, 2, data, COUNT, &r->err);
    GPU_CHECK(cudaMemcpy(host, data, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < COUNT; i++)
        r->data_ok = r->data_ok && host[i] == 3.0f;
    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(r->rank * 5 - i % 3);
    GPU_CHECK(cudaMemcpy(data, host, sizeof host, cudaMemcpyHostToDevice));
    if (status == 0)
        status = comm_all_reduce_max(&c, everyone, 2, data, COUNT, &r->err);
    GPU_CHECK(cudaMemcpy(host, data, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < COUNT; i++)
        r->data_ok = r->data_ok && host[i] == (float)(5 - i % 3);
    double values[2] = {r->rank + 1.0, 0.25 * r->rank};
    if (status == 0)
        status = comm_all_reduce_host(&c, everyone, 2, values, 2, &r->err);
    r->data_ok = r->data_ok && values[0] == 3.0 && values[1] == 0.25;
    if (status == 0)
        status = comm_barrier(&c, &r->err);
    cudaFree(data);
    return status;
}

static void test_collectives(gpu_test_tally *tally)
{
    rank_run runs[2];
    comm_nccl *world = run_pair(collectives_body, 60.0, runs, tally);
    if (world == NULL)
        return;
    for (int rank = 0; rank < 2; rank++) {
        char what[1200];
        snprintf(what, sizeof what, "rank %d: all-reduce sum and max, host "
                 "doubles and barrier give the expected values (%s)",
                 rank,
                 runs[rank].status == 0 ? "ok" : runs[rank].err.message);
        gpu_test_expect(tally, runs[rank].status == 0 && runs[rank].data_ok,
                        what);
    }
    comm_nccl_destroy(world);
}

/* --------------------------------------------------------- silent peer */

static int silent_body(rank_run *r)
{
    comm c = comm_nccl_rank(r->world, r->rank);
    if (r->rank == 1) {
        /* never sends; enters its barrier half a timeout late, so that
         * rank 0's receive is the first wait to run out (with both
         * waits begun together either may, and the one that loses names
         * the other: seen on 2 x H200, 2026-11-29, three runs of six) */
        struct timespec late = {.tv_sec = 1, .tv_nsec = 500000000L};
        nanosleep(&late, NULL);
        return comm_barrier(&c, &r->err);
    }
    float *data = NULL;
    GPU_CHECK(cudaMalloc((void **)&data, 1024 * sizeof(float)));
    int status = comm_recv(&c, 1, 0, data, 1024, &r->err);
    cudaFree(data);
    return status;
}

static void test_silent_peer(gpu_test_tally *tally)
{
    rank_run runs[2];
    comm_nccl *world = run_pair(silent_body, SILENT_TIMEOUT_S, runs, tally);
    if (world == NULL)
        return;
    printf("NOTE silent peer: rank 0 returned after %.1f s, rank 1 after "
           "%.1f s (timeout %.0f s)\n# rank 0: %s\n# rank 1: %s\n",
           runs[0].seconds, runs[1].seconds, SILENT_TIMEOUT_S,
           runs[0].err.message, runs[1].err.message);
    gpu_test_expect(tally,
                    runs[0].status == -1 &&
                        strstr(runs[0].err.message,
                               "rank 0: receive from rank 1") != NULL &&
                        strstr(runs[0].err.message, "no answer within") !=
                            NULL,
                    "the waiting rank fails naming itself, the peer and the "
                    "timeout");
    gpu_test_expect(tally,
                    runs[1].status == -1 &&
                        strstr(runs[1].err.message, "rank 0 failed") != NULL,
                    "the other rank returns too, naming the failed rank");
    gpu_test_expect(tally,
                    runs[0].seconds < 10 * SILENT_TIMEOUT_S &&
                        runs[1].seconds < 10 * SILENT_TIMEOUT_S,
                    "both return within ten times the timeout (no hang)");
    gpu_test_expect(tally,
                    comm_nccl_aborted_count(world, 0) > 0 &&
                        comm_nccl_aborted_count(world, 1) > 0,
                    "both ranks aborted their NCCL communicators");
    char reason[600];
    gpu_test_expect(tally, comm_nccl_failed_rank(world, reason,
                                                 sizeof reason) == 0,
                    "the world records rank 0 as the first failure");
    comm_nccl_destroy(world);
}

/* ------------------------------------------------------- green contexts */

typedef struct green_check {
    int sm_limit;
    int status;
    int sm_count;
    pt_error err;
} green_check;

static void *green_main(void *argument)
{
    green_check *g = argument;
    g->status = cuda_rank_device_open(1, g->sm_limit, 0.0, &g->err);
    if (g->status == 0) {
        g->sm_count = cuda_rank_sm_count();
        cudaStream_t stream = NULL;
        g->status = cuda_rank_stream_create(&stream, &g->err);
        if (g->status == 0) {
            void *buffer = NULL;
            if (cudaMalloc(&buffer, 1 << 20) != cudaSuccess ||
                cudaMemsetAsync(buffer, 0, 1 << 20, stream) != cudaSuccess ||
                cudaStreamSynchronize(stream) != cudaSuccess)
                g->status = pt_fail(&g->err, "work on the green stream "
                                             "failed");
            cudaFree(buffer);
            cudaStreamDestroy(stream);
        }
    }
    cuda_rank_device_close();
    return NULL;
}

static void run_green(green_check *g)
{
    pthread_t thread;
    if (pthread_create(&thread, NULL, green_main, g) != 0) {
        printf("FAIL cannot start a thread\n");
        exit(1);
    }
    pthread_join(thread, NULL);
}

static void test_green_contexts(gpu_test_tally *tally)
{
    green_check g = {.sm_limit = 40};
    run_green(&g);
    char what[1200];
    snprintf(what, sizeof what, "sm_limit 40 on device 1 gives a green "
             "context of %d SMs with a working stream (%s)",
             g.sm_count, g.status == 0 ? "ok" : g.err.message);
    gpu_test_expect(tally, g.status == 0 && g.sm_count >= 40 &&
                               g.sm_count <= 48,
                    what);
    green_check too_many = {.sm_limit = 1000};
    run_green(&too_many);
    snprintf(what, sizeof what, "sm_limit 1000 is refused naming both "
             "numbers (%s)", too_many.err.message);
    gpu_test_expect(tally, too_many.status == -1 &&
                               strstr(too_many.err.message,
                                      "sm_limit 1000") != NULL,
                    what);
}

/* ------------------------------------------------------- the launcher */

static void test_failing_rank(gpu_test_tally *tally)
{
    model_shape shape = {.name = "small", .layers = 2, .hidden = 128,
                         .heads = 2, .ffn_hidden = 512, .seq = 64,
                         .vocab = 257, .tied_embeddings = true};
    parallel_config config = {.gbs = 4, .mbs = 1, .tp = 1, .dp = 1,
                              .pp = 2, .schedule = SCHEDULE_1F1B};
    static const int partition[] = {1, 1};
    pipeline_layout layout;
    pt_error err = {{0}};
    if (pipeline_layout_init(&layout, &shape, &config, partition, 2, &err) !=
        0) {
        gpu_test_expect(tally, false, err.message);
        return;
    }
    device_spec devices[2] = {{.index = 0}, {.index = 1}};
    pipeline_gpu gpu;
    if (pipeline_gpu_start(&gpu, &layout, devices, GPU_COMM_NCCL, NULL, 7,
                           PIPELINE_TIMEOUT_S, &err) != 0) {
        gpu_test_expect(tally, false, err.message);
        return;
    }
    gpu_test_expect(tally, comm_nccl_clique_count(gpu.world) == 3,
                    "pp 2 makes three sets of communicators: the world "
                    "(which is also the embedding pair) and one per "
                    "message direction");
    uint32_t tokens[4 * 65];
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        tokens[i] = (uint32_t)(i * 13 % 257);
    train_config train = train_config_defaults();
    step_result result;
    int status = pipeline_threads_step(&gpu.threads, &train, tokens, &result,
                                       &err);
    gpu_test_expect(tally, status == 0, "a pp = 2 step on two GPUs runs");
    gpu.threads.inject_failure_rank = 1;
    double start = pt_monotonic_seconds();
    status = pipeline_threads_step(&gpu.threads, &train, tokens, &result,
                                   &err);
    double seconds = pt_monotonic_seconds() - start;
    printf("NOTE the failing step returned after %.2f s (comm timeout %.0f "
           "s)\n# %s\n# rank 0: %s\n",
           seconds, PIPELINE_TIMEOUT_S, err.message,
           gpu.threads.rank_errors[0].message);
    gpu_test_expect(tally, status == -1 &&
                               strstr(err.message, "rank 1 (stage 1") !=
                                   NULL &&
                               strstr(err.message, "injected failure") !=
                                   NULL,
                    "the step fails with the message of rank 1");
    gpu_test_expect(tally,
                    gpu.threads.rank_status[0] == -1 &&
                        strstr(gpu.threads.rank_errors[0].message,
                               "rank 1 failed") != NULL,
                    "rank 0 returns too, naming rank 1");
    gpu_test_expect(tally, seconds < PIPELINE_TIMEOUT_S / 4,
                    "without waiting for the comm timeout");
    gpu_test_expect(tally,
                    comm_nccl_aborted_count(gpu.world, 0) > 0 &&
                        comm_nccl_aborted_count(gpu.world, 1) > 0,
                    "both ranks aborted their NCCL communicators");
    status = pipeline_threads_step(&gpu.threads, &train, tokens, &result,
                                   &err);
    gpu_test_expect(tally, status == -1, "the failed world refuses the next "
                                         "step");
    pipeline_gpu_stop(&gpu);
    gpu_test_expect(tally, true, "the launcher stops after the failure");
}

/* ------------------------------------------------------ every schedule */

/* Two steps of a pp = `pp` pipeline under `schedule` (virtual stages v);
 * the second step's loss into *loss. */
static int run_schedule(int pp, schedule_kind schedule, int v,
                        float *loss, pt_error *err)
{
    model_shape shape = {.name = "small", .layers = 8, .hidden = 128,
                         .heads = 2, .ffn_hidden = 512, .seq = 64,
                         .vocab = 257, .tied_embeddings = true};
    parallel_config config = {.gbs = 8, .mbs = 1, .tp = 1, .dp = 1,
                              .pp = pp, .schedule = schedule,
                              .virtual_stages = v};
    int partition[4];
    for (int s = 0; s < pp; s++)
        partition[s] = shape.layers / pp; /* 4 or 2: v = 2 divides them */
    pipeline_layout layout;
    if (pipeline_layout_init(&layout, &shape, &config, partition, pp,
                             err) != 0)
        return -1;
    device_spec devices[4] = {{.index = 0}, {.index = 1}, {.index = 2},
                              {.index = 3}};
    pipeline_gpu gpu;
    if (pipeline_gpu_start(&gpu, &layout, devices, GPU_COMM_NCCL, NULL, 7,
                           PIPELINE_TIMEOUT_S, err) != 0)
        return -1;
    uint32_t tokens[8 * 65];
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        tokens[i] = (uint32_t)(i * 29 % 257);
    train_config train = train_config_defaults();
    step_result result = {0};
    int status = 0;
    for (int step = 0; step < 2 && status == 0; step++)
        status = pipeline_threads_step(&gpu.threads, &train, tokens, &result,
                                       err);
    *loss = result.loss;
    pipeline_gpu_stop(&gpu);
    return status;
}

static void test_schedules(gpu_test_tally *tally, int pp)
{
    static const struct {
        const char *name;
        schedule_kind schedule;
        int v;
    } runs[] = {{"1F1B", SCHEDULE_1F1B, 1},
                {"GPipe", SCHEDULE_GPIPE, 1},
                {"interleaved 1F1B (2 chunks a rank)", SCHEDULE_1F1B, 2}};
    float first = 0.0f;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        pt_error err = {{0}};
        float loss = 0.0f;
        double start = pt_monotonic_seconds();
        int status = run_schedule(pp, runs[i].schedule, runs[i].v, &loss,
                                  &err);
        if (i == 0)
            first = loss;
        char what[1200];
        snprintf(what, sizeof what, "pp %d %s over NCCL: two steps in %.1f "
                 "s, loss %.6f against 1F1B's %.6f (%s)",
                 pp, runs[i].name, pt_monotonic_seconds() - start, loss,
                 first, status == 0 ? "ok" : err.message);
        gpu_test_expect(tally, status == 0 && isfinite(loss) &&
                                   fabsf(loss - first) <=
                                       1e-4f * fabsf(first),
                        what);
    }
}

int main(void)
{
    gpu_test_require_device(PROGRAM);
    if (cuda_device_count() < 2) {
        printf("SKIP %s: needs 2 GPUs, %d visible\n", PROGRAM,
               cuda_device_count());
        return GPU_TEST_SKIP;
    }
    gpu_test_tally tally = {0};
    test_crossing_sends(&tally);
    test_collectives(&tally);
    test_silent_peer(&tally);
    test_green_contexts(&tally);
    test_failing_rank(&tally);
    test_schedules(&tally, cuda_device_count() >= 4 ? 4 : 2);
    return gpu_test_finish(&tally, PROGRAM);
}
