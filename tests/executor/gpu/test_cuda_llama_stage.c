/*
 * Whole stages of the Llama family on the cuda backend against the cpu
 * backend, same parameters and tokens (issue 35 item 3): the tiny Llama
 * of tests/data/models/llama-tiny.json (RMSNorm, SwiGLU, rotary
 * positions, 4 query heads over 2 key/value heads, no biases, an untied
 * head), two micro-batches of 3 sequences:
 *   1. the default options, nothing recomputed, everything recomputed,
 *      full layer recompute (a plan's "recompute": "full");
 *   2. its kin: Qwen's qkv biases, a tied head, multi-head attention
 *      (kv_heads = heads), GPT-2's LayerNorm and GELU under rotary
 *      positions and grouped-query attention, and a vocabulary of 1,000
 *      whose fused head's chunk holds the backward's stream-wide buffers
 *      (kept and fully recomputed layers);
 *   each: the loss, every parameter's gradient, and the device memory
 *   tallied by term against the memory plan computed without the GPU.
 *
 * Usage: test_cuda_llama_stage
 * The cpu reference rounds its residual stream to bf16 where the cuda
 * backend stores it (spec.bf16_residual). Tolerances: test_cuda_stage's
 * (bf16 products): loss 5e-3, gradients 3e-2 relative L2 per tensor.
 */
#include "gpu_test.h"

#include "executor/cuda/buffers.h"
#include "executor/executor.h"

#define TOL_LOSS 5e-3
#define TOL_GRAD 3e-2

/* Zero grads; forward then backward of each micro-batch in slot 0,
 * loss_scale 1 / micro_batches; the mean loss. */
static float run_micro_batches(model_stage *stage, const uint32_t *tokens,
                               int micro_batches, int mbs)
{
    pt_error err;
    PT_CHECK(stage_zero_grads(stage, &err), &err);
    double loss_sum = 0.0;
    size_t window = (size_t)stage->shape.seq + 1;
    for (int m = 0; m < micro_batches; m++) {
        stage_io io = {
            .mbs = mbs,
            .tokens = tokens + (size_t)m * mbs * window,
            .loss_scale = 1.0f / (float)micro_batches,
        };
        float loss = 0.0f;
        PT_CHECK(stage_forward(stage, 0, &io, &loss, &err), &err);
        PT_CHECK(stage_backward(stage, 0, &io, &err), &err);
        loss_sum += loss;
    }
    return (float)(loss_sum / micro_batches);
}

/* Every gradient of `gpu` against the cpu's tensor of the same name;
 * one summary check, and a line for each tensor out of tolerance. */
static void compare_grads(gpu_test_tally *tally, const char *label,
                          const model_stage *gpu, const float *got,
                          const model_stage *cpu, const float *want)
{
    int failures = 0;
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < gpu->tensor_count; i++) {
        const param_tensor *t = &gpu->tensors[i];
        const param_tensor *w = model_stage_find_tensor(cpu, t->name);
        if (w == NULL || w->count != t->count) {
            printf("FAIL %s: tensor %s has no counterpart\n", label, t->name);
            failures++;
            continue;
        }
        double diff = 0.0, norm = 0.0;
        bool finite = true;
        for (size_t k = 0; k < t->count; k++) {
            double g = got[t->offset + k], r = want[w->offset + k];
            finite = finite && isfinite(g);
            diff += (g - r) * (g - r);
            norm += r * r;
        }
        double relative = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        if (!finite)
            relative = INFINITY;
        if (relative > worst) {
            worst = relative;
            worst_name = t->name;
        }
        if (!(relative <= TOL_GRAD)) {
            printf("FAIL %s %-36s rel L2 err %.3e (tolerance %.1e)\n", label,
                   t->name, relative, TOL_GRAD);
            failures++;
        }
    }
    char line[256];
    snprintf(line, sizeof line,
             "%s: %d gradients, worst %s at rel L2 err %.3e (tolerance "
             "%.1e)",
             label, gpu->tensor_count, worst_name, worst, TOL_GRAD);
    gpu_test_expect(tally, failures == 0, line);
}

static model_shape llama_tiny(void)
{
    pt_error err;
    model_shape shape;
    char path[PT_PATH_MAX];
    const char *root = getenv("PARTITA_SOURCE");
    snprintf(path, sizeof path, "%s/tests/data/models/llama-tiny.json",
             root != NULL ? root : PARTITA_SOURCE_ROOT);
    PT_CHECK(model_load_file(path, &shape, &err), &err);
    return shape;
}

/* One whole-model stage of `shape` on both backends: loss, gradients,
 * memory. recompute: PARTITA_CUDA_RECOMPUTE (NULL: the default);
 * full: spec.recompute_layers; head_shared: also a check that the head's
 * chunk holds the backward's stream-wide buffers. */
static void test_variant(gpu_test_tally *tally, const char *label,
                         const model_shape *shape, const char *recompute,
                         bool full, bool head_shared)
{
    pt_error err;
    int mbs = 3, micro_batches = 2;
    if (recompute != NULL)
        setenv("PARTITA_CUDA_RECOMPUTE", recompute, 1);
    stage_spec spec = stage_spec_whole_model(shape);
    spec.bf16_residual = true; /* the cpu's stream rounded as cuda's */
    spec.recompute_layers = full;
    model_stage cpu, gpu;
    PT_CHECK(model_stage_create(&cpu, shape, &spec, BACKEND_CPU, mbs, 1,
                                &err),
             &err);
    PT_CHECK(cuda_model_stage_create(&gpu, shape, &spec, mbs, 1, &err),
             &err);
    printf("# %s: attention %s\n", label, cuda_stage_attention(&gpu));
    gpu_test_compare_memory(tally, label, &gpu, recompute);
    if (head_shared)
        gpu_test_expect_head_shared(tally, label, &gpu);
    unsetenv("PARTITA_CUDA_RECOMPUTE");
    PT_CHECK(model_stage_init_parameters(&cpu, 11, &err), &err);
    PT_CHECK(model_stage_init_parameters(&gpu, 11, &err), &err);
    uint64_t state = 5;
    uint32_t *tokens = gpu_test_random_tokens(
        micro_batches * mbs * (shape->seq + 1), shape->vocab, &state);
    float cpu_loss = run_micro_batches(&cpu, tokens, micro_batches, mbs);
    float gpu_loss = run_micro_batches(&gpu, tokens, micro_batches, mbs);
    printf("# %s: loss cpu %.6f, cuda %.6f nats/token\n", label, cpu_loss,
           gpu_loss);
    char name[160];
    snprintf(name, sizeof name, "%s: loss", label);
    float got = gpu_loss, want = cpu_loss;
    gpu_test_compare(tally, name, &got, &want, 1, TOL_LOSS);
    float *cpu_grads = gpu_test_read_buffer(&cpu, STAGE_GRADS);
    float *gpu_grads = gpu_test_read_buffer(&gpu, STAGE_GRADS);
    compare_grads(tally, label, &gpu, gpu_grads, &cpu, cpu_grads);
    free(tokens), free(cpu_grads), free(gpu_grads);
    model_stage_destroy(&cpu);
    model_stage_destroy(&gpu);
}

int main(void)
{
    gpu_test_require_device("test_cuda_llama_stage");
    gpu_test_tally tally = {0, 0};
    model_shape tiny = llama_tiny();
    test_variant(&tally, "llama-tiny", &tiny, NULL, false, false);
    test_variant(&tally, "llama-tiny recompute none", &tiny, "none", false,
                 false);
    test_variant(&tally, "llama-tiny recompute all", &tiny, "all", false,
                 false);
    test_variant(&tally, "llama-tiny full recompute", &tiny, NULL, true,
                 false);
    model_shape kin = tiny;
    kin.bias = MODEL_BIAS_QKV;
    test_variant(&tally, "qkv biases", &kin, NULL, false, false);
    kin = tiny;
    kin.tied_embeddings = true;
    test_variant(&tally, "tied head", &kin, NULL, false, false);
    kin = tiny;
    kin.kv_heads = kin.heads;
    test_variant(&tally, "multi-head", &kin, NULL, false, false);
    kin = tiny;
    kin.norm = MODEL_NORM_LAYERNORM;
    kin.mlp = MODEL_MLP_GELU;
    test_variant(&tally, "layernorm and gelu", &kin, NULL, false, false);
    /* a vocabulary whose head chunk (48 rows of 1,024) holds the fc
     * gradient and the backward's stream-wide buffers behind it */
    kin = tiny;
    kin.vocab = 1000;
    test_variant(&tally, "backward buffers in the head's chunk", &kin, NULL,
                 false, true);
    test_variant(&tally, "backward buffers in the head's chunk, full "
                 "recompute", &kin, NULL, true, true);
    return gpu_test_finish(&tally, "test_cuda_llama_stage");
}
