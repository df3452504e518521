/*
 * A derived profile calibrated on whole training runs (docs/profiles.md,
 * "Calibrated on training runs"): the runs' plans are estimated exactly
 * as `partita estimate` estimates them, with the profile's roofline, and
 * its parameters are fitted by least squares in log step time to the
 * measured step times, pulled towards the profile's own values (the
 * transfer from measured GPUs) so that what the runs cannot tell apart
 * stays where the measurements put it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

/* The parameters the runs fit, in the roofline's coordinate order: GEMM
 * efficiency, its half-work size, attention efficiency, bandwidth
 * efficiency and kernel overhead. The SMs' bandwidth saturation is left
 * as it is (whole GPUs do not see it). */
#define FITTED_PARAMS 5
/* Pull of each coordinate towards its transferred value, against the sum
 * of squared log errors of the runs (one run off by 10 % adds 0.009). */
#define CALIBRATION_PRIOR_WEIGHT 0.002

int calibration_check_run(const calibration_run *run, const profile *prof,
                          pt_error *err)
{
    const cluster *c = &run->plan->cluster;
    for (int t = 0; t < c->type_count; t++)
        if (strcmp(c->types[t].gpu, prof->gpu) != 0)
            return pt_fail(err, "run %s: node type %s is a %s, not a %s (a "
                           "run calibrates one GPU type: every node of it "
                           "must be of that type)", run->id, c->types[t].name,
                           c->types[t].gpu, prof->gpu);
    if (!(run->measured_s > 0.0) || !isfinite(run->measured_s))
        return pt_fail(err, "run %s: measured step time %g s is not a "
                       "positive number", run->id, run->measured_s);
    return 0;
}

/* One run estimated with prof pricing every node type of its cluster. */
static int estimate_run(const calibration_run *run, const profile *prof,
                        double *step_s, bool *fits, pt_error *err)
{
    const plan *p = run->plan;
    int types = p->cluster.type_count;
    profile *profiles = calloc(types > 0 ? (size_t)types : 1,
                               sizeof *profiles);
    if (profiles == NULL)
        return pt_fail(err, "calibration: out of memory");
    for (int t = 0; t < types; t++)
        profiles[t] = *prof; /* copied deep by costmodel_open_with_profiles */
    costmodel cm;
    int status = costmodel_open_with_profiles(&cm, &p->model, &p->cluster,
                                              profiles, err);
    free(profiles);
    if (status != 0)
        return -1;
    estimate est;
    status = costmodel_estimate(&cm, &p->config, p->node_order,
                                p->node_order_count, p->partition, false,
                                &est, err);
    if (status == 0) {
        *step_s = est.step_time_s;
        *fits = est.fits;
        estimate_free(&est);
    }
    costmodel_close(&cm);
    return status;
}

int calibration_estimate(const calibration_run *runs, int count,
                         const profile *prof, double *estimated_s,
                         bool *fits, pt_error *err)
{
    for (int i = 0; i < count; i++) {
        bool fit = true;
        if (calibration_check_run(&runs[i], prof, err) != 0 ||
            estimate_run(&runs[i], prof, &estimated_s[i], &fit, err) != 0)
            return -1;
        if (fits != NULL)
            fits[i] = fit;
    }
    return 0;
}

void calibration_summarise(const calibration_run *runs, int count,
                           const double *estimated_s,
                           calibration_summary *out)
{
    *out = (calibration_summary){.run_count = count};
    double absolute = 0.0, squares = 0.0;
    double *errors = calloc(count > 0 ? (size_t)count : 1, sizeof *errors);
    for (int i = 0; i < count; i++) {
        double error = estimated_s[i] / runs[i].measured_s - 1.0;
        absolute += fabs(error);
        squares += log1p(error) * log1p(error);
        if (fabs(error) <= 0.10)
            out->within_10_percent++;
        if (fabs(error) > fabs(out->worst_error))
            out->worst_error = error;
        if (errors)
            errors[i] = fabs(error);
    }
    if (count > 0) {
        out->mean_abs_error = absolute / count;
        out->rms_log_error = sqrt(squares / count);
    }
    /* the median by insertion sort: tables of runs are small */
    if (errors && count > 0) {
        for (int i = 1; i < count; i++)
            for (int j = i; j > 0 && errors[j - 1] > errors[j]; j--) {
                double swap = errors[j];
                errors[j] = errors[j - 1];
                errors[j - 1] = swap;
            }
        out->median_abs_error =
            count % 2 ? errors[count / 2]
                      : 0.5 * (errors[count / 2 - 1] + errors[count / 2]);
    }
    free(errors);
}

/* ------------------------------------------------------------------ fit */

typedef struct calibration_problem {
    const calibration_run *runs;
    int count;
    profile candidate;          /* shallow copy of the base profile */
    double prior[ROOFLINE_PARAM_COUNT];
    bool failed;
    pt_error *err;
} calibration_problem;

static void set_candidate(calibration_problem *problem, const double *u)
{
    double full[ROOFLINE_PARAM_COUNT];
    memcpy(full, problem->prior, sizeof full);
    memcpy(full, u, FITTED_PARAMS * sizeof *u);
    problem->candidate.roofline = roofline_params_from_vector(full);
}

/* A log error as the fit weighs it: itself up to about ROBUST_SCALE,
 * growing like its square root beyond (the soft-L1 loss), so that a run
 * the model cannot explain (the published set has some: a micro-batch
 * 64 twice as slow as its micro-batch-32 neighbour) does not drag the
 * parameters that every other run agrees on. */
#define ROBUST_SCALE 0.10
static double robust(double r)
{
    double z = r / ROBUST_SCALE;
    double loss = 2.0 * (sqrt(1.0 + z * z) - 1.0);
    return copysign(ROBUST_SCALE * sqrt(loss), r);
}

/* ln(estimated / measured) of every run, then the pull towards the
 * transferred values. A run that cannot be estimated fails the fit. */
static void residuals(const void *context, const double *u, double *r)
{
    calibration_problem *problem = (calibration_problem *)context;
    set_candidate(problem, u);
    for (int i = 0; i < problem->count; i++) {
        double step = NAN;
        bool fits;
        if (!problem->failed &&
            estimate_run(&problem->runs[i], &problem->candidate, &step,
                         &fits, problem->err) != 0)
            problem->failed = true;
        r[i] = problem->failed
                   ? 0.0
                   : robust(log(step / problem->runs[i].measured_s));
    }
    double weight = sqrt(CALIBRATION_PRIOR_WEIGHT);
    for (int j = 0; j < FITTED_PARAMS; j++)
        r[problem->count + j] = weight * (u[j] - problem->prior[j]);
}

int calibration_fit(const calibration_run *runs, int count,
                    const profile *base, roofline_params *out, pt_error *err)
{
    if (count < 1)
        return pt_fail(err, "calibration: no runs to fit");
    if (!base->roofline.present)
        return pt_fail(err, "calibration: profile %s has no roofline to "
                       "calibrate (a derived profile has one)", base->gpu);
    for (int i = 0; i < count; i++)
        if (calibration_check_run(&runs[i], base, err) != 0)
            return -1;
    calibration_problem problem = {.runs = runs, .count = count,
                                   .candidate = *base, .err = err};
    roofline_vector_from_params(&base->roofline, problem.prior);
    lsq_problem lsq = {.param_count = FITTED_PARAMS,
                       .residual_count = count + FITTED_PARAMS,
                       .residuals = residuals, .context = &problem,
                       .max_iterations = 60};
    /* the cost has kinks (the max of compute and memory time): start at
     * the transferred values and at a few spread-out efficiencies, keep
     * the best end */
    static const double gemm_starts[] = {0.0, 0.5, 0.7, 0.9};
    static const double bandwidth_starts[] = {0.0, 0.6, 0.9};
    double u[ROOFLINE_PARAM_COUNT], best_cost = HUGE_VAL;
    double best[ROOFLINE_PARAM_COUNT];
    for (int g = 0; g < 4; g++) {
        for (int b = 0; b < 3; b++) {
            memcpy(u, problem.prior, sizeof u);
            if (gemm_starts[g] > 0.0)
                u[0] = log(gemm_starts[g] / (1.0 - gemm_starts[g]));
            if (bandwidth_starts[b] > 0.0)
                u[3] = log(bandwidth_starts[b] / (1.0 - bandwidth_starts[b]));
            double cost = lsq_minimise(&lsq, u, err);
            if (isnan(cost) || problem.failed)
                return -1;
            if (cost < best_cost) {
                best_cost = cost;
                memcpy(best, u, sizeof u);
            }
        }
    }
    memcpy(u, best, sizeof u);
    set_candidate(&problem, u);
    *out = roofline_rounded(&problem.candidate.roofline);
    return 0;
}
