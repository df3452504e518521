/*
 * Shared by the model tests: finite differences and the tolerance test
 * that compares them with analytic gradients.
 *
 * The ops run in fp32, so a finite difference carries two errors.
 * Truncation: a central difference D(h) is off by h^2/6 |f'''|, and on
 * the tiny random models of these tests some paths (a layer norm over 8
 * channels, a tied embedding) curve enough for that to reach 1e-3 at
 * h = 1e-2; so the helper uses Richardson's extrapolation
 * (4 D(h/2) - D(h)) / 3, which cancels the h^2 term and leaves O(h^4).
 * Rounding: the objective is an fp32 result of O(1), about 1e-7 x
 * sqrt(terms) off, divided by 2h (0.02 or 0.01) and amplified about
 * 3 x by the extrapolation: a few 1e-5. The tests' tolerances sit well
 * above what they observe (each file says by how much), while a wrong
 * gradient (a missing term, a wrong sign, a transposed index) is off by
 * the gradient's own size and fails. The step actually taken,
 * (x + h) - (x - h) as rounded in fp32, is the denominator, so the
 * rounding of x +- h adds no error of its own.
 */
#ifndef PARTITA_TESTS_GRAD_CHECK_H
#define PARTITA_TESTS_GRAD_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stddef.h>

#include "executor/cpu/cpu.h"

#define FD_STEP 1e-2f

/* The objective as a function of everything the test may perturb. */
typedef double (*objective_fn)(void *context);

static inline double central_difference(objective_fn objective,
                                        void *context, float *values,
                                        size_t index, float step)
{
    float original = values[index];
    float plus = original + step;
    float minus = original - step;
    values[index] = plus;
    double objective_plus = objective(context);
    values[index] = minus;
    double objective_minus = objective(context);
    values[index] = original;
    return (objective_plus - objective_minus) / ((double)plus - (double)minus);
}

/* d objective / d values[index]: central differences at FD_STEP and at
 * half of it, extrapolated. */
static inline double finite_difference(objective_fn objective, void *context,
                                       float *values, size_t index)
{
    double coarse =
        central_difference(objective, context, values, index, FD_STEP);
    double fine =
        central_difference(objective, context, values, index, FD_STEP / 2);
    return (4.0 * fine - coarse) / 3.0;
}

/* The worst |analytic - numeric| / (atol + rtol |numeric|) over the given
 * indices of one array (all of them when indices is NULL): below 1 means
 * every element passes. Prints the worst element when it fails, so a
 * failure explains itself. */
static inline double worst_gradient_error(const char *label,
                                          objective_fn objective,
                                          void *context, float *values,
                                          const float *analytic, size_t count,
                                          const size_t *indices,
                                          double atol, double rtol)
{
    double worst = 0.0;
    size_t worst_index = 0;
    double worst_numeric = 0.0;
    for (size_t k = 0; k < count; k++) {
        size_t i = indices != NULL ? indices[k] : k;
        double numeric = finite_difference(objective, context, values, i);
        double error = fabs(analytic[i] - numeric) /
                       (atol + rtol * fabs(numeric));
        if (error > worst || isnan(error)) {
            worst = isnan(error) ? INFINITY : error;
            worst_index = i;
            worst_numeric = numeric;
        }
    }
    if (worst >= 1.0)
        printf("%s: element %zu analytic %.8g numeric %.8g (%.2f x the "
               "tolerance)\n",
               label, worst_index, (double)analytic[worst_index],
               worst_numeric, worst);
    return worst;
}

/* Fills values with normals of the given spread. */
static inline void fill_normal(model_rng *rng, float *values, size_t count,
                               double spread)
{
    for (size_t i = 0; i < count; i++)
        values[i] = (float)(spread * model_rng_normal(rng));
}

#endif
