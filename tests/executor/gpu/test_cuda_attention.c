/*
 * cuDNN's fused attention (attention_runner.h forced to cuDNN) against
 * the own kernels of attention.cu and the cpu reference op, forward and
 * backward, at head sizes 64 and 128 and at the shapes of GPT-2 124M and
 * 1.5B (there against the own kernels only: the cpu would take minutes).
 * The statistics are compared across conventions (cuDNN's natural
 * log-sum-exp x log2 e against the own kernels' base-2 one), and the
 * backward in lent memory against the own workspace, bit for bit. Then
 * the runner's choice in auto mode (cuDNN where it plans, the own kernels
 * for a sequence of 200) and the refusal in cudnn mode, the backward's
 * determinism, and the time of both paths (NOTE lines, never checked).
 *
 * For ONE GPU run to say what is wrong: the cuDNN versions (run time and
 * build) and each shape's engines come first; a failing cuDNN call
 * prints the graph, the call, the attribute and cuDNN's own message;
 * every comparison prints its error. Exit 77 without a GPU or when the
 * build has no cuDNN.
 *
 * Usage: test_cuda_attention
 */
#include "gpu_test.h"

#include "executor/cpu/cpu.h"
#include "executor/cuda/attention_runner.h"
#include "executor/cuda/buffers.h"

#define TOL_BF16_CHAIN 2e-2
#define TOL_STATS 1e-3
#define LOG2E 1.4426950408889634

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static float *random_bf16_host(size_t count, float scale)
{
    float *values = gpu_test_host(count * sizeof *values);
    gpu_test_fill(values, count, scale, 0.0f, &rng_state);
    gpu_test_round_bf16(values, count);
    return values;
}

/* One path's results on the host. */
typedef struct attention_result {
    float *out;                 /* N x C */
    float *lse;                 /* B x NH x T, base 2 */
    float *d_qkv;               /* N x 3C */
} attention_result;

/* The device inputs of one shape, and its sizes. */
typedef struct attention_case {
    int B, T, C, NH;
    size_t N, qkv_count, out_count, lse_count;
    pt_bf16 *qkv, *d_out;
} attention_case;

static void result_free(attention_result *r)
{
    free(r->out), free(r->lse), free(r->d_qkv);
}

/* The device outputs of one forward + backward of a case. */
typedef struct path_buffers {
    pt_bf16 *out, *d_qkv;
    float *lse, *scratch;
} path_buffers;

static path_buffers buffers_of(const attention_case *c)
{
    path_buffers b = {
        .out = gpu_test_device(c->out_count * sizeof(pt_bf16)),
        .d_qkv = gpu_test_device(c->qkv_count * sizeof(pt_bf16)),
        .lse = gpu_test_device(c->lse_count * sizeof(float)),
        .scratch = gpu_test_device(
            cuda_attention_backward_scratch(c->B, c->T, c->NH) *
            sizeof(float)),
    };
    return b;
}

static void buffers_free(path_buffers *b)
{
    cudaFree(b->out), cudaFree(b->d_qkv), cudaFree(b->lse);
    cudaFree(b->scratch);
}

/* Forward and backward on the runner's path into host memory (lse
 * converted to base 2 when `natural_log`), the backward lent lent_bytes
 * at lent. */
static attention_result run_path(gpu_test_tally *tally,
                                 attention_runner *runner,
                                 const attention_case *c, bool natural_log,
                                 void *lent, size_t lent_bytes,
                                 const char *name)
{
    pt_error err;
    path_buffers b = buffers_of(c);
    pt_bf16 *out = b.out, *d_qkv = b.d_qkv;
    float *lse = b.lse, *scratch = b.scratch;
    attention_result r = {
        .out = gpu_test_host(c->out_count * sizeof(float)),
        .lse = gpu_test_host(c->lse_count * sizeof(float)),
        .d_qkv = gpu_test_host(c->qkv_count * sizeof(float)),
    };
    if (attention_runner_forward(runner, out, lse, c->qkv, c->B, c->T, c->C,
                                 c->NH, 0, &err) != 0 ||
        attention_runner_backward(runner, d_qkv, c->d_out, c->qkv, out, lse,
                                  scratch, c->B, c->T, c->C, c->NH, lent,
                                  lent_bytes, 0, &err) != 0) {
        printf("FAIL %s: %s\n", name, err.message);
        tally->failed++;
    }
    GPU_CHECK(cudaDeviceSynchronize());
    gpu_test_download_bf16(r.out, out, c->out_count);
    gpu_test_download(r.lse, lse, c->lse_count);
    gpu_test_download_bf16(r.d_qkv, d_qkv, c->qkv_count);
    if (natural_log)
        for (size_t i = 0; i < c->lse_count; i++)
            r.lse[i] = (float)(r.lse[i] * LOG2E);
    buffers_free(&b);
    return r;
}

/* dQ, dK and dV of got against want, each on its own line. */
static void compare_gradients(gpu_test_tally *tally, const attention_case *c,
                              const float *got, const float *want,
                              const char *against)
{
    const char *parts[3] = {"dQ", "dK", "dV"};
    float *got_part = gpu_test_host(c->out_count * sizeof(float));
    float *want_part = gpu_test_host(c->out_count * sizeof(float));
    size_t C = (size_t)c->C;
    for (int part = 0; part < 3; part++) {
        for (size_t n = 0; n < c->N; n++) {
            memcpy(got_part + n * C, got + n * 3 * C + part * C,
                   C * sizeof(float));
            memcpy(want_part + n * C, want + n * 3 * C + part * C,
                   C * sizeof(float));
        }
        char name[160];
        snprintf(name, sizeof name, "cuDNN backward %s B=%d T=%d D=%d vs %s",
                 parts[part], c->B, c->T, c->C / c->NH, against);
        gpu_test_compare(tally, name, got_part, want_part, c->out_count,
                         TOL_BF16_CHAIN);
    }
    free(got_part), free(want_part);
}

/* The cpu reference of the shape: out and d_qkv. */
static attention_result cpu_reference(const attention_case *c,
                                      const float *qkv, const float *d_out)
{
    attention_result r = {
        .out = gpu_test_host(c->out_count * sizeof(float)),
        .lse = NULL,
        .d_qkv = gpu_test_host(c->qkv_count * sizeof(float)),
    };
    float *probs = gpu_test_host((size_t)c->B * c->NH * c->T * c->T *
                                 sizeof(float));
    float *row = gpu_test_host((size_t)c->T * sizeof(float));
    cpu_attention_forward(r.out, probs, qkv, c->B, c->T, c->C, c->NH);
    cpu_attention_backward(r.d_qkv, d_out, qkv, probs, row, c->B, c->T, c->C,
                           c->NH);
    free(probs), free(row);
    return r;
}

/* The cuDNN backward twice on the same inputs: the same bits. */
static void check_determinism(gpu_test_tally *tally,
                              attention_runner *cudnn,
                              const attention_case *c)
{
    attention_result first = run_path(tally, cudnn, c, true, NULL, 0, "determinism");
    attention_result second = run_path(tally, cudnn, c, true, NULL, 0, "determinism");
    bool same = memcmp(first.d_qkv, second.d_qkv,
                       c->qkv_count * sizeof(float)) == 0;
    char what[128];
    snprintf(what, sizeof what,
             "cuDNN backward B=%d T=%d gives the same bits twice", c->B,
             c->T);
    gpu_test_expect(tally, same, what);
    result_free(&first), result_free(&second);
}

/* A cuDNN runner of the case's shape whose backward is lent lent_bytes
 * at each call. */
static attention_runner *borrowing_runner(const attention_case *c,
                                          size_t lent_bytes)
{
    pt_error err;
    attention_runner *runner = NULL;
    PT_CHECK(attention_runner_create(&runner, ATTENTION_CUDNN, true, &err), &err);
    PT_CHECK(attention_runner_prepare(runner, c->B, c->T, c->C, c->NH,
                                      lent_bytes, &err),
             &err);
    return runner;
}

/* cuDNN's backward in lent memory (as a stage lends its logits): the
 * same bits as in the own workspace, and the description says so. */
static void check_lent(gpu_test_tally *tally, const attention_case *c,
                       const attention_result *own_workspace)
{
    size_t lent_bytes = (size_t)c->B * c->NH * c->T * c->T * 2 + (8u << 20);
    void *lent = gpu_test_device(lent_bytes);
    attention_runner *borrower = borrowing_runner(c, lent_bytes);
    printf("# lent B=%d T=%d: %s\n", c->B, c->T,
           attention_runner_describe(borrower));
    attention_result r =
        run_path(tally, borrower, c, true, lent, lent_bytes, "lent");
    char what[128];
    snprintf(what, sizeof what,
             "cuDNN backward B=%d T=%d in lent memory: the same bits", c->B,
             c->T);
    gpu_test_expect(tally,
                    memcmp(r.d_qkv, own_workspace->d_qkv,
                           c->qkv_count * sizeof(float)) == 0,
                    what);
    gpu_test_expect(tally,
                    strstr(attention_runner_describe(borrower), "lent") !=
                        NULL,
                    "the description names the lent workspace");
    result_free(&r);
    attention_runner_destroy(borrower);
    cudaFree(lent);
}

static double time_path(attention_runner *runner, const attention_case *c,
                        int reps, void *lent, size_t lent_bytes,
                        double *forward_ms);

/* cuDNN's backward lent the workspace of half the sequences (and 1 MiB,
 * as a stage's fused head lends it): it runs in pieces of whole
 * sequences, the same bits as one call in the own workspace, and the
 * description says so; its time beside the whole call's (a NOTE). */
static void check_pieces(gpu_test_tally *tally, const attention_case *c,
                         const attention_result *own_workspace,
                         double whole_ms)
{
    if (c->B % 2 != 0)
        return;
    size_t lent_bytes =
        cuda_cudnn_backward_workspace_bytes(c->B / 2, c->T, c->NH, c->NH,
                                            c->C / c->NH, true) +
        ATTENTION_LENT_SLACK;
    void *lent = gpu_test_device(lent_bytes);
    attention_runner *borrower = borrowing_runner(c, lent_bytes);
    const char *described = attention_runner_describe(borrower);
    printf("# pieces B=%d T=%d: %s\n", c->B, c->T, described);
    attention_result r =
        run_path(tally, borrower, c, true, lent, lent_bytes, "pieces");
    char what[128];
    snprintf(what, sizeof what,
             "cuDNN backward B=%d T=%d in 2 pieces: the same bits", c->B,
             c->T);
    gpu_test_expect(tally,
                    memcmp(r.d_qkv, own_workspace->d_qkv,
                           c->qkv_count * sizeof(float)) == 0,
                    what);
    gpu_test_expect(tally, strstr(described, "calls of") != NULL,
                    "the description names the pieces");
    double forward_ms = 0.0;
    double pieces_ms = time_path(borrower, c, 10, lent, lent_bytes,
                                 &forward_ms);
    printf("NOTE attention B=%d T=%d NH=%d, cuDNN forward + backward: "
           "whole %.3f ms, backward in 2 pieces %.3f ms\n",
           c->B, c->T, c->NH, whole_ms, pieces_ms);
    result_free(&r);
    attention_runner_destroy(borrower);
    cudaFree(lent);
}

static void print_path(attention_runner *runner, const attention_case *c,
                       const char *mode)
{
    pt_error err;
    bool cudnn = false;
    if (attention_runner_uses_cudnn(runner, c->B, c->T, c->C, c->NH, &cudnn,
                                    &err) != 0)
        printf("# %s B=%d T=%d C=%d NH=%d: %s\n", mode, c->B, c->T, c->C,
               c->NH, err.message);
    else
        printf("# %s B=%d T=%d C=%d NH=%d: %s\n", mode, c->B, c->T, c->C,
               c->NH, attention_runner_describe(runner));
}

/* Milliseconds of one forward + backward on the runner's path, the mean
 * of `reps` after one warm-up (a NOTE, never checked). */
static double time_path(attention_runner *runner, const attention_case *c,
                        int reps, void *lent, size_t lent_bytes,
                        double *forward_ms)
{
    pt_error err;
    path_buffers b = buffers_of(c);
    pt_bf16 *out = b.out, *d_qkv = b.d_qkv;
    float *lse = b.lse, *scratch = b.scratch;
    cudaEvent_t marks[3];
    for (int i = 0; i < 3; i++)
        GPU_CHECK(cudaEventCreate(&marks[i]));
    double total = 0.0, forward = 0.0;
    for (int rep = 0; rep <= reps; rep++) {
        GPU_CHECK(cudaEventRecord(marks[0], 0));
        int status = attention_runner_forward(runner, out, lse, c->qkv, c->B,
                                              c->T, c->C, c->NH, 0, &err);
        GPU_CHECK(cudaEventRecord(marks[1], 0));
        if (status == 0)
            status = attention_runner_backward(runner, d_qkv, c->d_out,
                                               c->qkv, out, lse, scratch,
                                               c->B, c->T, c->C, c->NH, lent,
                                               lent_bytes, 0, &err);
        GPU_CHECK(cudaEventRecord(marks[2], 0));
        GPU_CHECK(cudaEventSynchronize(marks[2]));
        if (status != 0) {
            printf("NOTE timing failed: %s\n", err.message);
            break;
        }
        float fwd = 0.0f, all = 0.0f;
        GPU_CHECK(cudaEventElapsedTime(&fwd, marks[0], marks[1]));
        GPU_CHECK(cudaEventElapsedTime(&all, marks[0], marks[2]));
        if (rep > 0)
            forward += fwd, total += all;
    }
    for (int i = 0; i < 3; i++)
        cudaEventDestroy(marks[i]);
    buffers_free(&b);
    *forward_ms = forward / reps;
    return total / reps;
}

/* A case of random inputs (qkv and d_out on the host too, rounded to
 * bf16, for the cpu reference). */
static attention_case random_case(int B, int T, int C, int NH, float **qkv,
                                  float **d_out)
{
    attention_case c = {.B = B, .T = T, .C = C, .NH = NH};
    c.N = (size_t)B * T;
    c.qkv_count = c.N * 3 * C, c.out_count = c.N * C;
    c.lse_count = (size_t)B * NH * T;
    *qkv = random_bf16_host(c.qkv_count, 1.5f);
    *d_out = random_bf16_host(c.out_count, 1.0f);
    c.qkv = gpu_test_upload_bf16(*qkv, c.qkv_count);
    c.d_out = gpu_test_upload_bf16(*d_out, c.out_count);
    return c;
}

static void test_shape(gpu_test_tally *tally, attention_runner *own,
                       attention_runner *cudnn, int B, int T, int C, int NH,
                       bool with_cpu)
{
    float *qkv = NULL, *d_out = NULL;
    attention_case c = random_case(B, T, C, NH, &qkv, &d_out);
    print_path(cudnn, &c, "cudnn mode");
    attention_result mine =
        run_path(tally, own, &c, false, NULL, 0, "own kernels");
    attention_result theirs =
        run_path(tally, cudnn, &c, true, NULL, 0, "cuDNN");
    char name[160];
    snprintf(name, sizeof name, "cuDNN forward B=%d T=%d C=%d NH=%d vs own",
             B, T, C, NH);
    gpu_test_compare(tally, name, theirs.out, mine.out, c.out_count,
                     TOL_BF16_CHAIN);
    snprintf(name, sizeof name, "cuDNN stats x log2 e B=%d T=%d vs own lse",
             B, T);
    gpu_test_compare(tally, name, theirs.lse, mine.lse, c.lse_count,
                     TOL_STATS);
    compare_gradients(tally, &c, theirs.d_qkv, mine.d_qkv, "own");
    if (with_cpu) {
        attention_result want = cpu_reference(&c, qkv, d_out);
        snprintf(name, sizeof name,
                 "cuDNN forward B=%d T=%d C=%d NH=%d vs cpu", B, T, C, NH);
        gpu_test_compare(tally, name, theirs.out, want.out, c.out_count,
                         TOL_BF16_CHAIN);
        compare_gradients(tally, &c, theirs.d_qkv, want.d_qkv, "cpu");
        snprintf(name, sizeof name,
                 "own forward B=%d T=%d C=%d NH=%d vs cpu", B, T, C, NH);
        gpu_test_compare(tally, name, mine.out, want.out, c.out_count,
                         TOL_BF16_CHAIN);
        result_free(&want);
    } else {
        double own_fwd = 0, cudnn_fwd = 0;
        double own_ms = time_path(own, &c, 10, NULL, 0, &own_fwd);
        double cudnn_ms = time_path(cudnn, &c, 10, NULL, 0, &cudnn_fwd);
        printf("NOTE attention B=%d T=%d C=%d NH=%d, forward + backward: "
               "own %.3f ms (forward %.3f), cuDNN %.3f ms (forward %.3f)\n",
               B, T, C, NH, own_ms, own_fwd, cudnn_ms, cudnn_fwd);
        check_determinism(tally, cudnn, &c);
        check_lent(tally, &c, &theirs);
        check_pieces(tally, &c, &theirs, cudnn_ms);
    }
    result_free(&mine), result_free(&theirs);
    free(qkv), free(d_out);
    cudaFree(c.qkv), cudaFree(c.d_out);
}

/* A runner that is not deterministic (the executor's default;
 * attention_cudnn.c): cuDNN's backward with dQ summed in an fp32
 * accumulator, against the own
 * kernels (its bits may differ between runs: not compared with the
 * deterministic plan's), its description, and a NOTE of its time beside
 * the deterministic plan's (GPT-2 124M's and 350M's shapes). */
static void test_accumulated_dq(gpu_test_tally *tally, attention_runner *own,
                                attention_runner *cudnn, int B, int T, int C,
                                int NH)
{
    pt_error err;
    attention_runner *accumulating = NULL;
    PT_CHECK(attention_runner_create(&accumulating, ATTENTION_CUDNN, false,
                                     &err),
             &err);
    float *qkv = NULL, *d_out = NULL;
    attention_case c = random_case(B, T, C, NH, &qkv, &d_out);
    print_path(accumulating, &c, "cudnn mode, dQ accumulated");
    const char *described = attention_runner_describe(accumulating);
    int major = 0, minor = 0;
    const char *at = strstr(described, "cuDNN ");
    bool recent = at != NULL &&
                  sscanf(at, "cuDNN %d.%d", &major, &minor) == 2 &&
                  major * 100 + minor >= 906;
    bool accumulated =
        !recent || strstr(described, "accumulator") != NULL;
    gpu_test_expect(tally, accumulated,
                    "dQ accumulated: the description names the accumulator "
                    "(cuDNN 9.6 or later)");
    attention_result mine =
        run_path(tally, own, &c, false, NULL, 0, "own kernels");
    attention_result theirs = run_path(tally, accumulating, &c, true, NULL, 0,
                                       "cuDNN, dQ accumulated");
    char name[160];
    snprintf(name, sizeof name,
             "cuDNN (dQ accumulated) forward B=%d T=%d vs own", B, T);
    gpu_test_compare(tally, name, theirs.out, mine.out, c.out_count,
                     TOL_BF16_CHAIN);
    compare_gradients(tally, &c, theirs.d_qkv, mine.d_qkv,
                      "own (dQ accumulated)");
    double forward_ms = 0.0;
    double deterministic_ms = time_path(cudnn, &c, 10, NULL, 0, &forward_ms);
    double accumulated_ms =
        time_path(accumulating, &c, 10, NULL, 0, &forward_ms);
    printf("NOTE attention B=%d T=%d C=%d NH=%d, cuDNN forward + backward: "
           "deterministic %.3f ms, dQ accumulated %.3f ms\n",
           B, T, C, NH, deterministic_ms, accumulated_ms);
    result_free(&mine), result_free(&theirs);
    free(qkv), free(d_out);
    cudaFree(c.qkv), cudaFree(c.d_out);
    attention_runner_destroy(accumulating);
}

/* auto mode: cuDNN for T = 256, the own kernels for T = 200 (not a
 * multiple of 128); cudnn mode refuses T = 200 with a reason. */
static void test_choice(gpu_test_tally *tally, attention_runner *cudnn)
{
    pt_error err;
    attention_runner *automatic = NULL;
    PT_CHECK(attention_runner_create(&automatic, ATTENTION_AUTO, true, &err), &err);
    bool uses = false;
    PT_CHECK(attention_runner_uses_cudnn(automatic, 2, 256, 128, 2, &uses,
                                         &err),
             &err);
    printf("# auto mode B=2 T=256: %s\n",
           attention_runner_describe(automatic));
    gpu_test_expect(tally, uses, "auto mode takes cuDNN for T=256, D=64");
    PT_CHECK(attention_runner_uses_cudnn(automatic, 2, 200, 128, 2, &uses,
                                         &err),
             &err);
    printf("# auto mode B=2 T=200: %s\n",
           attention_runner_describe(automatic));
    gpu_test_expect(tally, !uses, "auto mode takes the own kernels for T=200");
    attention_runner_destroy(automatic);
    int status = attention_runner_prepare(cudnn, 2, 200, 128, 2, 0, &err);
    printf("# cudnn mode B=2 T=200: %s\n",
           status != 0 ? err.message : "accepted");
    gpu_test_expect(tally, status != 0 && strstr(err.message, "128") != NULL,
                    "cudnn mode refuses T=200, naming the multiple of 128");
}

int main(void)
{
    gpu_test_require_device("test_cuda_attention");
    if (!attention_cudnn_built()) {
        printf("SKIP test_cuda_attention: this build has no cuDNN (meson "
               "option cudnn)\n");
        return GPU_TEST_SKIP;
    }
    gpu_test_tally tally = {0, 0};
    pt_error err;
    attention_runner *own = NULL, *cudnn = NULL;
    PT_CHECK(attention_runner_create(&own, ATTENTION_OWN, true, &err), &err);
    PT_CHECK(attention_runner_create(&cudnn, ATTENTION_CUDNN, true, &err), &err);
    test_shape(&tally, own, cudnn, 2, 256, 128, 2, true);   /* D 64 */
    test_shape(&tally, own, cudnn, 3, 128, 192, 3, true);   /* odd B, NH */
    test_shape(&tally, own, cudnn, 1, 256, 256, 2, true);   /* D 128 */
    test_shape(&tally, own, cudnn, 16, 1024, 768, 12, false); /* 124M */
    test_shape(&tally, own, cudnn, 8, 1024, 1600, 25, false); /* 1.5B */
    test_choice(&tally, cudnn);
    test_accumulated_dq(&tally, own, cudnn, 2, 256, 128, 2);
    test_accumulated_dq(&tally, own, cudnn, 16, 1024, 768, 12);   /* 124M */
    test_accumulated_dq(&tally, own, cudnn, 16, 1024, 1024, 16);  /* 350M */
    attention_runner_destroy(own);
    attention_runner_destroy(cudnn);
    GPU_CHECK(cudaGetLastError());
    return gpu_test_finish(&tally, "test_cuda_attention");
}
