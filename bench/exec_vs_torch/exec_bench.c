/*
 * Training throughput of the executor's cuda backend on one GPU: a whole
 * GPT model as one stage, synthetic tokens, warm-up steps, then timed
 * steps. Each step is what train_step does (zero grads, forward,
 * backward, global-norm clipping, AdamW), written out so that the time of
 * each phase can be printed. torch_gpt.py runs the same model and step in
 * PyTorch; run.sh puts the two side by side.
 *
 * Usage: exec_bench MODEL.json MBS [WARMUP_STEPS [TIMED_STEPS
 *        [GRAD_PRECISION]]]
 * GRAD_PRECISION: fp32 (default, Megatron-LM's recipe) or bf16 (llm.c's,
 * issue 34: the stage's spec.bf16_grads).
 * Prints a table and one machine-readable line:
 *   RESULT impl=partita model=... mbs=... tokens_per_s=... step_ms=...
 *          peak_gib=...
 * step_ms and tokens_per_s come from the median timed step, the figure
 * bench/exec_vs_llmc/run.sh takes from llm.c's log too, so one slow
 * step (a clock dip, the memory sampler) moves neither program; the
 * mean is printed beside it.
 * Exit status: 0, 1 on failure, 77 when no GPU is visible.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "executor/cuda/cuda_backend.h"
#include "executor/executor.h"

/* GPT-2-like parameters, fast: uniform values of standard deviation 0.02
 * for matrices and embeddings, norm weights 1, biases 0. (The library's
 * model_stage_init_parameters draws true normals, a minute of host time
 * for 1.5B parameters; the timing does not depend on the distribution,
 * only on the values not being trivial.) */
static int fast_init(model_stage *stage, pt_error *err)
{
    float *host = malloc((stage->param_count + 1) * sizeof *host);
    if (host == NULL)
        return pt_fail(err, "exec_bench: out of host memory");
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < stage->tensor_count; i++) {
        const param_tensor *t = &stage->tensors[i];
        float *values = host + t->offset;
        bool is_bias = strstr(t->name, "_bias") != NULL;
        bool is_norm = strstr(t->name, "ln1_") != NULL ||
                       strstr(t->name, "ln2_") != NULL ||
                       strstr(t->name, "final_norm") != NULL;
        for (size_t k = 0; k < t->count; k++) {
            if (is_bias) {
                values[k] = 0.0f;
            } else if (is_norm) {
                values[k] = 1.0f;
            } else {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                /* uniform in [-sqrt(3), sqrt(3)) x 0.02 */
                double u = (double)(state >> 11) * 0x1.0p-53;
                values[k] = (float)((2.0 * u - 1.0) * 1.7320508 * 0.02);
            }
        }
    }
    float *zeros = calloc(stage->param_count + 1, sizeof *zeros);
    int status = -1;
    if (zeros == NULL)
        pt_fail(err, "exec_bench: out of host memory");
    else if (model_stage_write(stage, STAGE_PARAMS, host, err) == 0 &&
             model_stage_write(stage, STAGE_ADAM_M, zeros, err) == 0 &&
             model_stage_write(stage, STAGE_ADAM_V, zeros, err) == 0)
        status = 0;
    free(zeros);
    free(host);
    return status;
}

/* Seconds spent in each phase over the timed steps, and the host's own
 * share of a step: queueing its work (begin and forward, backward,
 * norm and AdamW) and waiting for the device. */
typedef struct phase_times {
    double forward;
    double backward;
    double optimizer;     /* gradient norm + AdamW */
    double step;
    double host_queue_forward; /* stage_step_begin + stage_step_forward */
    double host_queue_rest;    /* backward and apply queued */
    double host_wait;          /* stage_step_end and the marks read */
} phase_times;

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of count values (count >= 1); sorts them. */
static double median_of(double *values, int count)
{
    qsort(values, (size_t)count, sizeof *values, compare_doubles);
    return count % 2 ? values[count / 2]
                     : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

/* The phases' ends, seconds from the step's start: on the device's
 * clock when the step stayed there (the host saw only their queueing;
 * the device was idle at the start, the last step having waited), else
 * the host's. */
static int phase_ends(const model_stage *stage, double *ends, pt_error *err)
{
    if (!stage->step.marked)
        return 0;
    for (int mark = 1; mark <= 3; mark++)
        if (stage_step_mark_seconds(stage, mark, &ends[mark - 1], err) != 0)
            return -1;
    return 0;
}

/* One step through stage_step_* (train_step's parts): on the cuda
 * backend the loss, the norm and the clipping stay on the device and the
 * host waits once, in stage_step_end, having readied the next step's
 * tokens (stage_prepare_tokens). */
static int run_step(model_stage *stage, const uint32_t *tokens, int mbs,
                    float learning_rate, phase_times *times, float *loss,
                    pt_error *err)
{
    double start = pt_monotonic_seconds();
    stage_io io = {.mbs = mbs, .tokens = tokens, .loss_scale = 1.0f};
    if (stage_step_begin(stage, err) != 0 ||
        stage_step_forward(stage, &io, err) != 0)
        return -1;
    double ends[3] = {pt_monotonic_seconds() - start, 0.0, 0.0};
    double queued_forward = ends[0];
    if (stage_step_backward(stage, &io, err) != 0)
        return -1;
    ends[1] = pt_monotonic_seconds() - start;
    train_config config = train_config_defaults();
    stage_step_totals totals;
    /* the next step's tokens (the same ones) readied while the device
     * runs this one, as partita exec draws its next iteration's */
    if (stage_step_apply(stage, &config, learning_rate, err) != 0 ||
        stage_prepare_tokens(stage, &io, err) != 0)
        return -1;
    double queued = pt_monotonic_seconds() - start;
    if (stage_step_end(stage, &totals, err) != 0)
        return -1;
    if (!totals.applied)
        return pt_fail(err, "the loss (%g) or the gradient norm (%g) is not "
                            "finite", totals.loss_sum, totals.grad_norm);
    double step = pt_monotonic_seconds() - start;
    ends[2] = step;
    if (phase_ends(stage, ends, err) != 0)
        return -1;
    times->host_queue_forward += queued_forward;
    times->host_queue_rest += queued - queued_forward;
    times->host_wait += step - queued;
    *loss = (float)totals.loss_sum;
    times->forward += ends[0];
    times->backward += ends[1] - ends[0];
    times->optimizer += ends[2] - ends[1];
    times->step += step;
    return 0;
}

/* The stage's device memory by term (what its allocations tally:
 * docs/cuda-backend.md, "Memory"), one '#' line. */
static void print_memory_terms(const model_stage *stage)
{
    pt_memory_terms terms;
    cuda_stage_memory_terms(stage, &terms);
    printf("# stage memory by term:");
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        if (terms.bytes[t] > 0.0)
            printf(" %s %.4f GiB", pt_memory_term_name((pt_memory_term)t),
                   terms.bytes[t] / (1 << 30));
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.json MBS [WARMUP [STEPS "
                        "[fp32|bf16]]]\n",
                argv[0]);
        return 1;
    }
    if (cuda_device_count() == 0) {
        printf("SKIP exec_bench: no CUDA device is visible\n");
        return 77;
    }
    int mbs = atoi(argv[2]);
    int warmup = argc > 3 ? atoi(argv[3]) : 5;
    int steps = argc > 4 ? atoi(argv[4]) : 20;
    if (mbs < 1 || warmup < 0 || steps < 1) {
        fprintf(stderr, "exec_bench: MBS and TIMED_STEPS must be at least 1, "
                        "WARMUP_STEPS at least 0\n");
        return 1;
    }
    pt_error err;
    model_shape shape;
    if (model_load_file(argv[1], &shape, &err) != 0) {
        fprintf(stderr, "exec_bench: %s\n", err.message);
        return 1;
    }
    struct cudaDeviceProp properties;
    if (cudaGetDeviceProperties(&properties, 0) != cudaSuccess) {
        fprintf(stderr, "exec_bench: cannot read the device properties\n");
        return 1;
    }
    size_t free_before = 0, total = 0;
    cudaMemGetInfo(&free_before, &total);
    stage_spec spec = stage_spec_whole_model(&shape);
    const char *grad_precision = argc > 5 ? argv[5] : "fp32";
    if (strcmp(grad_precision, "fp32") != 0 &&
        strcmp(grad_precision, "bf16") != 0) {
        fprintf(stderr, "exec_bench: grad precision '%s': expected fp32 or "
                        "bf16\n", grad_precision);
        return 1;
    }
    spec.bf16_grads = strcmp(grad_precision, "bf16") == 0;
    model_stage stage;
    if (cuda_model_stage_create(&stage, &shape, &spec, mbs, 1, &err) != 0 ||
        fast_init(&stage, &err) != 0) {
        fprintf(stderr, "exec_bench: %s\n", err.message);
        return 1;
    }
    size_t window = (size_t)shape.seq + 1;
    uint32_t *tokens = malloc((size_t)mbs * window * sizeof *tokens);
    if (tokens == NULL) {
        fprintf(stderr, "exec_bench: out of host memory\n");
        return 1;
    }
    uint64_t state = 0x853c49e6748fea9bull;
    for (size_t i = 0; i < (size_t)mbs * window; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (uint32_t)((state >> 33) % (uint64_t)shape.vocab);
    }
    phase_times warm = {0}, timed = {0};
    float loss = 0.0f, first_loss = 0.0f;
    double *step_seconds = calloc((size_t)steps, sizeof *step_seconds);
    if (step_seconds == NULL) {
        fprintf(stderr, "exec_bench: out of host memory\n");
        return 1;
    }
    for (int i = 0; i < warmup + steps; i++) {
        phase_times *times = i < warmup ? &warm : &timed;
        double before = times->step;
        if (run_step(&stage, tokens, mbs, 1e-4f, times, &loss, &err) != 0) {
            fprintf(stderr, "exec_bench: step %d: %s\n", i, err.message);
            return 1;
        }
        if (i >= warmup)
            step_seconds[i - warmup] = times->step - before;
        if (i == 0)
            first_loss = loss;
    }
    size_t free_after = 0;
    cudaMemGetInfo(&free_after, &total);
    double held = (double)cuda_stage_device_bytes(&stage) / (1 << 30);
    double used = (double)(free_before - free_after) / (1 << 30);
    double tokens_per_step = (double)mbs * shape.seq;
    double mean_step_s = timed.step / steps;
    double step_s = median_of(step_seconds, steps);
    free(step_seconds);
    double params = model_parameter_count(&shape);
    /* 6 N per token for the dense part, plus the causal attention
     * products (Q K^T and P V, forward and backward: 6 x 2 x s x h / 2
     * per layer per token) */
    double flops_per_token =
        6.0 * params + 6.0 * shape.layers * (double)shape.seq * shape.hidden;
    printf("# exec_bench on %s: %s, mbs %d, seq %d, %d warm-up + %d timed "
           "steps\n",
           properties.name, shape.name, mbs, shape.seq, warmup, steps);
    printf("# loss %.4f -> %.4f nats/token (synthetic tokens)\n", first_loss,
           loss);
    printf("# attention: %s\n", cuda_stage_attention(&stage));
    printf("# passes replayed from CUDA graphs: %ld\n",
           cuda_stage_graph_replays(&stage));
    printf("# per step (means; phases on the device's clock): forward "
           "%.2f ms, backward %.2f ms, norm + AdamW %.2f ms, total %.2f ms; "
           "median step %.2f ms\n",
           1e3 * timed.forward / steps, 1e3 * timed.backward / steps,
           1e3 * timed.optimizer / steps, 1e3 * mean_step_s, 1e3 * step_s);
    printf("# host per step (means): begin + forward queued %.3f ms, "
           "backward + norm + AdamW queued %.3f ms, waiting %.3f ms\n",
           1e3 * timed.host_queue_forward / steps,
           1e3 * timed.host_queue_rest / steps, 1e3 * timed.host_wait / steps);
    printf("# %.0f tokens/s at the median step, %.1f TFLOP/s (6N + "
           "attention), device memory: "
           "%.2f GiB held by the stage, %.2f GiB in use by the process\n",
           tokens_per_step / step_s,
           flops_per_token * tokens_per_step / step_s / 1e12, held, used);
    print_memory_terms(&stage);
    printf("RESULT impl=partita mode=cuda model=%s mbs=%d tokens_per_s=%.0f "
           "step_ms=%.3f peak_gib=%.3f process_gib=%.3f "
           "grad_precision=%s\n",
           shape.name, mbs, tokens_per_step / step_s, 1e3 * step_s, held,
           used, grad_precision);
    free(tokens);
    model_stage_destroy(&stage);
    return 0;
}
