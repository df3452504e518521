/*
 * The partition problem as a GLPK mixed-integer program, the reference the
 * DP is tested against:
 *     minimise   sum_s (fixed_s + per_layer_s l_s) + (m - 1) M
 *     subject to fixed_s + per_layer_s l_s <= M     for every stage s
 *                sum_s l_s = layers
 *                l_s integer in [0, max_layers_s],  M continuous.
 * Times are divided by the largest stage coefficient so the matrix is of
 * order one, where GLPK's absolute tolerances are meant to work.
 * GLPK keeps its environment per thread (it is built with thread-local
 * storage), so solves on different threads do not share state.
 */
#include "planner/planner.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>

static double coefficient_scale(const partition_problem *problem)
{
    double scale = 0.0;
    for (int s = 0; s < problem->pp; s++) {
        if (problem->stages[s].fixed_s > scale)
            scale = problem->stages[s].fixed_s;
        if (problem->stages[s].per_layer_s > scale)
            scale = problem->stages[s].per_layer_s;
    }
    return scale > 0.0 ? scale : 1.0;
}

/* Columns 1..pp are the layer counts, column pp+1 the bottleneck M; rows
 * 1..pp bound each stage by M, row pp+1 sums the layers. */
static void build_program(glp_prob *program, const partition_problem *problem,
                          int *row_index, int *column_index, double *value)
{
    const int pp = problem->pp;
    const double scale = coefficient_scale(problem);
    const int bottleneck = pp + 1;
    glp_set_obj_dir(program, GLP_MIN);
    glp_add_cols(program, pp + 1);
    glp_add_rows(program, pp + 1);
    double constant = 0.0;
    int entries = 0;
    for (int s = 0; s < pp; s++) {
        const partition_stage *stage = &problem->stages[s];
        int column = s + 1;
        int most = stage->max_layers < problem->layers ? stage->max_layers
                                                       : problem->layers;
        glp_set_col_kind(program, column, GLP_IV);
        if (most == 0)
            glp_set_col_bnds(program, column, GLP_FX, 0.0, 0.0);
        else
            glp_set_col_bnds(program, column, GLP_DB, 0.0, most);
        glp_set_obj_coef(program, column, stage->per_layer_s / scale);
        constant += stage->fixed_s / scale;

        glp_set_row_bnds(program, s + 1, GLP_UP, 0.0, -stage->fixed_s / scale);
        entries++;
        row_index[entries] = s + 1;
        column_index[entries] = column;
        value[entries] = stage->per_layer_s / scale;
        entries++;
        row_index[entries] = s + 1;
        column_index[entries] = bottleneck;
        value[entries] = -1.0;
        entries++;
        row_index[entries] = pp + 1;
        column_index[entries] = column;
        value[entries] = 1.0;
    }
    glp_set_obj_coef(program, 0, constant);
    glp_set_col_kind(program, bottleneck, GLP_CV);
    glp_set_col_bnds(program, bottleneck, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(program, bottleneck, (double)(problem->microbatches - 1));
    glp_set_row_bnds(program, pp + 1, GLP_FX, problem->layers,
                     problem->layers);
    glp_load_matrix(program, entries, row_index, column_index, value);
}

/* Reads the integer solution back; -1 when GLPK's values do not round to
 * a partition of the layers. */
static int read_solution(glp_prob *program, const partition_problem *problem,
                         int *layers_out, pt_error *err)
{
    long long total = 0;
    for (int s = 0; s < problem->pp; s++) {
        layers_out[s] = (int)lround(glp_mip_col_val(program, s + 1));
        total += layers_out[s];
    }
    if (total != problem->layers)
        return pt_fail(err, "partition (GLPK): the solution holds %lld "
                       "layers, not %d", total, problem->layers);
    return 0;
}

int partition_solve_ilp(const partition_problem *problem, int *layers_out,
                        double *value_out, pt_error *err)
{
    if (partition_problem_check(problem, layers_out, err) != 0)
        return -1;
    for (int s = 0; s < problem->pp; s++)
        if (problem->stages[s].max_layers < 0)
            return 0;
    size_t slots = 3 * (size_t)problem->pp + 1; /* GLPK counts from 1 */
    int *row_index = malloc(slots * sizeof(int));
    int *column_index = malloc(slots * sizeof(int));
    double *value = malloc(slots * sizeof(double));
    glp_prob *program = glp_create_prob();
    int result = -1;
    if (row_index == NULL || column_index == NULL || value == NULL) {
        pt_fail(err, "partition (GLPK): out of memory");
        goto done;
    }
    build_program(program, problem, row_index, column_index, value);

    glp_iocp options;
    glp_init_iocp(&options);
    options.presolve = GLP_ON;
    options.msg_lev = GLP_MSG_OFF;
    int code = glp_intopt(program, &options);
    int status = glp_mip_status(program);
    if (code == GLP_ENOPFS || (code == 0 && status == GLP_NOFEAS)) {
        result = 0;
    } else if (code != 0 || status != GLP_OPT) {
        pt_fail(err, "partition (GLPK): glp_intopt failed (code %d, "
                "status %d)", code, status);
    } else if (read_solution(program, problem, layers_out, err) == 0) {
        if (value_out != NULL)
            *value_out = partition_surrogate(problem, layers_out);
        result = 1;
    }
done:
    glp_delete_prob(program);
    free(row_index);
    free(column_index);
    free(value);
    return result;
}
