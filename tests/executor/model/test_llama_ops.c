/*
 * The CPU reference ops of the Llama layer (executor/cpu/ops_llama_cpu.c):
 * each backward against central finite differences of its forward, as
 * test_ops.c does for GPT-2's (objective sum(out x probe), the same
 * tolerances and the same reasons for them), and each forward against
 * what it must be: RMSNorm against its closed form, SwiGLU against known
 * values, RoPE norm-preserving, relative and undone by its inverse, and
 * grouped-query attention equal to the multi-head op, to the bit when
 * every query head has its own key/value head, and to the multi-head op
 * on copied key/value heads otherwise. Checked by breaking each op
 * (a dropped RMSNorm term, silu' as the sigmoid, the rotation's sign, a
 * query head reading the wrong key head, the wrong RoPE frequency): each
 * fails, the gradients by 200 x the tolerance or more.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "op_check.h"

#define OP_ATOL 1e-3
#define OP_RTOL 1e-2
#define RMS_EPS 1e-5f
#define ROPE_BASE 10000.0

/* ------------------------------------------------------------ rmsnorm */

typedef struct rmsnorm_case {
    int N, C;
    float *inp, *weight, *out, *rstd, *probe;
} rmsnorm_case;

static double rmsnorm_objective(void *context)
{
    rmsnorm_case *r = context;
    cpu_rmsnorm_forward(r->out, r->rstd, r->inp, r->weight, RMS_EPS, r->N,
                        r->C);
    return weighted_sum(r->out, r->probe, (size_t)r->N * r->C);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 21);
    rmsnorm_case r = {.N = 3, .C = 11};
    size_t NC = (size_t)r.N * r.C;
    r.inp = new_normals(&rng, NC, 1.0);
    r.weight = new_normals(&rng, (size_t)r.C, 1.0);
    r.probe = new_normals(&rng, NC, 1.0);
    r.out = new_floats(NC);
    r.rstd = new_floats((size_t)r.N);
    rmsnorm_objective(&r);
    float *d_inp = new_floats(NC), *d_weight = new_floats((size_t)r.C);
    cpu_rmsnorm_backward(d_inp, d_weight, r.probe, r.inp, r.weight, r.rstd,
                         r.N, r.C);
    assert_true(worst_gradient_error("rmsnorm d_inp", rmsnorm_objective, &r,
                                     r.inp, d_inp, NC, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    assert_true(worst_gradient_error("rmsnorm d_weight", rmsnorm_objective,
                                     &r, r.weight, d_weight, (size_t)r.C,
                                     NULL, OP_ATOL, OP_RTOL) < 1.0);

    /* the closed form in double: x weight / sqrt(mean(x^2) + eps) */
    rmsnorm_objective(&r);
    for (int n = 0; n < r.N; n++) {
        double square_sum = 0.0;
        for (int c = 0; c < r.C; c++)
            square_sum += (double)r.inp[n * r.C + c] * r.inp[n * r.C + c];
        double rstd = 1.0 / sqrt(square_sum / r.C + RMS_EPS);
        assert_float_equal(r.rstd[n], rstd, 1e-5 * rstd);
        for (int c = 0; c < r.C; c++)
            assert_float_equal(r.out[n * r.C + c],
                               r.inp[n * r.C + c] * rstd * r.weight[c], 1e-5);
    }
    /* (3, 4) has rms sqrt(12.5): it maps to (0.848528, 1.131371) */
    float x[2] = {3.0f, 4.0f}, ones[2] = {1.0f, 1.0f}, y[2], rstd;
    cpu_rmsnorm_forward(y, &rstd, x, ones, RMS_EPS, 1, 2);
    assert_float_equal(y[0], 0.848528, 1e-5);
    assert_float_equal(y[1], 1.131371, 1e-5);
    free(r.inp);
    free(r.weight);
    free(r.probe);
    free(r.out);
    free(r.rstd);
    free(d_inp);
    free(d_weight);
}

/* ------------------------------------------------------------- swiglu */

typedef struct swiglu_case {
    int N, F;
    float *inp, *out, *probe;
} swiglu_case;

static double swiglu_objective(void *context)
{
    swiglu_case *s = context;
    cpu_swiglu_forward(s->out, s->inp, s->N, s->F);
    return weighted_sum(s->out, s->probe, (size_t)s->N * s->F);
}

static void test_swiglu(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 22);
    swiglu_case s = {.N = 3, .F = 9};
    size_t in_count = (size_t)s.N * 2 * s.F, out_count = (size_t)s.N * s.F;
    s.inp = new_normals(&rng, in_count, 2.0);
    s.probe = new_normals(&rng, out_count, 1.0);
    s.out = new_floats(out_count);
    float *d_inp = new_floats(in_count);
    cpu_swiglu_backward(d_inp, s.probe, s.inp, s.N, s.F);
    assert_true(worst_gradient_error("swiglu d_inp", swiglu_objective, &s,
                                     s.inp, d_inp, in_count, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    /* gate in the first half, up in the second: silu(1) x 2 = 1.462117,
     * silu(0) x 5 = 0, silu(-1) x 1 = -0.268941 */
    float row[6] = {1.0f, 0.0f, -1.0f, 2.0f, 5.0f, 1.0f}, y[3];
    cpu_swiglu_forward(y, row, 1, 3);
    assert_float_equal(y[0], 1.462117, 1e-5);
    assert_float_equal(y[1], 0.0, 1e-7);
    assert_float_equal(y[2], -0.268941, 1e-5);
    free(s.inp);
    free(s.probe);
    free(s.out);
    free(d_inp);
}

/* --------------------------------------------------------------- rope */

typedef struct rope_case {
    int B, T, width, heads, head_size;
    float *inp, *out, *probe;
} rope_case;

static double rope_objective(void *context)
{
    rope_case *r = context;
    cpu_rope_forward(r->out, r->inp, ROPE_BASE, r->B, r->T, r->width,
                     r->heads, r->head_size);
    return weighted_sum(r->out, r->probe, (size_t)r->B * r->T * r->width);
}

/* Three heads of 8 rotated, then 5 channels passed through. */
static rope_case new_rope_case(model_rng *rng)
{
    rope_case r = {.B = 2, .T = 5, .width = 29, .heads = 3, .head_size = 8};
    size_t count = (size_t)r.B * r.T * r.width;
    r.inp = new_normals(rng, count, 1.0);
    r.probe = new_normals(rng, count, 1.0);
    r.out = new_floats(count);
    return r;
}

static void free_rope_case(rope_case *r)
{
    free(r->inp);
    free(r->out);
    free(r->probe);
}

static void test_rope_gradient(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 23);
    rope_case r = new_rope_case(&rng);
    size_t count = (size_t)r.B * r.T * r.width;
    float *d_inp = new_floats(count);
    cpu_rope_backward(d_inp, r.probe, ROPE_BASE, r.B, r.T, r.width, r.heads,
                      r.head_size);
    assert_true(worst_gradient_error("rope d_inp", rope_objective, &r, r.inp,
                                     d_inp, count, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    free(d_inp);
    free_rope_case(&r);
}

/* Each head keeps its norm; position 0 is not turned; the channels past
 * the heads pass unchanged; the inverse rotation (the backward, from
 * zero) gives the input back; in place equals out of place. */
static void test_rope_rotation(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 24);
    rope_case r = new_rope_case(&rng);
    size_t count = (size_t)r.B * r.T * r.width;
    rope_objective(&r);
    for (size_t row = 0; row < (size_t)r.B * r.T; row++) {
        const float *x = r.inp + row * r.width, *y = r.out + row * r.width;
        for (int h = 0; h < r.heads; h++) {
            double x_norm = 0.0, y_norm = 0.0;
            for (int c = h * r.head_size; c < (h + 1) * r.head_size; c++) {
                x_norm += (double)x[c] * x[c];
                y_norm += (double)y[c] * y[c];
            }
            assert_float_equal(y_norm, x_norm, 1e-5 * x_norm);
        }
        int rotated = row % (size_t)r.T == 0 ? 0 : r.heads * r.head_size;
        for (int c = rotated; c < r.width; c++)
            assert_true(y[c] == x[c]);
    }
    float *back = new_floats(count), *in_place = new_floats(count);
    cpu_rope_backward(back, r.out, ROPE_BASE, r.B, r.T, r.width, r.heads,
                      r.head_size);
    for (size_t i = 0; i < count; i++)
        assert_float_equal(back[i], r.inp[i], 1e-5);
    memcpy(in_place, r.inp, count * sizeof *in_place);
    cpu_rope_forward(in_place, in_place, ROPE_BASE, r.B, r.T, r.width,
                     r.heads, r.head_size);
    assert_memory_equal(in_place, r.out, count * sizeof *in_place);
    free(back);
    free(in_place);
    free_rope_case(&r);
}

/* The convention, by hand: a head of 2 turns by t radians at position t
 * (frequency base^0); in a head of 4 the second pair turns by
 * t / sqrt(base), and channel i pairs with i + 2 (rotate-half). And what
 * rotary positions are for: q at position t + d against k at t scores
 * the same for every t. */
static void test_rope_convention(void **state)
{
    (void)state;
    float pair[3 * 2] = {1, 0, 1, 0, 1, 0};
    cpu_rope_forward(pair, pair, ROPE_BASE, 1, 3, 2, 1, 2);
    for (int t = 0; t < 3; t++) {
        assert_float_equal(pair[2 * t], cos(t), 1e-6);
        assert_float_equal(pair[2 * t + 1], sin(t), 1e-6);
    }
    float head[2 * 4] = {0, 1, 0, 0, 0, 1, 0, 0};
    cpu_rope_forward(head, head, ROPE_BASE, 1, 2, 4, 1, 4);
    double angle = 1.0 / sqrt(ROPE_BASE);
    assert_float_equal(head[4 + 1], cos(angle), 1e-6);
    assert_float_equal(head[4 + 3], sin(angle), 1e-6);
    assert_true(head[4 + 0] == 0.0f && head[4 + 2] == 0.0f);

    model_rng rng;
    model_rng_seed(&rng, 25);
    enum { T = 12, D = 16 };
    float q[D], k[D], qs[T * D], ks[T * D];
    fill_normal(&rng, q, D, 1.0);
    fill_normal(&rng, k, D, 1.0);
    for (int t = 0; t < T; t++) {
        memcpy(qs + t * D, q, sizeof q);
        memcpy(ks + t * D, k, sizeof k);
    }
    cpu_rope_forward(qs, qs, ROPE_BASE, 1, T, D, 1, D);
    cpu_rope_forward(ks, ks, ROPE_BASE, 1, T, D, 1, D);
    for (int d = 0; d < 3; d++) {
        double first = 0.0;
        for (int c = 0; c < D; c++)
            first += (double)qs[d * D + c] * ks[c];
        for (int t = 1; t + d < T; t++) {
            double score = 0.0;
            for (int c = 0; c < D; c++)
                score += (double)qs[(t + d) * D + c] * ks[t * D + c];
            assert_float_equal(score, first, 1e-4);
        }
    }
}

/* ----------------------------------------------- grouped-query attention */

typedef struct gqa_case {
    int B, T, NH, KVH, hs;
    float *qkv, *out, *probs, *probe;
} gqa_case;

static size_t gqa_qkv_count(const gqa_case *g)
{
    return (size_t)g->B * g->T * (g->NH + 2 * g->KVH) * g->hs;
}

static size_t gqa_out_count(const gqa_case *g)
{
    return (size_t)g->B * g->T * g->NH * g->hs;
}

static double gqa_objective(void *context)
{
    gqa_case *g = context;
    cpu_gqa_attention_forward(g->out, g->probs, g->qkv, g->B, g->T, g->NH,
                              g->KVH, g->hs);
    return weighted_sum(g->out, g->probe, gqa_out_count(g));
}

static gqa_case new_gqa_case(model_rng *rng, int NH, int KVH)
{
    gqa_case g = {.B = 2, .T = 5, .NH = NH, .KVH = KVH, .hs = 4};
    g.qkv = new_normals(rng, gqa_qkv_count(&g), 1.0);
    g.probe = new_normals(rng, gqa_out_count(&g), 1.0);
    g.out = new_floats(gqa_out_count(&g));
    g.probs = new_floats((size_t)g.B * g.NH * g.T * g.T);
    return g;
}

static void free_gqa_case(gqa_case *g)
{
    free(g->qkv);
    free(g->out);
    free(g->probs);
    free(g->probe);
}

static void check_gqa_gradient(int NH, int KVH)
{
    model_rng rng;
    model_rng_seed(&rng, 26);
    gqa_case g = new_gqa_case(&rng, NH, KVH);
    gqa_objective(&g);
    float *d_qkv = new_floats(gqa_qkv_count(&g));
    float *scratch = new_floats((size_t)g.T);
    cpu_gqa_attention_backward(d_qkv, g.probe, g.qkv, g.probs, scratch, g.B,
                               g.T, g.NH, g.KVH, g.hs);
    assert_true(worst_gradient_error("gqa d_qkv", gqa_objective, &g, g.qkv,
                                     d_qkv, gqa_qkv_count(&g), NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    free(d_qkv);
    free(scratch);
    free_gqa_case(&g);
}

static void test_gqa_gradient(void **state)
{
    (void)state;
    check_gqa_gradient(4, 2); /* groups of two */
    check_gqa_gradient(4, 1); /* one key/value head for all (MQA) */
    check_gqa_gradient(2, 2); /* one per query head */
}

/* With a key/value head per query head the layout is the multi-head
 * op's (queries, keys, values side by side, C = NH hs) and so are the
 * sums: every output, probability and gradient the same bits. */
static void test_gqa_equals_attention(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 27);
    gqa_case g = new_gqa_case(&rng, 3, 3);
    int C = g.NH * g.hs;
    size_t probs_count = (size_t)g.B * g.NH * g.T * g.T;
    float *out = new_floats(gqa_out_count(&g));
    float *probs = new_floats(probs_count);
    gqa_objective(&g);
    cpu_attention_forward(out, probs, g.qkv, g.B, g.T, C, g.NH);
    assert_memory_equal(out, g.out, gqa_out_count(&g) * sizeof *out);
    assert_memory_equal(probs, g.probs, probs_count * sizeof *probs);

    float *d_gqa = new_floats(gqa_qkv_count(&g));
    float *d_mha = new_floats(gqa_qkv_count(&g));
    float *scratch = new_floats((size_t)g.T);
    cpu_gqa_attention_backward(d_gqa, g.probe, g.qkv, g.probs, scratch, g.B,
                               g.T, g.NH, g.KVH, g.hs);
    cpu_attention_backward(d_mha, g.probe, g.qkv, probs, scratch, g.B, g.T,
                           C, g.NH);
    assert_memory_equal(d_gqa, d_mha, gqa_qkv_count(&g) * sizeof *d_gqa);
    free(out);
    free(probs);
    free(d_gqa);
    free(d_mha);
    free(scratch);
    free_gqa_case(&g);
}

/* Query heads 2g and 2g + 1 share key/value head g: the multi-head op
 * on a copy of the projection with that head written out twice gives
 * the same output, and the shared head's gradient is the sum of its two
 * copies'. */
static void test_gqa_shares_heads(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 28);
    gqa_case g = new_gqa_case(&rng, 4, 2);
    int C = g.NH * g.hs, group = g.NH / g.KVH, rows = g.B * g.T;
    int width = (g.NH + 2 * g.KVH) * g.hs;
    float *wide = new_floats((size_t)rows * 3 * C);
    for (int r = 0; r < rows; r++) {
        const float *src = g.qkv + (size_t)r * width;
        float *dst = wide + (size_t)r * 3 * C;
        memcpy(dst, src, (size_t)C * sizeof *dst);
        for (int h = 0; h < g.NH; h++)
            for (int part = 1; part <= 2; part++)
                memcpy(dst + part * C + h * g.hs,
                       src + C + ((part - 1) * g.KVH + h / group) * g.hs,
                       (size_t)g.hs * sizeof *dst);
    }
    float *out = new_floats(gqa_out_count(&g));
    float *probs = new_floats((size_t)g.B * g.NH * g.T * g.T);
    gqa_objective(&g);
    cpu_attention_forward(out, probs, wide, g.B, g.T, C, g.NH);
    assert_memory_equal(out, g.out, gqa_out_count(&g) * sizeof *out);

    float *d_gqa = new_floats(gqa_qkv_count(&g));
    float *d_wide = new_floats((size_t)rows * 3 * C);
    float *scratch = new_floats((size_t)g.T);
    cpu_gqa_attention_backward(d_gqa, g.probe, g.qkv, g.probs, scratch, g.B,
                               g.T, g.NH, g.KVH, g.hs);
    cpu_attention_backward(d_wide, g.probe, wide, probs, scratch, g.B, g.T, C,
                           g.NH);
    for (int r = 0; r < rows; r++) {
        const float *dw = d_wide + (size_t)r * 3 * C;
        const float *dg = d_gqa + (size_t)r * width;
        for (int c = 0; c < C; c++)
            assert_true(dg[c] == dw[c]); /* queries: one head each */
        for (int part = 1; part <= 2; part++)
            for (int kv = 0; kv < g.KVH; kv++)
                for (int i = 0; i < g.hs; i++) {
                    double sum = 0.0;
                    for (int h = kv * group; h < (kv + 1) * group; h++)
                        sum += dw[part * C + h * g.hs + i];
                    assert_float_equal(
                        dg[C + ((part - 1) * g.KVH + kv) * g.hs + i], sum,
                        1e-5);
                }
    }
    free(wide);
    free(out);
    free(probs);
    free(d_gqa);
    free(d_wide);
    free(scratch);
    free_gqa_case(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_rope_gradient),
        cmocka_unit_test(test_rope_rotation),
        cmocka_unit_test(test_rope_convention),
        cmocka_unit_test(test_gqa_gradient),
        cmocka_unit_test(test_gqa_equals_attention),
        cmocka_unit_test(test_gqa_shares_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
