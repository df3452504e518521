/*
 * One process per rank (mpirun, srun; run_options.processes): the world
 * against the plan, each process's rank on the launcher, the agreement
 * to stop, and what rank 0's record gathers from the others.
 */
#include "executor/run/internal.h"

#include <stdlib.h>
#include <string.h>

/*
 * Under mpirun or srun every rank is a process of its own (run_options
 * processes): each runs its rank's stage through the same launcher and
 * runtime as the threads (pipeline_threads_start with this_rank_only),
 * and rank 0 gathers what the record needs of the others: the chosen
 * iteration's events, each rank's device and memory. Checkpoints: rank 0
 * begins the generation, every rank writes its own blobs into it, rank 0
 * adds their records, writes the shared blobs and commits, so the
 * directory equals a threads run's. Stopping is agreed after every
 * iteration, so that a signal seen by some processes stops all of them
 * at the same iteration.
 */

/* The world must hold one process per rank of the plan; checked before
 * anything else, identically in every process, so all refuse together. */
int run_check_process_world(run_context *ctx, pt_error *err)
{
    const parallel_config *config = &ctx->plan->config;
    int ranks = plan_rank_count(ctx->plan);
    ctx->world = comm_mpi_handle(ctx->options->processes);
    if (ctx->world.size != ranks && plan_first_asymmetric_stage(ctx->plan) >= 0)
        return pt_fail(err, "%d processes were started (mpirun -np, srun "
                            "--ntasks), but the plan's %d stages' tp x dp "
                            "sum to %d ranks: start one process per rank",
                       ctx->world.size, config->pp, ranks);
    if (ctx->world.size != ranks)
        return pt_fail(err, "%d processes were started (mpirun -np, srun "
                            "--ntasks), but the plan has tp %d x dp %d x pp "
                            "%d = %d ranks: start one process per rank",
                       ctx->world.size, config->tp, config->dp, config->pp,
                       ranks);
    ctx->world_members = malloc((size_t)ranks * sizeof *ctx->world_members);
    if (ctx->world_members == NULL)
        return pt_fail(err, "out of memory for the world's %d ranks", ranks);
    for (int rank = 0; rank < ranks; rank++)
        ctx->world_members[rank] = rank;
    ctx->processes = ranks > 1;
    return 0;
}

/* This process's rank: the MPI communicators of its groups, then its
 * stage on the launcher's thread. */
int run_start_own_rank(run_context *ctx, run_result *out, pt_error *err)
{
    comm_groups groups;
    if (pipeline_layout_groups(&ctx->layout, &groups, err) != 0)
        return -1;
    int status = comm_mpi_set_groups(ctx->options->processes, &groups, err);
    comm_groups_free(&groups);
    if (status != 0)
        return -1;
    if (ctx->options->backend != BACKEND_CPU)
        return run_start_own_gpu(ctx, out, err);
    pipeline_launch launch = {.backend = ctx->options->backend,
                              .seed = out->seed,
                              .comms = &ctx->world,
                              .this_rank_only = true};
    if (pipeline_threads_start(&ctx->threads, &ctx->layout, &launch,
                               err) != 0)
        return -1;
    ctx->threads_ready = true;
    ctx->launcher = &ctx->threads;
    return 0;
}

/* Whether any process saw the stop flag: then all stop. */
int run_agree_stop(run_context *ctx, bool *stopping, pt_error *err)
{
    double votes = *stopping ? 1.0 : 0.0;
    if (comm_all_reduce_host(&ctx->world, ctx->world_members,
                             ctx->world.size, &votes, 1, err) != 0)
        return -1;
    *stopping = votes > 0.0;
    return 0;
}

/* An event as it travels between processes: the kind as an index, since
 * each process's string addresses are its own. */
typedef struct event_record {
    int rank;
    int stage;
    int microbatch;
    int kind;
    double start_s;
    double end_s;
} event_record;

static const char *const event_kinds[] = {
    "fwd",          "bwd",          "send_fwd",
    "recv_fwd",     "send_bwd",     "recv_bwd",
    "tp_allreduce", "dp_allreduce", "embedding_allreduce",
    "optimizer",    "other",
};
enum { EVENT_KIND_COUNT = sizeof event_kinds / sizeof event_kinds[0] };

static int event_kind_index(const char *kind)
{
    for (int k = 0; k < EVENT_KIND_COUNT - 1; k++)
        if (strcmp(event_kinds[k], kind) == 0)
            return k;
    return EVENT_KIND_COUNT - 1;
}

/* This process's events of the chosen iteration into record slot
 * `mine` (entry 0's rank field holds the count). */
static void pack_events(const run_context *ctx, long chosen, int capacity,
                        event_record *mine)
{
    const run_event *events =
        ctx->event_ring + (size_t)(chosen % ctx->event_window) *
                              (size_t)ctx->events_per_iteration;
    int count = ctx->ring_counts[chosen % ctx->event_window];
    if (count > capacity)
        count = capacity;
    mine[0].rank = count;
    for (int i = 0; i < count; i++)
        mine[i + 1] = (event_record){
            .rank = events[i].rank,
            .stage = events[i].stage,
            .microbatch = events[i].microbatch,
            .kind = event_kind_index(events[i].kind),
            .start_s = events[i].start_s,
            .end_s = events[i].end_s};
}

/* Rank 0 chose the iteration whose events the record keeps (its own
 * median step); every rank's events of that iteration go to rank 0. */
int run_gather_chosen_events(const run_context *ctx, run_result *out,
                             long *chosen, pt_error *err)
{
    if (comm_mpi_broadcast(&ctx->world, chosen, sizeof *chosen, err) != 0)
        return -1;
    int ranks = ctx->world.size;
    int capacity = ctx->events_per_iteration / ranks;
    size_t slot = (size_t)capacity + 1;
    bool root = ctx->world.rank == 0;
    event_record *mine = calloc(slot, sizeof *mine);
    event_record *all = root ? calloc(slot * (size_t)ranks, sizeof *all)
                             : NULL;
    if (mine == NULL || (root && all == NULL)) {
        free(mine);
        free(all);
        return pt_fail(err, "out of memory gathering the ranks' events");
    }
    pack_events(ctx, *chosen, capacity, mine);
    int status = comm_mpi_gather(&ctx->world, mine, slot * sizeof *mine, all,
                                 err);
    out->event_count = 0;
    for (int rank = 0; status == 0 && root && rank < ranks; rank++) {
        const event_record *records = all + (size_t)rank * slot;
        for (int i = 0; i < records[0].rank; i++) {
            const event_record *e = &records[i + 1];
            out->events[out->event_count++] = (run_event){
                .rank = e->rank, .stage = e->stage,
                .microbatch = e->microbatch,
                .kind = event_kinds[e->kind >= 0 &&
                                            e->kind < EVENT_KIND_COUNT
                                        ? e->kind
                                        : EVENT_KIND_COUNT - 1],
                .start_s = e->start_s, .end_s = e->end_s};
        }
    }
    free(mine);
    free(all);
    return status;
}

/* What rank 0's record needs of each process's rank. */
typedef struct rank_record {
    run_device device;
    double peak_memory_bytes;
    pt_memory_terms memory_terms;
} rank_record;

int run_gather_rank_records(run_context *ctx, run_result *out,
                            pt_error *err)
{
    int me = ctx->world.rank, ranks = ctx->world.size;
    bool root = me == 0;
    rank_record mine = {.device = out->devices[me],
                        .peak_memory_bytes =
                            out->rank_peak_memory_bytes[me],
                        .memory_terms = out->rank_memory_terms[me]};
    rank_record *all = root ? calloc((size_t)ranks, sizeof *all) : NULL;
    if (root && all == NULL)
        return pt_fail(err, "out of memory gathering the ranks' records");
    int status = comm_mpi_gather(&ctx->world, &mine, sizeof mine, all, err);
    if (status == 0 && root) {
        out->peak_memory_bytes = 0.0;
        for (int rank = 0; rank < ranks; rank++) {
            out->devices[rank] = all[rank].device;
            out->devices[rank].rank = rank;
            out->rank_peak_memory_bytes[rank] = all[rank].peak_memory_bytes;
            out->rank_memory_terms[rank] = all[rank].memory_terms;
            if (all[rank].peak_memory_bytes > out->peak_memory_bytes)
                out->peak_memory_bytes = all[rank].peak_memory_bytes;
        }
        out->device = out->devices[0];
    }
    free(all);
    return status;
}
