/*
 * A per-kernel roofline of the embedding, one transformer layer and the
 * head, and its fit on measured (or published) profiles. A `derived`
 * profile carries the fitted parameters and the spec figures of its GPU,
 * and so prices any layer shape. docs/profiles.md states the model, the
 * kernels, the fit and its error; the formulas below follow it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

/* ------------------------------------------------------------ kernels */

typedef enum kernel_kind { KERNEL_GEMM, KERNEL_ATTENTION, KERNEL_MEMORY }
    kernel_kind;

/* weight: elements of the weight matrix a GEMM multiplies by (0 for a
 * product of two activations), whose gradient the backward accumulates;
 * skip_backward: a memory pass whose backward is done in its forward
 * (the fused classifier). */
typedef struct kernel {
    kernel_kind kind;
    double flops;
    double bytes;
    double weight;
    bool skip_backward;
} kernel;

/* The most kernels any part runs in one direction (a layer's backward
 * runs 14, 15 with a pass for rotary positions or the regrouped q, k
 * and v, 20 with unfused attention). */
#define MAX_PART_KERNELS 24

typedef struct kernel_list {
    int count;
    kernel kernels[MAX_PART_KERNELS];
} kernel_list;

static void add_kernel(kernel_list *list, kernel_kind kind, double flops,
                       double bytes)
{
    if (list->count < MAX_PART_KERNELS)
        list->kernels[list->count++] = (kernel){kind, flops, bytes, 0.0,
                                                false};
}

/* C[m x n] = A[m x k] W[k x n], W a weight: 2mnk FLOPs; A, W read and C
 * written once. */
static void add_gemm(kernel_list *list, double m, double n, double k,
                     double element)
{
    add_kernel(list, KERNEL_GEMM, 2.0 * m * n * k,
               element * (m * k + k * n + m * n));
    if (list->count > 0)
        list->kernels[list->count - 1].weight = k * n;
}

static void add_memory(kernel_list *list, double bytes)
{
    add_kernel(list, KERNEL_MEMORY, 0.0, bytes);
}

/* Key/value channels of one tp rank: kv d / t with multi-head attention
 * (h / t, the GPT expression), the key/value heads Megatron gives a rank
 * (replicated when fewer than t) with grouped-query attention. */
static double kv_channels(const model_shape *m, int tp)
{
    if (model_kv_heads(m) == m->heads)
        return (double)m->hidden / tp;
    return model_kv_heads_per_rank(m, tp) * (m->hidden / m->heads);
}

/* Unfused attention of one tp shard (a / t heads of h / a channels):
 * Q K^T and P V as batched GEMMs whose s x s scores go through memory,
 * the scaled, masked softmax over them, and dropout (its output and a
 * one-byte mask written). */
static void unfused_attention_kernels(const model_shape *m, int tp, int mbs,
                                      double e, kernel_list *out)
{
    double tokens = (double)mbs * m->seq, t = tp;
    double scores = (double)mbs * m->heads / t * m->seq * m->seq;
    double qkv_shard = tokens * m->hidden / t;
    /* Q's and K's (or V's) shard: with grouped-query attention K and V
       are narrower than Q */
    double qk_shard = model_kv_heads(m) == m->heads
                          ? 2.0 * qkv_shard
                          : qkv_shard + tokens * kv_channels(m, tp);
    add_kernel(out, KERNEL_GEMM, 2.0 * mbs * (double)m->seq * m->seq *
                                     m->hidden / t,
               e * (qk_shard + scores));                   /* Q K^T */
    add_memory(out, 2.0 * e * scores);                      /* softmax */
    add_memory(out, (2.0 * e + 1.0) * scores);              /* dropout */
    add_kernel(out, KERNEL_GEMM, 2.0 * mbs * (double)m->seq * m->seq *
                                     m->hidden / t,
               e * (scores + qk_shard));                    /* P V */
}

/* The attention core of one tp shard, forward: flash (one kernel: the
 * FLOPs of Q K^T and P V over the full s x s square, as Megatron counts
 * them, and the bytes of Q, K, V and O) or unfused (above). What
 * Megatron's selective recompute runs again in the backward. */
static void attention_core_kernels(const model_shape *m, int tp, int mbs,
                                   double e, bool unfused, kernel_list *out)
{
    double tokens = (double)mbs * m->seq, h = m->hidden, t = tp;
    double kv = kv_channels(m, tp);
    if (unfused)
        unfused_attention_kernels(m, tp, mbs, e, out);
    else
        add_kernel(out, KERNEL_ATTENTION,
                   4.0 * mbs * (double)m->seq * m->seq * h / t,
                   model_kv_heads(m) == m->heads
                       ? 4.0 * tokens * h / t * e
                       : 2.0 * tokens * (h / t + kv) * e);
}

/* The shard of one transformer layer a tp rank computes, forward. Biases
 * ride in the kernels that apply them (QKV's in the GEMM epilogue, the
 * others fused with GELU or with the residual add); the attention core
 * as above. */
static void layer_forward_kernels(const model_shape *m, roofline_shard shard,
                                  kernel_list *out)
{
    int tp = shard.tp, mbs = shard.mbs;
    double e = shard.element_bytes;
    double tokens = (double)mbs * m->seq, h = m->hidden, t = tp;
    double f = m->ffn_hidden;
    bool mha = model_kv_heads(m) == m->heads;
    bool swiglu = m->mlp == MODEL_MLP_SWIGLU;
    double kv = kv_channels(m, tp);
    /* RMSNorm reads and writes what LayerNorm does: both memory bound */
    add_memory(out, 2.0 * tokens * h * e);               /* norm 1 */
    add_gemm(out, tokens, mha ? 3.0 * h / t : h / t + 2.0 * kv, h,
             e);                                         /* QKV + bias */
    if (shard.regrouped_qkv && !model_is_gpt(m))
        add_memory(out, 2.0 * tokens * (h / t + 2.0 * kv) * e); /* q, k, v
                                                     regrouped (and turned) */
    else if (m->positions == MODEL_POSITIONS_ROPE)
        add_memory(out, 2.0 * tokens * (h / t + kv) * e); /* RoPE on Q, K */
    attention_core_kernels(m, tp, mbs, e, shard.unfused_attention, out);
    add_gemm(out, tokens, h, h / t, e);                  /* projection */
    add_memory(out, 3.0 * tokens * h * e);               /* bias + residual */
    add_memory(out, 2.0 * tokens * h * e);               /* norm 2 */
    /* SwiGLU: gate and up as one product of 2f / t columns, then the
       gate's SiLU times up (reads 2f / t, writes f / t) */
    add_gemm(out, tokens, (swiglu ? 2.0 : 1.0) * f / t, h, e); /* MLP up */
    add_memory(out, (swiglu ? 3.0 : 2.0) * tokens * f / t * e); /* act. */
    add_gemm(out, tokens, h, f / t, e);                  /* MLP down */
    add_memory(out, 3.0 * tokens * h * e);               /* bias + residual */
}

/* Token and position rows read, their sum written (rotary positions:
 * the token rows read and written). Vocabulary-parallel embeddings read
 * the same rows on every tp rank (masked), so the bytes do not shrink
 * with tp. */
static void embedding_forward_kernels(const model_shape *m, int mbs,
                                      double e, kernel_list *out)
{
    double rows = m->positions == MODEL_POSITIONS_LEARNED ? 3.0 : 2.0;
    add_memory(out, rows * mbs * (double)m->seq * m->hidden * e);
}

/* Final layer norm, the LM head GEMM over the rank's V / tp vocabulary
 * rows padded to 128 (padded_vocab_shard: both runtimes compute the
 * padding), and the cross-entropy as the runtime runs it. */
static void head_forward_kernels(const model_shape *m, int tp, int mbs,
                                 double e, bool fused_classifier,
                                 kernel_list *out)
{
    double tokens = (double)mbs * m->seq, h = m->hidden;
    double vocab_shard = padded_vocab_shard(m->vocab, tp);
    double logits = tokens * vocab_shard;
    add_memory(out, 2.0 * tokens * h * e);
    add_gemm(out, tokens, vocab_shard, h, e);
    if (fused_classifier) {
        /* one pass for the row's maximum and sum, one that overwrites
           the logits with their gradient: the backward's part is done */
        add_memory(out, 3.0 * e * logits);
        out->kernels[out->count - 1].skip_backward = true;
    } else {
        add_memory(out, logits * (e + 4.0)); /* fp32 softmax written */
    }
}

/* Backward of a forward kernel list. A GEMM by a weight becomes the
 * input gradient (the forward's size) and the weight gradient, which
 * reads the input and the output gradient and accumulates into the
 * weight's gradient (main_grad_bytes read and written; 0: written once
 * in e); a product of two activations becomes two of its size. Flash
 * attention's backward recomputes the scores, 2.5x the forward FLOPs,
 * reading Q, K, V, O, dO and writing dQ, dK, dV (2x the bytes); a
 * memory-bound kernel reads its saved input and the incoming gradient
 * and writes a gradient (2x the bytes), unless its forward did it. */
static void backward_kernels(const kernel_list *forward, double e,
                             double main_grad_bytes, kernel_list *out)
{
    out->count = 0;
    for (int i = 0; i < forward->count; i++) {
        const kernel *k = &forward->kernels[i];
        switch (k->kind) {
        case KERNEL_GEMM: {
            add_kernel(out, KERNEL_GEMM, k->flops, k->bytes);
            double accumulate = main_grad_bytes > 0.0
                                    ? 2.0 * main_grad_bytes * k->weight
                                    : e * k->weight;
            add_kernel(out, KERNEL_GEMM, k->flops,
                       k->bytes - e * k->weight + accumulate);
            break;
        }
        case KERNEL_ATTENTION:
            add_kernel(out, KERNEL_ATTENTION, 2.5 * k->flops, 2.0 * k->bytes);
            break;
        case KERNEL_MEMORY:
            if (!k->skip_backward)
                add_memory(out, 2.0 * k->bytes);
            break;
        }
    }
}

/* The kernels of one part (0 embedding, 1 layer, 2 head) in one
 * direction. */
static void part_kernels(const model_shape *m, roofline_shard shard,
                         int part, bool backward, kernel_list *out)
{
    kernel_list forward = {0};
    double e = shard.element_bytes;
    if (part == 0)
        embedding_forward_kernels(m, shard.mbs, e, &forward);
    else if (part == 1)
        layer_forward_kernels(m, shard, &forward);
    else
        head_forward_kernels(m, shard.tp, shard.mbs, e,
                             shard.fused_classifier, &forward);
    if (backward)
        backward_kernels(&forward, e, shard.main_grad_bytes, out);
    else
        *out = forward;
}

/* The head's kernels as the partita executor's fused head runs them:
 * the forward's and the backward's GEMMs (the head matrix's input and
 * weight gradients) in the forward, the rest of the backward (the final
 * norm's) in the backward. */
static void fused_head_kernels(const model_shape *m, roofline_shard shard,
                               bool backward, kernel_list *out)
{
    kernel_list back;
    part_kernels(m, shard, 2, true, &back);
    if (backward)
        out->count = 0;
    else
        part_kernels(m, shard, 2, false, out);
    for (int i = 0; i < back.count; i++)
        if ((back.kernels[i].kind == KERNEL_GEMM) != backward)
            out->kernels[out->count++] = back.kernels[i];
}

/* ------------------------------------------------------- kernel times */

/* Share of the GPU's memory bandwidth that sms_used SMs can pull: all of
 * it from the saturating share of the SMs on, proportionally less below. */
static double bandwidth_share(const roofline_params *p,
                              const roofline_device *d)
{
    double sm_share = (double)d->sms_used / d->sms;
    double share = sm_share / p->bandwidth_saturation_sm_fraction;
    return share < 1.0 ? share : 1.0;
}

/* max(FLOPs / rate, bytes / bandwidth) + overhead. A GEMM's (or the
 * attention's) efficiency saturates with its work per SM w:
 * top x w / (w + w_half), so small GEMMs reach less of the peak. The
 * SMs used scale the peak. */
static double kernel_seconds(const roofline_params *p,
                             const roofline_device *d, const kernel *k)
{
    double bandwidth = d->bandwidth_bytes_per_s * bandwidth_share(p, d) *
                       p->bandwidth_efficiency;
    double memory_s = k->bytes / bandwidth;
    double compute_s = 0.0;
    if (k->kind != KERNEL_MEMORY && k->flops > 0.0) {
        double top = k->kind == KERNEL_GEMM ? p->gemm_efficiency
                                            : p->attention_efficiency;
        double work_per_sm = k->flops / d->sms_used;
        double efficiency = top * work_per_sm /
                            (work_per_sm + p->gemm_half_work_flop);
        double peak = d->peak_flops * d->sms_used / d->sms;
        compute_s = k->flops / (peak * efficiency);
    }
    return (compute_s > memory_s ? compute_s : memory_s) +
           p->kernel_overhead_s;
}

static double list_seconds(const roofline_params *p, const roofline_device *d,
                           const kernel_list *list)
{
    double total = 0.0;
    for (int i = 0; i < list->count; i++)
        total += kernel_seconds(p, d, &list->kernels[i]);
    return total;
}

void roofline_part_costs(const roofline_params *params,
                         const roofline_device *device,
                         const model_shape *shape, roofline_shard shard,
                         model_part_costs *out)
{
    part_cost *parts[3] = {&out->embedding, &out->layer, &out->head};
    for (int part = 0; part < 3; part++) {
        kernel_list forward, backward;
        part_kernels(shape, shard, part, false, &forward);
        part_kernels(shape, shard, part, true, &backward);
        parts[part]->forward_s = list_seconds(params, device, &forward);
        parts[part]->backward_s = list_seconds(params, device, &backward);
    }
}

double roofline_attention_share(const roofline_params *params,
                                const roofline_device *device,
                                const model_shape *shape, roofline_shard shard)
{
    kernel_list layer, core = {0};
    part_kernels(shape, shard, 1, false, &layer);
    attention_core_kernels(shape, shard.tp, shard.mbs, shard.element_bytes,
                           shard.unfused_attention, &core);
    double whole = list_seconds(params, device, &layer);
    return whole > 0.0 ? list_seconds(params, device, &core) / whole : 0.0;
}

double roofline_head_products_share(const roofline_params *params,
                                    const roofline_device *device,
                                    const model_shape *shape,
                                    roofline_shard shard)
{
    kernel_list backward, products = {0};
    part_kernels(shape, shard, 2, true, &backward);
    /* the backward's GEMMs: the head matrix's input and weight
     * gradients (the final norm's backward is a memory pass) */
    for (int i = 0; i < backward.count; i++)
        if (backward.kernels[i].kind == KERNEL_GEMM)
            products.kernels[products.count++] = backward.kernels[i];
    double whole = list_seconds(params, device, &backward);
    return whole > 0.0 ? list_seconds(params, device, &products) / whole
                       : 0.0;
}

double roofline_head_fused_products_share(const roofline_params *params,
                                          const roofline_device *device,
                                          const model_shape *shape,
                                          roofline_shard shard)
{
    kernel_list forward, plain;
    fused_head_kernels(shape, shard, false, &forward);
    part_kernels(shape, shard, 2, false, &plain);
    double whole = list_seconds(params, device, &forward);
    /* the fused forward is the plain one's kernels and the products */
    return whole > 0.0
               ? (whole - list_seconds(params, device, &plain)) / whole
               : 0.0;
}

int roofline_device_of(const profile *p, roofline_device *out, pt_error *err)
{
    if (!(p->peak_tflops > 0.0) || !(p->memory_bandwidth_GBps > 0.0) ||
        p->sms <= 0)
        return pt_fail(err,
                       "profile %s: efficiency.peak_tflops, "
                       "memory_bandwidth_GBps and sms are needed for the "
                       "roofline (the GPU's spec figures), got %g TFLOP/s, "
                       "%g GB/s, %d SMs",
                       p->gpu, p->peak_tflops, p->memory_bandwidth_GBps,
                       p->sms);
    if (p->sm_limit > p->sms)
        return pt_fail(err, "profile %s: sm_limit %d is more than its %d SMs",
                       p->gpu, p->sm_limit, p->sms);
    *out = (roofline_device){
        .peak_flops = p->peak_tflops * 1e12,
        .bandwidth_bytes_per_s = p->memory_bandwidth_GBps * 1e9,
        .sms = p->sms,
        .sms_used = p->sm_limit > 0 ? p->sm_limit : p->sms};
    return 0;
}

/* ------------------------------------------------------- observations */

/* A usable time of a source with the kernels that predict it (which do
 * not depend on the parameters, so the fit builds them once). */
typedef struct fit_point {
    roofline_observation observation;
    const roofline_device *device;
    kernel_list kernels;
} fit_point;

/* The sources are Partita's own measurements: fp32 main gradients, the
 * fused classifier, a Llama layer's q, k, v regrouped in one pass
 * (docs/profiles.md, "The fit"). */
#define SOURCE_MAIN_GRAD_BYTES 4.0
#define SOURCE_FUSED_CLASSIFIER true
#define SOURCE_REGROUPED_QKV true

/* Times that carry tensor-parallel communication, or that the reader
 * filled in from backward_over_forward, are not the roofline's to fit;
 * nor the embedding's: a few microseconds of launches and index
 * arithmetic that no FLOPs or bytes describe, which pulled the fitted
 * kernel overhead (and with it every small layer) up tenfold, and never
 * more than 0.2 % of a measured step. */
static bool time_is_usable(const profile *source, const profile_point *pt,
                           const part_cost *cost, bool backward)
{
    if (source->layer_times_include_tp_comm && pt->tp > 1)
        return false;
    if (cost == &pt->embedding)
        return false;
    /* a head timed fused: its backward measures 4-5 x the final norm's
       backward that fused_head_kernels lists (0.33 against 0.07 ms at
       GPT-2 1.5B, mbs 8, H200 of 2026-11-29): a time the kernel list does
       not describe would pull every parameter of the fit (the H200's rms
       log error 0.13 -> 0.32), so it is left out */
    if (backward && cost == &pt->head && pt->head_fused)
        return false;
    if (!backward)
        return cost->forward_s > 0.0;
    bool filled = source->backward_over_forward > 0.0 &&
                  cost->backward_s ==
                      source->backward_over_forward * cost->forward_s;
    return cost->backward_s > 0.0 && !filled;
}

/* Appends the usable times of one source to points (which has room for
 * six per profile point); returns how many, counting the rest in
 * *left_out. */
static int source_points(const profile *source, const roofline_device *device,
                         fit_point *points, int *left_out)
{
    int count = 0;
    for (int s = 0; s < source->shape_count; s++) {
        const profile_shape *shape = &source->shapes[s];
        /* each shape's own layer: a measured Llama layer is fitted by
           its own kernels */
        model_shape m = profile_shape_model(&source->shapes[s]);
        for (int i = 0; i < shape->point_count; i++) {
            const profile_point *pt = &shape->points[i];
            const part_cost *parts[3] = {&pt->embedding, &pt->layer,
                                         &pt->head};
            for (int part = 0; part < 3; part++) {
                for (int direction = 0; direction < 2; direction++) {
                    bool backward = direction == 1;
                    if (!time_is_usable(source, pt, parts[part], backward)) {
                        (*left_out)++;
                        continue;
                    }
                    fit_point *fp = &points[count++];
                    fp->observation = (roofline_observation){
                        .shape_index = s, .tp = pt->tp, .mbs = pt->mbs,
                        .part = part, .backward = backward,
                        .measured_s = backward ? parts[part]->backward_s
                                               : parts[part]->forward_s};
                    fp->device = device;
                    /* the sources are half-precision measurements */
                    roofline_shard shard = {pt->tp, pt->mbs, 2.0, false,
                                            SOURCE_MAIN_GRAD_BYTES,
                                            SOURCE_FUSED_CLASSIFIER,
                                            SOURCE_REGROUPED_QKV};
                    /* a head timed fused: the products in its forward */
                    if (part == 2 && pt->head_fused)
                        fused_head_kernels(&m, shard, backward,
                                           &fp->kernels);
                    else
                        part_kernels(&m, shard, part, backward,
                                     &fp->kernels);
                }
            }
        }
    }
    return count;
}

static int profile_time_slots(const profile *source)
{
    int slots = 0;
    for (int s = 0; s < source->shape_count; s++)
        slots += 6 * source->shapes[s].point_count;
    return slots;
}

int roofline_observations(const roofline_params *params,
                          const profile *source,
                          roofline_observation **out, int *count,
                          int *left_out, pt_error *err)
{
    *out = NULL;
    *count = 0;
    *left_out = 0;
    roofline_device device;
    if (roofline_device_of(source, &device, err) != 0)
        return -1;
    int slots = profile_time_slots(source);
    fit_point *points = calloc(slots > 0 ? (size_t)slots : 1, sizeof *points);
    roofline_observation *observations =
        calloc(slots > 0 ? (size_t)slots : 1, sizeof *observations);
    if (points == NULL || observations == NULL) {
        free(points);
        free(observations);
        return pt_fail(err, "roofline: out of memory");
    }
    int used = source_points(source, &device, points, left_out);
    for (int i = 0; i < used; i++) {
        observations[i] = points[i].observation;
        observations[i].predicted_s = list_seconds(params, &device,
                                                   &points[i].kernels);
    }
    free(points);
    *out = observations;
    *count = used;
    return 0;
}

/* ---------------------------------------------------------------- fit */

/* The fit works on unbounded coordinates: logit of the efficiencies (the
 * attention's over (0, 2)), log of the sizes and times. */
#define PARAM_COUNT ROOFLINE_PARAM_COUNT
/* Weight of the pull towards the priors, per parameter, against the sum
 * of squared log errors (one point off by 10% adds 0.009). */
#define PRIOR_WEIGHT 0.01

static double logit(double x) { return log(x / (1.0 - x)); }
static double logistic(double u) { return 1.0 / (1.0 + exp(-u)); }

roofline_params roofline_params_from_vector(const double *u)
{
    return (roofline_params){
        .present = true,
        .gemm_efficiency = logistic(u[0]),
        .gemm_half_work_flop = 1e9 * exp(u[1]),
        .attention_efficiency = 2.0 * logistic(u[2]),
        .bandwidth_efficiency = logistic(u[3]),
        .kernel_overhead_s = 1e-6 * exp(u[4]),
        .bandwidth_saturation_sm_fraction = logistic(u[5])};
}

void roofline_vector_from_params(const roofline_params *p, double *u)
{
    u[0] = logit(p->gemm_efficiency);
    u[1] = log(p->gemm_half_work_flop / 1e9);
    u[2] = logit(p->attention_efficiency / 2.0);
    u[3] = logit(p->bandwidth_efficiency);
    u[4] = log(p->kernel_overhead_s / 1e-6);
    u[5] = logit(p->bandwidth_saturation_sm_fraction);
}

/* Priors (docs/profiles.md, "The fit"): cuBLAS reaches about 70% of peak
 * on large GEMMs; a GEMM of 0.01 GFLOP per SM reaches half of that; flash
 * attention 0.8 of peak on the full-square count (it skips the masked
 * half); elementwise kernels 80% of bandwidth; 5 us per kernel; half of
 * the SMs saturate memory bandwidth. */
static roofline_params prior_params(void)
{
    return (roofline_params){.present = true,
                             .gemm_efficiency = 0.7,
                             .gemm_half_work_flop = 1e7,
                             .attention_efficiency = 0.8,
                             .bandwidth_efficiency = 0.8,
                             .kernel_overhead_s = 5e-6,
                             .bandwidth_saturation_sm_fraction = 0.5};
}

typedef struct fit_problem {
    const fit_point *points;
    int point_count;
    double prior[PARAM_COUNT];
} fit_problem;

/* ln(predicted / measured) for every point, then the prior terms. */
static void residuals(const void *context, const double *u, double *r)
{
    const fit_problem *problem = context;
    roofline_params p = roofline_params_from_vector(u);
    for (int i = 0; i < problem->point_count; i++) {
        const fit_point *fp = &problem->points[i];
        double predicted = list_seconds(&p, fp->device, &fp->kernels);
        r[i] = log(predicted / fp->observation.measured_s);
    }
    double weight = sqrt(PRIOR_WEIGHT);
    for (int j = 0; j < PARAM_COUNT; j++)
        r[problem->point_count + j] = weight * (u[j] - problem->prior[j]);
}

/* The least-squares cost has kinks (the max of compute and memory time)
 * and flat directions, so the fit starts from the prior and from a few
 * spread-out points and keeps the best end. */
static int fit_from_starts(const fit_problem *fit, double *best,
                           pt_error *err)
{
    static const double gemm_starts[] = {0.2, 0.5, 0.85};
    static const double overhead_starts_us[] = {1.0, 5.0, 30.0};
    lsq_problem problem = {.param_count = PARAM_COUNT,
                           .residual_count = fit->point_count + PARAM_COUNT,
                           .residuals = residuals, .context = fit,
                           .max_iterations = 200};
    double best_cost = HUGE_VAL;
    for (int start = -1; start < 9; start++) {
        roofline_params p = prior_params();
        if (start >= 0) {
            p.gemm_efficiency = gemm_starts[start / 3];
            p.kernel_overhead_s = overhead_starts_us[start % 3] * 1e-6;
        }
        double u[PARAM_COUNT];
        roofline_vector_from_params(&p, u);
        double cost = lsq_minimise(&problem, u, err);
        if (isnan(cost))
            return -1;
        if (cost < best_cost) {
            best_cost = cost;
            memcpy(best, u, sizeof u);
        }
    }
    return 0;
}

/* What the file will say: 4 significant digits of each parameter. */
roofline_params roofline_rounded(const roofline_params *p)
{
    roofline_params out = *p;
    out.gemm_efficiency = pt_round_significant(p->gemm_efficiency, 4);
    out.gemm_half_work_flop =
        pt_round_significant(p->gemm_half_work_flop, 4);
    out.attention_efficiency =
        pt_round_significant(p->attention_efficiency, 4);
    out.bandwidth_efficiency =
        pt_round_significant(p->bandwidth_efficiency, 4);
    out.kernel_overhead_s = pt_round_significant(p->kernel_overhead_s, 4);
    out.bandwidth_saturation_sm_fraction =
        pt_round_significant(p->bandwidth_saturation_sm_fraction, 4);
    return out;
}

static void error_of(const roofline_params *p, const fit_point *points,
                     int count, roofline_fit_error *out)
{
    double squares = 0.0, worst = 0.0;
    for (int i = 0; i < count; i++) {
        double predicted = list_seconds(p, points[i].device,
                                        &points[i].kernels);
        double ratio = predicted / points[i].observation.measured_s;
        squares += log(ratio) * log(ratio);
        if (fabs(ratio - 1.0) > worst)
            worst = fabs(ratio - 1.0);
    }
    out->points = count;
    out->rms_log_error = count > 0 ? sqrt(squares / count) : 0.0;
    out->max_error = worst;
}

/* Gathers every source's usable points (devices into devices[]). */
static int gather_points(const profile *sources, int source_count,
                         roofline_device *devices, fit_point **out,
                         int *first, roofline_fit_result *result,
                         pt_error *err)
{
    int slots = 0;
    for (int i = 0; i < source_count; i++) {
        if (roofline_device_of(&sources[i], &devices[i], err) != 0)
            return -1;
        slots += profile_time_slots(&sources[i]);
    }
    fit_point *points = calloc(slots > 0 ? (size_t)slots : 1, sizeof *points);
    if (points == NULL)
        return pt_fail(err, "roofline: out of memory");
    int count = 0;
    for (int i = 0; i < source_count; i++) {
        roofline_fit_error *e = &result->sources[i];
        pt_copy_string(e->gpu, sizeof e->gpu, sources[i].gpu);
        first[i] = count;
        count += source_points(&sources[i], &devices[i], points + count,
                               &e->left_out);
        result->all.left_out += e->left_out;
    }
    first[source_count] = count;
    *out = points;
    return count;
}

int roofline_fit(const profile *sources, int source_count,
                 roofline_fit_result *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (source_count <= 0 || source_count > ROOFLINE_MAX_SOURCES)
        return pt_fail(err, "roofline: fit on 1 to %d profiles, got %d",
                       ROOFLINE_MAX_SOURCES, source_count);
    roofline_device devices[ROOFLINE_MAX_SOURCES];
    int first[ROOFLINE_MAX_SOURCES + 1];
    fit_point *points = NULL;
    int count = gather_points(sources, source_count, devices, &points, first,
                              out, err);
    if (count < 0)
        return -1;
    if (count == 0) {
        free(points);
        return pt_fail(err, "roofline: the profiles hold no time to fit (%d "
                       "left out: times with tensor-parallel communication "
                       "inside, or backward times filled in by a ratio)",
                       out->all.left_out);
    }
    fit_problem problem = {.points = points, .point_count = count};
    roofline_params prior = prior_params();
    roofline_vector_from_params(&prior, problem.prior);
    int status = 0;
    double best[PARAM_COUNT];
    if (fit_from_starts(&problem, best, err) != 0) {
        status = -1;
    } else {
        roofline_params fitted = roofline_params_from_vector(best);
        out->params = roofline_rounded(&fitted);
        out->source_count = source_count;
        pt_copy_string(out->all.gpu, sizeof out->all.gpu, "all");
        error_of(&out->params, points, count, &out->all);
        for (int i = 0; i < source_count; i++)
            error_of(&out->params, points + first[i], first[i + 1] - first[i],
                     &out->sources[i]);
    }
    free(points);
    return status;
}
