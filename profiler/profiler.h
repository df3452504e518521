/*
 * profiler: `partita profile`, what the parts of a model cost on the
 * device at hand, measured through the executor's stages (and, with
 * NCCL and two GPUs, the communication curves).
 */
#ifndef PARTITA_PROFILER_H
#define PARTITA_PROFILER_H

#include "executor/stage/stage.h"

/* ------------------------------------------------------------- profiler */

/*
 * `partita profile` (profiler/profiler.c, docs/profiles.md "Measuring"):
 * what the parts of a model cost on the device at hand. For every tp of
 * a list, shard 0 of the embedding, of one transformer layer (or of a
 * stack of them, a layer entry their mean: layer_stack) and of the
 * head, each a stage of its own, tensor-parallel shards compute-only (the
 * tp all-reduces are priced separately, from the all-reduce curve), at
 * every micro-batch of a list that fits in memory. Warm-up runs of the
 * three parts first (forward then backward, each call synchronous); then
 * each part timed back to back: rounds of calls queued without
 * synchronising (stage defer_sync), forwards alone and forward +
 * backward pairs, timed on the device on cuda (gated or graphed rounds,
 * profiler_graph.c), else on the host clock from the first call to the
 * end of the stage's stream; a time is the median over the rounds, its spread their
 * interquartile range over the median; on cuda the whole measurement is
 * made in several fresh processes and each time is the mean of theirs
 * (profiler/processes.c). Plus the AdamW step
 * per parameter and, built with NCCL and given two GPUs or more,
 * all-reduce, send/recv, reduce-scatter and all-gather curves. Backend-agnostic except the device handling: on the
 * cpu backend it runs (slowly) on a tiny model, which is how CI tests it.
 */

/* The most entries of a tp or micro-batch list; of notes; of message
 * sizes of a communication curve. */
#define PROFILER_MAX_VALUES 16
#define PROFILER_MAX_NOTES 24
#define PROFILER_MAX_COMM_SIZES 32
/* The most calls of one part queued back to back in a round. */
#define PROFILER_MAX_QUEUED 256
/* Enough rounds (or timed runs) for any sensible measurement, every set
 * of stages together; timing_summarize sorts a copy of this size on the
 * stack. */
#define PROFILER_MAX_RUNS 256
/* The most sets of stages (or of the embedding) a measurement makes. */
#define PROFILER_MAX_SETS 64
/* The most processes a measurement is repeated in. */
#define PROFILER_MAX_PROCESSES 16
/* The most layers of the layer stage (--layer-stack): more than any
 * bundled model holds (Llama-3.1-405B: 126). */
#define PROFILER_MAX_LAYER_STACK 256
/* The longest hold before a part's rounds (profiler_options.hold_s). */
#define PROFILER_MAX_HOLD_S 10.0

/* A timed quantity: the median of its timed runs and their spread,
 * (third quartile - first quartile) / median (quartiles by linear
 * interpolation between the sorted runs). */
typedef struct timing_summary {
    double median_s;
    double spread;
    int runs;
} timing_summary;

/* Summarises runs[0..count) (count >= 1; the array is left as is). */
timing_summary timing_summarize(const double *runs, int count);

/* Rounds of calls (profiler_graph.c), for profiler.c: `count` forward
 * calls of the stage at io (each followed by its backward with
 * with_backward), queued under defer_sync without waiting for them. */
int profiler_queue_calls(model_stage *stage, const stage_io *io,
                         bool with_backward, int count, pt_error *err);

/* The cuda backend's rounds: `count` forward + backward pairs captured
 * once as a CUDA graph and replayed `rounds` times, timed by events on
 * the stage's stream (seconds per pair into pair[rounds]); before them,
 * the same pairs captured with an event around every forward, whose one
 * replay gives the forwards' share of a pair: forward[r] is that share of
 * pair[r]. 1 when the calls cannot be captured (or no cuda build):
 * nothing timed, the caller queues them; -1 on a device failure. */
int profiler_graph_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err);

/* The cuda backend's gated rounds: each round's `count` forwards (then,
 * in a second round, forward + backward pairs) queued on the stage's
 * stream behind a gate that holds the device until every call is queued,
 * then timed by events on the stream from the gate's opening: the
 * device's time for the calls as a stream runs them, launch gaps
 * included, without the host's pace. `count` is cut so that a round's
 * kernels and copies fit the stream's queue. Seconds per call into
 * forward[rounds] and pair[rounds]; 1 when the calls cannot be gated (one
 * pair's kernels alone too many for the queue, or no cuda build): nothing
 * timed, the caller times them otherwise; -1 on a device failure. */
int profiler_gated_rounds(model_stage *stage, const stage_io *io, int count,
                          int rounds, double *forward, double *pair,
                          pt_error *err);

/* The backward of each round from its forward and its forward + backward
 * pair, both per call: pair - forward, but never under 5 % of the pair
 * (a pair is not faster than its forward but for noise). */
void profiler_backward_rounds(const double *forward, const double *pair,
                              int rounds, double *backward);

/* How a part's rounds are timed (docs/profiles.md, "Measuring"). */
typedef enum profiler_timing {
    /* cuda: queued behind a gate, device clock (profiler_gated_rounds) */
    PROFILER_TIMING_GATED,
    /* cuda: one CUDA graph, replayed (profiler_graph_rounds) */
    PROFILER_TIMING_GRAPH,
    /* queued as they come, host clock (the cpu; a cuda fallback) */
    PROFILER_TIMING_HOST,
    /* cuda, the layer and the head: inside training steps of the whole
     * chain, a CUDA graph of one step replayed back to back
     * (chain_step_rounds); the embedding graphed */
    PROFILER_TIMING_STEP,
    /* cuda, the layer: inside the executor's own training steps of a
     * whole model (stage_step_*), at two depths, the layer the difference
     * (chain_exec_rounds); the head what the shallower model leaves
     * beside its layers, less the embedding, where its rounds agree
     * within 5 % (tp 1; profiler.c), else stepped, as the layer where
     * that cannot be; the embedding graphed */
    PROFILER_TIMING_EXEC
} profiler_timing;

#define PROFILER_TIMINGS 5

typedef struct profiled_part {
    timing_summary forward;
    timing_summary backward;
} profiled_part;

/* One measured (tp, micro-batch) point: seconds per micro-batch on one
 * GPU of the tp group. */
typedef struct profiled_point {
    int tp;
    int mbs;
    profiled_part embedding;
    profiled_part layer;
    profiled_part head;      /* final norm, LM head and loss */
    int calls_per_round[3];  /* back to back in a round: embedding, layer,
                                head */
    profiler_timing timed[3];    /* how the part's rounds were timed (the
                                first set's; a fallback is to host) */
    bool head_fused;         /* the head stage ran fused (model_stage's
                                head_fused: its forward holds the backward
                                products), written with the head's times */
    int layers_stacked;      /* layers of the layer stage whose calls were
                                timed: the layer entries are its times
                                over this many (options.layer_stack, or
                                fewer where that many did not fit) */
} profiled_point;

/* Reported after each step of a measurement: done of total steps; point
 * is the point just measured, or NULL for another step (label says
 * which: "optimizer", "skipped: ...", "all-reduce 4.0 KiB"). */
typedef void (*profiler_progress_fn)(int done, int total, const char *label,
                                     const profiled_point *point,
                                     void *data);

typedef struct profiler_options {
    backend_kind backend;
    int device;                  /* cuda device ordinal (0) */
    int sm_limit;                /* cuda: only this many SMs, through a
                                    green context; 0: all */
    /* cuda, with sm_limit: the other slices of the same GPU (their SM
     * counts), each busy while this one is measured (a thread of its own
     * running the same model's layer forward and backward at the
     * measured tp and micro-batch, its AdamW step while the optimizer is
     * timed), as the other ranks of a plan on slices of one GPU are. 0:
     * none. */
    int beside_count;
    int beside_sms[PROFILER_MAX_VALUES];
    /* Where the measured slice sits in the split, 0..beside_count (0:
     * first, before beside_sms[0]): a slice's SMs, and so its speed, depend
     * on its place in a green-context split (docs/profiles.md, "The split,
     * measured"), so a rank is profiled at its own place. */
    int beside_place;
    /* The split made, the neighbour slices left idle: the slice's floor
     * in that split, for a model of neighbours that rest. */
    bool neighbours_idle;
    double memory_limit_bytes;   /* cuda: cap on the stages; 0: none */
    int tp_count;
    int tp_values[PROFILER_MAX_VALUES];   /* ascending */
    int mbs_count;
    int mbs_values[PROFILER_MAX_VALUES];  /* ascending */
    int warmup_runs;             /* untimed runs before each point */
    int timed_runs;              /* timed runs of a communication size,
                                    at most */
    int min_timed_runs;          /* at least */
    double device_warmup_s;      /* work before the first timing, so that
                                    clocks have ramped up; an eighth of it
                                    after the device idled a moment (the
                                    host made a set of stages, or a
                                    process before this one ran) */
    bool device_was_busy;        /* a process before this one kept the
                                    device busy until a moment ago
                                    (profiler_measure_processes sets it) */
    int timing_rounds;           /* rounds of back-to-back calls of a part,
                                    per set of stages */
    int stage_sets;              /* the part stages are made this many
                                    times, each set measured: an entry is
                                    the median of the rounds of every set
                                    (a set's buffers land elsewhere in
                                    memory, and small entries move with
                                    them; docs/profiles.md) */
    int embedding_sets;          /* the embedding's sets: stage_sets, plus
                                    its stage made again in fresh memory
                                    for the rest (its entries move most
                                    with their buffers' place); 0:
                                    stage_sets */
    int processes;               /* the measurement made in this many
                                    fresh processes, one after the other,
                                    each entry the mean of theirs
                                    (profiler_measure_processes: a small
                                    entry's level moves from process to
                                    process); 1: in this process */
    double round_s;              /* a round lasts about this long: calls
                                    queued in it, 1 to PROFILER_MAX_QUEUED */
    double hold_s;               /* cuda: before the layer's and the
                                    head's rounds, the part's forward +
                                    backward pairs run back to back this
                                    long, untimed, so that the rounds
                                    find the clock the part's sustained
                                    load holds (a whole H200 training
                                    GPT-2 1.5B holds its 700 W cap below
                                    the clock of short rounds after
                                    idle host pauses: docs/profiles.md,
                                    "Held load"); 0: none. Timed by
                                    steps (PROFILER_TIMING_STEP): the
                                    steps run this long before the timed
                                    ones, 0 meaning a second */
    size_t host_adamw_params;    /* the host's AdamW rate is timed on this
                                    many parameters (stage_offload_host_rate;
                                    profiler_result.host_adamw_s_per_param) */
    profiler_timing timing;      /* cuda: how the layer's and the head's
                                    rounds are timed, gated by default; the
                                    embedding's are graphed, except under
                                    PROFILER_TIMING_HOST (every part as
                                    before 2026-11-28) */
    /* The layer stage holds this many distinct layers (their own
     * parameters and activations), each call running them all; a layer
     * entry is the stage's time per call over the layers it holds (the
     * mean layer of a stack, which runs slower than a lone layer on a
     * GPU: docs/profiles.md, "Layer stack"). Cut to the model's layers,
     * and halved until the stage at the largest micro-batch fits
     * (profiled_point.layers_stacked says how many were). 1: one layer in
     * a stage of its own, 1 to PROFILER_MAX_LAYER_STACK. */
    int layer_stack;
    uint64_t seed;               /* parameters and tokens */
    profiler_progress_fn progress;   /* NULL: none */
    void *progress_data;
} profiler_options;

/* The full measurement: tp 1, 2, 4, 8, micro-batches 1, 2, 4, 8, 16,
 * in 8 processes on cuda (1 on the cpu), each with 1 set of stages (the
 * embedding 4), 5 warm-up runs per point, then 3 rounds of about 5 ms a
 * part and direction (the AdamW step alike, on the first set), 2 s of
 * device warm-up in the first process (0.25 s before each later tp, set
 * and process); 7 to 256 timed runs of a communication size. */
profiler_options profiler_options_defaults(backend_kind backend);
/* Fewer runs and rounds (3, of one call), one set of stages, one
 * process, no device warm-up: for tests and a first look. */
void profiler_options_quick(profiler_options *options);
/* Checks lists (ascending powers of two for tp, ascending for mbs, each
 * 1..1024), run counts and the cuda-only options. */
int profiler_options_check(const profiler_options *options, pt_error *err);

/* The device the profile was taken on. */
typedef struct profiled_device {
    char name[256];              /* "NVIDIA H200", "cpu (16 cores)" */
    int sms;                     /* SMs of the GPU; 0 for the cpu */
    int sms_used;                /* the green context's, or sms */
    double memory_bytes;         /* the GPU's (host's for the cpu) */
    double context_bytes;        /* device memory in use before the first
                                    stage: CUDA context and libraries */
    char driver_version[64];     /* "580.95.05"; "" when unknown */
    char driver_cuda_version[16];    /* highest CUDA the driver runs */
    char runtime_cuda_version[16];   /* the CUDA runtime linked in */
} profiled_device;

typedef struct profiler_result {
    profiled_device device;
    int point_count;             /* sorted by tp, then mbs */
    profiled_point points[PROFILER_MAX_VALUES * PROFILER_MAX_VALUES];
    /* AdamW steps of the tp 1 (or smallest tp measured) layer and
     * embedding stages, and the parameters each holds (the layer stage's:
     * every layer of its stack). */
    timing_summary optimizer_layer;
    timing_summary optimizer_embedding;
    double layer_parameters;
    double embedding_parameters;
    /* optimizer_layer per parameter: a real stage is mostly layers. */
    double optimizer_s_per_param;
    /* the host's AdamW as an offloaded optimizer runs it
     * (stage_offload_host_rate), seconds per parameter */
    double host_adamw_s_per_param;
    /* the host link's copies as an offloaded optimizer makes them
     * (stage_offload_copy_rate on the layer stage), seconds per parameter
     * for 4 bytes down and 4 up; 0: not measured */
    double host_copy_s_per_param;
    int runs_warmup;             /* as run (options, after checks) */
    int runs_timed_max;
    int runs_timed_min;
    double elapsed_s;            /* wall time of the measurement */
    int note_count;              /* what was skipped and why */
    char notes[PROFILER_MAX_NOTES][320];
} profiler_result;

/* Measures the model's parts under the options into out (zeroed first).
 * Points that fail to be made or run are skipped with a note (a tp the
 * shape does not divide; a tp the backend cannot run; a micro-batch that
 * does not fit: larger ones are not tried). -1 when nothing at all could
 * be measured, or on a device failure. */
int profiler_measure(const model_shape *shape,
                     const profiler_options *options, profiler_result *out,
                     pt_error *err);

/* The host's rates alone (`partita profile --host-rates`): its AdamW over
 * options->host_adamw_params and the host link's copies of the layer
 * stage of the shape at tp 1 and the first micro-batch, timing_rounds
 * passes each, as profiler_measure times them beside its points; into
 * out (zeroed first: host_adamw_s_per_param, host_copy_s_per_param,
 * device, elapsed_s). -1 on a failure (err). */
int profiler_measure_host_rates(const model_shape *shape,
                                const profiler_options *options,
                                profiler_result *out, pt_error *err);

/* profiler_measure in options->processes child processes (fork, before
 * this process touches the device), one after the other, combined by
 * profiler_results_combine; profiler_measure itself for 1. The children
 * report progress as one measurement each, the parent "process i of n"
 * before each. */
int profiler_measure_processes(const model_shape *shape,
                               const profiler_options *options,
                               profiler_result *out, pt_error *err);
/* The results of count measurements of one model as one (out may be
 * results): the points all of them hold, each part's forward and
 * backward the mean of their medians (spread: the largest; runs: all),
 * the optimizer's alike; elapsed_s their sum; the rest from results[0],
 * plus a note for each point left out. -1 when no point is in all. */
int profiler_results_combine(const profiler_result *results, int count,
                             profiler_result *out, pt_error *err);

/* Why a tp cannot be profiled for this shape (it does not divide the
 * heads...), or NULL. */
const char *profiler_tp_refusal(const model_shape *shape, int tp);

/* Communication curves between GPUs of this machine through NCCL:
 * all-reduce, reduce-scatter and all-gather over GPUs 0 .. n - 1 for n =
 * 2, 4 and 8 as far as the machine shows that many, and send/recv from
 * GPU 0 to GPU 1; each size the whole tensor's bytes (a reduce-scatter's
 * input, an all-gather's output). */
typedef struct profiled_comm_sample {
    double bytes;
    timing_summary time;         /* one operation */
    double compute_lost;         /* the share of the operations' time
                                    that bf16 products on a stream beside
                                    them lost (PROFILER_BESIDE_SIZES
                                    only; 0: not measured) */
} profiled_comm_sample;

/* The sizes whose all-reduce, reduce-scatter and all-gather are also
 * timed beside products (where inside the measured range): 16, 64 and
 * 256 MiB, a layer's to a few layers' weights or gradients. */
#define PROFILER_BESIDE_SIZES 3

/* The most GPU counts measured: 2, 4, 8. */
#define PROFILER_MAX_COMM_COUNTS 3

/* The curves of one GPU count. */
typedef struct profiled_comm_curves {
    int gpus;                    /* GPUs 0 .. gpus - 1 */
    profiled_comm_sample allreduce[PROFILER_MAX_COMM_SIZES];
    profiled_comm_sample sendrecv[PROFILER_MAX_COMM_SIZES];  /* 0 -> 1:
                                    at 2 GPUs only, else unmeasured */
    profiled_comm_sample reduce_scatter[PROFILER_MAX_COMM_SIZES];
    profiled_comm_sample all_gather[PROFILER_MAX_COMM_SIZES];
} profiled_comm_curves;

typedef struct profiler_comm_result {
    int count_sets;              /* GPU counts measured, in curves[] */
    profiled_comm_curves curves[PROFILER_MAX_COMM_COUNTS];
    int sample_count;            /* sizes, in each curve */
    int operations_per_run[PROFILER_MAX_COMM_SIZES]; /* back to back,
                                    timed together: small messages */
    char nccl_version[16];
    double elapsed_s;
} profiler_comm_result;

/* Whether this build has NCCL and this machine shows at least two GPUs;
 * if not, why, in reason (which may be NULL). */
bool profiler_comm_available(char *reason, size_t reason_size);

/* All-reduce (fp32 sum), reduce-scatter and all-gather, in place, over
 * GPUs 0 .. n - 1 for n = 2, 4, 8 (as many as are visible), and
 * send/recv from GPU 0 to GPU 1, for every power of two from min_bytes
 * to max_bytes
 * (both powers of two): warm-up runs, then timed runs (the options'
 * counts), each of a few operations back to back when messages are small
 * (so that launch jitter averages out), host clock from the first GPU's
 * start to the last GPU's end; one thread per GPU, each in
 * options->sm_limit SMs when set. Then, at PROFILER_BESIDE_SIZES, the
 * first three again beside a stream of bf16 products (4096-square, on
 * every GPU, long enough to outlast them): compute_lost is how much
 * longer the products took than alone, over the collectives' own time
 * (device clock), averaged over the GPUs. progress reports each size
 * (point NULL). */
int profiler_measure_comm(const profiler_options *options, double min_bytes,
                          double max_bytes, profiler_comm_result *out,
                          pt_error *err);

/* ------------------------------------------------------ the profile file */

/* The models one profile measures, one shape each. */
#define PROFILER_MAX_MODELS 8

/* What a profile says of how it was made, besides the measurements. The
 * first model's result gives the device and the optimizer figure. */
typedef struct profiler_writeup {
    int model_count;
    const model_shape *shapes;          /* model_count */
    const profiler_options *options;
    const profiler_result *results;     /* model_count */
    const profiler_comm_result *comm;   /* NULL: no curves */
    const char *comm_reason;            /* why none, when comm is NULL */
    const char *gpu;                    /* the profile's GPU name */
    const char *command_line;           /* as typed */
    const char *date_utc;               /* ISO 8601 */
    int sm_limit;                       /* 0: every SM */
    double memory_limit_gib;            /* 0: the device's memory */
} profiler_writeup;

/* The profile's name for a device: its first word with a digit, cut at
 * a '-' ("NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" ->
 * "A100"), "-<N>SM" under an SM limit, then "-beside-" and the busy
 * neighbours' SMs joined by '-' ("H200-16SM-beside-16-16-16"); "cpu" on
 * the cpu backend. */
void profiler_default_gpu_name(const profiled_device *device,
                               const profiler_options *options, char *out,
                               size_t size);
/* Seconds the whole measurement took (every model, and the curves). */
double profiler_measured_seconds(const profiler_writeup *writeup);
/* The profile's JSON object, checked by the profile reader (messages
 * name output); NULL with err when out of memory or refused. */
json_t *profiler_profile_json(const profiler_writeup *writeup,
                              const char *output, pt_error *err);

#endif
