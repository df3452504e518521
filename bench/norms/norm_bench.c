/*
 * norm_bench: the norms' kernels timed alone at the bundled models' row
 * shapes, as the stage's passes call them, against a device copy of the
 * same bytes in the same run: the forward after the residual add
 * (cuda_norm_forward_after_add: reads the stream and the branch, writes
 * their sum and the norm's output) and the fused backward
 * (cuda_rmsnorm_backward, cuda_layernorm_backward: reads dy, x and the
 * bf16 stream gradient, writes the stream gradient in place); 8 bytes a
 * value each, where the copy moves 4 bytes a value each way. Each line
 * gives microseconds a call (the median of ROUNDS rounds of CALLS
 * calls), the bytes' rate, the copy's, their ratio and a hash of one
 * call's output bits (the forward's output; the backward's d_inp, with
 * the weight gradient's sum), so that kernel variants
 * (PARTITA_LAYERNORM_FORWARD, PARTITA_LAYERNORM_BACKWARD;
 * bench/norms/run.sh) are compared on the same results. Built with the
 * cuda backend; run by hand on a GPU (docs/benchmarks.md, "The norms'
 * kernels, timed alone").
 *
 *   norm_bench [--calls N] [--rounds N] [rms:ROWSxC|ln:ROWSxC ...]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "executor/cuda/buffers.h"
#include "executor/cuda/cuda_ops.h"

#define MAX_ROUNDS 15

/* Stops the program on a failed CUDA call, naming it. */
#define BENCH_CHECK(call)                                                    \
    do {                                                                     \
        cudaError_t bench_status_ = (call);                                  \
        if (bench_status_ != cudaSuccess) {                                  \
            fprintf(stderr, "norm_bench: %s: %s\n", #call,          \
                    cudaGetErrorString(bench_status_));                      \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* One shape: RMSNorm or layer norm over rows x channels. */
typedef struct norm_shape {
    bool rms;
    int rows, channels;
} norm_shape;

/* The row shapes of the bundled models' norms on one GPU: Llama-3.2-1B
 * (micro-batch 4), Llama-3-8B (2, and sequence 8192), Qwen2.5-7B,
 * Llama-3-70B, GPT 13B (2), GPT 2.7B, GPT-2 XL, GPT-2 350M (16). */
static const char *const default_shapes[] = {
    "rms:8192x2048", "rms:4096x4096", "rms:8192x4096", "rms:4096x3584",
    "rms:4096x8192", "ln:4096x5120",  "ln:8192x2560",  "ln:8192x1600",
    "ln:16384x1024"};

static bool parse_shape(const char *text, norm_shape *shape)
{
    char kind[8];
    if (sscanf(text, "%3[a-z]:%dx%d", kind, &shape->rows,
               &shape->channels) != 3 ||
        shape->rows <= 0 || shape->channels <= 0)
        return false;
    shape->rms = strcmp(kind, "rms") == 0;
    return shape->rms || strcmp(kind, "ln") == 0;
}

/* A fixed pseudo-random sequence in [-1, 1) (xorshift), so every run and
 * variant sees the same inputs. */
static float next_value(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static void *host_memory(size_t bytes)
{
    void *host = malloc(bytes);
    if (host == NULL) {
        fprintf(stderr, "norm_bench: out of host memory\n");
        exit(1);
    }
    return host;
}

/* A device copy of `bytes` of host memory, which it frees. */
static void *upload_and_free(void *host, size_t bytes)
{
    void *device = NULL;
    BENCH_CHECK(cudaMalloc(&device, bytes));
    BENCH_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
    free(host);
    return device;
}

/* count bf16 values of the sequence, times scale. */
static void *device_bf16(size_t count, uint64_t *state, float scale)
{
    pt_bf16 *host = host_memory(count * sizeof *host);
    for (size_t i = 0; i < count; i++)
        host[i] = pt_float_to_bf16(scale * next_value(state));
    return upload_and_free(host, count * sizeof *host);
}

/* count floats about offset (state NULL: zeros). */
static float *device_floats(size_t count, uint64_t *state, float offset)
{
    float *host = host_memory(count * sizeof *host);
    for (size_t i = 0; i < count; i++)
        host[i] = state != NULL ? offset + 0.25f * next_value(state) : 0.0f;
    return upload_and_free(host, count * sizeof *host);
}

/* The tensors of one shape's calls. */
typedef struct norm_tensors {
    pt_bf16 *d_out, *inp, *stream, *stream_start, *norm_out;
    float *weight, *bias, *mean, *rstd, *d_weight, *d_bias, *scratch;
    float *forward_stats; /* the timed forwards' mean and rstd (2N) */
    void *copy_from, *copy_to;
} norm_tensors;

static void make_tensors(const norm_shape *s, norm_tensors *t)
{
    size_t values = (size_t)s->rows * s->channels;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    t->d_out = device_bf16(values, &state, 1.0f);
    t->inp = device_bf16(values, &state, 2.0f);
    t->stream_start = device_bf16(values, &state, 0.5f);
    BENCH_CHECK(cudaMalloc((void **)&t->stream, values * sizeof(pt_bf16)));
    BENCH_CHECK(cudaMalloc((void **)&t->norm_out, values * sizeof(pt_bf16)));
    t->weight = device_floats((size_t)s->channels, &state, 1.0f);
    t->bias = device_floats((size_t)s->channels, &state, 0.0f);
    t->mean = device_floats((size_t)s->rows, NULL, 0.0f);
    t->rstd = device_floats((size_t)s->rows, NULL, 0.0f);
    t->forward_stats = device_floats(2 * (size_t)s->rows, NULL, 0.0f);
    t->d_weight = device_floats((size_t)s->channels, NULL, 0.0f);
    t->d_bias = device_floats((size_t)s->channels, NULL, 0.0f);
    t->scratch = device_floats(
        cuda_layernorm_backward_scratch(s->rows, s->channels), NULL, 0.0f);
    BENCH_CHECK(cudaMalloc(&t->copy_from, values * 4));
    BENCH_CHECK(cudaMalloc(&t->copy_to, values * 4));
    if (s->rms)
        BENCH_CHECK(cuda_rmsnorm_forward(t->norm_out, t->rstd, t->inp,
                                         t->weight, 1e-5f, s->rows,
                                         s->channels, 0));
    else
        BENCH_CHECK(cuda_layernorm_forward(t->norm_out, t->mean, t->rstd,
                                           t->inp, t->weight, t->bias,
                                           s->rows, s->channels, 0));
    BENCH_CHECK(cudaMemcpy(t->stream, t->stream_start,
                           values * sizeof(pt_bf16),
                           cudaMemcpyDeviceToDevice));
}

static void free_tensors(norm_tensors *t)
{
    void *all[] = {t->d_out,  t->inp,      t->stream,   t->stream_start,
                   t->norm_out, t->weight, t->bias,     t->mean,
                   t->rstd,   t->d_weight, t->d_bias,   t->scratch,
                   t->copy_from, t->copy_to, t->forward_stats};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        BENCH_CHECK(cudaFree(all[i]));
}

/* One backward as the stage's pass calls it: the stream gradient in bf16,
 * in place, plus the norm's term. */
static void backward_call(const norm_shape *s, norm_tensors *t)
{
    cuda_grad d_weight = {t->d_weight, false}, d_bias = {t->d_bias, false};
    if (s->rms)
        BENCH_CHECK(cuda_rmsnorm_backward(
            NULL, t->stream, d_weight, NULL, t->stream, t->d_out, t->inp,
            t->weight, t->rstd, t->scratch, s->rows, s->channels, 0));
    else
        BENCH_CHECK(cuda_layernorm_backward(
            NULL, t->stream, d_weight, d_bias, NULL, t->stream, t->d_out,
            t->inp, t->weight, t->mean, t->rstd, t->scratch, s->rows,
            s->channels, 0));
}

/* One forward as the stage's pass calls it: the stream plus the branch
 * (stream_start) into their sum (norm_out's twin: copy_to), then the norm
 * of the sum. */
static void forward_call(const norm_shape *s, norm_tensors *t)
{
    BENCH_CHECK(cuda_norm_forward_after_add(
        t->norm_out, s->rms ? NULL : t->forward_stats,
        t->forward_stats + s->rows, t->copy_to, t->inp,
        t->stream_start, t->weight, t->bias, s->rms, 1e-5f, s->rows,
        s->channels, 0));
}

static uint64_t hash_bf16(const pt_bf16 *device, size_t values)
{
    pt_bf16 *host = host_memory(values * sizeof *host);
    BENCH_CHECK(cudaMemcpy(host, device, values * sizeof *host,
                           cudaMemcpyDeviceToHost));
    uint64_t hash = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < values; i++) {
        hash = (hash ^ (host[i] & 0xFF)) * 0x100000001b3ull;
        hash = (hash ^ (host[i] >> 8)) * 0x100000001b3ull;
    }
    free(host);
    return hash;
}

/* FNV-1a of one call's d_inp bits from the fresh stream gradient, and the
 * weight gradient's sum. */
static void one_call_results(const norm_shape *s, norm_tensors *t,
                             uint64_t *hash, double *weight_sum)
{
    size_t values = (size_t)s->rows * s->channels;
    BENCH_CHECK(cudaMemcpy(t->stream, t->stream_start,
                           values * sizeof(pt_bf16),
                           cudaMemcpyDeviceToDevice));
    BENCH_CHECK(cudaMemset(t->d_weight, 0, s->channels * sizeof(float)));
    backward_call(s, t);
    BENCH_CHECK(cudaDeviceSynchronize());
    float *weight = host_memory(s->channels * sizeof *weight);
    *hash = hash_bf16(t->stream, values);
    BENCH_CHECK(cudaMemcpy(weight, t->d_weight, s->channels * sizeof *weight,
                           cudaMemcpyDeviceToHost));
    *weight_sum = 0.0;
    for (int c = 0; c < s->channels; c++)
        *weight_sum += weight[c];
    free(weight);
}

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* What time_calls times. */
typedef enum timed_call { TIMED_BACKWARD, TIMED_FORWARD, TIMED_COPY } timed_call;

/* Microseconds a call: the median of `rounds` rounds of `calls` calls of
 * one kind. */
static float time_calls(const norm_shape *s, norm_tensors *t,
                        timed_call kind, int calls, int rounds)
{
    size_t copy_bytes = (size_t)s->rows * s->channels * 4;
    float per_call[MAX_ROUNDS];
    cudaEvent_t start, stop;
    BENCH_CHECK(cudaEventCreate(&start));
    BENCH_CHECK(cudaEventCreate(&stop));
    for (int r = 0; r < rounds; r++) {
        BENCH_CHECK(cudaEventRecord(start, 0));
        for (int i = 0; i < calls; i++) {
            if (kind == TIMED_COPY)
                BENCH_CHECK(cudaMemcpyAsync(t->copy_to, t->copy_from,
                                            copy_bytes,
                                            cudaMemcpyDeviceToDevice, 0));
            else if (kind == TIMED_FORWARD)
                forward_call(s, t);
            else
                backward_call(s, t);
        }
        BENCH_CHECK(cudaEventRecord(stop, 0));
        BENCH_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
        per_call[r] = 1000.0f * ms / (float)calls;
    }
    BENCH_CHECK(cudaEventDestroy(start));
    BENCH_CHECK(cudaEventDestroy(stop));
    qsort(per_call, (size_t)rounds, sizeof per_call[0], compare_floats);
    return per_call[rounds / 2];
}

static void bench_shape(const norm_shape *s, int calls, int rounds)
{
    norm_tensors t;
    make_tensors(s, &t);
    uint64_t hash = 0;
    double weight_sum = 0.0;
    one_call_results(s, &t, &hash, &weight_sum);
    forward_call(s, &t);
    uint64_t forward_hash =
        hash_bf16(t.norm_out, (size_t)s->rows * s->channels);
    for (int kind = TIMED_BACKWARD; kind <= TIMED_COPY; kind++) /* warm-up */
        time_calls(s, &t, (timed_call)kind, calls / 10 + 1, 1);
    float backward_us = time_calls(s, &t, TIMED_BACKWARD, calls, rounds);
    float forward_us = time_calls(s, &t, TIMED_FORWARD, calls, rounds);
    float copy_us = time_calls(s, &t, TIMED_COPY, calls, rounds);
    double bytes = 8.0 * s->rows * s->channels;
    const char *name = s->rms ? "rms" : "ln";
    printf("%5s %3s %7d %7d %10.1f %9.0f %9.1f %9.0f %7.2f  %016llx %.6e\n",
           name, "bwd", s->rows, s->channels, backward_us,
           bytes / (backward_us * 1e3), copy_us, bytes / (copy_us * 1e3),
           backward_us / copy_us, (unsigned long long)hash, weight_sum);
    printf("%5s %3s %7d %7d %10.1f %9.0f %9.1f %9.0f %7.2f  %016llx -\n",
           name, "fwd", s->rows, s->channels, forward_us,
           bytes / (forward_us * 1e3), copy_us, bytes / (copy_us * 1e3),
           forward_us / copy_us, (unsigned long long)forward_hash);
    fflush(stdout);
    free_tensors(&t);
}

static int usage(void)
{
    fprintf(stderr, "usage: norm_bench [--calls N] [--rounds N] "
                    "[rms:ROWSxC|ln:ROWSxC ...]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int calls = 200, rounds = 5, first_shape = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc)
            calls = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (argv[i][0] == '-')
            return usage();
        else {
            first_shape = i;
            break;
        }
    }
    if (calls < 1 || rounds < 1 || rounds > MAX_ROUNDS)
        return usage();
    const char *backward = getenv("PARTITA_LAYERNORM_BACKWARD");
    const char *forward = getenv("PARTITA_LAYERNORM_FORWARD");
    struct cudaDeviceProp properties;
    BENCH_CHECK(cudaGetDeviceProperties(&properties, 0));
    printf("# norm_bench on %s, %d SMs; kernels forward %s, backward %s; "
           "%d calls a round, median of %d rounds\n",
           properties.name, properties.multiProcessorCount,
           forward != NULL ? forward : "default",
           backward != NULL ? backward : "default", calls, rounds);
    printf("# %4s %3s %7s %7s %10s %9s %9s %9s %7s  %-16s %s\n", "norm",
           "way", "rows", "chans", "kernel(us)", "GB/s", "copy(us)", "GB/s",
           "ratio", "output hash", "sum(d_weight)");
    size_t count = first_shape < argc
                       ? (size_t)(argc - first_shape)
                       : sizeof default_shapes / sizeof default_shapes[0];
    for (size_t i = 0; i < count; i++) {
        const char *text = first_shape < argc ? argv[first_shape + i]
                                              : default_shapes[i];
        norm_shape shape;
        if (!parse_shape(text, &shape)) {
            fprintf(stderr, "norm_bench: %s: not rms:ROWSxC or "
                            "ln:ROWSxC\n", text);
            return 2;
        }
        bench_shape(&shape, calls, rounds);
    }
    return 0;
}
