/*
 * Levenberg-Marquardt for the cost model's small fits: the roofline on
 * measured layer times (roofline.c) and the roofline on whole training
 * runs (calibrate.c). A problem is a residual function of at most
 * LSQ_MAX_PARAMS unbounded coordinates; the caller maps them to its
 * parameters (logit, log) and adds any pull towards priors as residuals
 * of its own.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

static double sum_of_squares(const double *r, int n)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += r[i] * r[i];
    return sum;
}

/* Solves a x = b for a small symmetric positive definite a (Cholesky);
 * false when a is not positive definite. a is overwritten. */
static bool solve_small(int n, double a[LSQ_MAX_PARAMS][LSQ_MAX_PARAMS],
                        const double *b, double *x)
{
    for (int j = 0; j < n; j++) {
        double diagonal = a[j][j];
        for (int k = 0; k < j; k++)
            diagonal -= a[j][k] * a[j][k];
        if (!(diagonal > 0.0))
            return false;
        a[j][j] = sqrt(diagonal);
        for (int i = j + 1; i < n; i++) {
            double value = a[i][j];
            for (int k = 0; k < j; k++)
                value -= a[i][k] * a[j][k];
            a[i][j] = value / a[j][j];
        }
    }
    double y[LSQ_MAX_PARAMS];
    for (int i = 0; i < n; i++) {
        double value = b[i];
        for (int k = 0; k < i; k++)
            value -= a[i][k] * y[k];
        y[i] = value / a[i][i];
    }
    for (int i = n - 1; i >= 0; i--) {
        double value = y[i];
        for (int k = i + 1; k < n; k++)
            value -= a[k][i] * x[k];
        x[i] = value / a[i][i];
    }
    return true;
}

typedef struct lsq_workspace {
    double *r, *trial_r, *jac, *plus, *minus;
} lsq_workspace;

/* Central-difference Jacobian of the residuals, column by column. */
static void jacobian(const lsq_problem *problem, const double *u,
                     lsq_workspace *w)
{
    int n = problem->residual_count, m = problem->param_count;
    const double step = 1e-5;
    double probe[LSQ_MAX_PARAMS];
    for (int j = 0; j < m; j++) {
        memcpy(probe, u, (size_t)m * sizeof *probe);
        probe[j] = u[j] + step;
        problem->residuals(problem->context, probe, w->plus);
        probe[j] = u[j] - step;
        problem->residuals(problem->context, probe, w->minus);
        for (int i = 0; i < n; i++)
            w->jac[(size_t)i * m + j] =
                (w->plus[i] - w->minus[i]) / (2.0 * step);
    }
}

/* One step from u: tries damping until the cost drops. Returns false
 * when no damping helps (a minimum) or the step gains next to nothing. */
static bool lm_step(const lsq_problem *problem, lsq_workspace *w, double *u,
                    double *cost, double *damping)
{
    int n = problem->residual_count, m = problem->param_count;
    jacobian(problem, u, w);
    double normal[LSQ_MAX_PARAMS][LSQ_MAX_PARAMS] = {{0}};
    double gradient[LSQ_MAX_PARAMS] = {0};
    for (int i = 0; i < n; i++) {
        const double *row = &w->jac[(size_t)i * m];
        for (int a = 0; a < m; a++) {
            gradient[a] -= row[a] * w->r[i];
            for (int b = 0; b < m; b++)
                normal[a][b] += row[a] * row[b];
        }
    }
    for (int attempt = 0; attempt < 30; attempt++) {
        double damped[LSQ_MAX_PARAMS][LSQ_MAX_PARAMS], delta[LSQ_MAX_PARAMS];
        memcpy(damped, normal, sizeof damped);
        for (int a = 0; a < m; a++)
            damped[a][a] += *damping * (normal[a][a] + 1e-9);
        double trial[LSQ_MAX_PARAMS];
        if (solve_small(m, damped, gradient, delta)) {
            for (int a = 0; a < m; a++)
                trial[a] = u[a] + delta[a];
            problem->residuals(problem->context, trial, w->trial_r);
            double trial_cost = sum_of_squares(w->trial_r, n);
            if (trial_cost < *cost) {
                bool tiny = *cost - trial_cost < 1e-12 * (1.0 + *cost);
                memcpy(u, trial, (size_t)m * sizeof *u);
                memcpy(w->r, w->trial_r, (size_t)n * sizeof *w->r);
                *cost = trial_cost;
                *damping = *damping * 0.3 > 1e-12 ? *damping * 0.3 : 1e-12;
                return !tiny;
            }
        }
        *damping *= 10.0;
    }
    return false;
}

double lsq_minimise(const lsq_problem *problem, double *u, pt_error *err)
{
    int n = problem->residual_count, m = problem->param_count;
    if (m < 1 || m > LSQ_MAX_PARAMS || n < 1) {
        pt_fail(err, "least squares: %d parameters and %d residuals (1..%d "
                "parameters and at least one residual)", m, n,
                LSQ_MAX_PARAMS);
        return NAN;
    }
    lsq_workspace w = {
        .r = calloc((size_t)n, sizeof(double)),
        .trial_r = calloc((size_t)n, sizeof(double)),
        .jac = calloc((size_t)n * m, sizeof(double)),
        .plus = calloc((size_t)n, sizeof(double)),
        .minus = calloc((size_t)n, sizeof(double))};
    double cost = NAN;
    if (w.r && w.trial_r && w.jac && w.plus && w.minus) {
        problem->residuals(problem->context, u, w.r);
        cost = sum_of_squares(w.r, n);
        double damping = 1e-3;
        for (int iteration = 0; iteration < problem->max_iterations;
             iteration++)
            if (!lm_step(problem, &w, u, &cost, &damping))
                break;
    } else {
        pt_fail(err, "least squares: out of memory");
    }
    free(w.r);
    free(w.trial_r);
    free(w.jac);
    free(w.plus);
    free(w.minus);
    return cost;
}
