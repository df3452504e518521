/*
 * Looking a price up in a profile's measured points: the model's layer
 * shape, the nearest measured tp, the micro-batches around the one asked
 * for (docs/cost-model.md 1.1, 1.2), and, for a shape the profile does
 * not hold, the measured shapes around it (1.3): the times of the two
 * neighbours, each part interpolated as a power law of its work.
 * docs/profiles.md states the interpolation's tested error.
 */
#include <math.h>
#include <string.h>

#include "costmodel/internal.h"

double layer_forward_flops(double hidden, double ffn_hidden, double seq,
                           double microbatch)
{
    double matmuls = 2.0 * microbatch * seq *
                     (4.0 * hidden * hidden + 2.0 * hidden * ffn_hidden);
    double attention = 4.0 * microbatch * seq * seq * hidden;
    return matmuls + attention;
}

double model_layer_forward_flops(const model_shape *model, double microbatch)
{
    if (model_is_gpt(model))
        return layer_forward_flops(model->hidden, model->ffn_hidden,
                                   model->seq, microbatch);
    /* Megatron's count: q h x h, k and v h x kv d each, the projection
     * h x h, the MLP 2 (GELU) or 3 (SwiGLU) h x f matrices; attention's
     * Q K^T and P V over all heads whatever the key/value heads */
    double h = model->hidden, f = model->ffn_hidden, s = model->seq;
    double kv = (double)model_kv_heads(model) * (model->hidden / model->heads);
    double mlp_matrices = model->mlp == MODEL_MLP_SWIGLU ? 3.0 : 2.0;
    double matmuls = 2.0 * microbatch * s *
                     (2.0 * h * h + 2.0 * h * kv + mlp_matrices * h * f);
    return matmuls + 4.0 * microbatch * s * s * h;
}

double padded_vocab_shard(int vocab, int tp)
{
    int shard = (vocab + tp - 1) / tp;
    return (double)((shard + 127) / 128 * 128);
}

int profile_shape_ffn(const profile_shape *shape)
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

/* The model's shape in the profile: its widths and its layer's
 * architecture (a Llama layer is never priced by a GPT-2 layer of the
 * same widths, nor the reverse); heads are not part of the key. */
const profile_shape *lookup_held_shape(const profile *prof,
                                       const model_shape *model)
{
    for (int i = 0; i < prof->shape_count; i++) {
        const profile_shape *shape = &prof->shapes[i];
        if (profile_shape_prices(shape, model) && has_usable_point(shape))
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
        completed_part(point->head, backward_over_forward),
        point->head_fused};
}

part_cost lookup_head_unfused(part_cost head, double fused_share)
{
    double moved = fused_share * head.forward_s;
    head.forward_s -= moved;
    head.backward_s += moved;
    return head;
}

/* a and b with their heads timed alike: both unfused where they differ */
static void heads_alike(part_times *a, part_times *b, double fused_share)
{
    if (a->head_fused == b->head_fused)
        return;
    part_times *fused = a->head_fused ? a : b;
    fused->head = lookup_head_unfused(fused->head, fused_share);
    fused->head_fused = false;
}

static part_cost blend_part(part_cost a, part_cost b, double weight_a,
                            double weight_b)
{
    return (part_cost){
        .forward_s = a.forward_s * weight_a + b.forward_s * weight_b,
        .backward_s = a.backward_s * weight_a + b.backward_s * weight_b};
}

/* a and b's heads timed alike (heads_alike) */
static part_times blend(part_times a, part_times b, double weight_a,
                        double weight_b)
{
    return (part_times){blend_part(a.embedding, b.embedding, weight_a, weight_b),
                        blend_part(a.layer, b.layer, weight_a, weight_b),
                        blend_part(a.head, b.head, weight_a, weight_b),
                        a.head_fused};
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
                               int mbs, double fused_share)
{
    double bof = prof->backward_over_forward;
    const profile_point *lower = near->lower, *upper = near->upper;
    if (prof->mbs_scaling == MBS_SCALING_MEASURED && lower && upper) {
        if (lower->mbs == upper->mbs)
            return point_times(lower, bof);
        double weight_upper = (double)(mbs - lower->mbs) /
                              (upper->mbs - lower->mbs);
        part_times a = point_times(lower, bof), b = point_times(upper, bof);
        heads_alike(&a, &b, fused_share);
        return blend(a, b, 1.0 - weight_upper, weight_upper);
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

part_times lookup_shape_times(const profile *prof, const profile_shape *shape,
                              const parallel_config *config,
                              double fused_share, lookup_path *path)
{
    int tp = nearest_tp(shape, config->tp);
    mbs_neighbours near = find_neighbours(shape, tp, config->mbs);
    part_times times = times_at_mbs(prof, &near, config->mbs, fused_share);
    if (tp != config->tp)
        times = scaled(times, (double)tp / config->tp);
    if (path) {
        *path = (lookup_path){.tp_used = tp, .near = near};
        path->between = prof->mbs_scaling == MBS_SCALING_MEASURED &&
                        near.lower && near.upper;
    }
    return times;
}

/* ------------------------------------------------ neighbouring shapes */

/* What a part's time follows from shape to shape: one layer's forward
 * FLOPs for one sequence (layer, by its architecture), s h V (the head's
 * LM-head product) and s h (the embedding's rows). */
static double part_work(int part, const model_shape *m)
{
    if (part == 1)
        return model_layer_forward_flops(m, 1.0);
    return part == 2 ? (double)m->seq * m->hidden * m->vocab
                     : (double)m->seq * m->hidden;
}

static double shape_work(const profile_shape *shape)
{
    model_shape m = profile_shape_model(shape);
    return model_layer_forward_flops(&m, 1.0);
}

static bool has_tp(const profile_shape *shape, int tp)
{
    for (int i = 0; i < shape->point_count; i++)
        if (shape->points[i].tp == tp && shape->points[i].mbs > 0)
            return true;
    return false;
}

/* A shape that may stand in for the model: the same layer architecture,
 * the same vocabulary and the same ffn_hidden / hidden, measured points,
 * and (when need_tp) points at that tp. */
static bool candidate(const profile_shape *shape, const model_shape *m,
                      int need_tp)
{
    long long ffn = profile_shape_ffn(shape);
    return profile_shape_same_architecture(shape, m) &&
           shape->vocab == m->vocab &&
           ffn * m->hidden == (long long)m->ffn_hidden * shape->hidden &&
           has_usable_point(shape) && (need_tp == 0 || has_tp(shape, need_tp));
}

/* Neighbours among the candidates (need_tp as in candidate): one each
 * side of the model's layer work when there are both; else, when the
 * nearest is within NEIGHBOUR_REACH of it, the nearest and the next one
 * out on that side at least 1.2 times further (or none). */
/* Beyond a quarter more or less work than the nearest measured shape,
 * one side's trend is no guide (leave-one-out on the bundled profiles,
 * docs/profiles.md). */
#define NEIGHBOUR_REACH 1.25
static bool pick_neighbours(const profile *prof, const model_shape *m,
                            int need_tp, bool allow_one_side,
                            shape_neighbours *out)
{
    double target = model_layer_forward_flops(m, 1.0);
    const profile_shape *below = NULL, *above = NULL;
    for (int i = 0; i < prof->shape_count; i++) {
        const profile_shape *s = &prof->shapes[i];
        if (!candidate(s, m, need_tp))
            continue;
        double work = shape_work(s);
        if (work <= target && (!below || work > shape_work(below)))
            below = s;
        if (work >= target && (!above || work < shape_work(above)))
            above = s;
    }
    if (below && above && below != above) {
        *out = (shape_neighbours){below, above, false};
        return true;
    }
    const profile_shape *nearest = below ? below : above;
    if (!allow_one_side || !nearest)
        return false;
    double reach = shape_work(nearest) / target;
    if (reach > NEIGHBOUR_REACH || reach < 1.0 / NEIGHBOUR_REACH)
        return false;
    /* the second: the next candidate beyond the nearest, far enough that
       their difference is not noise */
    const profile_shape *second = NULL;
    double nearest_work = shape_work(nearest);
    for (int i = 0; i < prof->shape_count; i++) {
        const profile_shape *s = &prof->shapes[i];
        if (!candidate(s, m, need_tp))
            continue;
        double ratio = shape_work(s) / nearest_work;
        bool beyond = below ? ratio <= 1.0 / 1.2 : ratio >= 1.2;
        if (beyond && (!second || fabs(log(ratio)) <
                                      fabs(log(shape_work(second) /
                                               nearest_work))))
            second = s;
    }
    *out = (shape_neighbours){nearest, second, true};
    return true;
}

bool lookup_shape_neighbours(const profile *prof, const model_shape *m,
                             int tp, shape_neighbours *out)
{
    /* neighbours measured at the tp, on both sides if possible; other
       tps' points (scaled by tp) only when no shape of the model's
       architecture has that tp */
    if (pick_neighbours(prof, m, tp, false, out) ||
        pick_neighbours(prof, m, tp, true, out))
        return true;
    for (int i = 0; i < prof->shape_count; i++)
        if (has_tp(&prof->shapes[i], tp) &&
            profile_shape_same_architecture(&prof->shapes[i], m))
            return false;
    return pick_neighbours(prof, m, 0, false, out) ||
           pick_neighbours(prof, m, 0, true, out);
}

/* t_a (x / x_a)^k with k from the two points; with one point (or two
 * that cannot say), proportional to x. */
static double power_law(double t_a, double x_a, double t_b, double x_b,
                        double x, bool two)
{
    if (!two || t_a <= 0.0 || t_b <= 0.0 || x_a == x_b)
        return t_a * x / x_a;
    double k = log(t_b / t_a) / log(x_b / x_a);
    /* outside the two points, no faster than the work grows, never
       shrinking with it */
    if ((x - x_a) * (x - x_b) > 0.0)
        k = fmin(fmax(k, 0.0), 1.0);
    return t_a * pow(x / x_a, k);
}

static part_cost interpolated_part(part_cost a, part_cost b, double x_a,
                                   double x_b, double x, bool two)
{
    return (part_cost){
        .forward_s = power_law(a.forward_s, x_a, b.forward_s, x_b, x, two),
        .backward_s = power_law(a.backward_s, x_a, b.backward_s, x_b, x,
                                two)};
}

part_times lookup_neighbour_times(const profile *prof, const model_shape *m,
                                  const shape_neighbours *near,
                                  const parallel_config *config,
                                  double fused_share)
{
    bool two = near->b != NULL;
    const profile_shape *b = two ? near->b : near->a;
    part_times ta = lookup_shape_times(prof, near->a, config, fused_share,
                                       NULL);
    part_times tb = lookup_shape_times(prof, b, config, fused_share, NULL);
    heads_alike(&ta, &tb, fused_share);
    part_cost *out_parts[3];
    part_times out = {.head_fused = ta.head_fused};
    out_parts[0] = &out.embedding;
    out_parts[1] = &out.layer;
    out_parts[2] = &out.head;
    const part_cost a_parts[3] = {ta.embedding, ta.layer, ta.head};
    const part_cost b_parts[3] = {tb.embedding, tb.layer, tb.head};
    model_shape model_a = profile_shape_model(near->a);
    model_shape model_b = profile_shape_model(b);
    for (int part = 0; part < 3; part++) {
        double x = part_work(part, m);
        double x_a = part_work(part, &model_a);
        double x_b = part_work(part, &model_b);
        *out_parts[part] = interpolated_part(a_parts[part], b_parts[part],
                                             x_a, x_b, x, two);
    }
    return out;
}
