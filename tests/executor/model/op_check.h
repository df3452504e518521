/*
 * Shared by the op tests (test_ops.c, test_llama_ops.c): the objective
 * sum(out x probe) that makes the probe an op's d_out, and the arrays
 * they allocate. Include after cmocka.h (it asserts) and grad_check.h.
 */
#ifndef PARTITA_TESTS_OP_CHECK_H
#define PARTITA_TESTS_OP_CHECK_H

#include <stdlib.h>

#include "grad_check.h"

static inline double weighted_sum(const float *out, const float *probe,
                                  size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += (double)out[i] * probe[i];
    return sum;
}

static inline float *new_floats(size_t count)
{
    float *values = calloc(count, sizeof *values);
    assert_non_null(values);
    return values;
}

/* new_floats filled with normals of the given spread. */
static inline float *new_normals(model_rng *rng, size_t count, double spread)
{
    float *values = new_floats(count);
    fill_normal(rng, values, count, spread);
    return values;
}

#endif
