/*
 * A small parallel loop over work items for the search: items are taken
 * in order from a shared counter, so which thread runs an item never
 * changes what the item computes; callers merge per-worker results in a
 * fixed order afterwards.
 */
#include "planner/internal.h"

#include <glpk.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* The loop shared by every thread. */
typedef struct parallel_job {
    parallel_work work;
    void *context;
    int item_count;
    atomic_int next_item;
} parallel_job;

/* What one spawned thread needs. */
typedef struct parallel_thread {
    parallel_job *job;
    int worker;
    pthread_t handle;
} parallel_thread;

static void run_items(parallel_job *job, int worker)
{
    for (;;) {
        int item = atomic_fetch_add(&job->next_item, 1);
        if (item >= job->item_count)
            return;
        job->work(job->context, worker, item);
    }
}

static void *thread_main(void *argument)
{
    parallel_thread *thread = argument;
    run_items(thread->job, thread->worker);
    /* a thread that solved ILPs holds a GLPK environment of its own */
    glp_free_env();
    return NULL;
}

int search_thread_count(int requested)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = online > 0 ? (int)online : 1;
    /* each thread holds a cost model: more than the cores only costs */
    return requested > 0 && requested < cores ? requested : cores;
}

int parallel_for(int threads, int item_count, parallel_work work,
                 void *context, pt_error *err)
{
    parallel_job job = {work, context, item_count, 0};
    if (threads > item_count)
        threads = item_count > 0 ? item_count : 1;
    parallel_thread *spawned = NULL;
    int started = 0;
    if (threads > 1) {
        spawned = calloc((size_t)threads - 1, sizeof *spawned);
        if (spawned == NULL)
            return pt_fail(err, "search: out of memory for %d threads",
                           threads);
    }
    for (int t = 1; t < threads; t++) {
        spawned[t - 1].job = &job;
        spawned[t - 1].worker = t;
        if (pthread_create(&spawned[t - 1].handle, NULL, thread_main,
                           &spawned[t - 1]) != 0)
            break;
        started++;
    }
    /* the calling thread works too; with fewer threads than asked the
       items still all get done, only slower */
    run_items(&job, 0);
    for (int t = 0; t < started; t++)
        pthread_join(spawned[t].handle, NULL);
    free(spawned);
    return 0;
}
