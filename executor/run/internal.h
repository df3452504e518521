/*
 * Private to executor/run: the state of a run while it trains
 * (run_context) and what its files share. The public interface is
 * executor/run/run.h.
 */
#ifndef PARTITA_EXECUTOR_RUN_INTERNAL_H
#define PARTITA_EXECUTOR_RUN_INTERNAL_H

#include "executor/run/run.h"

/* Ranks of a parallel run: as many as its record, run.json, may hold. */
#define RUN_MAX_RANKS RUN_JSON_MAX_RANKS

/* Iterations whose events are kept for choosing the median one: runs of
 * up to this many timed iterations choose among all of them, longer runs
 * among the most recent, so memory stays bounded however long the run. */
#define RUN_EVENT_WINDOW 128
/* ...and at most this many events in all: a parallel run of many ranks
 * and micro-batches keeps fewer iterations instead of more memory. */
#define RUN_EVENT_BUDGET (1L << 20)

/* How long a rank of a parallel run waits for a peer before calling the
 * run hung: a cpu stage of a large model can take minutes per
 * micro-batch, and a rank that fails wakes the others at once anyway. */
#define RUN_COMM_TIMEOUT_S 3600.0
/* ...and on GPUs, where a micro-batch takes well under a second but the
 * first step also sets up cuBLAS and NCCL's connections. */
#define RUN_GPU_COMM_TIMEOUT_S 300.0

/* Run checkpoints hold these blobs besides meta.json. */
#define BLOB_PARAMS "params"
#define BLOB_ADAM_M "adam_m"
#define BLOB_ADAM_V "adam_v"
#define BLOB_STEPS "optimizer_steps"
#define BLOB_POSITION "data_position"
#define BLOB_RNG "rng"
#define BLOB_META "meta.json"

/* What a checkpoint to resume from holds besides the big buffers, read
 * and checked before anything is allocated. */
typedef struct resume_state {
    bool active;
    long optimizer_steps;
    uint64_t seed;
    unsigned char position[DATA_POSITION_BYTES];
    long samples_per_step;      /* gbs of the run that saved it: where
                                   optimizer_steps leave the data */
} resume_state;

/* Everything a run holds while it trains; owned by run_training. */
typedef struct run_context {
    const run_options *options;
    const plan *plan;
    model_shape shape;
    size_t param_count;
    resume_state resume;
    indexed_dataset dataset;
    bool dataset_open;
    gpt_sampler sampler;
    bool sampler_ready;
    data_position position;
    model_stage stage;          /* one-stage runs */
    bool stage_ready;
    bool stage_gpu_open;        /* its thread's GPU slice was opened */
    bool parallel;              /* pp, dp or tp > 1: the ranks below */
    pipeline_layout layout;
    pipeline_threads threads;   /* cpu backend */
    bool threads_ready;
    struct pipeline_gpu *gpu;   /* cuda backend, owned */
    run_gpu_comm gpu_comm;      /* its comm, resolved (never AUTO) */
    pipeline_threads *launcher; /* the running ranks: &threads or the
                                   GPU launcher's */
    bool processes;             /* one process per rank: this process
                                   runs only world.rank */
    comm world;                 /* of options->processes */
    int *world_members;         /* 0 .. world.size - 1: the world as a
                                   group */
    size_t largest_rank_params; /* floats of the largest rank's stage
                                   (or chunk of one) */
    uint32_t *tokens;           /* gbs windows of seq + 1 ids */
    /* A one-stage run draws the next iteration's windows while the
     * device finishes the last step (loop.c), into next_tokens, the data
     * position after them in next_position; next_ready: they are
     * there. ctx->position stays the last finished iteration's (what a
     * checkpoint saves) until the next iteration takes them. */
    uint32_t *next_tokens;
    data_position next_position;
    bool next_ready;
    float *host_buffer;         /* largest_rank_params floats, for
                                   checkpoints */
    int events_per_iteration;   /* room per iteration: one-stage 2 x
                                   micro-batches + 1; parallel every
                                   rank's events */
    run_event *event_ring;      /* event_window iterations of events */
    long event_window;          /* 1..RUN_EVENT_WINDOW */
    int ring_counts[RUN_EVENT_WINDOW]; /* events each ring entry holds */
    long iteration_capacity;    /* records out->iterations has room for */
    checkpoint_lock save_lock;  /* of options->save_dir, held from before
                                   the checks to the end (rank 0's
                                   process, with one process per rank) */
} run_context;

/* -------------------------------------------------------- context.c */

/* A note for the user in the record (at most RUN_MAX_NOTES), and the
 * removal of the notes that start with prefix (a guess made before a
 * stage could say better). */
void run_add_note(run_result *out, const char *text);
void run_drop_note(run_result *out, const char *prefix);
/* The ranks this process runs, [run_local_first, run_local_end). */
int run_local_first(const run_context *ctx);
int run_local_end(const run_context *ctx);
/* The chunks a rank holds (virtual_stages under the interleaved 1F1B,
 * else 1); a chunk's stage spec (chunk 0: the rank's stage), its
 * parameters, and the floats of one of its buffers (the AdamW moments:
 * its optimizer's range). */
int run_chunk_count(const run_context *ctx);
int run_chunk_spec(const run_context *ctx, int rank, int chunk,
                   stage_spec *out, pt_error *err);
int run_chunk_param_count(const run_context *ctx, int rank, int chunk,
                          size_t *out, pt_error *err);
int run_chunk_buffer_count(const run_context *ctx, int rank, int chunk,
                           stage_buffer which, size_t *out, pt_error *err);

/* -------------------------------------------------------- options.c */

int run_check_options(const run_options *options, pt_error *err);
/* The interleaved 1F1B (virtual_stages > 1) runs without ZeRO-2/3,
 * sequence parallelism on the cpu backend, so far. */
int run_check_interleave(const plan *p, const run_options *options,
                         pt_error *err);
/* A save_dir that holds a checkpoint is refused unless the run resumes
 * from it or may overwrite it (called by run_check_options). */
int run_check_save_dir(const run_options *options, pt_error *err);

/* The most checkpoint generations a run keeps. */
#define RUN_MAX_CHECKPOINT_KEEP 1000

/* --------------------------------------------------------- memory.c */

/* Fills the record's memory figures and refuses a run that cannot fit. */
int run_check_memory(const run_context *ctx, run_result *out,
                     pt_error *err);

/* -------------------------------------------------------- devices.c */

/* What the record says of rank 0's device before any stage exists. */
void run_describe_device(const plan *p, backend_kind backend,
                         run_device *device, run_result *out);
/* A one-stage cuda run: this thread on rank 0's GPU, in its slice of
 * SMs and under its memory cap (the node's `devices` entry), before the
 * stage is made; closed after it. */
int run_open_stage_gpu(run_context *ctx, pt_error *err);
void run_close_stage_gpu(run_context *ctx);
/* A one-stage cuda run: the device and bytes its stage reports. */
void run_describe_cuda_stage(run_context *ctx, run_result *out);
/* A parallel plan against this machine's GPUs, before any allocation. */
int run_check_gpu_devices(const run_context *ctx, pt_error *err);
/* The comm of a parallel cuda run (options->gpu_comm, AUTO resolved). */
int run_resolve_gpu_comm(run_context *ctx, pt_error *err);
/* llm.c's recipe (grad_precision bf16) on the cuda backend: what it does
 * not run (ZeRO-2/3, the optimizer offload, bf16 gradient sums over the
 * host-staged comm) refused in one line before anything is allocated;
 * after run_resolve_gpu_comm. */
int run_check_grad_precision(const run_context *ctx, pt_error *err);
/* Every rank on its GPU (threads), or this process's rank (processes). */
int run_start_gpus(run_context *ctx, run_result *out, pt_error *err);
int run_start_own_gpu(run_context *ctx, run_result *out, pt_error *err);
/* Each rank's device and device bytes into the record (cuda builds). */
int run_record_gpu_ranks(run_context *ctx, run_result *out, pt_error *err);

/* ----------------------------------------------------- checkpoint.c */

/* Checks the checkpoint of options->load_dir against the plan and reads
 * its small blobs into ctx->resume; then, once the stages exist, their
 * buffers. */
int run_read_resume_state(run_context *ctx, pt_error *err);
int run_restore_checkpoint(run_context *ctx, pt_error *err);
/* Saves the state after `iteration` into options->save_dir. */
int run_save_checkpoint(run_context *ctx, long iteration, uint64_t seed,
                        pt_error *err);

/* ------------------------------------------------------ processes.c */

int run_check_process_world(run_context *ctx, pt_error *err);
int run_start_own_rank(run_context *ctx, run_result *out, pt_error *err);
int run_agree_stop(run_context *ctx, bool *stopping, pt_error *err);
int run_gather_chosen_events(const run_context *ctx, run_result *out,
                             long *chosen, pt_error *err);
int run_gather_rank_records(run_context *ctx, run_result *out,
                            pt_error *err);

/* ----------------------------------------------------------- loop.c */

/* Iterations up to the last one, or until the stop flag is raised. */
int run_train_iterations(run_context *ctx, run_result *out, pt_error *err);

#endif
