/*
 * The world of the NCCL comm: argument checks, the cliques of ranks that
 * get a communicator, making them (one process for every rank, or one
 * process per rank with the ids over MPI), the record of the first
 * failure, each rank's streams, events and staging buffers on its own
 * thread, and the world's end. The operations are comm/nccl.c's.
 */
#include "executor/comm/device_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ arguments */

static int check_group(int size, const int *members, int count, int group,
                       pt_error *err)
{
    if (count < 2)
        return pt_fail(err, "nccl comm: group %d has %d rank%s; a group "
                            "needs at least 2",
                       group, count, count == 1 ? "" : "s");
    for (int i = 0; i < count; i++) {
        if (members[i] < 0 || members[i] >= size)
            return pt_fail(err, "nccl comm: group %d: rank %d is not one of "
                                "the %d",
                           group, members[i], size);
        for (int j = 0; j < i; j++)
            if (members[j] == members[i])
                return pt_fail(err, "nccl comm: group %d: rank %d appears "
                                    "twice",
                               group, members[i]);
    }
    return 0;
}

int comm_nccl_check_arguments(int size, const int *devices, int device_count,
                              const comm_groups *groups, pt_error *err)
{
    if (size < 2)
        return pt_fail(err, "nccl comm: a world needs at least 2 ranks, got "
                            "%d (one rank needs no comm)",
                       size);
    for (int rank = 0; rank < size; rank++) {
        if (devices[rank] < 0 || devices[rank] >= device_count)
            return pt_fail(err, "nccl comm: rank %d is on cuda device %d, "
                                "which does not exist (%d visible)",
                           rank, devices[rank], device_count);
        for (int other = 0; other < rank; other++)
            if (devices[other] == devices[rank])
                return pt_fail(err, "nccl comm: ranks %d and %d are both on "
                                    "cuda device %d; NCCL runs one rank per "
                                    "device",
                               other, rank, devices[rank]);
    }
    for (int g = 0; groups != NULL && g < groups->count; g++)
        if (check_group(size, groups->members + groups->offsets[g],
                        groups->offsets[g + 1] - groups->offsets[g], g,
                        err) != 0)
            return -1;
    return 0;
}

/* ---------------------------------------------------------- bookkeeping */

/* The collective clique, lean or not, whose members are exactly
 * `sorted`, or -1. */
static int find_clique_of(const comm_nccl *world, const int *sorted,
                          int count, bool lean)
{
    for (int k = 0; k < world->clique_count; k++) {
        if (k == CLIQUE_TO_HIGHER || k == CLIQUE_TO_LOWER)
            continue;
        const nccl_clique *q = &world->cliques[k];
        if ((q->max_ctas > 0) == lean && q->size == count &&
            memcmp(q->members, sorted, (size_t)count * sizeof *sorted) == 0)
            return k;
    }
    return -1;
}

int nccl_find_clique(const comm_nccl *world, const int *sorted, int count)
{
    return find_clique_of(world, sorted, count, false);
}

int nccl_find_lean_clique(const comm_nccl *world, const int *sorted,
                          int count)
{
    return find_clique_of(world, sorted, count, true);
}

/* NCCL's maxCTAs config came with 2.17: before it, no lean twins. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 17, 0)
#define HAVE_MAX_CTAS 1
#else
#define HAVE_MAX_CTAS 0
#endif

static void set_max_ctas(ncclConfig_t *config, int max_ctas)
{
#if HAVE_MAX_CTAS
    if (max_ctas > 0)
        config->maxCTAs = max_ctas;
#else
    (void)config;
    (void)max_ctas;
#endif
}

/* PARTITA_NCCL_LEAN_CTAS: the CTAs of each group's lean twin (0: no
 * twins). Every process of a world must see the same value. */
static int lean_ctas(pt_error *err)
{
    long ctas = 0;
    if (pt_env_count("PARTITA_NCCL_LEAN_CTAS", "CTAs", 64, 0, &ctas, err) !=
        0)
        return -1;
    if (ctas > 0 && !HAVE_MAX_CTAS)
        return pt_fail(err, "PARTITA_NCCL_LEAN_CTAS: this NCCL (%d) has no "
                            "maxCTAs config (2.17 on)",
                       NCCL_VERSION_CODE);
    return (int)ctas;
}

static int add_clique(comm_nccl *world, const char *name, const int *members,
                      int count, pt_error *err)
{
    nccl_clique *q = &world->cliques[world->clique_count];
    q->members = malloc((size_t)count * sizeof *q->members);
    q->comms = calloc((size_t)count, sizeof *q->comms);
    if (q->members == NULL || q->comms == NULL) {
        free(q->members);
        free(q->comms);
        return pt_fail(err, "nccl comm: out of memory");
    }
    memcpy(q->members, members, (size_t)count * sizeof *members);
    qsort(q->members, (size_t)count, sizeof *q->members, nccl_compare_ints);
    q->size = count;
    snprintf(q->name, sizeof q->name, "%s", name);
    world->clique_count++;
    return 0;
}

/* The world, the two message cliques and each distinct group (with
 * PARTITA_NCCL_LEAN_CTAS, each group of two or more then a lean twin:
 * the same members, NCCL's maxCTAs that many). */
static int plan_cliques(comm_nccl *world, const comm_groups *groups,
                        pt_error *err)
{
    int group_count = groups != NULL ? groups->count : 0;
    int twin_ctas = lean_ctas(err);
    if (twin_ctas < 0)
        return -1;
    world->cliques = calloc((size_t)(FIXED_CLIQUES + 2 * group_count),
                            sizeof *world->cliques);
    int *everyone = malloc((size_t)world->size * sizeof *everyone);
    if (world->cliques == NULL || everyone == NULL) {
        free(everyone);
        return pt_fail(err, "nccl comm: out of memory");
    }
    for (int rank = 0; rank < world->size; rank++)
        everyone[rank] = rank;
    int status = add_clique(world, "world", everyone, world->size, err);
    if (status == 0)
        status = add_clique(world, "messages to higher ranks", everyone,
                            world->size, err);
    if (status == 0)
        status = add_clique(world, "messages to lower ranks", everyone,
                            world->size, err);
    free(everyone);
    for (int g = 0; status == 0 && g < group_count; g++) {
        int count = groups->offsets[g + 1] - groups->offsets[g];
        int *sorted = malloc((size_t)count * sizeof *sorted);
        if (sorted == NULL)
            return pt_fail(err, "nccl comm: out of memory");
        memcpy(sorted, groups->members + groups->offsets[g],
               (size_t)count * sizeof *sorted);
        qsort(sorted, (size_t)count, sizeof *sorted, nccl_compare_ints);
        char name[32];
        snprintf(name, sizeof name, "group %d", g);
        if (nccl_find_clique(world, sorted, count) < 0)
            status = add_clique(world, name, sorted, count, err);
        if (status == 0 && twin_ctas > 0 && count > 1 &&
            nccl_find_lean_clique(world, sorted, count) < 0) {
            snprintf(name, sizeof name, "group %d, lean", g);
            status = add_clique(world, name, sorted, count, err);
            if (status == 0)
                world->cliques[world->clique_count - 1].max_ctas = twin_ctas;
        }
        free(sorted);
    }
    return status;
}

/* ------------------------------------------------------------- failure */

/* Records the first failure of the world. */
void nccl_mark_failed(comm_nccl *world, int rank, const char *reason)
{
    pthread_mutex_lock(&world->lock);
    bool first = comm_failure_mark(&world->failure, &world->failed, NULL,
                                   rank, reason);
    pthread_mutex_unlock(&world->lock);
    /* the other processes' waits end too */
    if (first && world->has_processes && rank == world->process_rank)
        comm_abort(&world->processes, reason);
}

/* One process per rank: another process's failure, announced over MPI,
 * fails this world as well. */
void nccl_watch_other_processes(comm_nccl *world)
{
    if (!world->has_processes || atomic_load(&world->failed))
        return;
    char reason[COMM_FAILURE_REASON_MAX];
    int failed = comm_failed_rank(&world->processes, reason, sizeof reason);
    if (failed >= 0)
        nccl_mark_failed(world, failed, reason);
}

/* NCCL aborts the communicators of one group call together (2.22 on). A
 * rank whose operations are in flight on two communicators (a send to a
 * higher rank waiting on one, a receive from it on the other) must abort
 * both so: aborted one after the other, the first abort can wait forever
 * on the second communicator's kernel (the failing-rank check of
 * test_nccl_parallel never returned on 2026-11-28). */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 22, 0)
#define ABORT_GROUP_START() ncclGroupStart()
#define ABORT_GROUP_END() ncclGroupEnd()
#else
#define ABORT_GROUP_START() ((void)0)
#define ABORT_GROUP_END() ((void)0)
#endif

/* Aborts every communicator of the rank (on its own thread) in one group
 * call: its kernels stop waiting on peers, and the handles are gone. */
void nccl_abort_rank_comms(comm_nccl *world, int rank)
{
    ABORT_GROUP_START();
    for (int k = 0; k < world->clique_count; k++) {
        nccl_clique *q = &world->cliques[k];
        for (int i = 0; i < q->size; i++)
            if (q->members[i] == rank && q->comms[i] != NULL) {
                ncclCommAbort(q->comms[i]);
                q->comms[i] = NULL;
                world->ranks[rank].aborted++;
            }
    }
    ABORT_GROUP_END();
}

/* ---------------------------------------------------------------- world */

/* Making a communicator starts NCCL's threads and, the first time, the
 * CUDA contexts: a short comm timeout (a test's) must not cut it off. */
#define INIT_TIMEOUT_MIN_S 120.0

static double init_timeout_s(const comm_nccl *world)
{
    return world->timeout_s > INIT_TIMEOUT_MIN_S ? world->timeout_s
                                                 : INIT_TIMEOUT_MIN_S;
}

/* Makes clique q's communicators from this thread: one ncclCommInitRank
 * per member inside a group call, then polls each until it is ready. */
static int init_clique(comm_nccl *world, nccl_clique *q, pt_error *err)
{
    ncclUniqueId id;
    ncclResult_t status = ncclGetUniqueId(&id);
    if (status != ncclSuccess)
        return pt_fail(err, "nccl comm: ncclGetUniqueId for the %s "
                            "communicator failed: %s",
                       q->name, ncclGetErrorString(status));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = q->name;
    set_max_ctas(&config, q->max_ctas);
    cudaError_t set = cudaSuccess;
    ncclGroupStart();
    for (int i = 0; i < q->size && status == ncclSuccess; i++) {
        set = cudaSetDevice(world->devices[q->members[i]]);
        if (set != cudaSuccess)
            break;
        status = ncclCommInitRankConfig(&q->comms[i], q->size, id, i,
                                        &config);
        if (status == ncclInProgress)
            status = ncclSuccess;
    }
    ncclResult_t ended = ncclGroupEnd();
    if (set != cudaSuccess)
        return pt_fail(err, "nccl comm: making the %s communicator: "
                            "cudaSetDevice: %s",
                       q->name, cudaGetErrorString(set));
    if (status == ncclSuccess && ended != ncclInProgress)
        status = ended;
    double deadline = pt_monotonic_seconds() + init_timeout_s(world);
    for (int i = 0; i < q->size && status == ncclSuccess; i++) {
        ncclResult_t state = ncclInProgress;
        while (q->comms[i] != NULL && state == ncclInProgress) {
            if (ncclCommGetAsyncError(q->comms[i], &state) != ncclSuccess)
                state = ncclInternalError;
            if (state == ncclInProgress && pt_monotonic_seconds() > deadline)
                return pt_fail(err, "nccl comm: the %s communicator was not "
                                    "ready within %g s",
                               q->name, init_timeout_s(world));
            if (state == ncclInProgress) {
                struct timespec pause = {.tv_sec = 0, .tv_nsec = 1000000};
                nanosleep(&pause, NULL);
            }
        }
        status = state;
    }
    if (status != ncclSuccess)
        return pt_fail(err, "nccl comm: making the %s communicator of %d "
                            "ranks failed: %s (%s)",
                       q->name, q->size, ncclGetErrorString(status),
                       ncclGetLastError(NULL));
    return 0;
}

/* Every communicator left, in one group call (see
 * nccl_abort_rank_comms). */
static void abort_all(comm_nccl *world)
{
    ABORT_GROUP_START();
    for (int k = 0; k < world->clique_count; k++)
        for (int i = 0; i < world->cliques[k].size; i++)
            if (world->cliques[k].comms[i] != NULL) {
                ncclCommAbort(world->cliques[k].comms[i]);
                world->cliques[k].comms[i] = NULL;
            }
    ABORT_GROUP_END();
}

static void free_world(comm_nccl *world)
{
    for (int k = 0; world->cliques != NULL && k < world->clique_count;
         k++) {
        free(world->cliques[k].members);
        free(world->cliques[k].comms);
    }
    free(world->cliques);
    free(world->ranks);
    free(world->devices);
    pthread_mutex_destroy(&world->lock);
    free(world);
}

/* A world of `size` ranks with nothing opened yet: the state both
 * constructors share (NULL with err filled on failure). */
static comm_nccl *new_world(int size, double timeout_s, pt_error *err)
{
    comm_nccl *world = calloc(1, sizeof *world);
    if (world == NULL) {
        pt_fail(err, "nccl comm: out of memory");
        return NULL;
    }
    pthread_mutex_init(&world->lock, NULL);
    atomic_init(&world->failed, false);
    comm_failure_init(&world->failure);
    world->size = size;
    world->timeout_s = timeout_s;
    world->devices = malloc((size_t)size * sizeof *world->devices);
    world->ranks = calloc((size_t)size, sizeof *world->ranks);
    if (world->devices == NULL || world->ranks == NULL) {
        free_world(world);
        pt_fail(err, "nccl comm: out of memory");
        return NULL;
    }
    return world;
}

static int check_timeout(double timeout_s, pt_error *err)
{
    if (!(timeout_s > 0.0))
        return pt_fail(err, "nccl comm: the timeout must be positive, got "
                            "%g s",
                       timeout_s);
    return 0;
}

int comm_nccl_create(int size, const int *devices, const comm_groups *groups,
                     double timeout_s, comm_nccl **out, pt_error *err)
{
    *out = NULL;
    if (check_timeout(timeout_s, err) != 0 ||
        comm_nccl_check_arguments(size, devices, cuda_device_count(), groups,
                                  err) != 0)
        return -1;
    comm_nccl *world = new_world(size, timeout_s, err);
    if (world == NULL)
        return -1;
    memcpy(world->devices, devices, (size_t)size * sizeof *devices);
    int status = plan_cliques(world, groups, err);
    for (int k = 0; status == 0 && k < world->clique_count; k++)
        status = init_clique(world, &world->cliques[k], err);
    if (status != 0) {
        abort_all(world);
        free_world(world);
        return -1;
    }
    *out = world;
    return 0;
}

/* ------------------------------------------- one process per rank */

/* World rank 0 makes every clique's id (making one needs no membership)
 * and broadcasts them all at once; `made` tells the others whether it
 * could. */
typedef struct clique_ids {
    int made;
    ncclUniqueId ids[];
} clique_ids;

static int share_clique_ids(comm_nccl *world, clique_ids *shared,
                            size_t bytes, pt_error *err)
{
    char reason[300] = "";
    if (world->process_rank == 0) {
        shared->made = 1;
        for (int k = 0; k < world->clique_count && shared->made; k++) {
            ncclResult_t status = ncclGetUniqueId(&shared->ids[k]);
            if (status != ncclSuccess) {
                shared->made = 0;
                snprintf(reason, sizeof reason, "nccl comm: ncclGetUniqueId "
                                                "for the %s communicator "
                                                "failed: %s",
                         world->cliques[k].name, ncclGetErrorString(status));
            }
        }
    }
    if (comm_mpi_broadcast(&world->processes, shared, bytes, err) != 0)
        return -1;
    if (!shared->made)
        return pt_fail(err, "%s", reason[0] != '\0'
                                      ? reason
                                      : "nccl comm: rank 0 could not make "
                                        "the communicators' ids");
    return 0;
}

/* This process's member index in clique q, or -1. */
static int own_member(const comm_nccl *world, const nccl_clique *q)
{
    for (int i = 0; i < q->size; i++)
        if (q->members[i] == world->process_rank)
            return i;
    return -1;
}

/* Starts every communicator of the cliques this process is in, in one
 * group call (non-blocking: NCCL sets them up in the background, every
 * process in the same clique order). */
static int start_own_cliques(comm_nccl *world, const clique_ids *shared,
                             pt_error *err)
{
    cudaError_t set = cudaSetDevice(world->devices[world->process_rank]);
    if (set != cudaSuccess)
        return pt_fail(err, "rank %d: nccl comm: cudaSetDevice(%d): %s",
                       world->process_rank,
                       world->devices[world->process_rank],
                       cudaGetErrorString(set));
    ncclResult_t status = ncclGroupStart();
    for (int k = 0; k < world->clique_count && status == ncclSuccess; k++) {
        nccl_clique *q = &world->cliques[k];
        int member = own_member(world, q);
        if (member < 0)
            continue;
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        config.commName = q->name;
        set_max_ctas(&config, q->max_ctas);
        status = ncclCommInitRankConfig(&q->comms[member], q->size,
                                        shared->ids[k], member, &config);
        if (status == ncclInProgress)
            status = ncclSuccess;
    }
    ncclResult_t ended = ncclGroupEnd();
    if (status == ncclSuccess && ended != ncclInProgress)
        status = ended;
    if (status != ncclSuccess)
        return pt_fail(err, "rank %d: nccl comm: starting its "
                            "communicators failed: %s (%s)",
                       world->process_rank, ncclGetErrorString(status),
                       ncclGetLastError(NULL));
    return 0;
}

/* Polls this process's communicators until each is ready, another
 * process failed, or the set-up time is up. */
static int await_own_cliques(comm_nccl *world, pt_error *err)
{
    double deadline = pt_monotonic_seconds() + init_timeout_s(world);
    for (int k = 0; k < world->clique_count; k++) {
        nccl_clique *q = &world->cliques[k];
        int member = own_member(world, q);
        ncclResult_t state = member >= 0 ? ncclInProgress : ncclSuccess;
        while (state == ncclInProgress) {
            if (ncclCommGetAsyncError(q->comms[member], &state) !=
                ncclSuccess)
                state = ncclInternalError;
            nccl_watch_other_processes(world);
            if (atomic_load(&world->failed))
                return pt_fail(err, "rank %d: nccl comm: making the %s "
                                    "communicator: rank %d failed: %s",
                               world->process_rank, q->name,
                               world->failure.rank, world->failure.reason);
            if (state == ncclInProgress && pt_monotonic_seconds() > deadline)
                return pt_fail(err, "rank %d: nccl comm: the %s "
                                    "communicator was not ready within %g s "
                                    "(is every process of the job up?)",
                               world->process_rank, q->name,
                               init_timeout_s(world));
            struct timespec pause = {.tv_sec = 0, .tv_nsec = 1000000};
            if (state == ncclInProgress)
                nanosleep(&pause, NULL);
        }
        if (state != ncclSuccess)
            return pt_fail(err, "rank %d: nccl comm: making the %s "
                                "communicator of %d ranks failed: %s (%s)",
                           world->process_rank, q->name, q->size,
                           ncclGetErrorString(state),
                           ncclGetLastError(q->comms[member]));
    }
    return 0;
}

static int check_rank_arguments(int size, int rank, int device,
                                const comm_groups *groups,
                                const comm *processes, pt_error *err)
{
    if (size < 2 || rank < 0 || rank >= size || processes == NULL ||
        processes->rank != rank || processes->size != size)
        return pt_fail(err, "nccl comm: this process must be rank %d of a "
                            "world of %d ranks, one per process of the MPI "
                            "world (%d of %d)",
                       rank, size, processes != NULL ? processes->rank : -1,
                       processes != NULL ? processes->size : 0);
    int count = cuda_device_count();
    if (device < 0 || device >= count)
        return pt_fail(err, "rank %d: nccl comm: cuda device %d does not "
                            "exist on this host (%d visible)",
                       rank, device, count);
    for (int g = 0; groups != NULL && g < groups->count; g++)
        if (check_group(size, groups->members + groups->offsets[g],
                        groups->offsets[g + 1] - groups->offsets[g], g,
                        err) != 0)
            return -1;
    return 0;
}

int comm_nccl_create_rank(int size, int rank, int device,
                          const comm_groups *groups, double timeout_s,
                          const comm *processes, comm_nccl **out,
                          pt_error *err)
{
    *out = NULL;
    if (check_timeout(timeout_s, err) != 0 ||
        check_rank_arguments(size, rank, device, groups, processes, err) !=
            0)
        return -1;
    comm_nccl *world = new_world(size, timeout_s, err);
    if (world == NULL)
        return -1;
    world->has_processes = true;
    world->process_rank = rank;
    world->processes = *processes;
    for (int r = 0; r < size; r++)
        world->devices[r] = r == rank ? device : -1;
    int status = plan_cliques(world, groups, err);
    size_t bytes = sizeof(clique_ids) +
                   (size_t)world->clique_count * sizeof(ncclUniqueId);
    clique_ids *shared = status == 0 ? calloc(1, bytes) : NULL;
    if (status == 0 && shared == NULL)
        status = pt_fail(err, "nccl comm: out of memory for the ids");
    if (status == 0)
        status = share_clique_ids(world, shared, bytes, err);
    if (status == 0)
        status = start_own_cliques(world, shared, err);
    if (status == 0)
        status = await_own_cliques(world, err);
    free(shared);
    if (status != 0) {
        abort_all(world);
        free_world(world);
        return -1;
    }
    *out = world;
    return 0;
}

/* Finalizes every communicator, waits (within the timeout) until each is
 * quiescent, then destroys them; anything left over is aborted. */
static void finalize_all(comm_nccl *world)
{
    for (int k = 0; k < world->clique_count; k++)
        for (int i = 0; i < world->cliques[k].size; i++) {
            ncclComm_t comm = world->cliques[k].comms[i];
            if (comm != NULL) {
                ncclResult_t status = ncclCommFinalize(comm);
                if (status != ncclSuccess && status != ncclInProgress) {
                    ncclCommAbort(comm);
                    world->cliques[k].comms[i] = NULL;
                }
            }
        }
    double deadline = pt_monotonic_seconds() + world->timeout_s;
    for (int k = 0; k < world->clique_count; k++)
        for (int i = 0; i < world->cliques[k].size; i++) {
            ncclComm_t comm = world->cliques[k].comms[i];
            ncclResult_t state = ncclInProgress;
            while (comm != NULL && state == ncclInProgress &&
                   pt_monotonic_seconds() < deadline) {
                if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
                    state = ncclInternalError;
                struct timespec pause = {.tv_sec = 0, .tv_nsec = 100000};
                if (state == ncclInProgress)
                    nanosleep(&pause, NULL);
            }
            if (comm != NULL && state == ncclSuccess) {
                ncclCommDestroy(comm);
                world->cliques[k].comms[i] = NULL;
            }
        }
    abort_all(world);
}

void comm_nccl_destroy(comm_nccl *world)
{
    if (world == NULL)
        return;
    /* finalizing waits for every member: not once one was aborted */
    bool aborted = atomic_load(&world->failed);
    for (int rank = 0; rank < world->size; rank++)
        aborted = aborted || world->ranks[rank].aborted > 0;
    if (aborted)
        abort_all(world);
    else
        finalize_all(world);
    free_world(world);
}

/* ----------------------------------------------------------- rank state */

#define OPEN_TRY(call)                                                       \
    do {                                                                     \
        cudaError_t open_status_ = (call);                                   \
        if (open_status_ != cudaSuccess)                                     \
            return pt_fail(err, "rank %d: nccl comm: %s failed: %s", rank,   \
                           #call, cudaGetErrorString(open_status_));         \
    } while (0)

static int open_lane(message_lane *lane, int clique, int rank, pt_error *err)
{
    lane->clique = clique;
    if (cuda_rank_stream_create(&lane->stream, err) != 0)
        return -1;
    OPEN_TRY(cudaEventCreateWithFlags(&lane->received,
                                      cudaEventDisableTiming));
    return 0;
}

int comm_nccl_rank_open(comm_nccl *world, int rank, pt_error *err)
{
    if (rank < 0 || rank >= world->size)
        return pt_fail(err, "nccl comm: no rank %d in a world of %d", rank,
                       world->size);
    nccl_rank *r = &world->ranks[rank];
    if (r->open)
        return 0;
    int device = -1;
    OPEN_TRY(cudaGetDevice(&device));
    if (device != world->devices[rank])
        return pt_fail(err, "rank %d: nccl comm: the thread works on cuda "
                            "device %d, the rank's communicators are on "
                            "device %d (open the rank's device first)",
                       rank, device, world->devices[rank]);
    r->device = device;
    r->open = true; /* from here on, close frees what was made */
    if (cuda_rank_stream_create(&r->collective_stream, err) != 0 ||
        cuda_rank_stream_create(&r->copy_stream, err) != 0 ||
        open_lane(&r->lanes[0], CLIQUE_TO_HIGHER, rank, err) != 0 ||
        open_lane(&r->lanes[1], CLIQUE_TO_LOWER, rank, err) != 0)
        return -1;
    OPEN_TRY(cudaEventCreateWithFlags(&r->collective_done,
                                      cudaEventDisableTiming));
    OPEN_TRY(cudaEventCreateWithFlags(&r->copy_done,
                                      cudaEventDisableTiming));
    OPEN_TRY(cudaEventCreateWithFlags(&r->caller, cudaEventDisableTiming));
    size_t bytes = HOST_REDUCE_MAX * sizeof(double);
    if (comm_device_reserve(&r->memory, bytes, "the comm's scratch", err) !=
        0)
        return -1;
    r->scratch_count = HOST_REDUCE_MAX;
    OPEN_TRY(cudaMalloc((void **)&r->device_scratch, bytes));
    OPEN_TRY(cudaMallocHost((void **)&r->host_scratch, bytes));
    return 0;
}


static void close_lane(comm_nccl *world, int rank, message_lane *lane)
{
    for (int i = 0; i < lane->staging_count; i++) {
        staging_buffer *b = &lane->staging[i];
        comm_staging_free(&b->buffer, &world->ranks[rank].memory);
        cudaEventDestroy(b->sent);
    }
    if (lane->received != NULL)
        cudaEventDestroy(lane->received);
    if (lane->stream != NULL)
        cudaStreamDestroy(lane->stream);
    memset(lane, 0, sizeof *lane);
}

/* Whether a send of the rank was never taken by its receiver (or not
 * yet). */
static bool send_in_flight(const nccl_rank *r)
{
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < r->lanes[l].staging_count; i++) {
            const staging_buffer *b = &r->lanes[l].staging[i];
            if (b->used && cudaEventQuery(b->sent) != cudaSuccess)
                return true;
        }
    return false;
}

/* How long a send may take to finish after its receiver took it (the
 * sender's kernel ends a little after the receiver's). */
#define SEND_DRAIN_S 5.0

void comm_nccl_rank_abort_if_stuck(comm_nccl *world, int rank)
{
    if (rank < 0 || rank >= world->size)
        return;
    const nccl_rank *r = &world->ranks[rank];
    double deadline = pt_monotonic_seconds() + SEND_DRAIN_S;
    bool stuck = r->open && send_in_flight(r);
    while (stuck && !atomic_load(&world->failed) &&
           pt_monotonic_seconds() < deadline) {
        struct timespec pause = {.tv_sec = 0, .tv_nsec = 1000000};
        nanosleep(&pause, NULL);
        stuck = send_in_flight(r);
    }
    if (atomic_load(&world->failed) || stuck)
        nccl_abort_rank_comms(world, rank);
}

void comm_nccl_rank_close(comm_nccl *world, int rank)
{
    if (rank < 0 || rank >= world->size || !world->ranks[rank].open)
        return;
    nccl_rank *r = &world->ranks[rank];
    cudaSetDevice(r->device);
    /* Freeing device memory waits for the device: a send nobody will
     * receive (a failed world, or a caller's unmatched send) would hold
     * it forever, so such a rank aborts its communicators first, which
     * ends their kernels. */
    comm_nccl_rank_abort_if_stuck(world, rank);
    close_lane(world, rank, &r->lanes[0]);
    close_lane(world, rank, &r->lanes[1]);
    cudaFree(r->device_scratch);
    cudaFreeHost(r->host_scratch);
    comm_device_release(&r->memory, r->scratch_count * sizeof(double));
    cudaStream_t streams[] = {r->collective_stream, r->copy_stream};
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++)
        if (streams[i] != NULL)
            cudaStreamDestroy(streams[i]);
    if (r->collective_done != NULL)
        cudaEventDestroy(r->collective_done);
    if (r->copy_done != NULL)
        cudaEventDestroy(r->copy_done);
    if (r->caller != NULL)
        cudaEventDestroy(r->caller);
    cudaGetLastError(); /* what failed here was already reported */
    nccl_rank closed = {.device = r->device,
                        .memory.peak = r->memory.peak,
                        .aborted = r->aborted};
    *r = closed;
}

/* ------------------------------------------------------------- queries */

int comm_nccl_failed_rank(comm_nccl *world, char *reason, size_t reason_size)
{
    pthread_mutex_lock(&world->lock);
    int rank = comm_failure_get(&world->failure, reason, reason_size);
    pthread_mutex_unlock(&world->lock);
    return rank;
}

int comm_nccl_aborted_count(comm_nccl *world, int rank)
{
    return rank >= 0 && rank < world->size ? world->ranks[rank].aborted : 0;
}

double comm_nccl_rank_peak_bytes(comm_nccl *world, int rank)
{
    return rank >= 0 && rank < world->size
               ? world->ranks[rank].memory.peak
               : 0.0;
}

int comm_nccl_clique_count(const comm_nccl *world)
{
    return world->clique_count;
}
