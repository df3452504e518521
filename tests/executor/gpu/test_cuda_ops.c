/*
 * Each kernel and product of the cuda backend against the cpu reference
 * op of executor/cpu/cpu.h, on fresh random inputs (the tensor-parallel kernels
 * against the whole op, their shards put together on the host). Inputs the GPU reads as bf16
 * are rounded to bf16 before the cpu sees them, so the errors below are
 * those of the computation alone: fp32 kernels must land under 1e-4,
 * kernels with bf16 outputs or bf16 intermediates (attention's P, the
 * products) under 1e-2.
 */
#include "gpu_test.h"

#include "executor/cuda/gemm.h"
#include "executor/cpu/cpu.h"

#define TOL_FP32 1e-4
#define TOL_BF16_OUT 8e-3
#define TOL_BF16_CHAIN 2e-2

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float *random_host(size_t count, float scale, float offset)
{
    return gpu_test_random(count, scale, offset, &rng_state);
}

static float *random_bf16_host(size_t count, float scale)
{
    return gpu_test_random_bf16(count, scale, &rng_state);
}

/* ----------------------------------------------------------- embedding */

static void test_embedding(gpu_test_tally *tally)
{
    int B = 3, T = 40, C = 96, V = 50;
    int N = B * T;
    float *wte = random_host((size_t)V * C, 1.0f, 0.0f);
    float *wpe = random_host((size_t)T * C, 1.0f, 0.0f);
    uint32_t *tokens = gpu_test_host((size_t)N * sizeof *tokens);
    for (int i = 0; i < N; i++) /* few distinct tokens: many repeats */
        tokens[i] = (uint32_t)(gpu_test_uniform(&rng_state) * 7) * 3;
    float *want = gpu_test_host((size_t)N * C * sizeof *want);
    float *got = gpu_test_host((size_t)N * C * sizeof *got);
    cpu_embedding_forward(want, tokens, wte, wpe, B, T, C);

    float *d_wte = gpu_test_upload(wte, (size_t)V * C);
    float *d_wpe = gpu_test_upload(wpe, (size_t)T * C);
    uint32_t *d_tokens = gpu_test_device((size_t)N * sizeof *d_tokens);
    GPU_CHECK(cudaMemcpy(d_tokens, tokens, (size_t)N * sizeof *tokens,
                         cudaMemcpyHostToDevice));
    /* the bf16 stream: the fp32 sum rounded once, as the host rounds */
    gpu_test_round_bf16(want, (size_t)N * C);
    pt_bf16 *d_out = gpu_test_device((size_t)N * C * sizeof(pt_bf16));
    GPU_CHECK(cuda_embedding_forward(d_out, d_tokens, d_wte, d_wpe, B, T, C,
                                     0));
    gpu_test_download_bf16(got, d_out, (size_t)N * C);
    gpu_test_compare(tally, "embedding forward (bf16 stream)", got, want,
                     (size_t)N * C, 1e-7);

    /* backward: gradients start non-zero to check that they are added */
    float *grad_out = random_host((size_t)N * C, 1.0f, 0.0f);
    float *want_wte = random_host((size_t)V * C, 1.0f, 0.0f);
    float *want_wpe = random_host((size_t)T * C, 1.0f, 0.0f);
    float *dev_grad_wte = gpu_test_upload(want_wte, (size_t)V * C);
    float *dev_grad_wpe = gpu_test_upload(want_wpe, (size_t)T * C);
    cpu_embedding_backward(want_wte, want_wpe, grad_out, tokens, B, T, C);

    embedding_plan plan = {
        .starts = gpu_test_host((size_t)(N + 1) * sizeof(int)),
        .rows = gpu_test_host((size_t)N * sizeof(int)),
        .tokens = gpu_test_host((size_t)N * sizeof(uint32_t)),
    };
    void *counts = calloc(1, embedding_plan_scratch_bytes(V));
    embedding_plan_build(&plan, tokens, N, V, counts);
    int *d_starts = gpu_test_device((size_t)(N + 1) * sizeof(int));
    int *d_rows = gpu_test_device((size_t)N * sizeof(int));
    uint32_t *d_group_tokens = gpu_test_device((size_t)N * sizeof(uint32_t));
    gpu_test_upload_embedding_plan(&plan, N, d_starts, d_rows,
                                   d_group_tokens);
    float *dev_grad_out = gpu_test_upload(grad_out, (size_t)N * C);
    GPU_CHECK(cuda_embedding_backward(cuda_grad_fp32(dev_grad_wte),
                                      cuda_grad_fp32(dev_grad_wpe),
                                      dev_grad_out, d_starts, d_rows,
                                      d_group_tokens, plan.unique_tokens, B,
                                      T, C, 0));
    float *got_wte = gpu_test_host((size_t)V * C * sizeof(float));
    float *got_wpe = gpu_test_host((size_t)T * C * sizeof(float));
    gpu_test_download(got_wte, dev_grad_wte, (size_t)V * C);
    gpu_test_download(got_wpe, dev_grad_wpe, (size_t)T * C);
    gpu_test_compare(tally, "embedding backward (token table)", got_wte,
                     want_wte, (size_t)V * C, 1e-6);
    gpu_test_compare(tally, "embedding backward (position table)", got_wpe,
                     want_wpe, (size_t)T * C, 1e-6);
    free(wte), free(wpe), free(tokens), free(want), free(got);
    free(grad_out), free(want_wte), free(want_wpe), free(got_wte);
    free(got_wpe), free(plan.starts), free(plan.rows), free(plan.tokens);
    free(counts);
    cudaFree(d_wte), cudaFree(d_wpe), cudaFree(d_tokens), cudaFree(d_out);
    cudaFree(dev_grad_wte), cudaFree(dev_grad_wpe), cudaFree(d_starts);
    cudaFree(d_rows), cudaFree(d_group_tokens), cudaFree(dev_grad_out);
}

/* The bf16 stream from an fp32 sum (+ positions, or + bias + residual)
 * and from a bf16 one (+ bias + residual), against the host's fp32 sums
 * rounded once; then widened back to fp32 exactly. */
static void test_stream_from(gpu_test_tally *tally, int N, int C, int T)
{
    size_t NC = (size_t)N * C;
    float *in = random_host(NC, 1.0f, 0.0f);
    float *half = random_bf16_host(NC, 1.0f);
    float *rows = random_host((size_t)T * C, 1.0f, 0.0f);
    float *residual = random_bf16_host(NC, 1.0f);
    float *want = gpu_test_host(NC * sizeof *want);
    float *got = gpu_test_host(NC * sizeof *got);
    float *d_in = gpu_test_upload(in, NC);
    pt_bf16 *d_half = gpu_test_upload_bf16(half, NC);
    float *d_rows = gpu_test_upload(rows, (size_t)T * C);
    pt_bf16 *d_residual = gpu_test_upload_bf16(residual, NC);
    pt_bf16 *d_out = gpu_test_device(NC * sizeof(pt_bf16));
    float *d_wide = gpu_test_device(NC * sizeof(float));
    char name[96];
    for (int kind = 0; kind < 3; kind++) {
        for (size_t i = 0; i < NC; i++) {
            size_t n = i / (size_t)C, c = i % (size_t)C;
            want[i] = kind == 0 ? in[i] + rows[(n % (size_t)T) * C + c]
                      : kind == 1 ? in[i] + rows[c] + residual[i]
                                  : half[i] + rows[c] + residual[i];
        }
        gpu_test_round_bf16(want, NC);
        if (kind == 0)
            GPU_CHECK(cuda_stream_from_float(d_out, d_in, d_rows, T, NULL,
                                             N, C, 0));
        else if (kind == 1)
            GPU_CHECK(cuda_stream_from_float(d_out, d_in, d_rows, 1,
                                             d_residual, N, C, 0));
        else
            GPU_CHECK(cuda_stream_from_bf16(d_out, d_half, d_rows,
                                            d_residual, N, C, 0));
        GPU_CHECK(cuda_convert_to_float(d_wide, d_out, NC, 0));
        gpu_test_download(got, d_wide, NC);
        snprintf(name, sizeof name, "bf16 stream from %s C=%d",
                 kind == 0 ? "fp32 + positions"
                 : kind == 1 ? "fp32 + bias + residual"
                             : "bf16 + bias + residual", C);
        /* one rounding of the same fp32 sum; the sum's order may differ
         * by an ulp of fp32, which can move a tie: one bf16 ulp */
        gpu_test_compare(tally, name, got, want, NC, TOL_BF16_OUT);
    }
    free(in), free(half), free(rows), free(residual), free(want), free(got);
    cudaFree(d_in), cudaFree(d_half), cudaFree(d_rows), cudaFree(d_residual);
    cudaFree(d_out), cudaFree(d_wide);
}

/* ----------------------------------------------------------- layernorm */

static void test_layernorm(gpu_test_tally *tally, int N, int C)
{
    char name[96];
    size_t NC = (size_t)N * C;
    /* the input is the bf16 residual stream */
    float *inp = random_host(NC, 2.0f, 0.5f);
    gpu_test_round_bf16(inp, NC);
    float *weight = random_host((size_t)C, 0.5f, 1.0f);
    float *bias = random_host((size_t)C, 0.5f, 0.0f);
    float *want = gpu_test_host(NC * sizeof(float));
    float *want_mean = gpu_test_host((size_t)N * sizeof(float));
    float *want_rstd = gpu_test_host((size_t)N * sizeof(float));
    cpu_layernorm_forward(want, want_mean, want_rstd, inp, weight, bias, N,
                          C);

    pt_bf16 *d_inp = gpu_test_upload_bf16(inp, NC);
    float *d_weight = gpu_test_upload(weight, (size_t)C);
    float *d_bias = gpu_test_upload(bias, (size_t)C);
    pt_bf16 *d_out = gpu_test_device(NC * sizeof(pt_bf16));
    float *d_mean = gpu_test_device((size_t)N * sizeof(float));
    float *d_rstd = gpu_test_device((size_t)N * sizeof(float));
    GPU_CHECK(cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight,
                                     d_bias, N, C, 0));
    float *got = gpu_test_host(NC * sizeof(float));
    float *got_mean = gpu_test_host((size_t)N * sizeof(float));
    float *got_rstd = gpu_test_host((size_t)N * sizeof(float));
    gpu_test_download_bf16(got, d_out, NC);
    gpu_test_download(got_mean, d_mean, (size_t)N);
    gpu_test_download(got_rstd, d_rstd, (size_t)N);
    snprintf(name, sizeof name, "layernorm forward N=%d C=%d (bf16 out)", N,
             C);
    gpu_test_compare(tally, name, got, want, NC, TOL_BF16_OUT);
    snprintf(name, sizeof name, "layernorm forward mean, rstd C=%d", C);
    gpu_test_compare(tally, name, got_mean, want_mean, (size_t)N, TOL_FP32);
    gpu_test_compare(tally, name, got_rstd, want_rstd, (size_t)N, TOL_FP32);

    /* backward with a residual gradient and non-zero weight gradients,
     * twice: the weight gradients accumulate, and the second call finds
     * the scratch's completion counters zeroed by the first */
    float *grad_out = random_bf16_host(NC, 1.0f);
    float *residual = random_host(NC, 1.0f, 0.0f);
    float *want_dinp = gpu_test_host(NC * sizeof(float));
    memcpy(want_dinp, residual, NC * sizeof(float));
    float *want_dw = random_host((size_t)C, 1.0f, 0.0f);
    float *want_db = random_host((size_t)C, 1.0f, 0.0f);
    float *dev_dw = gpu_test_upload(want_dw, (size_t)C);
    float *dev_db = gpu_test_upload(want_db, (size_t)C);
    cpu_layernorm_backward(want_dinp, want_dw, want_db, grad_out, inp, weight,
                           want_mean, want_rstd, N, C);
    cpu_layernorm_backward(NULL, want_dw, want_db, grad_out, inp, weight,
                           want_mean, want_rstd, N, C);
    pt_bf16 *dev_grad_out = gpu_test_upload_bf16(grad_out, NC);
    float *dev_residual = gpu_test_upload(residual, NC);
    float *dev_dinp = gpu_test_device(NC * sizeof(float));
    pt_bf16 *dev_dinp_bf16 = gpu_test_device(NC * sizeof(pt_bf16));
    size_t scratch_bytes =
        cuda_layernorm_backward_scratch(N, C) * sizeof(float);
    float *scratch = gpu_test_device(scratch_bytes);
    GPU_CHECK(cudaMemset(scratch, 0, scratch_bytes));
    for (int call = 0; call < 2; call++)
        GPU_CHECK(cuda_layernorm_backward(dev_dinp, dev_dinp_bf16,
                                          cuda_grad_fp32(dev_dw),
                                          cuda_grad_fp32(dev_db), dev_residual, NULL, dev_grad_out,
                                          d_inp, d_weight, d_mean, d_rstd,
                                          scratch, N, C, 0));
    float *got_dinp = gpu_test_host(NC * sizeof(float));
    float *got_dw = gpu_test_host((size_t)C * sizeof(float));
    float *got_db = gpu_test_host((size_t)C * sizeof(float));
    gpu_test_download(got_dinp, dev_dinp, NC);
    gpu_test_download(got_dw, dev_dw, (size_t)C);
    gpu_test_download(got_db, dev_db, (size_t)C);
    snprintf(name, sizeof name, "layernorm backward d_inp C=%d", C);
    gpu_test_compare(tally, name, got_dinp, want_dinp, NC, TOL_FP32);
    snprintf(name, sizeof name, "layernorm backward d_weight C=%d (2 calls)",
             C);
    gpu_test_compare(tally, name, got_dw, want_dw, (size_t)C, TOL_FP32);
    snprintf(name, sizeof name, "layernorm backward d_bias C=%d (2 calls)", C);
    gpu_test_compare(tally, name, got_db, want_db, (size_t)C, TOL_FP32);
    gpu_test_download_bf16(got_dinp, dev_dinp_bf16, NC);
    snprintf(name, sizeof name, "layernorm backward d_inp bf16 copy C=%d", C);
    gpu_test_compare(tally, name, got_dinp, want_dinp, NC, TOL_BF16_OUT);

    /* the stream gradient in bf16 alone, in place (the cuda stage's
     * layers): d_inp NULL, the residual read from the bf16 buffer it
     * is written back to; against the same sum over the rounded
     * residual */
    memcpy(want_dinp, residual, NC * sizeof(float));
    gpu_test_round_bf16(want_dinp, NC);
    pt_bf16 *dev_stream = gpu_test_upload_bf16(want_dinp, NC);
    cpu_layernorm_backward(want_dinp, NULL, NULL, grad_out, inp, weight,
                           want_mean, want_rstd, N, C);
    GPU_CHECK(cuda_layernorm_backward(NULL, dev_stream, cuda_grad_fp32(NULL),
                                      cuda_grad_fp32(NULL), NULL, dev_stream,
                                      dev_grad_out, d_inp, d_weight, d_mean,
                                      d_rstd, scratch, N, C, 0));
    gpu_test_download_bf16(got_dinp, dev_stream, NC);
    snprintf(name, sizeof name,
             "layernorm backward bf16 stream gradient in place C=%d", C);
    gpu_test_compare(tally, name, got_dinp, want_dinp, NC, TOL_BF16_OUT);
    snprintf(name, sizeof name, "layernorm C=%d", C);
    gpu_test_norm_output_again(tally, name, d_out, dev_grad_out, d_inp,
                               d_weight, d_bias, d_mean, d_rstd, false, N, C);
    cudaFree(dev_stream);

    free(inp), free(weight), free(bias), free(want), free(want_mean);
    free(want_rstd), free(got), free(got_mean), free(got_rstd);
    free(grad_out), free(residual), free(want_dinp), free(want_dw);
    free(want_db), free(got_dinp), free(got_dw), free(got_db);
    cudaFree(d_inp), cudaFree(d_weight), cudaFree(d_bias), cudaFree(d_out);
    cudaFree(d_mean), cudaFree(d_rstd), cudaFree(dev_dw), cudaFree(dev_db);
    cudaFree(dev_grad_out), cudaFree(dev_residual), cudaFree(dev_dinp);
    cudaFree(dev_dinp_bf16), cudaFree(scratch);
}

/* ----------------------------------------------------- bias grad, gelu */

static void test_bias_grad(gpu_test_tally *tally, int N, int OC)
{
    char name[96];
    size_t count = (size_t)N * OC;
    float *grad_out = random_bf16_host(count, 1.0f);
    float *want = random_host((size_t)OC, 1.0f, 0.0f);
    float *dev_bias = gpu_test_upload(want, (size_t)OC);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OC; j++)
            want[j] += grad_out[(size_t)n * OC + j];
    pt_bf16 *dev_grad = gpu_test_upload_bf16(grad_out, count);
    float *scratch =
        gpu_test_device(cuda_bias_grad_scratch(N, OC) * sizeof(float));
    GPU_CHECK(cuda_bias_grad(cuda_grad_fp32(dev_bias), dev_grad, scratch,
                             N, OC, 0));
    float *got = gpu_test_host((size_t)OC * sizeof(float));
    gpu_test_download(got, dev_bias, (size_t)OC);
    snprintf(name, sizeof name, "bias grad N=%d OC=%d", N, OC);
    gpu_test_compare(tally, name, got, want, (size_t)OC, TOL_FP32);
    free(grad_out), free(want), free(got);
    cudaFree(dev_bias), cudaFree(dev_grad), cudaFree(scratch);
}

static void test_gelu(gpu_test_tally *tally)
{
    size_t count = 100003; /* not a multiple of 8: the scalar tail too */
    float *inp = random_bf16_host(count, 4.0f);
    float *grad_out = random_bf16_host(count, 1.0f);
    float *want = gpu_test_host(count * sizeof(float));
    float *want_grad = gpu_test_host(count * sizeof(float));
    cpu_gelu_forward(want, inp, count);
    cpu_gelu_backward(want_grad, grad_out, inp, count);
    pt_bf16 *dev_inp = gpu_test_upload_bf16(inp, count);
    pt_bf16 *dev_grad_out = gpu_test_upload_bf16(grad_out, count);
    pt_bf16 *dev_out = gpu_test_device(count * sizeof(pt_bf16));
    pt_bf16 *dev_grad = gpu_test_device(count * sizeof(pt_bf16));
    GPU_CHECK(cuda_gelu_forward(dev_out, dev_inp, count, 0));
    GPU_CHECK(cuda_gelu_backward(dev_grad, dev_grad_out, dev_inp, count, 0));
    float *got = gpu_test_host(count * sizeof(float));
    gpu_test_download_bf16(got, dev_out, count);
    gpu_test_compare(tally, "gelu forward (bf16)", got, want, count,
                     TOL_BF16_OUT);
    gpu_test_download_bf16(got, dev_grad, count);
    gpu_test_compare(tally, "gelu backward (bf16)", got, want_grad, count,
                     TOL_BF16_OUT);
    free(inp), free(grad_out), free(want), free(want_grad), free(got);
    cudaFree(dev_inp), cudaFree(dev_grad_out), cudaFree(dev_out);
    cudaFree(dev_grad);
}

/* ----------------------------------------------------------- products */

/* Reads back a row-major N x OC bf16 matrix stored with row stride ld. */
static void download_rows_bf16(float *host, const pt_bf16 *device, int rows,
                               int cols, int ld)
{
    float *all = gpu_test_host((size_t)rows * ld * sizeof(float));
    gpu_test_download_bf16(all, device, (size_t)rows * ld);
    for (int r = 0; r < rows; r++)
        memcpy(host + (size_t)r * cols, all + (size_t)r * ld,
               (size_t)cols * sizeof(float));
    free(all);
}

static void test_products(gpu_test_tally *tally)
{
    pt_error err;
    gemm_context *context = NULL;
    PT_CHECK(gemm_context_create(&context, &err), &err);
    int N = 384, IC = 256, OC = 512;
    size_t in_count = (size_t)N * IC, out_count = (size_t)N * OC;
    size_t w_count = (size_t)OC * IC;
    float *inp = random_bf16_host(in_count, 1.0f);
    float *weight = random_bf16_host(w_count, 0.1f);
    float *bias = random_bf16_host((size_t)OC, 0.5f);
    float *residual = random_host(out_count, 1.0f, 0.0f);
    pt_bf16 *dev_inp = gpu_test_upload_bf16(inp, in_count);
    pt_bf16 *dev_weight = gpu_test_upload_bf16(weight, w_count);
    pt_bf16 *dev_bias_bf16 = gpu_test_upload_bf16(bias, (size_t)OC);
    float *dev_bias = gpu_test_upload(bias, (size_t)OC);
    float *dev_residual = gpu_test_upload(residual, out_count);
    float *want = gpu_test_host(out_count * sizeof(float));
    float *got = gpu_test_host(out_count * sizeof(float));
    cpu_matmul_forward(want, inp, weight, bias, N, IC, OC);

    /* forward, bf16 out, bias epilogue */
    pt_bf16 *dev_out = gpu_test_device(out_count * sizeof(pt_bf16));
    gemm_call call = {
        .transpose_a = true, .m = OC, .n = N, .k = IC,
        .a = dev_weight, .lda = IC, .b = dev_inp, .ldb = IC,
        .d = dev_out, .ldd = OC, .alpha = 1.0f,
        .epilogue = GEMM_BIAS, .bias = dev_bias_bf16,
    };
    PT_CHECK(gemm_run(context, &call, 0, &err), &err);
    gpu_test_download_bf16(got, dev_out, out_count);
    gpu_test_compare(tally, "linear forward, bias epilogue (bf16 out)", got,
                     want, out_count, TOL_BF16_OUT);

    /* forward, fp32 out, bias + residual (C != D) */
    float *dev_out32 = gpu_test_device(out_count * sizeof(float));
    gemm_call residual_call = call;
    residual_call.d = dev_out32;
    residual_call.d_fp32 = true;
    residual_call.c = dev_residual;
    residual_call.beta = 1.0f;
    residual_call.bias = dev_bias;
    PT_CHECK(gemm_run(context, &residual_call, 0, &err), &err);
    gpu_test_download(got, dev_out32, out_count);
    float *want_residual = gpu_test_host(out_count * sizeof(float));
    cpu_residual_forward(want_residual, want, residual, out_count);
    gpu_test_compare(tally, "linear forward + residual (fp32 out)", got,
                     want_residual, out_count, TOL_FP32);

    /* forward with the GELU epilogue */
    float *want_gelu = gpu_test_host(out_count * sizeof(float));
    cpu_gelu_forward(want_gelu, want, out_count);
    pt_bf16 *dev_aux = gpu_test_device(out_count * sizeof(pt_bf16));
    gemm_call gelu_call = call;
    gelu_call.epilogue = GEMM_GELU_AUX_BIAS;
    gelu_call.aux = dev_aux;
    gelu_call.ld_aux = OC;
    if (gemm_supported(context, &gelu_call)) {
        PT_CHECK(gemm_run(context, &gelu_call, 0, &err), &err);
        gpu_test_download_bf16(got, dev_out, out_count);
        gpu_test_compare(tally, "linear forward, GELU_AUX_BIAS epilogue: gelu",
                         got, want_gelu, out_count, TOL_BF16_OUT);
        gpu_test_download_bf16(got, dev_aux, out_count);
        gpu_test_compare(tally, "linear forward, GELU_AUX_BIAS epilogue: aux",
                         got, want, out_count, TOL_BF16_OUT);
    } else {
        printf("NOTE cuBLASLt offers no GELU_AUX_BIAS algorithm here: the "
               "backend uses its own GELU kernel\n");
    }

    /* backward: input gradient, weight gradient (+=), bias gradient */
    float *grad_out = random_bf16_host(out_count, 1.0f);
    pt_bf16 *dev_grad_out = gpu_test_upload_bf16(grad_out, out_count);
    float *want_dinp = gpu_test_host(in_count * sizeof(float));
    float *want_dw = random_host(w_count, 1.0f, 0.0f);
    float *want_db = gpu_test_host((size_t)OC * sizeof(float));
    float *dev_dw = gpu_test_upload(want_dw, w_count);
    cpu_matmul_backward(want_dinp, want_dw, want_db, grad_out, inp, weight,
                        N, IC, OC);
    pt_bf16 *dev_dinp = gpu_test_device(in_count * sizeof(pt_bf16));
    gemm_call dinp_call = {
        .m = IC, .n = N, .k = OC,
        .a = dev_weight, .lda = IC, .b = dev_grad_out, .ldb = OC,
        .d = dev_dinp, .ldd = IC, .alpha = 1.0f,
    };
    PT_CHECK(gemm_run(context, &dinp_call, 0, &err), &err);
    float *got_in = gpu_test_host(in_count * sizeof(float));
    gpu_test_download_bf16(got_in, dev_dinp, in_count);
    gpu_test_compare(tally, "linear backward: input gradient (bf16)", got_in,
                     want_dinp, in_count, TOL_BF16_OUT);
    float *dev_db = gpu_test_device((size_t)OC * sizeof(float));
    gemm_call dw_call = {
        .transpose_b = true, .m = IC, .n = OC, .k = N,
        .a = dev_inp, .lda = IC, .b = dev_grad_out, .ldb = OC,
        .d = dev_dw, .ldd = IC, .d_fp32 = true, .alpha = 1.0f, .beta = 1.0f,
        .epilogue = GEMM_BGRADB, .bias = dev_db,
    };
    bool fused_bias = gemm_supported(context, &dw_call);
    if (!fused_bias) {
        printf("NOTE cuBLASLt offers no BGRADB algorithm here: the backend "
               "sums bias gradients with its own kernel\n");
        dw_call.epilogue = GEMM_PLAIN;
        dw_call.bias = NULL;
    }
    PT_CHECK(gemm_run(context, &dw_call, 0, &err), &err);
    float *got_w = gpu_test_host(w_count * sizeof(float));
    gpu_test_download(got_w, dev_dw, w_count);
    gpu_test_compare(tally, "linear backward: weight gradient (fp32, +=)",
                     got_w, want_dw, w_count, TOL_FP32);
    if (fused_bias) {
        float *got_b = gpu_test_host((size_t)OC * sizeof(float));
        gpu_test_download(got_b, dev_db, (size_t)OC);
        gpu_test_compare(tally, "linear backward: BGRADB bias gradient", got_b,
                         want_db, (size_t)OC, TOL_FP32);
        free(got_b);
    }

    /* DGELU_BGRAD: the MLP's d(fc pre-activation) from d(gelu output):
     * here the "aux" pre-activations are `want` (rounded), the upstream
     * is the input-gradient product of a second layer OC -> IC */
    float *pre = gpu_test_host(out_count * sizeof(float));
    memcpy(pre, want, out_count * sizeof(float));
    gpu_test_round_bf16(pre, out_count);
    pt_bf16 *dev_pre = gpu_test_upload_bf16(pre, out_count);
    float *up = random_bf16_host(in_count, 1.0f); /* d out of layer 2: N x IC */
    float *w2 = random_bf16_host(w_count, 0.1f);  /* layer 2: IC x OC */
    pt_bf16 *dev_up = gpu_test_upload_bf16(up, in_count);
    pt_bf16 *dev_w2 = gpu_test_upload_bf16(w2, w_count);
    float *d_gelu = gpu_test_host(out_count * sizeof(float));
    float *want_dpre = gpu_test_host(out_count * sizeof(float));
    cpu_matmul_backward(d_gelu, NULL, NULL, up, want, w2, N, OC, IC);
    cpu_gelu_backward(want_dpre, d_gelu, pre, out_count);
    float *want_dbias = gpu_test_host((size_t)OC * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OC; j++)
            want_dbias[j] += want_dpre[(size_t)n * OC + j];
    pt_bf16 *dev_dpre = gpu_test_device(out_count * sizeof(pt_bf16));
    float *dev_dbias = gpu_test_device((size_t)OC * sizeof(float));
    gemm_call dgelu_call = {
        .m = OC, .n = N, .k = IC,
        .a = dev_w2, .lda = OC, .b = dev_up, .ldb = IC,
        .d = dev_dpre, .ldd = OC, .alpha = 1.0f,
        .epilogue = GEMM_DGELU_BGRAD, .bias = dev_dbias,
        .aux = dev_pre, .ld_aux = OC,
    };
    if (gemm_supported(context, &dgelu_call)) {
        PT_CHECK(gemm_run(context, &dgelu_call, 0, &err), &err);
        gpu_test_download_bf16(got, dev_dpre, out_count);
        gpu_test_compare(tally, "DGELU_BGRAD epilogue: d pre-activation", got,
                         want_dpre, out_count, TOL_BF16_CHAIN);
        float *got_b = gpu_test_host((size_t)OC * sizeof(float));
        gpu_test_download(got_b, dev_dbias, (size_t)OC);
        gpu_test_compare(tally, "DGELU_BGRAD epilogue: bias gradient", got_b,
                         want_dbias, (size_t)OC, TOL_BF16_CHAIN);
        free(got_b);
    } else {
        printf("NOTE cuBLASLt offers no DGELU_BGRAD algorithm here: the "
               "backend tries DGELU alone, bias gradients by its own "
               "kernel\n");
    }
    gemm_call dgelu_only = dgelu_call;
    dgelu_only.epilogue = GEMM_DGELU;
    dgelu_only.bias = NULL;
    if (gemm_supported(context, &dgelu_only)) {
        GPU_CHECK(cudaMemset(dev_dpre, 0xff, out_count * sizeof(pt_bf16)));
        PT_CHECK(gemm_run(context, &dgelu_only, 0, &err), &err);
        gpu_test_download_bf16(got, dev_dpre, out_count);
        gpu_test_compare(tally, "DGELU epilogue: d pre-activation", got,
                         want_dpre, out_count, TOL_BF16_CHAIN);
    } else {
        printf("NOTE cuBLASLt offers no DGELU algorithm here: the backend "
               "uses its own GELU backward kernel\n");
    }

    free(inp), free(weight), free(bias), free(residual), free(want);
    free(got), free(want_residual), free(want_gelu), free(grad_out);
    free(want_dinp), free(want_dw), free(want_db), free(got_in), free(got_w);
    free(pre), free(up), free(w2), free(d_gelu), free(want_dpre);
    free(want_dbias);
    cudaFree(dev_inp), cudaFree(dev_weight), cudaFree(dev_bias_bf16);
    cudaFree(dev_bias), cudaFree(dev_residual), cudaFree(dev_out);
    cudaFree(dev_out32), cudaFree(dev_aux), cudaFree(dev_grad_out);
    cudaFree(dev_dw), cudaFree(dev_dinp), cudaFree(dev_db), cudaFree(dev_pre);
    cudaFree(dev_up), cudaFree(dev_w2), cudaFree(dev_dpre);
    cudaFree(dev_dbias);
    gemm_context_destroy(context);
}

/* The bias epilogue at 1664-wide layers' shapes: in W^T + bias (bf16)
 * less in W^T (fp32), averaged over n rows, is the bias to about 1e-5
 * (biases up to 0.05); one added twice or not at all is off by itself. */
static void test_bias_epilogue(gpu_test_tally *tally, int m, int n, int k)
{
    pt_error err;
    gemm_context *context = NULL;
    PT_CHECK(gemm_context_create(&context, &err), &err);
    size_t d_count = (size_t)m * n;
    float *weight = random_bf16_host((size_t)m * k, 0.02f);
    float *inp = random_bf16_host((size_t)n * k, 1.0f);
    float *bias = random_bf16_host((size_t)m, 0.05f);
    float *dev_plain = gpu_test_device(d_count * sizeof(float));
    float *dev_wide = gpu_test_device(d_count * sizeof(float));
    gemm_call call = {
        .transpose_a = true, .m = m, .n = n, .k = k,
        .a = gpu_test_upload_bf16(weight, (size_t)m * k), .lda = k,
        .b = gpu_test_upload_bf16(inp, (size_t)n * k), .ldb = k,
        .d = gpu_test_device(d_count * sizeof(pt_bf16)), .ldd = m,
        .alpha = 1.0f, .epilogue = GEMM_BIAS,
        .bias = gpu_test_upload_bf16(bias, (size_t)m),
    };
    gemm_call plain = call;
    plain.d = dev_plain, plain.d_fp32 = true, plain.epilogue = GEMM_PLAIN;
    PT_CHECK(gemm_run(context, &call, 0, &err), &err);
    PT_CHECK(gemm_run(context, &plain, 0, &err), &err);
    GPU_CHECK(cuda_convert_to_float(dev_wide, call.d, d_count, 0));
    float *with_bias = gpu_test_host(d_count * 4), *without =
        gpu_test_host(d_count * 4);
    float *mean = gpu_test_host((size_t)m * sizeof(float));
    gpu_test_download(with_bias, dev_wide, d_count);
    gpu_test_download(without, dev_plain, d_count);
    for (size_t j = 0; j < d_count; j++) /* mean: zeroed by calloc */
        mean[j % (size_t)m] += (with_bias[j] - without[j]) / (float)n;
    char name[96];
    snprintf(name, sizeof name, "bias epilogue, m %d n %d k %d: bias", m, n,
             k);
    gpu_test_compare(tally, name, mean, bias, (size_t)m, 1e-2);
    free(weight), free(inp), free(bias), free(with_bias), free(without);
    free(mean), cudaFree(dev_plain), cudaFree(dev_wide), cudaFree(call.d);
    cudaFree((void *)call.a), cudaFree((void *)call.b), cudaFree(call.bias);
    gemm_context_destroy(context);
}

/* ----------------------------------------------------------- attention */

/* The plain attention's forward at T positions of one head of 16 (its
 * scores, T floats, in dynamic shared memory beside 128 static bytes: at
 * 12,288 positions exactly 48 KiB, which launches only when asked for),
 * against a double-precision reference of a few query rows. */
static void test_attention_rows(gpu_test_tally *tally, int T)
{
    enum { C = 16, ROWS = 6 };
    size_t qkv_count = (size_t)T * 3 * C;
    float *qkv = random_bf16_host(qkv_count, 1.5f);
    pt_bf16 *dev_qkv = gpu_test_upload_bf16(qkv, qkv_count);
    pt_bf16 *dev_out = gpu_test_device((size_t)T * C * sizeof(pt_bf16));
    float *dev_lse = gpu_test_device((size_t)T * sizeof(float));
    GPU_CHECK(cuda_attention_forward(dev_out, dev_lse, dev_qkv, 1, T, C, 1,
                                     0));
    float *all = gpu_test_host((size_t)T * C * sizeof(float));
    gpu_test_download_bf16(all, dev_out, (size_t)T * C);
    int rows[ROWS] = {0, 1, 4095, T / 2, T - 2, T - 1};
    float got[ROWS * C], want[ROWS * C];
    double *weights = gpu_test_host((size_t)T * sizeof(double));
    for (int r = 0; r < ROWS; r++) {
        int t = rows[r];
        const float *q = qkv + (size_t)t * 3 * C;
        double top = -INFINITY, total = 0.0;
        for (int j = 0; j <= t; j++) {
            const float *k = qkv + (size_t)j * 3 * C + C;
            double dot = 0.0;
            for (int c = 0; c < C; c++)
                dot += (double)q[c] * k[c];
            weights[j] = dot / sqrt((double)C);
            top = fmax(top, weights[j]);
        }
        for (int j = 0; j <= t; j++)
            total += weights[j] = exp(weights[j] - top);
        for (int c = 0; c < C; c++) {
            double sum = 0.0;
            for (int j = 0; j <= t; j++)
                sum += weights[j] * qkv[(size_t)j * 3 * C + 2 * C + c];
            want[r * C + c] = (float)(sum / total);
            got[r * C + c] = all[(size_t)t * C + c];
        }
    }
    char name[96];
    snprintf(name, sizeof name, "plain attention forward T=%d, %d rows", T,
             ROWS);
    gpu_test_compare(tally, name, got, want, (size_t)ROWS * C,
                     TOL_BF16_CHAIN);
    free(qkv);
    free(all);
    free(weights);
    GPU_CHECK(cudaFree(dev_qkv));
    GPU_CHECK(cudaFree(dev_out));
    GPU_CHECK(cudaFree(dev_lse));
}

static void test_attention(gpu_test_tally *tally, int B, int T, int C,
                           int NH)
{
    char name[128];
    size_t N = (size_t)B * T;
    size_t qkv_count = N * 3 * C, out_count = N * C;
    float *qkv = random_bf16_host(qkv_count, 1.5f);
    float *want = gpu_test_host(out_count * sizeof(float));
    float *probs = gpu_test_host((size_t)B * NH * T * T * sizeof(float));
    cpu_attention_forward(want, probs, qkv, B, T, C, NH);
    pt_bf16 *dev_qkv = gpu_test_upload_bf16(qkv, qkv_count);
    pt_bf16 *dev_out = gpu_test_device(out_count * sizeof(pt_bf16));
    float *dev_lse = gpu_test_device((size_t)B * NH * T * sizeof(float));
    GPU_CHECK(cuda_attention_forward(dev_out, dev_lse, dev_qkv, B, T, C, NH,
                                     0));
    float *got = gpu_test_host(out_count * sizeof(float));
    gpu_test_download_bf16(got, dev_out, out_count);
    snprintf(name, sizeof name, "attention forward B=%d T=%d C=%d NH=%d (D=%d)",
             B, T, C, NH, C / NH);
    gpu_test_compare(tally, name, got, want, out_count, TOL_BF16_CHAIN);

    /* backward against the cpu op fed the GPU's (rounded) output */
    float *grad_out = random_bf16_host(out_count, 1.0f);
    float *want_dqkv = gpu_test_host(qkv_count * sizeof(float));
    float *row = gpu_test_host((size_t)T * sizeof(float));
    cpu_attention_backward(want_dqkv, grad_out, qkv, probs, row, B, T, C, NH);
    pt_bf16 *dev_grad_out = gpu_test_upload_bf16(grad_out, out_count);
    pt_bf16 *dev_dqkv = gpu_test_device(qkv_count * sizeof(pt_bf16));
    float *scratch = gpu_test_device(
        cuda_attention_backward_scratch(B, T, NH) * sizeof(float));
    GPU_CHECK(cuda_attention_backward(dev_dqkv, dev_grad_out, dev_qkv,
                                      dev_out, dev_lse, scratch, B, T, C, NH,
                                      0));
    float *got_dqkv = gpu_test_host(qkv_count * sizeof(float));
    gpu_test_download_bf16(got_dqkv, dev_dqkv, qkv_count);
    /* compare q, k, v parts separately: a wrong part must not hide */
    const char *parts[3] = {"dQ", "dK", "dV"};
    float *got_part = gpu_test_host(out_count * sizeof(float));
    float *want_part = gpu_test_host(out_count * sizeof(float));
    for (int part = 0; part < 3; part++) {
        for (size_t n = 0; n < N; n++) {
            memcpy(got_part + n * C, got_dqkv + n * 3 * C + (size_t)part * C,
                   (size_t)C * sizeof(float));
            memcpy(want_part + n * C, want_dqkv + n * 3 * C + (size_t)part * C,
                   (size_t)C * sizeof(float));
        }
        snprintf(name, sizeof name, "attention backward %s B=%d T=%d D=%d",
                 parts[part], B, T, C / NH);
        gpu_test_compare(tally, name, got_part, want_part, out_count,
                         TOL_BF16_CHAIN);
    }
    free(qkv), free(want), free(probs), free(got), free(grad_out);
    free(want_dqkv), free(row), free(got_dqkv), free(got_part);
    free(want_part);
    cudaFree(dev_qkv), cudaFree(dev_out), cudaFree(dev_lse);
    cudaFree(dev_grad_out), cudaFree(dev_dqkv), cudaFree(scratch);
}

/* ----------------------------------------------------------- classifier */

static void test_classifier(gpu_test_tally *tally, int N, int V)
{
    char name[96];
    int ld = (V + 127) / 128 * 128;
    float *logits = random_bf16_host((size_t)N * V, 4.0f);
    uint32_t *targets = gpu_test_host((size_t)N * sizeof *targets);
    for (int n = 0; n < N; n++)
        targets[n] = (uint32_t)(gpu_test_uniform(&rng_state) * V);
    targets[0] = (uint32_t)V - 1; /* the last column, past the vector part */
    float *probs = gpu_test_host((size_t)N * V * sizeof(float));
    float *want_losses = gpu_test_host((size_t)N * sizeof(float));
    float want_mean = cpu_softmax_crossentropy_forward(
        probs, want_losses, logits, targets, N, V);
    cpu_softmax_crossentropy_backward(probs, probs, targets, 1.0f, N, V);

    float *padded = gpu_test_host((size_t)N * ld * sizeof(float));
    for (int n = 0; n < N; n++)
        memcpy(padded + (size_t)n * ld, logits + (size_t)n * V,
               (size_t)V * sizeof(float));
    pt_bf16 *dev_logits = gpu_test_upload_bf16(padded, (size_t)N * ld);
    uint32_t *dev_targets = gpu_test_device((size_t)N * sizeof(uint32_t));
    GPU_CHECK(cudaMemcpy(dev_targets, targets, (size_t)N * sizeof(uint32_t),
                         cudaMemcpyHostToDevice));
    float *dev_losses = gpu_test_device((size_t)N * sizeof(float));
    double *dev_mean = gpu_test_device(sizeof(double));
    GPU_CHECK(cuda_classifier_forward(dev_logits, dev_losses, dev_targets, N,
                                      V, ld, 0));
    GPU_CHECK(cuda_mean(dev_mean, dev_losses, N, 0));
    float *got_losses = gpu_test_host((size_t)N * sizeof(float));
    gpu_test_download(got_losses, dev_losses, (size_t)N);
    double got_mean = 0.0;
    GPU_CHECK(cudaMemcpy(&got_mean, dev_mean, sizeof got_mean,
                         cudaMemcpyDeviceToHost));
    snprintf(name, sizeof name, "classifier losses N=%d V=%d", N, V);
    gpu_test_compare(tally, name, got_losses, want_losses, (size_t)N,
                     TOL_FP32);
    float got_mean_f = (float)got_mean;
    snprintf(name, sizeof name, "classifier mean loss V=%d", V);
    gpu_test_compare(tally, name, &got_mean_f, &want_mean, 1, TOL_FP32);
    float *got = gpu_test_host((size_t)N * V * sizeof(float));
    download_rows_bf16(got, dev_logits, N, V, ld);
    snprintf(name, sizeof name, "classifier d_logits in place V=%d", V);
    gpu_test_compare(tally, name, got, probs, (size_t)N * V, TOL_BF16_OUT);
    float *whole = gpu_test_host((size_t)N * ld * sizeof(float));
    gpu_test_download_bf16(whole, dev_logits, (size_t)N * ld);
    bool padding_zero = true;
    for (int n = 0; n < N; n++)
        for (int c = V; c < ld; c++)
            padding_zero = padding_zero && whole[(size_t)n * ld + c] == 0.0f;
    snprintf(name, sizeof name,
             "classifier zeroes the %d padding columns of each row", ld - V);
    gpu_test_expect(tally, padding_zero, name);
    free(whole);
    free(logits), free(targets), free(probs), free(want_losses);
    free(padded), free(got_losses), free(got);
    cudaFree(dev_logits), cudaFree(dev_targets), cudaFree(dev_losses);
    cudaFree(dev_mean);
}

/* The vocab-parallel classifier over tp shards of the vocabulary, the
 * group's reductions done on the host between the launches, against the
 * whole classifier of the cpu: losses, each shard's d logits (its columns
 * of the whole), zeroed padding. */
static void test_vocab_parallel_classifier(gpu_test_tally *tally, int N,
                                           int V, int tp)
{
    char name[128];
    float *logits = random_bf16_host((size_t)N * V, 4.0f);
    uint32_t *targets = gpu_test_host((size_t)N * sizeof *targets);
    for (int n = 0; n < N; n++)
        targets[n] = (uint32_t)(gpu_test_uniform(&rng_state) * V);
    targets[0] = (uint32_t)V - 1;
    float *probs = gpu_test_host((size_t)N * V * sizeof(float));
    float *want_losses = gpu_test_host((size_t)N * sizeof(float));
    cpu_softmax_crossentropy_forward(probs, want_losses, logits, targets, N,
                                     V);
    cpu_softmax_crossentropy_backward(probs, probs, targets, 1.0f, N, V);
    uint32_t *dev_targets = gpu_test_device((size_t)N * sizeof(uint32_t));
    GPU_CHECK(cudaMemcpy(dev_targets, targets, (size_t)N * sizeof(uint32_t),
                         cudaMemcpyHostToDevice));

    /* per shard: its padded logits and its 4N row statistics */
    pt_bf16 *dev_logits[8];
    float *dev_stats[8];
    int firsts[8], counts[8], lds[8];
    size_t stats_bytes = 4 * (size_t)N * sizeof(float);
    for (int t = 0; t < tp; t++) {
        stage_vocab_shard(V, tp, t, &firsts[t], &counts[t]);
        lds[t] = (counts[t] + 127) / 128 * 128;
        float *padded = gpu_test_host((size_t)N * lds[t] * sizeof(float));
        for (int n = 0; n < N; n++)
            memcpy(padded + (size_t)n * lds[t],
                   logits + (size_t)n * V + firsts[t],
                   (size_t)counts[t] * sizeof(float));
        dev_logits[t] = gpu_test_upload_bf16(padded, (size_t)N * lds[t]);
        dev_stats[t] = gpu_test_device(stats_bytes);
        free(padded);
        /* stats: shard max, group max, sums, target logits */
        float *s = dev_stats[t];
        GPU_CHECK(cuda_vocab_parallel_partials(dev_logits[t], s, s + 2 * N,
                                               s + 3 * N, dev_targets,
                                               firsts[t], N, counts[t],
                                               lds[t], 0));
    }
    /* the group's max, then (after the rescale) the group's sums */
    float *host = gpu_test_host(stats_bytes);
    float *group = gpu_test_host(stats_bytes);
    for (int t = 0; t < tp; t++) {
        gpu_test_download(host, dev_stats[t], (size_t)N);
        for (int n = 0; n < N; n++)
            group[n] = t == 0 || host[n] > group[n] ? host[n] : group[n];
    }
    for (int t = 0; t < tp; t++) {
        GPU_CHECK(cudaMemcpy(dev_stats[t] + N, group, (size_t)N * sizeof(float),
                             cudaMemcpyHostToDevice));
        GPU_CHECK(cuda_vocab_parallel_rescale(dev_stats[t] + 2 * N,
                                              dev_stats[t], dev_stats[t] + N,
                                              N, 0));
    }
    for (int t = 0; t < tp; t++) {
        gpu_test_download(host, dev_stats[t] + 2 * N, 2 * (size_t)N);
        for (int i = 0; i < 2 * N; i++)
            group[i] = t == 0 ? host[i] : group[i] + host[i];
    }
    float *dev_losses = gpu_test_device((size_t)N * sizeof(float));
    float *got_losses = gpu_test_host((size_t)N * sizeof(float));
    float *got = gpu_test_host((size_t)N * V * sizeof(float));
    bool padding_zero = true, losses_agree = true;
    for (int t = 0; t < tp; t++) {
        GPU_CHECK(cudaMemcpy(dev_stats[t] + 2 * N, group,
                             2 * (size_t)N * sizeof(float),
                             cudaMemcpyHostToDevice));
        float *s = dev_stats[t];
        GPU_CHECK(cuda_vocab_parallel_finish(dev_logits[t], dev_losses,
                                             dev_targets, s + N, s + 2 * N,
                                             s + 3 * N, firsts[t], N,
                                             counts[t], lds[t], 0));
        gpu_test_download(host, dev_losses, (size_t)N);
        for (int n = 0; n < N; n++)
            losses_agree = losses_agree && (t == 0 || host[n] == got_losses[n]);
        memcpy(got_losses, host, (size_t)N * sizeof(float));
        float *rows = gpu_test_host((size_t)N * lds[t] * sizeof(float));
        gpu_test_download_bf16(rows, dev_logits[t], (size_t)N * lds[t]);
        for (int n = 0; n < N; n++) {
            memcpy(got + (size_t)n * V + firsts[t], rows + (size_t)n * lds[t],
                   (size_t)counts[t] * sizeof(float));
            for (int c = counts[t]; c < lds[t]; c++)
                padding_zero =
                    padding_zero && rows[(size_t)n * lds[t] + c] == 0.0f;
        }
        free(rows);
    }
    snprintf(name, sizeof name, "vocab-parallel losses N=%d V=%d tp=%d", N,
             V, tp);
    gpu_test_compare(tally, name, got_losses, want_losses, (size_t)N,
                     TOL_FP32);
    snprintf(name, sizeof name, "vocab-parallel d_logits V=%d tp=%d", V, tp);
    gpu_test_compare(tally, name, got, probs, (size_t)N * V, TOL_BF16_OUT);
    snprintf(name, sizeof name,
             "vocab-parallel: every shard gets the same losses and zeroes "
             "its padding (tp=%d)",
             tp);
    gpu_test_expect(tally, losses_agree && padding_zero, name);
    for (int t = 0; t < tp; t++)
        cudaFree(dev_logits[t]), cudaFree(dev_stats[t]);
    free(logits), free(targets), free(probs), free(want_losses), free(host);
    free(group), free(got_losses), free(got);
    cudaFree(dev_targets), cudaFree(dev_losses);
}

/* ----------------------------------------------------------- optimizer */

static void test_optimizer(gpu_test_tally *tally)
{
    /* two tensors: one decayed, one not, the second not 4-aligned */
    size_t sizes[2] = {40000, 1001};
    size_t total = sizes[0] + sizes[1];
    float *params = random_host(total, 1.0f, 0.0f);
    float *grads = random_host(total, 0.1f, 0.0f);
    float *m = random_host(total, 0.01f, 0.0f);
    float *v = random_host(total, 0.001f, 0.001f);
    float *dev_params = gpu_test_upload(params, total);
    float *dev_grads = gpu_test_upload(grads, total);
    float *dev_m = gpu_test_upload(m, total);
    float *dev_v = gpu_test_upload(v, total);
    pt_bf16 *dev_mirror = gpu_test_device(total * sizeof(pt_bf16));
    adamw_config config = adamw_defaults();
    long step = 3;
    float lr = 1e-3f, grad_scale = 0.7f;
    param_chunk chunks[8];
    int chunk_count = 0;
    size_t offset = 0;
    for (int t = 0; t < 2; t++) {
        cpu_adamw_update(params + offset, grads + offset, m + offset,
                         v + offset, sizes[t], &config, lr, grad_scale, step,
                         t == 0);
        for (size_t start = 0; start < sizes[t];
             start += PARAM_CHUNK_ELEMENTS) {
            size_t left = sizes[t] - start;
            chunks[chunk_count++] = (param_chunk){
                .offset = offset + start,
                .mirror_offset = offset + start,
                .moment_offset = offset + start, /* the whole optimizer */
                .count = (uint32_t)(left < PARAM_CHUNK_ELEMENTS
                                        ? left
                                        : PARAM_CHUNK_ELEMENTS),
                .decay = t == 0,
            };
        }
        offset += sizes[t];
    }
    param_chunk *dev_chunks = gpu_test_device(sizeof chunks);
    GPU_CHECK(cudaMemcpy(dev_chunks, chunks, sizeof chunks,
                         cudaMemcpyHostToDevice));
    adamw_args args = {
        .learning_rate = lr, .beta1 = config.beta1, .beta2 = config.beta2,
        .eps = config.eps, .weight_decay = config.weight_decay,
        .grad_scale = grad_scale,
        .first_correction = (float)(1.0 - pow(config.beta1, (double)step)),
        .second_correction = (float)(1.0 - pow(config.beta2, (double)step)),
    };
    GPU_CHECK(cuda_adamw(dev_params, cuda_grad_fp32(dev_grads), dev_m, dev_v,
                         dev_mirror, dev_chunks, chunk_count, &args, 0));
    float *got = gpu_test_host(total * sizeof(float));
    gpu_test_download(got, dev_params, total);
    gpu_test_compare(tally, "adamw parameters", got, params, total, 1e-6);
    gpu_test_download(got, dev_m, total);
    gpu_test_compare(tally, "adamw first moment", got, m, total, 1e-6);
    gpu_test_download(got, dev_v, total);
    gpu_test_compare(tally, "adamw second moment", got, v, total, 1e-6);
    gpu_test_download_bf16(got, dev_mirror, total);
    gpu_test_compare(tally, "adamw bf16 mirror", got, params, total,
                     TOL_BF16_OUT);

    double want_sum = 0.0;
    for (size_t i = 0; i < total; i++)
        want_sum += (double)grads[i] * grads[i];
    double *dev_sum = gpu_test_device(sizeof(double));
    double *scratch = gpu_test_device(cuda_square_sum_scratch() *
                                      sizeof(double));
    GPU_CHECK(cuda_square_sum(dev_sum, cuda_grad_fp32(dev_grads), total,
                              scratch, 0));
    double got_sum = 0.0;
    GPU_CHECK(cudaMemcpy(&got_sum, dev_sum, sizeof got_sum,
                         cudaMemcpyDeviceToHost));
    float got_f = (float)got_sum, want_f = (float)want_sum;
    gpu_test_compare(tally, "gradient sum of squares", &got_f, &want_f, 1,
                     1e-6);

    /* per tensor, through the chunk table: tensor 1 starts at the first
     * chunk past tensor 0 */
    int tensor_chunk_starts[3] = {0, 0, chunk_count};
    while (chunks[tensor_chunk_starts[1]].offset < sizes[0])
        tensor_chunk_starts[1]++;
    int *dev_starts = gpu_test_device(sizeof tensor_chunk_starts);
    GPU_CHECK(cudaMemcpy(dev_starts, tensor_chunk_starts,
                         sizeof tensor_chunk_starts, cudaMemcpyHostToDevice));
    double *dev_sums = gpu_test_device(2 * sizeof(double));
    double *dev_chunk_sums = gpu_test_device(8 * sizeof(double));
    GPU_CHECK(cuda_square_sums_per_tensor(dev_sums,
                                          cuda_grad_fp32(dev_grads),
                                          dev_chunks,
                                          chunk_count, dev_starts, 2,
                                          dev_chunk_sums, 0));
    double got_sums[2];
    GPU_CHECK(cudaMemcpy(got_sums, dev_sums, sizeof got_sums,
                         cudaMemcpyDeviceToHost));
    float got_per_tensor[2], want_per_tensor[2] = {0.0f, 0.0f};
    double want_tensor[2] = {0.0, 0.0};
    for (size_t i = 0; i < total; i++)
        want_tensor[i < sizes[0] ? 0 : 1] += (double)grads[i] * grads[i];
    for (int t = 0; t < 2; t++) {
        got_per_tensor[t] = (float)got_sums[t];
        want_per_tensor[t] = (float)want_tensor[t];
    }
    gpu_test_compare(tally, "gradient sums of squares per tensor",
                     got_per_tensor, want_per_tensor, 2, 1e-6);
    cudaFree(dev_starts), cudaFree(dev_sums), cudaFree(dev_chunk_sums);
    free(params), free(grads), free(m), free(v), free(got);
    cudaFree(dev_params), cudaFree(dev_grads), cudaFree(dev_m);
    cudaFree(dev_v), cudaFree(dev_mirror), cudaFree(dev_chunks);
    cudaFree(dev_sum), cudaFree(scratch);
}

/* --------------------------------------------- llm.c's bf16 gradients */

/* A bias gradient added into bf16 (the sum in fp32, rounded once: the
 * cpu reference's rounding of its fp32 sum; the two sums' orders differ,
 * so one bf16 step apart at most), and AdamW and the sum of squares
 * reading bf16 gradients against the cpu's over the same values. */
static void test_bf16_grads(gpu_test_tally *tally, int N, int OC)
{
    size_t count = (size_t)N * OC;
    float *grad_out = random_bf16_host(count, 1.0f);
    float *want = random_bf16_host((size_t)OC, 1.0f);
    pt_bf16 *dev_bias = gpu_test_upload_bf16(want, (size_t)OC);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OC; j++)
            want[j] += grad_out[(size_t)n * OC + j];
    cpu_round_to_bf16(want, (size_t)OC);
    pt_bf16 *dev_grad = gpu_test_upload_bf16(grad_out, count);
    float *scratch =
        gpu_test_device(cuda_bias_grad_scratch(N, OC) * sizeof(float));
    cuda_grad bias = {dev_bias, true};
    GPU_CHECK(cuda_bias_grad(bias, dev_grad, scratch, N, OC, 0));
    float *got = gpu_test_host((size_t)OC * sizeof(float));
    gpu_test_download_bf16(got, dev_bias, (size_t)OC);
    gpu_test_compare(tally, "bias grad into bf16", got, want, (size_t)OC,
                     TOL_BF16_OUT);

    /* AdamW of one decayed tensor, not a multiple of 4 */
    size_t total = 5003;
    float *params = random_host(total, 1.0f, 0.0f);
    float *grads = random_bf16_host(total, 0.1f);
    float *m = random_host(total, 0.01f, 0.0f);
    float *v = random_host(total, 0.001f, 0.001f);
    float *dev_params = gpu_test_upload(params, total);
    pt_bf16 *dev_grads = gpu_test_upload_bf16(grads, total);
    float *dev_m = gpu_test_upload(m, total);
    float *dev_v = gpu_test_upload(v, total);
    adamw_config config = adamw_defaults();
    cpu_adamw_update(params, grads, m, v, total, &config, 1e-3f, 1.0f, 2,
                     true);
    param_chunk chunk = {.offset = 0, .mirror_offset = 0,
                         .moment_offset = 0, .count = (uint32_t)total,
                         .decay = true};
    param_chunk *dev_chunk = gpu_test_device(sizeof chunk);
    GPU_CHECK(cudaMemcpy(dev_chunk, &chunk, sizeof chunk,
                         cudaMemcpyHostToDevice));
    adamw_args args = {
        .learning_rate = 1e-3f, .beta1 = config.beta1,
        .beta2 = config.beta2, .eps = config.eps,
        .weight_decay = config.weight_decay, .grad_scale = 1.0f,
        .first_correction = (float)(1.0 - pow(config.beta1, 2.0)),
        .second_correction = (float)(1.0 - pow(config.beta2, 2.0)),
    };
    cuda_grad bf16_grads = {dev_grads, true};
    GPU_CHECK(cuda_adamw(dev_params, bf16_grads, dev_m, dev_v, NULL,
                         dev_chunk, 1, &args, 0));
    float *got_params = gpu_test_host(total * sizeof(float));
    gpu_test_download(got_params, dev_params, total);
    gpu_test_compare(tally, "adamw of bf16 gradients", got_params, params,
                     total, 1e-6);
    double want_sum = 0.0;
    for (size_t i = 0; i < total; i++)
        want_sum += (double)grads[i] * grads[i];
    double *dev_sum = gpu_test_device(sizeof(double));
    double *sum_scratch =
        gpu_test_device(cuda_square_sum_scratch() * sizeof(double));
    GPU_CHECK(cuda_square_sum(dev_sum, bf16_grads, total, sum_scratch, 0));
    double got_sum = 0.0;
    GPU_CHECK(cudaMemcpy(&got_sum, dev_sum, sizeof got_sum,
                         cudaMemcpyDeviceToHost));
    float got_f = (float)got_sum, want_f = (float)want_sum;
    gpu_test_compare(tally, "sum of squares of bf16 gradients", &got_f,
                     &want_f, 1, 1e-6);
    free(grad_out), free(want), free(got), free(params), free(grads);
    free(m), free(v), free(got_params);
    cudaFree(dev_bias), cudaFree(dev_grad), cudaFree(scratch);
    cudaFree(dev_params), cudaFree(dev_grads), cudaFree(dev_m);
    cudaFree(dev_v), cudaFree(dev_chunk), cudaFree(dev_sum);
    cudaFree(sum_scratch);
}

int main(void)
{
    gpu_test_require_device("test_cuda_ops");
    gpu_test_tally tally = {0, 0};
    test_embedding(&tally);
    test_stream_from(&tally, 120, 96, 40);  /* 8 channels a thread */
    test_stream_from(&tally, 77, 100, 7);   /* C % 8 != 0: one each */
    /* the fused backward: 1, 2 and 4 channel groups per thread, several
     * groups of blocks (2500 rows: 79 blocks); then the generic kernels */
    test_layernorm(&tally, 300, 768);
    test_layernorm(&tally, 2500, 1600);
    /* the warp-row backward's widths (C <= 2048): several groups of
     * blocks, a lane's partial last group, two blocks of 32 rows */
    test_layernorm(&tally, 5000, 1024);
    test_layernorm(&tally, 1500, 1280);
    /* 48 KiB of sums a block (G = 3 at 8 warps a block; G = 6 at 4), a
     * launch that must ask for it; 1 and 2 groups a lane */
    test_layernorm(&tally, 700, 1536);
    test_layernorm(&tally, 300, 256);
    test_layernorm(&tally, 300, 512);
    test_layernorm(&tally, 37, 2048);
    test_layernorm(&tally, 200, 2560);
    test_layernorm(&tally, 100, 5120);
    test_layernorm(&tally, 64, 12288); /* above 8192: generic, vector */
    test_layernorm(&tally, 77, 100); /* C % 8 != 0: the scalar path */
    test_bias_grad(&tally, 1000, 768);
    test_bias_grad(&tally, 333, 100);
    test_gelu(&tally);
    test_products(&tally);
    test_bias_epilogue(&tally, 1664, 4096, 1664); /* GPT-2 1.5B's shapes */
    test_bias_epilogue(&tally, 1664, 4096, 6656); /* at mbs 4, seq 1024 */
    test_bias_epilogue(&tally, 4992, 4096, 1664);
    test_attention(&tally, 2, 256, 128, 2);   /* D 64, whole tiles */
    test_attention(&tally, 3, 200, 192, 3);   /* D 64, T not a multiple */
    test_attention(&tally, 1, 130, 256, 2);   /* D 128 */
    test_attention(&tally, 2, 70, 48, 3);     /* D 16: plain fallback */
    test_attention_rows(&tally, 12288);       /* 48 KiB of scores */
    /* a row of 5 columns (the tail alone), and up to Llama 3's
     * vocabulary */
    test_classifier(&tally, 64, 1000);
    test_classifier(&tally, 16, 50257);
    test_classifier(&tally, 8, 5);
    test_classifier(&tally, 8, 65536);
    test_classifier(&tally, 8, 128256);
    test_vocab_parallel_classifier(&tally, 64, 1001, 2);
    test_vocab_parallel_classifier(&tally, 16, 50257, 4);
    test_optimizer(&tally);
    test_bf16_grads(&tally, 1000, 768);
    GPU_CHECK(cudaGetLastError());
    return gpu_test_finish(&tally, "test_cuda_ops");
}
