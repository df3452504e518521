/*
 * Floors under the search's scores, for pruning: from the prices of the
 * GPU types alone, a score no configuration of a shape can go below, and
 * the order in which shapes are visited so that good plans are found
 * early and prune the rest (docs/planner.md, "Pruning").
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>

/* A floor under the score of every configuration of a shape at one
 * micro-batch size, from the prices of the GPU types alone. The stages'
 * paces are at best those of the GPUs taken fastest first, S = dp x tp
 * at a time; the bottleneck is then at least L / sum 1/pace (layers
 * spread perfectly) and at least the mean stage time; the sum of stage
 * times at least the cheapest embedding and head plus every layer on the
 * fastest GPU. Sends, memory and per-step work only add to the score,
 * recompute only slows layers: the floor holds for every order and
 * lever. */
static double shape_score_floor(const search_shape *shape, int mbs_index,
                                const cluster *c, const type_costs *prices,
                                int layers, int gbs)
{
    int order[PLANNER_MAX_TYPES] = {0}, used = 0;
    for (int t = 0; t < c->type_count; t++) {
        if (c->types[t].count == 0)
            continue;
        double pace = prices[t].layer_forward_s + prices[t].layer_backward_s;
        int position = used++;
        while (position > 0 &&
               prices[order[position - 1]].layer_forward_s +
                       prices[order[position - 1]].layer_backward_s >
                   pace) {
            order[position] = order[position - 1];
            position--;
        }
        order[position] = t;
    }
    const type_costs *fastest = &prices[order[0]];
    double embedding = INFINITY, head = INFINITY, capacity = 0.0;
    for (int i = 0; i < used; i++) {
        const type_costs *p = &prices[order[i]];
        double e = p->embedding_forward_s + p->embedding_backward_s;
        double h = p->head_forward_s + p->head_backward_s;
        embedding = e < embedding ? e : embedding;
        head = h < head ? h : head;
    }
    int stage_gpus = shape->dp * shape->tp, type = 0, gpus_before = 0;
    for (int j = 0; j < shape->pp; j++) {
        int slowest_gpu = (j + 1) * stage_gpus - 1;
        while (slowest_gpu >= gpus_before + c->types[order[type]].count *
                                                c->types[order[type]].gpus) {
            gpus_before += c->types[order[type]].count *
                           c->types[order[type]].gpus;
            type++;
        }
        double pace = prices[order[type]].layer_forward_s +
                      prices[order[type]].layer_backward_s;
        capacity += pace > 0.0 ? 1.0 / pace : INFINITY;
    }
    double sum = embedding + head +
                 layers * (fastest->layer_forward_s +
                           fastest->layer_backward_s);
    double bottleneck = layers / capacity;
    if (sum / shape->pp > bottleneck)
        bottleneck = sum / shape->pp;
    int microbatches = gbs / (shape->dp * shape->mbs[mbs_index]);
    /* shaded down so rounding never lifts it above a real score */
    return (sum + (microbatches - 1) * bottleneck) * (1.0 - 1e-9);
}

int search_score_floors(costmodel *cm, const search_options *options,
                        search_space *space, pt_error *err)
{
    const cluster *c = cm->cluster;
    for (int s = 0; s < space->shape_count; s++) {
        search_shape *shape = &space->shapes[s];
        for (int i = 0; i < shape->mbs_count; i++) {
            parallel_config config = {options->gbs, shape->mbs[i], shape->tp,
                                      shape->dp, shape->pp, options->schedule,
                                      options->precision, false, false};
            type_costs prices[PLANNER_MAX_TYPES] = {0};
            for (int t = 0; t < c->type_count; t++)
                if (c->types[t].count > 0 &&
                    costmodel_type_costs(cm, t, &config, &prices[t], err) != 0)
                    return -1;
            shape->score_floor_s[i] = shape_score_floor(
                shape, i, c, prices, cm->model.layers, options->gbs);
        }
    }
    return 0;
}

/* The order in which the workers take node orders: shapes by their
 * lowest floor, so good plans come early and prune the rest. Which
 * configuration is kept never depends on this order, only how many are
 * pruned. */
int search_visit_order(const search_space *space, int **visit_out,
                       pt_error *err)
{
    int *shapes = malloc((size_t)space->shape_count * sizeof(int));
    double *floors = malloc((size_t)space->shape_count * sizeof(double));
    int *visit = malloc(((size_t)space->order_count + 1) * sizeof(int));
    if (shapes == NULL || floors == NULL || visit == NULL) {
        free(visit);
        free(shapes);
        free(floors);
        return pt_fail(err, "search: out of memory for the visit order");
    }
    for (int s = 0; s < space->shape_count; s++) {
        const search_shape *shape = &space->shapes[s];
        floors[s] = INFINITY;
        for (int i = 0; i < shape->mbs_count; i++)
            if (shape->score_floor_s[i] < floors[s])
                floors[s] = shape->score_floor_s[i];
        int position = s;
        while (position > 0 && floors[shapes[position - 1]] > floors[s]) {
            shapes[position] = shapes[position - 1];
            position--;
        }
        shapes[position] = s;
    }
    int next = 0;
    for (int k = 0; k < space->shape_count; k++) {
        const search_shape *shape = &space->shapes[shapes[k]];
        for (int o = 0; o < shape->order_count; o++)
            visit[next++] = shape->first_order + o;
    }
    free(shapes);
    free(floors);
    *visit_out = visit;
    return 0;
}

