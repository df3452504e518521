/*
 * The GPUs of a run on the cuda backend: the check of a plan against this
 * machine's devices before anything is allocated, the comm the ranks use
 * (NCCL, the device exchange or host-staged), starting the ranks on
 * their GPUs, and what the record says of each rank's device. Without the cuda backend in the
 * build, the entry points refuse.
 */
#ifdef PARTITA_HAVE_CUDA
#include "executor/cuda/buffers.h"
#include "executor/cuda/cuda_backend.h"
#endif
#include "executor/run/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void run_describe_device(const plan *p, backend_kind backend,
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
    run_add_note(out, "the backend interface does not report the GPU's name, "
                  "driver or CUDA version yet");
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

/* A rank's floor: 10 bytes per parameter of each of its chunks (8 with
 * llm.c's bf16 gradients; one chunk without interleaving) and 8 per
 * parameter of each optimizer range
 * (none under optimizer offload). */
static int rank_floor_bytes(const run_context *ctx, int rank, double *out,
                            pt_error *err)
{
    *out = 0.0;
    for (int c = 0; c < pipeline_chunk_count(&ctx->layout); c++) {
        stage_spec spec;
        size_t params = 0, first = 0, moments = 0;
        if (pipeline_rank_chunk_spec(&ctx->layout, rank, c, &spec, err) !=
                0 ||
            stage_parameter_layout(&ctx->shape, &spec, NULL, &params, err) <
                0)
            return -1;
        stage_optimizer_range(params, spec.optimizer_shards,
                              spec.optimizer_shard, &first, &moments);
        double run = (double)moments;
        /* ZeRO-2/3: the gradients, ZeRO-3 the weights too, of the run
         * only, no bf16 copy of every parameter (buffers.c; their unit
         * buffers come on top, as the activations do) */
        bool grads = buffer_grads_by_unit(&ctx->shape, &spec);
        bool weights = grads && spec.shard_parameters;
        /* llm.c's recipe: 2-byte gradients (never with the units) */
        double grad_bytes = spec.bf16_grads ? 2.0 : 4.0;
        *out += (grads ? 4.0 * run : grad_bytes * (double)params) +
                (weights ? 4.0 * run : 6.0 * (double)params);
        /* offload keeps the moments in host memory */
        if (!ctx->plan->config.offload_optimizer)
            *out += 8.0 * run;
    }
    return 0;
}

/* A parallel plan against this machine's GPUs before anything is
 * allocated on them: device count, GPU types, sm_limit and
 * memory_limit_gib, and each rank's floor of 10 bytes per parameter of
 * its stage (fp32 weights and gradients, the bf16 copy; ZeRO-2/3's
 * shards: 4 bytes a parameter of the run for what it shards) and 8 per
 * parameter of its optimizer's range (AdamW's moments: all, or a ZeRO-1
 * shard); activations come on top and are counted against the rank's cap
 * as the stage allocates them. */
int run_check_gpu_devices(const run_context *ctx, pt_error *err)
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
    for (int rank = 0; status == 0 && rank < ranks; rank++)
        status = rank_floor_bytes(ctx, rank, &needed[rank], err);
    if (status == 0)
        status = device_check_plan(ctx->plan, devices, count, needed, err);
    free(devices);
    free(needed);
    return status;
}
#else
int run_check_gpu_devices(const run_context *ctx, pt_error *err)
{
    return pt_fail(err, "parallel plans on the %s backend are not built in "
                        "this binary",
                   backend_name(ctx->options->backend));
}
#endif

/* The GPU a rank of a thread-launched run uses (start_gpus' rule). */
static int rank_gpu_index(const plan *p, int rank)
{
    device_spec spec;
    return plan_rank_device(p, rank, &spec) == 0 ? spec.index : rank;
}

#ifdef PARTITA_HAVE_CUDA
/* A rank's device memory by term: its stage's tally, its comm's buffers
 * and, for a rank alone on its device, the context: the memory in use
 * there (cudaMemGetInfo) less the tally, which is the CUDA context, the
 * libraries' own buffers and what the tally's rounding misses. Its peak
 * figure is the tally. Runs on the rank's thread. */
static void record_rank_terms(int rank, model_stage *const *stages,
                              int stage_count, double comm_bytes, bool alone,
                              run_result *out)
{
    pt_memory_terms terms = {{0}};
    /* the interleaved 1F1B's chunks are stages of their own */
    for (int c = 0; c < stage_count; c++) {
        pt_memory_terms chunk;
        cuda_stage_memory_terms(stages[c], &chunk);
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            terms.bytes[t] += chunk.bytes[t];
    }
    terms.bytes[PT_MEMORY_COMM] = comm_bytes;
    double tallied = pt_memory_terms_total(&terms, false);
    terms.bytes[PT_MEMORY_CONTEXT] = NAN;
    size_t free_bytes = 0, total_bytes = 0;
    if (alone && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
        terms.bytes[PT_MEMORY_CONTEXT] =
            (double)(total_bytes - free_bytes) - tallied;
    cudaGetLastError();
    out->rank_memory_terms[rank] = terms;
    out->rank_peak_memory_bytes[rank] = tallied;
}

/* No other rank of this run works on the rank's GPU (one process per
 * rank: NCCL's rule, a GPU each). */
static bool rank_alone_on_gpu(const run_context *ctx, int rank)
{
    if (ctx->processes)
        return true;
    int ranks = plan_rank_count(ctx->plan);
    int gpu = rank_gpu_index(ctx->plan, rank);
    for (int other = 0; other < ranks; other++)
        if (other != rank && rank_gpu_index(ctx->plan, other) == gpu)
            return false;
    return true;
}
#endif

/* A cuda stage knows its device and the bytes it allocated: report those
 * instead of the plan's figures and the cpu layout's estimate. */
void run_describe_cuda_stage(run_context *ctx, run_result *out)
{
#ifdef PARTITA_HAVE_CUDA
    if (ctx->options->backend != BACKEND_CUDA)
        return;
    cuda_device_info info;
    if (cuda_device_describe(&info) != 0)
        return;
    run_device *device = &out->device;
    pt_copy_string(device->name, sizeof device->name, info.name);
    int slice = cuda_rank_sm_count(); /* the green context's, or 0 */
    device->sms_used = slice > 0 ? slice : info.multiprocessors;
    if (device->memory_cap_bytes <= 0)
        device->memory_cap_bytes = info.memory_bytes;
    snprintf(device->driver_version, sizeof device->driver_version,
             "CUDA %s", info.driver_cuda_version);
    snprintf(device->cuda_version, sizeof device->cuda_version, "%s",
             info.runtime_cuda_version);
    model_stage *const whole[1] = {&ctx->stage};
    record_rank_terms(0, whole, 1, 0.0, true, out);
    out->peak_memory_bytes = out->rank_peak_memory_bytes[0];
    out->devices[0] = *device;
    out->peak_memory_basis =
        "device bytes the cuda stage allocated, by memory_terms_gib: fp32 "
        "parameters, gradients and AdamW moments, the bf16 weight mirror, "
        "activations, logits, backward scratch, the cuBLASLt workspace and "
        "each allocation rounded up to 2 MiB (not the CUDA context, which "
        "memory_terms_gib's context measures)";
    run_drop_note(out, "the backend interface does not report");
#else
    (void)ctx;
    (void)out;
#endif
}

/* The first two ranks of the plan on one GPU, in *first and *second, and
 * that GPU in *gpu; false when every rank has a GPU of its own. */
static bool ranks_share_gpu(const plan *p, int *first, int *second,
                            int *gpu)
{
    int ranks = plan_rank_count(p);
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

/* Whether every rank of the plan is on one GPU. */
static bool ranks_on_one_gpu(const plan *p)
{
    int ranks = plan_rank_count(p);
    for (int rank = 1; rank < ranks; rank++)
        if (rank_gpu_index(p, rank) != rank_gpu_index(p, 0))
            return false;
    return true;
}

/* The comm of a parallel cuda run (options->gpu_comm, AUTO resolved):
 * NCCL needs a GPU per rank and a build with it; the device exchange
 * every rank on one GPU; host-staged the ranks to be threads of this
 * process. */
int run_resolve_gpu_comm(run_context *ctx, pt_error *err)
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
                        : shared && ranks_on_one_gpu(p)
                            ? RUN_GPU_COMM_DEVICE
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
    if (ctx->gpu_comm == RUN_GPU_COMM_DEVICE && !ranks_on_one_gpu(p))
        return pt_fail(err, "the device exchange joins ranks of one GPU, "
                            "and this plan's ranks are on several; "
                            "--gpu-comm host runs them");
    if (ctx->gpu_comm == RUN_GPU_COMM_NCCL && shared)
        return pt_fail(err, "ranks %d and %d share cuda device %d, and NCCL "
                            "needs a GPU per rank; --gpu-comm host runs "
                            "ranks that share a GPU",
                       first, second, gpu);
    return 0;
}

int run_check_grad_precision(const run_context *ctx, pt_error *err)
{
    const parallel_config *c = &ctx->plan->config;
    if (ctx->options->backend != BACKEND_CUDA ||
        c->grad_precision != GRAD_PRECISION_BF16)
        return 0;
    const char *what = "grad_precision bf16 on the cuda backend";
    /* the widest stage's dp (stages of their own degrees) */
    int dp = 1;
    for (int stage = 0; stage < c->pp; stage++) {
        int own = parallel_stage_config(c, ctx->plan->stages, stage).dp;
        dp = own > dp ? own : dp;
    }
    if (dp > 1 && parallel_zero_stage(c) >= 2)
        return pt_fail(err, "%s: zero %d is not supported: ZeRO-2/3's "
                            "gradient units are fp32 (zero 0 or 1, or "
                            "grad_precision fp32)",
                       what, parallel_zero_stage(c));
    if (c->offload_optimizer)
        return pt_fail(err, "%s: offload_optimizer is not supported: the "
                            "offload's host step is not checked against "
                            "bf16 gradients (grad_precision fp32)",
                       what);
    /* the dp sums and a pipeline's tied-embedding sum */
    bool sums = dp > 1 || (c->pp > 1 && ctx->shape.tied_embeddings);
    if (ctx->parallel && sums && ctx->gpu_comm == RUN_GPU_COMM_HOST)
        return pt_fail(err, "%s: --gpu-comm host sums fp32 only; bf16 "
                            "gradients are summed over NCCL or the device "
                            "exchange (--gpu-comm nccl or device, or "
                            "grad_precision fp32)",
                       what);
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
    model_stage *chunks[PIPELINE_MAX_CHUNKS] = {stage};
    int count = pipeline_chunk_count(&d->ctx->layout);
    for (int c = 1; c < count; c++)
        chunks[c] = pipeline_threads_chunk(d->ctx->launcher, rank, c);
    record_rank_terms(rank, chunks, count,
                      pipeline_gpu_comm_device_bytes(d->ctx->gpu, rank),
                      rank_alone_on_gpu(d->ctx, rank), d->out);
    return 0;
}

/* Each rank's device and device bytes, from its own thread: the stage's
 * allocation plus the comm's staging buffers (which grow during the first
 * steps, so this runs again at the end). */
int run_record_gpu_ranks(run_context *ctx, run_result *out,
                         pt_error *err)
{
    rank_description description = {.ctx = ctx, .out = out};
    out->peak_memory_bytes = 0.0;
    for (int rank = run_local_first(ctx); rank < run_local_end(ctx); rank++) {
        if (pipeline_threads_on_rank(ctx->launcher, rank, describe_rank_task,
                                     &description, err) != 0)
            return -1;
        if (out->rank_peak_memory_bytes[rank] > out->peak_memory_bytes)
            out->peak_memory_bytes = out->rank_peak_memory_bytes[rank];
    }
    out->device = out->devices[run_local_first(ctx)];
    out->peak_memory_basis =
        "device bytes each rank allocated, by memory_terms_gib: its cuda "
        "stage (fp32 parameters, gradients and AdamW moments, the bf16 "
        "weight mirror, activations, logits, backward scratch, the cuBLASLt "
        "workspace, each allocation rounded up to 2 MiB) and its comm's "
        "staging buffers and scratch (NCCL's or the device exchange's; not "
        "the CUDA context or NCCL's own buffers, which memory_terms_gib's "
        "context measures for a rank alone on its GPU; the host-staged comm "
        "holds no device memory)";
    run_drop_note(out, "the backend interface does not report");
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

int run_open_stage_gpu(run_context *ctx, pt_error *err)
{
    if (ctx->options->backend != BACKEND_CUDA)
        return 0;
    device_spec spec = {0};
    int place = 0;
    const node_type *type = rank_node(ctx->plan, 0, &place);
    if (type != NULL && type->device_count > place)
        spec = type->devices[place];
    if (cuda_rank_device_open(spec.index, spec.sm_limit,
                              spec.memory_limit_gib * PT_GIB, err) != 0)
        return -1;
    ctx->stage_gpu_open = true;
    return 0;
}

void run_close_stage_gpu(run_context *ctx)
{
    if (ctx->stage_gpu_open)
        cuda_rank_device_close();
    ctx->stage_gpu_open = false;
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

int run_start_own_gpu(run_context *ctx, run_result *out, pt_error *err)
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
    return run_record_gpu_ranks(ctx, out, err);
}

/* The device exchange's emulated links: between two ranks, the link of
 * the plan's cluster between their nodes (intra-node on one node). NULL
 * when out of memory or a rank has no node. */
static link_spec *plan_links(const plan *p, int ranks)
{
    link_spec *links = malloc((size_t)ranks * (size_t)ranks * sizeof *links);
    for (int a = 0; links != NULL && a < ranks; a++)
        for (int b = 0; b < ranks; b++) {
            int node_a = plan_rank_node(p, a);
            int node_b = plan_rank_node(p, b);
            if (node_a < 0 || node_b < 0) {
                free(links);
                return NULL;
            }
            links[a * ranks + b] = cluster_link(&p->cluster, node_a, node_b);
        }
    return links;
}

static gpu_comm_kind launcher_comm(run_gpu_comm comm)
{
    return comm == RUN_GPU_COMM_HOST     ? GPU_COMM_HOST
           : comm == RUN_GPU_COMM_DEVICE ? GPU_COMM_DEVICE
                                         : GPU_COMM_NCCL;
}

/* The ranks on their GPUs: rank r on the device its node's `devices`
 * entry names (plan_rank_device), with its sm_limit and memory cap; over
 * the device exchange, paced to the plan's cluster links. */
int run_start_gpus(run_context *ctx, run_result *out, pt_error *err)
{
    int ranks = ctx->layout.rank_count;
    device_spec *devices = calloc((size_t)ranks, sizeof *devices);
    link_spec *links = ctx->gpu_comm == RUN_GPU_COMM_DEVICE
                           ? plan_links(ctx->plan, ranks)
                           : NULL;
    ctx->gpu = calloc(1, sizeof *ctx->gpu);
    if (devices == NULL || ctx->gpu == NULL ||
        (ctx->gpu_comm == RUN_GPU_COMM_DEVICE && links == NULL)) {
        free(devices);
        free(links);
        return pt_fail(err, "out of memory for the GPU launcher");
    }
    for (int rank = 0; rank < ranks; rank++)
        if (plan_rank_device(ctx->plan, rank, &devices[rank]) != 0)
            devices[rank] = (device_spec){.index = rank};
    double timeout = ctx->options->comm_timeout_s > 0
                         ? ctx->options->comm_timeout_s
                         : RUN_GPU_COMM_TIMEOUT_S;
    int status = pipeline_gpu_start(ctx->gpu, &ctx->layout, devices,
                                    launcher_comm(ctx->gpu_comm), links,
                                    out->seed, timeout, err);
    free(devices);
    free(links);
    if (status != 0) {
        free(ctx->gpu);
        ctx->gpu = NULL;
        return -1;
    }
    ctx->launcher = &ctx->gpu->threads;
    return run_record_gpu_ranks(ctx, out, err);
}
#else
int run_start_gpus(run_context *ctx, run_result *out, pt_error *err)
{
    (void)out;
    return pt_fail(err, "parallel plans on the %s backend are not built in "
                        "this binary",
                   backend_name(ctx->options->backend));
}

int run_start_own_gpu(run_context *ctx, run_result *out, pt_error *err)
{
    return run_start_gpus(ctx, out, err);
}

int run_open_stage_gpu(run_context *ctx, pt_error *err)
{
    (void)ctx;
    (void)err;
    return 0; /* no cuda backend: backend_find refused it already */
}

void run_close_stage_gpu(run_context *ctx)
{
    (void)ctx;
}
#endif
