/*
 * Floors under the score of a placement in the making (docs/planner.md,
 * "Why the search is exact"): the per-task tables they read (each type's
 * fastest pace, least send, head and memory by position), and the floor
 * the tree asks for, which adds to the relaxed partition
 * (search_relaxed.c) the sends, embedding and per-step work it leaves
 * out, and, where that does not cut, the walk over the per-step work
 * (search_tail.c). Every relaxation only makes stages faster, cheaper to
 * reach or roomier, so no completion scores below the floor, and the
 * search may cut every subtree whose floor is above the scores it keeps.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


int bound_tables_open(bound_tables **out, int max_pp, int type_count,
                      pt_error *err)
{
    bound_tables *t = calloc(1, sizeof *t);
    if (t == NULL)
        return pt_fail(err, "search: out of memory for the floors");
    size_t types = (size_t)type_count, pp = (size_t)max_pp;
    t->pace_order = malloc(types * sizeof(int));
    t->pace = malloc(types * sizeof(double));
    t->send = malloc(types * sizeof(double));
    t->head = malloc(types * sizeof(double));
    t->embedding = malloc(types * sizeof(double));
    t->optimizer_per_param = malloc(types * sizeof(double));
    t->stream_per_byte = malloc(types * sizeof(double));
    t->pure = malloc(types * pp * sizeof *t->pure);
    t->ranks = malloc(pp * sizeof *t->ranks);
    t->costs = malloc(types * sizeof *t->costs);
    t->tail_memo = calloc(1, sizeof *t->tail_memo);
    t->tail_rows = malloc(pp * sizeof *t->tail_rows);
    t->tail_top = malloc(pp * sizeof(int));
    t->tail_caps = malloc(pp * sizeof(int));
    t->relaxed_layers = malloc(pp * sizeof(int));
    t->rank_caps = malloc(2 * pp * sizeof(int));

    t->cap_by_position = malloc(pp * sizeof(int));
    t->stages = malloc(pp * sizeof *t->stages);
    t->layers_out = malloc(pp * sizeof(int));
    *out = t;
    if (!t->pace_order || !t->pace || !t->send || !t->head || !t->embedding ||
        !t->optimizer_per_param || !t->stream_per_byte || !t->pure ||
        !t->ranks || !t->costs ||
        !t->tail_memo || !t->tail_rows || !t->tail_top || !t->tail_caps ||
        !t->relaxed_layers || !t->rank_caps ||
        !t->cap_by_position || !t->stages || !t->layers_out) {
        bound_tables_close(t);
        *out = NULL;
        return pt_fail(err, "search: out of memory for the floors");
    }
    return 0;
}

void bound_tables_close(bound_tables *t)
{
    if (t == NULL)
        return;
    free(t->pace_order);
    free(t->pace);
    free(t->send);
    free(t->head);
    free(t->embedding);
    free(t->optimizer_per_param);
    free(t->stream_per_byte);
    free(t->pure);
    free(t->ranks);
    free(t->costs);
    if (t->tail_memo != NULL)
        memo_free(t->tail_memo);
    free(t->tail_memo);
    free(t->tail_rows);
    free(t->tail_values);
    free(t->tail_top);
    free(t->tail_caps);
    free(t->relaxed_layers);
    free(t->rank_caps);
    free(t->pure_tail);
    free(t->capacity.held);
    free(t->capacity.sums);
    free(t->cap_by_position);
    free(t->stages);
    free(t->layers_out);
    free(t);
}

/* Seconds a send of `bytes` over a link of that bandwidth at least takes
 * (latency left out: the slowest link of a set is chosen by bandwidth, so
 * its latency need not be the largest). */
static double bandwidth_floor(double bytes, link_spec link)
{
    return link.bandwidth_bytes_per_s > 0.0
               ? bytes / link.bandwidth_bytes_per_s
               : INFINITY;
}

/* The least a stage holding a node of type t can take to send to a
 * neighbour: every GPU of the stage sends, so a GPU of that node does,
 * either inside its node (only when a node can hold GPUs of two stages)
 * or to another node over a link no faster than t's inter-node link. */
static double send_floor(costmodel *cm, const parallel_config *config,
                         int type, long long stage_gpus)
{
    const node_type *node = &cm->cluster->types[type];
    double bytes = costmodel_pipeline_message_bytes(&cm->model, config);
    double least = bandwidth_floor(bytes, node->inter_node);
    if (node->gpus > stage_gpus) {
        double inside = bandwidth_floor(bytes, node->intra_node);
        double measured = costmodel_send_seconds(cm, bytes, type,
                                                 node->intra_node);
        least = fmin(least, fmin(inside, measured));
    }
    return least;
}

/* Whether a tp group may span nodes under config: some node type's GPU
 * count is not a multiple of tp. */
static bool groups_may_span(const cluster *c, const parallel_config *config)
{
    for (int t = 0; t < c->type_count; t++)
        if (c->types[t].count > 0 && c->types[t].gpus % config->tp != 0)
            return true;
    return false;
}

/* The fastest a tp group holding type t can run a layer: in one node, or
 * when groups may span nodes, with its collectives no faster than
 * allreduce_floor_time over the cluster's fastest links (a sequence-
 * parallel reduce-scatter and all-gather move the same bytes). */
static double pace_floor(costmodel *cm, const parallel_config *config,
                         const type_costs *costs, bool may_span)
{
    double pace = costs->layer_forward_s + costs->layer_backward_s;
    if (!may_span)
        return pace;
    const cluster *c = cm->cluster;
    double intra = 0.0, inter = 0.0;
    int most_per_node = 1;
    for (int t = 0; t < c->type_count; t++) {
        intra = fmax(intra, c->types[t].intra_node.bandwidth_bytes_per_s);
        inter = fmax(inter, c->types[t].inter_node.bandwidth_bytes_per_s);
        if (c->types[t].gpus > most_per_node)
            most_per_node = c->types[t].gpus;
    }
    double bytes = activation_message_bytes(&cm->model, config);
    double across = allreduce_floor_time(bytes, config->tp, most_per_node,
                                         intra, inter);
    return fmin(pace, costmodel_layer_pace_across_s(config, costs, across));
}

/* A stage of type t alone at position s, placed so that only its memory
 * terms are meaningful. */
static int pure_terms(costmodel *cm, const parallel_config *config, int type,
                      int stage, stage_terms *out, pt_error *err)
{
    link_spec none = {INFINITY, 0.0};
    stage_placement place = {.slow_type = type, .small_type = type,
                             .tp_link = none, .next_link = none,
                             .dp_link = none, .next_curve_type = -1,
                             .dp_curve_type = -1, .dp_nodes = 1,
                             .dp_intra_link = none};
    return costmodel_stage_terms_between(cm, config,
                                         stage > 0 ? &place : NULL, &place,
                                         stage, out, err);
}

/* Whether a type's measured all-reduce curve for `members` GPUs never
 * gets faster with more bytes (then its time at some bytes bounds its
 * time at more). */
static bool curve_grows(const comm_curve *curve, int members)
{
    double last_bytes = -1.0, last_time = -1.0;
    for (int i = 0; i < curve->sample_count; i++) {
        const comm_sample *sample = &curve->samples[i];
        if (sample->gpus != members)
            continue;
        /* samples are sorted by gpus, then bytes */
        if (sample->bytes > last_bytes && sample->time_s < last_time)
            return false;
        last_bytes = sample->bytes;
        last_time = sample->time_s;
    }
    return true;
}

/* The least an all-reduce of `bytes` over the dp group can take on any
 * placement in this cluster: the fastest links anywhere, no latency, as
 * many members on a node as its GPUs allow (collectives.c). */
static double network_allreduce_floor(const costmodel *cm,
                                      const parallel_config *config,
                                      double bytes)
{
    const cluster *c = cm->cluster;
    double intra = 0.0, inter = 0.0;
    int most_per_node = 1;
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        intra = fmax(intra, c->types[type].intra_node.bandwidth_bytes_per_s);
        inter = fmax(inter, c->types[type].inter_node.bandwidth_bytes_per_s);
        int per_node = c->types[type].gpus / config->tp;
        if (per_node > most_per_node)
            most_per_node = per_node;
    }
    return allreduce_floor_time(bytes, config->dp, most_per_node, intra,
                                inter);
}

/* Seconds of a stage's gradient reduction (and ZeRO-1's gather) for
 * `params` parameters per GPU over a type's curve, or (curve_type -1)
 * over the network's floor; the share of the reduction the estimate may
 * hide behind the backward (costmodel_dp_overlap_floor_share) is left
 * out. */
static double reduction_s(costmodel *cm, const parallel_config *config,
                          double params, int curve_type, link_spec link)
{
    int dp = config->dp;
    double gradients = params * 4.0; /* fp32 main gradients */
    double exposed = costmodel_dp_overlap_floor_share(cm);
    double gathered = params * COSTMODEL_GATHER_BYTES_PER_PARAM;
    /* ZeRO-2/3 reduce unit by unit inside the backward, ZeRO-3 gathers
     * before each unit (costmodel/zero.c): no part of that is bounded by
     * the stage's parameters, so the floor counts none of it */
    int zero = parallel_zero_stage(config);
    if (zero >= 2 && dp > 1) {
        exposed = 0.0;
        if (zero >= 3)
            gathered = 0.0;
    }
    if (curve_type < 0) {
        double reduce = network_allreduce_floor(cm, config, gradients);
        if (!config->distributed_optimizer)
            return exposed * reduce;
        return 0.5 * (exposed * reduce +
                      network_allreduce_floor(cm, config, gathered));
    }
    if (!config->distributed_optimizer)
        return exposed * costmodel_allreduce_seconds(cm, gradients, dp,
                                                     curve_type, link);
    /* a curve prices even 0 bytes at its smallest sample: leave out what
     * the price leaves out */
    return (exposed > 0.0 ? exposed * costmodel_reduce_scatter_seconds(
                                          cm, gradients, dp, curve_type,
                                          link)
                          : 0.0) +
           (gathered > 0.0 ? costmodel_all_gather_seconds(
                                 cm, gathered, dp, curve_type, link)
                           : 0.0);
}

/* The first stage's per-step work: at least its embeddings' reduction and
 * optimizer step, and the tied embedding's all-reduce with the last stage
 * over the fastest link it could have (its bytes are fixed). */
static double first_stage_tail_floor(const bound_tables *t, costmodel *cm,
                                     link_spec fastest, double optimizer)
{
    const cluster *c = cm->cluster;
    const parallel_config *config = &t->config;
    double params = stage_parameters_per_gpu(&cm->model, config, 0, 0);
    double reduce = reduction_s(cm, config, params, -1, fastest);
    link_spec between = {0.0, 0.0};
    double embedding = INFINITY;
    long long distance = t->stage_gpus * (t->pp - 1);
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        const node_type *node = &c->types[type];
        if (node->gpus >= t->stage_gpus &&
            !curve_grows(&cm->profiles[type].allreduce, config->dp))
            reduce = 0.0;
        else if (node->gpus >= t->stage_gpus)
            reduce = fmin(reduce, reduction_s(cm, config, params, type,
                                              fastest));
        between.bandwidth_bytes_per_s = fmax(
            between.bandwidth_bytes_per_s, node->inter_node.bandwidth_bytes_per_s);
        if (node->gpus > distance) { /* both ends may share a node */
            between.bandwidth_bytes_per_s = fmax(
                between.bandwidth_bytes_per_s,
                node->intra_node.bandwidth_bytes_per_s);
            embedding = fmin(embedding, costmodel_embedding_allreduce_s(
                                            cm, config, node->intra_node,
                                            type));
        }
    }
    embedding = fmin(embedding,
                     costmodel_embedding_allreduce_s(cm, config, between, -1));
    double held = config->distributed_optimizer ? params / config->dp
                                                : params;
    return reduce + held * optimizer + embedding;
}

/* The tied-embedding all-reduce of a first (or last) stage holding types
 * a and b: over a link no faster than either's inter-node link, unless
 * both ends of the pipeline may share a node of its type. */
static void fill_embedding_floors(bound_tables *t, costmodel *cm)
{
    const cluster *c = cm->cluster;
    long long distance = t->stage_gpus * (t->pp - 1);
    for (int a = 0; a < c->type_count && a < PLANNER_MAX_TYPES; a++) {
        for (int b = 0; b < c->type_count && b < PLANNER_MAX_TYPES; b++) {
            link_spec link = c->types[a].inter_node;
            if (c->types[b].inter_node.bandwidth_bytes_per_s <
                link.bandwidth_bytes_per_s)
                link = c->types[b].inter_node;
            link.latency_s = 0.0;
            double least = costmodel_embedding_allreduce_s(cm, &t->config,
                                                           link, -1);
            for (int k = 0; k < 2; k++) {
                int type = k == 0 ? a : b;
                if (c->types[type].gpus > distance)
                    least = fmin(least, fmin(costmodel_embedding_allreduce_s(
                                                 cm, &t->config,
                                                 c->types[type].intra_node,
                                                 type),
                                             costmodel_embedding_allreduce_s(
                                                 cm, &t->config,
                                                 c->types[type].intra_node,
                                                 -1)));
            }
            t->embedding_floor_s[a][b] = least;
        }
    }
}

/* The score's per-step work is at least that of the stage holding the
 * most layers, which holds at least ceil(L / pp): its gradient reduction
 * over the fastest dp ring any stage could have and its optimizer step
 * at the fastest rate. 0 when a measured curve that can shrink with more
 * bytes could price that ring. */
static double busiest_stage_tail_floor(const bound_tables *t, costmodel *cm)
{
    const cluster *c = cm->cluster;
    const parallel_config *config = &t->config;
    int layers = (t->layers + t->pp - 1) / t->pp;
    /* (the second term, copied key/value heads, is 0 without GQA) */
    double params = layers * model_layer_parameter_count(&cm->model) /
                        config->tp +
                    layers * (model_layer_parameters_per_rank(&cm->model,
                                                              config->tp) -
                              model_layer_parameter_count(&cm->model) /
                                  config->tp);
    double optimizer = INFINITY;
    link_spec fastest = {0.0, 0.0};
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        optimizer = fmin(optimizer, t->optimizer_per_param[type]);
        const node_type *node = &c->types[type];
        fastest.bandwidth_bytes_per_s = fmax(
            fastest.bandwidth_bytes_per_s, node->inter_node.bandwidth_bytes_per_s);
        if (node->gpus >= t->stage_gpus) /* a stage may sit in one node */
            fastest.bandwidth_bytes_per_s = fmax(
                fastest.bandwidth_bytes_per_s,
                node->intra_node.bandwidth_bytes_per_s);
    }
    double reduce = reduction_s(cm, config, params, -1, fastest);
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0 || c->types[type].gpus < t->stage_gpus)
            continue;
        if (!curve_grows(&cm->profiles[type].allreduce, config->dp))
            return 0.0;
        reduce = fmin(reduce, reduction_s(cm, config, params, type, fastest));
    }
    double held = config->distributed_optimizer ? params / config->dp
                                                : params;
    return fmax(reduce + held * optimizer,
                first_stage_tail_floor(t, cm, fastest, optimizer));
}

int bound_tables_fill(bound_tables *t, costmodel *cm,
                      const parallel_config *config, pt_error *err)
{
    const cluster *c = cm->cluster;
    t->cm = cm;
    t->config = *config;
    t->type_count = c->type_count;
    t->pp = config->pp;
    t->layers = cm->model.layers;
    t->microbatches = parallel_microbatches(config);
    t->stage_gpus = (long long)config->dp * config->tp;
    t->caps_by_pace = true;
    bool may_span = groups_may_span(c, config);
    t->head_by_pace = !may_span;
    int used = 0, first_used = 0;
    while (first_used + 1 < c->type_count && c->types[first_used].count == 0)
        first_used++;
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        type_costs costs;
        if (costmodel_type_costs(cm, type, config, &costs, err) != 0)
            return -1;
        t->pace[type] = pace_floor(cm, config, &costs, may_span);
        t->send[type] = config->pp > 1
                            ? send_floor(cm, config, type, t->stage_gpus)
                            : 0.0;
        t->head[type] = costs.head_forward_s + costs.head_backward_s;
        t->embedding[type] = costs.embedding_forward_s +
                             costs.embedding_backward_s;
        t->optimizer_per_param[type] = costs.optimizer_s_per_param;
        t->stream_per_byte[type] = costs.stream_s_per_byte;
        t->costs[type] = costs;
        if (cm->profiles[type].flash_attention !=
            cm->profiles[first_used].flash_attention)
            t->caps_by_pace = false;
        for (int s = 0; s < config->pp; s++)
            if (pure_terms(cm, config, type, s,
                           &t->pure[(size_t)type * config->pp + s], err) != 0)
                return -1;
        int position = used++;
        while (position > 0 && t->pace[t->pace_order[position - 1]] >
                                   t->pace[type]) {
            t->pace_order[position] = t->pace_order[position - 1];
            position--;
        }
        t->pace_order[position] = type;
    }
    /* types without nodes go last; gpus_left keeps them out anyway */
    for (int type = 0; type < c->type_count; type++)
        if (c->types[type].count == 0)
            t->pace_order[used++] = type;
    t->capacity.states = 0;
    double pace = INFINITY, send = INFINITY, head = INFINITY,
           embedding = INFINITY;
    for (int type = 0; type < c->type_count; type++) {
        if (c->types[type].count == 0)
            continue;
        pace = fmin(pace, t->pace[type]);
        send = fmin(send, t->send[type]);
        head = fmin(head, t->head[type]);
        embedding = fmin(embedding, t->embedding[type]);
    }
    t->sum_floor_s = t->layers * pace + embedding + head +
                     (t->pp > 1 ? 2.0 * (t->pp - 1) * send : 0.0);
    t->tail_floor_s = busiest_stage_tail_floor(t, cm);
    fill_embedding_floors(t, cm);
    return tail_tables_fill(t, err);
}


/* What the relaxed stages leave out and every completion pays: the
 * embedding on stage 0 when it is still to come, and the sends beyond the
 * one each relaxed stage carries. */
/* The sum of the `count` least sends the stages to come can take: each
 * stage's send is at least the slowest send of its GPUs' types, and
 * grouping the GPUs slowest send first, S at a time, the i-th slowest
 * stage sends no faster than the first GPU of the i-th group. */
static double least_sends(const bound_tables *t, const int *gpus_left, int n,
                          int count)
{
    if (count <= 0 || t->pp < 2)
        return 0.0;
    int order[PLANNER_MAX_TYPES], used = 0;
    for (int type = 0; type < t->type_count; type++) {
        if (gpus_left[type] == 0)
            continue;
        int position = used++;
        while (position > 0 && t->send[order[position - 1]] < t->send[type]) {
            order[position] = order[position - 1];
            position--;
        }
        order[position] = type;
    }
    /* the last `count` groups of n, slowest first */
    double sum = 0.0;
    int k = 0;
    long long seen = 0;
    for (int i = 0; i < n; i++) {
        long long first = (long long)i * t->stage_gpus; /* 0-based GPU */
        while (k + 1 < used && seen + gpus_left[order[k]] <= first) {
            seen += gpus_left[order[k]];
            k++;
        }
        if (i >= n - count)
            sum += t->send[order[k]];
    }
    return sum;
}

static double sum_extras(const bound_tables *t, const int *gpus_left,
                         int complete)
{
    int n = t->pp - complete;
    double embedding = INFINITY;
    for (int type = 0; type < t->type_count; type++)
        if (gpus_left[type] > 0)
            embedding = fmin(embedding, t->embedding[type]);
    if (n == 0)
        return 0.0;
    double extras = complete == 0 ? embedding : 0.0;
    /* every stage to come but the pipeline's ends sends both ways; the
       relaxed stages carry one send each */
    return extras + least_sends(t, gpus_left, n,
                                n - 2 + (complete >= 1 ? 1 : 0));
}

/* The per-step work of a placed stage is at least that of its parameters
 * without its layers (the closed forms grow with the bytes; a measured
 * curve need not, so only the optimizer counts then). */
double bound_tail_floor(const bound_tables *t, const stage_facts *facts,
                        int count)
{
    double worst = t->tail_floor_s;
    for (int s = 0; s < count; s++) {
        const stage_placement *place = &facts[s].place;
        type_costs slow = {0};
        slow.optimizer_s_per_param = t->optimizer_per_param[place->slow_type];
        slow.stream_s_per_byte = t->stream_per_byte[place->slow_type];
        step_work work;
        costmodel_step_work(t->cm, &t->config, place, s, 0, &slow, &work);
        double tail = work.optimizer_s;
        if (place->dp_curve_type < 0)
            tail += costmodel_dp_overlap_floor_share(t->cm) * work.reduce_s +
                    work.gather_s;
        if (s == 0 || s == t->pp - 1)
            tail += t->embedding_floor_s[place->slow_type][place->small_type];
        worst = fmax(worst, tail);
    }
    return worst;
}


int bound_floor(bound_tables *t, search_memo *memo,
                const partial_placement *partial, double threshold_s,
                double *floor_s, pt_error *err)
{
    int complete = partial->final_count + (partial->pending ? 1 : 0);
    if (t->pp - complete == 0)
        return pt_fail(err, "search: no floor for a complete placement");
    double sends = sum_extras(t, partial->gpus_left, complete);
    double tail = bound_tail_floor(t, partial->facts, partial->final_count);
    double extras = sends + tail, relaxed;
    if (bound_relaxed(t, memo, partial, NULL, NULL, extras, threshold_s,
                      &relaxed, err) != 0)
        return -1;
    double floor = relaxed + extras;
    /* the per-step work of the placed stages grows with their layers,
       which the relaxed partition then pays for (search_tail.c): only
       worth its solves where the floor so far does not cut */
    if (complete > 0 && threshold_s < INFINITY &&
        floor * (1.0 - 1e-9) <= threshold_s) {
        double joint;
        if (tail_walk_floor(t, memo, partial, relaxed, tail, sends,
                            threshold_s, &joint, err) != 0)
            return -1;
        floor = fmax(floor, joint + sends);
    }
    *floor_s = floor * (1.0 - 1e-9);
    return 0;
}

void bound_memory_miss(const bound_tables *t, memory_miss *out)
{
    int *counts = t->layers_out;
    int *roomiest = t->cap_by_position;
    for (int s = 0; s < t->pp; s++) {
        counts[s] = 0;
        roomiest[s] = -1;
        for (int type = 0; type < t->type_count; type++) {
            if (t->cm->cluster->types[type].count == 0)
                continue;
            const stage_terms *terms = &t->pure[(size_t)type * t->pp + s];
            const stage_terms *best =
                roomiest[s] < 0 ? NULL
                                : &t->pure[(size_t)roomiest[s] * t->pp + s];
            if (best == NULL ||
                terms->cap_bytes - terms->fixed_bytes >
                    best->cap_bytes - best->fixed_bytes)
                roomiest[s] = type;
        }
    }
    for (int layer = 0; layer < t->layers; layer++) {
        int chosen = 0;
        double lowest = INFINITY;
        for (int s = 0; s < t->pp; s++) {
            const stage_terms *terms = &t->pure[(size_t)roomiest[s] * t->pp + s];
            double share = (terms->fixed_bytes +
                            terms->per_layer_bytes * (counts[s] + 1)) /
                           terms->cap_bytes;
            if (share < lowest) {
                lowest = share;
                chosen = s;
            }
        }
        counts[chosen]++;
    }
    out->ratio = -1.0;
    for (int s = 0; s < t->pp; s++) {
        const stage_terms *terms = &t->pure[(size_t)roomiest[s] * t->pp + s];
        double needed = terms->fixed_bytes + terms->per_layer_bytes * counts[s];
        double ratio = needed / terms->cap_bytes;
        if (isnan(ratio))
            ratio = INFINITY;
        if (ratio > out->ratio) {
            *out = (memory_miss){ratio, s, roomiest[s], needed,
                                 terms->cap_bytes};
        }
    }
}

