/*
 * executor/run: `partita exec`'s library half. Trains a plan's model on a
 * dataset, ranks as threads or as one process each, checkpoints that
 * resume bit for bit, the record of the run for run.json, and the check
 * of a plan against this machine's GPUs.
 */
#ifndef PARTITA_EXECUTOR_RUN_H
#define PARTITA_EXECUTOR_RUN_H

#include "executor/comm/comm.h"
#include "executor/data/data.h"
#include "executor/parallel/parallel.h"
#include "executor/stage/stage.h"

/* ----------------------------------------------------------------- runs */

/*
 * `partita exec` for plans of one stage on one device (tp = dp = pp = 1),
 * and for parallel plans (pp, dp or tp > 1), whose ranks run as threads
 * through the parallel runtime: on the cpu backend over the threads comm
 * (pipeline_threads), on the cuda backend one GPU per rank over NCCL or
 * ranks sharing GPUs over the host-staged comm (pipeline_gpu,
 * executor/parallel/parallel.h), after the plan was checked
 * against this machine's GPUs (device_check_plan); on the same data, seed
 * and record:
 * samples from a dataset (gpt_sampler), gbs / mbs accumulated
 * micro-batches per iteration, AdamW with clipping and the schedule,
 * per-phase timing, checkpoints that resume bit for bit, and a record of
 * it all for run.json. Only the backend interface is used, so any backend
 * that backend_find hands out runs here. docs/executor.md ("partita exec")
 * and docs/formats.md ("Run") describe it.
 */

#include <signal.h>

struct run_result;

/* Called after every iteration (and after an interval's checkpoint, if
 * one was due); so_far->iterations[so_far->iteration_count - 1] is the
 * iteration just finished. For printing progress: it must not keep the
 * pointer. */
typedef void (*run_observer)(const struct run_result *so_far, void *data);

/* Called after each blob as a checkpoint is checked ("checked":
 * checkpoint_verify_observed; a run's --load, before the model is
 * allocated) and as a run restores its ranks' blobs from it
 * ("restored"): bytes and blobs so far and in all. For printing
 * progress. */
typedef void (*checkpoint_progress)(const char *what, uint64_t bytes_done,
                                    uint64_t bytes_total, int blobs_done,
                                    int blob_count, void *data);

/* The comm of a parallel plan's ranks on GPUs (executor/parallel/parallel.h):
 * NCCL, one GPU per rank; the device exchange, every rank on one GPU
 * (each in its own slice of SMs), through its memory, paced to the
 * plan's cluster links; or host-staged, slow, but ranks may share GPUs in
 * any way and no NCCL is needed. */
typedef enum run_gpu_comm {
    RUN_GPU_COMM_AUTO,
    RUN_GPU_COMM_NCCL,
    RUN_GPU_COMM_HOST,
    RUN_GPU_COMM_DEVICE,
} run_gpu_comm;

/* What a run is asked to do. run_options_defaults fills every field. */
typedef struct run_options {
    const char *data_prefix;     /* PREFIX of PREFIX.bin / PREFIX.idx */
    backend_kind backend;
    long iterations;             /* the run ends after this iteration,
                                    counted from the start of training: a
                                    resumed run continues up to it */
    uint64_t seed;               /* initialisation and data order */
    bool seed_given;             /* false: a resumed run takes the
                                    checkpoint's seed; true: it must match */
    train_config train;          /* AdamW, clipping, learning-rate schedule */
    const char *save_dir;        /* NULL: no checkpoints */
    long save_interval;          /* iterations between checkpoints; 0: only
                                    at the end (a stopped run saves too) */
    int checkpoint_keep;         /* generations kept in save_dir, the
                                    newest included (default 2) */
    bool overwrite_checkpoint;   /* save_dir may hold another run's
                                    checkpoint; false: a save_dir holding
                                    one is refused unless it is load_dir */
    const char *load_dir;        /* NULL: start from initialisation */
    double memory_available_bytes; /* cpu backend: 0 means the machine's
                                      physical memory */
    double comm_timeout_s;       /* parallel runs: how long a rank waits
                                    for a peer before the run fails; 0:
                                    the default (3600 s on cpu, 300 s on
                                    cuda) */
    run_gpu_comm gpu_comm;       /* cuda backend, ranks as threads: how
                                    they communicate (RUN_GPU_COMM_AUTO:
                                    NCCL when built and every rank has a
                                    GPU of its own, the device exchange
                                    when every rank is on one GPU, else
                                    host-staged) */
    struct comm_mpi *processes;  /* NULL: the ranks of a parallel plan
                                    are threads of this process. Else one
                                    process per rank (mpirun, srun): this
                                    process runs only its rank of this
                                    world, whose size must be the plan's
                                    ranks; rank 0's result holds every
                                    rank's events, devices and memory, and
                                    checkpoints hold every rank's blobs */
    volatile sig_atomic_t *stop; /* non-zero (say, set by a signal handler):
                                    finish the current iteration, save if
                                    save_dir is set, and return normally.
                                    NULL: never */
    run_observer observer;       /* NULL: none */
    checkpoint_progress load_observer; /* while --load checks and restores;
                                          NULL: none */
    void *observer_data;         /* handed to both observers */
} run_options;

/* Defaults for a run of `iterations` iterations: cpu backend, seed 1234,
 * AdamW defaults, clipping at 1, learning rate 6e-4 warming up over the
 * first 10% of the iterations, then cosine decay to 6e-5 (10%) at the
 * last one; no checkpoints (2 generations kept when saving, another
 * run's checkpoint never replaced), no stop flag, no observer. */
run_options run_options_defaults(long iterations);

/* How long a rank of the run waits for a peer: options->comm_timeout_s,
 * or the backend's default. */
double run_comm_timeout(const run_options *options);

/* One iteration as recorded. */
typedef struct run_iteration {
    long iteration;              /* 1-based, counting those before a resume */
    double step_time_s;          /* wall time: batch assembly, forwards,
                                    backwards, norm, optimizer */
    float loss;                  /* mean over the micro-batches, nats/token */
    float grad_norm;             /* global norm before clipping */
    float learning_rate;
} run_iteration;

/* The device a rank ran on. */
typedef struct run_device {
    int rank;
    char name[PT_NAME_MAX * 2];  /* "cpu (16 cores)", or the GPU's name */
    int sms_used;                /* streaming multiprocessors; 0: not a GPU
                                    or not reported */
    double memory_cap_bytes;     /* cpu: physical memory; GPU: the plan's
                                    memory_limit_gib, 0 when none */
    char driver_version[32];     /* "" when not applicable or unknown */
    char cuda_version[32];
} run_device;

#define RUN_MAX_NOTES 8

/* What a run did: filled by run_training, freed by run_result_free. */
typedef struct run_result {
    backend_kind backend;
    run_device device;           /* of rank 0 (the only rank of a one-stage
                                    run) */
    int rank_count;              /* pp x dp x tp (or the stages' tp x dp
                                    summed): 1 for a one-stage run */
    int pp, dp, tp;
    run_device *devices;         /* owned, rank_count, by rank */
    double *rank_peak_memory_bytes; /* owned, rank_count: each rank's
                                       figure on peak_memory_basis */
    pt_memory_terms *rank_memory_terms; /* owned, rank_count: each rank's
                                       device memory by term (common.h),
                                       NAN where not known: every term on
                                       the cpu backend, the context of a
                                       rank that shares its GPU */
    char data_prefix[PT_PATH_MAX];
    uint64_t dataset_tokens;
    uint64_t dataset_documents;
    uint32_t largest_token;
    uint64_t seed;
    int gbs, mbs, micro_batches;
    long tokens_per_iteration;   /* gbs x seq */
    lr_schedule schedule;
    float max_grad_norm;
    char resumed_from[PT_PATH_MAX]; /* the --load directory, "" if none */
    char started_utc[32];        /* when training began, ISO 8601 UTC */
    long first_iteration;        /* 1, or one past the checkpoint's */
    long last_iteration;         /* options.iterations */
    long iteration_count;        /* iterations run by this call */
    run_iteration *iterations;   /* owned, iteration_count of them */
    long events_iteration;       /* the iteration events come from */
    int event_count;
    run_event *events;           /* owned: one-stage, 2 x micro_batches + 1;
                                    parallel, every rank's events of that
                                    iteration, rank after rank, with the
                                    runtime's kinds */
    double step_time_s;          /* median over the timed iterations (all
                                    but the first, when there are two or
                                    more) */
    double tokens_per_s;         /* tokens_per_iteration / step_time_s */
    double peak_memory_bytes;    /* the largest rank's, see
                                    peak_memory_basis */
    const char *peak_memory_basis;
    double max_rss_bytes;        /* the process's peak resident set */
    bool stopped;                /* the run ended before last_iteration:
                                    the stop flag, or a failure part-way */
    long interrupted_iteration;  /* the iteration the stop flag abandoned
                                    (one-stage runs read it between
                                    micro-batches; nothing of it was
                                    applied or recorded); 0: none */
    char stop_reason[512];       /* why the run stopped early: the failure
                                    of run_training's -2, or "stopped on
                                    request"; "" when it ran to the end */
    long last_checkpoint_iteration; /* 0: none saved by this call */
    int note_count;
    char notes[RUN_MAX_NOTES][256]; /* things the user should know, such
                                       as a precision the backend ignores */
} run_result;

/* Fails for plans exec cannot run on any backend: tp x dp x pp different
 * from the GPUs of the plan's node order, gbs not a multiple of dp x mbs.
 * On the cuda backend run_training also checks a parallel plan against
 * this machine's GPUs (device_check_plan) before allocating anything. */
int run_check_plan(const plan *p, pt_error *err);
/* Fails for a model the backend cannot train: on the cuda backend a
 * Llama-family model whose head size is not a multiple of 8 (both
 * backends train every other model file's layer). */
int run_check_backend(const plan *p, backend_kind backend, pt_error *err);

/* Host bytes a cpu-backend stage of the whole model needs at micro-batch
 * mbs: 16 per parameter (parameters, gradients, AdamW m and v, fp32) and
 * the activations and backward scratch of one micro-batch as the cpu
 * backend lays them out (with full recompute or without). *activation_bytes
 * gets the second part when not NULL. */
double run_cpu_stage_bytes(const model_shape *shape, int mbs, bool recompute,
                           double *activation_bytes);
/* The same for one pipeline stage (spec) keeping slot_count micro-batches'
 * activations, as a rank of a parallel run allocates it: 8 bytes per
 * parameter of the stage and 8 per parameter of its optimizer's range
 * (all, or its ZeRO-1 shard), slot_count activation slots of the stage's
 * layers (and embedding input / head), one backward scratch. */
double run_cpu_partial_stage_bytes(const model_shape *shape,
                                   const stage_spec *spec, int mbs,
                                   int slot_count, double *activation_bytes);

/*
 * Trains the plan's model on the dataset: loads and checks everything
 * first (plan, options, checkpoint to resume, dataset, vocabulary against
 * the largest token, memory), then runs iterations up to
 * options->iterations, saving checkpoints as asked. Returns 0 (also when
 * the stop flag ended the run: out->stopped); -1 when refused before
 * training started (nothing was written; a bad plan, option, dataset,
 * checkpoint, or too little memory); -2 when training failed part-way (a
 * non-finite loss or gradient norm, a state that is not finite or an I/O
 * error saving a checkpoint: checkpoints committed earlier stay). After a
 * stop or a part-way failure out holds the iterations that finished, with
 * their summary when there is at least one (threads; one process per
 * rank: stops only), and out->stop_reason says why, so the record can
 * still be written. out is filled in every case and must be freed with
 * run_result_free.
 */
int run_training(const plan *p, const run_options *options, run_result *out,
                 pt_error *err);
void run_result_free(run_result *r);

/*
 * The run.json object of formats.md ("Run"): plan_json (the plan with
 * model and cluster inline; a reference is taken, it is not stolen), the
 * device, software, every iteration, the chosen iteration's events and
 * the measured figures. flops_per_iteration (Megatron's model FLOPs of one
 * iteration, from the caller) gives tflops_per_gpu. NULL on failure.
 */
json_t *run_to_json(const run_result *r, json_t *plan_json,
                    double flops_per_iteration, pt_error *err);

/* The "format" of a run checkpoint's meta.json (docs/executor.md). */
#define RUN_CHECKPOINT_FORMAT "partita-run-checkpoint/1"

/*
 * A plan against the GPUs of this machine, checked before any allocation
 * (executor/run/device_check.c). All ranks of the plan run here (one process,
 * a thread per GPU). The caller queries the devices; the check only
 * compares, and names the rank, the cluster's GPU type, the device and
 * the numbers when they disagree.
 */

/* A GPU this machine has, as the CUDA runtime reports it. */
typedef struct local_device {
    int index;                  /* CUDA device ordinal */
    char name[256];             /* cudaDeviceProp.name: "NVIDIA H200" */
    double total_memory_bytes;
    double free_memory_bytes;   /* cudaMemGetInfo, before allocating */
    int multiprocessors;        /* SMs */
} local_device;

/* The device a rank runs on, with its throttles: a node that lists
 * `devices` (formats.md) gives its i-th GPU devices[i]; a node without
 * them gives rank r device r, unthrottled. -1 when no node holds rank. */
int plan_rank_device(const plan *p, int rank, device_spec *out);

/* Whether a cluster file's GPU type names the hardware of a device,
 * case-insensitively: the type's model, its words up to the first with a
 * digit, less a "-NNSM" suffix ("H200" of "H200-40SM", "A100" of
 * "A100-40GB" or "A100-FASOP", "RTX3090" of "RTX-3090"), must equal a
 * word of the device's name ("NVIDIA A100-SXM4-40GB") or adjacent words
 * joined ("GeForce RTX 3090"). "A10" does not match an A100. */
bool gpu_name_matches(const char *cluster_gpu, const char *device_name);

/* 0 when the machine can run every rank of the plan: as many devices as
 * the plan needs (tp x dp x pp) and its node order provides; each rank's
 * device present and of its node's GPU type; sm_limit and
 * memory_limit_gib within the device's SMs and memory (together, for
 * ranks that share a device); needed_bytes[rank] (what the rank will
 * allocate; NULL: not checked) within its memory_limit_gib and, summed
 * over the ranks of a device, within the device's free memory. -1 with
 * the first disagreement otherwise, e.g. "rank 1 (stage 1, H200-40SM on
 * node h200x2[0] device 1) needs 61.2 GiB, device 1 NVIDIA H200 has 58.0
 * GiB free". */
int device_check_plan(const plan *p, const local_device *devices,
                      int device_count, const double *needed_bytes,
                      pt_error *err);

/* ----------------------------------------------------------- checkpoints */

/*
 * Atomic, checksummed checkpoints (run/checkpoint_store.c): a directory of
 * named blobs and a manifest of their sizes and CRCs, published by one
 * rename, so a crash at any moment leaves the previous checkpoint whole.
 * docs/data.md ("Checkpoints") describes the layout.
 */

/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), table driven.
 * Start with crc 0 and feed the data in pieces of any size. */
uint32_t pt_crc32_update(uint32_t crc, const void *data, size_t size);
uint32_t pt_crc32(const void *data, size_t size);

#define CHECKPOINT_MAX_BLOBS 64
#define CHECKPOINT_MANIFEST "manifest.json"
/* Each generation folder's own copy of its manifest (no blob may take
 * the name): an older generation kept beside the newest loads from its
 * folder, dir/gen-NNNNNN. */
#define CHECKPOINT_GENERATION_MANIFEST "generation.json"

/* One blob as the manifest records it. */
typedef struct checkpoint_blob {
    char name[PT_NAME_MAX];   /* [A-Za-z0-9_.-], not starting with '.' */
    uint64_t bytes;
    uint32_t crc32;
} checkpoint_blob;

/*
 * A checkpoint directory holds manifest.json and one folder per save,
 * gen-NNNNNN/, with a file per blob. A save writes its blobs into a new
 * generation folder (each through a temporary file, fsync and rename), a
 * copy of its manifest there (generation.json), and the manifest last
 * (same way, then fsync of the directory); only then are the generations
 * beyond the `keep` newest removed. An interrupted save therefore leaves
 * the previous manifest and its generation untouched and loadable. One
 * writer per directory at a time.
 */
typedef struct checkpoint_writer {
    char dir[PT_PATH_MAX];
    uint64_t generation;
    int blob_count;
    checkpoint_blob blobs[CHECKPOINT_MAX_BLOBS];
    bool active;              /* begun and neither committed nor aborted */
    bool joined;              /* writes into another process's generation
                                 (checkpoint_writer_join) */
    int keep;                 /* generations left after a commit, the new
                                 one included; 0 (begin's) counts as 1.
                                 Set between begin and commit */
} checkpoint_writer;

/* Creates dir when missing, removes generations an earlier interrupted
 * save left behind and opens a new generation. */
int checkpoint_writer_begin(checkpoint_writer *w, const char *dir,
                            pt_error *err);
/* Any failure (bad or repeated name, I/O) aborts the save. */
int checkpoint_write_blob(checkpoint_writer *w, const char *name,
                          const void *data, size_t size, pt_error *err);
/* Writes the manifest: from here on the new checkpoint is the one that
 * loads. Older generations are then removed. */
int checkpoint_writer_commit(checkpoint_writer *w, pt_error *err);
/* Removes the uncommitted generation; the previous checkpoint stays. */
void checkpoint_writer_abort(checkpoint_writer *w);

/* One process per rank: the process that began the save (the only one
 * that commits) tells the others its generation; each joins it to write
 * its own blobs there, then hands their records (name, bytes, CRC-32) to
 * the committing writer, which adds them before its commit. A joined
 * writer never commits; its abort removes only the blobs it wrote (the
 * committing writer's abort removes the whole generation). */
int checkpoint_writer_join(checkpoint_writer *w, const char *dir,
                           uint64_t generation, pt_error *err);
int checkpoint_writer_add(checkpoint_writer *w, const checkpoint_blob *blob,
                          pt_error *err);

/* What a committed checkpoint holds. */
typedef struct checkpoint_manifest {
    uint64_t generation;
    int blob_count;
    checkpoint_blob blobs[CHECKPOINT_MAX_BLOBS];
    bool in_generation_folder; /* read from a generation folder's own copy
                                  (its blobs sit beside it) */
} checkpoint_manifest;

/* Whether dir holds a manifest (a committed checkpoint): dir is a
 * checkpoint directory, or one of its generation folders. The readers
 * below take either. */
bool checkpoint_exists(const char *dir);

/* The right to save into a checkpoint folder, held by one run at a time
 * (run/checkpoint_lock.c): a flock on the folder, released when its
 * process ends however it ends. */
typedef struct checkpoint_lock {
    int fd;                   /* the locked folder; -1: not held */
    bool made_folder;         /* taking it made the folder */
    char first_made[PT_PATH_MAX]; /* the outermost folder it made */
    char dir[PT_PATH_MAX];
} checkpoint_lock;

/* Makes dir when missing and locks it; -1 naming the holder when another
 * process holds it ("ckpt: process 4242 (partita) is saving checkpoints
 * into this folder; ..."). */
int checkpoint_lock_take(checkpoint_lock *lock, const char *dir,
                         pt_error *err);
/* Unlocks; removes the folder again when taking made it and it is still
 * empty. Safe on a lock not held. */
void checkpoint_lock_release(checkpoint_lock *lock);
/* mkdir -p, for the lock and the writer. */
int checkpoint_make_directories(const char *dir, pt_error *err);
/* 0 when dir holds no manifest or one of ours; -1 when its manifest.json
 * (or generation.json) is another program's (no "format":
 * "partita-checkpoint"): such a folder is neither loaded nor saved
 * into, even with --overwrite. */
int checkpoint_check_ours(const char *dir, pt_error *err);
/* Reads and validates the manifest only. */
int checkpoint_read_manifest(const char *dir, checkpoint_manifest *out,
                             pt_error *err);
/* Checks every blob's size and CRC-32: call it before reading blobs to
 * restore all or nothing. */
int checkpoint_verify(const char *dir, pt_error *err);
/* The same, calling progress (when not NULL) after each blob. */
int checkpoint_verify_observed(const char *dir, checkpoint_progress progress,
                               void *data, pt_error *err);
/* The recorded size of a blob. */
int checkpoint_blob_size(const char *dir, const char *name, uint64_t *bytes,
                         pt_error *err);
/* Copies a blob into buffer, which must be exactly its recorded size. The
 * size and CRC-32 are checked before anything is copied: on failure the
 * buffer is untouched. */
int checkpoint_read_blob(const char *dir, const char *name, void *buffer,
                         size_t size, pt_error *err);

#endif
