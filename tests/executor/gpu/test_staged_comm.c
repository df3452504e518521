/*
 * The host-staged comm (executor/parallel/parallel.h) on ONE GPU: three ranks,
 * threads of this process, all on device 0, each in its own slice of the
 * SMs (plain C: PASS / FAIL lines, exit 77 without a GPU). Checked:
 *   - crossing sends of a message larger than the 64 MiB staging piece
 *     (rank 0 and rank 1 send to each other before receiving), intact;
 *   - all-reduce sum and max of device floats over the three, larger
 *     than a piece, exact (integers, so the sums are exact in fp32);
 *   - reduce-scatter then all-gather with uneven chunks whose borders
 *     fall inside pieces and across them: each rank's chunk is the sum,
 *     and afterwards every rank holds every chunk;
 *   - the slices: sm_limit 40 for each rank gives 40 SMs each, and a
 *     fourth slice past the device's partitions is refused with numbers;
 *   - a rank that aborts ends the others' waits with its name.
 */
#include "gpu_test.h"

#include <pthread.h>

#include "executor/parallel/parallel.h"

#define PROGRAM "test_staged_comm"
#define RANKS 3
/* 40 Mi floats: 160 MiB, so every operation goes in three pieces */
#define BIG ((size_t)40 << 20)

typedef struct rank_run {
    comm_staged *world;
    int rank;
    int sm_slices[RANKS]; /* every rank's sm_limit on the GPU */
    int sm_count;
    int status;
    pt_error err;
    bool ok;
    bool aborting;      /* the failure check: this rank aborts */
} rank_run;

static float *device_filled(size_t count, float (*value)(size_t, int),
                            int rank)
{
    float *host = malloc(count * sizeof *host);
    for (size_t i = 0; i < count; i++)
        host[i] = value(i, rank);
    float *device = gpu_test_upload(host, count);
    free(host);
    return device;
}

static float message_value(size_t i, int rank)
{
    return (float)((i % 1000) + 1000 * rank);
}

static float reduce_value(size_t i, int rank)
{
    return (float)((i % 97) * (rank + 1));
}

/* Every element of device buffer d against want(i), on the host. */
static bool device_equals(const float *d, size_t count,
                          float (*want)(size_t, int), int rank)
{
    float *host = malloc(count * sizeof *host);
    GPU_CHECK(cudaMemcpy(host, d, count * sizeof *host,
                         cudaMemcpyDeviceToHost));
    bool ok = true;
    for (size_t i = 0; i < count && ok; i++)
        ok = host[i] == want(i, rank);
    free(host);
    return ok;
}

static float sum_value(size_t i, int unused)
{
    (void)unused;
    return (float)((i % 97) * (1 + 2 + 3));
}

static float max_value(size_t i, int unused)
{
    (void)unused;
    return (float)((i % 97) * RANKS);
}

static int exchange(rank_run *r, const comm *c)
{
    if (r->rank > 1)
        return 0;
    int peer = 1 - r->rank;
    float *out = device_filled(BIG, message_value, r->rank);
    float *in = gpu_test_device(BIG * sizeof(float));
    int status = comm_send(c, peer, 5, out, BIG, &r->err) != 0 ||
                         comm_recv(c, peer, 5, in, BIG, &r->err) != 0
                     ? -1
                     : 0;
    r->ok = status == 0 && device_equals(in, BIG, message_value, peer);
    cudaFree(out);
    cudaFree(in);
    return status;
}

static int reductions(rank_run *r, const comm *c, bool *sum_ok, bool *max_ok)
{
    static const int group[RANKS] = {0, 1, 2};
    float *data = device_filled(BIG, reduce_value, r->rank);
    int status = comm_all_reduce_sum(c, group, RANKS, data, BIG, &r->err);
    *sum_ok = status == 0 && device_equals(data, BIG, sum_value, 0);
    cudaFree(data);
    data = device_filled(BIG, reduce_value, r->rank);
    if (status == 0)
        status = comm_all_reduce_max(c, group, RANKS, data, BIG, &r->err);
    *max_ok = status == 0 && device_equals(data, BIG, max_value, 0);
    cudaFree(data);
    return status;
}

/* Chunks of 10, 20.5 and 9.5 Mi floats: borders inside pieces 0 and 1. */
static void uneven_chunks(size_t offsets[RANKS + 1])
{
    offsets[0] = 0;
    offsets[1] = (size_t)10 << 20;
    offsets[2] = offsets[1] + ((size_t)41 << 19);
    offsets[3] = BIG;
}

static int scatter_gather(rank_run *r, const comm *c, bool *scatter_ok,
                          bool *gather_ok)
{
    static const int group[RANKS] = {0, 1, 2};
    size_t offsets[RANKS + 1];
    uneven_chunks(offsets);
    float *data = device_filled(BIG, reduce_value, r->rank);
    int status = comm_reduce_scatter_sum(c, group, RANKS, data, offsets,
                                         &r->err);
    size_t first = offsets[r->rank], count = offsets[r->rank + 1] - first;
    float *host = malloc(BIG * sizeof *host);
    GPU_CHECK(cudaMemcpy(host, data, BIG * sizeof *host,
                         cudaMemcpyDeviceToHost));
    *scatter_ok = status == 0;
    for (size_t i = first; i < first + count && *scatter_ok; i++)
        *scatter_ok = host[i] == sum_value(i, 0);
    if (status == 0)
        status = comm_all_gather(c, group, RANKS, data, offsets, &r->err);
    GPU_CHECK(cudaMemcpy(host, data, BIG * sizeof *host,
                         cudaMemcpyDeviceToHost));
    *gather_ok = status == 0;
    for (size_t i = 0; i < BIG && *gather_ok; i++)
        *gather_ok = host[i] == sum_value(i, 0);
    free(host);
    cudaFree(data);
    return status;
}

typedef struct rank_results {
    bool exchange_ok, sum_ok, max_ok, scatter_ok, gather_ok;
} rank_results;

static rank_results results[RANKS];

static void *rank_main(void *argument)
{
    rank_run *r = argument;
    r->status = cuda_rank_device_open_slice(0, r->sm_slices, RANKS, r->rank,
                                            0.0, &r->err);
    if (r->status == 0)
        r->status = comm_staged_rank_open(r->world, r->rank, &r->err);
    r->sm_count = cuda_rank_sm_count();
    comm c = comm_staged_rank(r->world, r->rank);
    rank_results *out = &results[r->rank];
    if (r->status == 0 && r->aborting) {
        if (r->rank == 2)
            comm_abort(&c, "rank 2 gave up on purpose");
        else
            r->status = comm_barrier(&c, &r->err);
    } else if (r->status == 0) {
        r->status = exchange(r, &c);
        out->exchange_ok = r->ok || r->rank > 1;
        if (r->status == 0)
            r->status = reductions(r, &c, &out->sum_ok, &out->max_ok);
        if (r->status == 0)
            r->status = scatter_gather(r, &c, &out->scatter_ok,
                                       &out->gather_ok);
    }
    comm_staged_rank_close(r->world, r->rank);
    cuda_rank_device_close();
    return NULL;
}

static void run_world(rank_run runs[RANKS], bool aborting)
{
    comm_staged *world = NULL;
    pt_error err = {{0}};
    PT_CHECK(comm_staged_create(RANKS, 60.0, &world, &err), &err);
    pthread_t threads[RANKS];
    for (int rank = 0; rank < RANKS; rank++) {
        runs[rank] = (rank_run){.world = world, .rank = rank,
                                .sm_slices = {40, 40, 40},
                                .aborting = aborting};
        pthread_create(&threads[rank], NULL, rank_main, &runs[rank]);
    }
    for (int rank = 0; rank < RANKS; rank++)
        pthread_join(threads[rank], NULL);
    comm_staged_destroy(world);
}

static void expect(gpu_test_tally *tally, bool ok, const char *what)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    ok ? tally->passed++ : tally->failed++;
}

int main(void)
{
    gpu_test_require_device(PROGRAM);
    gpu_test_tally tally = {0};
    rank_run runs[RANKS];
    run_world(runs, false);
    bool all = true, slices = true;
    for (int rank = 0; rank < RANKS; rank++) {
        if (runs[rank].status != 0)
            printf("NOTE rank %d: %s\n", rank, runs[rank].err.message);
        all &= runs[rank].status == 0;
        slices &= runs[rank].sm_count == 40;
    }
    expect(&tally, all, "three ranks on device 0 ran every operation");
    expect(&tally, slices, "each rank's green context has 40 SMs");
    bool exchange = true, sum = true, max = true, scatter = true,
         gather = true;
    for (int rank = 0; rank < RANKS; rank++) {
        exchange &= results[rank].exchange_ok;
        sum &= results[rank].sum_ok;
        max &= results[rank].max_ok;
        scatter &= results[rank].scatter_ok;
        gather &= results[rank].gather_ok;
    }
    expect(&tally, exchange, "crossing 160 MiB messages arrive intact");
    expect(&tally, sum, "all-reduce sum of 160 MiB, exact on every rank");
    expect(&tally, max, "all-reduce max of 160 MiB, exact on every rank");
    expect(&tally, scatter, "reduce-scatter: each rank's uneven chunk is "
                            "the sum");
    expect(&tally, gather, "all-gather: every rank holds every chunk");

    pt_error err = {{0}};
    int too_many[4] = {40, 40, 40, 40};
    int refused = cuda_rank_device_open_slice(0, too_many, 4, 3, 0.0, &err);
    cuda_rank_device_close();
    printf("NOTE %s\n", err.message);
    expect(&tally, refused != 0 && strstr(err.message, "partitions") != NULL,
           "a slice past the device's partitions is refused");

    run_world(runs, true);
    bool named = runs[0].status != 0 && runs[1].status != 0 &&
                 strstr(runs[0].err.message, "rank 2") != NULL &&
                 strstr(runs[1].err.message, "rank 2") != NULL;
    printf("NOTE rank 0: %s\n", runs[0].err.message);
    expect(&tally, named, "a rank's abort ends the others' barrier, naming "
                          "it");
    printf("%s %s: %d passed, %d failed\n",
           tally.failed == 0 ? "ALL PASS" : "SOME FAILED", PROGRAM,
           tally.passed, tally.failed);
    return tally.failed == 0 ? 0 : 1;
}
