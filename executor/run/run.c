/*
 * `partita exec`'s library half, its entry points (run/run.h): a plan of
 * one stage on one device, or a parallel plan (pp, dp or tp > 1) whose
 * ranks run as threads of this process or as one process each. Loads and
 * checks everything before the first allocation of the model (plan,
 * options, checkpoint, dataset, vocabulary, memory), then trains
 * (run/loop.c) and summarises what happened for the record. The other
 * files of run/: context.c (the ranks of this process, notes), options.c,
 * memory.c, devices.c (the GPUs), processes.c (one process per rank),
 * checkpoint.c (the run's checkpoints), record.c (run.json).
 */
#ifdef PARTITA_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif
#include "executor/run/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* Every step takes samples_per_step samples in order, so the optimizer
 * steps say where the data stands; a position elsewhere (its epoch
 * above all) belongs to another save. */
static int check_resumed_position(const run_context *ctx, pt_error *err)
{
    uint64_t per_epoch = ctx->sampler.samples_per_epoch;
    uint64_t taken = (uint64_t)ctx->resume.optimizer_steps *
                     (uint64_t)ctx->resume.samples_per_step;
    data_position expected = {.epoch = taken / per_epoch,
                              .index = taken % per_epoch};
    if (ctx->position.epoch == expected.epoch &&
        ctx->position.index == expected.index)
        return 0;
    return pt_fail(err, "%s: the checkpoint disagrees with itself: %s: "
                        "epoch %llu, sample %llu, but %ld optimizer steps "
                        "of %ld samples end at epoch %llu, sample %llu "
                        "(parts of different saves?)",
                   ctx->options->load_dir, BLOB_POSITION,
                   (unsigned long long)ctx->position.epoch,
                   (unsigned long long)ctx->position.index,
                   ctx->resume.optimizer_steps, ctx->resume.samples_per_step,
                   (unsigned long long)expected.epoch,
                   (unsigned long long)expected.index);
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
    return check_resumed_position(ctx, err);
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
        run_add_note(out, note);
    }
}

/* Stages of their own degrees: theirs, beside the plan-wide pp x dp x tp
 * the notes below name. */
static void describe_own_degrees(const plan *p, run_result *out)
{
    if (plan_first_asymmetric_stage(p) < 0)
        return;
    char note[512];
    int used = snprintf(note, sizeof note,
                        "stages of their own degrees (tp x dp, samples a "
                        "replica's micro-batch):");
    for (int s = 0; s < p->config.pp && used < (int)sizeof note - 24; s++) {
        parallel_config own = parallel_stage_config(&p->config, p->stages, s);
        used += snprintf(note + used, sizeof note - (size_t)used,
                         "%s %d x %d (%d)", s > 0 ? "," : "", own.tp, own.dp,
                         own.mbs);
    }
    run_add_note(out, note);
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
    out->rank_count = plan_rank_count(ctx->plan);
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
            ? "computed per rank: its stage's parameters and gradients (4 "
              "bytes per parameter of the stage each, or of its optimizer "
              "shard plus one buffer per unit kind: the embeddings, a "
              "layer, the head; the gradients so under ZeRO-2/3, the "
              "parameters under ZeRO-3) and AdamW moments (8 bytes per parameter of its optimizer's "
              "range: all, or its ZeRO shard), and the "
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
    run_describe_device(ctx->plan, options->backend, &out->device, out);
    for (int rank = 0; rank < out->rank_count; rank++) {
        out->devices[rank] = out->device;
        out->devices[rank].rank = rank;
    }
    describe_plan_fit(ctx->plan, options->backend, out);
    describe_own_degrees(ctx->plan, out);
    char degrees[64];
    if (plan_first_asymmetric_stage(ctx->plan) >= 0)
        snprintf(degrees, sizeof degrees, "pp %d, each stage its tp x dp",
                 out->pp);
    else
        snprintf(degrees, sizeof degrees, "pp %d x dp %d x tp %d", out->pp,
                 out->dp, out->tp);
    if (ctx->processes) {
        char note[256];
        snprintf(note, sizeof note,
                 "the %d ranks (%s) ran as %d processes (MPI), one rank "
                 "each, %s",
                 out->rank_count, degrees, out->rank_count,
                 options->backend == BACKEND_CPU
                     ? "communicating over MPI"
                     : "one GPU each, communicating over NCCL");
        run_add_note(out, note);
    } else if (ctx->parallel) {
        char note[384];
        snprintf(note, sizeof note,
                 "the %d ranks (%s) ran as threads of one process, %s",
                 out->rank_count, degrees,
                 options->backend == BACKEND_CPU
                     ? "sharing the cpu's cores and memory"
                 : ctx->gpu_comm == RUN_GPU_COMM_HOST
                     ? "on this machine's GPUs (ranks may share one, each "
                       "in its own slice of SMs), communicating through "
                       "host memory (the host-staged comm: slow, for "
                       "checks, not for speed)"
                 : ctx->gpu_comm == RUN_GPU_COMM_DEVICE
                     ? "on one GPU, each in its own slice of SMs, "
                       "communicating through its memory (the device "
                       "exchange), every transfer paced to the cluster's "
                       "link between the ranks (emulated links: "
                       "docs/executor.md)"
                     : "one GPU each, communicating over NCCL");
        run_add_note(out, note);
    }
}

static int allocate_buffers(run_context *ctx, const run_result *out,
                            pt_error *err)
{
    size_t window = (size_t)ctx->shape.seq + 1;
    ctx->tokens = malloc((size_t)out->gbs * window * sizeof *ctx->tokens);
    if (!ctx->parallel)
        ctx->next_tokens =
            malloc((size_t)out->gbs * window * sizeof *ctx->next_tokens);
    ctx->events_per_iteration =
        ctx->parallel ? out->rank_count * (6 * out->micro_batches + 4) *
                            pipeline_chunk_count(&ctx->layout)
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
        (!ctx->parallel && ctx->next_tokens == NULL) ||
        ((ctx->options->save_dir != NULL || ctx->options->load_dir != NULL) &&
         ctx->host_buffer == NULL))
        return pt_fail(err, "out of memory for the run's buffers");
    return 0;
}

/* The layout of a parallel plan, the per-rank records and the largest
 * stage or chunk (for the checkpoint buffer). */
static int prepare_layout(run_context *ctx, run_result *out, pt_error *err)
{
    const plan *p = ctx->plan;
    stage_spec whole = stage_spec_whole_model(&ctx->shape);
    if (stage_parameter_layout(&ctx->shape, &whole, NULL, &ctx->param_count,
                               err) < 0)
        return -1;
    ctx->largest_rank_params = ctx->param_count;
    int ranks = plan_rank_count(p);
    ctx->parallel = p->config.pp > 1 || ranks > 1;
    out->devices = calloc((size_t)ranks, sizeof *out->devices);
    out->rank_peak_memory_bytes =
        calloc((size_t)ranks, sizeof *out->rank_peak_memory_bytes);
    out->rank_memory_terms =
        calloc((size_t)ranks, sizeof *out->rank_memory_terms);
    if (out->devices == NULL || out->rank_peak_memory_bytes == NULL ||
        out->rank_memory_terms == NULL)
        return pt_fail(err, "out of memory for the records of %d ranks",
                       ranks);
    for (int rank = 0; rank < ranks; rank++)
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            out->rank_memory_terms[rank].bytes[t] = NAN; /* not known */
    if (!ctx->parallel)
        return 0;
    if (run_resolve_gpu_comm(ctx, err) != 0)
        return -1;
    if (pipeline_layout_init_stages(&ctx->layout, &ctx->shape, &p->config,
                                    p->partition, p->config.pp, p->stages,
                                    err) != 0)
        return -1;
    /* three buffers per chunk of each rank, four shared */
    int chunks = run_chunk_count(ctx);
    int blobs = 3 * ranks * chunks + 4;
    if ((ctx->options->save_dir != NULL || ctx->options->load_dir != NULL) &&
        blobs > CHECKPOINT_MAX_BLOBS)
        return pt_fail(err, "checkpoints of %d ranks of %d chunks are not "
                            "supported yet: they need %d blobs (3 per chunk "
                            "of each rank and 4 more), a checkpoint holds at "
                            "most %d",
                       ranks, chunks, blobs, CHECKPOINT_MAX_BLOBS);
    ctx->largest_rank_params = 0;
    for (int rank = 0; rank < ranks; rank++)
        for (int chunk = 0; chunk < chunks; chunk++) {
            size_t params = 0;
            if (run_chunk_param_count(ctx, rank, chunk, &params, err) != 0)
                return -1;
            if (params > ctx->largest_rank_params)
                ctx->largest_rank_params = params;
        }
    return 0;
}

/* Every rank's stage, initialised from the seed (the same values as the
 * one-stage run's) and then, when resuming, overwritten by the
 * checkpoint. */
static int start_threads(run_context *ctx, run_result *out, pt_error *err)
{
    if (ctx->processes) {
        /* rank 0's log shows the largest rank's memory from the start */
        if (run_start_own_rank(ctx, out, err) != 0 ||
            run_gather_rank_records(ctx, out, err) != 0)
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
    } else if (run_start_gpus(ctx, out, err) != 0) {
        return -1;
    }
    if (ctx->resume.active)
        return run_restore_checkpoint(ctx, err);
    return 0;
}

/* One run at a time saves into a folder: the lock is taken before the
 * folder is looked at, so that a second run is refused naming the first
 * rather than finding its checkpoint (or none yet). */
static int lock_save_folder(run_context *ctx, pt_error *err)
{
    const char *save = ctx->options->save_dir;
    if (save == NULL || save[0] == '\0' ||
        (ctx->processes && ctx->world.rank != 0))
        return 0;
    return checkpoint_lock_take(&ctx->save_lock, save, err);
}

/* Everything before the first iteration; any failure is a refusal. */
static int prepare_run(run_context *ctx, run_result *out, pt_error *err)
{
    const run_options *options = ctx->options;
    if (run_check_plan(ctx->plan, err) != 0 ||
        run_check_backend(ctx->plan, options->backend, err) != 0 ||
        lock_save_folder(ctx, err) != 0 ||
        run_check_options(options, err) != 0 ||
        run_check_interleave(ctx->plan, options, err) != 0)
        return -1;
    if (prepare_layout(ctx, out, err) != 0 ||
        run_check_grad_precision(ctx, err) != 0 ||
        backend_find(options->backend, err) == NULL)
        return -1;
    fill_result_header(ctx, out);
    stage_spec spec = stage_spec_whole_model(&ctx->shape);
    spec.recompute_layers = ctx->plan->config.recompute;
    spec.bf16_grads =
        ctx->plan->config.grad_precision == GRAD_PRECISION_BF16;
    spec.offload_optimizer = ctx->plan->config.offload_optimizer;
    spec.deterministic = ctx->plan->config.deterministic;
    if (options->load_dir != NULL && run_read_resume_state(ctx, err) != 0)
        return -1;
    out->seed = ctx->resume.active ? ctx->resume.seed : options->seed;
    out->first_iteration = ctx->resume.optimizer_steps + 1;
    if (open_data(ctx, out->seed, out, err) != 0 ||
        run_check_memory(ctx, out, err) != 0 ||
        allocate_buffers(ctx, out, err) != 0)
        return -1;
    if (ctx->parallel)
        return start_threads(ctx, out, err);
    if (run_open_stage_gpu(ctx, err) != 0 ||
        model_stage_create(&ctx->stage, &ctx->shape, &spec, options->backend,
                           out->mbs, 1, err) != 0)
        return -1;
    ctx->stage_ready = true;
    run_describe_cuda_stage(ctx, out);
    /* A resumed stage gets every buffer that matters from the checkpoint
     * (gradients are zeroed at the start of each step). */
    if (ctx->resume.active)
        return run_restore_checkpoint(ctx, err);
    return model_stage_init_parameters(&ctx->stage, out->seed, err);
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
    if (ctx->processes &&
        run_gather_chosen_events(ctx, out, &chosen, err) != 0)
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

/* Trains, then summarises what finished: after a part-way failure too
 * (threads), so that the record keeps the iterations done and the
 * reason. 0 or -2. */
static int train_and_summarise(run_context *ctx, run_result *out,
                               pt_error *err)
{
    int status = run_train_iterations(ctx, out, err) == 0 ? 0 : -2;
    if (status != 0) {
        out->stopped = true;
        pt_copy_string(out->stop_reason, sizeof out->stop_reason,
                       err->message);
    } else if (out->stopped) {
        pt_copy_string(out->stop_reason, sizeof out->stop_reason,
                       "stopped on request");
    }
    /* the summary of one process per rank gathers from every process,
       which a failure may have ended */
    bool summarise = out->iteration_count > 0 &&
                     (status == 0 || !ctx->processes);
    pt_error summary_err = {{0}};
    if (summarise && summarise_timing(ctx, out, &summary_err) != 0 &&
        status == 0) {
        *err = summary_err;
        status = -2;
    }
    return status;
}

static void record_max_rss(run_result *out)
{
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0)
        out->max_rss_bytes = (double)usage.ru_maxrss * 1024.0; /* KiB */
}

/* A GPU run's comm buffers grow during the first steps, and the device
 * memory in use (the context term) with the libraries' lazy set-up: take
 * each rank's figure again at the end. */
static void record_final_gpu_memory(run_context *ctx, run_result *out)
{
#ifdef PARTITA_HAVE_CUDA
    pt_error ignored = {{0}};
    if (ctx->gpu != NULL && ctx->launcher != NULL)
        run_record_gpu_ranks(ctx, out, &ignored);
    if (!ctx->parallel && ctx->stage_ready)
        run_describe_cuda_stage(ctx, out);
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
    run_close_stage_gpu(ctx);
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
    free(ctx->next_tokens);
    free(ctx->host_buffer);
    free(ctx->event_ring);
    free(ctx->world_members);
    checkpoint_lock_release(&ctx->save_lock);
}

int run_training(const plan *p, const run_options *options, run_result *out,
                 pt_error *err)
{
    memset(out, 0, sizeof *out);
    run_context ctx = {.options = options, .plan = p, .shape = p->model,
                       .save_lock = {.fd = -1}};
    if (options->processes != NULL && run_check_process_world(&ctx, err) != 0)
        return -1;
    int status = prepare_run(&ctx, out, err);
    if (status == 0) {
        record_start_time(out);
        status = train_and_summarise(&ctx, out, err);
    }
    record_max_rss(out);
    record_final_gpu_memory(&ctx, out);
    if (status == 0 && ctx.processes &&
        run_gather_rank_records(&ctx, out, err) != 0)
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
    free(r->rank_memory_terms);
    r->rank_memory_terms = NULL;
    r->iterations = NULL;
    r->events = NULL;
    r->devices = NULL;
    r->rank_peak_memory_bytes = NULL;
    r->iteration_count = 0;
    r->event_count = 0;
}
