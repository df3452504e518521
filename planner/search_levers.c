/*
 * Megatron's schedule levers in the search (docs/planner.md, "Schedule
 * levers"): sequence parallelism is set on the tasks themselves (it
 * changes memory and sends, so the tree's floors and partitions see it;
 * the cost model never prices it worse than the plain tp, so it replaces
 * the plain task); the interleaved 1F1B is tried on each plan the
 * simulator ranks, since its smaller bubble is the simulator's to see
 * and it only ever adds memory.
 */
#include "planner/internal.h"

bool search_sequence_parallel_tried(const search_options *options,
                                    const parallel_config *config, int seq)
{
    return options->allow_sequence_parallel && config->tp > 1 &&
           seq % config->tp == 0;
}

/* Whether Megatron runs config with v chunks a rank on this partition. */
static bool interleave_allowed(const parallel_config *config, int v,
                               const int *partition)
{
    if (config->pp < 2 || config->schedule != SCHEDULE_1F1B ||
        parallel_microbatches(config) % config->pp != 0)
        return false;
    for (int s = 0; s < config->pp; s++)
        if (partition[s] % v != 0)
            return false;
    return true;
}

int search_try_interleave(costmodel *cm, const search_options *options,
                          parallel_config *config, const int *order,
                          int node_count, const int *partition,
                          estimate *est, pt_error *err)
{
    if (!options->allow_interleave || !est->fits)
        return 0;
    parallel_config base = *config;
    for (int v = 2; v <= SEARCH_MAX_VIRTUAL_STAGES; v++) {
        parallel_config trial = base;
        trial.virtual_stages = v;
        if (!interleave_allowed(&trial, v, partition))
            continue;
        /* beyond what the cost model simulates: more chunks do not help */
        if ((double)parallel_microbatches(&trial) * trial.pp * v >
            COSTMODEL_MAX_SCHEDULE_STEPS)
            break;
        estimate chunked;
        if (costmodel_estimate(cm, &trial, order, node_count, partition,
                               false, &chunked, err) != 0)
            return -1;
        bool better = chunked.fits && chunked.step_time_s < est->step_time_s;
        if (better) {
            estimate_free(est);
            *est = chunked;
            *config = trial;
        } else {
            estimate_free(&chunked);
        }
        /* the bubble shrinks as 1 / v while the sends grow as v: past the
         * first v that does not help, more chunks do not either */
        if (!better && config->virtual_stages > 1)
            break;
    }
    return 0;
}
