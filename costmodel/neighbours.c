/*
 * How busy the other slices of a stage's GPU are, for plans on slices of
 * one GPU (green contexts), whose speed depends on what their neighbours
 * run: the estimate prices such a stage between its profile at rest and
 * its profile beside busy neighbours by this share (docs/cost-model.md,
 * section 12).
 */
#include "costmodel/internal.h"

/* The SMs a slice weighs with: its limit (a whole GPU beside slices is
 * not a split the executor makes; it weighs nothing). */
static double slice_sms(const device_spec *device)
{
    return device->sm_limit > 0 ? (double)device->sm_limit : 0.0;
}

/* The stage holding GPU gpu (firsts[pp] GPUs in all). */
static int stage_of(const long long *firsts, int pp, long long gpu)
{
    int low = 0, high = pp - 1;
    while (low < high) {
        int middle = (low + high + 1) / 2;
        if (firsts[middle] <= gpu)
            low = middle;
        else
            high = middle - 1;
    }
    return low;
}

/* The share of one GPU of stage s: its neighbours' SMs, each weighted by
 * how busy its stage is (the stage's own other ranks compute with it:
 * busy), over all their SMs; 0 without neighbours. */
static double gpu_share(const costmodel *cm, const parallel_config *config,
                        const long long *firsts, const node_lane *lane,
                        const double *duty, int stage, long long gpu,
                        const device_spec *own)
{
    long long total = firsts[config->pp];
    double weight = 0.0, busy = 0.0;
    for (long long other = 0; other < total; other++) {
        if (other == gpu)
            continue;
        const device_spec *device = costmodel_lane_device(cm, lane, other);
        if (device == NULL || device->index != own->index)
            continue;
        int other_stage = stage_of(firsts, config->pp, other);
        double sms = slice_sms(device);
        weight += sms;
        busy += sms * (other_stage == stage ? 1.0 : duty[other_stage]);
    }
    return weight > 0.0 ? busy / weight : 0.0;
}

void costmodel_neighbour_shares(const costmodel *cm,
                                const parallel_config *config,
                                const long long *firsts,
                                const node_lane *lane, const double *duty,
                                double *shares)
{
    for (int s = 0; s < config->pp; s++) {
        shares[s] = -1.0;
        double largest = 0.0;
        bool sliced = true;
        for (long long g = firsts[s]; g < firsts[s + 1] && sliced; g++) {
            const device_spec *own = costmodel_lane_device(cm, lane, g);
            sliced = own != NULL && own->sm_limit > 0;
            if (sliced) {
                double share = gpu_share(cm, config, firsts, lane, duty, s,
                                         g, own);
                largest = share > largest ? share : largest;
            }
        }
        if (sliced)
            shares[s] = largest;
    }
}
