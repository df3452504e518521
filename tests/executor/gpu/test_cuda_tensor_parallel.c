/*
 * Tensor parallelism in the cuda backend, on one GPU:
 *   1. a tp = 2 pair of whole-model stages (embedding, layers, head; tied
 *      and untied head; a vocabulary of 1001 split 501 + 500, so both
 *      shards' logits carry masked padding) run as two threads, one per
 *      shard, joined by the host-staged comm (device buffers summed
 *      through host memory, fp32) and again by the device exchange (the
 *      sums enqueued on the stages' streams, the four of each layer in
 *      bf16). The shards' gradients, put together into whole tensors,
 *      are held against the unsplit cuda stage and against the cpu
 *      backend's tp = 2 shards (same parameters, same tokens); the loss
 *      too. Replicated tensors (norms, row-parallel biases, position
 *      embedding) must come out bit for bit equal on both shards, and
 *      the shards' gradient-norm shares must add up to the unsplit norm;
 *      The same pair with Megatron's sequence parallelism (each shard
 *      holding half the rows outside the products, one sequence of 96
 *      positions a micro-batch so the second shard's rows start mid
 *      sequence, in a stage made for two), over both comms: against the
 *      unsplit stage and the cpu backend's sequence-parallel shards as
 *      above, and against the plain tp pair of the same comm: the same
 *      loss to 1e-5 and gradients to 1e-3 (only the norms' gradients
 *      are summed in another order);
 *      The same pairs of a Llama-shaped model (RMSNorm, SwiGLU, rotary
 *      positions, 4 query heads over 2 key/value heads: one group a
 *      shard, qkv biases, untied head), plain and sequence-parallel;
 *   2. a compute-only shard (the profiler's: no comm) runs and stays
 *      finite;
 *   3. grad_square_sums (one sum per tensor) against sums made on the
 *      host and against grad_square_sum;
 *   4. the memory cap: a stage is refused under a cap smaller than it,
 *      and releasing a stage gives its bytes back to the cap;
 *   5. the vocab-parallel embedding's lookup and token gradient of two
 *      shards against the whole (cuda_embedding_shard_forward, range
 *      plans).
 *
 * Usage: test_cuda_tensor_parallel
 * Tolerances: those of test_cuda_stage (bf16 products): loss 5e-3,
 * gradients 3e-2 relative L2 per tensor.
 */
#include <pthread.h>

#include "gpu_test.h"

#include "executor/cpu/cpu.h"
#include "executor/executor.h"
#include "executor/parallel/parallel.h"

#define TOL_LOSS 5e-3
#define TOL_GRAD 3e-2
#define TOL_NORM 2e-2
#define TOL_DOUBLE_SUM 1e-9
#define TOL_SP_LOSS 1e-5
#define TOL_SP_GRAD 1e-3
#define TP 2

/* --------------------------------------------------------- the shards */

static model_shape tp_shape(bool tied)
{
    model_shape shape;
    memset(&shape, 0, sizeof shape);
    snprintf(shape.name, sizeof shape.name, "tp-test");
    shape.layers = 2;
    shape.hidden = 128;
    shape.heads = 2;       /* one head of 64 per shard */
    shape.ffn_hidden = 512;
    shape.seq = 96;        /* one and a half attention tiles */
    shape.vocab = 1001;    /* 501 + 500 rows: padded logits on both */
    shape.tied_embeddings = tied;
    return shape;
}

/* The same made a Llama (issue 35): RMSNorm, SwiGLU, rotary positions,
 * 4 query heads of 32 over 2 key/value heads (one group a shard), qkv
 * biases (Qwen's) and an untied head. */
static model_shape tp_llama_shape(void)
{
    model_shape shape = tp_shape(false);
    snprintf(shape.name, sizeof shape.name, "tp-llama-test");
    shape.heads = 4;
    shape.kv_heads = 2;
    shape.bias = MODEL_BIAS_QKV;
    gpu_test_llama_layer(&shape);
    return shape;
}

/* One shard's share of a step, run on its own thread. */
typedef struct shard_job {
    model_stage *stage;
    const comm *handle;          /* to abort the group on failure */
    const uint32_t *tokens;
    int micro_batches;
    int mbs;
    float loss;                  /* mean over the micro-batches */
    int status;
    pt_error err;
} shard_job;

/* Zero grads, then forward and backward of each micro-batch in slot 0
 * with loss_scale 1 / micro_batches. */
static int micro_batch_steps(model_stage *stage, const uint32_t *tokens,
                             int micro_batches, int mbs, float *mean_loss,
                             pt_error *err)
{
    if (stage_zero_grads(stage, err) != 0)
        return -1;
    double loss_sum = 0.0;
    size_t window = (size_t)stage->shape.seq + 1;
    for (int m = 0; m < micro_batches; m++) {
        stage_io io = {
            .mbs = mbs,
            .tokens = tokens + (size_t)m * (size_t)mbs * window,
            .loss_scale = 1.0f / (float)micro_batches,
        };
        float loss = 0.0f;
        if (stage_forward(stage, 0, &io, &loss, err) != 0 ||
            stage_backward(stage, 0, &io, err) != 0)
            return -1;
        loss_sum += loss;
    }
    *mean_loss = (float)(loss_sum / micro_batches);
    return 0;
}

static void *run_shard(void *argument)
{
    shard_job *job = argument;
    job->status = micro_batch_steps(job->stage, job->tokens,
                                    job->micro_batches, job->mbs, &job->loss,
                                    &job->err);
    if (job->status != 0 && job->handle != NULL)
        comm_abort(job->handle, job->err.message);
    return NULL;
}

/* Runs the TP shards' step, one thread each, joined by handles[t]. */
static void run_shards(model_stage *shards, const comm *handles,
                       const uint32_t *tokens, int micro_batches, int mbs,
                       float *losses)
{
    pthread_t threads[TP];
    shard_job jobs[TP];
    for (int t = 0; t < TP; t++) {
        jobs[t] = (shard_job){.stage = &shards[t], .handle = &handles[t],
                              .tokens = tokens, .micro_batches = micro_batches,
                              .mbs = mbs};
        if (pthread_create(&threads[t], NULL, run_shard, &jobs[t]) != 0) {
            printf("FAIL cannot start the thread of shard %d\n", t);
            exit(1);
        }
    }
    for (int t = 0; t < TP; t++)
        pthread_join(threads[t], NULL);
    for (int t = 0; t < TP; t++) {
        if (jobs[t].status != 0) {
            printf("FAIL shard %d (%s backend): %s\n", t,
                   shards[t].backend->name, jobs[t].err.message);
            exit(1);
        }
        losses[t] = jobs[t].loss;
    }
}

/* Shard t of the whole model on a backend (with sequence parallelism or
 * not), initialised like the unsplit model and attached to its group
 * through handles[t]. */
static void create_shards(model_stage *shards, const model_shape *shape,
                          backend_kind backend, int mbs, uint64_t seed,
                          const comm *handles, bool sp)
{
    pt_error err;
    static const int group[TP] = {0, 1};
    for (int t = 0; t < TP; t++) {
        stage_spec spec = stage_spec_whole_model(shape);
        spec.tp = TP;
        spec.tp_rank = t;
        spec.sequence_parallel = sp;
        /* the cpu's stream rounded to bf16 as cuda's (cuda ignores it) */
        spec.bf16_residual = true;
        PT_CHECK(model_stage_create(&shards[t], shape, &spec, backend, mbs, 1,
                                    &err),
                 &err);
        PT_CHECK(model_stage_init_parameters(&shards[t], seed, &err), &err);
        PT_CHECK(model_stage_attach_tp(&shards[t], &handles[t], group, &err),
                 &err);
    }
}

/* ------------------------------------------------ putting shards together */

/* Where element k of a shard's tensor sits in the whole tensor (see
 * param_tensor: parts, part offsets and full shape). */
static size_t whole_index(const param_tensor *shard, size_t k)
{
    int r = (int)(k / (size_t)shard->cols), c = (int)(k % (size_t)shard->cols);
    int kept_rows = shard->rows / shard->row_parts;
    int kept_cols = shard->cols / shard->col_parts;
    int row = r / kept_rows * (shard->full_rows / shard->row_parts) +
              shard->part_row_offset + r % kept_rows;
    int col = c / kept_cols * (shard->full_cols / shard->col_parts) +
              shard->part_col_offset + c % kept_cols;
    return (size_t)row * (size_t)shard->full_cols + (size_t)col;
}

/* The shards' gradients laid out as the unsplit stage's buffer. Fails the
 * program when an element of the whole is left uncovered. */
static float *assemble(const model_stage *shards, const model_stage *whole)
{
    float *out = gpu_test_host((whole->param_count + 1) * sizeof *out);
    unsigned char *covered = gpu_test_host(whole->param_count + 1);
    for (int t = 0; t < TP; t++) {
        float *grads = gpu_test_read_buffer(&shards[t], STAGE_GRADS);
        for (int i = 0; i < shards[t].tensor_count; i++) {
            const param_tensor *mine = &shards[t].tensors[i];
            const param_tensor *theirs =
                model_stage_find_tensor(whole, mine->name);
            if (theirs == NULL || mine->full_rows != theirs->rows ||
                mine->full_cols != theirs->cols) {
                printf("FAIL shard tensor %s has no whole counterpart\n",
                       mine->name);
                exit(1);
            }
            for (size_t k = 0; k < mine->count; k++) {
                size_t at = theirs->offset + whole_index(mine, k);
                out[at] = grads[mine->offset + k];
                covered[at] = 1;
            }
        }
        free(grads);
    }
    for (size_t i = 0; i < whole->param_count; i++) {
        if (!covered[i]) {
            printf("FAIL the shards leave element %zu of the whole model "
                   "uncovered\n",
                   i);
            exit(1);
        }
    }
    free(covered);
    return out;
}

/* Every tensor of `got` against `want`, both in the layout of `layout`.
 * Prints the failures and one summary check. */
static void compare_tensors(gpu_test_tally *tally, const char *label,
                            const model_stage *layout, const float *got,
                            const float *want, double tolerance)
{
    int failures = 0;
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < layout->tensor_count; i++) {
        const param_tensor *t = &layout->tensors[i];
        double diff = 0.0, norm = 0.0;
        bool finite = true;
        for (size_t k = 0; k < t->count; k++) {
            double g = got[t->offset + k], w = want[t->offset + k];
            finite = finite && isfinite(g);
            diff += (g - w) * (g - w);
            norm += w * w;
        }
        double relative = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        bool pass = finite && relative <= tolerance;
        if (!finite || relative > worst) {
            worst = finite ? relative : INFINITY;
            worst_name = t->name;
        }
        if (!pass) {
            printf("FAIL %s %-36s rel L2 err %.3e (tolerance %.1e)%s\n",
                   label, t->name, relative, tolerance,
                   finite ? "" : " NON-FINITE");
            failures++;
        }
    }
    char line[256];
    snprintf(line, sizeof line,
             "%s: %d tensors, worst %s at rel L2 err %.3e (tolerance %.1e)",
             label, layout->tensor_count, worst_name, worst, tolerance);
    gpu_test_expect(tally, failures == 0, line);
}

static void compare_value(gpu_test_tally *tally, const char *name, double got,
                          double want, double tolerance)
{
    float g = (float)got, w = (float)want;
    gpu_test_compare(tally, name, &g, &w, 1, tolerance);
}

/* Replicated tensors are computed from the same summed values on every
 * shard by the same deterministic kernels: they must agree exactly. */
static void check_replicas_agree(gpu_test_tally *tally, const char *label,
                                 const model_stage *shards)
{
    float *first = gpu_test_read_buffer(&shards[0], STAGE_GRADS);
    float *second = gpu_test_read_buffer(&shards[1], STAGE_GRADS);
    int replicated = 0, differing = 0;
    for (int i = 0; i < shards[0].tensor_count; i++) {
        const param_tensor *t = &shards[0].tensors[i];
        if (!t->replicated)
            continue;
        replicated++;
        const param_tensor *other = &shards[1].tensors[i];
        if (memcmp(first + t->offset, second + other->offset,
                   t->count * sizeof(float)) != 0) {
            printf("FAIL %s: replicated %s differs between the shards\n",
                   label, t->name);
            differing++;
        }
    }
    char line[256];
    snprintf(line, sizeof line,
             "%s: %d replicated gradient tensors equal on both shards",
             label, replicated);
    gpu_test_expect(tally, replicated > 0 && differing == 0, line);
    free(first), free(second);
}

/* --------------------------------------------------- 1. the tp = 2 pair */

/* The cuda pair's comm: host-staged (blocking, fp32 sums after a stream
 * synchronisation) or the device exchange (sums enqueued on the stages'
 * streams, Megatron's four per layer in bf16). Neither has green
 * contexts here, so the ranks' streams may be made on this thread. */
typedef struct pair_comm {
    bool exchange;
    comm_staged *staged;
    comm_exchange *device;
    comm handles[TP];
} pair_comm;

static void open_pair_comm(pair_comm *p, bool exchange)
{
    pt_error err;
    memset(p, 0, sizeof *p);
    p->exchange = exchange;
    if (exchange)
        PT_CHECK(comm_exchange_create(TP, NULL, 60.0, &p->device, &err),
                 &err);
    else
        PT_CHECK(comm_staged_create(TP, 60.0, &p->staged, &err), &err);
    for (int t = 0; t < TP; t++) {
        if (exchange) {
            PT_CHECK(comm_exchange_rank_open(p->device, t, &err), &err);
            p->handles[t] = comm_exchange_rank(p->device, t);
        } else {
            PT_CHECK(comm_staged_rank_open(p->staged, t, &err), &err);
            p->handles[t] = comm_staged_rank(p->staged, t);
        }
    }
}

static void close_pair_comm(pair_comm *p)
{
    for (int t = 0; t < TP; t++)
        if (p->exchange)
            comm_exchange_rank_close(p->device, t);
        else
            comm_staged_rank_close(p->staged, t);
    comm_exchange_destroy(p->device);
    comm_staged_destroy(p->staged);
}

/* Sequence parallelism against the plain tp pair over the same comm:
 * the same loss and, but for the norms' gradients' summation order, the
 * same gradients. */
static void compare_with_plain_tp(gpu_test_tally *tally, const char *label,
                                  const model_shape *shape, int capacity,
                                  int mbs, int micro_batches, uint64_t seed,
                                  const uint32_t *tokens, const comm *handles,
                                  const model_stage *whole,
                                  const float *sp_assembled, float sp_loss)
{
    model_stage plain[TP];
    float losses[TP];
    create_shards(plain, shape, BACKEND_CUDA, capacity, seed, handles,
                  false);
    run_shards(plain, handles, tokens, micro_batches, mbs, losses);
    char name[200];
    printf("# %s loss %.6f, plain tp=2 %.6f nats/token\n", label, sp_loss,
           losses[0]);
    snprintf(name, sizeof name, "%s loss vs plain tp=2", label);
    compare_value(tally, name, sp_loss, losses[0], TOL_SP_LOSS);
    float *assembled = assemble(plain, whole);
    snprintf(name, sizeof name, "%s grad vs plain tp=2", label);
    compare_tensors(tally, name, whole, sp_assembled, assembled, TOL_SP_GRAD);
    free(assembled);
    for (int t = 0; t < TP; t++)
        model_stage_destroy(&plain[t]);
}

static void test_tensor_parallel_pair(gpu_test_tally *tally, bool tied,
                                      bool exchange, bool sp, bool llama)
{
    pt_error err;
    model_shape shape = llama ? tp_llama_shape() : tp_shape(tied);
    /* sequence parallelism: one sequence a micro-batch, so shard 1's
     * rows start mid sequence, in stages made for two */
    int capacity = 2, mbs = sp ? 1 : 2, micro_batches = 2;
    uint64_t seed = tied ? 31 : 32;
    char label[96];
    snprintf(label, sizeof label, "tp=2%s %s%s%s", sp ? " sp" : "",
             llama ? "llama " : "", tied ? "tied" : "untied",
             exchange ? " (device exchange, bf16 sums on the stream)" : "");
    printf("# %s: %d layers, hidden %d, %d heads, ffn %d, vocab %d, seq %d, "
           "mbs %d x %d micro-batches\n",
           label, shape.layers, shape.hidden, shape.heads, shape.ffn_hidden,
           shape.vocab, shape.seq, mbs, micro_batches);
    uint64_t state = tied ? 77 : 78;
    uint32_t *tokens = gpu_test_random_tokens(micro_batches * mbs * (shape.seq + 1),
                                     shape.vocab, &state);

    /* the unsplit cuda stage */
    stage_spec whole_spec = stage_spec_whole_model(&shape);
    model_stage whole;
    PT_CHECK(cuda_model_stage_create(&whole, &shape, &whole_spec, capacity,
                                     1, &err),
             &err);
    PT_CHECK(model_stage_init_parameters(&whole, seed, &err), &err);
    float whole_loss = 0.0f;
    PT_CHECK(micro_batch_steps(&whole, tokens, micro_batches, mbs,
                               &whole_loss, &err),
             &err);
    float *whole_grads = gpu_test_read_buffer(&whole, STAGE_GRADS);

    /* the cuda pair through its comm, the cpu pair through threads */
    pair_comm cuda_world;
    open_pair_comm(&cuda_world, exchange);
    const comm *cuda_handles = cuda_world.handles;
    comm_threads *cpu_world = NULL;
    PT_CHECK(comm_threads_create(TP, 60.0, &cpu_world, &err), &err);
    comm cpu_handles[TP];
    for (int t = 0; t < TP; t++)
        cpu_handles[t] = comm_threads_rank(cpu_world, t);
    model_stage cuda_shards[TP], cpu_shards[TP];
    create_shards(cuda_shards, &shape, BACKEND_CUDA, capacity, seed,
                  cuda_handles, sp);
    create_shards(cpu_shards, &shape, BACKEND_CPU, capacity, seed,
                  cpu_handles, sp);
    float cuda_losses[TP], cpu_losses[TP];
    run_shards(cuda_shards, cuda_handles, tokens, micro_batches, mbs,
               cuda_losses);
    run_shards(cpu_shards, cpu_handles, tokens, micro_batches, mbs,
               cpu_losses);
    printf("# %s loss: cuda shards %.6f / %.6f, unsplit cuda %.6f, cpu "
           "shards %.6f nats/token\n",
           label, cuda_losses[0], cuda_losses[1], whole_loss, cpu_losses[0]);

    char name[160];
    snprintf(name, sizeof name, "%s: both shards report the same loss",
             label);
    gpu_test_expect(tally, cuda_losses[0] == cuda_losses[1], name);
    snprintf(name, sizeof name, "%s loss vs unsplit cuda", label);
    compare_value(tally, name, cuda_losses[0], whole_loss, TOL_LOSS);
    snprintf(name, sizeof name, "%s loss vs cpu tp=2", label);
    compare_value(tally, name, cuda_losses[0], cpu_losses[0], TOL_LOSS);

    float *cuda_assembled = assemble(cuda_shards, &whole);
    float *cpu_assembled = assemble(cpu_shards, &whole);
    snprintf(name, sizeof name, "%s grad vs unsplit cuda", label);
    compare_tensors(tally, name, &whole, cuda_assembled, whole_grads,
                    TOL_GRAD);
    snprintf(name, sizeof name, "%s grad vs cpu tp=2", label);
    compare_tensors(tally, name, &whole, cuda_assembled, cpu_assembled,
                    TOL_GRAD);
    check_replicas_agree(tally, label, cuda_shards);
    if (sp)
        compare_with_plain_tp(tally, label, &shape, capacity, mbs,
                              micro_batches, seed, tokens, cuda_handles,
                              &whole, cuda_assembled, cuda_losses[0]);

    /* the global norm: shard 1 leaves out what shard 0 counts */
    double shares[TP], whole_square = 0.0;
    for (int t = 0; t < TP; t++)
        PT_CHECK(stage_grad_norm_share(&cuda_shards[t], &shares[t], &err),
                 &err);
    PT_CHECK(stage_grad_square_sum(&whole, &whole_square, &err), &err);
    printf("# %s gradient norm: shards %.6f, unsplit %.6f\n", label,
           sqrt(shares[0] + shares[1]), sqrt(whole_square));
    snprintf(name, sizeof name, "%s gradient norm from the shares", label);
    compare_value(tally, name, sqrt(shares[0] + shares[1]),
                  sqrt(whole_square), TOL_NORM);

    free(cuda_assembled), free(cpu_assembled), free(whole_grads);
    free(tokens);
    for (int t = 0; t < TP; t++) {
        model_stage_destroy(&cuda_shards[t]);
        model_stage_destroy(&cpu_shards[t]);
    }
    model_stage_destroy(&whole);
    close_pair_comm(&cuda_world);
    comm_threads_destroy(cpu_world);
}

/* ------------------------------------------------- 2. compute-only shard */

static void test_compute_only(gpu_test_tally *tally)
{
    pt_error err;
    model_shape shape = tp_shape(true);
    int mbs = 2;
    stage_spec spec = stage_spec_whole_model(&shape);
    spec.tp = TP;
    spec.tp_rank = 1;
    model_stage shard;
    PT_CHECK(cuda_model_stage_create(&shard, &shape, &spec, mbs, 1, &err),
             &err);
    PT_CHECK(model_stage_init_parameters(&shard, 5, &err), &err);
    PT_CHECK(model_stage_attach_tp(&shard, NULL, NULL, &err), &err);
    uint64_t state = 3;
    uint32_t *tokens = gpu_test_random_tokens(mbs * (shape.seq + 1), shape.vocab,
                                     &state);
    float loss = 0.0f;
    PT_CHECK(micro_batch_steps(&shard, tokens, 1, mbs, &loss, &err), &err);
    double square = 0.0;
    PT_CHECK(stage_grad_square_sum(&shard, &square, &err), &err);
    char line[160];
    snprintf(line, sizeof line,
             "compute-only shard: finite loss %.4f nats/token and gradient "
             "norm %.4f without a comm",
             loss, sqrt(square));
    gpu_test_expect(tally, isfinite(loss) && isfinite(square) && square > 0,
                    line);
    free(tokens);
    model_stage_destroy(&shard);
}

/* ---------------------------------------------- 3. grad_square_sums */

/* The backend's per-tensor sums against double sums of the downloaded
 * gradients, and their total against grad_square_sum. */
static void check_square_sums(gpu_test_tally *tally, const char *label,
                              const model_stage *stage)
{
    pt_error err;
    float *grads = gpu_test_read_buffer(stage, STAGE_GRADS);
    double *sums = gpu_test_host((size_t)stage->tensor_count * sizeof *sums);
    PT_CHECK(stage->backend->grad_square_sums(stage, sums, &err), &err);
    double worst = 0.0, total = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        double want = 0.0;
        for (size_t k = 0; k < t->count; k++)
            want += (double)grads[t->offset + k] * grads[t->offset + k];
        double relative = fabs(sums[i] - want) / (want > 0 ? want : 1.0);
        if (!isfinite(sums[i]) || relative > worst) {
            worst = isfinite(sums[i]) ? relative : INFINITY;
            worst_name = t->name;
        }
        total += sums[i];
    }
    char line[256];
    snprintf(line, sizeof line,
             "%s: grad_square_sums of %d tensors against the host, worst %s "
             "at rel err %.3e (tolerance %.0e)",
             label, stage->tensor_count, worst_name, worst, TOL_DOUBLE_SUM);
    gpu_test_expect(tally, worst <= TOL_DOUBLE_SUM, line);
    double whole = 0.0;
    PT_CHECK(stage_grad_square_sum(stage, &whole, &err), &err);
    double relative = fabs(total - whole) / (whole > 0 ? whole : 1.0);
    snprintf(line, sizeof line,
             "%s: sum of grad_square_sums %.9g vs grad_square_sum %.9g, rel "
             "err %.3e (tolerance %.0e)",
             label, total, whole, relative, TOL_DOUBLE_SUM);
    gpu_test_expect(tally, whole > 0 && relative <= TOL_DOUBLE_SUM, line);
    free(grads), free(sums);
}

static void test_square_sums(gpu_test_tally *tally)
{
    pt_error err;
    /* several chunks per tensor: 2 layers of hidden 256, vocab 5000 */
    model_shape shape = tp_shape(false);
    shape.hidden = 256;
    shape.heads = 4;
    shape.ffn_hidden = 1024;
    shape.vocab = 5000;
    int mbs = 2;
    uint64_t state = 9;
    uint32_t *tokens = gpu_test_random_tokens(mbs * (shape.seq + 1), shape.vocab,
                                     &state);
    stage_spec spec = stage_spec_whole_model(&shape);
    model_stage stage;
    PT_CHECK(cuda_model_stage_create(&stage, &shape, &spec, mbs, 1, &err),
             &err);
    PT_CHECK(model_stage_init_parameters(&stage, 21, &err), &err);
    float loss = 0.0f;
    PT_CHECK(micro_batch_steps(&stage, tokens, 1, mbs, &loss, &err), &err);
    check_square_sums(tally, "unsplit stage", &stage);
    /* a pipeline stage with the head only: its lm_head is a tied copy,
     * left out of the norm share */
    model_shape tied = shape;
    tied.tied_embeddings = true;
    int partition[2] = {1, 1};
    stage_spec last;
    PT_CHECK(stage_spec_from_partition(&tied, partition, 2, 1, &last, &err),
             &err);
    model_stage head;
    PT_CHECK(cuda_model_stage_create(&head, &tied, &last, mbs, 1, &err),
             &err);
    PT_CHECK(model_stage_init_parameters(&head, 21, &err), &err);
    /* gradients to sum without a backward: write known values */
    float *values = gpu_test_host(head.param_count * sizeof *values);
    gpu_test_fill(values, head.param_count, 1.0f, 0.0f, &state);
    PT_CHECK(model_stage_write(&head, STAGE_GRADS, values, &err), &err);
    check_square_sums(tally, "last pipeline stage", &head);
    double share = 0.0, want = 0.0;
    PT_CHECK(stage_grad_norm_share(&head, &share, &err), &err);
    for (int i = 0; i < head.tensor_count; i++) {
        const param_tensor *t = &head.tensors[i];
        if (t->tied_copy)
            continue;
        for (size_t k = 0; k < t->count; k++)
            want += (double)values[t->offset + k] * values[t->offset + k];
    }
    char line[200];
    snprintf(line, sizeof line,
             "last pipeline stage: norm share %.9g leaves out the tied copy "
             "(host %.9g)",
             share, want);
    gpu_test_expect(tally, fabs(share - want) <= TOL_DOUBLE_SUM * want,
                    line);
    free(values), free(tokens);
    model_stage_destroy(&head);
    model_stage_destroy(&stage);
}

/* -------------------------------------------------------- 4. memory cap */

static void test_memory_cap(gpu_test_tally *tally)
{
    pt_error err;
    model_shape shape = tp_shape(true);
    stage_spec spec = stage_spec_whole_model(&shape);
    model_stage stage;
    PT_CHECK(cuda_model_stage_create(&stage, &shape, &spec, 2, 1, &err),
             &err);
    double bytes = (double)cuda_stage_device_bytes(&stage);
    model_stage_destroy(&stage);

    /* a cap of 1.5 stages: two stages one after the other fit only if
     * the first one's release gave its bytes back */
    PT_CHECK(cuda_rank_device_open(0, 0, 1.5 * bytes, &err), &err);
    bool fits = true;
    for (int round = 0; round < 2 && fits; round++) {
        fits = cuda_model_stage_create(&stage, &shape, &spec, 2, 1, &err) ==
               0;
        if (fits)
            model_stage_destroy(&stage);
        else
            printf("# round %d: %s\n", round, err.message);
    }
    char line[200];
    snprintf(line, sizeof line,
             "memory cap of %.1f MiB: a stage of %.1f MiB, released, fits "
             "again",
             1.5 * bytes / (1024.0 * 1024.0), bytes / (1024.0 * 1024.0));
    gpu_test_expect(tally, fits, line);
    cuda_rank_device_close();

    PT_CHECK(cuda_rank_device_open(0, 0, 0.5 * bytes, &err), &err);
    int status = cuda_model_stage_create(&stage, &shape, &spec, 2, 1, &err);
    if (status == 0)
        model_stage_destroy(&stage);
    else
        printf("# refused: %s\n", err.message);
    gpu_test_expect(tally,
                    status != 0 && strstr(err.message, "memory_limit_gib"),
                    "memory cap of half a stage: the stage is refused, "
                    "naming memory_limit_gib");
    cuda_rank_device_close();
}

/* ------------------------------------------ the vocab-parallel embedding */

static uint64_t embedding_rng = 0x9E3779B97F4A7C15ull;

/* The vocab-parallel lookup of two shards (rows 0..V/2 and the rest),
 * summed on the host, plus the positions by cuda_add_broadcast_rows,
 * against the whole lookup; then each shard's token gradient through its
 * range plan against its rows of the whole gradient. */
static void test_embedding_shards(gpu_test_tally *tally)
{
    int B = 2, T = 33, C = 64, V = 51;
    int N = B * T, tp = 2;
    size_t NC = (size_t)N * C;
    float *wte = gpu_test_random((size_t)V * C, 1.0f, 0.0f, &embedding_rng);
    float *wpe = gpu_test_random((size_t)T * C, 1.0f, 0.0f, &embedding_rng);
    uint32_t *tokens = gpu_test_host((size_t)N * sizeof *tokens);
    for (int i = 0; i < N; i++)
        tokens[i] = (uint32_t)(gpu_test_uniform(&embedding_rng) * V);
    float *want = gpu_test_host(NC * sizeof *want);
    cpu_embedding_forward(want, tokens, wte, wpe, B, T, C);
    float *grad_out = gpu_test_random(NC, 1.0f, 0.0f, &embedding_rng);
    float *want_wte = gpu_test_host((size_t)V * C * sizeof(float));
    float *want_wpe = gpu_test_host((size_t)T * C * sizeof(float));
    cpu_embedding_backward(want_wte, want_wpe, grad_out, tokens, B, T, C);

    uint32_t *d_tokens = gpu_test_device((size_t)N * sizeof *d_tokens);
    GPU_CHECK(cudaMemcpy(d_tokens, tokens, (size_t)N * sizeof *tokens,
                         cudaMemcpyHostToDevice));
    float *d_out = gpu_test_device(NC * sizeof(float));
    float *dev_grad_out = gpu_test_upload(grad_out, NC);
    float *sum = gpu_test_host(NC * sizeof *sum);
    float *part = gpu_test_host(NC * sizeof *part);
    embedding_plan plan = {
        .starts = gpu_test_host((size_t)(N + 1) * sizeof(int)),
        .rows = gpu_test_host((size_t)N * sizeof(int)),
        .tokens = gpu_test_host((size_t)N * sizeof(uint32_t)),
    };
    void *counts = calloc(1, embedding_plan_scratch_bytes(V));
    int *d_starts = gpu_test_device((size_t)(N + 1) * sizeof(int));
    int *d_rows = gpu_test_device((size_t)N * sizeof(int));
    uint32_t *d_group_tokens = gpu_test_device((size_t)N * sizeof(uint32_t));
    float *got_wte = gpu_test_host((size_t)V * C * sizeof(float));
    for (int t = 0; t < tp; t++) {
        int first = 0, count = 0;
        stage_vocab_shard(V, tp, t, &first, &count);
        float *d_shard = gpu_test_upload(wte + (size_t)first * C,
                                         (size_t)count * C);
        GPU_CHECK(cuda_embedding_shard_forward(d_out, d_tokens, d_shard,
                                               first, count, N, C, 0));
        gpu_test_download(part, d_out, NC);
        for (size_t i = 0; i < NC; i++)
            sum[i] = t == 0 ? part[i] : sum[i] + part[i];

        /* the shard's token gradient from zero, through its range plan */
        GPU_CHECK(cudaMemset(d_shard, 0, (size_t)count * C * sizeof(float)));
        embedding_plan_build_range(&plan, tokens, N, first, count, counts);
        gpu_test_upload_embedding_plan(&plan, N, d_starts, d_rows,
                                       d_group_tokens);
        GPU_CHECK(cuda_embedding_backward(cuda_grad_fp32(d_shard),
                                          cuda_grad_fp32(NULL), dev_grad_out,
                                          d_starts, d_rows, d_group_tokens,
                                          plan.unique_tokens, B, T, C, 0));
        gpu_test_download(got_wte + (size_t)first * C, d_shard,
                          (size_t)count * C);
        cudaFree(d_shard);
    }
    float *d_sum = gpu_test_upload(sum, NC);
    float *d_wpe = gpu_test_upload(wpe, (size_t)T * C);
    GPU_CHECK(cuda_add_broadcast_rows(d_sum, d_wpe, T, NULL, N, C, 0));
    float *got = gpu_test_host(NC * sizeof *got);
    gpu_test_download(got, d_sum, NC);
    gpu_test_compare(tally, "embedding shards summed + positions", got, want,
                     NC, 1e-7);
    gpu_test_compare(tally, "embedding shards' token gradients", got_wte,
                     want_wte, (size_t)V * C, 1e-6);

    /* a bias and a residual, the row-parallel layers' epilogue */
    float *out = gpu_test_random(NC, 1.0f, 0.0f, &embedding_rng);
    float *bias = gpu_test_random((size_t)C, 1.0f, 0.0f, &embedding_rng);
    float *residual = gpu_test_random(NC, 1.0f, 0.0f, &embedding_rng);
    float *d_target = gpu_test_upload(out, NC);
    float *d_bias = gpu_test_upload(bias, (size_t)C);
    float *d_residual = gpu_test_upload(residual, NC);
    for (size_t i = 0; i < NC; i++)
        out[i] += bias[i % (size_t)C] + residual[i];
    GPU_CHECK(cuda_add_broadcast_rows(d_target, d_bias, 1, d_residual, N, C,
                                      0));
    gpu_test_download(got, d_target, NC);
    gpu_test_compare(tally, "add bias and residual", got, out, NC, 1e-7);

    free(wte), free(wpe), free(tokens), free(want), free(grad_out);
    free(want_wte), free(want_wpe), free(sum), free(part), free(got);
    free(plan.starts), free(plan.rows), free(plan.tokens), free(counts);
    free(got_wte), free(out), free(bias), free(residual);
    cudaFree(d_tokens), cudaFree(d_out), cudaFree(dev_grad_out);
    cudaFree(d_starts), cudaFree(d_rows), cudaFree(d_group_tokens);
    cudaFree(d_sum), cudaFree(d_wpe), cudaFree(d_target), cudaFree(d_bias);
    cudaFree(d_residual);
}

int main(void)
{
    gpu_test_require_device("test_cuda_tensor_parallel");
    /* the checks compare bits between runs: cuDNN's deterministic
     * attention backward (the default sums dQ with atomics) */
    setenv("PARTITA_CUDA_DETERMINISTIC", "1", 1);
    gpu_test_tally tally = {0, 0};
    test_tensor_parallel_pair(&tally, true, false, false, false);
    test_tensor_parallel_pair(&tally, false, false, false, false);
    test_tensor_parallel_pair(&tally, true, true, false, false);
    test_tensor_parallel_pair(&tally, false, true, false, false);
    test_tensor_parallel_pair(&tally, true, true, true, false);
    test_tensor_parallel_pair(&tally, false, false, true, false);
    /* the Llama layer (issue 35): both comms, with and without sequence
     * parallelism */
    test_tensor_parallel_pair(&tally, false, false, false, true);
    test_tensor_parallel_pair(&tally, false, true, false, true);
    test_tensor_parallel_pair(&tally, false, true, true, true);
    test_tensor_parallel_pair(&tally, false, false, true, true);
    test_compute_only(&tally);
    test_square_sums(&tally);
    test_memory_cap(&tally);
    test_embedding_shards(&tally);
    return gpu_test_finish(&tally, "test_cuda_tensor_parallel");
}
