/*
 * Each CPU reference op's backward against central finite differences of
 * its forward. The objective is sum(out x probe) for a fixed random probe,
 * so the op's d_out is the probe and every output element counts.
 * Tolerances: grad_check.h gives the error budget. The ops here use
 * atol 1e-3, rtol 1e-2: the objectives reach |L| ~ 50 (a sum of ~150
 * products), so fp32 rounding of L divided by the step can approach 2e-4;
 * the worst element observed sits at a fifth of the tolerance, while the
 * gradients checked are 1e-2 .. 1 and a wrong term fails by 10 x or more
 * (checked by breaking the layer norm, attention and GELU backwards).
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

/* ------------------------------------------------------------- matmul */

typedef struct matmul_case {
    int N, C, OC;
    float *inp, *weight, *bias, *out, *probe;
} matmul_case;

static double matmul_objective(void *context)
{
    matmul_case *m = context;
    cpu_matmul_forward(m->out, m->inp, m->weight, m->bias, m->N, m->C, m->OC);
    return weighted_sum(m->out, m->probe, (size_t)m->N * m->OC);
}

static void check_matmul(int N, int C, int OC, bool with_bias)
{
    model_rng rng;
    model_rng_seed(&rng, 11);
    matmul_case m = {.N = N, .C = C, .OC = OC};
    m.inp = new_floats((size_t)N * C);
    m.weight = new_floats((size_t)OC * C);
    m.bias = with_bias ? new_floats((size_t)OC) : NULL;
    m.out = new_floats((size_t)N * OC);
    m.probe = new_floats((size_t)N * OC);
    fill_normal(&rng, m.inp, (size_t)N * C, 1.0);
    fill_normal(&rng, m.weight, (size_t)OC * C, 1.0);
    if (with_bias)
        fill_normal(&rng, m.bias, (size_t)OC, 1.0);
    fill_normal(&rng, m.probe, (size_t)N * OC, 1.0);

    float *d_inp = new_floats((size_t)N * C);
    float *d_weight = new_floats((size_t)OC * C);
    float *d_bias = new_floats((size_t)OC);
    cpu_matmul_backward(d_inp, d_weight, with_bias ? d_bias : NULL, m.probe,
                        m.inp, m.weight, N, C, OC);
    assert_true(worst_gradient_error("matmul d_inp", matmul_objective, &m,
                                     m.inp, d_inp, (size_t)N * C, NULL,
                                     OP_ATOL, OP_RTOL) < 1.0);
    assert_true(worst_gradient_error("matmul d_weight", matmul_objective, &m,
                                     m.weight, d_weight, (size_t)OC * C, NULL,
                                     OP_ATOL, OP_RTOL) < 1.0);
    if (with_bias)
        assert_true(worst_gradient_error("matmul d_bias", matmul_objective,
                                         &m, m.bias, d_bias, (size_t)OC, NULL,
                                         OP_ATOL, OP_RTOL) < 1.0);

    /* The forward against a plain triple loop in double: catches a wrong
     * index that the backward might share with the forward. */
    matmul_objective(&m);
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double expected = with_bias ? m.bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                expected += (double)m.inp[n * C + c] * m.weight[o * C + c];
            assert_float_equal(m.out[n * OC + o], expected, 1e-4);
        }
    }
    free(m.inp);
    free(m.weight);
    free(m.bias);
    free(m.out);
    free(m.probe);
    free(d_inp);
    free(d_weight);
    free(d_bias);
}

static void test_matmul(void **state)
{
    (void)state;
    check_matmul(3, 5, 7, true);     /* shorter than the 8-lane dot */
    check_matmul(4, 19, 37, true);   /* lanes plus a tail; two blocks */
    check_matmul(2, 8, 3, false);    /* no bias, as the LM head */
}

/* ---------------------------------------------------------- layernorm */

typedef struct layernorm_case {
    int N, C;
    float *inp, *weight, *bias, *out, *mean, *rstd, *probe;
} layernorm_case;

static double layernorm_objective(void *context)
{
    layernorm_case *l = context;
    cpu_layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->weight,
                          l->bias, l->N, l->C);
    return weighted_sum(l->out, l->probe, (size_t)l->N * l->C);
}

static void test_layernorm(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 12);
    int N = 3, C = 7;
    layernorm_case l = {.N = N, .C = C};
    size_t NC = (size_t)N * C;
    l.inp = new_floats(NC);
    l.weight = new_floats((size_t)C);
    l.bias = new_floats((size_t)C);
    l.out = new_floats(NC);
    l.mean = new_floats((size_t)N);
    l.rstd = new_floats((size_t)N);
    l.probe = new_floats(NC);
    fill_normal(&rng, l.inp, NC, 1.0);
    fill_normal(&rng, l.weight, (size_t)C, 1.0);
    fill_normal(&rng, l.bias, (size_t)C, 1.0);
    fill_normal(&rng, l.probe, NC, 1.0);
    layernorm_objective(&l);
    float *d_inp = new_floats(NC);
    float *d_weight = new_floats((size_t)C);
    float *d_bias = new_floats((size_t)C);
    cpu_layernorm_backward(d_inp, d_weight, d_bias, l.probe, l.inp, l.weight,
                           l.mean, l.rstd, N, C);
    assert_true(worst_gradient_error("layernorm d_inp", layernorm_objective,
                                     &l, l.inp, d_inp, NC, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    assert_true(worst_gradient_error("layernorm d_weight",
                                     layernorm_objective, &l, l.weight,
                                     d_weight, (size_t)C, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    assert_true(worst_gradient_error("layernorm d_bias", layernorm_objective,
                                     &l, l.bias, d_bias, (size_t)C, NULL,
                                     OP_ATOL, OP_RTOL) < 1.0);
    /* a normalised row has mean 0 and variance 1 before weight and bias */
    layernorm_objective(&l);
    for (int n = 0; n < N; n++) {
        double sum = 0.0, square_sum = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (l.out[n * C + c] - l.bias[c]) / l.weight[c];
            sum += xhat;
            square_sum += xhat * xhat;
        }
        assert_float_equal(sum / C, 0.0, 1e-4);
        assert_float_equal(square_sum / C, 1.0, 1e-3);
    }
    free(l.inp);
    free(l.weight);
    free(l.bias);
    free(l.out);
    free(l.mean);
    free(l.rstd);
    free(l.probe);
    free(d_inp);
    free(d_weight);
    free(d_bias);
}

/* ---------------------------------------------------------- attention */

typedef struct attention_case {
    int B, T, C, NH;
    float *qkv, *out, *probs, *probe;
} attention_case;

static double attention_objective(void *context)
{
    attention_case *a = context;
    cpu_attention_forward(a->out, a->probs, a->qkv, a->B, a->T, a->C, a->NH);
    return weighted_sum(a->out, a->probe, (size_t)a->B * a->T * a->C);
}

static void test_attention(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 13);
    attention_case a = {.B = 2, .T = 4, .C = 8, .NH = 2};
    size_t qkv_count = (size_t)a.B * a.T * 3 * a.C;
    size_t out_count = (size_t)a.B * a.T * a.C;
    size_t probs_count = (size_t)a.B * a.NH * a.T * a.T;
    a.qkv = new_floats(qkv_count);
    a.out = new_floats(out_count);
    a.probs = new_floats(probs_count);
    a.probe = new_floats(out_count);
    fill_normal(&rng, a.qkv, qkv_count, 1.0);
    fill_normal(&rng, a.probe, out_count, 1.0);
    attention_objective(&a);
    float *d_qkv = new_floats(qkv_count);
    float *scratch = new_floats((size_t)a.T);
    cpu_attention_backward(d_qkv, a.probe, a.qkv, a.probs, scratch, a.B, a.T,
                           a.C, a.NH);
    assert_true(worst_gradient_error("attention d_qkv", attention_objective,
                                     &a, a.qkv, d_qkv, qkv_count, NULL,
                                     OP_ATOL, OP_RTOL) < 1.0);

    /* Causality: every row of probabilities sums to 1 over positions up to
     * its own and is 0 after; the first position sees only itself, so its
     * output is its own value vector. */
    attention_objective(&a);
    for (size_t row = 0; row < (size_t)a.B * a.NH * a.T; row++) {
        int t = (int)(row % (size_t)a.T);
        double sum = 0.0;
        for (int t2 = 0; t2 < a.T; t2++) {
            float p = a.probs[row * a.T + t2];
            if (t2 > t)
                assert_true(p == 0.0f);
            sum += p;
        }
        assert_float_equal(sum, 1.0, 1e-5);
    }
    for (int c = 0; c < a.C; c++)
        assert_float_equal(a.out[c], a.qkv[2 * a.C + c], 1e-6);
    free(a.qkv);
    free(a.out);
    free(a.probs);
    free(a.probe);
    free(d_qkv);
    free(scratch);
}

/* ---------------------------------------------------------------- gelu */

typedef struct elementwise_case {
    size_t count;
    float *a, *b, *out, *probe;
} elementwise_case;

static double gelu_objective(void *context)
{
    elementwise_case *e = context;
    cpu_gelu_forward(e->out, e->a, e->count);
    return weighted_sum(e->out, e->probe, e->count);
}

static void test_gelu(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 14);
    elementwise_case e = {.count = 33};
    e.a = new_floats(e.count);
    e.out = new_floats(e.count);
    e.probe = new_floats(e.count);
    for (size_t i = 0; i < e.count; i++)
        e.a[i] = -4.0f + 8.0f * (float)i / (float)(e.count - 1);
    fill_normal(&rng, e.probe, e.count, 1.0);
    float *d_a = new_floats(e.count);
    cpu_gelu_backward(d_a, e.probe, e.a, e.count);
    assert_true(worst_gradient_error("gelu", gelu_objective, &e, e.a, d_a,
                                     e.count, NULL, OP_ATOL, OP_RTOL) < 1.0);
    /* known values of the tanh form: gelu(0) = 0, gelu(1) = 0.841192,
     * gelu(-1) = -0.158808 */
    float x[3] = {0.0f, 1.0f, -1.0f}, y[3];
    cpu_gelu_forward(y, x, 3);
    assert_float_equal(y[0], 0.0, 1e-7);
    assert_float_equal(y[1], 0.841192, 1e-5);
    assert_float_equal(y[2], -0.158808, 1e-5);
    free(e.a);
    free(e.out);
    free(e.probe);
    free(d_a);
}

/* ------------------------------------------------------------ residual */

static double residual_objective(void *context)
{
    elementwise_case *e = context;
    cpu_residual_forward(e->out, e->a, e->b, e->count);
    return weighted_sum(e->out, e->probe, e->count);
}

static void test_residual(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 15);
    elementwise_case e = {.count = 10};
    e.a = new_floats(e.count);
    e.b = new_floats(e.count);
    e.out = new_floats(e.count);
    e.probe = new_floats(e.count);
    fill_normal(&rng, e.a, e.count, 1.0);
    fill_normal(&rng, e.b, e.count, 1.0);
    fill_normal(&rng, e.probe, e.count, 1.0);
    float *d_a = new_floats(e.count);
    float *d_b = new_floats(e.count);
    /* start from non-zero gradients: backward must add, not overwrite */
    for (size_t i = 0; i < e.count; i++)
        d_a[i] = d_b[i] = 1.0f;
    cpu_residual_backward(d_a, d_b, e.probe, e.count);
    for (size_t i = 0; i < e.count; i++) {
        d_a[i] -= 1.0f;
        d_b[i] -= 1.0f;
    }
    assert_true(worst_gradient_error("residual d_a", residual_objective, &e,
                                     e.a, d_a, e.count, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    assert_true(worst_gradient_error("residual d_b", residual_objective, &e,
                                     e.b, d_b, e.count, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);
    free(e.a);
    free(e.b);
    free(e.out);
    free(e.probe);
    free(d_a);
    free(d_b);
}

/* ----------------------------------------------------------- embedding */

typedef struct embedding_case {
    int B, T, C, V;
    uint32_t *tokens;
    float *wte, *wpe, *out, *probe;
} embedding_case;

static double embedding_objective(void *context)
{
    embedding_case *e = context;
    cpu_embedding_forward(e->out, e->tokens, e->wte, e->wpe, e->B, e->T,
                          e->C);
    return weighted_sum(e->out, e->probe, (size_t)e->B * e->T * e->C);
}

static void test_embedding(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 16);
    /* token 2 appears three times: its gradient rows must add up */
    uint32_t tokens[] = {2, 0, 2, 4, 1, 2};
    embedding_case e = {.B = 2, .T = 3, .C = 4, .V = 5, .tokens = tokens};
    size_t out_count = (size_t)e.B * e.T * e.C;
    e.wte = new_floats((size_t)e.V * e.C);
    e.wpe = new_floats((size_t)e.T * e.C);
    e.out = new_floats(out_count);
    e.probe = new_floats(out_count);
    fill_normal(&rng, e.wte, (size_t)e.V * e.C, 1.0);
    fill_normal(&rng, e.wpe, (size_t)e.T * e.C, 1.0);
    fill_normal(&rng, e.probe, out_count, 1.0);
    float *d_wte = new_floats((size_t)e.V * e.C);
    float *d_wpe = new_floats((size_t)e.T * e.C);
    cpu_embedding_backward(d_wte, d_wpe, e.probe, tokens, e.B, e.T, e.C);
    assert_true(worst_gradient_error("embedding d_wte", embedding_objective,
                                     &e, e.wte, d_wte, (size_t)e.V * e.C,
                                     NULL, OP_ATOL, OP_RTOL) < 1.0);
    assert_true(worst_gradient_error("embedding d_wpe", embedding_objective,
                                     &e, e.wpe, d_wpe, (size_t)e.T * e.C,
                                     NULL, OP_ATOL, OP_RTOL) < 1.0);
    /* token 3 never appears: its row gets no gradient */
    for (int c = 0; c < e.C; c++)
        assert_true(d_wte[3 * e.C + c] == 0.0f);
    free(e.wte);
    free(e.wpe);
    free(e.out);
    free(e.probe);
    free(d_wte);
    free(d_wpe);
}

/* ------------------------------------------------ softmax cross-entropy */

#define CE_WEIGHT 0.7f

typedef struct crossentropy_case {
    int N, V;
    const uint32_t *targets;
    float *logits, *probs, *losses;
} crossentropy_case;

static double crossentropy_objective(void *context)
{
    crossentropy_case *x = context;
    float mean = cpu_softmax_crossentropy_forward(x->probs, x->losses,
                                                  x->logits, x->targets, x->N,
                                                  x->V);
    return CE_WEIGHT * (double)mean * x->N; /* CE_WEIGHT x sum of losses */
}

static void test_softmax_crossentropy(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 17);
    static const uint32_t targets[] = {0, 5, 3, 5};
    crossentropy_case x = {.N = 4, .V = 6, .targets = targets};
    size_t count = (size_t)x.N * x.V;
    x.logits = new_floats(count);
    x.probs = new_floats(count);
    x.losses = new_floats((size_t)x.N);
    fill_normal(&rng, x.logits, count, 2.0);
    crossentropy_objective(&x);
    float *d_logits = new_floats(count);
    cpu_softmax_crossentropy_backward(d_logits, x.probs, targets, CE_WEIGHT,
                                      x.N, x.V);
    assert_true(worst_gradient_error("cross-entropy d_logits",
                                     crossentropy_objective, &x, x.logits,
                                     d_logits, count, NULL, OP_ATOL,
                                     OP_RTOL) < 1.0);

    /* uniform logits: every loss is ln V; in place (probs == logits) gives
     * the same; huge logits stay finite */
    float flat[6] = {3, 3, 3, 3, 3, 3}, loss = 0.0f;
    float mean = cpu_softmax_crossentropy_forward(flat, &loss, flat,
                                                  targets + 1, 1, 6);
    assert_float_equal(mean, logf(6.0f), 1e-6);
    assert_float_equal(flat[0], 1.0 / 6.0, 1e-7);
    float extreme[2] = {1000.0f, -1000.0f};
    uint32_t second = 1;
    mean = cpu_softmax_crossentropy_forward(extreme, &loss, extreme, &second,
                                            1, 2);
    assert_true(isfinite(mean));
    assert_float_equal(mean, 2000.0, 1e-2);
    free(x.logits);
    free(x.probs);
    free(x.losses);
    free(d_logits);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_softmax_crossentropy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
