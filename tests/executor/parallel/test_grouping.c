/*
 * Sends that cannot deadlock, on the CPU: two ranks of the threads comm
 * sending 4 MB to each other at once (plain sends before receives, and
 * comm_sendrecv) get each other's data intact; comm_sendrecv refuses bad
 * peers and tags; the pipeline step makes each send with the receive that
 * follows it in the schedule, as Megatron's batched p2p does (the exact
 * sequence of operations of each stage of pp 2 under 1F1B and GPipe,
 * through a comm that logs them); under every schedule (1F1B, GPipe, the
 * interleaved 1F1B, on pp 2 and pp 4) each rank receives a peer's
 * messages in the order that peer sent them, as the NCCL comm needs (it
 * does not send tags: messages of one pair and direction are matched in
 * order, and all of a pipeline's have one size, so another order would
 * hand one micro-batch's tensor to another silently); the threads comm
 * has no stream-ordered collectives and the wrappers say so.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/executor.h"

#define MESSAGE_FLOATS ((size_t)1 << 20) /* 4 MB */
#define MAX_RANKS 4
#define MAX_OPS 160

/* ---------------------------------------------------- crossing messages */

typedef struct crossing_job {
    comm c;
    bool grouped;
    int status;
    pt_error err;
    bool intact;
} crossing_job;

static float message_value(int sender, size_t i)
{
    return (float)(sender * 1000003 + (int)(i % 1000));
}

static void *crossing_body(void *argument)
{
    crossing_job *job = argument;
    int peer = 1 - job->c.rank;
    float *out = malloc(MESSAGE_FLOATS * sizeof *out);
    float *in = malloc(MESSAGE_FLOATS * sizeof *in);
    for (size_t i = 0; i < MESSAGE_FLOATS; i++)
        out[i] = message_value(job->c.rank, i);
    if (job->grouped)
        job->status = comm_sendrecv(&job->c, peer, 3, out, MESSAGE_FLOATS,
                                    peer, 3, in, MESSAGE_FLOATS, &job->err);
    else
        job->status =
            comm_send(&job->c, peer, 3, out, MESSAGE_FLOATS, &job->err) != 0 ||
                    comm_recv(&job->c, peer, 3, in, MESSAGE_FLOATS,
                              &job->err) != 0
                ? -1
                : 0;
    job->intact = true;
    for (size_t i = 0; i < MESSAGE_FLOATS && job->intact; i++)
        job->intact = in[i] == message_value(peer, i);
    free(out);
    free(in);
    return NULL;
}

static void run_crossing(bool grouped)
{
    comm_threads *world = NULL;
    pt_error err = {{0}};
    assert_int_equal(comm_threads_create(2, 10.0, &world, &err), 0);
    crossing_job jobs[2];
    pthread_t ids[2];
    for (int r = 0; r < 2; r++) {
        jobs[r] = (crossing_job){.c = comm_threads_rank(world, r),
                                 .grouped = grouped};
        assert_int_equal(pthread_create(&ids[r], NULL, crossing_body,
                                        &jobs[r]),
                         0);
    }
    for (int r = 0; r < 2; r++) {
        assert_int_equal(pthread_join(ids[r], NULL), 0);
        if (jobs[r].status != 0)
            fail_msg("rank %d: %s", r, jobs[r].err.message);
        assert_true(jobs[r].intact);
    }
    comm_threads_destroy(world);
}

static void crossing_sends_arrive(void **state)
{
    (void)state;
    run_crossing(false);
}

static void crossing_sendrecv_arrives(void **state)
{
    (void)state;
    run_crossing(true);
}

static void sendrecv_refuses_bad_arguments(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err = {{0}};
    assert_int_equal(comm_threads_create(2, 1.0, &world, &err), 0);
    comm c = comm_threads_rank(world, 0);
    float x = 1.0f, y = 0.0f;
    assert_int_equal(comm_sendrecv(&c, 0, 1, &x, 1, 1, 1, &y, 1, &err), -1);
    assert_non_null(strstr(err.message, "peer 0 is not another rank"));
    assert_int_equal(comm_sendrecv(&c, 1, 1, &x, 1, 2, 1, &y, 1, &err), -1);
    assert_non_null(strstr(err.message, "peer 2"));
    assert_int_equal(comm_sendrecv(&c, 1, -1, &x, 1, 1, 1, &y, 1, &err), -1);
    assert_non_null(strstr(err.message, "tags must be >= 0"));
    comm_threads_destroy(world);
}

static void threads_comm_has_no_stream_ops(void **state)
{
    (void)state;
    comm_threads *world = NULL;
    pt_error err = {{0}};
    assert_int_equal(comm_threads_create(2, 1.0, &world, &err), 0);
    comm c = comm_threads_rank(world, 0);
    assert_false(comm_has_stream_ops(&c));
    int group[2] = {0, 1};
    float x = 1.0f;
    int fake_stream = 0;
    assert_int_equal(comm_all_reduce_on_stream(&c, group, 2, &x, 1,
                                               COMM_FLOAT32, COMM_SUM,
                                               &fake_stream, &err),
                     -1);
    assert_non_null(strstr(err.message, "no stream-ordered collectives"));
    assert_int_equal(comm_wait_stream(&c, &fake_stream, "test", &err), -1);
    comm_threads_destroy(world);
}

/* ------------------------------------------- the pipeline step's groups */

/* One message operation a rank made: 's' send, 'r' receive, 'g' a send
 * with its receive; tags of the send and the receive (-1: none). */
typedef struct logged_op {
    char kind;
    int send_tag;
    int recv_tag;
    int send_peer;
    int recv_peer;
} logged_op;

/* A comm that forwards to the threads comm and logs every message
 * operation of each rank (each rank writes only its own log). */
typedef struct logging_world {
    comm inner[MAX_RANKS];
    logged_op ops[MAX_RANKS][MAX_OPS];
    int count[MAX_RANKS];
} logging_world;

static logging_world *logging(const comm *c)
{
    return c->shared;
}

static void log_op(const comm *c, char kind, int send_peer, int send_tag,
                   int recv_peer, int recv_tag)
{
    logging_world *w = logging(c);
    if (w->count[c->rank] < MAX_OPS)
        w->ops[c->rank][w->count[c->rank]++] =
            (logged_op){kind, send_tag, recv_tag, send_peer, recv_peer};
}

static int logging_send(const comm *c, int peer, int tag, const float *data,
                        size_t count, pt_error *err)
{
    log_op(c, 's', peer, tag, -1, -1);
    return comm_send(&logging(c)->inner[c->rank], peer, tag, data, count,
                     err);
}

static int logging_recv(const comm *c, int peer, int tag, float *data,
                        size_t count, pt_error *err)
{
    log_op(c, 'r', -1, -1, peer, tag);
    return comm_recv(&logging(c)->inner[c->rank], peer, tag, data, count,
                     err);
}

static int logging_sendrecv(const comm *c, int send_peer, int send_tag,
                            const float *send_data, size_t send_count,
                            int recv_peer, int recv_tag, float *recv_data,
                            size_t recv_count, pt_error *err)
{
    log_op(c, 'g', send_peer, send_tag, recv_peer, recv_tag);
    return comm_sendrecv(&logging(c)->inner[c->rank], send_peer, send_tag,
                         send_data, send_count, recv_peer, recv_tag,
                         recv_data, recv_count, err);
}

static int logging_all_reduce(const comm *c, const int *group, int size,
                              float *data, size_t count, comm_reduce_op op,
                              pt_error *err)
{
    const comm *inner = &logging(c)->inner[c->rank];
    return op == COMM_MAX
               ? comm_all_reduce_max(inner, group, size, data, count, err)
               : comm_all_reduce_sum(inner, group, size, data, count, err);
}

static int logging_all_reduce_host(const comm *c, const int *group, int size,
                                   double *data, size_t count,
                                   pt_error *err)
{
    return comm_all_reduce_host(&logging(c)->inner[c->rank], group, size,
                                data, count, err);
}

static int logging_barrier(const comm *c, pt_error *err)
{
    return comm_barrier(&logging(c)->inner[c->rank], err);
}

static void logging_abort(const comm *c, const char *reason)
{
    comm_abort(&logging(c)->inner[c->rank], reason);
}

static int logging_failed_rank(const comm *c, char *reason, size_t size)
{
    return comm_failed_rank(&logging(c)->inner[c->rank], reason, size);
}

static const comm_ops logging_ops = {
    .name = "logging threads",
    .send = logging_send,
    .recv = logging_recv,
    .sendrecv = logging_sendrecv,
    .all_reduce = logging_all_reduce,
    .all_reduce_host = logging_all_reduce_host,
    .barrier = logging_barrier,
    .abort = logging_abort,
    .failed_rank = logging_failed_rank,
};

/* One step of a pp `pp` plan (virtual stages v) of a model of 2 pp v
 * layers with 4 micro-batches over the logging comm; returns the world
 * with each rank's log. */
static void log_pipeline_step(int pp, int v, schedule_kind schedule,
                              logging_world *w)
{
    model_shape shape = {.name = "tiny", .layers = 2 * pp * v, .hidden = 16,
                         .heads = 2, .ffn_hidden = 64, .seq = 8,
                         .vocab = 31, .tied_embeddings = true};
    parallel_config config = {.gbs = 4, .mbs = 1, .tp = 1, .dp = 1,
                              .pp = pp, .schedule = schedule,
                              .virtual_stages = v};
    int partition[MAX_RANKS];
    for (int s = 0; s < pp; s++)
        partition[s] = 2 * v;
    pipeline_layout layout;
    pt_error err = {{0}};
    assert_int_equal(pipeline_layout_init(&layout, &shape, &config,
                                          partition, pp, &err),
                     0);
    comm_threads *threads = NULL;
    assert_int_equal(comm_threads_create(pp, 30.0, &threads, &err), 0);
    memset(w, 0, sizeof *w);
    comm handles[MAX_RANKS];
    for (int rank = 0; rank < pp; rank++) {
        w->inner[rank] = comm_threads_rank(threads, rank);
        handles[rank] = (comm){.ops = &logging_ops, .shared = w,
                               .rank = rank, .size = pp};
    }
    pipeline_launch launch = {.backend = BACKEND_CPU, .seed = 3,
                              .comms = handles};
    pipeline_threads p;
    if (pipeline_threads_start(&p, &layout, &launch, &err) != 0)
        fail_msg("start: %s", err.message);
    uint32_t tokens[4 * 9];
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        tokens[i] = (uint32_t)(i * 11 % 31);
    train_config train = train_config_defaults();
    step_result result;
    if (pipeline_threads_step(&p, &train, tokens, &result, &err) != 0)
        fail_msg("step: %s", err.message);
    pipeline_threads_destroy(&p);
    comm_threads_destroy(threads);
}

static void log_one_step(schedule_kind schedule, logging_world *w)
{
    log_pipeline_step(2, 1, schedule, w);
}

static void expect_log(const logging_world *w, int rank, const char *want)
{
    char got[MAX_OPS * 12] = "";
    size_t used = 0;
    for (int i = 0; i < w->count[rank]; i++) {
        const logged_op *op = &w->ops[rank][i];
        if (op->kind == 's')
            used += (size_t)snprintf(got + used, sizeof got - used, "%ss%d",
                                     i ? " " : "", op->send_tag);
        else if (op->kind == 'r')
            used += (size_t)snprintf(got + used, sizeof got - used, "%sr%d",
                                     i ? " " : "", op->recv_tag);
        else
            used += (size_t)snprintf(got + used, sizeof got - used,
                                     "%ss%d+r%d", i ? " " : "", op->send_tag,
                                     op->recv_tag);
    }
    if (strcmp(got, want) != 0)
        fail_msg("rank %d made \"%s\", expected \"%s\"", rank, got, want);
}

/* Tags: micro-batch j's activation 2j, its gradient 2j + 1. Under 1F1B
 * stage 0 sends its warm-up activation alone, then each activation with
 * the receive of a gradient (send_forward_recv_backward); stage 1 each
 * gradient with the receive of the next activation
 * (send_backward_recv_forward), the last gradient alone. */
static void one_f_one_b_groups_each_send_with_a_receive(void **state)
{
    (void)state;
    logging_world w;
    log_one_step(SCHEDULE_1F1B, &w);
    expect_log(&w, 0, "s0 s2+r1 s4+r3 s6+r5 r7");
    expect_log(&w, 1, "r0 s1+r2 s3+r4 s5+r6 s7");
}

/* GPipe: stage 0 sends its activations alone, the last one with the
 * first gradient's receive; stage 1 receives every activation, then sends
 * each gradient alone (a backward comes next, not a receive). */
static void gpipe_pairs_only_what_follows(void **state)
{
    (void)state;
    logging_world w;
    log_one_step(SCHEDULE_GPIPE, &w);
    expect_log(&w, 0, "s0 s2 s4 s6+r1 r3 r5 r7");
    expect_log(&w, 1, "r0 r2 r4 r6 s1 s3 s5 s7");
}

/* The tags `from` sent to `to`, in order, or those `to` received from
 * `from` (received); returns how many. */
static int pair_tags(const logging_world *w, int from, int to,
                     bool received, int *tags)
{
    int n = 0;
    int rank = received ? to : from;
    for (int i = 0; i < w->count[rank]; i++) {
        const logged_op *op = &w->ops[rank][i];
        if (!received && op->kind != 'r' && op->send_peer == to)
            tags[n++] = op->send_tag;
        if (received && op->kind != 's' && op->recv_peer == from)
            tags[n++] = op->recv_tag;
    }
    return n;
}

static void expect_pairs_in_order(int pp, int v, schedule_kind schedule)
{
    logging_world w;
    log_pipeline_step(pp, v, schedule, &w);
    for (int rank = 0; rank < pp; rank++)
        assert_true(w.count[rank] < MAX_OPS);
    int messages = 0;
    for (int from = 0; from < pp; from++)
        for (int to = 0; to < pp; to++) {
            int sent[MAX_OPS], received[MAX_OPS];
            int n = pair_tags(&w, from, to, false, sent);
            int m = pair_tags(&w, from, to, true, received);
            assert_int_equal(n, m);
            messages += n;
            for (int i = 0; i < n; i++)
                if (sent[i] != received[i])
                    fail_msg("pp %d v %d %s: rank %d sent tag %d as its "
                             "message %d to rank %d, which received tag "
                             "%d there",
                             pp, v, schedule_name(schedule), from, sent[i],
                             i, to, received[i]);
        }
    /* each of 4 micro-batches crosses pp v - 1 boundaries both ways */
    assert_int_equal(messages, 2 * 4 * (pp * v - 1));
}

static void every_schedule_receives_in_send_order(void **state)
{
    (void)state;
    expect_pairs_in_order(2, 1, SCHEDULE_1F1B);
    expect_pairs_in_order(2, 1, SCHEDULE_GPIPE);
    expect_pairs_in_order(2, 2, SCHEDULE_1F1B);
    expect_pairs_in_order(4, 1, SCHEDULE_1F1B);
    expect_pairs_in_order(4, 1, SCHEDULE_GPIPE);
    expect_pairs_in_order(4, 2, SCHEDULE_1F1B);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crossing_sends_arrive),
        cmocka_unit_test(crossing_sendrecv_arrives),
        cmocka_unit_test(sendrecv_refuses_bad_arguments),
        cmocka_unit_test(threads_comm_has_no_stream_ops),
        cmocka_unit_test(one_f_one_b_groups_each_send_with_a_receive),
        cmocka_unit_test(gpipe_pairs_only_what_follows),
        cmocka_unit_test(every_schedule_receives_in_send_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
