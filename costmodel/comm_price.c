/*
 * Communication priced from a profile's measured curves where the GPUs of
 * a collective sit inside one node of a type that has them, else from
 * the cluster's links (docs/cost-model.md, section 2, "Measured
 * curves"): sends, all-reduces, reduce-scatters and all-gathers, what
 * they take from products beside them, and the bytes of one activation
 * message.
 */
#include "costmodel/internal.h"

#include <math.h>

/* Time of one measured communication curve at (gpus, bytes): piecewise
 * linear between samples, the last slope beyond them, the smallest sample
 * below them. False when the curve has no sample for that group size. */
bool costmodel_curve_time(const comm_curve *curve, int gpus, double bytes,
                       double *out)
{
    const comm_sample *below = NULL, *above = NULL, *largest = NULL,
                      *second = NULL, *smallest = NULL;
    for (int i = 0; i < curve->sample_count; i++) {
        const comm_sample *s = &curve->samples[i];
        if (s->gpus != gpus || s->bytes <= 0.0)
            continue;
        if (s->bytes <= bytes && (!below || s->bytes > below->bytes))
            below = s;
        if (s->bytes >= bytes && (!above || s->bytes < above->bytes))
            above = s;
        if (!smallest || s->bytes < smallest->bytes)
            smallest = s;
        if (!largest || s->bytes > largest->bytes) {
            second = largest;
            largest = s;
        } else if (s->bytes < largest->bytes &&
                   (!second || s->bytes > second->bytes)) {
            second = s;
        }
    }
    if (!smallest)
        return false;
    if (below && above) {
        double span = above->bytes - below->bytes;
        double w = span > 0.0 ? (bytes - below->bytes) / span : 0.0;
        *out = below->time_s + w * (above->time_s - below->time_s);
    } else if (above) {
        *out = smallest->time_s;
    } else {
        double slope = second ? (largest->time_s - second->time_s) /
                                    (largest->bytes - second->bytes)
                              : 0.0;
        if (slope <= 0.0)
            slope = largest->time_s / largest->bytes;
        *out = largest->time_s + (bytes - largest->bytes) * slope;
    }
    return true;
}

bool costmodel_curve_compute_lost(const comm_curve *curve, int gpus,
                                  double bytes, double *out)
{
    const comm_sample *nearest = NULL;
    double distance = HUGE_VAL;
    for (int i = 0; i < curve->sample_count; i++) {
        const comm_sample *s = &curve->samples[i];
        if (s->gpus != gpus || s->compute_lost <= 0.0 || s->bytes <= 0.0)
            continue;
        double d = fabs(log(s->bytes / bytes));
        if (d < distance) {
            distance = d;
            nearest = s;
        }
    }
    if (nearest == NULL)
        return false;
    *out = nearest->compute_lost;
    return true;
}

/* The profile of node type curve_type when a collective stays inside
 * one node of that type; NULL when the cluster's links price it. */
static const profile *curve_profile(const costmodel *cm, int curve_type)
{
    if (curve_type < 0 || curve_type >= cm->cluster->type_count)
        return NULL;
    return &cm->profiles[curve_type];
}

double costmodel_send_seconds(const costmodel *cm, double bytes,
                              int curve_type, link_spec link)
{
    const profile *prof = curve_profile(cm, curve_type);
    double measured;
    if (bytes > 0.0 && prof && costmodel_curve_time(&prof->sendrecv, 2, bytes,
                                          &measured))
        return measured;
    return p2p_time(bytes, link);
}

/* The collectives a profile may hold curves of. */
typedef enum collective_curve {
    CURVE_ALLREDUCE,
    CURVE_REDUCE_SCATTER,
    CURVE_ALL_GATHER
} collective_curve;

/* The measured time of `bytes` over `members` GPUs from node type
 * curve_type's curve of that collective; false when it holds none for
 * that group size (or there is no type, one member, no bytes). */
static bool measured_seconds(const costmodel *cm, int curve_type,
                             collective_curve which, int members,
                             double bytes, double *out)
{
    const profile *prof = curve_profile(cm, curve_type);
    if (members < 2 || bytes <= 0.0 || prof == NULL)
        return false;
    const comm_curve *curve = which == CURVE_ALLREDUCE ? &prof->allreduce
                              : which == CURVE_REDUCE_SCATTER
                                  ? &prof->reduce_scatter
                                  : &prof->all_gather;
    return costmodel_curve_time(curve, members, bytes, out);
}

double costmodel_allreduce_seconds(const costmodel *cm, double bytes,
                                   int members, int curve_type,
                                   link_spec link)
{
    double measured;
    if (measured_seconds(cm, curve_type, CURVE_ALLREDUCE, members, bytes,
                         &measured))
        return measured;
    return allreduce_time(bytes, members, link);
}

double costmodel_reduce_scatter_seconds(const costmodel *cm, double bytes,
                                        int members, int curve_type,
                                        link_spec link)
{
    double measured;
    /* the measured reduce-scatter of the whole tensor where the profile
     * holds it for this group size; else half the measured all-reduce (a
     * ring reduce-scatter is half of a ring all-reduce) */
    if (measured_seconds(cm, curve_type, CURVE_REDUCE_SCATTER, members,
                         bytes, &measured))
        return measured;
    if (measured_seconds(cm, curve_type, CURVE_ALLREDUCE, members, bytes,
                         &measured))
        return 0.5 * measured;
    return reduce_scatter_time(bytes, members, link);
}

double costmodel_all_gather_seconds(const costmodel *cm, double bytes,
                                    int members, int curve_type,
                                    link_spec link)
{
    /* the measured all-gather of the whole tensor where the profile holds
     * it for this group size; else as the reduce-scatter (a ring
     * all-gather moves what a ring reduce-scatter moves) */
    double measured;
    return measured_seconds(cm, curve_type, CURVE_ALL_GATHER, members,
                            bytes, &measured)
               ? measured
               : costmodel_reduce_scatter_seconds(cm, bytes, members,
                                                  curve_type, link);
}

double activation_message_bytes(const model_shape *model,
                                const parallel_config *config)
{
    return (double)config->mbs * model->seq * model->hidden *
           precision_bytes(config->precision);
}

