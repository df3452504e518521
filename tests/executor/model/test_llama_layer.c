/*
 * The whole Llama layer of the CPU reference (executor/cpu/
 * layer_llama_cpu.c) against central finite differences, as one
 * function: the input and every parameter, the objective sum(out x
 * probe) as in test_ops.c. Where the op tests check each piece, this
 * checks that the pieces are wired in the right order with the right
 * buffers (a gradient routed to the wrong place, a missing skip). The
 * layer is small (C 16, 4 heads sharing 2 key/value heads of 4, F 12,
 * B 2, T 5) so that every element is checked. Tolerances: rtol as the
 * op tests', atol 2e-3 rather than 1e-3, since the objective (|L| ~ 20,
 * through a whole fp32 layer) rounds more: the worst element observed
 * sits at a quarter of the tolerance (at half of atol 1e-3), while
 * breaking the wiring (the MLP's skip, the norm's input, the rotation's
 * backward, a scratch not zeroed) fails by 190 x or more.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "op_check.h"

#define LAYER_ATOL 2e-3
#define LAYER_RTOL 1e-2

enum { WEIGHTS = 6 };

typedef struct layer_case {
    cpu_llama_dims d;
    float *inp, *probe, *activations;
    float *weight[WEIGHTS];
    size_t weight_count[WEIGHTS];
    cpu_llama_activations act;
} layer_case;

static const char *const weight_names[WEIGHTS] = {
    "attn_norm", "qkv", "attn_out", "mlp_norm", "fc1", "fc2"};

static cpu_llama_weights weights_of(const layer_case *l)
{
    return (cpu_llama_weights){l->weight[0], l->weight[1], l->weight[2],
                               l->weight[3], l->weight[4], l->weight[5]};
}

static size_t rows(const layer_case *l)
{
    return (size_t)l->d.B * l->d.T;
}

static double layer_objective(void *context)
{
    layer_case *l = context;
    cpu_llama_weights w = weights_of(l);
    cpu_llama_layer_forward(&l->act, l->inp, &w, &l->d);
    return weighted_sum(l->act.out, l->probe, rows(l) * l->d.C);
}

static layer_case new_layer_case(model_rng *rng)
{
    layer_case l = {.d = {.B = 2, .T = 5, .C = 16, .heads = 4,
                          .kv_heads = 2, .head_size = 4, .F = 12,
                          .rope_base = 10000.0, .eps = 1e-5f}};
    size_t C = 16, W = (4 + 2 * 2) * 4, A = 4 * 4, F = 12;
    size_t counts[WEIGHTS] = {C, W * C, C * A, C, 2 * F * C, C * F};
    for (int i = 0; i < WEIGHTS; i++) {
        l.weight_count[i] = counts[i];
        /* the norms' weights near 1, the matrices ~ 1 / sqrt(fan-in), as
         * a trained layer's, so no path saturates */
        double spread = counts[i] == C ? 0.2 : 0.25;
        l.weight[i] = new_normals(rng, counts[i], spread);
        if (counts[i] == C)
            for (size_t c = 0; c < C; c++)
                l.weight[i][c] += 1.0f;
    }
    l.inp = new_normals(rng, rows(&l) * C, 1.0);
    l.probe = new_normals(rng, rows(&l) * C, 1.0);
    l.activations = new_floats(cpu_llama_activation_floats(&l.d));
    cpu_llama_activations_carve(&l.act, l.activations, &l.d);
    return l;
}

static void free_layer_case(layer_case *l)
{
    for (int i = 0; i < WEIGHTS; i++)
        free(l->weight[i]);
    free(l->inp);
    free(l->probe);
    free(l->activations);
}

static void test_layer_gradient(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 31);
    layer_case l = new_layer_case(&rng);
    float *grad[WEIGHTS];
    for (int i = 0; i < WEIGHTS; i++)
        grad[i] = new_floats(l.weight_count[i]);
    cpu_llama_grads g = {grad[0], grad[1], grad[2], grad[3], grad[4],
                         grad[5]};
    size_t in_count = rows(&l) * l.d.C;
    float *d_inp = new_floats(in_count);
    float *scratch = new_floats(cpu_llama_scratch_floats(&l.d));
    layer_objective(&l);
    cpu_llama_weights w = weights_of(&l);
    cpu_llama_layer_backward(d_inp, &g, l.probe, l.inp, &l.act, &w, scratch,
                             &l.d);
    assert_true(worst_gradient_error("layer d_inp", layer_objective, &l,
                                     l.inp, d_inp, in_count, NULL, LAYER_ATOL,
                                     LAYER_RTOL) < 1.0);
    for (int i = 0; i < WEIGHTS; i++)
        assert_true(worst_gradient_error(weight_names[i], layer_objective,
                                         &l, l.weight[i], grad[i],
                                         l.weight_count[i], NULL, LAYER_ATOL,
                                         LAYER_RTOL) < 1.0);
    for (int i = 0; i < WEIGHTS; i++)
        free(grad[i]);
    free(d_inp);
    free(scratch);
    free_layer_case(&l);
}

/* Causal: the output at position t depends on inputs up to t only, so
 * changing the last position of a sequence leaves the rest as it was. */
static void test_layer_causal(void **state)
{
    (void)state;
    model_rng rng;
    model_rng_seed(&rng, 32);
    layer_case l = new_layer_case(&rng);
    size_t count = rows(&l) * l.d.C, C = (size_t)l.d.C;
    layer_objective(&l);
    float *before = new_floats(count);
    memcpy(before, l.act.out, count * sizeof *before);
    size_t last = (size_t)(l.d.T - 1) * C; /* sequence 0's last row */
    for (size_t c = 0; c < C; c++)
        l.inp[last + c] += 1.0f;
    layer_objective(&l);
    assert_memory_equal(l.act.out, before, last * sizeof *before);
    assert_memory_equal(l.act.out + last + C, before + last + C,
                        (count - last - C) * sizeof *before);
    assert_true(memcmp(l.act.out + last, before + last, C * sizeof *before));
    free(before);
    free_layer_case(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_gradient),
        cmocka_unit_test(test_layer_causal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
