/*
 * Megatron's schedule levers in the search (docs/planner.md, "Schedule
 * levers"): sequence parallelism is set on tasks of its own beside the
 * plain tp's (it changes memory and sends, so the tree's floors and
 * partitions see it; in Partita's executor it saves memory but costs
 * time: docs/cost-model.md 1.7); the interleaved 1F1B is tried on each
 * plan the simulator ranks, with its node order and a partition solved
 * again for the interleaved schedule, since its smaller bubble is the
 * simulator's to see and it only ever adds memory.
 */
#include "planner/internal.h"

#include <stdlib.h>
#include <string.h>

bool search_sequence_parallel_tried(const search_options *options,
                                    const parallel_config *config, int seq)
{
    return options->allow_sequence_parallel && config->tp > 1 &&
           seq % config->tp == 0;
}

/* Whether Megatron runs config with v chunks a rank of a model of that
 * many layers (each stage's layers a multiple of v, so v divides them). */
static bool interleave_allowed(const parallel_config *config, int v,
                               int layers)
{
    return config->pp >= 2 && config->schedule == SCHEDULE_1F1B &&
           parallel_microbatches(config) % config->pp == 0 &&
           layers % v == 0 &&
           (double)parallel_microbatches(config) * config->pp * v <=
               COSTMODEL_MAX_SCHEDULE_STEPS;
}

/* The partition of the interleaved plan `trial` on the plain plan's
 * placement, in units of v layers: a chunk step of stage s takes
 * (ends_s + v sends_s + v u_s per_layer_s) / v for u_s units, and
 * Megatron's bubble makes the step about sum + (m v - 1) max of those,
 * the plain surrogate over m v chunk steps (docs/planner.md). 1: solved
 * into layers_out; 0: nothing fits; -1: error. */
static int interleaved_partition(costmodel *cm, const parallel_config *trial,
                                 const stage_placement *placement,
                                 const estimate *plain, int *layers_out,
                                 pt_error *err)
{
    int pp = trial->pp, v = trial->virtual_stages;
    partition_stage stages[PT_MAX_STAGES];
    for (int s = 0; s < pp; s++) {
        stage_terms terms;
        if (costmodel_stage_terms(cm, trial, placement, s, &terms, err) != 0)
            return -1;
        double sends = plain->stages[s].send_s + plain->stages[s].send_bwd_s;
        stages[s] = (partition_stage){
            .fixed_s = (terms.fixed_s - sends) / v + sends,
            .per_layer_s = terms.per_layer_s,
            .max_layers = terms.max_layers < 0 ? -1 : terms.max_layers / v};
    }
    partition_problem problem = {pp, cm->model.layers / v,
                                 parallel_microbatches(trial) * v, stages};
    double value;
    int solved = partition_solve_dp(&problem, layers_out, &value, err);
    for (int s = 0; solved == 1 && s < pp; s++)
        layers_out[s] *= v;
    return solved;
}

int search_try_interleave(costmodel *cm, const search_options *options,
                          parallel_config *config, const int *order,
                          int node_count, int *partition, estimate *est,
                          pt_error *err)
{
    if (!options->allow_interleave || !est->fits || config->pp < 2)
        return 0;
    stage_placement *placement = malloc((size_t)config->pp *
                                        sizeof *placement);
    int *layers = malloc((size_t)config->pp * sizeof *layers);
    int rc = placement && layers ? 0 : pt_fail(err, "search: out of memory");
    if (rc == 0)
        rc = costmodel_place(cm, config, order, node_count, placement, err);
    parallel_config base = *config;
    estimate plain = *est;
    bool replaced = false;
    double previous_s = est->step_time_s;
    for (int v = 2; rc == 0 && v <= SEARCH_MAX_VIRTUAL_STAGES; v++) {
        parallel_config trial = base;
        trial.virtual_stages = v;
        if (!interleave_allowed(&trial, v, cm->model.layers))
            continue;
        int solved = interleaved_partition(cm, &trial, placement, &plain,
                                           layers, err);
        estimate chunked;
        if (solved < 0 ||
            (solved == 1 && costmodel_estimate(cm, &trial, order, node_count,
                                               layers, false, &chunked,
                                               err) != 0)) {
            rc = -1;
            break;
        }
        bool better = solved == 1 && chunked.fits &&
                      chunked.step_time_s < est->step_time_s;
        bool gained = solved == 1 && chunked.fits &&
                      chunked.step_time_s < previous_s;
        if (solved == 1 && chunked.fits)
            previous_s = chunked.step_time_s;
        if (better) {
            if (replaced)
                estimate_free(est);
            *est = chunked;
            *config = trial;
            memcpy(partition, layers, (size_t)base.pp * sizeof *layers);
            replaced = true;
        } else if (solved == 1) {
            estimate_free(&chunked);
        }
        /* the bubble shrinks as 1 / v while the sends grow as v: past the
         * first v that is no faster than the one before, more chunks do
         * not help either */
        if (!gained)
            break;
    }
    if (replaced)
        estimate_free(&plain);
    free(placement);
    free(layers);
    return rc;
}
