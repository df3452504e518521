/*
 * One pipeline stage as linear functions of its layer count: time per
 * micro-batch and memory per GPU (docs/cost-model.md, "Memory" and
 * "Stage terms"). The partition solvers and costmodel_estimate both use
 * these, so a partition is judged the same way everywhere.
 */
#include <math.h>

#include "costmodel/internal.h"

/* The parameter counts a stage's are made of, computed once where a
 * loop asks for many layer counts (the same values, so the same sums,
 * as stage_parameters_per_gpu computes each time). */
typedef struct parameter_counts {
    double layer, embedding, final_norm, per_rank;
} parameter_counts;

static parameter_counts parameter_counts_of(const model_shape *model, int tp)
{
    return (parameter_counts){model_layer_parameter_count(model),
                              model_embedding_parameter_count(model),
                              model_final_norm_parameter_count(model),
                              model_layer_parameters_per_rank(model, tp)};
}

static double stage_parameters_from(const model_shape *model,
                                    const parallel_config *config, int stage,
                                    int layers, const parameter_counts *n)
{
    double hidden = model->hidden;
    double word_embedding = (double)model->vocab * hidden;
    double params = layers * n->layer;
    if (stage == 0)
        params += n->embedding;
    if (stage == config->pp - 1) {
        params += n->final_norm;
        /* an untied head is its own matrix; a tied one is a copy of the
           word embedding on the last stage when that is not the first */
        if (!model->tied_embeddings || config->pp > 1)
            params += word_embedding;
    }
    /* key/value heads copied on ranks beyond their count (exactly 0
       without grouped-query attention) */
    double copies = n->per_rank - n->layer / config->tp;
    return params / config->tp + layers * copies;
}

double stage_parameters_per_gpu(const model_shape *model,
                                const parallel_config *config, int stage,
                                int layers)
{
    parameter_counts n = parameter_counts_of(model, config->tp);
    return stage_parameters_from(model, config, stage, layers, &n);
}

double costmodel_offload_host_bytes(const model_shape *model,
                                    const parallel_config *config, int stage,
                                    int layers)
{
    if (!config->offload_optimizer)
        return 0.0;
    double params = stage_parameters_per_gpu(model, config, stage, layers);
    if (parallel_zero_stage(config) >= 1 && config->dp > 1)
        params /= config->dp;
    return 12.0 * params; /* fp32 master weights, m and v */
}

int costmodel_microbatch_count(const parallel_config *config, pt_error *err)
{
    if (config->gbs <= 0 || config->dp <= 0 || config->mbs <= 0 ||
        config->gbs % (config->dp * config->mbs) != 0)
        return pt_fail(err, "plan: gbs %d must be a positive multiple of dp "
                       "x mbs = %d x %d", config->gbs, config->dp,
                       config->mbs);
    int microbatches = config->gbs / (config->dp * config->mbs);
    if ((long)microbatches * config->pp > COSTMODEL_MAX_SCHEDULE_STEPS)
        return pt_fail(err, "plan: gbs %d / (dp %d x mbs %d) = %d "
                       "micro-batches on pp %d stages is %ld steps of the "
                       "schedule; the cost model simulates at most %ld (a "
                       "bound on its time and memory): a larger mbs or dp, "
                       "or a smaller gbs, brings it under",
                       config->gbs, config->dp, config->mbs, microbatches,
                       config->pp, (long)microbatches * config->pp,
                       COSTMODEL_MAX_SCHEDULE_STEPS);
    return microbatches;
}

/* One pipeline message over `link`: whole from every tp rank (Partita's
 * executor, or the sequence shard under sequence parallelism), or, as
 * Megatron-LM and DeepSpeed send it, 1/tp from each tp rank and
 * all-gathered inside the receiving node (`gather`; the stage's own
 * node type's link stands for it). */
static double pipeline_send_s(const costmodel *cm,
                              const parallel_config *config, double bytes,
                              int curve_type, link_spec link,
                              link_spec gather)
{
    bool split = config->runtime != RUNTIME_PARTITA && config->tp > 1 &&
                 !config->sequence_parallel;
    if (!split)
        return costmodel_send_seconds(cm, bytes, curve_type, link);
    return costmodel_send_seconds(cm, bytes / config->tp, curve_type, link) +
           reduce_scatter_time(bytes, config->tp, gather);
}

/* Whether two stage configs split their stages alike. */
static bool same_degrees(const parallel_config *a, const parallel_config *b)
{
    return a->tp == b->tp && a->dp == b->dp;
}

double costmodel_boundary_send_s(const costmodel *cm,
                                  const parallel_config *from,
                                  const parallel_config *to, int curve_type,
                                  link_spec link, link_spec gather)
{
    if (same_degrees(from, to))
        return pipeline_send_s(
            cm, from, costmodel_pipeline_message_bytes(&cm->model, from),
            curve_type, link, gather);
    return costmodel_reshard_seconds(cm, from, to, curve_type, link, gather);
}

void costmodel_boundary_sends(const costmodel *cm, const stage_neighbours *n,
                              int stage, double *send_forward_s,
                              double *send_backward_s)
{
    const parallel_config *own = n->own;
    double bytes = costmodel_pipeline_message_bytes(&cm->model, own);
    const node_type *types = cm->cluster->types;
    link_spec gather = types[n->self->slow_type].intra_node;
    *send_forward_s = 0.0;
    *send_backward_s = 0.0;
    if (stage < own->pp - 1)
        *send_forward_s =
            same_degrees(own, n->after)
                ? pipeline_send_s(cm, own, bytes, n->self->next_curve_type,
                                  n->self->next_link, gather)
                : costmodel_reshard_seconds(
                      cm, own, n->after, n->self->next_curve_type,
                      n->self->next_link,
                      types[n->next->slow_type].intra_node);
    if (stage > 0)
        *send_backward_s =
            same_degrees(n->before, own)
                ? pipeline_send_s(cm, own, bytes,
                                  n->previous->next_curve_type,
                                  n->previous->next_link, gather)
                : costmodel_reshard_seconds(
                      cm, own, n->before, n->previous->next_curve_type,
                      n->previous->next_link,
                      types[n->previous->slow_type].intra_node);
}

void costmodel_stage_sends(const costmodel *cm, const parallel_config *config,
                           const stage_placement *previous,
                           const stage_placement *self, int stage,
                           double *send_forward_s, double *send_backward_s)
{
    stage_neighbours n = {config, config, config, previous, self, NULL};
    costmodel_boundary_sends(cm, &n, stage, send_forward_s, send_backward_s);
}

void costmodel_boundary_count(int s, int pp, int *forward, int *backward)
{
    bool first = s == 0, last = s == pp - 1;
    *forward = (first ? 0 : 1) + (last ? 0 : 1);
    *backward = (last ? 0 : 1) + 1;
}

/* Largest layer count whose memory fits, in the same arithmetic the
 * estimate uses to decide `fits`. */
static int layers_that_fit(const stage_terms *terms, int model_layers)
{
    if (terms->fixed_bytes > terms->cap_bytes)
        return -1;
    if (terms->per_layer_bytes <= 0.0)
        return model_layers;
    double room = (terms->cap_bytes - terms->fixed_bytes) /
                  terms->per_layer_bytes;
    int layers = room >= model_layers ? model_layers : (int)floor(room);
    while (layers > 0 &&
           terms->fixed_bytes + layers * terms->per_layer_bytes >
               terms->cap_bytes)
        layers--;
    while (layers < model_layers &&
           terms->fixed_bytes + (layers + 1) * terms->per_layer_bytes <=
               terms->cap_bytes)
        layers++;
    return layers;
}

void costmodel_terms_from_costs(const costmodel *cm,
                                const parallel_config *config,
                                const stage_placement *previous,
                                const stage_placement *self, int stage,
                                const type_costs *slow,
                                const type_costs *small, stage_terms *out)
{
    double send_forward, send_backward;
    costmodel_stage_sends(cm, config, previous, self, stage, &send_forward,
                          &send_backward);
    costmodel_terms_with_sends(cm, config, self, stage, slow, small,
                               send_forward + send_backward, out);
}

void costmodel_terms_with_sends(const costmodel *cm,
                                const parallel_config *config,
                                const stage_placement *self, int stage,
                                const type_costs *slow,
                                const type_costs *small, double sends_s,
                                stage_terms *out)
{
    const model_shape *model = &cm->model;
    type_costs zero_costs = *slow; /* with ZeRO-2/3's gathers, reduces */
    costmodel_zero_unit_costs(cm, config, self, &zero_costs);
    double pass_forward, pass_backward;
    costmodel_zero_pass_extra_s(cm, config, self, stage, slow, &pass_forward,
                                &pass_backward);
    slow = &zero_costs;
    bool first = stage == 0, last = stage == config->pp - 1;
    out->fixed_s = sends_s + pass_forward + pass_backward;
    if (first)
        out->fixed_s += slow->embedding_forward_s + slow->embedding_backward_s;
    if (last)
        out->fixed_s += slow->head_forward_s + slow->head_backward_s;
    int boundary_forward, boundary_backward;
    costmodel_boundary_count(stage, config->pp, &boundary_forward,
                             &boundary_backward);
    out->fixed_s += (boundary_forward + boundary_backward) * slow->boundary_s;
    comm_group tp_span = {.members = config->tp, .nodes = self->tp_nodes,
                          .intra = self->tp_intra_link,
                          .inter = self->tp_link};
    out->per_layer_s = costmodel_layer_pace_s(
        cm, config, slow, self->tp_spans_nodes ? &tp_span : NULL);

    /* memory: docs/cost-model.md, "Memory per GPU" (memory.c) */
    double workspace = cm->profiles[self->small_type].workspace_gib * PT_GIB;
    double context = costmodel_context_bytes(cm, config, self->small_type);
    if (!costmodel_memory_memo_find(cm, config, stage, context,
                                    &out->fixed_bytes,
                                    &out->per_layer_bytes)) {
        stage_memory memory;
        costmodel_stage_memory(model, config, stage, context, &memory);
        out->fixed_bytes = pt_memory_terms_total(&memory.fixed, true);
        out->per_layer_bytes = pt_memory_terms_total(&memory.per_layer, true);
        costmodel_memory_memo_keep(cm, config, stage, context,
                                   out->fixed_bytes, out->per_layer_bytes);
    }
    out->cap_bytes = small->memory_cap_bytes + workspace;
    out->max_layers = layers_that_fit(out, model->layers);
}

int costmodel_stage_terms_between(costmodel *cm,
                                  const parallel_config *config,
                                  const stage_placement *previous,
                                  const stage_placement *self, int stage,
                                  stage_terms *out, pt_error *err)
{
    if (costmodel_check_degrees(config, err) != 0 ||
        costmodel_microbatch_count(config, err) < 0)
        return -1;
    if (stage < 0 || stage >= config->pp)
        return pt_fail(err, "costmodel: stage %d is not in 0..%d", stage,
                       config->pp - 1);
    if (stage > 0 && previous == NULL)
        return pt_fail(err, "costmodel: stage %d needs the placement of the "
                       "stage before it", stage);
    type_costs slow, small;
    if (costmodel_slow_and_small_costs(cm, self, config, &slow, &small,
                                       err) != 0)
        return -1;
    costmodel_terms_from_costs(cm, config, previous, self, stage, &slow,
                               &small, out);
    return 0;
}

int costmodel_stage_terms(costmodel *cm, const parallel_config *config,
                          const stage_placement *placement, int stage,
                          stage_terms *out, pt_error *err)
{
    if (stage < 0 || stage >= config->pp)
        return pt_fail(err, "costmodel: stage %d is not in 0..%d", stage,
                       config->pp - 1);
    return costmodel_stage_terms_between(cm, config,
                                         stage > 0 ? &placement[stage - 1]
                                                   : NULL,
                                         &placement[stage], stage, out, err);
}

double costmodel_embedding_allreduce_s(const costmodel *cm,
                                       const parallel_config *config,
                                       link_spec link, int curve_type)
{
    if (!cm->model.tied_embeddings || config->pp < 2)
        return 0.0;
    double bytes = (double)cm->model.vocab * cm->model.hidden / config->tp *
                   4.0;
    return costmodel_allreduce_seconds(cm, bytes, 2, curve_type, link);
}

/* The backward of the stage's last micro-batch and its gradient bytes,
 * for the dp overlap. */
static dp_backward last_backward(const costmodel *cm,
                                 const parallel_config *config, int stage,
                                 int layers, const type_costs *slow,
                                 const parameter_counts *counts)
{
    bool first = stage == 0;
    /* what the head's backward still runs (a fused head's products ran
     * in its forward: head.c) */
    double head_forward, head_backward;
    costmodel_head_phases(&cm->model, config, stage, slow, &head_forward,
                          &head_backward);
    return (dp_backward){
        .first = first,
        .layers = layers,
        .head_s = head_backward,
        .layer_s = slow->layer_backward_s,
        .embedding_s = first ? slow->embedding_backward_s : 0.0,
        .fixed_bytes = 4.0 * stage_parameters_from(&cm->model, config,
                                                   stage, 0, counts),
        .layer_bytes = 4.0 * counts->per_rank};
}


/* Bytes the gradient-norm pass reads per parameter: the fp32 gradient
 * (executor/cuda/reductions.cu, cuda_square_sum), nothing written. */
#define NORM_BYTES_PER_PARAM 4.0
/* After ZeRO-1's (and ZeRO-2's) all-gather Partita's executor rebuilds
 * the half-precision copy of every parameter of the stage from the fp32
 * ones (cuda_params_changed): 4 bytes read, 2 written a parameter, at the
 * GPU's streaming rate, inside the run's dp_allreduce event. */
#define MIRROR_REBUILD_BYTES_PER_PARAM 6.0

/* The SM time of the device exchange's dp sums on a slice: each member's
 * kernel reads its chunk of every member's gradients (the whole buffer)
 * and writes the sum into every member's buffer (all-reduce) or its own
 * (ZeRO-1's reduce-scatter), at the slice's streaming rate. */
static double sum_kernels_seconds(const parallel_config *config,
                                  const stage_placement *placement,
                                  double gradient_bytes,
                                  const type_costs *slow)
{
    if (config->dp < 2 || !placement->slices_of_one_gpu)
        return 0.0;
    double written = config->distributed_optimizer
                         ? gradient_bytes / config->dp
                         : gradient_bytes;
    return (gradient_bytes + written) * slow->stream_s_per_byte;
}

/* The stage's gradient reduction, ZeRO-1's gather and its optimizer
 * step (what the searches' scores count): into out's reduce_s, gather_s
 * and optimizer_s; its parameters per GPU and gradient bytes into
 * *params and *gradient_bytes. */
static void reduce_and_step(const costmodel *cm, const parallel_config *config,
                            const stage_placement *placement, int stage,
                            int layers, const type_costs *slow,
                            const parameter_counts *counts, step_work *out,
                            double *params, double *gradient_bytes)
{
    *params = stage_parameters_from(&cm->model, config, stage, layers,
                                    counts);
    /* the main gradients as the runtime keeps and reduces them */
    *gradient_bytes = *params * parallel_gradient_bytes(config);
    bool zero1 = config->distributed_optimizer;
    out->reduce_s = costmodel_dp_reduce_seconds(cm, config, placement,
                                                *gradient_bytes, zero1);
    /* ZeRO-1's all-gather of the updated parameters: the fp32 master
     * parameters the executor gathers (it rebuilds its half-precision
     * copy from them afterwards) */
    out->gather_s = zero1 ? costmodel_dp_gather_seconds(
                                cm, config, placement,
                                *params * COSTMODEL_GATHER_BYTES_PER_PARAM)
                          : 0.0;
    if (zero1 && config->dp > 1 && config->runtime == RUNTIME_PARTITA)
        out->gather_s += *params * MIRROR_REBUILD_BYTES_PER_PARAM *
                         slow->stream_s_per_byte;
    double held = zero1 ? *params / config->dp : *params;
    out->optimizer_s = held * slow->optimizer_s_per_param;
}

void costmodel_step_work(const costmodel *cm, const parallel_config *config,
                         const stage_placement *placement, int stage,
                         int layers, const type_costs *slow, step_work *out)
{
    parameter_counts counts = parameter_counts_of(&cm->model, config->tp);
    double params, gradient_bytes;
    reduce_and_step(cm, config, placement, stage, layers, slow, &counts, out,
                    &params, &gradient_bytes);
    dp_backward backward = last_backward(cm, config, stage, layers, slow,
                                         &counts);
    out->exposed_s = costmodel_dp_exposed_seconds(cm, config, placement,
                                                  &backward, out->reduce_s);
    /* whole GPUs of one node: the sums' kernels hold the SMs for the
     * sums' whole time */
    out->sum_kernels_s =
        placement->dp_collectives_contend
            ? out->reduce_s
            : sum_kernels_seconds(config, placement, gradient_bytes, slow);
    double held = config->distributed_optimizer ? params / config->dp
                                                : params;
    /* the square sum of the gradients the rank steps (ZeRO-1: its shard),
     * before every rank meets the others' norms */
    out->norm_s = held * NORM_BYTES_PER_PARAM * slow->stream_s_per_byte;
    /* the buckets the backward completes last: the embedding's gradients
     * (the first stage's), or one bucket */
    const model_shape *m = &cm->model;
    double tail_bytes = COSTMODEL_GRAD_BUCKET_BYTES;
    double embedding_bytes = ((double)m->vocab / config->tp + m->seq) *
                             m->hidden * 4.0;
    if (stage == 0 && embedding_bytes > tail_bytes)
        tail_bytes = embedding_bytes;
    out->tail_fraction = gradient_bytes > tail_bytes
                             ? tail_bytes / gradient_bytes
                             : 1.0;
    /* ZeRO-2/3 reduce unit by unit during every backward (zero.c) */
    costmodel_zero_step_work(cm, config, placement, stage, slow, out);
}

void costmodel_step_work_sums(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *placement, int stage,
                              int most_layers, const type_costs *slow,
                              double *work_s)
{
    parameter_counts counts = parameter_counts_of(&cm->model, config->tp);
    for (int layers = 0; layers <= most_layers; layers++) {
        step_work work;
        double params, gradient_bytes;
        reduce_and_step(cm, config, placement, stage, layers, slow, &counts,
                        &work, &params, &gradient_bytes);
        /* ZeRO-2/3 replace the reduction and the gather (zero.c) */
        costmodel_zero_step_work(cm, config, placement, stage, slow, &work);
        work_s[layers] = work.reduce_s + work.gather_s + work.optimizer_s;
    }
}
