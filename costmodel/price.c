/*
 * Pricing one GPU type: the profile's measured points looked up by layer
 * shape, tensor-parallel degree and micro-batch (lookup.c), interpolated
 * from measured neighbouring shapes, or the roofline / efficiency model
 * when the profile has neither (docs/cost-model.md, "Layer time"); and
 * the list of how each part was priced, for the estimate.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "costmodel/internal.h"

/* Achieved / peak over the layer forwards the profile holds (its tp = 1
 * points when it has any, since the others may include communication),
 * of the model's layer architecture when the profile holds any, else of
 * every shape (a Llama layer's rate is not a GPT-2 layer's). */
static double fitted_efficiency(const profile *prof, const model_shape *m)
{
    double sum_tp1 = 0.0, sum_all = 0.0;
    int count_tp1 = 0, count_all = 0;
    bool own = false;
    for (int i = 0; i < prof->shape_count; i++)
        own = own || profile_shape_same_architecture(&prof->shapes[i], m);
    for (int i = 0; i < prof->shape_count; i++) {
        const profile_shape *shape = &prof->shapes[i];
        if (own && !profile_shape_same_architecture(shape, m))
            continue;
        model_shape layer = profile_shape_model(shape);
        for (int j = 0; j < shape->point_count; j++) {
            const profile_point *point = &shape->points[j];
            if (point->layer.forward_s <= 0.0 || point->tp <= 0 ||
                point->mbs <= 0)
                continue;
            double flops = model_layer_forward_flops(&layer, point->mbs) /
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

static double model_efficiency(const profile *prof, const model_shape *m)
{
    return prof->flops_efficiency > 0.0 ? prof->flops_efficiency
                                        : fitted_efficiency(prof, m);
}

/* "hidden 64, ffn_hidden 96, seq 16, vocab 257", and the layer's
 * architecture after it when it is not GPT-2's ("(rmsnorm swiglu rope kv
 * 2/4 nobias)"): the key of the profile shape the model looks for. */
static void shape_key_text(const model_shape *m, char *out, size_t size)
{
    char tag[64];
    model_architecture_tag(m, tag, sizeof tag);
    snprintf(out, size, "hidden %d, ffn_hidden %d, seq %d, vocab %d%s%s%s",
             m->hidden, m->ffn_hidden, m->seq, m->vocab,
             tag[0] != '\0' ? " (" : "", tag, tag[0] != '\0' ? ")" : "");
}

static int check_efficiency_model(const costmodel *cm, const profile *prof,
                                  pt_error *err)
{
    const model_shape *m = &cm->model;
    if (prof->roofline.present) {
        roofline_device device;
        return roofline_device_of(prof, &device, err);
    }
    char key[160];
    shape_key_text(m, key, sizeof key);
    if (prof->peak_tflops <= 0.0 || model_efficiency(prof, m) <= 0.0)
        return pt_fail(err,
                       "profile %s: holds no layer shape %s and has no "
                       "efficiency model to price it (needs "
                       "efficiency.peak_tflops and measured points or "
                       "flops_efficiency)",
                       prof->gpu, key);
    return 0;
}

/* "hidden 1024 (16 heads, seq 1024)": a shape as the notes name it,
 * its architecture's tag after the heads when it is not GPT-2's. */
static void describe_shape(const profile_shape *shape, char *out,
                           size_t size)
{
    model_shape layer = profile_shape_model(shape);
    char tag[64];
    model_architecture_tag(&layer, tag, sizeof tag);
    snprintf(out, size, "hidden %d (%d heads%s%s, seq %d)", shape->hidden,
             shape->heads, tag[0] != '\0' ? ", " : "", tag, shape->seq);
}

/* Whether the profile measured any layer of the model's architecture. */
static bool holds_architecture(const profile *prof, const model_shape *m)
{
    for (int i = 0; i < prof->shape_count; i++)
        if (profile_shape_same_architecture(&prof->shapes[i], m))
            return true;
    return false;
}

/* "interpolated from hidden 1024 (...) and hidden 1280 (...)". */
static void describe_neighbours(const shape_neighbours *near, char *out,
                                size_t size)
{
    char a[160], b[160] = "";
    describe_shape(near->a, a, sizeof a);
    if (near->b)
        describe_shape(near->b, b, sizeof b);
    if (!near->one_side)
        snprintf(out, size, "interpolated from the measured %s and %s", a,
                 b);
    else if (near->b)
        snprintf(out, size, "extrapolated from the measured %s and %s", a,
                 b);
    else
        snprintf(out, size, "scaled from the measured %s in proportion to "
                 "each part's work", a);
}

/* One coverage note into the memo, formatted as costmodel_add_note
 * formats it. */
static void coverage_note(coverage_memo *memo, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

static void coverage_note(coverage_memo *memo, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(memo->text[memo->count++], sizeof memo->text[0], format, args);
    va_end(args);
}

/* The notes costmodel_note_shape_coverage adds for the type, in order. */
static void coverage_notes(const costmodel *cm, int type_index,
                      coverage_memo *memo)
{
    const profile *prof = &cm->profiles[type_index];
    const model_shape *m = &cm->model;
    shape_neighbours near;
    if (lookup_held_shape(prof, m))
        return;
    if (!model_is_gpt(m) && prof->shape_count > 0 &&
        !holds_architecture(prof, m))
        coverage_note(memo,
                      "%s: the profile measured no layer of %s's "
                      "architecture (%s, %s, %s positions, %d key/value "
                      "heads of %d); it is priced from its own FLOPs "
                      "and bytes, not a GPT-2 layer's times "
                      "(docs/cost-model.md, \"Llama-family layers\"; "
                      "`partita profile --missing-only` measures it)",
                      prof->gpu, m->name, model_norm_name(m->norm),
                      model_mlp_name(m->mlp),
                      model_positions_name(m->positions),
                      model_kv_heads(m), m->heads);
    char key[160];
    shape_key_text(m, key, sizeof key);
    if (lookup_shape_neighbours(prof, m, 1, &near)) {
        char how[400];
        describe_neighbours(&near, how, sizeof how);
        coverage_note(memo,
                      "%s: the profile holds no layer shape %s; %s "
                      "(each part a power law of its work; "
                      "docs/profiles.md states the error)",
                      prof->gpu, key, how);
        return;
    }
    if (check_efficiency_model(cm, &cm->profiles[type_index], NULL))
        return;
    if (prof->roofline.present) {
        coverage_note(memo,
                      "%s: %s profile without measured times for %s; "
                      "priced by its roofline (%.0f TFLOP/s, %.0f GB/s, "
                      "%d SMs, efficiencies fitted on %s)",
                      prof->gpu, profile_source_name(prof->source), key,
                      prof->peak_tflops, prof->memory_bandwidth_GBps,
                      prof->sm_limit > 0 ? prof->sm_limit : prof->sms,
                      prof->source == PROFILE_DERIVED
                          ? "what its provenance names"
                          : "its own measured times");
        return;
    }
    coverage_note(memo,
                  "%s: the profile holds no layer shape %s; priced by "
                  "the efficiency model (%.0f TFLOP/s peak x %.3f %s)",
                  prof->gpu, key,
                  prof->peak_tflops, model_efficiency(prof, m),
                  prof->flops_efficiency > 0.0 ? "given" : "fitted");
}

void costmodel_note_shape_coverage(costmodel *cm, int type_index)
{
    const profile *prof = &cm->profiles[type_index];
    coverage_memo fresh, *memo = type_index < COSTMODEL_COVERAGE_MEMO
                                     ? &cm->coverage[type_index]
                                     : &fresh;
    if (memo == &fresh || memo->profile != prof) {
        memo->profile = prof;
        memo->count = 0;
        coverage_notes(cm, type_index, memo);
    }
    for (int i = 0; i < memo->count; i++)
        costmodel_add_note_text(cm, memo->text[i]);
}

/* Prices the three parts from FLOPs and bytes for a shape the profile
 * does not hold. Embedding: memory bound (read word and position rows,
 * write the sum). Head: the logits matmul in FLOPs plus the bf16 logits
 * and fp32 softmax written and read once. Backward: twice the FLOPs, the
 * same bytes. */
/* The compute peak a plan's matmuls run at on prof's GPU: the dense
 * tensor peak for half precision; for fp32 the TF32 tensor rate (with
 * tf32) or the plain FP32 one, when the profile gives it (0: it does
 * not, and the tensor peak stands in with a note). */
static double plan_peak_tflops(const profile *prof,
                               const parallel_config *config)
{
    if (config->precision != PRECISION_FP32)
        return prof->peak_tflops;
    double rate = config->tf32 ? prof->tf32_tflops : prof->fp32_tflops;
    return rate > 0.0 ? rate : 0.0;
}

static double rate_or_tensor(const profile *prof,
                             const parallel_config *config)
{
    double rate = plan_peak_tflops(prof, config);
    return rate > 0.0 ? rate : prof->peak_tflops;
}

static part_times efficiency_times(const profile *prof, const model_shape *m,
                                   const parallel_config *config)
{
    double flops_per_s =
        rate_or_tensor(prof, config) * 1e12 * model_efficiency(prof, m);
    double bytes_per_s = prof->memory_bandwidth_GBps * 1e9;
    double tokens = (double)config->mbs * m->seq;
    double element = precision_bytes(config->precision);
    part_times t = {0};

    double layer_flops = model_layer_forward_flops(m, config->mbs) /
                         config->tp;
    t.layer.forward_s = layer_flops / flops_per_s;
    t.layer.backward_s = 2.0 * t.layer.forward_s;

    /* token and position rows read, their sum written; rotary
     * positions: the token rows read and written */
    double embedding_rows = m->positions == MODEL_POSITIONS_LEARNED ? 3.0
                                                                    : 2.0;
    double embedding_bytes = embedding_rows * tokens * m->hidden * element;
    t.embedding.forward_s = bytes_per_s > 0.0 ? embedding_bytes / bytes_per_s
                                              : 0.0;
    t.embedding.backward_s = 2.0 * t.embedding.forward_s;

    double vocab_shard = padded_vocab_shard(m->vocab, config->tp);
    double head_flops = 2.0 * tokens * m->hidden * vocab_shard;
    double logits_bytes = 2.0 * tokens * vocab_shard * (element + 4.0);
    double head_bytes_s = bytes_per_s > 0.0 ? logits_bytes / bytes_per_s : 0.0;
    t.head.forward_s = head_flops / flops_per_s + head_bytes_s;
    t.head.backward_s = 2.0 * head_flops / flops_per_s + head_bytes_s;
    return t;
}

/* Computation of the three parts from the profile's roofline (any
 * shape, tp and micro-batch; costmodel/roofline.c). */
static roofline_shard shard_of(const parallel_config *config)
{
    return (roofline_shard){
        .tp = config->tp, .mbs = config->mbs,
        .element_bytes = precision_bytes(config->precision),
        .unfused_attention = parallel_attention(config) == ATTENTION_UNFUSED,
        .main_grad_bytes = parallel_gradient_bytes(config),
        .fused_classifier = config->runtime == RUNTIME_PARTITA,
        .regrouped_qkv = config->runtime == RUNTIME_PARTITA};
}

static part_times roofline_times(const profile *prof, const model_shape *m,
                                 const parallel_config *config)
{
    roofline_device device;
    model_part_costs costs;
    /* check_efficiency_model has made sure the device is complete */
    roofline_device_of(prof, &device, NULL);
    device.peak_flops = rate_or_tensor(prof, config) * 1e12;
    roofline_part_costs(&prof->roofline, &device, m, shard_of(config),
                        &costs);
    return (part_times){costs.embedding, costs.layer, costs.head, false};
}

/* The profile's roofline device at the plan's compute rate; false when
 * the profile has no roofline. */
static bool plan_roofline_device(const profile *prof,
                                 const parallel_config *config,
                                 roofline_device *out)
{
    if (!prof->roofline.present || roofline_device_of(prof, out, NULL) != 0)
        return false;
    out->peak_flops = rate_or_tensor(prof, config) * 1e12;
    return true;
}

/* Megatron's selective recompute runs the attention core's forward again
 * in the backward: its share of the layer's forward time, from the
 * profile's roofline when it has one, else by FLOPs (4 s^2 h of the
 * layer's). */
static double attention_core_share(const profile *prof, const model_shape *m,
                                   const parallel_config *config)
{
    roofline_device device;
    if (plan_roofline_device(prof, config, &device))
        return roofline_attention_share(&prof->roofline, &device, m,
                                        shard_of(config));
    double layer = model_layer_forward_flops(m, 1.0);
    return layer > 0.0 ? 4.0 * (double)m->seq * m->seq * m->hidden / layer
                       : 0.0;
}

/* The head's backward products' share of its backward time (the head
 * matrix's input and weight gradients; the rest is the final norm's
 * backward), from the profile's roofline when it has one; else all of
 * it: the efficiency model prices the head's backward as those two
 * products and the logits they read, and nothing else. */
static double head_products_share(const profile *prof, const model_shape *m,
                                  const parallel_config *config)
{
    roofline_device device;
    if (plan_roofline_device(prof, config, &device))
        return roofline_head_products_share(&prof->roofline, &device, m,
                                            shard_of(config));
    return 1.0;
}

/* The same products' share of a fused head's forward (points timed with
 * the executor's fused head), from the roofline when the profile has
 * one; else by FLOPs: the forward's logits product and the backward's
 * two of the same size, 2 of the 3. */
static double head_fused_products_share(const profile *prof,
                                        const model_shape *m,
                                        const parallel_config *config)
{
    roofline_device device;
    if (plan_roofline_device(prof, config, &device))
        return roofline_head_fused_products_share(&prof->roofline, &device,
                                                  m, shard_of(config));
    return 2.0 / 3.0;
}

/* One of the layer's tensor-parallel all-reduces (b x s x h elements) on
 * the node's intra-node link, or from the profile's measured curve. */
static double tp_allreduce_seconds(const costmodel *cm, int type_index,
                                   const parallel_config *config)
{
    double bytes = activation_message_bytes(&cm->model, config);
    link_spec intra = cm->cluster->types[type_index].intra_node;
    if (config->sequence_parallel)
        return costmodel_sequence_tp_comm_s(
            costmodel_reduce_scatter_seconds(cm, bytes, config->tp,
                                             type_index, intra),
            costmodel_all_gather_seconds(cm, bytes, config->tp, type_index,
                                         intra));
    double measured;
    if (costmodel_curve_time(&cm->profiles[type_index].allreduce, config->tp, bytes,
                   &measured))
        return measured;
    return allreduce_time(bytes, config->tp, intra);
}

/* What a layer's pass adds to its collectives under sequence
 * parallelism in Partita's executor (docs/cost-model.md 1.7): the
 * shard's rows copied into the gathered buffer, two in each pass (2
 * bytes read and written a value), and in the backward the two norm
 * outputs' rows gathered again for the weight gradients (Megatron-LM
 * does the same but overlaps the gather with the input gradient's
 * product; this executor's stream does not) and the group's sum of the
 * norms' weight and bias gradients (4 h floats a layer and micro-batch).
 * Under another runtime nothing: the gather hides under the product. */
static double sequence_extra_seconds(const costmodel *cm, int type_index,
                                     const parallel_config *config,
                                     double stream_s_per_byte, bool backward)
{
    if (!config->sequence_parallel || config->tp < 2 ||
        config->runtime != RUNTIME_PARTITA)
        return 0.0;
    double bytes = activation_message_bytes(&cm->model, config);
    /* each copy reads and writes the shard's bytes, bytes / tp */
    double copies = 2.0 * 2.0 * bytes / config->tp * stream_s_per_byte;
    if (!backward)
        return copies;
    link_spec intra = cm->cluster->types[type_index].intra_node;
    double gather = costmodel_all_gather_seconds(cm, bytes, config->tp,
                                                 type_index, intra);
    double norm_sum_bytes = 4.0 * cm->model.hidden * 4.0, norm_sum;
    if (!costmodel_curve_time(&cm->profiles[type_index].allreduce,
                              config->tp, norm_sum_bytes, &norm_sum))
        norm_sum = allreduce_time(norm_sum_bytes, config->tp, intra);
    return copies + 2.0 * gather + norm_sum;
}

/* Notes what a lookup stretched (another tp, a micro-batch far outside
 * the measured ones). */
static void note_lookup(costmodel *note_target, const costmodel *cm,
                        const profile *prof, const parallel_config *config,
                        const lookup_path *path)
{
    if (path->tp_used != config->tp)
        costmodel_add_note(note_target,
                           "%s: the profile has no tp %d points for "
                           "hidden %d; priced from tp %d scaled by %d/%d",
                           prof->gpu, config->tp, cm->model.hidden,
                           path->tp_used, path->tp_used, config->tp);
    bool far_outside = config->mbs > 2 * path->near.grid_max ||
                       2 * config->mbs < path->near.grid_min;
    if (far_outside)
        costmodel_add_note(note_target,
                           "%s: micro-batch %d is more than 2x outside the "
                           "measured micro-batches %d..%d; its time is "
                           "scaled linearly from the nearest point",
                           prof->gpu, config->mbs, path->near.grid_min,
                           path->near.grid_max);
}

/* The three parts' times of a type: from the held shape, from measured
 * neighbours, or from the roofline / efficiency model; *add_tp_comm
 * says whether the layer times still lack the tp all-reduces. */
static int type_times(const costmodel *cm, int type_index,
                      const profile *prof, const parallel_config *config,
                      costmodel *note_target, part_times *times,
                      bool *add_tp_comm, bool *measured, pt_error *err)
{
    *measured = true;
    const profile_shape *shape = lookup_held_shape(prof, &cm->model);
    shape_neighbours near;
    *add_tp_comm = !prof->layer_times_include_tp_comm;
    double fused_share = head_fused_products_share(prof, &cm->model, config);
    if (shape) {
        lookup_path path;
        *times = lookup_shape_times(prof, shape, config, fused_share, &path);
        if (note_target)
            note_lookup(note_target, cm, prof, config, &path);
        return 0;
    }
    if (lookup_shape_neighbours(prof, &cm->model, config->tp, &near)) {
        *times = lookup_neighbour_times(prof, &cm->model, &near, config,
                                        fused_share);
    } else {
        if (check_efficiency_model(cm, prof, err) != 0)
            return -1;
        *times = prof->roofline.present
                     ? roofline_times(prof, &cm->model, config)
                     : efficiency_times(prof, &cm->model, config);
        *add_tp_comm = true; /* FLOPs alone carry no communication */
        *measured = false;
    }
    if (note_target)
        costmodel_note_shape_coverage(note_target, type_index);
    return 0;
}

/* Why an fp32 plan's compute is priced as it is: measured (half-
 * precision) times, or a profile without the FP32 / TF32 figure. */
static void note_fp32(costmodel *note_target, const profile *prof,
                      const parallel_config *config, bool times_measured)
{
    if (times_measured)
        costmodel_add_note(note_target,
                           "%s: fp32 plans are priced with the profile's "
                           "measured half-precision layer times (compute "
                           "not slowed)", prof->gpu);
    else if (plan_peak_tflops(prof, config) <= 0.0)
        costmodel_add_note(note_target,
                           "%s: the profile gives no %s rate; fp32 compute "
                           "is priced at its half-precision tensor peak",
                           prof->gpu, config->tf32 ? "TF32" : "FP32");
}

/* A layer's tensor-parallel collectives (two in each pass) and what
 * sequence parallelism adds to them, into the layer times; the note says
 * what the latter costs a layer. */
static void add_tp_collectives(const costmodel *cm, int type_index,
                               const parallel_config *config,
                               costmodel *note_target, type_costs *out)
{
    double forward = sequence_extra_seconds(cm, type_index, config,
                                            out->stream_s_per_byte, false);
    double backward = sequence_extra_seconds(cm, type_index, config,
                                             out->stream_s_per_byte, true);
    out->layer_forward_s += 2.0 * out->tp_allreduce_s + forward;
    out->layer_backward_s += 2.0 * out->tp_allreduce_s + backward;
    if (note_target != NULL && backward > 0.0)
        costmodel_add_note(note_target,
                           "%s: sequence parallelism in Partita's executor "
                           "adds %.3f ms to a layer's forward and %.3f ms "
                           "to its backward (the norm outputs gathered "
                           "again, the norms' gradient sum, the row "
                           "copies; Megatron-LM hides the gather: "
                           "docs/cost-model.md 1.7)",
                           cm->cluster->types[type_index].gpu,
                           forward * 1e3, backward * 1e3);
}

/* Type type_index (checked by the callers) costs from profile prof (its
 * own, or its profile at rest); the tp all-reduce from its own profile's
 * curves either way. */
static int price_type_from(const costmodel *cm, int type_index,
                           const profile *prof, const parallel_config *config,
                           costmodel *note_target, type_costs *out,
                           pt_error *err)
{
    if (config->tp <= 0 || config->mbs <= 0)
        return pt_fail(err, "costmodel: tp and mbs must be positive, got tp "
                       "%d, mbs %d", config->tp, config->mbs);
    part_times times;
    bool add_tp_comm, times_measured;
    if (type_times(cm, type_index, prof, config, note_target, &times,
                   &add_tp_comm, &times_measured, err) != 0)
        return -1;
    if (config->precision == PRECISION_FP32 && note_target)
        note_fp32(note_target, prof, config, times_measured);

    out->embedding_forward_s = times.embedding.forward_s;
    out->embedding_backward_s = times.embedding.backward_s;
    out->layer_forward_s = times.layer.forward_s;
    out->layer_backward_s = times.layer.backward_s;
    out->head_forward_s = times.head.forward_s;
    out->head_backward_s = times.head.backward_s;
    /* the products where the times hold them: an unfused head's
     * backward, a fused head's forward (docs/cost-model.md 5) */
    out->head_timed_fused = times.head_fused;
    out->head_products_s =
        times.head_fused
            ? head_fused_products_share(prof, &cm->model, config) *
                  times.head.forward_s
            : head_products_share(prof, &cm->model, config) *
                  times.head.backward_s;
    out->tp_allreduce_s = config->tp > 1
                              ? tp_allreduce_seconds(cm, type_index, config)
                              : 0.0;
    out->stream_s_per_byte =
        prof->optimizer_s_per_param / COSTMODEL_ADAMW_BYTES_PER_PARAM;
    if (add_tp_comm)
        add_tp_collectives(cm, type_index, config, note_target, out);
    if (config->recompute)
        out->layer_backward_s += out->layer_forward_s;
    else if (config->selective_recompute)
        out->layer_backward_s += attention_core_share(prof, &cm->model,
                                                      config) *
                                 times.layer.forward_s;
    /* ZeRO-Offload: the step moves to the host (zero.c) */
    out->optimizer_s_per_param = config->offload_optimizer
                                     ? costmodel_offload_s_per_param(
                                           config,
                                           prof->host_adamw_s_per_param,
                                           prof->host_copy_s_per_param)
                                     : prof->optimizer_s_per_param;
    out->host_adamw_s_per_param = prof->host_adamw_s_per_param;
    out->host_copy_s_per_param = prof->host_copy_s_per_param;
    /* the stage boundary of Partita's executor: fp32 message <-> bf16
     * stream, 4 bytes read and 2 written an element (or 2 and 4), of the
     * shard's rows under sequence parallelism */
    double rows = (double)config->mbs * cm->model.seq /
                  (config->sequence_parallel ? config->tp : 1);
    out->boundary_s = config->runtime == RUNTIME_PARTITA
                          ? 6.0 * rows * cm->model.hidden *
                                out->stream_s_per_byte
                          : 0.0;
    out->memory_cap_bytes = (prof->memory_gib - prof->workspace_gib) * PT_GIB;
    return 0;
}

/* ----------------------------------------------------- the price memo */

/* Slots of each of the memo's two caches: direct-mapped, a newcomer
 * replaces the entry its slot held. Entries lie in the order first
 * made, so the pages a memo touches grow with what it holds, not with
 * its slots. */
#define PRICE_MEMO_SLOTS 4096

/* A config's every field, as the memo compares them (a parallel_config's
 * padding is not always written, so its bytes cannot be compared). */
#define CONFIG_KEY_FIELDS 21
typedef struct config_key {
    int field[CONFIG_KEY_FIELDS];
} config_key;

/* A field added to parallel_config must be added to config_of too. */
_Static_assert(sizeof(parallel_config) == 68,
               "parallel_config changed: update config_of's fields");

static config_key config_of(const parallel_config *c)
{
    return (config_key){{c->gbs, c->mbs, c->tp, c->dp, c->pp,
                         (int)c->schedule, (int)c->precision, c->recompute,
                         c->selective_recompute, c->distributed_optimizer,
                         c->zero_stage, c->offload_optimizer,
                         c->virtual_stages, c->sequence_parallel,
                         (int)c->runtime, (int)c->attention,
                         c->overlap_grad_reduce, c->overlap_param_gather,
                         c->tf32, (int)c->grad_precision,
                         c->deterministic}};
}

typedef struct price_entry {
    bool noted; /* its notes are in the costmodel's */
    int type;
    config_key config;
    type_costs costs;
} price_entry;

typedef struct memory_entry {
    int stage;
    double context_bytes;
    config_key config;
    double fixed_bytes, per_layer_bytes;
} memory_entry;

struct price_memo {
    /* entry index + 1 of each slot (0: empty) */
    int32_t price_slot[PRICE_MEMO_SLOTS], memory_slot[PRICE_MEMO_SLOTS];
    /* the entries, grown as they are made (a memo of a small search
       stays small: a block of every slot's entry would be mapped and
       its pages touched anew for every search) */
    int price_count, memory_count, price_room, memory_room;
    price_entry *prices;
    memory_entry *memories;
    /* whether each lies in a reservation of its own (memo_grow) */
    bool prices_mapped, memories_mapped;
};

/* A memo's entries lie in a reservation of address space advised for
 * huge pages, made at the first entry and never moved: grown by realloc
 * they were copied into pages touched anew each time, and every first
 * touch of a small page is a page fault (about 15 us on a virtual
 * machine; a memo of the asymmetric search holds hundreds of kilobytes).
 * Where no reservation can be made, or once it is full, realloc. */
#define PRICE_MEMO_RESERVE ((size_t)64 << 20)

static void memo_items_free(void *items, bool mapped)
{
    if (mapped)
        munmap(items, PRICE_MEMO_RESERVE);
    else
        free(items);
}

/* Room for more entries (the reservation's, or twice as many: 64 at
 * first); false without memory. */
static bool memo_grow(void *items_at, int *room, bool *mapped, size_t size)
{
    void *items;
    memcpy(&items, items_at, sizeof items);
    void *grown = NULL;
    int grown_room = *room > 0 ? 2 * *room : 64;
    if (*room == 0) {
        void *reserved = mmap(NULL, PRICE_MEMO_RESERVE,
                              PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                              -1, 0);
        if (reserved != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
            madvise(reserved, PRICE_MEMO_RESERVE, MADV_HUGEPAGE);
#endif
            grown = reserved;
            grown_room = (int)(PRICE_MEMO_RESERVE / size);
            *mapped = true;
        }
    }
    if (grown == NULL) {
        grown = *mapped ? malloc(size * (size_t)grown_room)
                        : realloc(items, size * (size_t)grown_room);
        if (grown == NULL)
            return false;
        if (*mapped) {
            memcpy(grown, items, size * (size_t)*room);
            munmap(items, PRICE_MEMO_RESERVE);
            *mapped = false;
        }
    }
    memcpy(items_at, &grown, sizeof grown);
    *room = grown_room;
    return true;
}

int costmodel_price_memo_attach(costmodel *cm, pt_error *err)
{
    /* only the slots zeroed: the entries are written as they are made */
    price_memo *memo = malloc(sizeof *memo);
    if (memo == NULL)
        return pt_fail(err, "costmodel: out of memory for the price memo");
    memset(memo->price_slot, 0, sizeof memo->price_slot);
    memset(memo->memory_slot, 0, sizeof memo->memory_slot);
    memo->price_count = memo->memory_count = 0;
    memo->price_room = memo->memory_room = 0;
    memo->prices = NULL;
    memo->memories = NULL;
    memo->prices_mapped = memo->memories_mapped = false;
    costmodel_price_memo_detach(cm);
    cm->price_memo = memo;
    return 0;
}

void costmodel_price_memo_detach(costmodel *cm)
{
    price_memo *memo = cm->price_memo;
    if (memo != NULL) {
        memo_items_free(memo->prices, memo->prices_mapped);
        memo_items_free(memo->memories, memo->memories_mapped);
    }
    free(cm->price_memo);
    cm->price_memo = NULL;
}

static size_t memo_slot_of(uint64_t seed, const config_key *key)
{
    uint64_t hash = 0x9e3779b97f4a7c15ULL ^ seed;
    for (int i = 0; i < CONFIG_KEY_FIELDS; i++)
        hash = (hash ^ (uint32_t)key->field[i]) * 0x100000001b3ULL;
    return (size_t)((hash ^ hash >> 29) % PRICE_MEMO_SLOTS);
}

/* The index of the entry a slot holds, or of a new one it now holds;
 * -1 when a new one is wanted and the `room` entries are all used. */
static int memo_entry_of(int32_t *slot, int *count, int room)
{
    if (*slot != 0)
        return *slot - 1;
    if (*count == room)
        return -1;
    *slot = ++*count;
    return *slot - 1;
}

bool costmodel_memory_memo_find(const costmodel *cm,
                                const parallel_config *config, int stage,
                                double context_bytes, double *fixed_bytes,
                                double *per_layer_bytes)
{
    const price_memo *memo = cm->price_memo;
    if (memo == NULL)
        return false;
    config_key key = config_of(config);
    int32_t at = memo->memory_slot[memo_slot_of((uint64_t)stage, &key)];
    const memory_entry *e = at > 0 ? &memo->memories[at - 1] : NULL;
    if (e == NULL || e->stage != stage ||
        memcmp(&e->context_bytes, &context_bytes, sizeof context_bytes) != 0 ||
        memcmp(&e->config, &key, sizeof key) != 0)
        return false;
    *fixed_bytes = e->fixed_bytes;
    *per_layer_bytes = e->per_layer_bytes;
    return true;
}

void costmodel_memory_memo_keep(const costmodel *cm,
                                const parallel_config *config, int stage,
                                double context_bytes, double fixed_bytes,
                                double per_layer_bytes)
{
    price_memo *memo = cm->price_memo;
    if (memo == NULL)
        return;
    config_key key = config_of(config);
    int32_t *slot = &memo->memory_slot[memo_slot_of((uint64_t)stage, &key)];
    int at = memo_entry_of(slot, &memo->memory_count, memo->memory_room);
    if (at < 0 && memo_grow(&memo->memories, &memo->memory_room,
                            &memo->memories_mapped, sizeof *memo->memories))
        at = memo_entry_of(slot, &memo->memory_count, memo->memory_room);
    if (at >= 0)
        memo->memories[at] = (memory_entry){stage, context_bytes, key,
                                            fixed_bytes, per_layer_bytes};
}

int costmodel_price_type(const costmodel *cm, int type_index,
                         const parallel_config *config,
                         costmodel *note_target, type_costs *out,
                         pt_error *err)
{
    if (type_index < 0 || type_index >= cm->cluster->type_count)
        return pt_fail(err, "costmodel: node type %d does not exist (the "
                       "cluster has %d)", type_index, cm->cluster->type_count);
    /* notes for a costmodel other than cm: priced as without a memo */
    price_memo *memo = cm->price_memo;
    bool memo_use = memo != NULL && (note_target == NULL || note_target == cm);
    config_key key = memo_use ? config_of(config) : (config_key){{0}};
    int32_t *slot = memo_use ? &memo->price_slot[memo_slot_of(
                                   (uint64_t)type_index, &key)]
                             : NULL;
    const price_entry *e =
        slot != NULL && *slot > 0 ? &memo->prices[*slot - 1] : NULL;
    if (e != NULL && e->type == type_index &&
        memcmp(&e->config, &key, sizeof key) == 0 &&
        (e->noted || note_target == NULL)) {
        *out = e->costs;
        return 0;
    }
    if (price_type_from(cm, type_index, &cm->profiles[type_index], config,
                        note_target, out, err) != 0)
        return -1;
    int at = slot != NULL ? memo_entry_of(slot, &memo->price_count,
                                          memo->price_room)
                          : -1;
    if (at < 0 && slot != NULL &&
        memo_grow(&memo->prices, &memo->price_room, &memo->prices_mapped,
                  sizeof *memo->prices))
        at = memo_entry_of(slot, &memo->price_count, memo->price_room);
    if (at >= 0)
        memo->prices[at] =
            (price_entry){note_target != NULL, type_index, key, *out};
    return 0;
}

int costmodel_type_costs_at_rest(const costmodel *cm, int type_index,
                                 const parallel_config *config,
                                 type_costs *out, pt_error *err)
{
    if (type_index < 0 || type_index >= cm->cluster->type_count ||
        !cm->rest_loaded || !cm->rest_loaded[type_index])
        return pt_fail(err, "costmodel: node type %d has no profile at rest",
                       type_index);
    return price_type_from(cm, type_index, &cm->rest_profiles[type_index],
                           config, NULL, out, err);
}

double costmodel_layer_pace_across_s(const parallel_config *config,
                                     const type_costs *costs,
                                     double across_s)
{
    double pace = costs->layer_forward_s + costs->layer_backward_s;
    if (config->tp < 2)
        return pace;
    /* the layer's all-reduces (2 forward, 2 backward, 2 more when the
       backward recomputes the forward) leave the node: swap the in-node
       time for the time across */
    double count = config->recompute ? 6.0 : 4.0;
    return pace + count * (across_s - costs->tp_allreduce_s);
}

double costmodel_tp_collective_across_s(const costmodel *cm,
                                        const parallel_config *config,
                                        const comm_group *span)
{
    double bytes = activation_message_bytes(&cm->model, config);
    if (config->sequence_parallel)
        return costmodel_sequence_tp_comm_s(nccl_reduce_scatter(bytes, span),
                                            nccl_reduce_scatter(bytes, span));
    return nccl_allreduce(bytes, span).seconds;
}

double costmodel_layer_pace_s(const costmodel *cm,
                              const parallel_config *config,
                              const type_costs *costs,
                              const comm_group *span)
{
    if (span == NULL || span->nodes < 2 || config->tp < 2)
        return costs->layer_forward_s + costs->layer_backward_s;
    return costmodel_layer_pace_across_s(
        config, costs, costmodel_tp_collective_across_s(cm, config, span));
}

int costmodel_type_costs(costmodel *cm, int type_index,
                         const parallel_config *config, type_costs *out,
                         pt_error *err)
{
    return costmodel_price_type(cm, type_index, config, cm, out, err);
}

int costmodel_slow_and_small_costs(costmodel *cm, const stage_placement *place,
                                   const parallel_config *config,
                                   type_costs *slow, type_costs *small,
                                   pt_error *err)
{
    if (costmodel_type_costs(cm, place->slow_type, config, slow, err) != 0)
        return -1;
    if (place->small_type == place->slow_type) {
        *small = *slow;
        return 0;
    }
    return costmodel_type_costs(cm, place->small_type, config, small, err);
}

const char *price_method_name(price_method method)
{
    static const char *const names[] = {
        [PRICE_MEASURED] = "measured",
        [PRICE_MICROBATCH] = "micro-batch",
        [PRICE_TP_SCALED] = "tp scaled",
        [PRICE_INTERPOLATED] = "interpolated",
        [PRICE_EXTRAPOLATED] = "extrapolated",
        [PRICE_ROOFLINE] = "roofline",
        [PRICE_EFFICIENCY] = "efficiency model"};
    if ((int)method < 0 || method > PRICE_EFFICIENCY)
        return "unknown";
    return names[method];
}

/* The method and its one line for a held shape's lookup. */
static price_method describe_lookup(const parallel_config *config,
                                    const lookup_path *path, char *how,
                                    size_t size)
{
    const profile_point *lower = path->near.lower, *upper = path->near.upper;
    if (path->tp_used != config->tp) {
        snprintf(how, size, "the measured tp %d points scaled by %d/%d",
                 path->tp_used, path->tp_used, config->tp);
        return PRICE_TP_SCALED;
    }
    if (lower && lower->mbs == config->mbs) {
        snprintf(how, size, "measured");
        return PRICE_MEASURED;
    }
    if (path->between)
        snprintf(how, size, "interpolated between the measured micro-batches "
                 "%d and %d", lower->mbs, upper->mbs);
    else
        snprintf(how, size, "scaled linearly from the measured micro-batch "
                 "%d", (lower ? lower : upper)->mbs);
    return PRICE_MICROBATCH;
}

/* The method and its one line for a shape the profile does not hold. */
static price_method describe_unheld(const costmodel *cm, const profile *prof,
                                    const parallel_config *config, char *how,
                                    size_t size)
{
    shape_neighbours near;
    if (lookup_shape_neighbours(prof, &cm->model, config->tp, &near)) {
        char from[256];
        describe_neighbours(&near, from, sizeof from);
        snprintf(how, size, "%s at tp %d, micro-batch %d", from, config->tp,
                 config->mbs);
        return near.one_side ? PRICE_EXTRAPOLATED : PRICE_INTERPOLATED;
    }
    if (prof->roofline.present) {
        snprintf(how, size, "the roofline of the %s profile (%.0f TFLOP/s, "
                 "%.0f GB/s)", profile_source_name(prof->source),
                 prof->peak_tflops, prof->memory_bandwidth_GBps);
        return PRICE_ROOFLINE;
    }
    snprintf(how, size, "FLOPs at %.0f TFLOP/s x %.3f efficiency",
             prof->peak_tflops, model_efficiency(prof, &cm->model));
    return PRICE_EFFICIENCY;
}

int costmodel_pricing(const costmodel *cm, int type_index,
                      const parallel_config *config, pricing_entry out[3],
                      pt_error *err)
{
    part_times times;
    bool add_tp_comm, measured;
    if (config->tp <= 0 || config->mbs <= 0 || type_index < 0 ||
        type_index >= cm->cluster->type_count)
        return pt_fail(err, "costmodel: no such type or config to price");
    const profile *prof = &cm->profiles[type_index];
    if (type_times(cm, type_index, prof, config, NULL, &times, &add_tp_comm,
                   &measured, err) != 0)
        return -1;
    const profile_shape *shape = lookup_held_shape(prof, &cm->model);
    char how[320];
    price_method method;
    if (shape) {
        lookup_path path;
        lookup_shape_times(prof, shape, config, 0.0, &path);
        method = describe_lookup(config, &path, how, sizeof how);
    } else {
        method = describe_unheld(cm, prof, config, how, sizeof how);
    }
    static const char *const parts[3] = {"embedding", "layer", "head"};
    const part_cost costs[3] = {times.embedding, times.layer, times.head};
    for (int i = 0; i < 3; i++) {
        out[i] = (pricing_entry){.part = parts[i], .tp = config->tp,
                                 .mbs = config->mbs, .method = method,
                                 .forward_s = costs[i].forward_s,
                                 .backward_s = costs[i].backward_s};
        pt_copy_string(out[i].gpu, sizeof out[i].gpu, prof->gpu);
        pt_copy_string(out[i].how, sizeof out[i].how, how);
    }
    /* the head's times as the profile holds them (docs/profiles.md) */
    if (times.head_fused) {
        size_t used = strlen(out[2].how);
        snprintf(out[2].how + used, sizeof out[2].how - used,
                 "; timed as the fused head (its backward products in the "
                 "forward)");
    }
    return 0;
}
