/*
 * The launcher that runs every rank of a layout (or, one process per
 * rank, this process's one) on a thread of its own, each owning its
 * stage, over the threads comm or a comm the caller made (NCCL, MPI,
 * host-staged). docs/executor.md ("Every rank in one process").
 */
#include "executor/parallel/parallel.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* -------------------------------------------------------------- launcher */

typedef enum worker_command {
    COMMAND_STEP,
    COMMAND_TASK,
    COMMAND_EXIT
} worker_command;

/* What the rank threads are told to do; each copies it under the lock
 * when it sees a new generation, so the next order cannot change it under
 * a slow reader. */
typedef struct worker_order {
    worker_command command;
    /* COMMAND_STEP */
    const train_config *config;
    const uint32_t *tokens;
    double step_start_s;
    int inject_failure_rank;
    /* COMMAND_TASK: one rank runs it */
    int task_rank;
    pipeline_rank_task task;
    void *task_data;
    pt_error *task_err;
} worker_order;

/* One rank's thread. */
typedef struct rank_worker {
    struct pipeline_workers *all;
    int rank;
    pthread_t thread;
    bool started;
    step_result result;          /* of the last step */
} rank_worker;

/* The rank threads and the order they are given. The main thread posts
 * an order (bumping generation) and waits until `pending` ranks have
 * carried it out; everything here is read and written under lock. */
struct pipeline_workers {
    pipeline_threads *owner;
    pipeline_launch launch;
    pthread_mutex_t lock;
    pthread_cond_t posted;       /* a new order */
    pthread_cond_t done;         /* pending went down */
    long generation;
    worker_order order;
    int pending;
    int task_status;             /* of the last COMMAND_TASK */
    rank_worker *ranks;          /* rank_count */
};

/* The interleaved 1F1B's chunks 1..v-1 of a rank (chunk 0 is its
 * stage): made, initialised and attached on the rank's thread, or
 * destroyed (count: how many were made). */
model_stage *pipeline_threads_chunk(pipeline_threads *p, int rank,
                                    int chunk)
{
    int v = pipeline_chunk_count(&p->layout);
    return chunk == 0 ? &p->stages[rank]
                      : &p->chunk_stages[(size_t)rank * (v - 1) + chunk - 1];
}

static void destroy_chunks(pipeline_threads *p, int rank, int count)
{
    for (int c = 1; c < count; c++)
        model_stage_destroy(pipeline_threads_chunk(p, rank, c));
}

static int set_up_chunks(pipeline_threads *p, int rank,
                         const pipeline_launch *launch, pt_error *err)
{
    int v = pipeline_chunk_count(&p->layout);
    for (int c = 1; c < v; c++) {
        model_stage *chunk = pipeline_threads_chunk(p, rank, c);
        if (pipeline_chunk_stage_create(chunk, &p->layout, rank, c,
                                        launch->backend, launch->seed,
                                        err) != 0) {
            destroy_chunks(p, rank, c);
            return -1;
        }
        if (pipeline_stage_attach(&p->layout, chunk, &p->comms[rank], err) !=
            0) {
            destroy_chunks(p, rank, c + 1);
            return -1;
        }
    }
    return 0;
}

/* A rank's part of pipeline_threads_start, on its own thread: the open
 * hook, its stage (and chunks), its events, its comm. */
static int set_up_rank(rank_worker *w, pt_error *err)
{
    struct pipeline_workers *all = w->all;
    pipeline_threads *p = all->owner;
    const pipeline_launch *launch = &all->launch;
    if (launch->hooks.open != NULL &&
        launch->hooks.open(launch->hooks.data, w->rank, err) != 0)
        return -1;
    if (pipeline_stage_create(&p->stages[w->rank], &p->layout, w->rank,
                              launch->backend, launch->seed, err) != 0)
        return -1;
    if (pipeline_events_reserve(&p->events[w->rank], &p->layout, err) != 0 ||
        pipeline_stage_attach(&p->layout, &p->stages[w->rank],
                              &p->comms[w->rank], err) != 0 ||
        pipeline_grad_buckets(&p->stages[w->rank], launch->grad_bucket_bytes,
                              &p->buckets[w->rank], err) != 0 ||
        set_up_chunks(p, w->rank, launch, err) != 0) {
        model_stage_destroy(&p->stages[w->rank]);
        return -1;
    }
    return 0;
}

/* Counts one rank's part of the current command as done; lock held. */
static void finish_part(struct pipeline_workers *all)
{
    if (--all->pending == 0)
        pthread_cond_broadcast(&all->done);
}

static void run_order(rank_worker *w, const worker_order *order)
{
    struct pipeline_workers *all = w->all;
    pipeline_threads *p = all->owner;
    int task_status = 0;
    if (order->command == COMMAND_TASK) {
        if (order->task_rank != w->rank)
            return;
        task_status = order->task(order->task_data, w->rank,
                                  &p->stages[w->rank], order->task_err);
    } else {
        p->rank_errors[w->rank].message[0] = '\0';
        pipeline_grad_sync sync = {.buckets = &p->buckets[w->rank],
                                   .overlap = &all->launch.overlap};
        model_stage *chunks[PIPELINE_MAX_CHUNKS];
        int v = pipeline_chunk_count(&p->layout);
        for (int c = 0; c < v; c++)
            chunks[c] = pipeline_threads_chunk(p, w->rank, c);
        p->rank_status[w->rank] = pipeline_rank_step_chunks(
            &p->layout, chunks, v, &p->comms[w->rank], order->config,
            order->tokens, order->step_start_s,
            w->rank == order->inject_failure_rank, &sync, &w->result,
            &p->events[w->rank], &p->rank_errors[w->rank]);
    }
    pthread_mutex_lock(&all->lock);
    if (order->command == COMMAND_TASK)
        all->task_status = task_status;
    finish_part(all);
    pthread_mutex_unlock(&all->lock);
}

static void *worker_main(void *argument)
{
    rank_worker *w = argument;
    struct pipeline_workers *all = w->all;
    pipeline_threads *p = all->owner;
    int status = set_up_rank(w, &p->rank_errors[w->rank]);
    pthread_mutex_lock(&all->lock);
    p->rank_status[w->rank] = status;
    long seen = all->generation;
    finish_part(all);
    for (;;) {
        while (all->generation == seen)
            pthread_cond_wait(&all->posted, &all->lock);
        seen = all->generation;
        worker_order order = all->order;
        if (order.command == COMMAND_EXIT)
            break;
        pthread_mutex_unlock(&all->lock);
        run_order(w, &order);
        pthread_mutex_lock(&all->lock);
    }
    pthread_mutex_unlock(&all->lock);
    if (status == 0) {
        destroy_chunks(p, w->rank, pipeline_chunk_count(&p->layout));
        model_stage_destroy(&p->stages[w->rank]);
    }
    if (all->launch.hooks.close != NULL)
        all->launch.hooks.close(all->launch.hooks.data, w->rank);
    return NULL;
}

/* Posts an order that `parts` ranks carry out and waits for them. */
static void post_order(struct pipeline_workers *all,
                       const worker_order *order, int parts)
{
    pthread_mutex_lock(&all->lock);
    all->order = *order;
    all->pending = parts;
    all->generation++;
    pthread_cond_broadcast(&all->posted);
    while (all->pending > 0)
        pthread_cond_wait(&all->done, &all->lock);
    pthread_mutex_unlock(&all->lock);
}

static int allocate_launcher(pipeline_threads *out, int ranks, pt_error *err)
{
    out->stages = calloc((size_t)ranks, sizeof *out->stages);
    out->chunk_stages =
        calloc((size_t)ranks * (pipeline_chunk_count(&out->layout) - 1) + 1,
               sizeof *out->chunk_stages);
    out->events = calloc((size_t)ranks, sizeof *out->events);
    out->rank_errors = calloc((size_t)ranks, sizeof *out->rank_errors);
    out->rank_status = calloc((size_t)ranks, sizeof *out->rank_status);
    out->comms = calloc((size_t)ranks, sizeof *out->comms);
    out->buckets = calloc((size_t)ranks, sizeof *out->buckets);
    struct pipeline_workers *all = calloc(1, sizeof *all);
    if (all != NULL)
        all->ranks = calloc((size_t)ranks, sizeof *all->ranks);
    if (out->stages == NULL || out->chunk_stages == NULL ||
        out->events == NULL ||
        out->rank_errors == NULL || out->rank_status == NULL ||
        out->comms == NULL || out->buckets == NULL || all == NULL ||
        all->ranks == NULL) {
        if (all != NULL)
            free(all->ranks);
        free(all);
        return pt_fail(err, "pipeline runtime: out of memory for %d ranks",
                       ranks);
    }
    pthread_mutex_init(&all->lock, NULL);
    pthread_cond_init(&all->posted, NULL);
    pthread_cond_init(&all->done, NULL);
    all->owner = out;
    out->workers = all;
    return 0;
}

/* Each rank's handle: the caller's, or of a threads world made here. */
static int set_up_comms(pipeline_threads *out, const pipeline_launch *launch,
                        pt_error *err)
{
    int ranks = out->layout.rank_count;
    out->first_local_rank = 0;
    out->local_rank_count = ranks;
    if (launch->comms != NULL && launch->this_rank_only) {
        const comm *own = &launch->comms[0];
        if (own->size != ranks || own->rank < 0 || own->rank >= ranks)
            return pt_fail(err, "pipeline runtime: this process is rank %d "
                                "of %d, the layout has %d ranks",
                           own->rank, own->size, ranks);
        out->comms[own->rank] = *own;
        out->first_local_rank = own->rank;
        out->local_rank_count = 1;
        return 0;
    }
    if (launch->comms != NULL) {
        memcpy(out->comms, launch->comms, (size_t)ranks * sizeof *out->comms);
        for (int rank = 0; rank < ranks; rank++)
            if (out->comms[rank].rank != rank ||
                out->comms[rank].size != ranks)
                return pt_fail(err, "pipeline runtime: comm %d is rank %d "
                                    "of %d, the layout has %d ranks",
                               rank, out->comms[rank].rank,
                               out->comms[rank].size, ranks);
        return 0;
    }
    if (comm_threads_create(ranks, launch->timeout_s, &out->world, err) != 0)
        return -1;
    for (int rank = 0; rank < ranks; rank++)
        out->comms[rank] = comm_threads_rank(out->world, rank);
    return 0;
}

/* Starts every local rank's thread and waits until each has set itself
 * up. */
static void start_workers(pipeline_threads *out)
{
    struct pipeline_workers *all = out->workers;
    int first = out->first_local_rank;
    pthread_mutex_lock(&all->lock);
    all->pending = out->local_rank_count;
    pthread_mutex_unlock(&all->lock);
    for (int rank = first; rank < first + out->local_rank_count; rank++) {
        rank_worker *w = &all->ranks[rank];
        w->all = all;
        w->rank = rank;
        w->started = pthread_create(&w->thread, NULL, worker_main, w) == 0;
        if (w->started)
            continue;
        pthread_mutex_lock(&all->lock);
        out->rank_status[rank] = -1;
        pt_fail(&out->rank_errors[rank], "cannot start its thread");
        finish_part(all);
        pthread_mutex_unlock(&all->lock);
    }
    pthread_mutex_lock(&all->lock);
    while (all->pending > 0)
        pthread_cond_wait(&all->done, &all->lock);
    pthread_mutex_unlock(&all->lock);
}

int pipeline_threads_start(pipeline_threads *out,
                           const pipeline_layout *layout,
                           const pipeline_launch *launch, pt_error *err)
{
    memset(out, 0, sizeof *out);
    out->layout = *layout;
    out->inject_failure_rank = -1;
    int ranks = layout->rank_count;
    if (allocate_launcher(out, ranks, err) != 0 ||
        set_up_comms(out, launch, err) != 0) {
        pipeline_threads_destroy(out);
        return -1;
    }
    out->workers->launch = *launch;
    start_workers(out);
    for (int rank = out->first_local_rank;
         rank < out->first_local_rank + out->local_rank_count; rank++)
        if (out->rank_status[rank] != 0) {
            pt_fail(err, "rank %d: %s", rank,
                    out->rank_errors[rank].message);
            pipeline_threads_destroy(out);
            return -1;
        }
    return 0;
}

int pipeline_threads_create(pipeline_threads *out,
                            const pipeline_layout *layout,
                            backend_kind backend, uint64_t seed,
                            double timeout_s, pt_error *err)
{
    pipeline_launch launch = {.backend = backend, .seed = seed,
                              .timeout_s = timeout_s};
    return pipeline_threads_start(out, layout, &launch, err);
}

int pipeline_threads_step(pipeline_threads *p, const train_config *config,
                          const uint32_t *tokens, step_result *out,
                          pt_error *err)
{
    struct pipeline_workers *all = p->workers;
    int first = p->first_local_rank;
    const comm *local = &p->comms[first];
    if (comm_failed_rank(local, NULL, 0) >= 0)
        return pt_fail(err, "pipeline runtime: a rank failed in an earlier "
                            "step; the world is unusable");
    worker_order order = {.command = COMMAND_STEP,
                          .config = config,
                          .tokens = tokens,
                          .step_start_s = pt_monotonic_seconds(),
                          .inject_failure_rank = p->inject_failure_rank};
    post_order(all, &order, p->local_rank_count);
    char reason[sizeof err->message];
    if (comm_failed_rank(local, reason, sizeof reason) >= 0)
        return pt_fail(err, "%s", reason);
    for (int rank = first; rank < first + p->local_rank_count; rank++)
        if (p->rank_status[rank] != 0)
            return pt_fail(err, "%s", p->rank_errors[rank].message);
    *out = all->ranks[first].result;
    return 0;
}

int pipeline_threads_on_rank(pipeline_threads *p, int rank,
                             pipeline_rank_task task, void *data,
                             pt_error *err)
{
    struct pipeline_workers *all = p->workers;
    if (all == NULL || rank < p->first_local_rank ||
        rank >= p->first_local_rank + p->local_rank_count)
        return pt_fail(err, "pipeline runtime: no rank %d to run a task on",
                       rank);
    worker_order order = {.command = COMMAND_TASK,
                          .task_rank = rank,
                          .task = task,
                          .task_data = data,
                          .task_err = err};
    post_order(all, &order, 1);
    pthread_mutex_lock(&all->lock);
    int status = all->task_status;
    pthread_mutex_unlock(&all->lock);
    return status;
}

void pipeline_threads_destroy(pipeline_threads *p)
{
    struct pipeline_workers *all = p->workers;
    if (all != NULL) {
        pthread_mutex_lock(&all->lock);
        all->order = (worker_order){.command = COMMAND_EXIT};
        all->generation++;
        pthread_cond_broadcast(&all->posted);
        pthread_mutex_unlock(&all->lock);
        for (int rank = 0; rank < p->layout.rank_count; rank++)
            if (all->ranks[rank].started)
                pthread_join(all->ranks[rank].thread, NULL);
        pthread_cond_destroy(&all->posted);
        pthread_cond_destroy(&all->done);
        pthread_mutex_destroy(&all->lock);
        free(all->ranks);
        free(all);
    }
    if (p->events != NULL)
        for (int rank = 0; rank < p->layout.rank_count; rank++)
            pipeline_events_free(&p->events[rank]);
    if (p->buckets != NULL)
        for (int rank = 0; rank < p->layout.rank_count; rank++)
            pipeline_buckets_free(&p->buckets[rank]);
    comm_threads_destroy(p->world);
    free(p->stages);
    free(p->chunk_stages);
    free(p->events);
    free(p->rank_errors);
    free(p->rank_status);
    free(p->comms);
    free(p->buckets);
    memset(p, 0, sizeof *p);
}
