/* Llama-family layers in the cost model against closed forms written out
 * by hand (docs/cost-model.md, "Llama-family layers"): FLOPs per token
 * (6N plus the attention term), the roofline's FLOPs of one rank with
 * grouped-query attention split and replicated over tp, parameters per
 * stage with the untied head on the last one, and the activation memory
 * a layer adds over its GPT-2 counterpart. GPT-2 layers stay exactly
 * what they were. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

static model_shape bundled(const char *name)
{
    const char *root = getenv("PARTITA_SOURCE");
    if (root == NULL)
        fail_msg("PARTITA_SOURCE is not set: run the tests with meson test");
    char path[PT_PATH_MAX];
    snprintf(path, sizeof path, "%s/models/%s.json", root, name);
    model_shape m;
    pt_error err = {""};
    if (model_load_file(path, &m, &err) != 0)
        fail_msg("%s", err.message);
    return m;
}

static void assert_close(double got, double want, double relative)
{
    if (!(fabs(got - want) <= relative * fabs(want)))
        fail_msg("got %.17g, want %.17g (relative %.3g)", got, want,
                 fabs(got - want) / fabs(want));
}

/* One layer's forward FLOPs, b sequences: 2 b s (2h^2 + 2 h kv d + 3 h f)
 * + 4 b s^2 h. */
static void test_layer_flops(void **state)
{
    (void)state;
    model_shape m = bundled("llama3-8b");
    double h = 4096, kvd = 8 * 128, f = 14336, s = 8192, b = 2;
    double want = 2 * b * s * (2 * h * h + 2 * h * kvd + 3 * h * f) +
                  4 * b * s * s * h;
    assert_true(model_layer_forward_flops(&m, b) == want);
    /* a GPT-2 layer: the old count, bit for bit */
    model_shape gpt = bundled("gpt2-xl");
    assert_true(model_layer_forward_flops(&gpt, 3) ==
                layer_forward_flops(1600, 6400, 1024, 3));
}

/* Training FLOPs per token (Megatron's count, no recompute) = 6 x the
 * matrices' parameters (the head's included, the token embedding's and
 * the norms' not) + the attention term 12 L s h. */
static void test_six_n(void **state)
{
    (void)state;
    static const char *const names[] = {"llama3-8b", "llama3-70b",
                                        "llama2-7b", "llama3.2-1b",
                                        "mistral-7b", "llama3.1-405b"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        model_shape m = bundled(names[i]);
        double h = m.hidden, V = m.vocab, L = m.layers, s = m.seq;
        double N = model_parameter_count(&m);
        double not_matrices = V * h                 /* token embedding */
                              + L * 2 * h + h       /* RMSNorm weights */
                              - (m.tied_embeddings ? V * h : 0.0);
        double per_token = 6 * (N - not_matrices) + 12 * L * s * h;
        int gbs = 4;
        double flops = model_flops_per_iteration(&m, gbs, false);
        assert_close(flops / (gbs * s), per_token, 1e-12);
    }
}

/* A roofline whose kernels run at peak with no overhead and memory for
 * free: a part's time x peak is its FLOPs. */
static double roofline_layer_flops(const model_shape *m, int tp)
{
    roofline_params p = {.present = true, .gemm_efficiency = 1.0,
                         .gemm_half_work_flop = 1e-30,
                         .attention_efficiency = 1.0,
                         .bandwidth_efficiency = 1.0,
                         .kernel_overhead_s = 0.0,
                         .bandwidth_saturation_sm_fraction = 1.0};
    roofline_device d = {.peak_flops = 1e15, .bandwidth_bytes_per_s = 1e30,
                         .sms = 100, .sms_used = 100};
    model_part_costs costs;
    roofline_part_costs(&p, &d, m,
                        (roofline_shard){tp, 1, 2.0, false, 4.0, true, true},
                        &costs);
    return costs.layer.forward_s * d.peak_flops;
}

/* The roofline's FLOPs of one rank: the layer's / tp where tp splits the
 * 8 key/value heads; at tp 16 each rank computes one whole key and one
 * value head (2 s h d more than its 1/16 share of 8 heads, half of it). */
static void test_roofline_gqa(void **state)
{
    (void)state;
    model_shape m = bundled("llama3-70b");
    double s = m.seq, h = m.hidden, d = 128;
    for (int tp = 1; tp <= 8; tp *= 2)
        assert_close(roofline_layer_flops(&m, tp),
                     model_layer_forward_flops(&m, 1) / tp, 1e-9);
    double copies = 2.0 * s * (2.0 * h * d) * (1.0 - 8.0 / 16.0);
    assert_close(roofline_layer_flops(&m, 16),
                 model_layer_forward_flops(&m, 1) / 16 + copies, 1e-9);
}

/* Parameters per GPU over the stages and tp ranks add up to the model's
 * (untied head on the last stage, no position embedding); with kv_heads
 * < tp each rank holds a whole key and value head. */
static void test_stage_parameters(void **state)
{
    (void)state;
    model_shape m = bundled("llama3-70b");
    parallel_config c = {.tp = 8, .pp = 4, .dp = 1, .mbs = 1, .gbs = 8};
    double total = 0.0;
    for (int stage = 0; stage < 4; stage++)
        total += 8 * stage_parameters_per_gpu(&m, &c, stage, 20);
    assert_close(total, model_parameter_count(&m), 1e-15);
    double h = m.hidden, V = m.vocab;
    assert_close(stage_parameters_per_gpu(&m, &c, 3, 0), (V * h + h) / 8,
                 1e-15);
    assert_close(stage_parameters_per_gpu(&m, &c, 0, 0), V * h / 8, 1e-15);
    c.tp = 16;
    double layer = model_layer_parameter_count(&m);
    double kv_head = 2.0 * 128 * h; /* one key and one value head */
    assert_close(stage_parameters_per_gpu(&m, &c, 1, 20),
                 20 * (layer / 16 + kv_head * (1.0 - 8.0 / 16.0)), 1e-15);
}

/* The activations one layer keeps over a GPT-2 layer of the same widths
 * (tp 1, flash attention, one micro-batch in flight): RMSNorm keeps one
 * statistic a row, not two (-8 N bytes); K and V are kv d wide, not h
 * (2 e N (kv d - h)); SwiGLU keeps gate and up, its product made again
 * in the backward as the GELU's output is (e N f more). */
static void test_layer_activations(void **state)
{
    (void)state;
    model_shape m = bundled("llama3-8b");
    model_shape gpt = m;
    gpt.kv_heads = gpt.heads;
    gpt.norm = MODEL_NORM_LAYERNORM;
    gpt.mlp = MODEL_MLP_GELU;
    gpt.positions = MODEL_POSITIONS_LEARNED;
    gpt.bias = MODEL_BIAS_ALL;
    assert_true(model_is_gpt(&gpt));
    parallel_config c = {.tp = 1, .pp = 1, .dp = 1, .mbs = 1, .gbs = 1,
                         .precision = PRECISION_BF16};
    stage_memory llama, base;
    costmodel_stage_memory(&m, &c, 0, 0.0, &llama);
    costmodel_stage_memory(&gpt, &c, 0, 0.0, &base);
    double N = m.seq, e = 2, h = m.hidden, kvd = 8 * 128, f = m.ffn_hidden;
    double delta = -8 * N + 2 * e * N * (kvd - h) + e * N * f;
    assert_close(llama.per_layer.bytes[PT_MEMORY_ACTIVATIONS] -
                     base.per_layer.bytes[PT_MEMORY_ACTIVATIONS],
                 delta, 1e-12);
    /* weights: q h x h, k and v h x kv d, o h x h, SwiGLU 3 h f, two
       RMSNorm weights, fp32 */
    double layer = 2 * h * h + 2 * h * kvd + 3 * h * f + 2 * h;
    assert_true(llama.per_layer.bytes[PT_MEMORY_WEIGHTS] == 4 * layer);
}

/* tp must split the query heads, and split the key/value heads or be a
 * multiple of them; GPT-2 models keep splitting columns unchecked. */
static void test_tp_check(void **state)
{
    (void)state;
    model_shape qwen = bundled("qwen2.5-7b"); /* 28 heads, 4 kv heads */
    assert_int_equal(model_check_tp(&qwen, 4, NULL), 0);
    pt_error err = {""};
    assert_int_equal(model_check_tp(&qwen, 8, &err), -1);
    assert_non_null(strstr(err.message, "tp 8 does not divide its 28"));
    model_shape llama = bundled("llama3-8b");
    assert_int_equal(model_check_tp(&llama, 16, NULL), 0);
    model_shape gpt = bundled("gpt2-xl"); /* 25 heads */
    assert_int_equal(model_check_tp(&gpt, 2, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_flops),
        cmocka_unit_test(test_six_n),
        cmocka_unit_test(test_roofline_gqa),
        cmocka_unit_test(test_stage_parameters),
        cmocka_unit_test(test_layer_activations),
        cmocka_unit_test(test_tp_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
