/*
 * `partita exec`'s library half: a plan of one stage on one device, or a
 * parallel plan (pp, dp or tp > 1) whose ranks run as threads of this
 * process through the parallel runtime: on the cpu backend over the
 * threads comm (pipeline_threads), on the cuda backend one GPU per rank
 * over NCCL (pipeline_gpu). Loads and checks everything before the first
 * allocation of the model (plan, options, checkpoint, dataset,
 * vocabulary, memory), then trains, timing each phase, saving checkpoints
 * that resume bit for bit, and records what happened for run.json. Both
 * paths share the data, the checkpoints and the record; only the step
 * differs.
 */
#ifdef PARTITA_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#include "executor/parallel/parallel.h"
#endif
#include "executor/run/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>


/* Ranks of a parallel run the record holds devices and memory for. */
#define RUN_MAX_RANKS (PT_MAX_STAGES * 64)

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
    size_t largest_rank_params; /* floats of the largest rank's stage */
    uint32_t *tokens;           /* gbs windows of seq + 1 ids */
    float *host_buffer;         /* largest_rank_params floats, for
                                   checkpoints */
    int events_per_iteration;   /* room per iteration: one-stage 2 x
                                   micro-batches + 1; parallel every
                                   rank's events */
    run_event *event_ring;      /* event_window iterations of events */
    long event_window;          /* 1..RUN_EVENT_WINDOW */
    int ring_counts[RUN_EVENT_WINDOW]; /* events each ring entry holds */
    long iteration_capacity;    /* records out->iterations has room for */
} run_context;

static void add_note(run_result *out, const char *text)
{
    if (out->note_count < RUN_MAX_NOTES)
        pt_copy_string(out->notes[out->note_count++], sizeof out->notes[0],
                       text);
}

#ifdef PARTITA_HAVE_CUDA
/* Removes the notes that start with prefix (a guess made before the
 * stage could say better). */
static void drop_note(run_result *out, const char *prefix)
{
    int kept = 0;
    for (int i = 0; i < out->note_count; i++)
        if (strncmp(out->notes[i], prefix, strlen(prefix)) != 0)
            memmove(out->notes[kept++], out->notes[i], sizeof out->notes[0]);
    out->note_count = kept;
}
#endif

/* ------------------------------------------------------------- options */

double run_comm_timeout(const run_options *options)
{
    if (options->comm_timeout_s > 0)
        return options->comm_timeout_s;
    return options->backend == BACKEND_CPU ? RUN_COMM_TIMEOUT_S
                                           : RUN_GPU_COMM_TIMEOUT_S;
}

run_options run_options_defaults(long iterations)
{
    run_options options = {
        .backend = BACKEND_CPU,
        .iterations = iterations,
        .seed = 1234,
        .train = train_config_defaults(),
    };
    options.train.schedule.max_lr = 6e-4;
    options.train.schedule.min_lr = 6e-5;
    options.train.schedule.warmup_steps = iterations > 0 ? iterations / 10 : 0;
    options.train.schedule.decay_steps = iterations > 0 ? iterations : 0;
    return options;
}

int run_check_plan(const plan *p, pt_error *err)
{
    const parallel_config *config = &p->config;
    if (config->dp < 1 || config->pp < 1 || config->tp < 1 ||
        config->pp > PT_MAX_STAGES || config->tp > PT_MAX_TP ||
        (long)config->dp * config->pp * config->tp > RUN_MAX_RANKS)
        return pt_fail(err, "tp %d x dp %d x pp %d: exec runs 1 to %d ranks "
                            "of 1 to %d stages, tp at most %d",
                       config->tp, config->dp, config->pp, RUN_MAX_RANKS,
                       PT_MAX_STAGES, PT_MAX_TP);
    int ranks = config->tp * config->dp * config->pp;
    int gpus = plan_gpu_count(p);
    if (ranks != gpus)
        return pt_fail(err, "the plan has tp x dp x pp = %d x %d x %d = %d "
                            "ranks, but the nodes of its node order hold %d "
                            "GPUs",
                       config->tp, config->dp, config->pp, ranks, gpus);
    if (config->mbs < 1 || config->gbs < config->mbs ||
        config->gbs % (config->mbs * config->dp) != 0)
        return pt_fail(err, "gbs %d is not a positive multiple of dp x mbs "
                            "= %d x %d",
                       config->gbs, config->dp, config->mbs);
    return 0;
}

static int check_options(const run_options *options, pt_error *err)
{
    if (options->data_prefix == NULL || options->data_prefix[0] == '\0')
        return pt_fail(err, "no dataset given (the PREFIX of PREFIX.bin and "
                            "PREFIX.idx)");
    if (options->iterations < 1)
        return pt_fail(err, "iterations must be >= 1, got %ld",
                       options->iterations);
    if (options->save_interval < 0)
        return pt_fail(err, "the save interval must be >= 0 iterations, "
                            "got %ld",
                       options->save_interval);
    if (options->seed > (uint64_t)INT64_MAX)
        return pt_fail(err, "the seed must be below 2^63 (JSON files hold "
                            "it as an integer)");
    if (!isfinite(options->train.max_grad_norm))
        return pt_fail(err, "the gradient clipping norm must be finite");
    if (lr_schedule_check(&options->train.schedule, err) != 0)
        return -1;
    return 0;
}

/* -------------------------------------------------------------- device */

static void describe_device(const plan *p, backend_kind backend,
                            run_device *device, run_result *out)
{
    device->rank = 0;
    if (backend == BACKEND_CPU) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        snprintf(device->name, sizeof device->name, "cpu (%ld cores)",
                 cores > 0 ? cores : 1);
        long pages = sysconf(_SC_PHYS_PAGES);
        long page_size = sysconf(_SC_PAGESIZE);
        device->memory_cap_bytes =
            pages > 0 && page_size > 0 ? (double)pages * (double)page_size
                                       : 0.0;
        return;
    }
    /* The backend table has no query for the device's name or versions
     * yet; take what the plan says about the device instead. */
    snprintf(device->name, sizeof device->name, "%s device",
             backend_name(backend));
    int node = plan_rank_node(p, 0);
    if (node >= 0 && node < p->cluster.node_count) {
        const node_type *type =
            &p->cluster.types[cluster_node_type(&p->cluster, node)];
        if (type->device_count > 0) {
            device->sms_used = type->devices[0].sm_limit;
            device->memory_cap_bytes =
                type->devices[0].memory_limit_gib * PT_GIB;
        }
    }
    add_note(out, "the backend interface does not report the GPU's name, "
                  "driver or CUDA version yet");
}

/* ------------------------------------------------------------- memory */

/* Floats of one activation slot and of the backward scratch, as
 * model_cpu.c carves them, for a whole-model stage at micro-batch mbs. */
double run_cpu_stage_bytes(const model_shape *shape, int mbs, bool recompute,
                           double *activation_bytes)
{
    double B = mbs, T = shape->seq, C = shape->hidden;
    double F = shape->ffn_hidden, V = shape->vocab, NH = shape->heads;
    double N = B * T;
    double per_layer = 8.0 * N * C + 4.0 * N + 2.0 * N * F + B * NH * T * T;
    /* full recompute keeps each layer's output (N x C) per slot and one
     * layer's other activations in the scratch */
    double kept = recompute ? N * C : per_layer;
    double slot = N * C + shape->layers * kept + (N * C + 3.0 * N + N * V);
    double scratch = 8.0 * N * C + 2.0 * N * F + T +
                     (recompute ? per_layer - N * C : 0.0);
    double token_ids = 2.0 * N; /* inputs and targets, uint32 */
    double activations = 4.0 * (slot + scratch + token_ids);
    if (activation_bytes != NULL)
        *activation_bytes = activations;
    return 16.0 * model_parameter_count(shape) + activations;
}

double run_cpu_partial_stage_bytes(const model_shape *shape,
                                   const stage_spec *spec, int mbs,
                                   int slot_count, double *activation_bytes)
{
    stage_shard shard = stage_shard_of(shape, spec);
    double B = mbs, T = shape->seq, C = shape->hidden;
    double A = shard.attention_channels, F = shard.ffn, V = shard.vocab_count;
    double NH = shard.heads;
    double N = B * T;
    double layers = spec->last_layer - spec->first_layer;
    /* ln1, mid, ln2, output: N x C; qkv and attention output: 4 N x A */
    double per_layer =
        4.0 * N * C + 4.0 * N * A + 4.0 * N + 2.0 * N * F + B * NH * T * T;
    /* full recompute: each layer's output per slot, one layer's other
     * activations in the scratch */
    double kept = spec->recompute_layers ? N * C : per_layer;
    double slot = N * C + layers * kept +
                  (spec->has_head ? N * C + 3.0 * N + N * V : 0.0);
    double token_ids = 2.0 * N; /* per slot: inputs and targets, uint32 */
    /* streams, mid, norm, received gradient: 5 N x C; attention 4 N x A;
     * row statistics 3 N */
    double scratch = 5.0 * N * C + 4.0 * N * A + 2.0 * N * F + T + 3.0 * N +
                     (spec->recompute_layers && layers > 0
                          ? per_layer - N * C
                          : 0.0);
    double activations = 4.0 * (slot_count * (slot + token_ids) + scratch);
    if (activation_bytes != NULL)
        *activation_bytes = activations;
    size_t params = 0, first = 0, moments = 0;
    pt_error ignored = {{0}};
    if (stage_parameter_layout(shape, spec, NULL, &params, &ignored) < 0)
        params = 0;
    stage_optimizer_range(params, spec->optimizer_shards,
                          spec->optimizer_shard, &first, &moments);
    /* params and grads; AdamW's two moments of the optimizer's range */
    return 8.0 * (double)params + 8.0 * (double)moments + activations;
}

/* The ranks this process runs, [local_first, local_end): every rank, or
 * its own one under one process per rank. */
static int local_first(const run_context *ctx)
{
    return ctx->processes ? ctx->world.rank : 0;
}

static int local_end(const run_context *ctx)
{
    if (ctx->processes)
        return ctx->world.rank + 1;
    return ctx->parallel ? ctx->layout.rank_count : 1;
}

/* The stage spec of a rank of a parallel run. */
static int rank_spec(const run_context *ctx, int rank, stage_spec *out,
                     pt_error *err)
{
    return pipeline_rank_spec(&ctx->layout, rank, out, err);
}

static int rank_param_count(const run_context *ctx, int rank, size_t *out,
                            pt_error *err)
{
    if (!ctx->parallel) {
        *out = ctx->param_count;
        return 0;
    }
    stage_spec spec;
    if (rank_spec(ctx, rank, &spec, err) != 0 ||
        stage_parameter_layout(&ctx->shape, &spec, NULL, out, err) < 0)
        return -1;
    return 0;
}

/* Floats of a rank's buffer `which`: its parameters, or for the AdamW
 * moments its optimizer's range (a ZeRO-1 shard of them). */
static int rank_buffer_count(const run_context *ctx, int rank,
                             stage_buffer which, size_t *out, pt_error *err)
{
    size_t params = 0, first = 0;
    if (rank_param_count(ctx, rank, &params, err) != 0)
        return -1;
    *out = params;
    if (!ctx->parallel || (which != STAGE_ADAM_M && which != STAGE_ADAM_V))
        return 0;
    stage_spec spec;
    if (rank_spec(ctx, rank, &spec, err) != 0)
        return -1;
    stage_optimizer_range(params, spec.optimizer_shards,
                          spec.optimizer_shard, &first, out);
    return 0;
}

#ifdef PARTITA_HAVE_CUDA
static device_spec own_device(const run_context *ctx);
static int check_own_gpu(const run_context *ctx, pt_error *err);

/* The GPUs of this machine as device_check_plan wants them; free memory
 * is asked only of the devices the plan's ranks use (asking creates a
 * CUDA context there). */
static int query_local_devices(const plan *p, int rank_count,
                               local_device *devices, int count,
                               pt_error *err)
{
    for (int d = 0; d < count; d++) {
        struct cudaDeviceProp properties;
        if (cudaGetDeviceProperties(&properties, d) != cudaSuccess) {
            cudaGetLastError();
            return pt_fail(err, "cuda device %d: cannot read its "
                                "properties",
                           d);
        }
        devices[d] = (local_device){
            .index = d,
            .total_memory_bytes = (double)properties.totalGlobalMem,
            .free_memory_bytes = (double)properties.totalGlobalMem,
            .multiprocessors = properties.multiProcessorCount};
        pt_copy_string(devices[d].name, sizeof devices[d].name,
                       properties.name);
    }
    for (int rank = 0; rank < rank_count; rank++) {
        device_spec spec;
        size_t free_bytes = 0, total_bytes = 0;
        if (plan_rank_device(p, rank, &spec) != 0 || spec.index < 0 ||
            spec.index >= count)
            continue; /* device_check_plan names it */
        if (cudaSetDevice(spec.index) != cudaSuccess ||
            cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
            cudaGetLastError();
            return pt_fail(err, "cuda device %d: cannot read its free "
                                "memory",
                           spec.index);
        }
        devices[spec.index].free_memory_bytes = (double)free_bytes;
    }
    return 0;
}

/* A parallel plan against this machine's GPUs before anything is
 * allocated on them: device count, GPU types, sm_limit and
 * memory_limit_gib, and each rank's floor of 10 bytes per parameter of
 * its stage (fp32 weights and gradients, the bf16 copy) and 8 per
 * parameter of its optimizer's range (AdamW's moments: all, or a ZeRO-1
 * shard); activations come on top and are counted against the rank's cap
 * as the stage allocates them. */
static int check_gpu_devices(const run_context *ctx, pt_error *err)
{
    if (ctx->processes)
        return check_own_gpu(ctx, err);
    int ranks = ctx->layout.rank_count;
    int count = cuda_device_count();
    local_device *devices = calloc((size_t)(count > 0 ? count : 1),
                                   sizeof *devices);
    double *needed = calloc((size_t)ranks, sizeof *needed);
    int status = devices != NULL && needed != NULL
                     ? query_local_devices(ctx->plan, ranks, devices, count,
                                           err)
                     : pt_fail(err, "out of memory checking the devices");
    for (int rank = 0; status == 0 && rank < ranks; rank++) {
        size_t params = 0, moments = 0;
        status = rank_param_count(ctx, rank, &params, err) != 0 ||
                         rank_buffer_count(ctx, rank, STAGE_ADAM_M, &moments,
                                           err) != 0
                     ? -1
                     : 0;
        needed[rank] = 10.0 * (double)params + 8.0 * (double)moments;
    }
    if (status == 0)
        status = device_check_plan(ctx->plan, devices, count, needed, err);
    free(devices);
    free(needed);
    return status;
}
#else
static int check_gpu_devices(const run_context *ctx, pt_error *err)
{
    return pt_fail(err, "parallel plans on the %s backend are not built in "
                        "this binary",
                   backend_name(ctx->options->backend));
}
#endif

/* A parallel run's ranks all live in this process: each rank's figure is
 * its own stage, and the check is of their sum (and the checkpoint
 * buffer) against the machine; on GPUs, device_check_plan's checks. */
static int check_parallel_memory(const run_context *ctx, run_result *out,
                                 pt_error *err)
{
    double total = 0.0, largest_activations = 0.0;
    int largest_rank = local_first(ctx);
    for (int rank = local_first(ctx); rank < local_end(ctx); rank++) {
        stage_spec spec;
        if (rank_spec(ctx, rank, &spec, err) != 0)
            return -1;
        int stage = pipeline_rank_stage(&ctx->layout, rank);
        double activations = 0.0;
        double bytes = run_cpu_partial_stage_bytes(
            &ctx->shape, &spec, out->mbs,
            pipeline_slot_count(&ctx->layout, stage), &activations);
        out->rank_peak_memory_bytes[rank] = bytes;
        total += bytes;
        if (bytes > out->rank_peak_memory_bytes[largest_rank] ||
            rank == local_first(ctx)) {
            largest_rank = rank;
            largest_activations = activations;
        }
    }
    out->peak_memory_bytes = out->rank_peak_memory_bytes[largest_rank];
    if (ctx->options->backend != BACKEND_CPU)
        return check_gpu_devices(ctx, err);
    if (ctx->options->save_dir != NULL || ctx->options->load_dir != NULL)
        total += 4.0 * (double)ctx->largest_rank_params;
    double available = ctx->options->memory_available_bytes > 0
                           ? ctx->options->memory_available_bytes
                           : out->device.memory_cap_bytes;
    if (available <= 0 || total <= available)
        return 0;
    char total_text[32], have_text[32], rank_text[32], act_text[32];
    pt_format_bytes(total, total_text, sizeof total_text);
    pt_format_bytes(available, have_text, sizeof have_text);
    pt_format_bytes(out->peak_memory_bytes, rank_text, sizeof rank_text);
    pt_format_bytes(largest_activations, act_text, sizeof act_text);
    if (ctx->processes)
        return pt_fail(err, "not enough memory: rank %d of this plan needs "
                            "%s on the cpu backend (activations %s at "
                            "micro-batch %d), its machine has %s",
                       largest_rank, total_text, act_text, out->mbs,
                       have_text);
    return pt_fail(err, "not enough memory: the %d ranks of this plan run "
                        "as threads of one process and need %s in all on "
                        "the cpu backend (rank %d the most: %s, of which "
                        "activations %s at micro-batch %d), the machine has "
                        "%s",
                   out->rank_count, total_text, largest_rank, rank_text,
                   act_text, out->mbs, have_text);
}

static int check_memory(const run_context *ctx, run_result *out,
                        pt_error *err)
{
    if (ctx->parallel)
        return check_parallel_memory(ctx, out, err);
    double activations = 0.0;
    double needed = run_cpu_stage_bytes(&ctx->shape, ctx->plan->config.mbs,
                                        ctx->plan->config.recompute,
                                        &activations);
    double state = needed - activations;
    if (ctx->options->save_dir != NULL || ctx->options->load_dir != NULL)
        needed += 4.0 * (double)ctx->param_count; /* checkpoint buffer */
    out->peak_memory_bytes = needed;
    out->rank_peak_memory_bytes[0] = needed;
    if (ctx->options->backend != BACKEND_CPU)
        return 0; /* a GPU backend's allocation reports its own shortage */
    double available = ctx->options->memory_available_bytes > 0
                           ? ctx->options->memory_available_bytes
                           : out->device.memory_cap_bytes;
    if (available <= 0 || needed <= available)
        return 0;
    char need_text[32], have_text[32], state_text[32], act_text[32];
    pt_format_bytes(needed, need_text, sizeof need_text);
    pt_format_bytes(available, have_text, sizeof have_text);
    pt_format_bytes(state, state_text, sizeof state_text);
    pt_format_bytes(activations, act_text, sizeof act_text);
    return pt_fail(err, "not enough memory: the cpu backend needs %s "
                        "(parameters, gradients and AdamW moments %s at 16 "
                        "bytes per parameter, activations %s at micro-batch "
                        "%d), the machine has %s",
                   need_text, state_text, act_text, ctx->plan->config.mbs,
                   have_text);
}

/* ------------------------------------------------------------- dataset */

static int find_largest_token(const indexed_dataset *ds, uint32_t *out,
                              pt_error *err)
{
    enum { CHUNK = 65536 };
    uint32_t *buffer = malloc(CHUNK * sizeof *buffer);
    if (buffer == NULL)
        return pt_fail(err, "out of memory scanning %s", ds->bin_path);
    uint32_t largest = 0;
    for (uint64_t s = 0; s < ds->sequence_count; s++) {
        uint64_t length = indexed_dataset_sequence_length(ds, s);
        for (uint64_t first = 0; first < length; first += CHUNK) {
            uint64_t count = length - first < CHUNK ? length - first : CHUNK;
            if (indexed_dataset_read_tokens(ds, s, first, count, buffer,
                                            err) != 0) {
                free(buffer);
                return -1;
            }
            for (uint64_t i = 0; i < count; i++)
                if (buffer[i] > largest)
                    largest = buffer[i];
        }
    }
    free(buffer);
    *out = largest;
    return 0;
}

static int open_data(run_context *ctx, uint64_t seed, run_result *out,
                     pt_error *err)
{
    const char *prefix = ctx->options->data_prefix;
    if (indexed_dataset_open(&ctx->dataset, prefix, err) != 0)
        return -1;
    ctx->dataset_open = true;
    out->dataset_tokens = ctx->dataset.total_tokens;
    out->dataset_documents = ctx->dataset.document_count;
    if (find_largest_token(&ctx->dataset, &out->largest_token, err) != 0)
        return -1;
    if ((uint64_t)out->largest_token >= (uint64_t)ctx->shape.vocab)
        return pt_fail(err, "model %s has vocab %d, but dataset %s holds "
                            "token %u (a vocabulary of at least %llu is "
                            "needed)",
                       ctx->shape.name, ctx->shape.vocab, prefix,
                       out->largest_token,
                       (unsigned long long)out->largest_token + 1);
    if (gpt_sampler_init(&ctx->sampler, &ctx->dataset,
                         (uint64_t)ctx->shape.seq, seed,
                         (uint32_t)ctx->shape.vocab, err) != 0) {
        pt_error_prefix(err, "dataset %s", prefix);
        return -1;
    }
    ctx->sampler_ready = true;
    if (!ctx->resume.active)
        return 0;
    if (gpt_sampler_decode_position(&ctx->sampler, ctx->resume.position,
                                    DATA_POSITION_BYTES, &ctx->position,
                                    err) != 0) {
        pt_error_prefix(err, "%s: %s", ctx->options->load_dir,
                        BLOB_POSITION);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------- checkpoint */

/* The model fields a checkpoint must agree on, in the order checked. */
static const char *const shape_fields[] = {
    "layers", "hidden", "heads", "ffn_hidden", "seq", "vocab",
};

static int shape_field(const model_shape *shape, size_t index)
{
    const int values[] = {shape->layers,     shape->hidden, shape->heads,
                          shape->ffn_hidden, shape->seq,    shape->vocab};
    return values[index];
}

static model_stage *rank_stage(run_context *ctx, int rank)
{
    return ctx->parallel ? &ctx->launcher->stages[rank] : &ctx->stage;
}

static int rank_total(const run_context *ctx)
{
    return ctx->parallel ? ctx->layout.rank_count : 1;
}

/* A state blob's name: "params" for a one-stage run, "params.rank3" for
 * rank 3 of a parallel one. */
static void blob_name(const run_context *ctx, const char *base, int rank,
                      char *out, size_t size)
{
    if (ctx->parallel)
        snprintf(out, size, "%s.rank%d", base, rank);
    else
        snprintf(out, size, "%s", base);
}

/* Whether the ranks keep ZeRO-1 shards of the AdamW state (the plan asks
 * and dp > 1): the checkpoint's moment blobs are shards then. */
static bool sharded_optimizer(const run_context *ctx)
{
    return ctx->parallel && ctx->plan->config.distributed_optimizer &&
           ctx->plan->config.dp > 1;
}

/* meta.json: what a person (or a resume) needs to know about the
 * checkpoint (pp, dp and the partition say which stage each rank's blobs
 * hold). The blobs hold the state itself. */
static char *checkpoint_meta_text(run_context *ctx, long iteration,
                                  uint64_t seed)
{
    json_t *model = json_object();
    json_t *meta = json_object();
    if (model == NULL || meta == NULL) {
        json_decref(model);
        json_decref(meta);
        return NULL;
    }
    json_object_set_new(model, "name", json_string(ctx->shape.name));
    for (size_t i = 0; i < sizeof shape_fields / sizeof shape_fields[0]; i++)
        json_object_set_new(model, shape_fields[i],
                            json_integer(shape_field(&ctx->shape, i)));
    json_object_set_new(model, "tied_embeddings",
                        json_boolean(ctx->shape.tied_embeddings));
    json_object_set_new(meta, "format", json_string(RUN_CHECKPOINT_FORMAT));
    json_object_set_new(meta, "iteration", json_integer(iteration));
    json_object_set_new(
        meta, "optimizer_steps",
        json_integer(rank_stage(ctx, local_first(ctx))->optimizer_steps));
    json_t *partition = json_array();
    for (int s = 0; partition != NULL && s < ctx->plan->config.pp; s++)
        json_array_append_new(partition,
                              json_integer(ctx->parallel
                                               ? ctx->layout.partition[s]
                                               : ctx->shape.layers));
    json_object_set_new(meta, "pp", json_integer(ctx->plan->config.pp));
    json_object_set_new(meta, "dp", json_integer(ctx->plan->config.dp));
    json_object_set_new(meta, "tp", json_integer(ctx->plan->config.tp));
    json_object_set_new(meta, "distributed_optimizer",
                        json_boolean(sharded_optimizer(ctx)));
    json_object_set_new(meta, "partition", partition);
    json_object_set_new(meta, "seed", json_integer((json_int_t)seed));
    json_object_set_new(meta, "backend",
                        json_string(backend_name(ctx->options->backend)));
    json_object_set_new(meta, "gbs", json_integer(ctx->plan->config.gbs));
    json_object_set_new(meta, "mbs", json_integer(ctx->plan->config.mbs));
    json_object_set_new(meta, "param_count",
                        json_integer((json_int_t)ctx->param_count));
    json_object_set_new(meta, "model", model);
    char *text = json_dumps(meta, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(meta);
    return text;
}

/* One buffer of a rank's stage to or from ctx->host_buffer. */
typedef struct buffer_copy {
    float *host;
    stage_buffer which;
    bool to_host;
} buffer_copy;

static int copy_buffer_task(void *data, int rank, model_stage *stage,
                            pt_error *err)
{
    (void)rank;
    const buffer_copy *copy = data;
    return copy->to_host ? model_stage_read(stage, copy->which, copy->host,
                                            err)
                         : model_stage_write(stage, copy->which, copy->host,
                                             err);
}

/* The copy runs on the rank's own thread in a parallel run, where the
 * rank's device (and green context) is current. */
static int copy_stage_buffer(run_context *ctx, int rank, stage_buffer which,
                             bool to_host, pt_error *err)
{
    buffer_copy copy = {.host = ctx->host_buffer, .which = which,
                        .to_host = to_host};
    if (!ctx->parallel)
        return copy_buffer_task(&copy, 0, &ctx->stage, err);
    return pipeline_threads_on_rank(ctx->launcher, rank, copy_buffer_task,
                                    &copy, err);
}

static int write_state_blob(checkpoint_writer *w, run_context *ctx,
                            int rank, stage_buffer which, const char *base,
                            pt_error *err)
{
    model_stage *stage = rank_stage(ctx, rank);
    char name[64];
    blob_name(ctx, base, rank, name, sizeof name);
    if (copy_stage_buffer(ctx, rank, which, true, err) != 0)
        return -1;
    return checkpoint_write_blob(
        w, name, ctx->host_buffer,
        model_stage_buffer_count(stage, which) * sizeof(float), err);
}

static int write_rank_blobs(checkpoint_writer *w, run_context *ctx,
                            pt_error *err)
{
    for (int rank = local_first(ctx); rank < local_end(ctx); rank++)
        if (write_state_blob(w, ctx, rank, STAGE_PARAMS, BLOB_PARAMS,
                             err) != 0 ||
            write_state_blob(w, ctx, rank, STAGE_ADAM_M, BLOB_ADAM_M,
                             err) != 0 ||
            write_state_blob(w, ctx, rank, STAGE_ADAM_V, BLOB_ADAM_V,
                             err) != 0)
            return -1;
    return 0;
}

static int write_checkpoint_blobs(checkpoint_writer *w, run_context *ctx,
                                  long iteration, uint64_t seed,
                                  pt_error *err)
{
    unsigned char steps[8], rng[8], position[DATA_POSITION_BYTES];
    pt_store_le(steps,
             (uint64_t)rank_stage(ctx, local_first(ctx))->optimizer_steps,
             8);
    pt_store_le(rng, seed, 8);
    gpt_sampler_encode_position(&ctx->sampler, &ctx->position, position);
    if ((!ctx->processes && write_rank_blobs(w, ctx, err) != 0) ||
        checkpoint_write_blob(w, BLOB_STEPS, steps, sizeof steps, err) != 0 ||
        checkpoint_write_blob(w, BLOB_POSITION, position, sizeof position,
                              err) != 0 ||
        checkpoint_write_blob(w, BLOB_RNG, rng, sizeof rng, err) != 0)
        return -1;
    char *meta = checkpoint_meta_text(ctx, iteration, seed);
    if (meta == NULL)
        return pt_fail(err, "%s: out of memory writing %s",
                       ctx->options->save_dir, BLOB_META);
    int status = checkpoint_write_blob(w, BLOB_META, meta, strlen(meta), err);
    free(meta);
    return status;
}

static int save_checkpoint_processes(run_context *ctx, long iteration,
                                     uint64_t seed, pt_error *err);

static int save_checkpoint(run_context *ctx, long iteration, uint64_t seed,
                           pt_error *err)
{
    if (ctx->processes)
        return save_checkpoint_processes(ctx, iteration, seed, err);
    checkpoint_writer writer;
    if (checkpoint_writer_begin(&writer, ctx->options->save_dir, err) != 0)
        return -1;
    if (write_checkpoint_blobs(&writer, ctx, iteration, seed, err) != 0 ||
        checkpoint_writer_commit(&writer, err) != 0) {
        checkpoint_writer_abort(&writer);
        return -1;
    }
    return 0;
}

/* An integer field of meta.json; a missing one is `missing` (checkpoints
 * of one-stage runs written before pp and dp were recorded). */
static int meta_integer(const json_t *meta, const char *key, int missing,
                        long long *out)
{
    const json_t *value = json_object_get(meta, key);
    if (value == NULL) {
        *out = missing;
        return 0;
    }
    if (!json_is_integer(value))
        return -1;
    *out = json_integer_value(value);
    return 0;
}

/* A checkpoint holds one set of blobs per rank of the layout that saved
 * it: refuse another layout, naming the first field that differs. */
static int check_checkpoint_layout(const char *dir, const json_t *meta,
                                   const plan *p, pt_error *err)
{
    const char *const keys[] = {"pp", "dp", "tp"};
    const int expected[] = {p->config.pp, p->config.dp, p->config.tp};
    for (int i = 0; i < 3; i++) {
        long long value = 0;
        if (meta_integer(meta, keys[i], 1, &value) != 0)
            return pt_fail(err, "%s: %s: %s is not an integer", dir,
                           BLOB_META, keys[i]);
        if (value != expected[i])
            return pt_fail(err, "%s: the checkpoint is of another layout: "
                                "%s: %s is %lld, the plan has %s %d (a "
                                "checkpoint resumes under the layout that "
                                "saved it)",
                           dir, BLOB_META, keys[i], value, keys[i],
                           expected[i]);
    }
    const json_t *sharded = json_object_get(meta, "distributed_optimizer");
    bool expected_sharded =
        p->config.distributed_optimizer && p->config.dp > 1;
    if (sharded != NULL && !json_is_boolean(sharded))
        return pt_fail(err, "%s: %s: distributed_optimizer is not a boolean",
                       dir, BLOB_META);
    if ((sharded != NULL && json_is_true(sharded)) != expected_sharded)
        return pt_fail(err, "%s: the checkpoint is of another layout: %s: "
                            "distributed_optimizer is %s, the plan's is %s "
                            "(ZeRO-1 checkpoints hold each replica's shard "
                            "of the AdamW state)",
                       dir, BLOB_META, expected_sharded ? "false" : "true",
                       expected_sharded ? "true" : "false");
    const json_t *partition = json_object_get(meta, "partition");
    if (partition == NULL)
        return p->config.pp == 1 ? 0
                                 : pt_fail(err, "%s: %s: partition is "
                                                "missing",
                                           dir, BLOB_META);
    for (int s = 0; s < p->config.pp; s++) {
        const json_t *layers = json_array_get(partition, (size_t)s);
        if (!json_is_array(partition) ||
            json_array_size(partition) != (size_t)p->config.pp ||
            !json_is_integer(layers))
            return pt_fail(err, "%s: %s: partition is not an array of %d "
                                "layer counts",
                           dir, BLOB_META, p->config.pp);
        if (json_integer_value(layers) != p->partition[s])
            return pt_fail(err, "%s: the checkpoint is of another layout: "
                                "%s: partition[%d] is %lld layers, the "
                                "plan's stage %d holds %d",
                           dir, BLOB_META, s,
                           (long long)json_integer_value(layers), s,
                           p->partition[s]);
    }
    return 0;
}

/* Reads meta.json and refuses a checkpoint of another model or layout,
 * naming the first field that differs. */
static int check_checkpoint_model(const char *dir, const model_shape *shape,
                                  const plan *p, pt_error *err)
{
    uint64_t bytes = 0;
    if (checkpoint_blob_size(dir, BLOB_META, &bytes, err) != 0)
        return -1;
    char *text = malloc((size_t)bytes + 1);
    if (text == NULL)
        return pt_fail(err, "%s: out of memory reading %s", dir, BLOB_META);
    if (checkpoint_read_blob(dir, BLOB_META, text, (size_t)bytes, err) != 0) {
        free(text);
        return -1;
    }
    json_error_t json_err;
    json_t *meta = json_loadb(text, (size_t)bytes, 0, &json_err);
    free(text);
    json_t *model = json_object_get(meta, "model");
    const char *format = json_string_value(json_object_get(meta, "format"));
    if (meta == NULL || !json_is_object(model) || format == NULL ||
        strcmp(format, RUN_CHECKPOINT_FORMAT) != 0) {
        json_decref(meta);
        return pt_fail(err, "%s: %s: not a run checkpoint (expected format "
                            "\"%s\" and a \"model\" object)",
                       dir, BLOB_META, RUN_CHECKPOINT_FORMAT);
    }
    int status = 0;
    for (size_t i = 0; i < sizeof shape_fields / sizeof shape_fields[0];
         i++) {
        json_t *value = json_object_get(model, shape_fields[i]);
        int expected = shape_field(shape, i);
        if (!json_is_integer(value)) {
            status = pt_fail(err, "%s: %s: model.%s is missing or not an "
                                  "integer",
                             dir, BLOB_META, shape_fields[i]);
            break;
        }
        if (json_integer_value(value) != expected) {
            status = pt_fail(err, "%s: the checkpoint is of another model: "
                                  "%s: model.%s is %lld, the plan's model %s "
                                  "has %d",
                             dir, BLOB_META, shape_fields[i],
                             (long long)json_integer_value(value),
                             shape->name, expected);
            break;
        }
    }
    json_t *tied = json_object_get(model, "tied_embeddings");
    if (status == 0 && (!json_is_boolean(tied) ||
                        json_is_true(tied) != shape->tied_embeddings))
        status = pt_fail(err, "%s: the checkpoint is of another model: %s: "
                              "model.tied_embeddings differs from the plan's "
                              "model %s (%s)",
                         dir, BLOB_META, shape->name,
                         shape->tied_embeddings ? "true" : "false");
    if (status == 0)
        status = check_checkpoint_layout(dir, meta, p, err);
    json_decref(meta);
    return status;
}

static int check_state_blob_size(const char *dir, const char *base,
                                 stage_buffer which, int rank,
                                 const run_context *ctx, pt_error *err)
{
    char name[64];
    blob_name(ctx, base, rank, name, sizeof name);
    size_t floats = 0;
    if (rank_buffer_count(ctx, rank, which, &floats, err) != 0)
        return -1;
    uint64_t bytes = 0;
    if (checkpoint_blob_size(dir, name, &bytes, err) != 0)
        return -1;
    uint64_t expected = (uint64_t)floats * sizeof(float);
    if (bytes != expected)
        return pt_fail(err, "%s: %s holds %llu bytes, the plan's model %s "
                            "needs %llu (%zu parameters)",
                       dir, name, (unsigned long long)bytes, ctx->shape.name,
                       (unsigned long long)expected, floats);
    return 0;
}

static int check_rank_blob_sizes(const char *dir, const run_context *ctx,
                                 pt_error *err)
{
    for (int rank = 0; rank < rank_total(ctx); rank++)
        if (check_state_blob_size(dir, BLOB_PARAMS, STAGE_PARAMS, rank, ctx,
                                  err) != 0 ||
            check_state_blob_size(dir, BLOB_ADAM_M, STAGE_ADAM_M, rank, ctx,
                                  err) != 0 ||
            check_state_blob_size(dir, BLOB_ADAM_V, STAGE_ADAM_V, rank, ctx,
                                  err) != 0)
            return -1;
    return 0;
}

/* Checks the whole checkpoint (checksums, model, sizes) and reads its
 * small blobs: after this only the big buffers remain to be copied. */
static int read_resume_state(run_context *ctx, pt_error *err)
{
    const char *dir = ctx->options->load_dir;
    if (checkpoint_verify(dir, err) != 0 ||
        check_checkpoint_model(dir, &ctx->shape, ctx->plan, err) != 0 ||
        check_rank_blob_sizes(dir, ctx, err) != 0)
        return -1;
    unsigned char steps[8], rng[8];
    if (checkpoint_read_blob(dir, BLOB_STEPS, steps, sizeof steps, err) != 0 ||
        checkpoint_read_blob(dir, BLOB_RNG, rng, sizeof rng, err) != 0 ||
        checkpoint_read_blob(dir, BLOB_POSITION, ctx->resume.position,
                             DATA_POSITION_BYTES, err) != 0)
        return -1;
    uint64_t step_count = pt_load_le(steps, 8);
    if (step_count > (uint64_t)INT32_MAX)
        return pt_fail(err, "%s: %s: %llu steps is not a plausible count",
                       dir, BLOB_STEPS, (unsigned long long)step_count);
    ctx->resume.optimizer_steps = (long)step_count;
    ctx->resume.seed = pt_load_le(rng, 8);
    ctx->resume.active = true;
    const run_options *options = ctx->options;
    if (options->seed_given && options->seed != ctx->resume.seed)
        return pt_fail(err, "%s: the checkpoint was saved by a run with seed "
                            "%llu, this run asks for seed %llu (resuming "
                            "would draw other samples; leave the seed out "
                            "to continue with %llu)",
                       dir, (unsigned long long)ctx->resume.seed,
                       (unsigned long long)options->seed,
                       (unsigned long long)ctx->resume.seed);
    if (ctx->resume.optimizer_steps >= options->iterations)
        return pt_fail(err, "%s: the checkpoint is at iteration %ld and the "
                            "run ends at iteration %ld: nothing left to run "
                            "(raise the iteration count)",
                       dir, ctx->resume.optimizer_steps, options->iterations);
    return 0;
}

static int restore_state_blob(run_context *ctx, int rank, stage_buffer which,
                              const char *base, pt_error *err)
{
    model_stage *stage = rank_stage(ctx, rank);
    char name[64];
    blob_name(ctx, base, rank, name, sizeof name);
    if (checkpoint_read_blob(
            ctx->options->load_dir, name, ctx->host_buffer,
            model_stage_buffer_count(stage, which) * sizeof(float),
            err) != 0)
        return -1;
    return copy_stage_buffer(ctx, rank, which, false, err);
}

static int restore_checkpoint(run_context *ctx, pt_error *err)
{
    for (int rank = local_first(ctx); rank < local_end(ctx); rank++) {
        if (restore_state_blob(ctx, rank, STAGE_PARAMS, BLOB_PARAMS,
                               err) != 0 ||
            restore_state_blob(ctx, rank, STAGE_ADAM_M, BLOB_ADAM_M,
                               err) != 0 ||
            restore_state_blob(ctx, rank, STAGE_ADAM_V, BLOB_ADAM_V,
                               err) != 0)
            return -1;
        rank_stage(ctx, rank)->optimizer_steps = ctx->resume.optimizer_steps;
    }
    return 0;
}

/* --------------------------------------------------------- preparation */

static void describe_plan_fit(const plan *p, backend_kind backend,
                              run_result *out)
{
    char note[256];
    if (backend == BACKEND_CPU && p->config.precision != PRECISION_FP32) {
        snprintf(note, sizeof note, "the plan asks for %s; the cpu backend "
                                    "computes in fp32",
                 precision_name(p->config.precision));
        add_note(out, note);
    }
}

static void fill_result_header(const run_context *ctx, run_result *out)
{
    const run_options *options = ctx->options;
    const parallel_config *config = &ctx->plan->config;
    out->backend = options->backend;
    pt_copy_string(out->data_prefix, sizeof out->data_prefix,
                   options->data_prefix);
    out->gbs = config->gbs;
    out->mbs = config->mbs;
    out->pp = config->pp;
    out->dp = config->dp;
    out->rank_count = config->pp * config->dp * config->tp;
    out->tp = config->tp;
    /* per replica: each of the dp replicas runs gbs / dp windows */
    out->micro_batches = config->gbs / (config->dp * config->mbs);
    out->tokens_per_iteration = (long)config->gbs * ctx->shape.seq;
    out->schedule = options->train.schedule;
    out->max_grad_norm = options->train.max_grad_norm;
    out->first_iteration = 1;
    out->last_iteration = options->iterations;
    if (options->load_dir != NULL)
        pt_copy_string(out->resumed_from, sizeof out->resumed_from,
                       options->load_dir);
    out->peak_memory_basis =
        ctx->parallel
            ? "computed per rank: its stage's parameters and gradients (8 "
              "bytes per parameter of the stage) and AdamW moments (8 bytes "
              "per parameter of its optimizer's range: all, or its ZeRO-1 "
              "shard), and the "
              "activations of the micro-batches it keeps in flight (its 1F1B "
              "or GPipe slot count) and one backward scratch, as the cpu "
              "backend allocates them; the ranks are threads of one process, "
              "whose shared checkpoint buffer is not in any rank's figure"
        : options->backend == BACKEND_CPU
            ? "computed: parameters, gradients and AdamW moments (16 bytes "
              "per parameter), activations and backward scratch of one "
              "micro-batch as the cpu backend allocates them, and the "
              "checkpoint buffer when saving or loading"
            : "estimated: 16 bytes per parameter plus fp32 activations as "
              "the cpu backend lays them out (the backend interface does "
              "not report device memory yet)";
    describe_device(ctx->plan, options->backend, &out->device, out);
    for (int rank = 0; rank < out->rank_count; rank++) {
        out->devices[rank] = out->device;
        out->devices[rank].rank = rank;
    }
    describe_plan_fit(ctx->plan, options->backend, out);
    if (ctx->processes) {
        char note[256];
        snprintf(note, sizeof note,
                 "the %d ranks (pp %d x dp %d x tp %d) ran as %d processes "
                 "(MPI), one rank each, %s",
                 out->rank_count, out->pp, out->dp, out->tp, out->rank_count,
                 options->backend == BACKEND_CPU
                     ? "communicating over MPI"
                     : "one GPU each, communicating over NCCL");
        add_note(out, note);
    } else if (ctx->parallel) {
        char note[384];
        snprintf(note, sizeof note,
                 "the %d ranks (pp %d x dp %d x tp %d) ran as threads of "
                 "one process, %s",
                 out->rank_count, out->pp, out->dp, out->tp,
                 options->backend == BACKEND_CPU
                     ? "sharing the cpu's cores and memory"
                 : ctx->gpu_comm == RUN_GPU_COMM_HOST
                     ? "on this machine's GPUs (ranks may share one, each "
                       "in its own slice of SMs), communicating through "
                       "host memory (the host-staged comm: slow, for "
                       "checks, not for speed)"
                     : "one GPU each, communicating over NCCL");
        add_note(out, note);
    }
}

/* A cuda stage knows its device and the bytes it allocated: report those
 * instead of the plan's figures and the cpu layout's estimate. */
static void describe_cuda_stage(run_context *ctx, run_result *out)
{
#ifdef PARTITA_HAVE_CUDA
    if (ctx->options->backend != BACKEND_CUDA)
        return;
    cuda_device_info info;
    if (cuda_device_describe(&info) != 0)
        return;
    run_device *device = &out->device;
    pt_copy_string(device->name, sizeof device->name, info.name);
    if (device->sms_used == 0)
        device->sms_used = info.multiprocessors;
    if (device->memory_cap_bytes <= 0)
        device->memory_cap_bytes = info.memory_bytes;
    snprintf(device->driver_version, sizeof device->driver_version,
             "CUDA %s", info.driver_cuda_version);
    snprintf(device->cuda_version, sizeof device->cuda_version, "%s",
             info.runtime_cuda_version);
    out->peak_memory_bytes = (double)cuda_stage_device_bytes(&ctx->stage);
    out->rank_peak_memory_bytes[0] = out->peak_memory_bytes;
    out->devices[0] = *device;
    out->peak_memory_basis =
        "device bytes the cuda stage allocated: fp32 parameters, gradients "
        "and AdamW moments, the bf16 weight mirror, activations, backward "
        "scratch and the cuBLASLt workspace (not the CUDA context)";
    drop_note(out, "the backend interface does not report");
#else
    (void)ctx;
    (void)out;
#endif
}

static int allocate_buffers(run_context *ctx, const run_result *out,
                            pt_error *err)
{
    size_t window = (size_t)ctx->shape.seq + 1;
    ctx->tokens = malloc((size_t)out->gbs * window * sizeof *ctx->tokens);
    ctx->events_per_iteration =
        ctx->parallel ? out->rank_count * (6 * out->micro_batches + 4)
                      : 2 * out->micro_batches + 1;
    ctx->event_window = RUN_EVENT_BUDGET / ctx->events_per_iteration;
    if (ctx->event_window > RUN_EVENT_WINDOW)
        ctx->event_window = RUN_EVENT_WINDOW;
    if (ctx->event_window < 1)
        ctx->event_window = 1;
    ctx->event_ring = calloc((size_t)ctx->event_window *
                                 (size_t)ctx->events_per_iteration,
                             sizeof *ctx->event_ring);
    if (ctx->options->save_dir != NULL || ctx->options->load_dir != NULL)
        ctx->host_buffer =
            malloc(ctx->largest_rank_params * sizeof(float) + 1);
    if (ctx->tokens == NULL || ctx->event_ring == NULL ||
        ((ctx->options->save_dir != NULL || ctx->options->load_dir != NULL) &&
         ctx->host_buffer == NULL))
        return pt_fail(err, "out of memory for the run's buffers");
    return 0;
}

/* The GPU a rank of a thread-launched run uses (start_gpus' rule). */
static int rank_gpu_index(const plan *p, int rank)
{
    device_spec spec;
    return plan_rank_device(p, rank, &spec) == 0 ? spec.index : rank;
}

/* The first two ranks of the plan on one GPU, in *first and *second, and
 * that GPU in *gpu; false when every rank has a GPU of its own. */
static bool ranks_share_gpu(const plan *p, int *first, int *second,
                            int *gpu)
{
    int ranks = p->config.pp * p->config.dp * p->config.tp;
    for (int b = 1; b < ranks; b++)
        for (int a = 0; a < b; a++)
            if (rank_gpu_index(p, a) == rank_gpu_index(p, b)) {
                *first = a;
                *second = b;
                *gpu = rank_gpu_index(p, a);
                return true;
            }
    return false;
}

#ifdef PARTITA_HAVE_NCCL
static const bool nccl_built = true;
#else
static const bool nccl_built = false;
#endif

/* The comm of a parallel cuda run (options->gpu_comm, AUTO resolved):
 * NCCL needs a GPU per rank and a build with it; host-staged needs the
 * ranks to be threads of this process. */
static int resolve_gpu_comm(run_context *ctx, pt_error *err)
{
    run_gpu_comm asked = ctx->options->gpu_comm;
    const plan *p = ctx->plan;
    if (ctx->options->backend != BACKEND_CUDA) {
        if (asked != RUN_GPU_COMM_AUTO)
            return pt_fail(err, "--gpu-comm chooses how the ranks of the "
                                "cuda backend communicate; the %s backend's "
                                "ranks use %s",
                           backend_name(ctx->options->backend),
                           ctx->options->processes ? "MPI" : "the threads "
                                                            "comm");
        return 0;
    }
    int first = 0, second = 0, gpu = 0;
    bool shared = !ctx->options->processes &&
                  ranks_share_gpu(p, &first, &second, &gpu);
    if (ctx->options->processes) {
        if (asked == RUN_GPU_COMM_HOST)
            return pt_fail(err, "--gpu-comm host runs the ranks as threads "
                                "of one process; under mpirun or srun each "
                                "process drives its GPU over NCCL");
        ctx->gpu_comm = RUN_GPU_COMM_NCCL;
    } else if (asked == RUN_GPU_COMM_AUTO) {
        ctx->gpu_comm = nccl_built && !shared ? RUN_GPU_COMM_NCCL
                                              : RUN_GPU_COMM_HOST;
    } else {
        ctx->gpu_comm = asked;
    }
    if (ctx->gpu_comm == RUN_GPU_COMM_NCCL && !nccl_built)
        return pt_fail(err, "this plan has tp %d, dp %d, pp %d: parallel "
                            "plans on the cuda backend communicate over "
                            "NCCL, which this binary was built without "
                            "(nccl.h and libnccl were not found); "
                            "--gpu-comm host runs them through host memory",
                       p->config.tp, p->config.dp, p->config.pp);
    if (ctx->gpu_comm == RUN_GPU_COMM_NCCL && shared)
        return pt_fail(err, "ranks %d and %d share cuda device %d, and NCCL "
                            "needs a GPU per rank; --gpu-comm host runs "
                            "ranks that share a GPU",
                       first, second, gpu);
    return 0;
}

/* The layout of a parallel plan, the per-rank records and the largest
 * stage (for the checkpoint buffer). */
static int prepare_layout(run_context *ctx, run_result *out, pt_error *err)
{
    const plan *p = ctx->plan;
    stage_spec whole = stage_spec_whole_model(&ctx->shape);
    if (stage_parameter_layout(&ctx->shape, &whole, NULL, &ctx->param_count,
                               err) < 0)
        return -1;
    ctx->largest_rank_params = ctx->param_count;
    ctx->parallel = p->config.pp > 1 || p->config.dp > 1 || p->config.tp > 1;
    int ranks = p->config.pp * p->config.dp * p->config.tp;
    out->devices = calloc((size_t)ranks, sizeof *out->devices);
    out->rank_peak_memory_bytes =
        calloc((size_t)ranks, sizeof *out->rank_peak_memory_bytes);
    if (out->devices == NULL || out->rank_peak_memory_bytes == NULL)
        return pt_fail(err, "out of memory for the records of %d ranks",
                       ranks);
    if (!ctx->parallel)
        return 0;
    if (resolve_gpu_comm(ctx, err) != 0)
        return -1;
    if (pipeline_layout_init(&ctx->layout, &ctx->shape, &p->config,
                             p->partition, p->config.pp, err) != 0)
        return -1;
    int blobs = 3 * ranks + 4; /* three buffers per rank, four shared */
    if ((ctx->options->save_dir != NULL || ctx->options->load_dir != NULL) &&
        blobs > CHECKPOINT_MAX_BLOBS)
        return pt_fail(err, "checkpoints of %d ranks are not supported yet: "
                            "they need %d blobs (3 per rank and 4 more), a "
                            "checkpoint holds at most %d",
                       ranks, blobs, CHECKPOINT_MAX_BLOBS);
    ctx->largest_rank_params = 0;
    for (int rank = 0; rank < ranks; rank++) {
        size_t params = 0;
        if (rank_param_count(ctx, rank, &params, err) != 0)
            return -1;
        if (params > ctx->largest_rank_params)
            ctx->largest_rank_params = params;
    }
    return 0;
}

#ifdef PARTITA_HAVE_CUDA
/* What a rank's thread reports of its device into the record. */
typedef struct rank_description {
    run_context *ctx;
    run_result *out;
} rank_description;

static int describe_rank_task(void *data, int rank, model_stage *stage,
                              pt_error *err)
{
    (void)err;
    const rank_description *d = data;
    run_device *device = &d->out->devices[rank];
    cuda_device_info info;
    if (cuda_device_describe(&info) != 0)
        return 0; /* the plan's figures stay */
    pt_copy_string(device->name, sizeof device->name, info.name);
    device->sms_used = cuda_rank_sm_count();
    device_spec spec = {.index = rank};
    if (d->ctx->processes)
        spec = own_device(d->ctx);
    else
        plan_rank_device(d->ctx->plan, rank, &spec);
    device->memory_cap_bytes = spec.memory_limit_gib > 0
                                   ? spec.memory_limit_gib * PT_GIB
                                   : info.memory_bytes;
    snprintf(device->driver_version, sizeof device->driver_version,
             "CUDA %s", info.driver_cuda_version);
    snprintf(device->cuda_version, sizeof device->cuda_version, "%s",
             info.runtime_cuda_version);
    d->out->rank_peak_memory_bytes[rank] =
        (double)cuda_stage_device_bytes(stage) +
        pipeline_gpu_comm_device_bytes(d->ctx->gpu, rank);
    return 0;
}

/* Each rank's device and device bytes, from its own thread: the stage's
 * allocation plus the comm's staging buffers (which grow during the first
 * steps, so this runs again at the end). */
static int record_gpu_ranks(run_context *ctx, run_result *out,
                            pt_error *err)
{
    rank_description description = {.ctx = ctx, .out = out};
    out->peak_memory_bytes = 0.0;
    for (int rank = local_first(ctx); rank < local_end(ctx); rank++) {
        if (pipeline_threads_on_rank(ctx->launcher, rank, describe_rank_task,
                                     &description, err) != 0)
            return -1;
        if (out->rank_peak_memory_bytes[rank] > out->peak_memory_bytes)
            out->peak_memory_bytes = out->rank_peak_memory_bytes[rank];
    }
    out->device = out->devices[local_first(ctx)];
    out->peak_memory_basis =
        "device bytes each rank allocated: its cuda stage (fp32 "
        "parameters, gradients and AdamW moments, the bf16 weight mirror, "
        "activations, backward scratch, the cuBLASLt workspace) and its "
        "NCCL comm's staging buffers and scratch (not the CUDA context or "
        "NCCL's own buffers; the host-staged comm holds no device memory)";
    drop_note(out, "the backend interface does not report");
    return 0;
}

/* The node type of a rank and its place among the node's GPUs. */
static const node_type *rank_node(const plan *p, int rank, int *place)
{
    int local = rank;
    for (int i = 0; i < p->node_order_count; i++) {
        int node = p->node_order[i];
        int gpus = cluster_node_gpus(&p->cluster, node);
        if (local >= gpus) {
            local -= gpus;
            continue;
        }
        *place = local;
        return &p->cluster.types[cluster_node_type(&p->cluster, node)];
    }
    return NULL;
}

/* One process per rank: the GPU of this process's rank is its node's
 * `devices` entry when the node lists them (index, sm_limit, memory
 * cap), else the process's local rank on its host (mpirun and srun
 * number a host's processes from 0). */
static device_spec own_device(const run_context *ctx)
{
    device_spec spec = {.index = comm_mpi_local_rank(ctx->options->processes)};
    int place = 0;
    const node_type *type = rank_node(ctx->plan, ctx->world.rank, &place);
    if (type != NULL && type->device_count > place)
        spec = type->devices[place];
    return spec;
}

/* One process per rank: its GPU exists and is of its node's type (the
 * other ranks' GPUs are other hosts' to check). */
static int check_own_gpu(const run_context *ctx, pt_error *err)
{
    int rank = ctx->world.rank, place = 0;
    device_spec spec = own_device(ctx);
    int count = cuda_device_count();
    if (spec.index < 0 || spec.index >= count)
        return pt_fail(err, "rank %d: its GPU is cuda device %d (local rank "
                            "%d of the %d processes on this host), and this "
                            "host has %d: start one process per GPU",
                       rank, spec.index,
                       comm_mpi_local_rank(ctx->options->processes),
                       comm_mpi_local_size(ctx->options->processes), count);
    struct cudaDeviceProp properties;
    if (cudaGetDeviceProperties(&properties, spec.index) != cudaSuccess) {
        cudaGetLastError();
        return pt_fail(err, "rank %d: cuda device %d: cannot read its "
                            "properties",
                       rank, spec.index);
    }
    const node_type *type = rank_node(ctx->plan, rank, &place);
    if (type != NULL && !gpu_name_matches(type->gpu, properties.name))
        return pt_fail(err, "rank %d (node type %s, GPU %s) is on cuda "
                            "device %d, a %s",
                       rank, type->name, type->gpu, spec.index,
                       properties.name);
    return 0;
}

static int start_own_gpu(run_context *ctx, run_result *out, pt_error *err)
{
    device_spec device = own_device(ctx);
    ctx->gpu = calloc(1, sizeof *ctx->gpu);
    if (ctx->gpu == NULL)
        return pt_fail(err, "out of memory for the GPU launcher");
    if (pipeline_gpu_start_rank(ctx->gpu, &ctx->layout, &device, &ctx->world,
                                out->seed, run_comm_timeout(ctx->options),
                                err) != 0) {
        free(ctx->gpu);
        ctx->gpu = NULL;
        return -1;
    }
    ctx->launcher = &ctx->gpu->threads;
    return record_gpu_ranks(ctx, out, err);
}

/* The ranks on their GPUs: rank r on the device its node's `devices`
 * entry names (plan_rank_device), with its sm_limit and memory cap. */
static int start_gpus(run_context *ctx, run_result *out, pt_error *err)
{
    int ranks = ctx->layout.rank_count;
    device_spec *devices = calloc((size_t)ranks, sizeof *devices);
    ctx->gpu = calloc(1, sizeof *ctx->gpu);
    if (devices == NULL || ctx->gpu == NULL) {
        free(devices);
        return pt_fail(err, "out of memory for the GPU launcher");
    }
    for (int rank = 0; rank < ranks; rank++)
        if (plan_rank_device(ctx->plan, rank, &devices[rank]) != 0)
            devices[rank] = (device_spec){.index = rank};
    double timeout = ctx->options->comm_timeout_s > 0
                         ? ctx->options->comm_timeout_s
                         : RUN_GPU_COMM_TIMEOUT_S;
    int status = pipeline_gpu_start(
        ctx->gpu, &ctx->layout, devices,
        ctx->gpu_comm == RUN_GPU_COMM_HOST ? GPU_COMM_HOST : GPU_COMM_NCCL,
        out->seed, timeout, err);
    free(devices);
    if (status != 0) {
        free(ctx->gpu);
        ctx->gpu = NULL;
        return -1;
    }
    ctx->launcher = &ctx->gpu->threads;
    return record_gpu_ranks(ctx, out, err);
}
#else
static int start_gpus(run_context *ctx, run_result *out, pt_error *err)
{
    (void)out;
    return pt_fail(err, "parallel plans on the %s backend are not built in "
                        "this binary",
                   backend_name(ctx->options->backend));
}

static int start_own_gpu(run_context *ctx, run_result *out, pt_error *err)
{
    return start_gpus(ctx, out, err);
}
#endif

/* ------------------------------------------------ one process per rank */

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
static int check_process_world(run_context *ctx, pt_error *err)
{
    const parallel_config *config = &ctx->plan->config;
    int ranks = config->pp * config->dp * config->tp;
    ctx->world = comm_mpi_handle(ctx->options->processes);
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

static int start_own_gpu(run_context *ctx, run_result *out, pt_error *err);

/* This process's rank: the MPI communicators of its groups, then its
 * stage on the launcher's thread. */
static int start_own_rank(run_context *ctx, run_result *out, pt_error *err)
{
    comm_groups groups;
    if (pipeline_layout_groups(&ctx->layout, &groups, err) != 0)
        return -1;
    int status = comm_mpi_set_groups(ctx->options->processes, &groups, err);
    comm_groups_free(&groups);
    if (status != 0)
        return -1;
    if (ctx->options->backend != BACKEND_CPU)
        return start_own_gpu(ctx, out, err);
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
static int agree_stop(run_context *ctx, bool *stopping, pt_error *err)
{
    double votes = *stopping ? 1.0 : 0.0;
    if (comm_all_reduce_host(&ctx->world, ctx->world_members,
                             ctx->world.size, &votes, 1, err) != 0)
        return -1;
    *stopping = votes > 0.0;
    return 0;
}

/* The three state blobs of each rank, in the order a threads run writes
 * them. */
static const char *const rank_blob_bases[] = {BLOB_PARAMS, BLOB_ADAM_M,
                                              BLOB_ADAM_V};
enum { RANK_BLOBS = 3, REPORT_SLOTS = RANK_BLOBS + 1 };

/* Rank 0: the others' blobs (their CRCs in report), then the shared
 * blobs, then the commit. */
static int commit_for_all(checkpoint_writer *w, run_context *ctx,
                          const double *report, long iteration,
                          uint64_t seed, pt_error *err)
{
    for (int rank = 1; rank < ctx->world.size; rank++) {
        size_t params = 0;
        if (rank_param_count(ctx, rank, &params, err) != 0) {
            checkpoint_writer_abort(w);
            return -1;
        }
        for (int b = 0; b < RANK_BLOBS; b++) {
            checkpoint_blob blob = {
                .bytes = params * sizeof(float),
                .crc32 = (uint32_t)report[rank * REPORT_SLOTS + 1 + b]};
            blob_name(ctx, rank_blob_bases[b], rank, blob.name,
                      sizeof blob.name);
            if (checkpoint_writer_add(w, &blob, err) != 0)
                return -1;
        }
    }
    if (write_checkpoint_blobs(w, ctx, iteration, seed, err) != 0)
        return -1;
    if (checkpoint_writer_commit(w, err) != 0) {
        checkpoint_writer_abort(w);
        return -1;
    }
    return 0;
}

/* Every rank's own blobs into the generation rank 0 began; report gets
 * this rank's slot: a failure flag and its blobs' CRCs. */
static int write_own_blobs(checkpoint_writer *w, run_context *ctx,
                           uint64_t generation, double *report,
                           pt_error *err)
{
    double *slot = report + ctx->world.rank * REPORT_SLOTS;
    slot[0] = 1.0;
    if (ctx->world.rank != 0 &&
        checkpoint_writer_join(w, ctx->options->save_dir, generation,
                               err) != 0)
        return -1;
    if (write_rank_blobs(w, ctx, err) != 0)
        return -1;
    slot[0] = 0.0;
    for (int b = 0; b < RANK_BLOBS; b++)
        slot[1 + b] = w->blobs[w->blob_count - RANK_BLOBS + b].crc32;
    return 0;
}

static int save_checkpoint_processes(run_context *ctx, long iteration,
                                     uint64_t seed, pt_error *err)
{
    const comm *world = &ctx->world;
    bool root = world->rank == 0;
    checkpoint_writer writer;
    memset(&writer, 0, sizeof writer);
    pt_error local = {{0}};
    double generation = 0.0, committed = 0.0;
    if (root && checkpoint_writer_begin(&writer, ctx->options->save_dir,
                                        &local) == 0)
        generation = (double)writer.generation;
    double *report = calloc((size_t)world->size * REPORT_SLOTS,
                            sizeof *report);
    if (report == NULL ||
        comm_all_reduce_host(world, ctx->world_members, world->size,
                             &generation, 1, err) != 0) {
        free(report);
        checkpoint_writer_abort(&writer);
        return report == NULL ? pt_fail(err, "out of memory saving") : -1;
    }
    int written = generation > 0.0
                      ? write_own_blobs(&writer, ctx, (uint64_t)generation,
                                        report, &local)
                      : -1;
    int failed_rank = -1;
    if (comm_all_reduce_host(world, ctx->world_members, world->size, report,
                             (size_t)world->size * REPORT_SLOTS, err) != 0) {
        free(report);
        checkpoint_writer_abort(&writer);
        return -1;
    }
    for (int rank = world->size - 1; rank >= 0; rank--)
        if (report[rank * REPORT_SLOTS] != 0.0)
            failed_rank = rank;
    if (root && generation > 0.0 && failed_rank < 0)
        committed = commit_for_all(&writer, ctx, report, iteration, seed,
                                   &local) == 0
                        ? 1.0
                        : 0.0;
    free(report);
    if (comm_all_reduce_host(world, ctx->world_members, world->size,
                             &committed, 1, err) != 0)
        return -1;
    if (committed > 0.0)
        return 0;
    checkpoint_writer_abort(&writer);
    if (local.message[0] != '\0')
        return pt_fail(err, "%s", local.message);
    if (generation == 0.0)
        return pt_fail(err, "%s: rank 0 could not begin the checkpoint",
                       ctx->options->save_dir);
    if (written == 0 && failed_rank >= 0)
        return pt_fail(err, "%s: rank %d could not write its blobs",
                       ctx->options->save_dir, failed_rank);
    return pt_fail(err, "%s: rank 0 could not commit the checkpoint",
                   ctx->options->save_dir);
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
static int gather_chosen_events(const run_context *ctx, run_result *out,
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
} rank_record;

static int gather_rank_records(run_context *ctx, run_result *out,
                               pt_error *err)
{
    int me = ctx->world.rank, ranks = ctx->world.size;
    bool root = me == 0;
    rank_record mine = {.device = out->devices[me],
                        .peak_memory_bytes =
                            out->rank_peak_memory_bytes[me]};
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
            if (all[rank].peak_memory_bytes > out->peak_memory_bytes)
                out->peak_memory_bytes = all[rank].peak_memory_bytes;
        }
        out->device = out->devices[0];
    }
    free(all);
    return status;
}


/* Every rank's stage, initialised from the seed (the same values as the
 * one-stage run's) and then, when resuming, overwritten by the
 * checkpoint. */
static int start_threads(run_context *ctx, run_result *out, pt_error *err)
{
    if (ctx->processes) {
        /* rank 0's log shows the largest rank's memory from the start */
        if (start_own_rank(ctx, out, err) != 0 ||
            gather_rank_records(ctx, out, err) != 0)
            return -1;
    } else if (ctx->options->backend == BACKEND_CPU) {
        if (pipeline_threads_create(&ctx->threads, &ctx->layout,
                                    ctx->options->backend, out->seed,
                                    ctx->options->comm_timeout_s > 0
                                        ? ctx->options->comm_timeout_s
                                        : RUN_COMM_TIMEOUT_S,
                                    err) != 0)
            return -1;
        ctx->threads_ready = true;
        ctx->launcher = &ctx->threads;
    } else if (start_gpus(ctx, out, err) != 0) {
        return -1;
    }
    if (ctx->resume.active)
        return restore_checkpoint(ctx, err);
    return 0;
}

/* Everything before the first iteration; any failure is a refusal. */
static int prepare_run(run_context *ctx, run_result *out, pt_error *err)
{
    const run_options *options = ctx->options;
    if (run_check_plan(ctx->plan, err) != 0 || check_options(options, err) != 0)
        return -1;
    if (prepare_layout(ctx, out, err) != 0 ||
        backend_find(options->backend, err) == NULL)
        return -1;
    fill_result_header(ctx, out);
    stage_spec spec = stage_spec_whole_model(&ctx->shape);
    spec.recompute_layers = ctx->plan->config.recompute;
    if (options->load_dir != NULL && read_resume_state(ctx, err) != 0)
        return -1;
    out->seed = ctx->resume.active ? ctx->resume.seed : options->seed;
    out->first_iteration = ctx->resume.optimizer_steps + 1;
    if (open_data(ctx, out->seed, out, err) != 0 ||
        check_memory(ctx, out, err) != 0 ||
        allocate_buffers(ctx, out, err) != 0)
        return -1;
    if (ctx->parallel)
        return start_threads(ctx, out, err);
    if (model_stage_create(&ctx->stage, &ctx->shape, &spec, options->backend,
                           out->mbs, 1, err) != 0)
        return -1;
    ctx->stage_ready = true;
    describe_cuda_stage(ctx, out);
    /* A resumed stage gets every buffer that matters from the checkpoint
     * (gradients are zeroed at the start of each step). */
    if (ctx->resume.active)
        return restore_checkpoint(ctx, err);
    return model_stage_init_parameters(&ctx->stage, out->seed, err);
}

/* ------------------------------------------------------------ training */

static void set_event(run_event *event, int microbatch, const char *kind,
                      double start_s, double end_s)
{
    event->rank = 0;
    event->stage = 0;
    event->microbatch = microbatch;
    event->kind = kind;
    event->start_s = start_s;
    event->end_s = end_s;
}

/* The forwards and backwards of one iteration's micro-batches, with the
 * gradients averaged through loss_scale, as train_step does; each phase
 * timed from iteration_start. */
static int accumulate_gradients(run_context *ctx, const run_result *out,
                                double iteration_start, run_event *events,
                                double *mean_loss, pt_error *err)
{
    size_t window = (size_t)ctx->shape.seq + 1;
    double loss_sum = 0.0;
    for (int m = 0; m < out->micro_batches; m++) {
        stage_io io = {
            .mbs = out->mbs,
            .tokens = ctx->tokens + (size_t)m * (size_t)out->mbs * window,
            .loss_scale = 1.0f / (float)out->micro_batches,
        };
        float loss = 0.0f;
        double forward_start = pt_monotonic_seconds();
        if (stage_forward(&ctx->stage, 0, &io, &loss, err) != 0)
            return -1;
        double backward_start = pt_monotonic_seconds();
        if (stage_backward(&ctx->stage, 0, &io, err) != 0)
            return -1;
        double backward_end = pt_monotonic_seconds();
        set_event(&events[2 * m], m, "fwd", forward_start - iteration_start,
                  backward_start - iteration_start);
        set_event(&events[2 * m + 1], m, "bwd",
                  backward_start - iteration_start,
                  backward_end - iteration_start);
        loss_sum += loss;
    }
    *mean_loss = loss_sum / out->micro_batches;
    return 0;
}

/* Global norm, clipping and AdamW: the "optimizer" event. */
static int optimizer_step(run_context *ctx, double mean_loss,
                          run_iteration *record, pt_error *err)
{
    const train_config *train = &ctx->options->train;
    double square_sum = 0.0;
    if (stage_grad_square_sum(&ctx->stage, &square_sum, err) != 0)
        return -1;
    double grad_norm = sqrt(square_sum);
    if (!isfinite(grad_norm))
        return pt_fail(err, "iteration %ld: the gradient norm is not finite "
                            "(loss %g); the step was not applied",
                       record->iteration, mean_loss);
    float learning_rate = (float)lr_schedule_at(&train->schedule,
                                                ctx->stage.optimizer_steps);
    float scale = clip_coefficient(grad_norm, train->max_grad_norm);
    if (stage_adamw_step(&ctx->stage, &train->adamw, learning_rate, scale,
                         err) != 0)
        return -1;
    record->loss = (float)mean_loss;
    record->grad_norm = (float)grad_norm;
    record->learning_rate = learning_rate;
    return 0;
}

/* One step of every rank on the global batch already in ctx->tokens;
 * the ranks' events, shifted to count from the iteration's start (the
 * runtime counts from its own, just after sampling), go to events rank
 * after rank. */
static int parallel_step(run_context *ctx, double start, run_event *events,
                         int *event_count, run_iteration *record,
                         pt_error *err)
{
    double step_start = pt_monotonic_seconds();
    step_result result;
    if (pipeline_threads_step(ctx->launcher, &ctx->options->train,
                              ctx->tokens, &result, err) != 0) {
        pt_error_prefix(err, "iteration %ld", record->iteration);
        return -1;
    }
    double end = pt_monotonic_seconds();
    double shift = step_start - start;
    int count = 0;
    for (int rank = local_first(ctx); rank < local_end(ctx); rank++) {
        const pipeline_events *rank_events = &ctx->launcher->events[rank];
        for (int i = 0; i < rank_events->count &&
                        count < ctx->events_per_iteration;
             i++) {
            events[count] = rank_events->events[i];
            events[count].start_s += shift;
            events[count].end_s += shift;
            count++;
        }
    }
    *event_count = count;
    record->loss = result.loss;
    record->grad_norm = result.grad_norm;
    record->learning_rate = result.learning_rate;
    record->step_time_s = end - start;
    return 0;
}

/* One iteration: gbs samples from the data position, the accumulated
 * micro-batches (one stage) or every rank's step (parallel), one
 * optimizer step. */
static int run_iteration_once(run_context *ctx, const run_result *out,
                              run_event *events, int *event_count,
                              run_iteration *record, pt_error *err)
{
    size_t window = (size_t)ctx->shape.seq + 1;
    double start = pt_monotonic_seconds();
    for (int sample = 0; sample < out->gbs; sample++)
        if (gpt_sampler_next(&ctx->sampler, &ctx->position,
                             ctx->tokens + (size_t)sample * window, err) != 0)
            return -1;
    if (ctx->parallel)
        return parallel_step(ctx, start, events, event_count, record, err);
    *event_count = 2 * out->micro_batches + 1;
    double mean_loss = 0.0;
    if (stage_zero_grads(&ctx->stage, err) != 0 ||
        accumulate_gradients(ctx, out, start, events, &mean_loss, err) != 0)
        return -1;
    double optimizer_start = pt_monotonic_seconds();
    if (optimizer_step(ctx, mean_loss, record, err) != 0)
        return -1;
    double end = pt_monotonic_seconds();
    set_event(&events[2 * out->micro_batches], -1, "optimizer",
              optimizer_start - start, end - start);
    record->step_time_s = end - start;
    return 0;
}

static bool stop_raised(const run_options *options)
{
    return options->stop != NULL && *options->stop != 0;
}

/* Saves after `iteration` unless that was already done. */
static int save_once(run_context *ctx, run_result *out, long iteration,
                     pt_error *err)
{
    if (ctx->options->save_dir == NULL ||
        out->last_checkpoint_iteration == iteration)
        return 0;
    if (save_checkpoint(ctx, iteration, out->seed, err) != 0)
        return -1;
    out->last_checkpoint_iteration = iteration;
    return 0;
}

/* After an iteration: the interval's or the last checkpoint, the
 * observer, and the stop flag, which may also be raised while saving or
 * by the observer (a checkpoint is then written for this iteration too).
 * *stopping tells the caller to end the run. */
static int after_iteration(run_context *ctx, run_result *out, long iteration,
                           bool *stopping, pt_error *err)
{
    const run_options *options = ctx->options;
    bool last = iteration == out->last_iteration;
    *stopping = stop_raised(options);
    if (ctx->processes && agree_stop(ctx, stopping, err) != 0)
        return -1;
    bool due = last || *stopping ||
               (options->save_interval > 0 &&
                iteration % options->save_interval == 0);
    if (due && save_once(ctx, out, iteration, err) != 0)
        return -1;
    if (options->observer != NULL)
        options->observer(out, options->observer_data);
    if (!ctx->processes && !*stopping && stop_raised(options)) {
        *stopping = true;
        if (save_once(ctx, out, iteration, err) != 0)
            return -1;
    }
    return 0;
}

/* Room for one more iteration record; the array grows by doubling, so a
 * run asked for a billion iterations and stopped early holds only what it
 * ran. */
static int reserve_iteration(run_context *ctx, run_result *out,
                             pt_error *err)
{
    if (out->iteration_count < ctx->iteration_capacity)
        return 0;
    long capacity = ctx->iteration_capacity > 0
                        ? 2 * ctx->iteration_capacity
                        : 64;
    run_iteration *grown =
        realloc(out->iterations, (size_t)capacity * sizeof *grown);
    if (grown == NULL)
        return pt_fail(err, "out of memory for %ld iteration records",
                       capacity);
    out->iterations = grown;
    ctx->iteration_capacity = capacity;
    return 0;
}

/* Iterations up to the last one, or until the stop flag is raised. */
static int train_iterations(run_context *ctx, run_result *out, pt_error *err)
{
    for (long iteration = out->first_iteration;
         iteration <= out->last_iteration; iteration++) {
        if (reserve_iteration(ctx, out, err) != 0)
            return -1;
        long index = out->iteration_count;
        run_event *events =
            ctx->event_ring + (size_t)(index % ctx->event_window) *
                                  (size_t)ctx->events_per_iteration;
        run_iteration *record = &out->iterations[index];
        memset(record, 0, sizeof *record);
        record->iteration = iteration;
        if (run_iteration_once(ctx, out, events,
                               &ctx->ring_counts[index % ctx->event_window],
                               record, err) != 0)
            return -1;
        out->iteration_count++;
        bool stopping = false;
        if (after_iteration(ctx, out, iteration, &stopping, err) != 0)
            return -1;
        if (stopping && iteration < out->last_iteration) {
            out->stopped = true;
            break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- summary */

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median step time over the timed iterations (all but the first when
 * there are two or more: it pays for first touches of memory and
 * caches), and the events of the timed iteration whose time is the
 * (lower) median among those still in the event window. */
static int summarise_timing(const run_context *ctx, run_result *out,
                            pt_error *err)
{
    long count = out->iteration_count;
    long first_timed = count > 1 ? 1 : 0;
    long timed = count - first_timed;
    long first_kept = count - ctx->event_window > first_timed
                          ? count - ctx->event_window
                          : first_timed;
    double *times = malloc((size_t)timed * sizeof *times);
    out->events = malloc((size_t)ctx->events_per_iteration *
                         sizeof *out->events);
    if (times == NULL || out->events == NULL) {
        free(times);
        return pt_fail(err, "out of memory summarising the run");
    }
    for (long i = 0; i < timed; i++)
        times[i] = out->iterations[first_timed + i].step_time_s;
    qsort(times, (size_t)timed, sizeof *times, compare_doubles);
    out->step_time_s = timed % 2 == 1
                           ? times[timed / 2]
                           : 0.5 * (times[timed / 2 - 1] + times[timed / 2]);
    long kept = count - first_kept;
    for (long i = 0; i < kept; i++)
        times[i] = out->iterations[first_kept + i].step_time_s;
    qsort(times, (size_t)kept, sizeof *times, compare_doubles);
    double chosen_time = times[(kept - 1) / 2];
    free(times);
    long chosen = first_kept;
    while (out->iterations[chosen].step_time_s != chosen_time)
        chosen++;
    if (ctx->processes && gather_chosen_events(ctx, out, &chosen, err) != 0)
        return -1;
    out->events_iteration = out->iterations[chosen].iteration;
    if (!ctx->processes) {
        out->event_count = ctx->ring_counts[chosen % ctx->event_window];
        memcpy(out->events,
               ctx->event_ring + (size_t)(chosen % ctx->event_window) *
                                     (size_t)ctx->events_per_iteration,
               (size_t)out->event_count * sizeof *out->events);
    }
    out->tokens_per_s = out->step_time_s > 0
                            ? (double)out->tokens_per_iteration /
                                  out->step_time_s
                            : 0.0;
    return 0;
}

static void record_max_rss(run_result *out)
{
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0)
        out->max_rss_bytes = (double)usage.ru_maxrss * 1024.0; /* KiB */
}

/* A GPU run's comm buffers grow during the first steps: take each rank's
 * figure again at the end. */
static void record_final_gpu_memory(run_context *ctx, run_result *out)
{
#ifdef PARTITA_HAVE_CUDA
    pt_error ignored = {{0}};
    if (ctx->gpu != NULL && ctx->launcher != NULL)
        record_gpu_ranks(ctx, out, &ignored);
#else
    (void)ctx;
    (void)out;
#endif
}

static void record_start_time(run_result *out)
{
    time_t now = time(NULL);
    struct tm utc;
    if (gmtime_r(&now, &utc) != NULL)
        strftime(out->started_utc, sizeof out->started_utc,
                 "%Y-%m-%dT%H:%M:%SZ", &utc);
}

static void release_context(run_context *ctx)
{
    if (ctx->stage_ready)
        model_stage_destroy(&ctx->stage);
    if (ctx->threads_ready)
        pipeline_threads_destroy(&ctx->threads);
#ifdef PARTITA_HAVE_CUDA
    if (ctx->gpu != NULL)
        pipeline_gpu_stop(ctx->gpu);
#endif
    free(ctx->gpu);
    if (ctx->sampler_ready)
        gpt_sampler_free(&ctx->sampler);
    if (ctx->dataset_open)
        indexed_dataset_close(&ctx->dataset);
    free(ctx->tokens);
    free(ctx->host_buffer);
    free(ctx->event_ring);
    free(ctx->world_members);
}

int run_training(const plan *p, const run_options *options, run_result *out,
                 pt_error *err)
{
    memset(out, 0, sizeof *out);
    run_context ctx = {.options = options, .plan = p, .shape = p->model};
    if (options->processes != NULL && check_process_world(&ctx, err) != 0)
        return -1;
    int status = prepare_run(&ctx, out, err);
    if (status == 0) {
        record_start_time(out);
        if (train_iterations(&ctx, out, err) != 0 ||
            summarise_timing(&ctx, out, err) != 0)
            status = -2;
    }
    record_max_rss(out);
    record_final_gpu_memory(&ctx, out);
    if (status == 0 && ctx.processes && gather_rank_records(&ctx, out, err) != 0)
        status = -2;
    /* The other processes wait on this one: a failure here ends them. */
    if (status != 0 && options->processes != NULL)
        comm_abort(&ctx.world, err->message);
    release_context(&ctx);
    return status;
}

void run_result_free(run_result *r)
{
    free(r->iterations);
    free(r->events);
    free(r->devices);
    free(r->rank_peak_memory_bytes);
    r->iterations = NULL;
    r->events = NULL;
    r->devices = NULL;
    r->rank_peak_memory_bytes = NULL;
    r->iteration_count = 0;
    r->event_count = 0;
}

/* ------------------------------------------------------------ run.json */

/* Sets obj[key] = value, counting a failed allocation. */
static void put(json_t *obj, const char *key, json_t *value, int *failures)
{
    if (value == NULL || json_object_set_new(obj, key, value) != 0)
        (*failures)++;
}

static json_t *optional_string(const char *text)
{
    return text[0] != '\0' ? json_string(text) : json_null();
}

static const char *compiler_description(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown C compiler";
#endif
}

static json_t *device_to_json(const run_device *device, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "rank", json_integer(device->rank), failures);
    put(obj, "name", json_string(device->name), failures);
    put(obj, "sms_used",
        device->sms_used > 0 ? json_integer(device->sms_used) : json_null(),
        failures);
    put(obj, "memory_cap_gib",
        device->memory_cap_bytes > 0
            ? json_real(device->memory_cap_bytes / PT_GIB)
            : json_null(),
        failures);
    put(obj, "driver_version", optional_string(device->driver_version),
        failures);
    put(obj, "cuda_version", optional_string(device->cuda_version), failures);
    return obj;
}

static json_t *software_to_json(int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "partita", json_string(PARTITA_VERSION), failures);
    put(obj, "compiler", json_string(compiler_description()), failures);
    put(obj, "jansson", json_string(jansson_version_str()), failures);
    return obj;
}

static json_t *data_to_json(const run_result *r, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "prefix", json_string(r->data_prefix), failures);
    put(obj, "tokens", json_integer((json_int_t)r->dataset_tokens), failures);
    put(obj, "documents", json_integer((json_int_t)r->dataset_documents),
        failures);
    put(obj, "largest_token", json_integer(r->largest_token), failures);
    return obj;
}

static json_t *training_to_json(const run_result *r, int *failures)
{
    json_t *obj = json_object();
    if (obj == NULL) {
        (*failures)++;
        return NULL;
    }
    put(obj, "backend", json_string(backend_name(r->backend)), failures);
    put(obj, "seed", json_integer((json_int_t)r->seed), failures);
    put(obj, "gbs", json_integer(r->gbs), failures);
    put(obj, "mbs", json_integer(r->mbs), failures);
    put(obj, "micro_batches", json_integer(r->micro_batches), failures);
    put(obj, "tokens_per_iteration", json_integer(r->tokens_per_iteration),
        failures);
    put(obj, "max_lr", json_real(r->schedule.max_lr), failures);
    put(obj, "min_lr", json_real(r->schedule.min_lr), failures);
    put(obj, "warmup_iterations", json_integer(r->schedule.warmup_steps),
        failures);
    put(obj, "decay_iterations", json_integer(r->schedule.decay_steps),
        failures);
    put(obj, "max_grad_norm", json_real(r->max_grad_norm), failures);
    put(obj, "first_iteration", json_integer(r->first_iteration), failures);
    put(obj, "last_iteration", json_integer(r->last_iteration), failures);
    put(obj, "resumed_from", optional_string(r->resumed_from), failures);
    put(obj, "stopped_early", json_boolean(r->stopped), failures);
    put(obj, "last_checkpoint_iteration",
        r->last_checkpoint_iteration > 0
            ? json_integer(r->last_checkpoint_iteration)
            : json_null(),
        failures);
    put(obj, "started_utc", json_string(r->started_utc), failures);
    return obj;
}

static json_t *iterations_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    for (long i = 0; array != NULL && i < r->iteration_count; i++) {
        const run_iteration *it = &r->iterations[i];
        json_t *obj = json_object();
        if (obj == NULL || json_array_append_new(array, obj) != 0) {
            (*failures)++;
            break;
        }
        put(obj, "iteration", json_integer(it->iteration), failures);
        put(obj, "step_time_s", json_real(it->step_time_s), failures);
        put(obj, "loss", json_real(it->loss), failures);
        put(obj, "grad_norm", json_real(it->grad_norm), failures);
        put(obj, "learning_rate", json_real(it->learning_rate), failures);
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *events_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->event_count; i++) {
        const run_event *event = &r->events[i];
        json_t *obj = json_object();
        if (obj == NULL || json_array_append_new(array, obj) != 0) {
            (*failures)++;
            break;
        }
        put(obj, "rank", json_integer(event->rank), failures);
        put(obj, "stage", json_integer(event->stage), failures);
        put(obj, "microbatch", json_integer(event->microbatch), failures);
        put(obj, "kind", json_string(event->kind), failures);
        put(obj, "start_s", json_real(event->start_s), failures);
        put(obj, "end_s", json_real(event->end_s), failures);
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

/* One entry per rank. A record that never got its per-rank arrays (a
 * refusal before they were made) shows rank 0 from the scalar fields. */
static json_t *devices_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    int ranks = r->devices != NULL ? r->rank_count : 1;
    for (int rank = 0; array != NULL && rank < ranks; rank++)
        if (json_array_append_new(
                array, device_to_json(r->devices != NULL ? &r->devices[rank]
                                                         : &r->device,
                                      failures)) != 0)
            (*failures)++;
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *memory_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    int ranks = r->rank_peak_memory_bytes != NULL ? r->rank_count : 1;
    for (int rank = 0; array != NULL && rank < ranks; rank++) {
        double bytes = r->rank_peak_memory_bytes != NULL
                           ? r->rank_peak_memory_bytes[rank]
                           : r->peak_memory_bytes;
        if (json_array_append_new(array, json_real(bytes / PT_GIB)) != 0)
            (*failures)++;
    }
    if (array == NULL)
        (*failures)++;
    return array;
}

/* The process's peak resident set, once per rank: the ranks are threads
 * of this one process. */
static json_t *rss_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    int ranks = r->rank_count > 0 ? r->rank_count : 1;
    for (int rank = 0; array != NULL && rank < ranks; rank++)
        if (json_array_append_new(array,
                                  json_real(r->max_rss_bytes / PT_GIB)) != 0)
            (*failures)++;
    if (array == NULL)
        (*failures)++;
    return array;
}

static json_t *notes_to_json(const run_result *r, int *failures)
{
    json_t *array = json_array();
    for (int i = 0; array != NULL && i < r->note_count; i++)
        if (json_array_append_new(array, json_string(r->notes[i])) != 0)
            (*failures)++;
    if (array == NULL)
        (*failures)++;
    return array;
}

json_t *run_to_json(const run_result *r, json_t *plan_json,
                    double flops_per_iteration, pt_error *err)
{
    int failures = 0;
    json_t *root = json_object();
    if (root == NULL) {
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    put(root, "format", json_string("partita-run/1"), &failures);
    put(root, "plan", json_incref(plan_json), &failures);
    put(root, "devices", devices_to_json(r, &failures), &failures);
    put(root, "software", software_to_json(&failures), &failures);
    put(root, "data", data_to_json(r, &failures), &failures);
    put(root, "training", training_to_json(r, &failures), &failures);
    put(root, "iterations", iterations_to_json(r, &failures), &failures);
    put(root, "events_iteration", json_integer(r->events_iteration),
        &failures);
    put(root, "events", events_to_json(r, &failures), &failures);
    put(root, "peak_memory_gib", memory_to_json(r, &failures), &failures);
    put(root, "peak_memory_basis", json_string(r->peak_memory_basis),
        &failures);
    put(root, "max_rss_gib", rss_to_json(r, &failures), &failures);
    put(root, "step_time_s", json_real(r->step_time_s), &failures);
    put(root, "tokens_per_s", json_real(r->tokens_per_s), &failures);
    int gpus = r->rank_count > 0 ? r->rank_count : 1;
    double tflops = r->step_time_s > 0
                        ? flops_per_iteration / r->step_time_s / 1e12 / gpus
                        : 0.0;
    put(root, "tflops_per_gpu", json_real(tflops), &failures);
    put(root, "notes", notes_to_json(r, &failures), &failures);
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building run.json");
        return NULL;
    }
    return root;
}
