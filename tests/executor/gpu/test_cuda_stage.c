/*
 * Whole stages of the cuda backend against the cpu backend, same
 * parameters and tokens:
 *   1. GPT-2 124M (models/gpt2-124m.json; a shorter sequence, default
 *      128, keeps the cpu reference to about a minute): loss, every
 *      parameter's gradient, the gradient norm, then one AdamW step;
 *   2. a small model split into three pipeline stages (embedding and
 *      tied head on different stages, two micro-batches in flight in two
 *      activation slots, gradients received in stage_output_grad_buffer)
 *      against the whole model on the cpu;
 *   3. the backend's variants (epilogues off, the residual adds in the
 *      products' epilogues instead of the norms after them, nothing or
 *      everything recomputed, untied head, the fused head's logits in
 *      chunks of 40 of the 288 rows, a vocabulary of 4,000 whose head
 *      chunk holds the backward's stream-wide buffers) on a small model;
 *   4. full activation recompute (a plan's "recompute": "full") against
 *      keeping every activation, three micro-batches in flight: the same
 *      loss and gradients, less device memory;
 *   and for the stages of 3 and 4 the tally of device memory by term
 *   against the memory plan computed without the GPU.
 *
 * Usage: test_cuda_stage [model.json [seq [mbs]]]
 * The cpu reference rounds its residual stream to bf16 where the cuda
 * backend stores it (spec.bf16_residual).
 * Tolerances: the cuda backend runs its products in bf16, so gradients
 * are held to 3e-2 relative L2 per tensor (1e-2 was measured on
 * an H100) and the loss to 5e-3.
 */
#include "gpu_test.h"

#include "executor/cuda/buffers.h"
#include "executor/executor.h"

#define TOL_LOSS 5e-3
#define TOL_GRAD 3e-2
#define TOL_PARAM 1e-5
#define TOL_RECOMPUTE 1e-6

/* Zero grads; forward and backward of `micro_batches` micro-batches,
 * loss_scale 1 / micro_batches; returns the mean loss. One after the
 * other in slot 0, or (in_flight) every forward into slots 0, 1, ...
 * before the backwards in order, as 1F1B keeps several in flight. */
static float run_micro_batches_as(model_stage *stage, const uint32_t *tokens,
                                  int micro_batches, int mbs, bool in_flight)
{
    pt_error err;
    PT_CHECK(stage_zero_grads(stage, &err), &err);
    double loss_sum = 0.0;
    size_t window = (size_t)stage->shape.seq + 1;
    for (int step = 0; step < 2 * micro_batches; step++) {
        int m = in_flight ? step % micro_batches : step / 2;
        bool forward = in_flight ? step < micro_batches : step % 2 == 0;
        int slot = in_flight ? m : 0;
        stage_io io = {
            .mbs = mbs,
            .tokens = tokens + (size_t)m * mbs * window,
            .loss_scale = 1.0f / (float)micro_batches,
        };
        float loss = 0.0f;
        if (forward)
            PT_CHECK(stage_forward(stage, slot, &io, &loss, &err), &err);
        else
            PT_CHECK(stage_backward(stage, slot, &io, &err), &err);
        loss_sum += loss;
    }
    return (float)(loss_sum / micro_batches);
}

static float run_micro_batches(model_stage *stage, const uint32_t *tokens,
                               int micro_batches, int mbs)
{
    return run_micro_batches_as(stage, tokens, micro_batches, mbs, false);
}

/* Every tensor's values in `got` (of stage `got_stage`) against the
 * tensor of the same name in `want` (a tied copy of the embedding
 * against the token embedding). Prints every tensor when verbose, else
 * the failures, then one summary check. Returns the number of failures. */
static int compare_tensors(gpu_test_tally *tally, const char *label,
                           const model_stage *got_stage, const float *got,
                           const model_stage *want_stage, const float *want,
                           double tolerance, bool verbose)
{
    int failures = 0;
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < got_stage->tensor_count; i++) {
        const param_tensor *t = &got_stage->tensors[i];
        const char *name = t->tied_copy ? "token_embedding" : t->name;
        const param_tensor *w = model_stage_find_tensor(want_stage, name);
        if (w == NULL || w->count != t->count) {
            printf("FAIL %s: tensor %s has no counterpart\n", label, t->name);
            tally->failed++;
            failures++;
            continue;
        }
        const float *g = got + t->offset;
        const float *r = want + w->offset;
        double diff = 0.0, norm = 0.0;
        bool finite = true;
        for (size_t k = 0; k < t->count; k++) {
            if (!isfinite(g[k]))
                finite = false;
            diff += ((double)g[k] - r[k]) * ((double)g[k] - r[k]);
            norm += (double)r[k] * r[k];
        }
        double relative = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        bool pass = finite && relative <= tolerance;
        if (relative > worst || !finite) {
            worst = finite ? relative : INFINITY;
            worst_name = t->name;
        }
        if (verbose || !pass)
            printf("%s %s %-36s rel L2 err %.3e (tolerance %.1e)%s\n",
                   pass ? "PASS" : "FAIL", label, t->name, relative,
                   tolerance, finite ? "" : " NON-FINITE");
        if (!pass)
            failures++;
    }
    char line[256];
    snprintf(line, sizeof line,
             "%s: %d tensors, worst %s at rel L2 err %.3e (tolerance %.1e)",
             label, got_stage->tensor_count, worst_name, worst, tolerance);
    gpu_test_expect(tally, failures == 0, line);
    return failures;
}

static void compare_value(gpu_test_tally *tally, const char *name, double got,
                          double want, double tolerance)
{
    float g = (float)got, w = (float)want;
    gpu_test_compare(tally, name, &g, &w, 1, tolerance);
}

/* ------------------------------------------------ 1. GPT-2 124M step */

static void test_gpt2_step(gpu_test_tally *tally, const char *path, int seq,
                           int mbs)
{
    pt_error err;
    model_shape shape;
    PT_CHECK(model_load_file(path, &shape, &err), &err);
    shape.seq = seq;
    printf("# %s: %d layers, hidden %d, %d heads, vocab %d; seq %d, mbs %d\n",
           shape.name, shape.layers, shape.hidden, shape.heads, shape.vocab,
           seq, mbs);
    stage_spec spec = stage_spec_whole_model(&shape);
    spec.bf16_residual = true; /* the cpu's stream rounded as cuda's */
    model_stage cpu, gpu;
    PT_CHECK(model_stage_create(&cpu, &shape, &spec, BACKEND_CPU, mbs, 1,
                                &err),
             &err);
    PT_CHECK(cuda_model_stage_create(&gpu, &shape, &spec, mbs, 1, &err),
             &err);
    printf("# attention: %s\n", cuda_stage_attention(&gpu));
    PT_CHECK(model_stage_init_parameters(&cpu, 1234, &err), &err);
    PT_CHECK(model_stage_init_parameters(&gpu, 1234, &err), &err);
    uint64_t state = 42;
    uint32_t *tokens = gpu_test_random_tokens(mbs * (seq + 1), shape.vocab, &state);

    float cpu_loss = run_micro_batches(&cpu, tokens, 1, mbs);
    float gpu_loss = run_micro_batches(&gpu, tokens, 1, mbs);
    printf("# loss: cpu %.6f, cuda %.6f nats/token\n", cpu_loss, gpu_loss);
    compare_value(tally, "gpt2 loss", gpu_loss, cpu_loss, TOL_LOSS);
    float *cpu_grads = gpu_test_read_buffer(&cpu, STAGE_GRADS);
    float *gpu_grads = gpu_test_read_buffer(&gpu, STAGE_GRADS);
    compare_tensors(tally, "gpt2 grad", &gpu, gpu_grads, &cpu, cpu_grads,
                    TOL_GRAD, true);
    double cpu_square = 0.0, gpu_square = 0.0;
    PT_CHECK(stage_grad_square_sum(&cpu, &cpu_square, &err), &err);
    PT_CHECK(stage_grad_square_sum(&gpu, &gpu_square, &err), &err);
    printf("# gradient norm: cpu %.6f, cuda %.6f\n", sqrt(cpu_square),
           sqrt(gpu_square));
    compare_value(tally, "gpt2 gradient norm", sqrt(gpu_square),
                  sqrt(cpu_square), 2e-2);

    /* AdamW on the same gradients (the cpu's), so that the comparison
     * holds the optimizer alone: Adam turns a gradient's sign into a
     * step of about the learning rate, so tiny gradients that differ in
     * bf16 would otherwise make the updated parameters differ a lot */
    PT_CHECK(model_stage_write(&gpu, STAGE_GRADS, cpu_grads, &err), &err);
    adamw_config config = adamw_defaults();
    for (int step = 0; step < 2; step++) {
        PT_CHECK(stage_adamw_step(&cpu, &config, 6e-4f, 0.5f, &err), &err);
        PT_CHECK(stage_adamw_step(&gpu, &config, 6e-4f, 0.5f, &err), &err);
    }
    float *cpu_params = gpu_test_read_buffer(&cpu, STAGE_PARAMS);
    float *gpu_params = gpu_test_read_buffer(&gpu, STAGE_PARAMS);
    compare_tensors(tally, "gpt2 params after 2 AdamW steps", &gpu,
                    gpu_params, &cpu, cpu_params, TOL_PARAM, false);
    float *cpu_moment = gpu_test_read_buffer(&cpu, STAGE_ADAM_V);
    float *gpu_moment = gpu_test_read_buffer(&gpu, STAGE_ADAM_V);
    compare_tensors(tally, "gpt2 AdamW second moments", &gpu, gpu_moment,
                    &cpu, cpu_moment, TOL_PARAM, false);
    free(cpu_moment), free(gpu_moment);
    printf("# cuda stage holds %.2f GiB of device memory\n",
           (double)cuda_stage_device_bytes(&gpu) / PT_GIB);
    free(tokens), free(cpu_grads), free(gpu_grads), free(cpu_params);
    free(gpu_params);
    model_stage_destroy(&cpu);
    model_stage_destroy(&gpu);
}

/* ------------------------------------------------- 2. pipeline split */

static model_shape small_shape(void)
{
    model_shape shape;
    memset(&shape, 0, sizeof shape);
    snprintf(shape.name, sizeof shape.name, "small-test");
    shape.layers = 4;
    shape.hidden = 128;
    shape.heads = 2;       /* head size 64: the tensor-core kernels */
    shape.ffn_hidden = 512;
    shape.seq = 96;        /* one and a half attention tiles */
    shape.vocab = 1000;
    shape.tied_embeddings = true;
    return shape;
}

static void test_pipeline_split(gpu_test_tally *tally)
{
    pt_error err;
    model_shape shape = small_shape();
    int mbs = 2, micro_batches = 2;
    int partition[3] = {1, 2, 1};
    stage_spec whole = stage_spec_whole_model(&shape);
    whole.bf16_residual = true; /* the cpu's stream rounded as cuda's */
    model_stage cpu;
    PT_CHECK(model_stage_create(&cpu, &shape, &whole, BACKEND_CPU, mbs, 1,
                                &err),
             &err);
    PT_CHECK(model_stage_init_parameters(&cpu, 7, &err), &err);
    model_stage stages[3];
    for (int s = 0; s < 3; s++) {
        stage_spec spec;
        PT_CHECK(stage_spec_from_partition(&shape, partition, 3, s, &spec,
                                           &err),
                 &err);
        PT_CHECK(cuda_model_stage_create(&stages[s], &shape, &spec, mbs,
                                         micro_batches, &err),
                 &err);
        PT_CHECK(model_stage_init_parameters(&stages[s], 7, &err), &err);
        PT_CHECK(stage_zero_grads(&stages[s], &err), &err);
    }
    uint64_t state = 99;
    size_t window = (size_t)shape.seq + 1;
    uint32_t *tokens =
        gpu_test_random_tokens(micro_batches * mbs * (int)window, shape.vocab, &state);
    float cpu_losses[2];
    PT_CHECK(stage_zero_grads(&cpu, &err), &err);
    for (int m = 0; m < micro_batches; m++) {
        stage_io io = {.mbs = mbs, .tokens = tokens + m * mbs * window,
                       .loss_scale = 0.5f};
        PT_CHECK(stage_forward(&cpu, 0, &io, &cpu_losses[m], &err), &err);
        PT_CHECK(stage_backward(&cpu, 0, &io, &err), &err);
    }
    /* both forwards first, in two slots, then both backwards */
    float gpu_losses[2];
    for (int m = 0; m < micro_batches; m++) {
        const float *activation = NULL;
        for (int s = 0; s < 3; s++) {
            stage_io io = {.mbs = mbs, .tokens = tokens + m * mbs * window,
                           .input = activation, .loss_scale = 0.5f};
            PT_CHECK(stage_forward(&stages[s], m, &io, &gpu_losses[m], &err),
                     &err);
            activation = stage_output(&stages[s], m);
        }
    }
    /* gradients travel as the runtime moves them: into the receiving
     * stage's stage_output_grad_buffer */
    size_t activation_bytes =
        (size_t)mbs * (size_t)shape.seq * (size_t)shape.hidden * sizeof(float);
    gpu_test_expect(tally,
                    stage_output_grad_buffer(&stages[2]) == NULL &&
                        stage_output_grad_buffer(&stages[0]) != NULL &&
                        stage_output_grad_buffer(&stages[1]) != NULL,
                    "pipeline: stages without the head have an output "
                    "gradient buffer, the head's stage none");
    for (int m = 0; m < micro_batches; m++) {
        const float *gradient = NULL;
        for (int s = 2; s >= 0; s--) {
            float *received = NULL;
            if (gradient != NULL) {
                received = stage_output_grad_buffer(&stages[s]);
                GPU_CHECK(cudaMemcpy(received, gradient, activation_bytes,
                                     cudaMemcpyDeviceToDevice));
            }
            stage_io io = {.mbs = mbs, .tokens = tokens + m * mbs * window,
                           .output_grad = received, .loss_scale = 0.5f};
            PT_CHECK(stage_backward(&stages[s], m, &io, &err), &err);
            gradient = stage_input_grad(&stages[s]);
        }
    }
    for (int m = 0; m < micro_batches; m++) {
        char name[64];
        snprintf(name, sizeof name, "pipeline loss of micro-batch %d", m);
        compare_value(tally, name, gpu_losses[m], cpu_losses[m], TOL_LOSS);
    }
    /* the embedding all-reduce: the head's tied copy joins stage 0 */
    float *first = gpu_test_read_buffer(&stages[0], STAGE_GRADS);
    float *last = gpu_test_read_buffer(&stages[2], STAGE_GRADS);
    const param_tensor *embedding =
        model_stage_find_tensor(&stages[0], "token_embedding");
    const param_tensor *copy =
        model_stage_find_tensor(&stages[2], "lm_head_weight");
    gpu_test_expect(tally, embedding != NULL && copy != NULL && copy->tied_copy,
                    "pipeline: the last stage holds a tied copy of the "
                    "token embedding");
    if (embedding != NULL && copy != NULL) {
        for (size_t k = 0; k < embedding->count; k++) {
            float sum = first[embedding->offset + k] + last[copy->offset + k];
            first[embedding->offset + k] = sum;
            last[copy->offset + k] = sum;
        }
    }
    float *cpu_grads = gpu_test_read_buffer(&cpu, STAGE_GRADS);
    float *buffers[3] = {first, last, NULL};
    for (int s = 0; s < 3; s++) {
        float *grads = s == 0 ? buffers[0]
                     : s == 2 ? buffers[1]
                              : gpu_test_read_buffer(&stages[s], STAGE_GRADS);
        char label[64];
        snprintf(label, sizeof label, "pipeline stage %d grad", s);
        compare_tensors(tally, label, &stages[s], grads, &cpu, cpu_grads,
                        TOL_GRAD, false);
        if (s == 1)
            free(grads);
    }
    free(first), free(last), free(cpu_grads), free(tokens);
    for (int s = 0; s < 3; s++)
        model_stage_destroy(&stages[s]);
    model_stage_destroy(&cpu);
}

/* ------------------------------------------------------- 3. variants */

/* One variant of the backend on the small model against the cpu: loss,
 * gradients, and the stage's tally of its allocations, term by term,
 * against the memory plan computed without the GPU (executor/cuda/
 * buffers.c) for the same shape, slots and PARTITA_CUDA_RECOMPUTE: what
 * the cost model's formulas are tested against on the cpu
 * (tests/costmodel/test_memory.c). vocab > 0: that vocabulary instead,
 * and a check that the head's chunk holds the backward's stream-wide
 * buffers (buffer_layout.head_shared_offset). */
static void test_variant(gpu_test_tally *tally, const char *label,
                         const char *recompute, const char *fuse,
                         const char *head_rows, bool tied, int vocab)
{
    pt_error err;
    model_shape shape = small_shape();
    shape.tied_embeddings = tied;
    if (vocab > 0)
        shape.vocab = vocab;
    int mbs = 3, micro_batches = 2;
    if (recompute != NULL)
        setenv("PARTITA_CUDA_RECOMPUTE", recompute, 1);
    if (fuse != NULL)
        setenv("PARTITA_CUDA_FUSE", fuse, 1);
    if (head_rows != NULL)
        setenv("PARTITA_CUDA_HEAD_ROWS", head_rows, 1);
    stage_spec spec = stage_spec_whole_model(&shape);
    spec.bf16_residual = true; /* the cpu's stream rounded as cuda's */
    model_stage cpu, gpu;
    PT_CHECK(model_stage_create(&cpu, &shape, &spec, BACKEND_CPU, mbs, 1,
                                &err),
             &err);
    PT_CHECK(cuda_model_stage_create(&gpu, &shape, &spec, mbs, 1, &err),
             &err);
    gpu_test_compare_memory(tally, label, &gpu, recompute);
    if (vocab > 0)
        gpu_test_expect_head_shared(tally, label, &gpu);
    /* what the profiler records with the head's times (head.fused) */
    char fused_name[160];
    snprintf(fused_name, sizeof fused_name, "%s: head_fused is "
             "buffer_head_fused's, false on the cpu", label);
    gpu_test_expect(tally, gpu.head_fused ==
                               buffer_head_fused(&shape, &spec) &&
                           gpu.head_fused && !cpu.head_fused,
                    fused_name);
    unsetenv("PARTITA_CUDA_RECOMPUTE");
    unsetenv("PARTITA_CUDA_FUSE");
    unsetenv("PARTITA_CUDA_HEAD_ROWS");
    PT_CHECK(model_stage_init_parameters(&cpu, 11, &err), &err);
    PT_CHECK(model_stage_init_parameters(&gpu, 11, &err), &err);
    uint64_t state = 5;
    uint32_t *tokens = gpu_test_random_tokens(micro_batches * mbs * (shape.seq + 1),
                                     shape.vocab, &state);
    float cpu_loss = run_micro_batches(&cpu, tokens, micro_batches, mbs);
    float gpu_loss = run_micro_batches(&gpu, tokens, micro_batches, mbs);
    char name[128];
    snprintf(name, sizeof name, "%s: loss", label);
    compare_value(tally, name, gpu_loss, cpu_loss, TOL_LOSS);
    float *cpu_grads = gpu_test_read_buffer(&cpu, STAGE_GRADS);
    float *gpu_grads = gpu_test_read_buffer(&gpu, STAGE_GRADS);
    snprintf(name, sizeof name, "%s: grad", label);
    compare_tensors(tally, name, &gpu, gpu_grads, &cpu, cpu_grads, TOL_GRAD,
                    false);
    free(tokens), free(cpu_grads), free(gpu_grads);
    model_stage_destroy(&cpu);
    model_stage_destroy(&gpu);
}

/* -------------------------------------------- 4. full recompute */

/* A plan's "recompute": "full" keeps each layer's input only and runs
 * the layer's forward again before its backward: the same kernels, so
 * the same loss and gradients as keeping everything (within
 * TOL_RECOMPUTE, room for a kernel that sums in a run-dependent order),
 * with less device memory for three micro-batches in flight. */
static void test_full_recompute(gpu_test_tally *tally)
{
    pt_error err;
    model_shape shape = small_shape();
    int mbs = 2, micro_batches = 3;
    stage_spec keep_spec = stage_spec_whole_model(&shape);
    stage_spec recompute_spec = keep_spec;
    recompute_spec.recompute_layers = true;
    model_stage keep, recompute;
    PT_CHECK(cuda_model_stage_create(&keep, &shape, &keep_spec, mbs,
                                     micro_batches, &err),
             &err);
    PT_CHECK(cuda_model_stage_create(&recompute, &shape, &recompute_spec, mbs,
                                     micro_batches, &err),
             &err);
    gpu_test_compare_memory(tally, "kept activations", &keep, NULL);
    gpu_test_compare_memory(tally, "full recompute", &recompute, NULL);
    PT_CHECK(model_stage_init_parameters(&keep, 11, &err), &err);
    PT_CHECK(model_stage_init_parameters(&recompute, 11, &err), &err);
    uint64_t state = 9;
    uint32_t *tokens = gpu_test_random_tokens(micro_batches * mbs * (shape.seq + 1),
                                     shape.vocab, &state);
    float kept_loss =
        run_micro_batches_as(&keep, tokens, micro_batches, mbs, true);
    float recomputed_loss =
        run_micro_batches_as(&recompute, tokens, micro_batches, mbs, true);
    compare_value(tally, "full recompute: loss", recomputed_loss, kept_loss,
                  TOL_RECOMPUTE);
    float *kept_grads = gpu_test_read_buffer(&keep, STAGE_GRADS);
    float *recomputed_grads = gpu_test_read_buffer(&recompute, STAGE_GRADS);
    compare_tensors(tally, "full recompute: grad", &recompute,
                    recomputed_grads, &keep, kept_grads, TOL_RECOMPUTE,
                    false);
    size_t kept_bytes = cuda_stage_device_bytes(&keep);
    size_t recomputed_bytes = cuda_stage_device_bytes(&recompute);
    char line[160];
    snprintf(line, sizeof line,
             "full recompute: device memory %.1f MiB against %.1f MiB kept",
             (double)recomputed_bytes / 1048576.0,
             (double)kept_bytes / 1048576.0);
    gpu_test_expect(tally, recomputed_bytes < kept_bytes, line);
    free(tokens), free(kept_grads), free(recomputed_grads);
    model_stage_destroy(&keep);
    model_stage_destroy(&recompute);
}

/* ------------------------------------ 5. deferred synchronisation */

/* The profiler's back-to-back timing queues calls without waiting
 * (defer_sync) and waits once (stage_synchronize): the same gradients as
 * synchronous calls, and no loss read back. */
static void test_deferred_sync(gpu_test_tally *tally)
{
    pt_error err;
    model_shape shape = small_shape();
    int mbs = 2;
    stage_spec spec = stage_spec_whole_model(&shape);
    model_stage synced, deferred;
    PT_CHECK(cuda_model_stage_create(&synced, &shape, &spec, mbs, 1, &err),
             &err);
    PT_CHECK(cuda_model_stage_create(&deferred, &shape, &spec, mbs, 1, &err),
             &err);
    PT_CHECK(model_stage_init_parameters(&synced, 11, &err), &err);
    PT_CHECK(model_stage_init_parameters(&deferred, 11, &err), &err);
    uint64_t state = 13;
    uint32_t *tokens = gpu_test_random_tokens(mbs * (shape.seq + 1),
                                              shape.vocab, &state);
    stage_io io = {.mbs = mbs, .tokens = tokens, .loss_scale = 1.0f};
    float loss = -1.0f, deferred_loss = -1.0f;
    deferred.defer_sync = true;
    PT_CHECK(stage_zero_grads(&synced, &err), &err);
    PT_CHECK(stage_zero_grads(&deferred, &err), &err);
    for (int i = 0; i < 3; i++) {
        PT_CHECK(stage_forward(&synced, 0, &io, &loss, &err), &err);
        PT_CHECK(stage_backward(&synced, 0, &io, &err), &err);
        PT_CHECK(stage_forward(&deferred, 0, &io, &deferred_loss, &err),
                 &err);
        PT_CHECK(stage_backward(&deferred, 0, &io, &err), &err);
    }
    PT_CHECK(stage_synchronize(&deferred, &err), &err);
    gpu_test_expect(tally, deferred_loss == 0.0f && loss > 0.0f,
                    "deferred sync: no loss read back (the synchronous "
                    "stage's is positive)");
    float *synced_grads = gpu_test_read_buffer(&synced, STAGE_GRADS);
    float *deferred_grads = gpu_test_read_buffer(&deferred, STAGE_GRADS);
    compare_tensors(tally, "deferred sync: grads of 3 queued steps",
                    &deferred, deferred_grads, &synced, synced_grads,
                    TOL_RECOMPUTE, false);
    free(tokens), free(synced_grads), free(deferred_grads);
    model_stage_destroy(&synced);
    model_stage_destroy(&deferred);
}

int main(int argc, char **argv)
{
    gpu_test_require_device("test_cuda_stage");
    gpu_test_tally tally = {0, 0};
    char path[PT_PATH_MAX];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        const char *root = getenv("PARTITA_SOURCE");
        snprintf(path, sizeof path, "%s/models/gpt2-124m.json",
                 root != NULL ? root : PARTITA_SOURCE_ROOT);
    }
    int seq = argc > 2 ? atoi(argv[2]) : 128;
    int mbs = argc > 3 ? atoi(argv[3]) : 2;
    test_variant(&tally, "default options", NULL, NULL, NULL, true, 0);
    test_variant(&tally, "epilogues off", NULL, "0", NULL, true, 0);
    /* the residual adds back in the projections' epilogues (beta = 1) */
    setenv("PARTITA_CUDA_RESIDUAL_IN_NORM", "0", 1);
    test_variant(&tally, "residual adds in the epilogues", NULL, NULL, NULL,
                 true, 0);
    unsetenv("PARTITA_CUDA_RESIDUAL_IN_NORM");
    test_variant(&tally, "recompute none", "none", NULL, NULL, true, 0);
    test_variant(&tally, "recompute all", "all", NULL, NULL, true, 0);
    test_variant(&tally, "untied head", NULL, NULL, NULL, false, 0);
    test_variant(&tally, "head in chunks of 40 rows", NULL, NULL, "40",
                 true, 0);
    test_variant(&tally, "untied head in chunks of 40 rows", "none", NULL,
                 "40", false, 0);
    /* a vocabulary whose head chunk (288 rows of 4,096) holds the fc
     * gradient and the backward's stream-wide buffers behind it */
    test_variant(&tally, "backward buffers in the head's chunk", NULL, NULL,
                 NULL, true, 4000);
    test_pipeline_split(&tally);
    test_full_recompute(&tally);
    test_deferred_sync(&tally);
    test_gpt2_step(&tally, path, seq, mbs);
    return gpu_test_finish(&tally, "test_cuda_stage");
}
