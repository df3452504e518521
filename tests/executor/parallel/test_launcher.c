/*
 * The launcher and the group bookkeeping behind the NCCL comm, without a
 * GPU: pipeline_layout_groups lists exactly the dp groups, tp groups and
 * embedding pairs of a layout (none equal to the world or to each other);
 * a run through pipeline_threads_start over a caller's comm (the threads
 * comm behind an interposer) makes every collective over the world or one
 * of those groups, which is what a NCCL world made from them must serve;
 * hooks and tasks run on each rank's own thread; a rank whose hook fails
 * stops the start with its name and every rank's close hook still runs;
 * the device of each rank (GPU index, sm_limit, memory cap) comes from
 * the cluster file's `devices` entries; one launcher per rank (as each
 * process of an mpirun job makes) trains like one launcher of all.
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

#define SEED 5
#define MAX_RANKS 8

static model_shape tiny_shape(void)
{
    model_shape shape = {.name = "tiny", .layers = 4, .hidden = 16,
                         .heads = 2, .ffn_hidden = 64, .seq = 8,
                         .vocab = 31, .tied_embeddings = true};
    return shape;
}

static pipeline_layout make_layout(int tp, int dp, int pp)
{
    model_shape shape = tiny_shape();
    parallel_config config = {.gbs = 2 * dp, .mbs = 1, .tp = tp, .dp = dp,
                              .pp = pp, .schedule = SCHEDULE_1F1B};
    int partition[4] = {4, 0, 0, 0};
    if (pp == 2)
        partition[0] = partition[1] = 2;
    pipeline_layout layout;
    pt_error err = {{0}};
    if (pipeline_layout_init(&layout, &shape, &config, partition, pp,
                             &err) != 0)
        fail_msg("layout refused: %s", err.message);
    return layout;
}

static bool group_is(const comm_groups *groups, int g, const int *members,
                     int size)
{
    return groups->offsets[g + 1] - groups->offsets[g] == size &&
           memcmp(groups->members + groups->offsets[g], members,
                  (size_t)size * sizeof *members) == 0;
}

/* pp 2 x dp 2 x tp 2: rank = t + 2 (d + 2 s). */
static void groups_of_a_full_layout(void **state)
{
    (void)state;
    pipeline_layout layout = make_layout(2, 2, 2);
    comm_groups groups;
    pt_error err = {{0}};
    assert_int_equal(pipeline_layout_groups(&layout, &groups, &err), 0);
    static const int expected[][2] = {
        {0, 2}, {1, 3}, {4, 6}, {5, 7},   /* dp groups: stage, shard */
        {0, 1}, {2, 3}, {4, 5}, {6, 7},   /* tp groups: stage, replica */
        {0, 4}, {1, 5}, {2, 6}, {3, 7}};  /* embedding pairs */
    int count = (int)(sizeof expected / sizeof expected[0]);
    assert_int_equal(groups.count, count);
    for (int g = 0; g < count; g++)
        assert_true(group_is(&groups, g, expected[g], 2));
    comm_groups_free(&groups);
}

/* A group equal to the world or to another group is left out. */
static void groups_equal_to_the_world_are_left_out(void **state)
{
    (void)state;
    comm_groups groups;
    pt_error err = {{0}};
    pipeline_layout pp2 = make_layout(1, 1, 2); /* the pair is the world */
    assert_int_equal(pipeline_layout_groups(&pp2, &groups, &err), 0);
    assert_int_equal(groups.count, 0);
    comm_groups_free(&groups);
    pipeline_layout dp2 = make_layout(1, 2, 1); /* the dp group too */
    assert_int_equal(pipeline_layout_groups(&dp2, &groups, &err), 0);
    assert_int_equal(groups.count, 0);
    comm_groups_free(&groups);
    pipeline_layout dp4 = make_layout(1, 4, 2);
    assert_int_equal(pipeline_layout_groups(&dp4, &groups, &err), 0);
    /* two dp groups of 4, four embedding pairs */
    assert_int_equal(groups.count, 6);
    static const int stage1[] = {4, 5, 6, 7};
    assert_true(group_is(&groups, 1, stage1, 4));
    comm_groups_free(&groups);
}

/* ------------------------------------------------------ the interposer */

/* A comm that forwards to the threads comm and checks every collective's
 * group against the layout's groups and the world. */
typedef struct checked_world {
    comm inner[MAX_RANKS];
    comm_groups groups;
    int size;
    pthread_mutex_t lock;
    int collectives;
    int unknown_groups;
    /* the hooks: which thread each rank's open and close ran on */
    pthread_t opened_on[MAX_RANKS];
    int opens[MAX_RANKS];
    int closes[MAX_RANKS];
    int closed_elsewhere;        /* close hooks off the rank's thread */
    int fail_open_rank;          /* -1: none */
} checked_world;

static checked_world *checked(const comm *c)
{
    return c->shared;
}

static void check_group_known(const comm *c, const int *group, int size)
{
    checked_world *w = checked(c);
    int sorted[MAX_RANKS];
    memcpy(sorted, group, (size_t)size * sizeof *group);
    for (int i = 1; i < size; i++) /* insertion sort: tiny groups */
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    bool known = size == w->size;
    for (int i = 0; known && i < size; i++)
        known = sorted[i] == i;
    for (int g = 0; !known && g < w->groups.count; g++)
        known = group_is(&w->groups, g, sorted, size);
    pthread_mutex_lock(&w->lock);
    w->collectives++;
    w->unknown_groups += !known;
    pthread_mutex_unlock(&w->lock);
}

static int checked_send(const comm *c, int peer, int tag, const float *data,
                        size_t count, pt_error *err)
{
    return comm_send(&checked(c)->inner[c->rank], peer, tag, data, count,
                     err);
}

static int checked_recv(const comm *c, int peer, int tag, float *data,
                        size_t count, pt_error *err)
{
    return comm_recv(&checked(c)->inner[c->rank], peer, tag, data, count,
                     err);
}

static int checked_all_reduce(const comm *c, const int *group, int size,
                              float *data, size_t count, comm_reduce_op op,
                              pt_error *err)
{
    check_group_known(c, group, size);
    const comm *inner = &checked(c)->inner[c->rank];
    return op == COMM_MAX
               ? comm_all_reduce_max(inner, group, size, data, count, err)
               : comm_all_reduce_sum(inner, group, size, data, count, err);
}

static int checked_all_reduce_host(const comm *c, const int *group, int size,
                                   double *data, size_t count,
                                   pt_error *err)
{
    check_group_known(c, group, size);
    return comm_all_reduce_host(&checked(c)->inner[c->rank], group, size,
                                data, count, err);
}

static int checked_barrier(const comm *c, pt_error *err)
{
    return comm_barrier(&checked(c)->inner[c->rank], err);
}

static void checked_abort(const comm *c, const char *reason)
{
    comm_abort(&checked(c)->inner[c->rank], reason);
}

static int checked_failed_rank(const comm *c, char *reason, size_t size)
{
    return comm_failed_rank(&checked(c)->inner[c->rank], reason, size);
}

static const comm_ops checked_ops = {
    .name = "checked threads",
    .send = checked_send,
    .recv = checked_recv,
    .all_reduce = checked_all_reduce,
    .all_reduce_host = checked_all_reduce_host,
    .barrier = checked_barrier,
    .abort = checked_abort,
    .failed_rank = checked_failed_rank,
};

static int open_hook(void *data, int rank, pt_error *err)
{
    checked_world *w = data;
    w->opened_on[rank] = pthread_self();
    w->opens[rank]++;
    if (rank == w->fail_open_rank)
        return pt_fail(err, "no device for this rank (the test says so)");
    return 0;
}

static void close_hook(void *data, int rank)
{
    checked_world *w = data;
    /* no cmocka assertion here: this is not the test's thread */
    if (!pthread_equal(w->opened_on[rank], pthread_self())) {
        pthread_mutex_lock(&w->lock);
        w->closed_elsewhere++;
        pthread_mutex_unlock(&w->lock);
    }
    w->closes[rank]++;
}

static int same_thread_task(void *data, int rank, model_stage *stage,
                            pt_error *err)
{
    checked_world *w = data;
    if (!pthread_equal(w->opened_on[rank], pthread_self()) ||
        stage->spec.tp_rank != rank % 2)
        return pt_fail(err, "rank %d: the task ran elsewhere", rank);
    return 0;
}

static void make_checked_world(checked_world *w, comm_threads **threads,
                               const pipeline_layout *layout, comm *handles)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    w->size = layout->rank_count;
    w->fail_open_rank = -1;
    pt_error err = {{0}};
    assert_int_equal(pipeline_layout_groups(layout, &w->groups, &err), 0);
    assert_int_equal(comm_threads_create(w->size, 30.0, threads, &err), 0);
    for (int rank = 0; rank < w->size; rank++) {
        w->inner[rank] = comm_threads_rank(*threads, rank);
        handles[rank] = (comm){.ops = &checked_ops, .shared = w,
                               .rank = rank, .size = w->size};
    }
}

static void free_checked_world(checked_world *w, comm_threads *threads)
{
    comm_groups_free(&w->groups);
    comm_threads_destroy(threads);
    pthread_mutex_destroy(&w->lock);
}

/* Two steps of pp 2 x dp 2 x tp 2 over the interposer. */
static void collectives_use_only_the_listed_groups(void **state)
{
    (void)state;
    pipeline_layout layout = make_layout(2, 2, 2);
    checked_world w;
    comm_threads *threads = NULL;
    comm handles[MAX_RANKS];
    make_checked_world(&w, &threads, &layout, handles);
    pipeline_launch launch = {
        .backend = BACKEND_CPU, .seed = SEED, .comms = handles,
        .hooks = {.open = open_hook, .close = close_hook, .data = &w}};
    pipeline_threads p;
    pt_error err = {{0}};
    if (pipeline_threads_start(&p, &layout, &launch, &err) != 0)
        fail_msg("start: %s", err.message);
    assert_null(p.world); /* the caller's comm, not a world of its own */
    size_t window = (size_t)layout.shape.seq + 1;
    uint32_t tokens[4 * 9];
    for (size_t i = 0; i < 4 * window; i++)
        tokens[i] = (uint32_t)(i * 7 % 31);
    train_config config = train_config_defaults();
    step_result result;
    for (int step = 0; step < 2; step++)
        if (pipeline_threads_step(&p, &config, tokens, &result, &err) != 0)
            fail_msg("step %d: %s", step, err.message);
    for (int rank = 0; rank < layout.rank_count; rank++)
        if (pipeline_threads_on_rank(&p, rank, same_thread_task, &w, &err) !=
            0)
            fail_msg("%s", err.message);
    pipeline_threads_destroy(&p);
    assert_true(w.collectives > 0);
    assert_int_equal(w.unknown_groups, 0);
    assert_int_equal(w.closed_elsewhere, 0);
    for (int rank = 0; rank < layout.rank_count; rank++) {
        assert_int_equal(w.opens[rank], 1);
        assert_int_equal(w.closes[rank], 1);
    }
    free_checked_world(&w, threads);
}

/* One launcher per rank (launch.this_rank_only), as each process of an
 * mpirun job makes: here two launchers over one threads world, stepped
 * from two threads, must train exactly as one launcher of both ranks. */
typedef struct own_rank_run {
    pipeline_threads launcher;
    const uint32_t *tokens;
    float losses[2];
    int status;
    pt_error err;
} own_rank_run;

static void *step_own_rank(void *data)
{
    own_rank_run *run = data;
    train_config config = train_config_defaults();
    for (int step = 0; step < 2 && run->status == 0; step++) {
        step_result result;
        run->status = pipeline_threads_step(&run->launcher, &config,
                                            run->tokens, &result, &run->err);
        run->losses[step] = result.loss;
    }
    return NULL;
}

static void one_launcher_per_rank_trains_like_one_for_all(void **state)
{
    (void)state;
    pipeline_layout layout = make_layout(1, 1, 2);
    size_t window = (size_t)layout.shape.seq + 1;
    uint32_t tokens[2 * 9];
    for (size_t i = 0; i < 2 * window; i++)
        tokens[i] = (uint32_t)(i * 5 % 31);
    pt_error err = {{0}};
    pipeline_threads all;
    if (pipeline_threads_create(&all, &layout, BACKEND_CPU, SEED, 60.0,
                                &err) != 0)
        fail_msg("start: %s", err.message);
    assert_int_equal(all.first_local_rank, 0);
    assert_int_equal(all.local_rank_count, 2);
    train_config config = train_config_defaults();
    float expected[2];
    for (int step = 0; step < 2; step++) {
        step_result result;
        if (pipeline_threads_step(&all, &config, tokens, &result, &err) != 0)
            fail_msg("step: %s", err.message);
        expected[step] = result.loss;
    }
    pipeline_threads_destroy(&all);

    comm_threads *world = NULL;
    if (comm_threads_create(2, 60.0, &world, &err) != 0)
        fail_msg("%s", err.message);
    own_rank_run runs[2];
    memset(runs, 0, sizeof runs);
    for (int rank = 0; rank < 2; rank++) {
        comm own = comm_threads_rank(world, rank);
        pipeline_launch launch = {.backend = BACKEND_CPU, .seed = SEED,
                                  .comms = &own, .this_rank_only = true};
        if (pipeline_threads_start(&runs[rank].launcher, &layout, &launch,
                                   &err) != 0)
            fail_msg("rank %d: %s", rank, err.message);
        assert_int_equal(runs[rank].launcher.first_local_rank, rank);
        assert_int_equal(runs[rank].launcher.local_rank_count, 1);
        runs[rank].tokens = tokens;
    }
    /* a launcher runs tasks on its own rank only */
    assert_int_equal(pipeline_threads_on_rank(&runs[0].launcher, 1,
                                              same_thread_task, NULL, &err),
                     -1);
    assert_non_null(strstr(err.message, "no rank 1"));
    pthread_t threads[2];
    for (int rank = 0; rank < 2; rank++)
        assert_int_equal(pthread_create(&threads[rank], NULL, step_own_rank,
                                        &runs[rank]),
                         0);
    for (int rank = 0; rank < 2; rank++)
        pthread_join(threads[rank], NULL);
    for (int rank = 0; rank < 2; rank++) {
        if (runs[rank].status != 0)
            fail_msg("rank %d: %s", rank, runs[rank].err.message);
        for (int step = 0; step < 2; step++)
            assert_true(runs[rank].losses[step] == expected[step]);
        pipeline_threads_destroy(&runs[rank].launcher);
    }
    comm_threads_destroy(world);
}

static void failed_hook_stops_the_start(void **state)
{
    (void)state;
    pipeline_layout layout = make_layout(1, 2, 2);
    checked_world w;
    comm_threads *threads = NULL;
    comm handles[MAX_RANKS];
    make_checked_world(&w, &threads, &layout, handles);
    w.fail_open_rank = 2;
    pipeline_launch launch = {
        .backend = BACKEND_CPU, .seed = SEED, .comms = handles,
        .hooks = {.open = open_hook, .close = close_hook, .data = &w}};
    pipeline_threads p;
    pt_error err = {{0}};
    assert_int_equal(pipeline_threads_start(&p, &layout, &launch, &err), -1);
    assert_non_null(strstr(err.message, "rank 2: no device for this rank"));
    for (int rank = 0; rank < layout.rank_count; rank++)
        assert_int_equal(w.closes[rank], 1);
    pipeline_threads_destroy(&p); /* safe on a failed start */
    free_checked_world(&w, threads);
}

/* -------------------------------------------------- device assignment */

/* The 2 x H200 machine as a heterogeneous pair (clusters/), pp 2: rank 0
 * on the full GPU 0, rank 1 on GPU 1 with 40 SMs and 48 GiB. */
static void devices_come_from_the_cluster_file(void **state)
{
    (void)state;
    char text[1024];
    snprintf(text, sizeof text,
             "{ \"model\": \"%s/models/gpt2-124m.json\","
             "  \"cluster\": \"%s/clusters/h200x2-hetero.json\","
             "  \"gbs\": 8, \"mbs\": 1, \"tp\": 1, \"dp\": 1, \"pp\": 2 }",
             PARTITA_SOURCE_ROOT, PARTITA_SOURCE_ROOT);
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    assert_non_null(root);
    plan p;
    pt_error err = {{0}};
    if (plan_from_json(root, "plan.json", &p, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
    device_spec spec;
    assert_int_equal(plan_rank_device(&p, 0, &spec), 0);
    assert_int_equal(spec.index, 0);
    assert_int_equal(spec.sm_limit, 0);
    assert_true(spec.memory_limit_gib == 0.0);
    assert_int_equal(plan_rank_device(&p, 1, &spec), 0);
    assert_int_equal(spec.index, 1);
    assert_int_equal(spec.sm_limit, 40);
    assert_true(spec.memory_limit_gib == 48.0);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(groups_of_a_full_layout),
        cmocka_unit_test(groups_equal_to_the_world_are_left_out),
        cmocka_unit_test(collectives_use_only_the_listed_groups),
        cmocka_unit_test(one_launcher_per_rank_trains_like_one_for_all),
        cmocka_unit_test(failed_hook_stops_the_start),
        cmocka_unit_test(devices_come_from_the_cluster_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
