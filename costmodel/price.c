/*
 * Pricing one GPU type: the profile's measured points looked up by layer
 * shape, tensor-parallel degree and micro-batch, or the efficiency model
 * when the profile does not hold the shape (docs/cost-model.md, "Layer
 * time").
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "costmodel/internal.h"

/* The three parts of the model priced for one micro-batch. */
typedef struct part_times {
    part_cost embedding, layer, head;
} part_times;

double layer_forward_flops(double hidden, double ffn_hidden, double seq,
                           double microbatch)
{
    double matmuls = 2.0 * microbatch * seq *
                     (4.0 * hidden * hidden + 2.0 * hidden * ffn_hidden);
    double attention = 4.0 * microbatch * seq * seq * hidden;
    return matmuls + attention;
}

static int shape_ffn(const profile_shape *shape)
{
    return shape->ffn_hidden > 0 ? shape->ffn_hidden : 4 * shape->hidden;
}

static bool has_usable_point(const profile_shape *shape)
{
    for (int i = 0; i < shape->point_count; i++)
        if (shape->points[i].tp > 0 && shape->points[i].mbs > 0)
            return true;
    return false;
}

/* The model's shape in the profile; heads are not part of the key. */
static const profile_shape *held_shape(const profile *prof,
                                       const model_shape *model)
{
    for (int i = 0; i < prof->shape_count; i++) {
        const profile_shape *shape = &prof->shapes[i];
        if (shape->hidden == model->hidden && shape->seq == model->seq &&
            shape->vocab == model->vocab &&
            shape_ffn(shape) == model->ffn_hidden && has_usable_point(shape))
            return shape;
    }
    return NULL;
}

/* A part whose backward was not measured gets backward_over_forward x
 * forward (2 when the profile does not say either). */
static part_cost completed_part(part_cost cost, double backward_over_forward)
{
    if (cost.backward_s <= 0.0)
        cost.backward_s = cost.forward_s *
                          (backward_over_forward > 0.0 ? backward_over_forward
                                                       : 2.0);
    return cost;
}

static part_times point_times(const profile_point *point,
                              double backward_over_forward)
{
    return (part_times){
        completed_part(point->embedding, backward_over_forward),
        completed_part(point->layer, backward_over_forward),
        completed_part(point->head, backward_over_forward)};
}

static part_cost blend_part(part_cost a, part_cost b, double weight_a,
                            double weight_b)
{
    return (part_cost){
        .forward_s = a.forward_s * weight_a + b.forward_s * weight_b,
        .backward_s = a.backward_s * weight_a + b.backward_s * weight_b};
}

static part_times blend(part_times a, part_times b, double weight_a,
                        double weight_b)
{
    return (part_times){blend_part(a.embedding, b.embedding, weight_a, weight_b),
                        blend_part(a.layer, b.layer, weight_a, weight_b),
                        blend_part(a.head, b.head, weight_a, weight_b)};
}

static part_times scaled(part_times t, double factor)
{
    return blend(t, t, factor, 0.0);
}

/* The measured tp closest to the wanted one by ratio (ties: the larger,
 * whose communication pattern is closer); 0 when there is no point. */
static int nearest_tp(const profile_shape *shape, int tp)
{
    int best = 0;
    double best_distance = HUGE_VAL;
    for (int i = 0; i < shape->point_count; i++) {
        int candidate = shape->points[i].tp;
        if (candidate <= 0 || shape->points[i].mbs <= 0)
            continue;
        double distance = fabs(log((double)candidate / tp));
        if (distance < best_distance - 1e-12 ||
            (fabs(distance - best_distance) <= 1e-12 && candidate > best)) {
            best = candidate;
            best_distance = distance;
        }
    }
    return best;
}

/* The measured micro-batches around mbs at one tp: lower is the largest
 * <= mbs, upper the smallest >= mbs (NULL when none). */
typedef struct mbs_neighbours {
    const profile_point *lower, *upper;
    int grid_min, grid_max;
} mbs_neighbours;

static mbs_neighbours find_neighbours(const profile_shape *shape, int tp,
                                      int mbs)
{
    mbs_neighbours found = {NULL, NULL, 0, 0};
    for (int i = 0; i < shape->point_count; i++) {
        const profile_point *point = &shape->points[i];
        if (point->tp != tp || point->mbs <= 0)
            continue;
        if (found.grid_min == 0 || point->mbs < found.grid_min)
            found.grid_min = point->mbs;
        if (point->mbs > found.grid_max)
            found.grid_max = point->mbs;
        if (point->mbs <= mbs && (!found.lower || point->mbs > found.lower->mbs))
            found.lower = point;
        if (point->mbs >= mbs && (!found.upper || point->mbs < found.upper->mbs))
            found.upper = point;
    }
    return found;
}

/* Times at (tp, mbs) from the points measured at that tp. */
static part_times times_at_mbs(const profile *prof, const mbs_neighbours *near,
                               int mbs)
{
    double bof = prof->backward_over_forward;
    const profile_point *lower = near->lower, *upper = near->upper;
    if (prof->mbs_scaling == MBS_SCALING_MEASURED && lower && upper) {
        if (lower->mbs == upper->mbs)
            return point_times(lower, bof);
        double weight_upper = (double)(mbs - lower->mbs) /
                              (upper->mbs - lower->mbs);
        return blend(point_times(lower, bof), point_times(upper, bof),
                     1.0 - weight_upper, weight_upper);
    }
    /* linear scaling from the nearest measured micro-batch by ratio; ties
     * go to the larger, which runs the GPU closer to its steady state */
    const profile_point *base = lower ? lower : upper;
    if (lower && upper) {
        double below = log((double)mbs / lower->mbs);
        double above = log((double)upper->mbs / mbs);
        base = above <= below ? upper : lower;
    }
    return scaled(point_times(base, bof), (double)mbs / base->mbs);
}

/* Achieved / peak over the layer forwards the profile holds (its tp = 1
 * points when it has any, since the others may include communication). */
static double fitted_efficiency(const profile *prof)
{
    double sum_tp1 = 0.0, sum_all = 0.0;
    int count_tp1 = 0, count_all = 0;
    for (int i = 0; i < prof->shape_count; i++) {
        const profile_shape *shape = &prof->shapes[i];
        for (int j = 0; j < shape->point_count; j++) {
            const profile_point *point = &shape->points[j];
            if (point->layer.forward_s <= 0.0 || point->tp <= 0 ||
                point->mbs <= 0)
                continue;
            double flops = layer_forward_flops(shape->hidden, shape_ffn(shape),
                                               shape->seq, point->mbs) /
                           point->tp;
            double achieved = flops / point->layer.forward_s /
                              (prof->peak_tflops * 1e12);
            sum_all += achieved;
            count_all++;
            if (point->tp == 1) {
                sum_tp1 += achieved;
                count_tp1++;
            }
        }
    }
    if (count_tp1 > 0)
        return sum_tp1 / count_tp1;
    return count_all > 0 ? sum_all / count_all : 0.0;
}

static double model_efficiency(const profile *prof)
{
    return prof->flops_efficiency > 0.0 ? prof->flops_efficiency
                                        : fitted_efficiency(prof);
}

static int check_efficiency_model(const costmodel *cm, int type_index,
                                  pt_error *err)
{
    const profile *prof = &cm->profiles[type_index];
    const model_shape *m = &cm->model;
    if (prof->roofline.present) {
        roofline_device device;
        return roofline_device_of(prof, &device, err);
    }
    if (prof->peak_tflops <= 0.0 || model_efficiency(prof) <= 0.0)
        return pt_fail(err,
                       "profile %s: holds no layer shape hidden %d, ffn_hidden "
                       "%d, seq %d, vocab %d and has no efficiency model to "
                       "price it (needs efficiency.peak_tflops and measured "
                       "points or flops_efficiency)",
                       prof->gpu, m->hidden, m->ffn_hidden, m->seq, m->vocab);
    return 0;
}

void costmodel_note_shape_coverage(costmodel *cm, int type_index)
{
    const profile *prof = &cm->profiles[type_index];
    const model_shape *m = &cm->model;
    if (held_shape(prof, m) || check_efficiency_model(cm, type_index, NULL))
        return;
    if (prof->roofline.present) {
        costmodel_add_note(cm,
                           "%s: %s profile without measured times for hidden "
                           "%d, ffn_hidden %d, seq %d, vocab %d; priced by "
                           "its roofline (%.0f TFLOP/s, %.0f GB/s, %d SMs, "
                           "fitted efficiencies)",
                           prof->gpu, profile_source_name(prof->source),
                           m->hidden, m->ffn_hidden, m->seq, m->vocab,
                           prof->peak_tflops, prof->memory_bandwidth_GBps,
                           prof->sm_limit > 0 ? prof->sm_limit : prof->sms);
        return;
    }
    costmodel_add_note(cm,
                       "%s: the profile holds no layer shape hidden %d, "
                       "ffn_hidden %d, seq %d, vocab %d; priced by the "
                       "efficiency model (%.0f TFLOP/s peak x %.3f %s)",
                       prof->gpu, m->hidden, m->ffn_hidden, m->seq, m->vocab,
                       prof->peak_tflops, model_efficiency(prof),
                       prof->flops_efficiency > 0.0 ? "given" : "fitted");
}

/* Prices the three parts from FLOPs and bytes for a shape the profile
 * does not hold. Embedding: memory bound (read word and position rows,
 * write the sum). Head: the logits matmul in FLOPs plus the bf16 logits
 * and fp32 softmax written and read once. Backward: twice the FLOPs, the
 * same bytes. */
static part_times efficiency_times(const profile *prof, const model_shape *m,
                                   const parallel_config *config)
{
    double flops_per_s = prof->peak_tflops * 1e12 * model_efficiency(prof);
    double bytes_per_s = prof->memory_bandwidth_GBps * 1e9;
    double tokens = (double)config->mbs * m->seq;
    double element = precision_bytes(config->precision);
    part_times t;

    double layer_flops = layer_forward_flops(m->hidden, m->ffn_hidden, m->seq,
                                             config->mbs) / config->tp;
    t.layer.forward_s = layer_flops / flops_per_s;
    t.layer.backward_s = 2.0 * t.layer.forward_s;

    double embedding_bytes = 3.0 * tokens * m->hidden * element;
    t.embedding.forward_s = bytes_per_s > 0.0 ? embedding_bytes / bytes_per_s
                                              : 0.0;
    t.embedding.backward_s = 2.0 * t.embedding.forward_s;

    double head_flops = 2.0 * tokens * m->hidden * m->vocab / config->tp;
    double logits_bytes = 2.0 * tokens * m->vocab / config->tp * (element + 4.0);
    double head_bytes_s = bytes_per_s > 0.0 ? logits_bytes / bytes_per_s : 0.0;
    t.head.forward_s = head_flops / flops_per_s + head_bytes_s;
    t.head.backward_s = 2.0 * head_flops / flops_per_s + head_bytes_s;
    return t;
}

/* Computation of the three parts from the profile's roofline (any
 * shape, tp and micro-batch; costmodel/roofline.c). */
static part_times roofline_times(const profile *prof, const model_shape *m,
                                 const parallel_config *config)
{
    roofline_device device;
    model_part_costs costs;
    /* check_efficiency_model has made sure the device is complete */
    roofline_device_of(prof, &device, NULL);
    roofline_part_costs(&prof->roofline, &device, m, config->tp, config->mbs,
                        precision_bytes(config->precision), &costs);
    return (part_times){costs.embedding, costs.layer, costs.head};
}

/* Time of one measured communication curve at (gpus, bytes): piecewise
 * linear between samples, the last slope beyond them, the smallest sample
 * below them. False when the curve has no sample for that group size. */
static bool curve_time(const comm_curve *curve, int gpus, double bytes,
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

/* One of the layer's tensor-parallel all-reduces (b x s x h elements) on
 * the node's intra-node link, or from the profile's measured curve. */
static double tp_allreduce_seconds(const costmodel *cm, int type_index,
                                   const parallel_config *config)
{
    double bytes = activation_message_bytes(&cm->model, config);
    double measured;
    if (curve_time(&cm->profiles[type_index].allreduce, config->tp, bytes,
                   &measured))
        return measured;
    return allreduce_time(bytes, config->tp,
                          cm->cluster->types[type_index].intra_node);
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
    if (bytes > 0.0 && prof && curve_time(&prof->sendrecv, 2, bytes,
                                          &measured))
        return measured;
    return p2p_time(bytes, link);
}

double costmodel_allreduce_seconds(const costmodel *cm, double bytes,
                                   int members, int curve_type,
                                   link_spec link)
{
    const profile *prof = curve_profile(cm, curve_type);
    double measured;
    if (members > 1 && bytes > 0.0 && prof &&
        curve_time(&prof->allreduce, members, bytes, &measured))
        return measured;
    return allreduce_time(bytes, members, link);
}

double costmodel_reduce_scatter_seconds(const costmodel *cm, double bytes,
                                        int members, int curve_type,
                                        link_spec link)
{
    const profile *prof = curve_profile(cm, curve_type);
    double measured;
    /* a ring reduce-scatter (or all-gather) is half of a ring all-reduce */
    if (members > 1 && bytes > 0.0 && prof &&
        curve_time(&prof->allreduce, members, bytes, &measured))
        return 0.5 * measured;
    return reduce_scatter_time(bytes, members, link);
}

double activation_message_bytes(const model_shape *model,
                                const parallel_config *config)
{
    return (double)config->mbs * model->seq * model->hidden *
           precision_bytes(config->precision);
}

/* Looks the shape up in the profile and fills times (per micro-batch at
 * config's tp); notes what was stretched when note_target is given. */
static void profile_times(const costmodel *cm, const profile *prof,
                          const profile_shape *shape,
                          const parallel_config *config,
                          costmodel *note_target, part_times *out)
{
    int tp = nearest_tp(shape, config->tp);
    mbs_neighbours near = find_neighbours(shape, tp, config->mbs);
    *out = times_at_mbs(prof, &near, config->mbs);
    if (tp != config->tp) {
        *out = scaled(*out, (double)tp / config->tp);
        if (note_target)
            costmodel_add_note(note_target,
                               "%s: the profile has no tp %d points for "
                               "hidden %d; priced from tp %d scaled by %d/%d",
                               prof->gpu, config->tp, cm->model.hidden, tp,
                               tp, config->tp);
    }
    bool far_outside = config->mbs > 2 * near.grid_max ||
                       2 * config->mbs < near.grid_min;
    if (far_outside && note_target)
        costmodel_add_note(note_target,
                           "%s: micro-batch %d is more than 2x outside the "
                           "measured micro-batches %d..%d; its time is "
                           "scaled linearly from the nearest point",
                           prof->gpu, config->mbs, near.grid_min,
                           near.grid_max);
}

int costmodel_price_type(const costmodel *cm, int type_index,
                         const parallel_config *config,
                         costmodel *note_target, type_costs *out,
                         pt_error *err)
{
    if (type_index < 0 || type_index >= cm->cluster->type_count)
        return pt_fail(err, "costmodel: node type %d does not exist (the "
                       "cluster has %d)", type_index, cm->cluster->type_count);
    if (config->tp <= 0 || config->mbs <= 0)
        return pt_fail(err, "costmodel: tp and mbs must be positive, got tp "
                       "%d, mbs %d", config->tp, config->mbs);
    const profile *prof = &cm->profiles[type_index];
    const profile_shape *shape = held_shape(prof, &cm->model);
    part_times times;
    bool add_tp_comm = !prof->layer_times_include_tp_comm;
    if (shape) {
        profile_times(cm, prof, shape, config, note_target, &times);
    } else {
        if (check_efficiency_model(cm, type_index, err) != 0)
            return -1;
        times = prof->roofline.present
                    ? roofline_times(prof, &cm->model, config)
                    : efficiency_times(prof, &cm->model, config);
        add_tp_comm = true; /* FLOPs alone carry no communication */
        if (note_target)
            costmodel_note_shape_coverage(note_target, type_index);
    }
    if (config->precision == PRECISION_FP32 && note_target)
        costmodel_add_note(note_target,
                           "fp32 plans are priced with the profiles' "
                           "half-precision layer times (compute not slowed)");

    out->embedding_forward_s = times.embedding.forward_s;
    out->embedding_backward_s = times.embedding.backward_s;
    out->layer_forward_s = times.layer.forward_s;
    out->layer_backward_s = times.layer.backward_s;
    out->head_forward_s = times.head.forward_s;
    out->head_backward_s = times.head.backward_s;
    out->tp_allreduce_s = config->tp > 1
                              ? tp_allreduce_seconds(cm, type_index, config)
                              : 0.0;
    if (add_tp_comm) {
        out->layer_forward_s += 2.0 * out->tp_allreduce_s;
        out->layer_backward_s += 2.0 * out->tp_allreduce_s;
    }
    if (config->recompute)
        out->layer_backward_s += out->layer_forward_s;
    out->optimizer_s_per_param = prof->optimizer_s_per_param;
    out->memory_cap_bytes = (prof->memory_gib - prof->workspace_gib) * PT_GIB;
    return 0;
}

double costmodel_layer_pace_s(const costmodel *cm,
                              const parallel_config *config,
                              const type_costs *costs, bool spans_nodes,
                              link_spec span_link)
{
    double pace = costs->layer_forward_s + costs->layer_backward_s;
    if (!spans_nodes || config->tp < 2)
        return pace;
    /* the layer's all-reduces (2 forward, 2 backward, 2 more when the
       backward recomputes the forward) leave the node: swap the in-node
       time for the closed form over the group's slowest link */
    double count = config->recompute ? 6.0 : 4.0;
    double bytes = activation_message_bytes(&cm->model, config);
    return pace + count * (allreduce_time(bytes, config->tp, span_link) -
                           costs->tp_allreduce_s);
}

int costmodel_type_costs(costmodel *cm, int type_index,
                         const parallel_config *config, type_costs *out,
                         pt_error *err)
{
    return costmodel_price_type(cm, type_index, config, cm, out, err);
}
