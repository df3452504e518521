/*
 * costmodel_estimate: prices every stage of a plan, simulates the
 * pipeline, then adds the per-step work each stage does after its last
 * backward (gradient all-reduce over dp, tied-embedding all-reduce,
 * optimizer step) and turns the result into the figures users compare.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

static const char *const event_names[EVENT_KIND_COUNT] = {
    [EVENT_FWD] = "fwd",
    [EVENT_BWD] = "bwd",
    [EVENT_SEND_FWD] = "send_fwd",
    [EVENT_RECV_FWD] = "recv_fwd",
    [EVENT_SEND_BWD] = "send_bwd",
    [EVENT_RECV_BWD] = "recv_bwd",
    [EVENT_TP_ALLREDUCE] = "tp_allreduce",
    [EVENT_DP_ALLREDUCE] = "dp_allreduce",
    [EVENT_EMBEDDING_ALLREDUCE] = "embedding_allreduce",
    [EVENT_OPTIMIZER] = "optimizer",
};

const char *event_kind_name(event_kind kind)
{
    if ((int)kind < 0 || kind >= EVENT_KIND_COUNT)
        return "unknown";
    return event_names[kind];
}

int event_kind_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int k = 0; k < EVENT_KIND_COUNT; k++)
        if (strcmp(event_names[k], name) == 0)
            return k;
    return -1;
}

double model_flops_per_iteration(const model_shape *model, int gbs,
                                 bool recompute)
{
    model_shape shape = *model;
    if (shape.ffn_hidden <= 0)
        shape.ffn_hidden = 4 * shape.hidden;
    double layers_forward = model->layers *
                            model_layer_forward_flops(&shape, gbs);
    double head_forward = 2.0 * gbs * model->seq * (double)model->hidden *
                          model->vocab;
    /* forward + backward (2x forward) = 3 passes; recompute adds one more
       forward of the layers, not of the head */
    double layer_passes = recompute ? 4.0 : 3.0;
    return layer_passes * layers_forward + 3.0 * head_forward;
}

void estimate_free(estimate *e)
{
    if (!e)
        return;
    free(e->stages);
    free(e->events);
    free(e->pricing);
    memset(e, 0, sizeof *e);
}

/* A stage's per-step work: durations, then when each phase runs (each
 * starts when the one before it ends; absolute seconds). */
typedef struct step_tail {
    double reduce_s;         /* gradient all-reduce, or reduce-scatter */
    double exposed_s;        /* of reduce_s, after the last backward */
    double gather_s;         /* parameter all-gather (distributed opt.) */
    double norm_s;           /* the gradient-norm pass */
    bool embedding_member;   /* first or last stage of tied embeddings */
    double backward_end;
    double reduce_end;
    double embedding_start, embedding_end;
    double optimizer_start, optimizer_end;
    double gather_end;
} step_tail;

/* Scratch memory of one estimate, one allocation (but the lane's and
 * the stages'). Type costs are priced once per estimate for each class
 * of stages that share a config (one in a symmetric plan): costs[class
 * x types + type]. */
typedef struct estimate_scratch {
    node_lane lane;              /* the node order's nodes */
    int *lane_storage;
    int types;                   /* the cluster's node types */
    parallel_config *configs;    /* [pp]: each stage's own */
    long long *firsts;           /* [pp + 1]: each stage's first GPU */
    int *classes;                /* [pp]: the class of each stage */
    int class_count;
    void *stage_block;
    stage_placement *placement;  /* [pp] */
    schedule_stage *schedule;    /* [pp] */
    step_tail *tails;            /* [pp] */
    type_costs *costs;           /* [classes x types] */
    bool *priced;                /* [classes x types] */
    double *compute_scale;       /* [pp]: price_stages' tp-span scale */
    void *block;
} estimate_scratch;

static int scratch_allocate(estimate_scratch *s, int pp, int types,
                            pt_error *err)
{
    size_t sizes[6] = {
        (size_t)pp * sizeof(stage_placement),
        (size_t)pp * sizeof(schedule_stage), (size_t)pp * sizeof(step_tail),
        (size_t)types * sizeof(type_costs), (size_t)types * sizeof(bool),
        (size_t)pp * sizeof(double)};
    size_t align = sizeof(double) > sizeof(void *) ? sizeof(double)
                                                   : sizeof(void *);
    size_t offsets[6], total = 0;
    for (int i = 0; i < 6; i++) {
        offsets[i] = total;
        total += (sizes[i] + align - 1) / align * align;
    }
    char *block = calloc(1, total);
    if (!block)
        return pt_fail(err, "costmodel: out of memory");
    s->block = block;
    s->placement = (stage_placement *)(block + offsets[0]);
    s->schedule = (schedule_stage *)(block + offsets[1]);
    s->tails = (step_tail *)(block + offsets[2]);
    s->costs = (type_costs *)(block + offsets[3]);
    s->priced = (bool *)(block + offsets[4]);
    s->compute_scale = (double *)(block + offsets[5]);
    return 0;
}

/* Each stage's config, first GPU and class (stages_block); the class of
 * a stage is that of the first stage with the same tp and dp. */
static int stages_allocate(const costmodel *cm, const parallel_config *config,
                           const stage_degrees *stages,
                           estimate_scratch *s, pt_error *err)
{
    int pp = config->pp;
    size_t configs = costmodel_stage_configs_bytes(pp);
    size_t firsts = (size_t)(pp + 1) * sizeof(long long);
    char *block = calloc(1, configs + firsts + (size_t)pp * sizeof(int));
    if (!block)
        return pt_fail(err, "costmodel: out of memory");
    s->stage_block = block;
    s->configs = (parallel_config *)block;
    s->firsts = (long long *)(block + configs);
    s->classes = (int *)(block + configs + firsts);
    if (costmodel_stage_configs(cm, config, stages, s->configs, s->firsts,
                                err) != 0)
        return -1;
    s->class_count = 0;
    for (int i = 0; i < pp; i++) {
        int match = 0;
        while (match < i && (s->configs[match].tp != s->configs[i].tp ||
                             s->configs[match].dp != s->configs[i].dp))
            match++;
        s->classes[i] = match < i ? s->classes[match] : s->class_count++;
    }
    return 0;
}

/* The costs of type `type` under stage s's config (priced by
 * priced_type). */
static const type_costs *stage_costs(const estimate_scratch *scratch, int s,
                                     int type)
{
    return &scratch->costs[scratch->classes[s] * scratch->types + type];
}

static int check_partition(const costmodel *cm, const parallel_config *config,
                           const int *partition, pt_error *err)
{
    if (!partition)
        return pt_fail(err, "plan: no partition given");
    long long total = 0;
    for (int s = 0; s < config->pp; s++) {
        if (partition[s] < 0)
            return pt_fail(err, "plan: partition[%d]: layer count %d is "
                           "negative", s, partition[s]);
        total += partition[s];
    }
    if (total != cm->model.layers)
        return pt_fail(err, "plan: partition holds %lld layers, model %s has "
                       "%d", total, cm->model.name, cm->model.layers);
    return 0;
}

/* Prices a type once per estimate and class of stages (with notes),
 * under stage s's config. */
static const type_costs *priced_type(costmodel *cm,
                                     estimate_scratch *scratch, int s,
                                     int type, pt_error *err)
{
    int slot = scratch->classes[s] * scratch->types + type;
    if (!scratch->priced[slot]) {
        if (costmodel_type_costs(cm, type, &scratch->configs[s],
                                 &scratch->costs[slot], err) != 0)
            return NULL;
        scratch->priced[slot] = true;
    }
    return &scratch->costs[slot];
}

/* `costs` with ZeRO-2/3's per-unit comm added (as they are without). */
static type_costs zero_unit_costs(const costmodel *cm,
                                  const parallel_config *config,
                                  const stage_placement *place,
                                  const type_costs *costs)
{
    type_costs zero_costs = *costs;
    costmodel_zero_unit_costs(cm, config, place, &zero_costs);
    return zero_costs;
}

/* One micro-batch's forward and backward of stage s of `layers` layers
 * at the pace of `costs` with ZeRO's units (zero_unit_costs'), and
 * ZeRO-3's time per pass beyond its units; `scale` spreads a tp group's
 * slower all-reduces across nodes over the layer's two halves. */
static void stage_compute_s(const costmodel *cm,
                            const parallel_config *config,
                            const stage_placement *place, int s, int layers,
                            const type_costs *costs, double scale,
                            double *forward_s, double *backward_s)
{
    type_costs zero = zero_unit_costs(cm, config, place, costs);
    const type_costs *zero_costs = &zero;
    double pass_forward, pass_backward;
    costmodel_zero_pass_extra_s(cm, config, place, s, costs, &pass_forward,
                                &pass_backward);
    bool first = s == 0;
    int boundary_forward, boundary_backward;
    costmodel_boundary_count(s, config->pp, &boundary_forward,
                             &boundary_backward);
    /* the head's phases as the executor runs them (head.c) */
    double head_forward, head_backward;
    costmodel_head_phases(&cm->model, config, s, zero_costs, &head_forward,
                          &head_backward);
    *forward_s = layers * zero_costs->layer_forward_s * scale +
                 (first ? zero_costs->embedding_forward_s : 0.0) +
                 head_forward + boundary_forward * zero_costs->boundary_s;
    *backward_s = layers * zero_costs->layer_backward_s * scale +
                  (first ? zero_costs->embedding_backward_s : 0.0) +
                  head_backward +
                  boundary_backward * zero_costs->boundary_s + pass_backward;
    *forward_s += pass_forward;
}

/* Time and memory of every stage, and the simulator's inputs. */
static int price_stages(costmodel *cm, const int *partition,
                        estimate_scratch *scratch, estimate *out,
                        pt_error *err)
{
    int pp = scratch->configs[0].pp;
    for (int s = 0; s < pp; s++) {
        const parallel_config *config = &scratch->configs[s];
        const stage_placement *place = &scratch->placement[s];
        const type_costs *slow = priced_type(cm, scratch, s,
                                             place->slow_type, err);
        const type_costs *small = priced_type(cm, scratch, s,
                                              place->small_type, err);
        if (!slow || !small)
            return -1;
        stage_terms terms;
        const stage_placement *previous = s > 0 ? place - 1 : NULL;
        costmodel_terms_from_costs(cm, config, previous, place, s, slow,
                                   small, &terms);
        int layers = partition[s];
        stage_estimate *st = &out->stages[s];
        st->layers = layers;
        st->tp = config->tp;
        st->dp = config->dp;
        st->first_rank = (int)scratch->firsts[s];
        st->ranks = config->tp * config->dp;
        pt_copy_string(st->gpu, sizeof st->gpu,
                       cm->cluster->types[place->slow_type].gpu);
        st->host_adamw_s_per_param = slow->host_adamw_s_per_param;
        st->host_copy_s_per_param = slow->host_copy_s_per_param;
        /* a tp group across nodes slows its layers' all-reduces; spread
           the difference over forward and backward as the layer is */
        type_costs zero_costs = zero_unit_costs(cm, config, place, slow);
        double pace = zero_costs.layer_forward_s + zero_costs.layer_backward_s;
        scratch->compute_scale[s] = pace > 0.0 ? terms.per_layer_s / pace
                                               : 1.0;
        stage_compute_s(cm, config, place, s, layers, slow,
                        scratch->compute_scale[s], &st->forward_s,
                        &st->backward_s);
        stage_neighbours around = {
            s > 0 ? config - 1 : config, config,
            s < pp - 1 ? config + 1 : config, previous, place,
            s < pp - 1 ? place + 1 : NULL};
        costmodel_boundary_sends(cm, &around, s, &st->send_s,
                                 &st->send_bwd_s);
        st->peak_memory_bytes = terms.fixed_bytes +
                                layers * terms.per_layer_bytes;
        stage_memory memory;
        costmodel_stage_memory(
            &cm->model, config, s,
            costmodel_context_bytes(cm, config, place->small_type), &memory);
        stage_memory_at(&memory, layers, &st->memory);
        st->memory_cap_bytes = terms.cap_bytes;
        scratch->schedule[s] = (schedule_stage){st->forward_s, st->backward_s,
                                                st->send_s, st->send_bwd_s};
    }
    return 0;
}

/* The pipeline's simulation: the plain schedule, or the interleaved one
 * over the plan's chunks (interleave.c). */
static int simulate_pipeline(const costmodel *cm,
                             const parallel_config *config, int microbatches,
                             bool want_events, estimate_scratch *scratch,
                             const estimate *out, schedule_result *pipeline,
                             pt_error *err)
{
    if (parallel_virtual_stages(config) == 1)
        return schedule_simulate(config->schedule, scratch->schedule,
                                 config->pp, microbatches, want_events,
                                 pipeline, err);
    return costmodel_interleave_pipeline(cm, config, &scratch->lane,
                                         scratch->placement, scratch->costs,
                                         out->stages, microbatches,
                                         want_events, pipeline, err);
}

/* Durations of each stage's per-step collectives and optimizer step. */
static void price_step_work(const costmodel *cm, estimate_scratch *scratch,
                            estimate *out)
{
    const parallel_config *configs = scratch->configs;
    int pp = configs[0].pp;
    link_spec embedding_link;
    int embedding_curve;
    costmodel_embedding_link_at(cm, &configs[0], &configs[pp - 1],
                                scratch->firsts[pp - 1], &scratch->lane,
                                &embedding_link, &embedding_curve);
    /* each of the pair's ranks sums its rows of the word embedding: the
       larger shard, of the smaller tp, paces it */
    parallel_config pair = configs[0];
    if (configs[pp - 1].tp < pair.tp)
        pair.tp = configs[pp - 1].tp;
    double embedding_s = costmodel_embedding_allreduce_s(
        cm, &pair, embedding_link, embedding_curve);
    for (int s = 0; s < pp; s++) {
        const parallel_config *config = &configs[s];
        stage_estimate *st = &out->stages[s];
        step_tail *tail = &scratch->tails[s];
        const stage_placement *place = &scratch->placement[s];
        step_work work;
        costmodel_step_work(cm, config, place, s, st->layers,
                            stage_costs(scratch, s, place->slow_type),
                            &work);
        tail->reduce_s = work.reduce_s;
        tail->gather_s = work.gather_s;
        tail->norm_s = work.norm_s;
        st->dp_allreduce_s = work.reduce_s + work.gather_s;
        tail->embedding_member = cm->model.tied_embeddings && pp > 1 &&
                                 (s == 0 || s == pp - 1);
        /* the executor's buckets run during the last micro-batch's
         * backward, but under ZeRO-1 on the tied embedding's pair, whose
         * copies are summed after it first (docs/cost-model.md, 7.1) */
        double exposed = work.reduce_s;
        if (!parallel_overlaps_grad_reduce(config) ||
            (config->distributed_optimizer && tail->embedding_member)) {
            /* after the backward, whole: the runtime does not overlap
             * (Megatron-LM without --overlap-grad-reduce), or ZeRO-1's
             * tied pair */
        } else if (cm->dp_overlap.enabled) {
            exposed = work.exposed_s; /* --dp-overlap: bucket by bucket */
        } else {
            exposed = work.reduce_s * work.tail_fraction;
            if (work.reduce_s - st->backward_s > exposed)
                exposed = work.reduce_s - st->backward_s;
        }
        /* on slices of one GPU the kernels of the sums that overlap the
         * backward take its SMs; the exposed share's run within their
         * paced transfers, which outlast them; on whole GPUs of one node
         * NCCL's hold them for the sums' whole time (sum_kernels_s =
         * reduce_s), unless --dp-overlap states what hides */
        bool stated = cm->dp_overlap.enabled &&
                      place->dp_collectives_contend;
        if (work.reduce_s > 0.0 && exposed < work.reduce_s && !stated)
            exposed += work.sum_kernels_s * (1.0 - exposed / work.reduce_s);
        tail->exposed_s = exposed;
        st->embedding_allreduce_s = tail->embedding_member ? embedding_s
                                                           : 0.0;
        st->optimizer_s = work.optimizer_s;
    }
}

/* Schedules the per-step work after each stage's last backward; the
 * embedding all-reduce waits for both of its members. Returns the end of
 * the step. */
static double schedule_step_work(const parallel_config *config,
                                 const schedule_result *pipeline,
                                 estimate_scratch *scratch,
                                 const estimate *out)
{
    int pp = config->pp;
    for (int s = 0; s < pp; s++) {
        step_tail *tail = &scratch->tails[s];
        tail->backward_end = pipeline->stage_end_s[s];
        tail->reduce_end = tail->backward_end + tail->exposed_s;
    }
    double embedding_ready = scratch->tails[0].reduce_end;
    if (scratch->tails[pp - 1].reduce_end > embedding_ready)
        embedding_ready = scratch->tails[pp - 1].reduce_end;
    /* every rank sums its gradients' squares, then waits for the world's
     * norm (one host all-reduce) before its optimizer step */
    double norm_end = 0.0;
    for (int s = 0; s < pp; s++) {
        const stage_estimate *st = &out->stages[s];
        step_tail *tail = &scratch->tails[s];
        tail->embedding_start = tail->embedding_member ? embedding_ready
                                                       : tail->reduce_end;
        tail->embedding_end = tail->embedding_start + st->embedding_allreduce_s;
        if (tail->embedding_end + tail->norm_s > norm_end)
            norm_end = tail->embedding_end + tail->norm_s;
    }
    double step_end = pipeline->pipeline_end_s;
    for (int s = 0; s < pp; s++) {
        const stage_estimate *st = &out->stages[s];
        step_tail *tail = &scratch->tails[s];
        tail->optimizer_start = norm_end;
        tail->optimizer_end = norm_end + st->optimizer_s;
        /* --overlap-param-gather: the gather runs under the next step's
           first forward; only what outlasts that forward is the step's */
        double gather_s = tail->gather_s;
        if (config->overlap_param_gather)
            gather_s = gather_s > st->forward_s ? gather_s - st->forward_s
                                                : 0.0;
        tail->gather_end = tail->optimizer_end + gather_s;
        if (tail->gather_end > step_end)
            step_end = tail->gather_end;
    }
    return step_end;
}

/* Orders a stage's events by start, then end, kind and micro-batch. */
static int compare_events(const void *a, const void *b)
{
    const timeline_event *x = a, *y = b;
    if (x->stage != y->stage)
        return x->stage < y->stage ? -1 : 1;
    if (x->start_s != y->start_s)
        return x->start_s < y->start_s ? -1 : 1;
    if (x->end_s != y->end_s)
        return x->end_s < y->end_s ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    return (x->microbatch > y->microbatch) - (x->microbatch < y->microbatch);
}

/* The per-step events of a stage (microbatch -1) into events; returns
 * how many (at most 4). */
static int step_events(const parallel_config *config, const step_tail *tail,
                       int stage, timeline_event *events)
{
    int count = 0;
    bool dp_comm = config->dp > 1;
    timeline_event proto = {.rank = -1, .stage = stage, .microbatch = -1};
    if (dp_comm) {
        events[count] = proto;
        events[count].kind = EVENT_DP_ALLREDUCE;
        events[count].start_s = tail->reduce_end - tail->reduce_s;
        events[count++].end_s = tail->reduce_end;
    }
    if (tail->embedding_member) {
        events[count] = proto;
        events[count].kind = EVENT_EMBEDDING_ALLREDUCE;
        events[count].start_s = tail->embedding_start;
        events[count++].end_s = tail->embedding_end;
    }
    events[count] = proto;
    events[count].kind = EVENT_OPTIMIZER;
    events[count].start_s = tail->optimizer_start;
    events[count++].end_s = tail->optimizer_end;
    if (dp_comm && config->distributed_optimizer) {
        events[count] = proto;
        events[count].kind = EVENT_DP_ALLREDUCE;
        events[count].start_s = tail->optimizer_end;
        events[count++].end_s = tail->gather_end;
    }
    return count;
}

/* The timeline, one copy per stage: each stage's pipeline events (sorted
 * by start) and then its per-step events, stages in order. Every rank of
 * a stage runs the same events, so they carry rank -1 rather than being
 * copied tp x dp times (a 1,024-GPU plan would hold a million). */
static int build_events(schedule_result *pipeline,
                        const estimate_scratch *scratch, estimate *out,
                        pt_error *err)
{
    const parallel_config *configs = scratch->configs;
    int pp = configs[0].pp;
    qsort(pipeline->events, (size_t)pipeline->event_count,
          sizeof *pipeline->events, compare_events);
    timeline_event tail_events[4];
    size_t total = (size_t)pipeline->event_count;
    for (int s = 0; s < pp; s++)
        total += (size_t)step_events(&configs[s], &scratch->tails[s], s,
                                     tail_events);
    if (total > (size_t)INT_MAX)
        return pt_fail(err, "costmodel: %zu events are too many to list",
                       total);
    out->events = malloc((total > 0 ? total : 1) * sizeof *out->events);
    if (!out->events)
        return pt_fail(err, "costmodel: out of memory for %zu events", total);
    size_t n = 0, next = 0;
    for (int s = 0; s < pp; s++) {
        while (next < (size_t)pipeline->event_count &&
               pipeline->events[next].stage == s) {
            out->events[n] = pipeline->events[next++];
            out->events[n++].rank = -1;
        }
        int tail_count = step_events(&configs[s], &scratch->tails[s], s,
                                     tail_events);
        for (int i = 0; i < tail_count; i++)
            out->events[n++] = tail_events[i];
    }
    out->event_count = (int)n;
    return 0;
}

/* Throughput, efficiency, price and memory verdict of a priced plan. */
static void summarise(const costmodel *cm, const parallel_config *config,
                      const long long *firsts, const int *node_order,
                      int node_count, const schedule_result *pipeline,
                      estimate *out)
{
    double step = out->step_time_s;
    double gpus = (double)firsts[config->pp];
    out->tokens_per_s = step > 0.0 ? (double)config->gbs * cm->model.seq / step
                                   : 0.0;
    out->tflops_per_gpu =
        step > 0.0 ? model_flops_per_iteration(&cm->model, config->gbs,
                                               config->recompute) /
                         step / gpus / 1e12
                   : 0.0;
    double busiest = 0.0;
    for (int s = 0; s < config->pp; s++)
        if (pipeline->stage_busy_s[s] > busiest)
            busiest = pipeline->stage_busy_s[s];
    out->bubble_fraction = pipeline->pipeline_end_s > 0.0
                               ? 1.0 - busiest / pipeline->pipeline_end_s
                               : 0.0;
    double price_per_hour = 0.0;
    for (int i = 0; i < node_count; i++)
        price_per_hour += cm->cluster->types[cluster_node_type(
                                                 cm->cluster, node_order[i])]
                              .price_per_hour;
    out->cost_per_step_usd = step / 3600.0 * price_per_hour;

    out->fits = true;
    out->worst_stage = 0;
    double worst_ratio = -1.0;
    for (int s = 0; s < config->pp; s++) {
        const stage_estimate *st = &out->stages[s];
        double ratio = st->memory_cap_bytes > 0.0
                           ? st->peak_memory_bytes / st->memory_cap_bytes
                           : HUGE_VAL;
        if (st->peak_memory_bytes > st->memory_cap_bytes)
            out->fits = false;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            out->worst_stage = s;
        }
    }
}

/* Stages on slices of one GPU whose type names a profile at rest are
 * priced between that profile and their own (beside busy neighbours) by
 * the neighbours' busy share of the step (docs/cost-model.md, section
 * 12), which depends on the step: priced, simulated and priced again
 * until the step moves less than 0.01 % (at most REST_ROUNDS times; in
 * the suite two or three). Not for the interleaved schedule. */
#define REST_ROUNDS 8

typedef struct rest_work {
    double *busy_forward, *busy_backward, *rest_forward, *rest_backward;
    double *duty, *share;
    bool *at_rest;
} rest_work;

static int rest_prepare(costmodel *cm, const estimate_scratch *scratch,
                        const estimate *out, rest_work *w, double *block,
                        pt_error *err)
{
    int pp = scratch->configs[0].pp;
    double *column[6];
    for (int i = 0; i < 6; i++)
        column[i] = block + (size_t)i * (size_t)pp;
    *w = (rest_work){column[0], column[1], column[2], column[3], column[4],
                     column[5], (bool *)(block + 6 * (size_t)pp)};
    for (int s = 0; s < pp; s++) {
        const stage_placement *place = &scratch->placement[s];
        w->busy_forward[s] = w->rest_forward[s] = out->stages[s].forward_s;
        w->busy_backward[s] = w->rest_backward[s] = out->stages[s].backward_s;
        w->at_rest[s] = cm->rest_loaded[place->slow_type];
        if (!w->at_rest[s])
            continue;
        const parallel_config *config = &scratch->configs[s];
        type_costs rest;
        if (costmodel_type_costs_at_rest(cm, place->slow_type, config, &rest,
                                         err) != 0)
            return -1;
        stage_compute_s(cm, config, place, s, out->stages[s].layers, &rest,
                        scratch->compute_scale[s], &w->rest_forward[s],
                        &w->rest_backward[s]);
    }
    return 0;
}

/* Prices every stage at rest by its share; -1 share: as it was. */
static void rest_price(const rest_work *w, int pp, estimate_scratch *scratch,
                       estimate *out)
{
    for (int s = 0; s < pp; s++) {
        if (!w->at_rest[s] || w->share[s] < 0.0)
            continue;
        stage_estimate *st = &out->stages[s];
        double share = w->share[s];
        st->forward_s = w->rest_forward[s] +
                        share * (w->busy_forward[s] - w->rest_forward[s]);
        st->backward_s = w->rest_backward[s] +
                         share * (w->busy_backward[s] - w->rest_backward[s]);
        scratch->schedule[s].forward_s = st->forward_s;
        scratch->schedule[s].backward_s = st->backward_s;
    }
}

static int price_at_rest(costmodel *cm, const parallel_config *config,
                         int microbatches, bool want_events,
                         estimate_scratch *scratch, estimate *out,
                         schedule_result *pipeline, pt_error *err)
{
    int pp = config->pp;
    bool any = false;
    for (int s = 0; s < pp && cm->rest_loaded; s++)
        any = any || cm->rest_loaded[scratch->placement[s].slow_type];
    if (!any || parallel_virtual_stages(config) > 1)
        return 0;
    /* six columns of doubles, then the flags */
    double *block = calloc((size_t)pp * 7, sizeof *block);
    if (!block)
        return pt_fail(err, "costmodel: out of memory");
    rest_work w;
    int rc = rest_prepare(cm, scratch, out, &w, block, err);
    for (int round = 0; rc == 0 && round < REST_ROUNDS; round++) {
        double step = out->step_time_s;
        for (int s = 0; s < pp; s++) {
            double busy = microbatches * (out->stages[s].forward_s +
                                          out->stages[s].backward_s);
            w.duty[s] = step > 0.0 && busy < step ? busy / step : 1.0;
        }
        costmodel_neighbour_shares(cm, config, scratch->firsts,
                                   &scratch->lane, w.duty, w.share);
        rest_price(&w, pp, scratch, out);
        schedule_result_free(pipeline);
        rc = simulate_pipeline(cm, config, microbatches, want_events,
                               scratch, out, pipeline, err);
        if (rc != 0)
            break;
        price_step_work(cm, scratch, out);
        out->step_time_s = schedule_step_work(config, pipeline, scratch, out);
        if (fabs(out->step_time_s - step) <= 1e-4 * step)
            break;
    }
    free(block);
    return rc;
}

/* The pricing entries of every type that paces a stage, in type order. */
static int list_pricing(const costmodel *cm, const estimate_scratch *scratch,
                        estimate *out, pt_error *err)
{
    int types = cm->cluster->type_count;
    int pp = scratch->configs[0].pp;
    out->pricing = calloc((size_t)types * 3 * (size_t)scratch->class_count,
                          sizeof *out->pricing);
    if (!out->pricing)
        return pt_fail(err, "costmodel: out of memory");
    /* each class of stages (one config) in order of its first stage */
    for (int first = 0; first < pp; first++) {
        bool new_class = true;
        for (int s = 0; s < first && new_class; s++)
            new_class = scratch->classes[s] != scratch->classes[first];
        if (!new_class)
            continue;
        for (int t = 0; t < types; t++) {
            bool paces = false;
            for (int s = first; s < pp && !paces; s++)
                paces = scratch->classes[s] == scratch->classes[first] &&
                        scratch->placement[s].slow_type == t;
            if (!paces)
                continue;
            if (costmodel_pricing(cm, t, &scratch->configs[first],
                                  &out->pricing[out->pricing_count],
                                  err) != 0)
                return -1;
            out->pricing_count += 3;
        }
    }
    return 0;
}

int costmodel_estimate(costmodel *cm, const parallel_config *config,
                       const int *node_order, int node_count,
                       const int *partition, bool want_events,
                       estimate *out, pt_error *err)
{
    return costmodel_estimate_stages(cm, config, NULL, node_order,
                                     node_count, partition, want_events, out,
                                     err);
}

/* The checks before an estimate: the plan's degrees and each stage's
 * (scratch's stage configs), the micro-batches, the partition and the
 * schedule's levers. Returns the micro-batches, or -1. */
static int check_plan(const costmodel *cm, const parallel_config *config,
                      const stage_degrees *stages, const int *partition,
                      estimate_scratch *scratch, pt_error *err)
{
    if (costmodel_check_degrees(config, err) != 0 ||
        stages_allocate(cm, config, stages, scratch, err) != 0)
        return -1;
    int microbatches = costmodel_microbatch_count(config, err);
    bool symmetric = stage_degrees_first_own(config, stages) < 0;
    if (microbatches < 0 || check_partition(cm, config, partition, err) != 0 ||
        (symmetric &&
         costmodel_check_schedule_levers(cm, config, partition, err) != 0))
        return -1;
    return microbatches;
}

/* Places the stages: a symmetric plan as it always was, stages of their
 * own degrees each on its own GPUs. */
static int place_stages(const costmodel *cm, const parallel_config *config,
                        const stage_degrees *stages, const int *node_order,
                        int node_count, estimate_scratch *scratch,
                        pt_error *err)
{
    if (stage_degrees_first_own(config, stages) < 0)
        return costmodel_place_order(cm, config, node_order, node_count,
                                     scratch->placement, &scratch->lane,
                                     &scratch->lane_storage, err);
    stage_layout layout = {config->pp, scratch->configs, scratch->firsts};
    return costmodel_place_order_stages(cm, &layout, node_order, node_count,
                                        scratch->placement, &scratch->lane,
                                        &scratch->lane_storage, err);
}

int costmodel_estimate_stages(costmodel *cm, const parallel_config *config,
                              const stage_degrees *stages,
                              const int *node_order, int node_count,
                              const int *partition, bool want_events,
                              estimate *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    estimate_scratch scratch = {0};
    schedule_result pipeline = {0};
    int rc = -1;
    int microbatches = check_plan(cm, config, stages, partition, &scratch,
                                  err);
    if (microbatches < 0)
        goto done;
    out->parameters = model_parameter_count(&cm->model);
    scratch.types = cm->cluster->type_count;
    if (scratch_allocate(&scratch, config->pp,
                         scratch.types * scratch.class_count, err) != 0)
        goto done;
    out->stage_count = config->pp;
    out->stages = calloc((size_t)config->pp, sizeof *out->stages);
    if (!out->stages) {
        pt_fail(err, "costmodel: out of memory");
        goto done;
    }
    if (place_stages(cm, config, stages, node_order, node_count, &scratch,
                     err) != 0 ||
        price_stages(cm, partition, &scratch, out, err) != 0 ||
        simulate_pipeline(cm, config, microbatches, want_events, &scratch,
                          out, &pipeline, err) != 0)
        goto done;
    price_step_work(cm, &scratch, out);
    out->step_time_s = schedule_step_work(config, &pipeline, &scratch, out);
    if (price_at_rest(cm, config, microbatches, want_events, &scratch, out,
                      &pipeline, err) != 0)
        goto done;
    summarise(cm, config, scratch.firsts, node_order, node_count, &pipeline,
              out);
    if (want_events && (build_events(&pipeline, &scratch, out, err) != 0 ||
                        list_pricing(cm, &scratch, out, err) != 0))
        goto done;
    rc = 0;
done:
    schedule_result_free(&pipeline);
    free(scratch.lane_storage);
    free(scratch.block);
    free(scratch.stage_block);
    if (rc != 0)
        estimate_free(out);
    return rc;
}
