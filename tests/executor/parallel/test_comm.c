/*
 * The threads comm: messages of one peer and tag arrive in order and
 * others wait their turn, all-reduce gives every member the same sum
 * over its group, reduce-scatter and all-gather of uneven chunks make
 * that sum in two halves, barrier, size mismatches, and the failure paths: a
 * receive that nobody answers times out naming the peer, and an abort
 * wakes every waiting rank with the failed rank's name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "executor/executor.h"

#define RANKS 4

/* A rank's thread: its comm, a test body, and what it reports. */
typedef struct rank_job {
    comm c;
    int status;
    pt_error err;
    float values[8];
} rank_job;

typedef void *(*rank_body)(void *);

static void run_ranks(comm_threads *world, rank_job *jobs, int ranks,
                      rank_body body)
{
    pthread_t ids[RANKS];
    for (int r = 0; r < ranks; r++) {
        jobs[r].c = comm_threads_rank(world, r);
        jobs[r].status = 0;
        jobs[r].err.message[0] = '\0';
        assert_int_equal(pthread_create(&ids[r], NULL, body, &jobs[r]), 0);
    }
    for (int r = 0; r < ranks; r++)
        assert_int_equal(pthread_join(ids[r], NULL), 0);
}

/* Each rank sends two tagged messages to the next rank, tag 1 first,
 * then receives tag 0 before tag 1 from the previous one: a receive
 * skips messages of other tags. */
static void *ring_body(void *argument)
{
    rank_job *job = argument;
    const comm *c = &job->c;
    int next = (c->rank + 1) % c->size;
    int previous = (c->rank + c->size - 1) % c->size;
    float first[2] = {(float)c->rank, 1.0f};
    float second[2] = {(float)c->rank, 2.0f};
    float third[2] = {(float)c->rank, 3.0f};
    job->status = comm_send(c, next, 1, second, 2, &job->err) ||
                  comm_send(c, next, 1, third, 2, &job->err) ||
                  comm_send(c, next, 0, first, 2, &job->err) ||
                  comm_recv(c, previous, 0, job->values, 2, &job->err) ||
                  comm_recv(c, previous, 1, job->values + 2, 2, &job->err) ||
                  comm_recv(c, previous, 1, job->values + 4, 2, &job->err) ||
                  comm_barrier(c, &job->err);
    return NULL;
}

static void test_send_receive_in_order(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err;
    assert_int_equal(comm_threads_create(RANKS, 10.0, &world, &err), 0);
    rank_job jobs[RANKS];
    run_ranks(world, jobs, RANKS, ring_body);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(jobs[r].status, 0);
        float previous = (float)((r + RANKS - 1) % RANKS);
        const float expected[6] = {previous, 1.0f, previous, 2.0f,
                                   previous, 3.0f};
        assert_memory_equal(jobs[r].values, expected, sizeof expected);
    }
    assert_int_equal(comm_threads_failed_rank(world, NULL, 0), -1);
    comm_threads_destroy(world);
}

/* Ranks 3 and 1 reduce among themselves (3 is the root), then all four
 * reduce over the world. */
static void *all_reduce_body(void *argument)
{
    rank_job *job = argument;
    const comm *c = &job->c;
    for (int k = 0; k < 3; k++)
        job->values[k] = (float)(c->rank * 10 + k);
    static const int pair[2] = {3, 1};
    static const int world[RANKS] = {0, 1, 2, 3};
    if (c->rank == 1 || c->rank == 3)
        job->status = comm_all_reduce_sum(c, pair, 2, job->values, 3,
                                          &job->err);
    if (job->status == 0)
        job->status = comm_all_reduce_sum(c, world, RANKS, job->values + 3,
                                          0, &job->err) ||
                      comm_all_reduce_sum(c, world, RANKS, job->values, 3,
                                          &job->err);
    return NULL;
}

static void test_all_reduce(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err;
    assert_int_equal(comm_threads_create(RANKS, 10.0, &world, &err), 0);
    rank_job jobs[RANKS];
    run_ranks(world, jobs, RANKS, all_reduce_body);
    /* after the pair: ranks 1 and 3 hold 40 + 2k; then the world sums
     * 0 + k, 40 + 2k, 20 + k, 40 + 2k */
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(jobs[r].status, 0);
        for (int k = 0; k < 3; k++)
            assert_true(jobs[r].values[k] == (float)(100 + 6 * k));
    }
    comm_threads_destroy(world);
}

/* Uneven chunks (3, 0, 2, 3 floats) over the world in the order 2, 0,
 * 3, 1: member i keeps chunk i of the sum; the all-gather then gives
 * every rank every chunk, which together equal an all-reduce. */
static const int scatter_group[RANKS] = {2, 0, 3, 1};
static const size_t scatter_offsets[RANKS + 1] = {0, 3, 3, 5, 8};

static int member_of(int rank)
{
    for (int i = 0; i < RANKS; i++)
        if (scatter_group[i] == rank)
            return i;
    return -1;
}

static void *scatter_gather_body(void *argument)
{
    rank_job *job = argument;
    const comm *c = &job->c;
    for (int k = 0; k < 8; k++)
        job->values[k] = (float)(c->rank * 10 + k);
    job->status = comm_reduce_scatter_sum(c, scatter_group, RANKS,
                                          job->values, scatter_offsets,
                                          &job->err);
    if (job->status != 0)
        return NULL;
    /* poison what is not this rank's chunk: the gather must fill it */
    int me = member_of(c->rank);
    for (int k = 0; k < 8; k++)
        if (k < (int)scatter_offsets[me] || k >= (int)scatter_offsets[me + 1])
            job->values[k] = -1.0f;
    job->status = comm_all_gather(c, scatter_group, RANKS, job->values,
                                  scatter_offsets, &job->err);
    return NULL;
}

static void test_reduce_scatter_and_all_gather(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err;
    assert_int_equal(comm_threads_create(RANKS, 10.0, &world, &err), 0);
    rank_job jobs[RANKS];
    run_ranks(world, jobs, RANKS, scatter_gather_body);
    /* sum over ranks of 10 r + k: 60 + 4k */
    for (int r = 0; r < RANKS; r++) {
        if (jobs[r].status != 0)
            fail_msg("rank %d: %s", r, jobs[r].err.message);
        for (int k = 0; k < 8; k++)
            assert_true(jobs[r].values[k] == (float)(60 + 4 * k));
    }
    comm rank0 = comm_threads_rank(world, 0);
    static const size_t backwards[3] = {0, 4, 2};
    static const int pair[2] = {0, 1};
    float data[4] = {0};
    assert_int_equal(comm_reduce_scatter_sum(&rank0, pair, 2, data,
                                             backwards, &err),
                     -1);
    assert_non_null(strstr(err.message, "chunk 1 ends"));
    comm_threads_destroy(world);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err;
    assert_int_equal(comm_threads_create(0, 1.0, &world, &err), -1);
    assert_int_equal(comm_threads_create(2, 0.0, &world, &err), -1);
    assert_int_equal(comm_threads_create(2, 10.0, &world, &err), 0);
    comm rank0 = comm_threads_rank(world, 0);
    comm rank1 = comm_threads_rank(world, 1);
    float data[4] = {1, 2, 3, 4};
    assert_int_equal(comm_send(&rank0, 0, 0, data, 4, &err), -1);
    assert_non_null(strstr(err.message, "peer 0"));
    assert_int_equal(comm_send(&rank0, 2, 0, data, 4, &err), -1);
    assert_int_equal(comm_send(&rank0, 1, -3, data, 4, &err), -1);
    static const int without_me[1] = {1};
    assert_int_equal(comm_all_reduce_sum(&rank0, without_me, 1, data, 4,
                                         &err),
                     -1);
    assert_non_null(strstr(err.message, "not in"));
    static const int twice[3] = {0, 1, 1};
    assert_int_equal(comm_all_reduce_sum(&rank0, twice, 3, data, 4, &err),
                     -1);
    assert_non_null(strstr(err.message, "twice"));
    /* four floats sent, three expected */
    assert_int_equal(comm_send(&rank0, 1, 5, data, 4, &err), 0);
    assert_int_equal(comm_recv(&rank1, 0, 5, data, 3, &err), -1);
    assert_non_null(strstr(err.message, "expected 3 floats, got 4"));
    comm_threads_destroy(world);
}

/* A receive nobody answers: a timeout naming the peer and the tag, and
 * the world marked failed by the waiting rank, so the peer's next
 * operation fails too, naming it. */
static void test_receive_times_out(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err;
    assert_int_equal(comm_threads_create(2, 0.2, &world, &err), 0);
    comm rank0 = comm_threads_rank(world, 0);
    comm rank1 = comm_threads_rank(world, 1);
    float data[2];
    assert_int_equal(comm_recv(&rank0, 1, 7, data, 2, &err), -1);
    assert_non_null(strstr(err.message, "rank 0: receive from rank 1 "
                                        "(tag 7) timed out after 0.2 s"));
    char reason[600];
    assert_int_equal(comm_threads_failed_rank(world, reason, sizeof reason),
                     0);
    assert_non_null(strstr(reason, "timed out"));
    assert_int_equal(comm_send(&rank1, 0, 7, data, 2, &err), -1);
    assert_non_null(strstr(err.message, "rank 0 failed"));
    assert_int_equal(comm_barrier(&rank1, &err), -1);
    comm_threads_destroy(world);
}

/* Rank 2 aborts; ranks 0 and 1 wait in a receive and rank 3 in the
 * barrier: all return, naming rank 2 and its reason. The long timeout
 * shows it is the abort, not the clock, that wakes them. */
static void *abort_body(void *argument)
{
    rank_job *job = argument;
    const comm *c = &job->c;
    float data[1];
    if (c->rank == 2) {
        comm_abort(c, "disk on fire");
        job->status = -1;
    } else if (c->rank == 3) {
        job->status = comm_barrier(c, &job->err);
    } else {
        job->status = comm_recv(c, 2, 0, data, 1, &job->err);
    }
    return NULL;
}

static void test_abort_wakes_everyone(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err;
    assert_int_equal(comm_threads_create(RANKS, 600.0, &world, &err), 0);
    rank_job jobs[RANKS];
    run_ranks(world, jobs, RANKS, abort_body);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(jobs[r].status, -1);
        if (r == 2)
            continue;
        assert_non_null(strstr(jobs[r].err.message,
                               "rank 2 failed: disk on fire"));
    }
    assert_non_null(strstr(jobs[3].err.message, "barrier"));
    assert_non_null(strstr(jobs[0].err.message, "receive from rank 2"));
    assert_int_equal(comm_threads_failed_rank(world, NULL, 0), 2);
    comm_threads_destroy(world);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_send_receive_in_order),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_reduce_scatter_and_all_gather),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_receive_times_out),
        cmocka_unit_test(test_abort_wakes_everyone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
