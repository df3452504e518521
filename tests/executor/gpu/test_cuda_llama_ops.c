/*
 * The Llama layer's kernels of the cuda backend (RMSNorm, SwiGLU, RoPE,
 * grouped-query attention; both norms after a residual add) against the cpu reference ops of
 * executor/cpu/cpu.h (ops_llama_cpu.c), forward and backward, on fresh
 * random inputs at a few shapes each: hidden sizes on and off the
 * kernels' vector and block sizes, key/value heads = heads, heads / 4
 * and 1, head sizes 64, 128 and others. Attention runs on every path a
 * stage may take: the plain grouped kernels, the own dispatcher (the
 * tensor-core kernels when KVH == NH) and, in builds with cuDNN, cuDNN's
 * fused attention forced by its runner (and, on two grouped shapes, with
 * dQ accumulated in fp32, the executor's default); then
 * RoPE and attention chained as the layer runs them.
 *
 * Inputs the GPU reads as bf16 are rounded to bf16 before the cpu sees
 * them, so the errors are those of the computation alone (relative L2,
 * gpu_test.h): fp32 results under 1e-4, bf16 outputs under 8e-3, results
 * through bf16 intermediates (attention's P, a rounded gradient rotated
 * again) under 2e-2, the tolerances of test_cuda_ops.c.
 *
 * Usage: test_cuda_llama_ops (exit 0 all passed, 1 a failure, 77 no GPU)
 */
#include "gpu_test.h"

#include "executor/cpu/cpu.h"
#include "executor/cuda/attention_runner.h"

#define TOL_FP32 1e-4
#define TOL_BF16_OUT 8e-3
#define TOL_BF16_CHAIN 2e-2
#define RMSNORM_EPS 1e-5f

static uint64_t rng_state = 0x6A09E667F3BCC909ull;

static float *download_bf16(const pt_bf16 *device, size_t count)
{
    float *host = gpu_test_host(count * sizeof *host);
    gpu_test_download_bf16(host, device, count);
    return host;
}

/* ------------------------------------------------ a norm after an add */

/* cuda_norm_forward_after_add (the stage's residual add in the norm that
 * follows it): the sum rounded to bf16 as the stream keeps it, written
 * in place over the input or apart, and the norm of that sum, against
 * the cpu's norm of the rounded sum; layer norm and RMSNorm, on the
 * register-cached kernel (C <= 2048) and the generic one. */
static void test_norm_after_add(gpu_test_tally *tally, bool rms,
                                bool in_place, int N, int C)
{
    char name[128];
    size_t NC = (size_t)N * C;
    float *inp = gpu_test_random_bf16(NC, 2.0f, &rng_state);
    float *skip = gpu_test_random_bf16(NC, 1.0f, &rng_state);
    float *weight = gpu_test_random((size_t)C, 0.5f, 1.0f, &rng_state);
    float *bias = gpu_test_random((size_t)C, 0.5f, 0.0f, &rng_state);
    float *sum = gpu_test_host(NC * sizeof(float));
    for (size_t i = 0; i < NC; i++)
        sum[i] = inp[i] + skip[i];
    gpu_test_round_bf16(sum, NC);
    float *want = gpu_test_host(NC * sizeof(float));
    float *want_mean = gpu_test_host((size_t)N * sizeof(float));
    float *want_rstd = gpu_test_host((size_t)N * sizeof(float));
    if (rms)
        cpu_rmsnorm_forward(want, want_rstd, sum, weight, RMSNORM_EPS, N, C);
    else
        cpu_layernorm_forward(want, want_mean, want_rstd, sum, weight, bias,
                              N, C);

    pt_bf16 *dev_inp = gpu_test_upload_bf16(inp, NC);
    pt_bf16 *dev_skip = gpu_test_upload_bf16(skip, NC);
    pt_bf16 *dev_sum =
        in_place ? dev_inp : gpu_test_device(NC * sizeof(pt_bf16));
    float *dev_weight = gpu_test_upload(weight, (size_t)C);
    float *dev_bias = gpu_test_upload(bias, (size_t)C);
    pt_bf16 *dev_out = gpu_test_device(NC * sizeof(pt_bf16));
    float *dev_mean = gpu_test_device((size_t)N * sizeof(float));
    float *dev_rstd = gpu_test_device((size_t)N * sizeof(float));
    GPU_CHECK(cuda_norm_forward_after_add(
        dev_out, dev_mean, dev_rstd, dev_sum, dev_inp, dev_skip, dev_weight,
        rms ? NULL : dev_bias, rms, RMSNORM_EPS, N, C, 0));
    float *got_sum = download_bf16(dev_sum, NC);
    float *got = download_bf16(dev_out, NC);
    float *got_rstd = gpu_test_host((size_t)N * sizeof(float));
    gpu_test_download(got_rstd, dev_rstd, (size_t)N);
    const char *what = rms ? "rmsnorm" : "layernorm";
    const char *where = in_place ? "in place" : "apart";
    snprintf(name, sizeof name, "%s after add N=%d C=%d: the sum (%s)", what,
             N, C, where);
    /* the same two bf16 values added in fp32 and rounded once */
    gpu_test_compare(tally, name, got_sum, sum, NC, 0.0);
    snprintf(name, sizeof name, "%s after add N=%d C=%d: out (bf16)", what,
             N, C);
    gpu_test_compare(tally, name, got, want, NC, TOL_BF16_OUT);
    snprintf(name, sizeof name, "%s after add C=%d: rstd", what, C);
    gpu_test_compare(tally, name, got_rstd, want_rstd, (size_t)N, TOL_FP32);
    if (!rms) {
        float *got_mean = gpu_test_host((size_t)N * sizeof(float));
        gpu_test_download(got_mean, dev_mean, (size_t)N);
        snprintf(name, sizeof name, "layernorm after add C=%d: mean", C);
        gpu_test_compare(tally, name, got_mean, want_mean, (size_t)N,
                         TOL_FP32);
    }
}

/* ------------------------------------------------------------- rmsnorm */

/* The forward's output and rstd; the backward with a residual gradient
 * and a non-zero weight gradient, called twice (the weight gradient
 * accumulates; the second call finds the scratch's counters zeroed). */
static void test_rmsnorm(gpu_test_tally *tally, int N, int C)
{
    char name[112];
    size_t NC = (size_t)N * C;
    /* the input is the bf16 residual stream */
    float *inp = gpu_test_random_bf16(NC, 2.0f, &rng_state);
    float *weight = gpu_test_random((size_t)C, 0.5f, 1.0f, &rng_state);
    float *want = gpu_test_host(NC * sizeof(float));
    float *want_rstd = gpu_test_host((size_t)N * sizeof(float));
    cpu_rmsnorm_forward(want, want_rstd, inp, weight, RMSNORM_EPS, N, C);

    pt_bf16 *dev_inp = gpu_test_upload_bf16(inp, NC);
    float *dev_weight = gpu_test_upload(weight, (size_t)C);
    pt_bf16 *dev_out = gpu_test_device(NC * sizeof(pt_bf16));
    float *dev_rstd = gpu_test_device((size_t)N * sizeof(float));
    GPU_CHECK(cuda_rmsnorm_forward(dev_out, dev_rstd, dev_inp, dev_weight,
                                   RMSNORM_EPS, N, C, 0));
    float *got = download_bf16(dev_out, NC);
    float *got_rstd = gpu_test_host((size_t)N * sizeof(float));
    gpu_test_download(got_rstd, dev_rstd, (size_t)N);
    snprintf(name, sizeof name, "rmsnorm forward N=%d C=%d (bf16 out)", N, C);
    gpu_test_compare(tally, name, got, want, NC, TOL_BF16_OUT);
    snprintf(name, sizeof name, "rmsnorm forward rstd C=%d", C);
    gpu_test_compare(tally, name, got_rstd, want_rstd, (size_t)N, TOL_FP32);

    float *grad_out = gpu_test_random_bf16(NC, 1.0f, &rng_state);
    float *residual = gpu_test_random(NC, 1.0f, 0.0f, &rng_state);
    float *want_dinp = gpu_test_host(NC * sizeof(float));
    memcpy(want_dinp, residual, NC * sizeof(float));
    float *want_dw = gpu_test_random((size_t)C, 1.0f, 0.0f, &rng_state);
    float *dev_dw = gpu_test_upload(want_dw, (size_t)C);
    cpu_rmsnorm_backward(want_dinp, want_dw, grad_out, inp, weight,
                         want_rstd, N, C);
    cpu_rmsnorm_backward(NULL, want_dw, grad_out, inp, weight, want_rstd, N,
                         C);
    pt_bf16 *dev_grad_out = gpu_test_upload_bf16(grad_out, NC);
    float *dev_residual = gpu_test_upload(residual, NC);
    /* the norms share the layer norm's scratch (counters zeroed once) */
    float *scratch = gpu_test_device_zeroed(
        cuda_layernorm_backward_scratch(N, C) * sizeof(float));
    float *dev_dinp = gpu_test_device(NC * sizeof(float));
    pt_bf16 *dev_dinp_bf16 = gpu_test_device(NC * sizeof(pt_bf16));
    for (int call = 0; call < 2; call++)
        GPU_CHECK(cuda_rmsnorm_backward(dev_dinp, dev_dinp_bf16,
                                        cuda_grad_fp32(dev_dw), dev_residual,
                                        NULL, dev_grad_out, dev_inp,
                                        dev_weight, dev_rstd, scratch, N, C,
                                        0));
    float *got_dinp = gpu_test_host(NC * sizeof(float));
    float *got_dw = gpu_test_host((size_t)C * sizeof(float));
    gpu_test_download(got_dinp, dev_dinp, NC);
    gpu_test_download(got_dw, dev_dw, (size_t)C);
    snprintf(name, sizeof name, "rmsnorm backward d_inp N=%d C=%d", N, C);
    gpu_test_compare(tally, name, got_dinp, want_dinp, NC, TOL_FP32);
    snprintf(name, sizeof name, "rmsnorm backward d_weight C=%d (2 calls)",
             C);
    gpu_test_compare(tally, name, got_dw, want_dw, (size_t)C, TOL_FP32);
    float *got_copy = download_bf16(dev_dinp_bf16, NC);
    snprintf(name, sizeof name, "rmsnorm backward d_inp bf16 copy C=%d", C);
    gpu_test_compare(tally, name, got_copy, want_dinp, NC, TOL_BF16_OUT);

    /* the stream gradient in bf16 alone, in place, as the cuda stage
     * keeps it: d_inp NULL, the residual read from the bf16 buffer the
     * result goes back to; against the sum over the rounded residual */
    memcpy(want_dinp, residual, NC * sizeof(float));
    gpu_test_round_bf16(want_dinp, NC);
    pt_bf16 *dev_stream = gpu_test_upload_bf16(want_dinp, NC);
    cpu_rmsnorm_backward(want_dinp, NULL, grad_out, inp, weight, want_rstd,
                         N, C);
    GPU_CHECK(cuda_rmsnorm_backward(NULL, dev_stream, cuda_grad_fp32(NULL),
                                    NULL, dev_stream, dev_grad_out, dev_inp,
                                    dev_weight, dev_rstd, scratch, N, C, 0));
    gpu_test_download_bf16(got_copy, dev_stream, NC);
    snprintf(name, sizeof name,
             "rmsnorm backward bf16 stream gradient in place C=%d", C);
    gpu_test_compare(tally, name, got_copy, want_dinp, NC, TOL_BF16_OUT);
    snprintf(name, sizeof name, "rmsnorm C=%d", C);
    gpu_test_norm_output_again(tally, name, dev_out, dev_grad_out,
                               dev_inp, dev_weight, NULL, NULL, dev_rstd,
                               true, N, C);
    cudaFree(dev_stream);

    free(inp), free(weight), free(want), free(want_rstd), free(got);
    free(got_rstd), free(grad_out), free(residual), free(want_dinp);
    free(want_dw), free(got_dinp), free(got_dw), free(got_copy);
    cudaFree(dev_inp), cudaFree(dev_weight), cudaFree(dev_out);
    cudaFree(dev_rstd), cudaFree(dev_dw), cudaFree(dev_grad_out);
    cudaFree(dev_residual), cudaFree(dev_dinp), cudaFree(dev_dinp_bf16);
    cudaFree(scratch);
}

/* -------------------------------------------------------------- swiglu */

/* Forward; backward into its own buffer and in place over the fc1
 * output (the same bits expected); both in one pass (the same bits as
 * the two). */
static void test_swiglu(gpu_test_tally *tally, int N, int F)
{
    char name[112];
    size_t in_count = (size_t)N * 2 * F, out_count = (size_t)N * F;
    float *inp = gpu_test_random_bf16(in_count, 4.0f, &rng_state);
    float *want = gpu_test_host(out_count * sizeof(float));
    cpu_swiglu_forward(want, inp, N, F);
    pt_bf16 *dev_inp = gpu_test_upload_bf16(inp, in_count);
    pt_bf16 *dev_out = gpu_test_device(out_count * sizeof(pt_bf16));
    GPU_CHECK(cuda_swiglu_forward(dev_out, dev_inp, N, F, 0));
    float *got = download_bf16(dev_out, out_count);
    snprintf(name, sizeof name, "swiglu forward N=%d F=%d (bf16 out)", N, F);
    gpu_test_compare(tally, name, got, want, out_count, TOL_BF16_OUT);

    float *grad_out = gpu_test_random_bf16(out_count, 1.0f, &rng_state);
    float *want_dinp = gpu_test_host(in_count * sizeof(float));
    cpu_swiglu_backward(want_dinp, grad_out, inp, N, F);
    pt_bf16 *dev_grad_out = gpu_test_upload_bf16(grad_out, out_count);
    pt_bf16 *dev_dinp = gpu_test_device(in_count * sizeof(pt_bf16));
    GPU_CHECK(cuda_swiglu_backward(dev_dinp, dev_grad_out, dev_inp, N, F, 0));
    float *got_dinp = download_bf16(dev_dinp, in_count);
    snprintf(name, sizeof name, "swiglu backward d_gate, d_up N=%d F=%d", N,
             F);
    gpu_test_compare(tally, name, got_dinp, want_dinp, in_count,
                     TOL_BF16_OUT);
    GPU_CHECK(cuda_swiglu_backward(dev_inp, dev_grad_out, dev_inp, N, F, 0));
    float *got_inplace = download_bf16(dev_inp, in_count);
    snprintf(name, sizeof name, "swiglu backward in place F=%d: same bits",
             F);
    gpu_test_expect(tally,
                    memcmp(got_inplace, got_dinp,
                           in_count * sizeof(float)) == 0,
                    name);

    /* the backward and the forward in one pass, in place over the fc1
     * output and over d_out, as a recomputing layer calls it: the two
     * kernels' bits */
    pt_bf16 *dev_fc = gpu_test_upload_bf16(inp, in_count);
    pt_bf16 *dev_both = gpu_test_upload_bf16(grad_out, out_count);
    GPU_CHECK(cuda_swiglu_backward_and_forward(dev_fc, dev_both, dev_fc, N, F,
                                               0));
    float *got_fused_dinp = download_bf16(dev_fc, in_count);
    float *got_fused_out = download_bf16(dev_both, out_count);
    snprintf(name, sizeof name,
             "swiglu backward and forward F=%d: the backward's bits", F);
    gpu_test_expect(tally,
                    memcmp(got_fused_dinp, got_dinp,
                           in_count * sizeof(float)) == 0,
                    name);
    snprintf(name, sizeof name,
             "swiglu backward and forward F=%d: the forward's bits", F);
    gpu_test_expect(tally,
                    memcmp(got_fused_out, got, out_count * sizeof(float)) ==
                        0,
                    name);

    free(inp), free(want), free(got), free(grad_out), free(want_dinp);
    free(got_dinp), free(got_inplace), free(got_fused_dinp);
    free(got_fused_out);
    cudaFree(dev_inp), cudaFree(dev_out), cudaFree(dev_grad_out);
    cudaFree(dev_dinp), cudaFree(dev_fc), cudaFree(dev_both);
}

/* ---------------------------------------------------------------- rope */

/* A qkv product of NH query, KVH key and KVH value heads: the queries
 * and keys turned in place, the values passed; then the backward on a
 * gradient of the same layout. */
static void test_rope(gpu_test_tally *tally, int B, int T, int NH, int KVH,
                      int hs, double base)
{
    char name[128];
    int width = (NH + 2 * KVH) * hs, heads = NH + KVH;
    size_t count = (size_t)B * T * width;
    float *x = gpu_test_random_bf16(count, 2.0f, &rng_state);
    float *want = gpu_test_host(count * sizeof(float));
    cpu_rope_forward(want, x, base, B, T, width, heads, hs);
    pt_bf16 *dev_x = gpu_test_upload_bf16(x, count);
    GPU_CHECK(cuda_rope_forward(dev_x, base, B, T, width, heads, hs, 0));
    float *got = download_bf16(dev_x, count);
    snprintf(name, sizeof name,
             "rope forward B=%d T=%d NH=%d KVH=%d hs=%d base=%.0f", B, T, NH,
             KVH, hs, base);
    gpu_test_compare(tally, name, got, want, count, TOL_BF16_OUT);

    float *grad = gpu_test_random_bf16(count, 1.0f, &rng_state);
    float *want_grad = gpu_test_host(count * sizeof(float));
    cpu_rope_backward(want_grad, grad, base, B, T, width, heads, hs);
    pt_bf16 *dev_grad = gpu_test_upload_bf16(grad, count);
    GPU_CHECK(cuda_rope_backward(dev_grad, base, B, T, width, heads, hs, 0));
    float *got_grad = download_bf16(dev_grad, count);
    snprintf(name, sizeof name, "rope backward B=%d T=%d NH=%d KVH=%d hs=%d",
             B, T, NH, KVH, hs);
    gpu_test_compare(tally, name, got_grad, want_grad, count, TOL_BF16_OUT);

    free(x), free(want), free(got), free(grad), free(want_grad);
    free(got_grad);
    cudaFree(dev_x), cudaFree(dev_grad);
}

/* ------------------------------------------------------------ regroup */

/* The regrouping pass's two directions share one signature. */
typedef cudaError_t (*regroup_pass)(pt_bf16 *, const pt_bf16 *, double, bool,
                                    int, int, int, int, int, cudaStream_t);

/* One pass of `count` values: `host` uploaded into `in`, turned into `out`,
 * read back (the caller frees it). */
static float *regroup_on_gpu(regroup_pass pass, pt_bf16 *out, pt_bf16 *in,
                             const float *host, size_t count, double base,
                             bool turn, int B, int T, int NH, int KVH, int hs)
{
    gpu_test_upload_bf16_into(in, host, count);
    GPU_CHECK(pass(out, in, base, turn, B, T, NH, KVH, hs, 0));
    return download_bf16(out, count);
}

/* cuda_qkv_to_heads and cuda_qkv_to_grouped (rope.cu) against the cpu's
 * regrouping and RoPE; head sizes that are multiples of 16 take the
 * rows kernel on aligned tensors, the others (and a tensor one element
 * off 16 bytes) the one-thread-per-pair kernel: the same bits asked of
 * the two where both can run. */
static void test_regroup(gpu_test_tally *tally, int B, int T, int NH,
                         int KVH, int hs, double base, bool turn)
{
    char name[144];
    int width = (NH + 2 * KVH) * hs;
    size_t rows = (size_t)B * T, count = rows * width;
    float *grouped = gpu_test_random_bf16(count, 2.0f, &rng_state);
    float *heads = gpu_test_host(count * sizeof(float));
    float *want = gpu_test_host(count * sizeof(float));
    cpu_qkv_regroup(heads, grouped, rows, NH, KVH, hs, true);
    /* no heads turned: the rows copied */
    cpu_rope_forward(want, heads, base, B, T, width, turn ? NH + KVH : 0, hs);
    /* one element more: the inputs again one element off 16 bytes */
    pt_bf16 *dev_in = gpu_test_device((count + 1) * sizeof(pt_bf16));
    pt_bf16 *dev_out = gpu_test_device((count + 1) * sizeof(pt_bf16));
    float *got = regroup_on_gpu(cuda_qkv_to_heads, dev_out, dev_in, grouped,
                                count, base, turn, B, T, NH, KVH, hs);
    snprintf(name, sizeof name,
             "qkv to heads B=%d T=%d NH=%d KVH=%d hs=%d%s", B, T, NH, KVH,
             hs, turn ? " turned" : "");
    gpu_test_compare(tally, name, got, want, count, TOL_BF16_OUT);
    if (hs % 16 == 0) { /* off 16 bytes: the per-pair kernel instead */
        float *got_off =
            regroup_on_gpu(cuda_qkv_to_heads, dev_out + 1, dev_in + 1,
                           grouped, count, base, turn, B, T, NH, KVH, hs);
        snprintf(name, sizeof name,
                 "qkv to heads hs=%d, per-pair kernel: the same bits", hs);
        gpu_test_expect(tally,
                        memcmp(got, got_off, count * sizeof(float)) == 0,
                        name);
        free(got_off);
    }

    float *grad = gpu_test_random_bf16(count, 1.0f, &rng_state);
    float *turned = gpu_test_host(count * sizeof(float));
    float *want_grad = gpu_test_host(count * sizeof(float));
    cpu_rope_backward(turned, grad, base, B, T, width, turn ? NH + KVH : 0,
                      hs);
    cpu_qkv_regroup(want_grad, turned, rows, NH, KVH, hs, false);
    float *got_grad =
        regroup_on_gpu(cuda_qkv_to_grouped, dev_out, dev_in, grad, count, base,
                       turn, B, T, NH, KVH, hs);
    snprintf(name, sizeof name,
             "qkv to grouped B=%d T=%d NH=%d KVH=%d hs=%d%s", B, T, NH, KVH,
             hs, turn ? " turned back" : "");
    gpu_test_compare(tally, name, got_grad, want_grad, count, TOL_BF16_OUT);

    free(grouped), free(heads), free(want), free(got);
    free(grad), free(turned), free(want_grad), free(got_grad);
    cudaFree(dev_in), cudaFree(dev_out);
}

/* ------------------------------------------------- grouped-query attention */

/* One attention problem: sizes, the host inputs (qkv already turned by
 * RoPE when the case chains it) and the cpu's answers. */
typedef struct gqa_case {
    int B, T, NH, KVH, D;
    double rope_base;           /* 0: no RoPE before the attention */
    int width;                  /* (NH + 2 KVH) D */
    size_t N, qkv_count, out_count;
    float *qkv, *d_out;         /* host, bf16-rounded */
    float *want_out, *want_dqkv;
} gqa_case;

/* The cpu reference: RoPE (when chained), the attention forward and
 * backward, and the backward through RoPE. */
static gqa_case gqa_case_make(int B, int T, int NH, int KVH, int D,
                              double rope_base)
{
    gqa_case c = {.B = B, .T = T, .NH = NH, .KVH = KVH, .D = D,
                  .rope_base = rope_base};
    c.width = (NH + 2 * KVH) * D;
    c.N = (size_t)B * T;
    c.qkv_count = c.N * c.width;
    c.out_count = c.N * NH * D;
    c.qkv = gpu_test_random_bf16(c.qkv_count, 1.5f, &rng_state);
    c.d_out = gpu_test_random_bf16(c.out_count, 1.0f, &rng_state);
    c.want_out = gpu_test_host(c.out_count * sizeof(float));
    c.want_dqkv = gpu_test_host(c.qkv_count * sizeof(float));
    float *turned = gpu_test_host(c.qkv_count * sizeof(float));
    memcpy(turned, c.qkv, c.qkv_count * sizeof(float));
    if (rope_base > 0.0) {
        cpu_rope_forward(turned, c.qkv, rope_base, B, T, c.width, NH + KVH,
                         D);
        gpu_test_round_bf16(turned, c.qkv_count); /* as the GPU keeps it */
    }
    float *probs = gpu_test_host((size_t)B * NH * T * T * sizeof(float));
    float *row = gpu_test_host((size_t)T * sizeof(float));
    cpu_gqa_attention_forward(c.want_out, probs, turned, B, T, NH, KVH, D);
    float *d_turned = gpu_test_host(c.qkv_count * sizeof(float));
    cpu_gqa_attention_backward(d_turned, c.d_out, turned, probs, row, B, T,
                               NH, KVH, D);
    if (rope_base > 0.0)
        cpu_rope_backward(c.want_dqkv, d_turned, rope_base, B, T, c.width,
                          NH + KVH, D);
    else
        memcpy(c.want_dqkv, d_turned, c.qkv_count * sizeof(float));
    free(turned), free(probs), free(row), free(d_turned);
    return c;
}

static void gqa_case_free(gqa_case *c)
{
    free(c->qkv), free(c->d_out), free(c->want_out), free(c->want_dqkv);
}

/* The attention paths under test. */
typedef enum gqa_path {
    PATH_PLAIN,                 /* cuda_gqa_attention_*_plain */
    PATH_OWN,                   /* cuda_gqa_attention_* */
    PATH_RUNNER,                /* attention_runner_*_gqa (its mode) */
} gqa_path;

static const char *path_name(gqa_path path, attention_runner *runner)
{
    if (path == PATH_PLAIN)
        return "plain";
    if (path == PATH_OWN)
        return "own";
    return strstr(attention_runner_describe(runner), "cuDNN") ==
                   attention_runner_describe(runner)
               ? "cuDNN"
               : "runner";
}

/* Forward and backward on one path, RoPE around them when chained;
 * false (a FAIL line printed) when a call failed. */
static bool gqa_run(gpu_test_tally *tally, const gqa_case *c, gqa_path path,
                    attention_runner *runner, pt_bf16 *qkv, pt_bf16 *d_out,
                    pt_bf16 *out, pt_bf16 *d_qkv, float *lse, float *scratch)
{
    pt_error err = {0};
    int B = c->B, T = c->T, NH = c->NH, KVH = c->KVH, D = c->D, status = 0;
    if (c->rope_base > 0.0)
        GPU_CHECK(cuda_rope_forward(qkv, c->rope_base, B, T, c->width,
                                    NH + KVH, D, 0));
    if (path == PATH_PLAIN) {
        GPU_CHECK(cuda_gqa_attention_forward_plain(out, lse, qkv, B, T, NH,
                                                   KVH, D, 0));
        GPU_CHECK(cuda_gqa_attention_backward_plain(d_qkv, d_out, qkv, out,
                                                    lse, scratch, B, T, NH,
                                                    KVH, D, 0));
    } else if (path == PATH_OWN) {
        GPU_CHECK(cuda_gqa_attention_forward(out, lse, qkv, B, T, NH, KVH, D,
                                             0));
        GPU_CHECK(cuda_gqa_attention_backward(d_qkv, d_out, qkv, out, lse,
                                              scratch, B, T, NH, KVH, D, 0));
    } else {
        status = attention_runner_forward_gqa(runner, out, lse, qkv, B, T,
                                              NH, KVH, D, 0, &err);
        if (status == 0)
            status = attention_runner_backward_gqa(
                runner, d_qkv, d_out, qkv, out, lse, scratch, B, T, NH, KVH,
                D, NULL, 0, 0, &err);
    }
    if (status != 0) {
        printf("FAIL attention B=%d T=%d NH=%d KVH=%d D=%d on the runner: "
               "%s\n",
               B, T, NH, KVH, D, err.message);
        tally->failed++;
        return false;
    }
    if (c->rope_base > 0.0)
        GPU_CHECK(cuda_rope_backward(d_qkv, c->rope_base, B, T, c->width,
                                     NH + KVH, D, 0));
    return true;
}

/* Columns [first, first + count) of each width-wide row of rows. */
static float *columns(const float *rows, size_t N, int width, int first,
                      int count)
{
    float *part = gpu_test_host(N * count * sizeof *part);
    for (size_t n = 0; n < N; n++)
        memcpy(part + n * count, rows + n * width + first,
               (size_t)count * sizeof *part);
    return part;
}

/* out, then dQ, dK and dV each on its own line (a wrong part must not
 * hide in the others). */
static void gqa_compare(gpu_test_tally *tally, const gqa_case *c,
                        const char *path, const float *out,
                        const float *d_qkv)
{
    char name[160], shape[80];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d KVH=%d D=%d%s", c->B,
             c->T, c->NH, c->KVH, c->D, c->rope_base > 0.0 ? " +rope" : "");
    snprintf(name, sizeof name, "gqa %s forward %s", path, shape);
    gpu_test_compare(tally, name, out, c->want_out, c->out_count,
                     TOL_BF16_CHAIN);
    const char *parts[3] = {"dQ", "dK", "dV"};
    int firsts[3] = {0, c->NH * c->D, (c->NH + c->KVH) * c->D};
    int counts[3] = {c->NH * c->D, c->KVH * c->D, c->KVH * c->D};
    for (int p = 0; p < 3; p++) {
        float *got = columns(d_qkv, c->N, c->width, firsts[p], counts[p]);
        float *want =
            columns(c->want_dqkv, c->N, c->width, firsts[p], counts[p]);
        snprintf(name, sizeof name, "gqa %s backward %s %s", path, parts[p],
                 shape);
        gpu_test_compare(tally, name, got, want, c->N * counts[p],
                         TOL_BF16_CHAIN);
        free(got), free(want);
    }
}

/* One path of one case from fresh device copies of its inputs. */
static void test_gqa_path(gpu_test_tally *tally, const gqa_case *c,
                          gqa_path path, attention_runner *runner)
{
    pt_bf16 *qkv = gpu_test_upload_bf16(c->qkv, c->qkv_count);
    pt_bf16 *d_out = gpu_test_upload_bf16(c->d_out, c->out_count);
    pt_bf16 *out = gpu_test_device(c->out_count * sizeof(pt_bf16));
    pt_bf16 *d_qkv = gpu_test_device(c->qkv_count * sizeof(pt_bf16));
    size_t rows = (size_t)c->B * c->NH * c->T;
    float *lse = gpu_test_device(rows * sizeof(float));
    float *scratch = gpu_test_device(
        cuda_attention_backward_scratch(c->B, c->T, c->NH) * sizeof(float));
    if (gqa_run(tally, c, path, runner, qkv, d_out, out, d_qkv, lse,
                scratch)) {
        float *got_out = download_bf16(out, c->out_count);
        float *got_dqkv = download_bf16(d_qkv, c->qkv_count);
        gqa_compare(tally, c, path_name(path, runner), got_out, got_dqkv);
        free(got_out), free(got_dqkv);
    }
    cudaFree(qkv), cudaFree(d_out), cudaFree(out), cudaFree(d_qkv);
    cudaFree(lse), cudaFree(scratch);
}

/* Every path that takes the shape: the plain kernels (shared memory
 * permitting), the own dispatcher, and cuDNN when `cudnn` is a runner
 * forced to it (NULL without cuDNN in the build). */
static void test_gqa(gpu_test_tally *tally, attention_runner *cudnn, int B,
                     int T, int NH, int KVH, int D, double rope_base)
{
    gqa_case c = gqa_case_make(B, T, NH, KVH, D, rope_base);
    test_gqa_path(tally, &c, PATH_PLAIN, NULL);
    test_gqa_path(tally, &c, PATH_OWN, NULL);
    if (cudnn != NULL && T % 128 == 0 && D % 8 == 0 && D <= 128) {
        pt_error err = {0};
        if (attention_runner_prepare_gqa(cudnn, B, T, NH, KVH, D, 0, &err) !=
            0) {
            printf("FAIL cuDNN plans B=%d T=%d NH=%d KVH=%d D=%d: %s\n", B,
                   T, NH, KVH, D, err.message);
            tally->failed++;
        } else {
            printf("# %s\n", attention_runner_describe(cudnn));
            test_gqa_path(tally, &c, PATH_RUNNER, cudnn);
        }
    }
    gqa_case_free(&c);
}

/* The runner in auto mode on a shape cuDNN does not take (T not a
 * multiple of 128): the grouped own kernels, named so. */
static void test_gqa_auto(gpu_test_tally *tally)
{
    pt_error err = {0};
    attention_runner *automatic = NULL;
    PT_CHECK(attention_runner_create(&automatic, ATTENTION_AUTO, true, &err), &err);
    gqa_case c = gqa_case_make(2, 100, 8, 2, 64, 10000.0);
    test_gqa_path(tally, &c, PATH_RUNNER, automatic);
    printf("# auto, T=100: %s\n", attention_runner_describe(automatic));
    gpu_test_expect(tally,
                    strstr(attention_runner_describe(automatic),
                           "attention_plain.cu, grouped") != NULL,
                    "auto mode runs T=100 with 2 of 8 key/value heads on "
                    "the grouped own kernels");
    gqa_case_free(&c);
    attention_runner_destroy(automatic);
}

int main(void)
{
    gpu_test_require_device("test_cuda_llama_ops");
    gpu_test_tally tally = {0, 0};
    /* fused backward with 1, 2 and 4 channel groups a thread, C not a
     * multiple of 256 threads x 8, the generic kernels above 8192 and
     * for C % 8 != 0 (the scalar path) */
    test_rmsnorm(&tally, 300, 768);
    test_rmsnorm(&tally, 2500, 1000);
    /* the warp-row kernel at 48 KiB of sums a block (G = 6: a launch
     * that must ask for it), and at Llama-3.2-1B's 2048 */
    test_rmsnorm(&tally, 700, 1536);
    test_rmsnorm(&tally, 1000, 2048);
    test_rmsnorm(&tally, 200, 4096);
    test_rmsnorm(&tally, 64, 8192);
    test_rmsnorm(&tally, 40, 12288);
    test_rmsnorm(&tally, 77, 100);
    /* the cached kernel (768, 2048), the generic one (4096; 100 scalar) */
    test_norm_after_add(&tally, false, true, 300, 768);
    test_norm_after_add(&tally, false, false, 100, 2048);
    test_norm_after_add(&tally, false, true, 64, 4096);
    test_norm_after_add(&tally, true, true, 200, 2048);
    test_norm_after_add(&tally, true, false, 64, 4096);
    test_norm_after_add(&tally, true, true, 77, 100);
    test_swiglu(&tally, 64, 1024);
    test_swiglu(&tally, 16, 14336); /* Llama-3-8B's F */
    test_swiglu(&tally, 33, 1000);  /* F % 256 != 0 */
    test_swiglu(&tally, 17, 1001);  /* F % 8 != 0: one channel a thread */
    test_rope(&tally, 2, 64, 4, 4, 64, 10000.0);
    test_rope(&tally, 1, 4096, 8, 2, 128, 500000.0); /* late positions */
    test_rope(&tally, 3, 50, 6, 1, 80, 10000.0);     /* 40 pairs a head */
    test_regroup(&tally, 2, 64, 8, 2, 64, 10000.0, true);
    test_regroup(&tally, 1, 256, 32, 8, 64, 500000.0, true); /* 3.2-1B's */
    test_regroup(&tally, 1, 128, 8, 2, 128, 500000.0, true);
    test_regroup(&tally, 3, 50, 6, 2, 72, 10000.0, true); /* hs % 16 != 0 */
    test_regroup(&tally, 2, 32, 4, 4, 64, 10000.0, false); /* no RoPE */

    attention_runner *cudnn = NULL;
    if (attention_cudnn_built()) {
        pt_error err = {0};
        PT_CHECK(attention_runner_create(&cudnn, ATTENTION_CUDNN, true, &err),
                 &err);
    } else {
        printf("# this build has no cuDNN: its attention is not tested\n");
    }
    test_gqa(&tally, cudnn, 2, 128, 8, 8, 64, 0.0);   /* KVH = NH */
    test_gqa(&tally, cudnn, 2, 128, 8, 2, 64, 0.0);   /* NH / 4 */
    test_gqa(&tally, cudnn, 2, 128, 8, 1, 64, 0.0);   /* one kv head */
    test_gqa(&tally, cudnn, 1, 256, 4, 1, 128, 0.0);  /* D 128 */
    test_gqa(&tally, cudnn, 2, 128, 12, 3, 32, 0.0); /* D 32: no mma kernels */
    test_gqa(&tally, cudnn, 2, 70, 8, 2, 48, 0.0);    /* odd T, D 48 */
    test_gqa(&tally, cudnn, 1, 256, 8, 2, 128, 500000.0); /* RoPE chained */
    test_gqa(&tally, cudnn, 2, 128, 4, 4, 64, 10000.0);
    test_gqa_auto(&tally);
    if (cudnn != NULL) {
        /* cuDNN's backward with dQ summed in an fp32 accumulator (a
         * runner not deterministic, the executor's default): the same
         * comparisons on grouped shapes */
        attention_runner *accumulating = NULL;
        pt_error err = {0};
        PT_CHECK(attention_runner_create(&accumulating, ATTENTION_CUDNN,
                                         false, &err),
                 &err);
        test_gqa(&tally, accumulating, 2, 128, 8, 2, 64, 0.0);
        test_gqa(&tally, accumulating, 1, 256, 4, 1, 128, 0.0);
        attention_runner_destroy(accumulating);
    }
    attention_runner_destroy(cudnn);
    GPU_CHECK(cudaGetLastError());
    return gpu_test_finish(&tally, "test_cuda_llama_ops");
}
