/*
 * executor/parallel: the parallel runtime. A plan's layout of ranks
 * (pipeline stages, data-parallel replicas, tensor-parallel shards) and
 * the groups they run collectives over (parallel/layout.c), one rank's
 * training step under the pipeline schedule, 1F1B or GPipe
 * (parallel/step.c), and the launchers that run every rank: threads of
 * one process over any comm (parallel/launcher.c), and on this machine's
 * GPUs over NCCL or the host-staged comm (parallel/pipeline_gpu.c).
 * docs/executor.md ("Parallel runtime").
 */
#ifndef PARTITA_EXECUTOR_PARALLEL_H
#define PARTITA_EXECUTOR_PARALLEL_H

#include "executor/comm/comm.h"
#include "executor/stage/stage.h"

/* One timed phase of an iteration, in the estimate's event schema
 * (formats.md, "Events"). */
typedef struct run_event {
    int rank;
    int stage;
    int microbatch;              /* -1 for the optimizer */
    const char *kind;            /* "fwd", "bwd" or "optimizer": the names
                                    of costmodel's event kinds */
    double start_s;              /* from the start of the iteration */
    double end_s;
} run_event;

/*
 * A parallel plan's layout: pp pipeline stages, each replicated dp times,
 * each replica split over tp tensor-parallel shards. Rank layout as the
 * planner's (formats.md), pipeline outermost, then data, then tensor:
 * rank = t + tp x (d + dp x s) for shard t of replica d of stage s.
 * Each step takes a global batch of gbs token windows of seq + 1 ids;
 * replica d trains on windows [d gbs/dp, (d + 1) gbs/dp) as
 * micro_batches micro-batches of mbs windows (every shard of a replica
 * reads the same windows).
 *
 * Stages of their own degrees (plan.json's "stages", issue 36): stage s
 * runs stage_tp[s] x stage_dp[s] ranks, from first_rank[s] (the earlier
 * stages' ranks), laid out inside as above: rank = first_rank[s] + t +
 * tp_s x d. Every stage runs the plan's micro_batches micro-batches; a
 * pipeline micro-batch is dp x mbs samples (the plan-wide dp and mbs),
 * position p of micro-batch j being window (p / mbs) gbs / dp + j mbs +
 * p % mbs of the global batch, and replica e of stage s takes positions
 * [e b_s, (e + 1) b_s), b_s = stage_mbs[s] = dp mbs / dp_s. With every
 * stage at the plan's degrees this is the layout above, rank for rank
 * and window for window. docs/executor.md ("Stages of their own
 * degrees") gives the boundary between stages of different degrees.
 */
typedef struct pipeline_layout {
    model_shape shape;
    parallel_config config;
    int stage_count;                 /* config.pp */
    int partition[PT_MAX_STAGES];    /* layers per stage */
    int micro_batches;               /* gbs / (dp x mbs) */
    int rank_count;                  /* pp x dp x tp; with stages of their
                                        own degrees, the sum of their
                                        tp x dp */
    bool asymmetric;                 /* some stage has its own tp or dp */
    int stage_tp[PT_MAX_STAGES];     /* each stage's tp, dp and its */
    int stage_dp[PT_MAX_STAGES];     /* replicas' micro-batch (config's */
    int stage_mbs[PT_MAX_STAGES];    /* when symmetric) */
    int first_rank[PT_MAX_STAGES + 1]; /* [pp]: rank_count */
} pipeline_layout;

/* Checks the config (gbs a multiple of dp x mbs, the partition summing to
 * the layers, tp dividing the heads and ffn_hidden) and fills out. */
int pipeline_layout_init(pipeline_layout *out, const model_shape *shape,
                         const parallel_config *config, const int *partition,
                         int partition_count, pt_error *err);
/* The same with each stage's own degrees (plan.stages: pp entries, zeros
 * the plan's; NULL: none). Also checks each stage's: its dp divides the
 * micro-batch's dp x mbs samples, its tp splits the model (and the
 * sequence, under sequence parallelism); refuses them under the
 * interleaved 1F1B. */
int pipeline_layout_init_stages(pipeline_layout *out,
                                const model_shape *shape,
                                const parallel_config *config,
                                const int *partition, int partition_count,
                                const stage_degrees *stages, pt_error *err);
int pipeline_rank_stage(const pipeline_layout *layout, int rank);
int pipeline_rank_replica(const pipeline_layout *layout, int rank);
int pipeline_rank_tp(const pipeline_layout *layout, int rank);
/* The rank of shard tp_rank of replica `replica` of stage `stage`. */
int pipeline_rank_of(const pipeline_layout *layout, int stage, int replica,
                     int tp_rank);
/* Whether stages a and b run the same tp and dp (then their boundary is
 * the symmetric one: shard t of replica d to shard t of replica d). */
bool pipeline_same_degrees(const pipeline_layout *layout, int a, int b);
/*
 * The boundary between stages of different degrees (docs/executor.md,
 * "Stages of their own degrees"; the cost model's re-sharding,
 * docs/cost-model.md section 15). The rows of a pipeline micro-batch are
 * its dp x mbs samples' seq positions, sample-major; at such a boundary
 * every rank sends and receives its replica's b_s x seq rows cut evenly
 * over the replica's tp shards: rows [*first, *first + *count) (under
 * sequence parallelism exactly the shard's own rows). A message goes
 * from each rank of one side to each rank of the other whose rows meet
 * its own; a receiving stage without sequence parallelism then gathers
 * the whole activation (or gradient) over its tp group.
 */
void pipeline_boundary_rows(const pipeline_layout *layout, int rank,
                            size_t *first, size_t *count);
/* The tied embedding between a first and a last stage of different
 * degrees: the vocabulary rows [*first, *first + *count) that shard t of
 * the first stage and shard u of the last both hold (*count 0: none);
 * replica d of each stage sums them pairwise with replica d of the
 * other, for each d both stages have, then the stage of more replicas
 * gives replica 0's sums to its others. */
void pipeline_tied_segment(const pipeline_layout *layout, int t, int u,
                           int *first, int *count);

/* The stage spec of a rank: its stage's layers, its tp shard and, with
 * the distributed optimizer and dp > 1, its optimizer shard (its
 * replica). */
int pipeline_rank_spec(const pipeline_layout *layout, int rank,
                       stage_spec *out, pt_error *err);
/* Micro-batches whose activations stage s keeps at once: min(pp - s, m)
 * for 1F1B, m for GPipe. */
int pipeline_slot_count(const pipeline_layout *layout, int stage);

/* Megatron's interleaved 1F1B (the plan's virtual_stages v > 1): each
 * rank holds v chunks, chunk c of stage s being virtual stage c pp + s
 * of pp x v, with 1 / v of the stage's layers (docs/executor.md,
 * "Interleaved 1F1B"). Chunks per rank (1 without interleaving); the
 * spec of a rank's chunk (chunk 0 is pipeline_rank_spec's when v is 1);
 * the micro-batches of chunk `chunk` of stage s in flight at once under
 * Megatron's order; and its stage, made and initialised as
 * pipeline_stage_create makes a rank's. */
int pipeline_chunk_count(const pipeline_layout *layout);
int pipeline_rank_chunk_spec(const pipeline_layout *layout, int rank,
                             int chunk, stage_spec *out, pt_error *err);
int pipeline_chunk_slot_count(const pipeline_layout *layout, int stage,
                              int chunk);
int pipeline_chunk_stage_create(model_stage *out,
                                const pipeline_layout *layout, int rank,
                                int chunk, backend_kind backend,
                                uint64_t seed, pt_error *err);
/* Creates and initialises (seed: the same values as the whole model) the
 * stage of a rank with its slots. */
int pipeline_stage_create(model_stage *out, const pipeline_layout *layout,
                          int rank, backend_kind backend, uint64_t seed,
                          pt_error *err);
/* Connects a rank's stage to its tensor-parallel group on comm c (which
 * must outlive the stage's use); nothing when tp is 1. */
int pipeline_stage_attach(const pipeline_layout *layout, model_stage *stage,
                          const comm *c, pt_error *err);

/* The timed events of one rank's step, in the estimate's event schema;
 * kinds are costmodel's names: "fwd", "bwd", "send_fwd", "recv_fwd",
 * "send_bwd", "recv_bwd", "dp_allreduce", "embedding_allreduce",
 * "optimizer" (microbatch -1 for the last three; with ZeRO-1 the
 * reduce-scatter and the all-gather are two "dp_allreduce" events, as in
 * the estimate). */
typedef struct pipeline_events {
    int count;
    int capacity;
    run_event *events;   /* owned */
} pipeline_events;

/* Room for every event of a step of that layout: 6 per micro-batch and
 * 4 more. */
int pipeline_events_reserve(pipeline_events *events,
                            const pipeline_layout *layout, pt_error *err);
void pipeline_events_free(pipeline_events *events);

/*
 * The data-parallel gradient reduction in buckets (parallel/grad_sync.c),
 * as PyTorch DDP and Megatron make it: the gradient buffer cut at tensor
 * boundaries into buckets of at most bucket_bytes (a tensor larger than
 * that is a bucket of its own), listed in the order the backward
 * completes them: the last tensors of the buffer first. Each bucket is
 * summed over the dp group on its own (ZeRO-1: reduce-scattered, member i
 * keeping the part of the bucket inside its optimizer run). The sums are
 * element-wise in group order whatever the cut, so the buckets change no
 * bit of the result.
 */
#define PIPELINE_GRAD_BUCKET_DEFAULT_BYTES ((size_t)25 << 20)

typedef struct pipeline_bucket {
    size_t offset;               /* first float of the gradient buffer */
    size_t count;
} pipeline_bucket;

typedef struct pipeline_buckets {
    int count;
    pipeline_bucket *buckets;    /* owned; last tensors first */
} pipeline_buckets;

/* The buckets of a stage's gradient buffer (bucket_bytes 0: the
 * default, 25 MiB). */
int pipeline_grad_buckets(const model_stage *stage, size_t bucket_bytes,
                          pipeline_buckets *out, pt_error *err);
void pipeline_buckets_free(pipeline_buckets *buckets);
/* Sums one bucket of the stage's gradients over the dp group (or any
 * group: the tied embedding's pair): an all-reduce, or with run_offsets
 * (group_size + 1 optimizer runs of the whole buffer,
 * stage_optimizer_offsets) a reduce-scatter of the bucket's parts of the
 * runs; fp32, or bf16 when the stage keeps them so (grads_bf16, which
 * needs a comm with stream-ordered collectives). stream NULL: blocking;
 * else enqueued on that CUDA stream (comm_stream_ops). */
int pipeline_reduce_bucket(const comm *c, const int *group, int group_size,
                           model_stage *stage, pipeline_bucket bucket,
                           const size_t *run_offsets, void *stream,
                           pt_error *err);

/*
 * ZeRO-2 and ZeRO-3 (parallel/zero_step.c; docs/executor.md): group is
 * the rank's dp group in replica order, offsets its dp + 1 optimizer
 * runs (stage_optimizer_offsets), the stage's own run its shard.
 */
/* Reduce-scatters one micro-batch's gradients bucket by bucket (buckets
 * NULL: the whole buffer), keeping the shard's running sum; zeroes the
 * rest of the buffer. */
int zero_reduce_micro_batch(const comm *c, const int *group, int dp,
                            const size_t *offsets,
                            const pipeline_buckets *buckets,
                            model_stage *stage, pt_error *err);
/* What zero_reduce_unit needs: the dp group and its runs. */
typedef struct zero_unit_group {
    const comm *c;
    const int *group;
    int dp;
    const size_t *offsets;
} zero_unit_group;
/* A stage_unit_hook (context: a zero_unit_group) for a stage whose
 * backend keeps its shard's gradients only (grads_by_unit): one unit's
 * gradients of a micro-batch reduce-scattered over the dp group in
 * place, each replica's part of the unit summed into that replica's
 * slice of it. */
int zero_reduce_unit(model_stage *stage, size_t first, size_t count,
                     float *unit, void *stream, void *context, pt_error *err);
/* The stage_unit_hook for a stage whose backend keeps its shard's
 * parameters only (params_by_unit): one unit's weights all-gathered
 * over the dp group in place around each replica's part. */
int zero_gather_unit(model_stage *stage, size_t first, size_t count,
                     float *unit, void *stream, void *context, pt_error *err);
/* The tied embedding's gradient whole on the first-stage replica and its
 * last-stage partner (pair), from the shards of both stages (with
 * grads_by_unit, in a buffer of the tensor's size for the while, each
 * keeping its shard's part). pair NULL: the first and the last stage run
 * different degrees, and every replica of both gets the sum as layout
 * gives it (pipeline_tied_segment). Also ZeRO-1's, there, after its
 * reduce-scatter. fp32 gradients only. */
int zero_tied_embedding(const comm *c, const int *group, int dp,
                        const size_t *offsets, const int *pair,
                        const pipeline_layout *layout, model_stage *stage,
                        const param_tensor *tensor, pt_error *err);
/* ZeRO-3: the parameters gathered whole from the shards, then released
 * (zeroed outside the rank's shard); nothing for a stage gathering unit
 * by unit (params_by_unit). */
int zero_gather_parameters(const comm *c, const int *group, int dp,
                           const size_t *offsets, model_stage *stage,
                           pt_error *err);
int zero_release_parameters(model_stage *stage, pt_error *err);

/*
 * Overlap of the bucketed reduction with the backward (optional, given by
 * a launcher whose backend and comm can: the GPU launcher over NCCL or
 * the device exchange, parallel/grad_overlap.c). The step calls `begin`
 * before the last micro-batch's backward (the gradients are final only
 * then) and `end` after the schedule, instead of reducing after it.
 */
typedef struct pipeline_grad_overlap {
    /* Arms the rank's backend so that each bucket's reduction is
     * enqueued on a second stream as soon as the backward has produced
     * it. 0: armed; 1: not here (the step then reduces after the
     * backward); -1: error. run_offsets: NULL, or the ZeRO-1 runs. */
    int (*begin)(void *data, int rank, model_stage *stage, const comm *c,
                 const int *group, int group_size,
                 const pipeline_buckets *buckets, const size_t *run_offsets,
                 pt_error *err);
    /* After the backward: enqueues the buckets left, waits for every
     * reduction (under the comm's deadline), disarms. */
    int (*end)(void *data, int rank, model_stage *stage, const comm *c,
               pt_error *err);
    void *data;
} pipeline_grad_overlap;

/* How a rank reduces its gradients over its dp group. */
typedef struct pipeline_grad_sync {
    const pipeline_buckets *buckets;  /* NULL: the whole buffer at once */
    const pipeline_grad_overlap *overlap; /* NULL or begin NULL: none */
} pipeline_grad_sync;

/*
 * One training step of one rank, whatever launches the ranks (threads of
 * one process, or one process per rank under MPI): zero the gradients;
 * the schedule's forwards and backwards (1F1B: min(pp - s - 1, m) warm-up
 * forwards, then one forward one backward, then the remaining backwards;
 * GPipe: every forward, then every backward), activations received from
 * rank d + dp (s - 1) and sent to d + dp (s + 1), gradients the other
 * way, each send made with the receive that follows it (comm_sendrecv),
 * loss_scale 1 / (m dp) so gradients average over the global batch; the
 * gradient all-reduce over the stage's dp group, bucket by bucket, with
 * the last backward when the launcher overlaps it; with tied embeddings and
 * pp > 1, the all-reduce of the first stage's token-embedding gradient
 * with the last stage's tied copy; the global gradient norm (sum over the
 * stages of a replica, the tied copy once); clipping and AdamW. Every
 * rank gets the same step_result (loss: mean over the m dp
 * micro-batches). tokens: the global batch, gbs x (seq + 1) ids, host
 * memory. step_start_s: CLOCK_MONOTONIC seconds the event times count
 * from. events may be NULL; it is emptied first. inject_failure: fail
 * after the first forward (tests of the failure path). sync: the buckets
 * and overlap of the dp reduction (NULL: one bucket, no overlap). On
 * failure the rank aborts the comm so that the others return too.
 */
int pipeline_rank_step(const pipeline_layout *layout, model_stage *stage,
                       const comm *c, const train_config *config,
                       const uint32_t *tokens, double step_start_s,
                       bool inject_failure, const pipeline_grad_sync *sync,
                       step_result *out, pipeline_events *events,
                       pt_error *err);
/* The most chunks a rank holds (plan.json's virtual_stages at most). */
#define PIPELINE_MAX_CHUNKS 64
/* The same step of a rank holding chunk_count chunks (the layout's
 * pipeline_chunk_count; chunks[0] is its stage): under the interleaved
 * 1F1B, Megatron's order of chunk forwards and backwards (parallel_chunk_
 * warmup, parallel_chunk_unit), activations to the chunk that follows
 * (the last stage's chunk c to stage 0's chunk c + 1) and gradients
 * back, then each chunk's dp reduction (whole buffers, after the
 * backward), the tied embedding's pair (stage 0's chunk 0 and the last
 * stage's last chunk), the norm over every chunk and AdamW on each.
 * The same mathematics as the plain 1F1B: the same losses and updates. */
int pipeline_rank_step_chunks(const pipeline_layout *layout,
                              model_stage *const *chunks, int chunk_count,
                              const comm *c, const train_config *config,
                              const uint32_t *tokens, double step_start_s,
                              bool inject_failure,
                              const pipeline_grad_sync *sync,
                              step_result *out, pipeline_events *events,
                              pt_error *err);

/* The groups the ranks of a layout run collectives over, besides the
 * world: each stage's dp groups (one per tp shard; dp > 1), each
 * replica's tp groups (tp > 1), and each first/last-stage embedding pair
 * (tied embeddings, pp > 1), as pipeline_rank_step and
 * pipeline_stage_attach form them; a group equal to an earlier one or to
 * the world is left out. Free with comm_groups_free. */
int pipeline_layout_groups(const pipeline_layout *layout, comm_groups *out,
                           pt_error *err);

/* What a launcher's rank thread does around its stage, for backends whose
 * state is per thread (the cuda backend: the rank's GPU, green context and
 * memory cap; the NCCL comm's streams). Each hook runs on the rank's own
 * thread; NULL hooks do nothing. */
typedef struct pipeline_rank_hooks {
    /* Before the rank's stage is made. */
    int (*open)(void *data, int rank, pt_error *err);
    /* After its stage is destroyed; also after a failed open. */
    void (*close)(void *data, int rank);
    void *data;
} pipeline_rank_hooks;

/* How pipeline_threads_start runs the ranks. */
typedef struct pipeline_launch {
    backend_kind backend;
    uint64_t seed;                   /* initialisation */
    double timeout_s;                /* the threads comm's (comms NULL) */
    /* NULL: the launcher makes and owns a threads comm world. Else
     * comms[rank] is each rank's handle of a world the caller made and
     * keeps until pipeline_threads_destroy has returned (NCCL). */
    const comm *comms;
    /* One process per rank (comm_mpi): only the rank of comms[0], the one
     * handle given, runs here; the layout's other ranks are other
     * processes. false: every rank of the layout runs here. */
    bool this_rank_only;
    pipeline_rank_hooks hooks;
    /* The dp reduction's bucket size (0: 25 MiB) and its overlap with
     * the backward (begin NULL: none). */
    size_t grad_bucket_bytes;
    pipeline_grad_overlap overlap;
} pipeline_launch;

struct pipeline_workers;

/*
 * Every rank of a layout in one process, each on a thread of its own that
 * lives as long as the launcher: the thread runs the open hook, makes and
 * initialises its rank's stage (so a cuda stage lands on the rank's
 * device), attaches it to its comm, then runs the steps (and tasks) it is
 * given, and at the end destroys the stage and runs the close hook.
 */
typedef struct pipeline_threads {
    pipeline_layout layout;
    model_stage *stages;             /* rank_count, each owned by its
                                        rank's thread */
    model_stage *chunk_stages;       /* interleaved 1F1B: chunks 1..v-1
                                        of each rank, rank_count x (v - 1),
                                        owned likewise (chunk 0 is its
                                        entry of stages) */
    comm_threads *world;             /* owned; NULL with the caller's
                                        comms */
    pipeline_events *events;         /* rank_count: the last step's */
    pt_error *rank_errors;           /* rank_count: the last step's */
    int *rank_status;                /* rank_count: 0 or -1 */
    comm *comms;                     /* rank_count: each rank's handle */
    pipeline_buckets *buckets;       /* rank_count: each stage's dp buckets */
    int inject_failure_rank;         /* -1: none (tests set it) */
    struct pipeline_workers *workers; /* owned: the rank threads */
    /* The ranks that run in this process, [first_local_rank,
     * first_local_rank + local_rank_count): all of them, or the one rank
     * of this_rank_only; only their entries above are filled. */
    int first_local_rank;
    int local_rank_count;
} pipeline_threads;

/* Starts the rank threads and waits until every rank has its stage.
 * Fails, with nothing left running, when any rank's hook or stage fails
 * (the message of the lowest such rank, prefixed "rank R"). */
int pipeline_threads_start(pipeline_threads *out,
                           const pipeline_layout *layout,
                           const pipeline_launch *launch, pt_error *err);
/* pipeline_threads_start with a threads comm of that timeout and no
 * hooks: the CPU reference. */
int pipeline_threads_create(pipeline_threads *out,
                            const pipeline_layout *layout,
                            backend_kind backend, uint64_t seed,
                            double timeout_s, pt_error *err);
/* Runs one step on every rank. Fails when any rank failed, with the
 * message of the rank that failed first (each rank's own message stays
 * in rank_errors); the world is then unusable. */
int pipeline_threads_step(pipeline_threads *p, const train_config *config,
                          const uint32_t *tokens, step_result *out,
                          pt_error *err);
/* Runs task(data, rank, stage) on that rank's own thread and waits for
 * it: what must run where the rank's device is current (checkpoint
 * copies, device queries). Returns the task's status. */
typedef int (*pipeline_rank_task)(void *data, int rank, model_stage *stage,
                                  pt_error *err);
int pipeline_threads_on_rank(pipeline_threads *p, int rank,
                             pipeline_rank_task task, void *data,
                             pt_error *err);
/* Chunk `chunk` of a rank's interleaved 1F1B (chunk 0: its stage). */
model_stage *pipeline_threads_chunk(pipeline_threads *p, int rank,
                                    int chunk);
/* Ends the rank threads (each destroys its stage) and frees the rest.
 * Safe on a launcher that failed to start or was zeroed. */
void pipeline_threads_destroy(pipeline_threads *p);

/* ------------------------------------------------ the launcher on GPUs */

/*
 * Parallel plans on the GPUs of this machine (executor/parallel/pipeline_gpu.c),
 * built with the cuda backend: one process, one thread per rank, each
 * rank on the GPU (and green context, and memory cap) its plan entry
 * names, over one of three comms:
 *   - NCCL (executor/comm/comm.h, built when NCCL is found): one GPU per
 *     rank, the fast path;
 *   - the device exchange (executor/comm/exchange.c): every rank on ONE
 *     GPU, each in its own slice of its SMs, exchanging through its
 *     memory with no host round trip, paced to emulated links (the
 *     cluster's), so that one GPU runs a plan for several and its step
 *     can be held against the estimate of that cluster;
 *   - host-staged (executor/comm/staged.c, below): every operation copies
 *     the rank's device floats into pinned host memory and runs the
 *     threads comm on them. Slow (two PCIe copies per operation, nothing
 *     overlapped), but it needs neither NCCL nor a GPU per rank: ranks may
 *     share GPUs in any way, a heterogeneous plan included (a full-speed
 *     slice and a throttled slice). Its sums are the threads comm's, made
 *     on the host in group order.
 * Include under PARTITA_HAVE_CUDA. docs/executor.md ("Parallel runtime on
 * GPUs", "Ranks sharing a GPU") describes them.
 */

typedef enum gpu_comm_kind {
    GPU_COMM_NCCL,    /* one GPU per rank; needs a build with NCCL */
    GPU_COMM_HOST,    /* staged through host memory; ranks may share GPUs */
    GPU_COMM_DEVICE,  /* the device exchange: every rank on one GPU */
} gpu_comm_kind;

struct comm_nccl;

/* A rank's overlap of the dp reduction with its backward on a GPU
 * (parallel/grad_overlap.c): a reduction stream in the rank's slice and
 * the state of an armed backward. Opened and closed on the rank's thread
 * once its device is open. */
typedef struct gpu_grad_overlap gpu_grad_overlap;
int gpu_grad_overlap_open(gpu_grad_overlap **out, pt_error *err);
void gpu_grad_overlap_close(gpu_grad_overlap *overlap);

/*
 * Every rank of a layout on this machine's GPUs, one thread per rank
 * (pipeline_threads over the chosen comm). devices[rank] gives the rank's
 * GPU (index), its sm_limit (run in a CUDA green context of that many
 * SMs; 0: all) and memory_limit_gib (a cap on what the rank allocates; 0:
 * none). Ranks with an sm_limit that share a GPU get consecutive,
 * non-overlapping slices of its SMs in rank order. Each rank's thread
 * opens its device, its comm's streams and its cuda stage; the close runs
 * on the same thread.
 */
typedef struct pipeline_gpu {
    pipeline_threads threads;        /* stages, events, errors by rank */
    gpu_comm_kind kind;
    struct comm_nccl *world;         /* owned, GPU_COMM_NCCL */
    comm_staged *staged;             /* owned, GPU_COMM_HOST */
    comm_exchange *exchange;         /* owned, GPU_COMM_DEVICE */
    comm *comms;                     /* rank_count, owned */
    device_spec *devices;            /* rank_count, owned copy */
    bool *sliced;                    /* rank_count: shares its GPU with
                                        other ranks that have sm_limits */
    int *sm_slices;                  /* for each rank, the sm_limits of
                                        the sliced ranks on its GPU, its
                                        own included, in rank order
                                        (sm_slice_offset) */
    int *sm_slice_offset;            /* rank_count + 1 offsets into it */
    int *slice_index;                /* rank_count: each rank's place in
                                        its own list */
    gpu_grad_overlap **overlaps;     /* rank_count; NULL entries with the
                                        host-staged comm (no streams) */
} pipeline_gpu;

/* The launch hooks that overlap each rank's dp reduction with its last
 * backward (pipeline_launch.overlap), for a comm with stream-ordered
 * collectives. */
pipeline_grad_overlap pipeline_gpu_overlap(pipeline_gpu *g);

/* links: GPU_COMM_DEVICE only, the emulated links between the ranks
 * (rank_count x rank_count, as comm_exchange_create takes them), or NULL
 * for unpaced exchanges; the other comms ignore it. */
int pipeline_gpu_start(pipeline_gpu *out, const pipeline_layout *layout,
                       const device_spec *devices, gpu_comm_kind kind,
                       const link_spec *links, uint64_t seed,
                       double timeout_s, pt_error *err);
/* One process per rank (NCCL only): only this process's rank
 * (processes->rank), on `device`, over a NCCL world of
 * comm_nccl_create_rank; devices[] then holds that rank's entry only. */
int pipeline_gpu_start_rank(pipeline_gpu *out, const pipeline_layout *layout,
                            const device_spec *device, const comm *processes,
                            uint64_t seed, double timeout_s, pt_error *err);
/* Device bytes the rank's comm holds (NCCL's or the device exchange's
 * staging buffers and scratch; 0 for the host-staged comm, whose buffers
 * are host memory). */
double pipeline_gpu_comm_device_bytes(const pipeline_gpu *g, int rank);
/* Stops the rank threads (after a failure, each aborts its NCCL
 * communicators before its stage is freed) and ends the world. Safe on a
 * zeroed or failed launcher. */
void pipeline_gpu_stop(pipeline_gpu *g);

#endif
