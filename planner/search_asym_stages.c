/*
 * What a stage of the asymmetric tree costs (issue 36; docs/planner.md,
 * "Stages of their own degrees"): the stages it places, priced on the
 * nodes under them and memoised by them; and floors of what any stage of
 * a shape holding a GPU of a type costs, which the relaxation of the
 * stages to come is made of (search_asym_relax.c).
 *
 * A stage's pace is its slowest tp group's: the group holding the GPU of
 * that type runs no faster than the least of every way tp GPUs can lie
 * over nodes with one of that type, each priced as the cost model prices
 * it. Its fixed time is its slowest type's: with tp 1 a type no cheaper
 * by price, else (a spanning group may be the slowest) any type. Its
 * per-step work: in one node of the type, exact; across nodes, the
 * cheapest optimizer step and allreduce_floor_time over the links its dp
 * group may have; the first and last stage add the tied embedding's
 * all-reduce, over the fastest link between nodes (with two nodes or
 * more, some GPU pair it joins lies on two). Its sends: over the fastest
 * link of any kind, across nodes on both sides for a stage as large as
 * a node or larger. Its memory cap is its
 * smallest type's, at most the type's own.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The segment memo is a cache: dropped past this size. */
#define SEGMENT_MEMO_BYTES ((size_t)64 << 20)
/* The address space the caps and work arrays are taken from (past it
 * they are malloc'd). */
#define STAGES_REGION_BYTES ((size_t)256 << 20)
/* Micro-batches in flight the caps are priced at (asym_level). */
#define CAP_LEVELS (ASYM_LEVELS_EXACT + 24)

struct asym_stages {
    costmodel *cm;
    const search_options *options;
    const asym_batch *batches;
    int batch_count, type_count, layers;
    double cutoff;                     /* the caps' (asym_stages_caps) */
    asym_pure **pure;                  /* [batch] -> [shapes x types] */
    int **caps;    /* [batch] -> [shapes x types x levels x (roles + 1)] */
    memo_table segments;               /* stage terms by segment */
    int *key;
    double *scratch;                   /* [layers + 1] */
    /* the caps' and the floors' work arrays: written a few cells at a
       time, on pages touched once (region.c) */
    region room;
    int lane_types[PLANNER_MAX_NODES];
    int lane_starts[PLANNER_MAX_NODES + 1];
};

/* ------------------------------------------------- the stages placed */

/* The key of a stage's terms and work: micro-batch, shape, whether it is
 * first or last, its micro-batches in flight, where it starts in its
 * first node and the types of the nodes under it. */
static int segment_key(asym_stages *r, int batch, int k,
                       const asym_role *role, const node_lane *lane,
                       long long first, long long end)
{
    int *key = r->key, n = 0;
    int microbatches = r->batches[batch].microbatches;
    int ahead = role->pp - role->stage;
    key[n++] = batch;
    key[n++] = k;
    key[n++] = (role->stage == 0) | (ahead == 1) << 1;
    key[n++] = ahead < microbatches ? ahead : microbatches;
    int slot = 0;
    while (lane->starts[slot + 1] <= first)
        slot++;
    key[n++] = (int)(first - lane->starts[slot]);
    for (; slot < lane->count && lane->starts[slot] < end; slot++)
        key[n++] = lane->types[slot];
    return n;
}

int asym_stages_price(asym_stages *r, int batch, int k, const asym_role *role,
                     const node_lane *lane, long long first,
                     asym_placed *out, pt_error *err)
{
    const asym_batch *mb = &r->batches[batch];
    const asym_shape *shape = &mb->shape[k];
    size_t length = sizeof(int) *
                    (size_t)segment_key(r, batch, k, role, lane, first,
                                        first + shape->gpus);
    uint64_t hash = memo_hash(r->key, length);
    size_t work_bytes = sizeof(double) * (size_t)(r->layers + 1);
    const unsigned char *found = memo_find(&r->segments, r->key, length,
                                           hash);
    stage_terms terms;
    if (found == NULL) {
        parallel_config own = asym_stage_config(
            r->options, role->pp, mb->samples, shape->tp, shape->dp);
        if (costmodel_stage_terms_unsent(r->cm, &own, lane, role->stage,
                                         first, &terms, err) != 0 ||
            costmodel_stage_work_at(r->cm, &own, lane, role->stage, first,
                                    r->layers, r->scratch, err) != 0)
            return -1;
        if (memo_bytes(&r->segments) > SEGMENT_MEMO_BYTES)
            memo_clear(&r->segments);
        unsigned char *room = memo_insert(&r->segments, r->key, length,
                                          hash, sizeof terms + work_bytes);
        if (room == NULL)
            return pt_fail(err, "search: out of memory for stage terms");
        memcpy(room, &terms, sizeof terms);
        memcpy(room + sizeof terms, r->scratch, work_bytes);
        found = room;
    }
    memcpy(&terms, found, sizeof terms);
    memcpy(out->work, found + sizeof terms, work_bytes);
    out->fixed = terms.fixed_s;
    out->pace = terms.per_layer_s;
    out->cap = terms.max_layers;
    out->extra = 0.0;
    return 0;
}

/* Room for an array that lives as long as the stages: from their
 * region (malloc when it has none left). */
static void *stages_array(asym_stages *r, size_t bytes)
{
    void *room = region_take(&r->room, bytes);
    return room != NULL ? room : malloc(bytes);
}

/* --------------------------------------------------- one type's stage */

/* Where a stage of a role sits as the cost model reads it: the first of
 * two, the last of two, or the second of `level` + 1 (that many
 * micro-batches in flight at its peak, when m allows). */
static asym_role role_of(int role, int level)
{
    if (role == ASYM_FIRST)
        return (asym_role){level > 2 ? level : 2, 0};
    if (role == ASYM_LAST)
        return (asym_role){2, 1};
    return (asym_role){(level > 2 ? level : 2) + 1, 1};
}

/* A lane of nodes of one type from GPU 0. */
static node_lane pure_lane(asym_stages *r, int type, long long gpus)
{
    int gpus_of = r->cm->cluster->types[type].gpus, count = 0;
    r->lane_starts[0] = 0;
    while (r->lane_starts[count] < gpus && count < PLANNER_MAX_NODES) {
        r->lane_types[count] = type;
        r->lane_starts[count + 1] = r->lane_starts[count] + gpus_of;
        count++;
    }
    return (node_lane){count, r->lane_types, r->lane_starts};
}

/* The fastest links a group of `members` that spans nodes and holds a
 * GPU of type `type` can have: any node's own link, and the fastest
 * between that type's node and another (the group crosses from it to a
 * neighbour); the most members of it one node holds: gpus / tp, and
 * fewer than all of them. */
typedef struct group_links {
    double intra, inter;
    int most_per_node;
} group_links;

static group_links links_of(const asym_stages *r, int type, int tp,
                            int members)
{
    const cluster *c = r->cm->cluster;
    group_links out = {0.0, 0.0, 1};
    for (int t = 0; t < c->type_count; t++) {
        if (c->types[t].count == 0)
            continue;
        out.intra = fmax(out.intra,
                         c->types[t].intra_node.bandwidth_bytes_per_s);
        out.inter = fmax(out.inter, cluster_type_link(c, type, t)
                                        .bandwidth_bytes_per_s);
        int per_node = c->types[t].gpus / tp;
        out.most_per_node = per_node > out.most_per_node ? per_node
                                                         : out.most_per_node;
    }
    if (out.most_per_node > members - 1)
        out.most_per_node = members - 1 > 1 ? members - 1 : 1;
    return out;
}

/* The per-step work of a stage across nodes holding a GPU of type
 * `type`: its optimizer step at the cheapest type's, and its reduction
 * (the layers' parameters alone) no faster than allreduce_floor_time
 * over the links its dp group may have (placement.c's dp_hierarchy):
 * whole nodes of that type's size, each member's node link no faster
 * than the type's own, or spread unevenly, a flat ring over the slowest
 * link of its rings, which crosses from the type's node to another.
 * What does not depend on the layers is taken once (span_of), each
 * layer count's work then (span_work). */
typedef struct span {
    double per_layer, gradient_bytes, cheapest_step, inter, intra;
    int members, nodes_of_type;  /* nodes_of_type: 0 when not whole */
} span;

static span span_of(const asym_stages *r, const parallel_config *own,
                    int type, double cheapest_step)
{
    const cluster *c = r->cm->cluster;
    group_links links = links_of(r, type, own->tp, own->dp);
    int gpus = c->types[type].gpus, stage_gpus = own->tp * own->dp;
    bool whole = stage_gpus % gpus == 0 && stage_gpus >= 2 * gpus &&
                 gpus % own->tp == 0;
    return (span){model_layer_parameters_per_rank(&r->cm->model, own->tp),
                  parallel_gradient_bytes(own), cheapest_step, links.inter,
                  c->types[type].intra_node.bandwidth_bytes_per_s, own->dp,
                  whole ? gpus / own->tp : 0};
}

static double span_work(const span *s, int layers)
{
    double params = layers * s->per_layer;
    double bytes = params * s->gradient_bytes;
    double reduce = allreduce_floor_time(bytes, s->members, 1, s->inter,
                                         s->inter);
    if (s->nodes_of_type > 0)
        reduce = fmin(reduce, allreduce_floor_time(bytes, s->members,
                                                   s->nodes_of_type, s->intra,
                                                   s->inter));
    return params * s->cheapest_step + reduce;
}

/* Shape k's stage of a role at `level` micro-batches in flight over
 * the lane from its GPU 0: its config into *own, its terms. */
static int pure_terms(asym_stages *r, int batch, int k, int role, int level,
                      const node_lane *lane, parallel_config *own,
                      stage_terms *terms, pt_error *err)
{
    const asym_shape *shape = &r->batches[batch].shape[k];
    asym_role where = role_of(role, level);
    *own = asym_stage_config(r->options, where.pp,
                             r->batches[batch].samples, shape->tp,
                             shape->dp);
    return costmodel_stage_terms_unsent(r->cm, own, lane, where.stage, 0,
                                        terms, err);
}

/* Type `type`'s stage of shape k in every role: its own fixed time and
 * its work in one node of it (when it fits one), the work across nodes
 * where not. */
static int fill_pure(asym_stages *r, int batch, int k, int type,
                     double cheapest_step, asym_pure *out, pt_error *err)
{
    const asym_shape *shape = &r->batches[batch].shape[k];
    bool inside = shape->gpus <= r->cm->cluster->types[type].gpus;
    node_lane lane = pure_lane(r, type, shape->gpus);
    for (int role = 0; role < ASYM_ROLES; role++) {
        parallel_config own;
        stage_terms terms;
        if (pure_terms(r, batch, k, role, 2, &lane, &own, &terms, err) != 0)
            return -1;
        out->fixed[role] = terms.fixed_s;
        out->work[role] = stages_array(r, sizeof(double) *
                                              (size_t)(r->layers + 1));
        if (out->work[role] == NULL)
            return pt_fail(err, "search: out of memory for the floors");
        if (inside && costmodel_stage_work_at(r->cm, &own, &lane,
                                              role_of(role, 2).stage, 0,
                                              r->layers, out->work[role],
                                              err) != 0)
            return -1;
        double embedding = role == ASYM_MIDDLE
                               ? 0.0
                               : asym_stages_embedding_floor(r, shape->tp);
        span across_nodes = span_of(r, &own, type, cheapest_step);
        for (int l = 0; l <= r->layers; l++) {
            double across = span_work(&across_nodes, l);
            out->work[role][l] = (inside ? fmin(out->work[role][l], across)
                                         : across) +
                                 embedding;
        }
    }
    return 0;
}

/* Group layouts priced at most per (tp, mbs, type): past it the pace
 * floor is any type's compute alone. */
#define GROUP_LAYOUTS_MOST 4096

typedef struct group_walk {
    asym_stages *r;
    parallel_config own;
    int type, offset, count, layouts;
    int used[PLANNER_MAX_TYPES];
    double least;
    pt_error *err;
} group_walk;

/* Prices the tp group laid over the lane's nodes from offset g->offset
 * (a stage of that one group), when it holds a GPU of g->type; else puts
 * one more node of each type after them. */
static int walk_layouts(group_walk *g)
{
    asym_stages *r = g->r;
    const cluster *c = r->cm->cluster;
    if (r->lane_starts[g->count] >= g->offset + g->own.tp) {
        bool holds = false;
        for (int i = 0; i < g->count; i++)
            holds = holds || r->lane_types[i] == g->type;
        if (!holds || ++g->layouts > GROUP_LAYOUTS_MOST)
            return 0;
        node_lane lane = {g->count, r->lane_types, r->lane_starts};
        stage_terms terms;
        if (costmodel_stage_terms_unsent(r->cm, &g->own, &lane, 1,
                                         g->offset, &terms, g->err) != 0)
            return -1;
        g->least = fmin(g->least, terms.per_layer_s);
        return 0;
    }
    for (int t = 0; t < c->type_count && g->layouts <= GROUP_LAYOUTS_MOST;
         t++) {
        if (g->used[t] >= c->types[t].count ||
            (g->count == 0 && g->offset >= c->types[t].gpus))
            continue;
        g->used[t]++;
        r->lane_types[g->count] = t;
        r->lane_starts[g->count + 1] = r->lane_starts[g->count] +
                                       c->types[t].gpus;
        g->count++;
        int rc = walk_layouts(g);
        g->count--;
        g->used[t]--;
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* The least pace of a stage whose tp groups of this config hold a GPU of
 * type `type`: the group holding it runs no faster than the least of
 * every way a group of tp GPUs can lie over nodes with one of that type
 * (a stage runs at its slowest group's pace). NAN when there are too
 * many ways to price. */
static int group_pace_floor(asym_stages *r, const parallel_config *config,
                            int type, double *out, pt_error *err)
{
    group_walk g = {.r = r, .own = *config, .type = type, .least = INFINITY,
                    .err = err};
    g.own.pp = 3;
    g.own.mbs = config->mbs;
    g.own.dp = 1;
    int most_offset = 0;
    for (int t = 0; t < r->type_count; t++)
        most_offset = r->cm->cluster->types[t].gpus > most_offset
                          ? r->cm->cluster->types[t].gpus
                          : most_offset;
    r->lane_starts[0] = 0;
    for (g.offset = 0; g.offset < most_offset; g.offset++)
        if (walk_layouts(&g) != 0)
            return -1;
    *out = g.layouts > GROUP_LAYOUTS_MOST ? NAN : g.least;
    return 0;
}

/* Every type's stage of shape k at a micro-batch: its pace floored by
 * every way its tp group may lie over nodes (or, where they are too
 * many, by any type's compute alone), its fixed time by every type
 * no cheaper by price (tp 1: the stage's slowest GPU prices it), or by
 * every type (its slowest group may span nodes). */
static int fill_shape(asym_stages *r, int batch, int k, pt_error *err)
{
    const asym_shape *shape = &r->batches[batch].shape[k];
    parallel_config own = asym_stage_config(
        r->options, 2, r->batches[batch].samples, shape->tp, shape->dp);
    type_costs costs[PLANNER_MAX_TYPES];
    double cheapest_step = INFINITY;
    for (int t = 0; t < r->type_count; t++) {
        if (costmodel_type_costs(r->cm, t, &own, &costs[t], err) != 0)
            return -1;
        cheapest_step = fmin(cheapest_step, costs[t].optimizer_s_per_param);
    }
    asym_pure *row = &r->pure[batch][k * r->type_count];
    for (int t = 0; t < r->type_count; t++) {
        if (group_pace_floor(r, &own, t, &row[t].pace, err) != 0)
            return -1;
        if (isnan(row[t].pace)) {
            /* any type's compute alone, with no tp collective */
            row[t].pace = INFINITY;
            for (int v = 0; v < r->type_count; v++)
                row[t].pace = fmin(
                    row[t].pace,
                    fmin(costs[v].layer_forward_s + costs[v].layer_backward_s,
                         costmodel_layer_pace_across_s(&own, &costs[v],
                                                       0.0)));
        }
        if (fill_pure(r, batch, k, t, cheapest_step, &row[t], err) != 0)
            return -1;
    }
    for (int t = 0; t < r->type_count; t++) {
        double price = costs[t].layer_forward_s + costs[t].layer_backward_s;
        for (int v = 0; v < r->type_count; v++) {
            if (shape->tp == 1 &&
                costs[v].layer_forward_s + costs[v].layer_backward_s < price)
                continue;
            for (int role = 0; role < ASYM_ROLES; role++)
                row[t].fixed[role] = fmin(row[t].fixed[role],
                                          row[v].fixed[role]);
        }
    }
    return 0;
}

/* The caps of type t's stage of shape k in every role at `level`
 * micro-batches in flight, priced: its memory's, and no more layers
 * than its floors keep C = (m - 1) T + W under the cutoff at. A stage
 * holding more makes a plan score no lower than the cutoff, which no
 * plan kept reaches; so levels whose memory caps differ only above that
 * share their tables (search_asym_relax.c). */
static int price_caps(asym_stages *r, int batch, int k, int type, int level,
                      int *caps, pt_error *err)
{
    node_lane lane = pure_lane(r, type, r->batches[batch].shape[k].gpus);
    const asym_pure *pure = asym_stages_pure(r, batch, k, type, err);
    if (pure == NULL)
        return -1;
    double weight = r->batches[batch].microbatches - 1;
    for (int role = 0; role < ASYM_ROLES; role++) {
        parallel_config own;
        stage_terms terms;
        if (pure_terms(r, batch, k, role, level, &lane, &own, &terms,
                       err) != 0)
            return -1;
        int most = terms.max_layers < r->layers ? terms.max_layers
                                                : r->layers;
        while (most >= 0 &&
               !(weight * (pure->fixed[role] + pure->pace * most) +
                     pure->work[role][most] <
                 r->cutoff))
            most--;
        caps[role] = most < terms.max_layers ? most : terms.max_layers;
    }
    return 0;
}

int asym_level(int inflight)
{
    if (inflight <= ASYM_LEVELS_EXACT)
        return inflight < 1 ? 1 : inflight;
    int level = ASYM_LEVELS_EXACT;
    while (level * 2 <= inflight && level < (1 << 29))
        level *= 2;
    return level;
}

int asym_level_below(int level)
{
    return level <= ASYM_LEVELS_EXACT ? level - 1 : level / 2;
}

/* ------------------------------------------------- the embedding floor */

/* The fastest link between two nodes of the cluster (none: INFINITY
 * bandwidth), and the fastest inside one. */
static link_spec fastest_between(const cluster *c)
{
    link_spec fastest = {0.0, INFINITY};
    for (int a = 0; a < c->type_count; a++)
        for (int b = 0; b < c->type_count; b++) {
            if (c->types[a].count == 0 || c->types[b].count == 0 ||
                (a == b && c->types[a].count < 2))
                continue;
            link_spec link = cluster_type_link(c, a, b);
            fastest.bandwidth_bytes_per_s = fmax(
                fastest.bandwidth_bytes_per_s, link.bandwidth_bytes_per_s);
            fastest.latency_s = fmin(fastest.latency_s, link.latency_s);
        }
    return fastest;
}

static link_spec fastest_inside(const cluster *c)
{
    link_spec fastest = {0.0, INFINITY};
    for (int t = 0; t < c->type_count; t++) {
        fastest.bandwidth_bytes_per_s =
            fmax(fastest.bandwidth_bytes_per_s,
                 c->types[t].intra_node.bandwidth_bytes_per_s);
        fastest.latency_s = fmin(fastest.latency_s,
                                 c->types[t].intra_node.latency_s);
    }
    return fastest;
}

double asym_stages_embedding_floor(const asym_stages *r, int tp)
{
    const cluster *c = r->cm->cluster;
    if (c->node_count < 2)
        return 0.0;
    parallel_config pair = asym_stage_config(r->options, 2, 1, tp, 1);
    return costmodel_embedding_allreduce_s(r->cm, &pair, fastest_between(c),
                                           -1);
}

/* The index of a level asym_level gives. */
static int level_index(int level)
{
    int index = level <= ASYM_LEVELS_EXACT ? level - 1 : ASYM_LEVELS_EXACT - 1;
    for (int above = ASYM_LEVELS_EXACT; above < level; above *= 2)
        index++;
    return index < CAP_LEVELS ? index : CAP_LEVELS - 1;
}

int asym_stages_caps(asym_stages *r, int batch, int k, int type, int level,
                     int *caps, pt_error *err)
{
    level = asym_level(level);
    if (r->caps[batch] == NULL) {
        size_t cells = (size_t)r->batches[batch].count * r->type_count *
                       CAP_LEVELS * (ASYM_ROLES + 1);
        /* zero: the reservation's pages are new, and never reused */
        r->caps[batch] = stages_array(r, (cells + 1) * sizeof(int));
        if (r->caps[batch] != NULL && !region_holds(&r->room, r->caps[batch]))
            memset(r->caps[batch], 0, (cells + 1) * sizeof(int));
        if (r->caps[batch] == NULL)
            return pt_fail(err, "search: out of memory for the floors");
    }
    /* by level first: a table asks every shape and type at one level,
       so the cells it touches share pages */
    int *cell = r->caps[batch] +
                (((size_t)level_index(level) * r->batches[batch].count + k) *
                     r->type_count +
                 type) *
                    (ASYM_ROLES + 1);
    if (!cell[ASYM_ROLES]) {
        if (price_caps(r, batch, k, type, level, cell, err) != 0)
            return -1;
        cell[ASYM_ROLES] = 1;
    }
    memcpy(caps, cell, sizeof(int) * ASYM_ROLES);
    return 0;
}

/* The fastest links a stage on GPUs of the types in `mask` may send
 * over: inside a node of one of them, or from one of them to a node of
 * any type (its neighbours are on those GPUs or in front of them). */
static void mask_links(const cluster *c, int mask, link_spec *inside,
                       link_spec *between)
{
    *inside = (link_spec){0.0, INFINITY};
    *between = (link_spec){0.0, INFINITY};
    for (int a = 0; a < c->type_count; a++) {
        if (!(mask >> a & 1) || c->types[a].count == 0)
            continue;
        inside->bandwidth_bytes_per_s =
            fmax(inside->bandwidth_bytes_per_s,
                 c->types[a].intra_node.bandwidth_bytes_per_s);
        inside->latency_s = fmin(inside->latency_s,
                                 c->types[a].intra_node.latency_s);
        for (int b = 0; b < c->type_count; b++) {
            if (c->types[b].count == 0 || (a == b && c->types[a].count < 2))
                continue;
            link_spec link = cluster_type_link(c, a, b);
            between->bandwidth_bytes_per_s = fmax(
                between->bandwidth_bytes_per_s, link.bandwidth_bytes_per_s);
            between->latency_s = fmin(between->latency_s, link.latency_s);
        }
    }
}

double asym_stages_send_floor(const asym_stages *r, int batch, int k,
                              int mask)
{
    const cluster *c = r->cm->cluster;
    const asym_batch *mb = &r->batches[batch];
    int most_per_node = 0;
    for (int t = 0; t < c->type_count; t++)
        if (c->types[t].count > 0 && c->types[t].gpus > most_per_node)
            most_per_node = c->types[t].gpus;
    link_spec inside, link;
    mask_links(c, mask, &inside, &link);
    /* a stage smaller than the largest node may send inside one (and
       with one node it does); one as large sends across nodes */
    if (mb->shape[k].gpus < most_per_node || c->node_count < 2) {
        link.bandwidth_bytes_per_s = fmax(link.bandwidth_bytes_per_s,
                                          inside.bandwidth_bytes_per_s);
        link.latency_s = fmin(link.latency_s, inside.latency_s);
    }
    link_spec gather = fastest_inside(c);
    parallel_config own = asym_stage_config(r->options, 3, mb->samples,
                                            mb->shape[k].tp,
                                            mb->shape[k].dp);
    double least = INFINITY;
    for (int other = 0; other < mb->count; other++) {
        parallel_config to = asym_stage_config(
            r->options, 3, mb->samples, mb->shape[other].tp,
            mb->shape[other].dp);
        /* priced by the link or by any type's measured curve */
        for (int curve = -1; curve < c->type_count; curve++)
            if (curve < 0 || c->types[curve].count > 0)
                least = fmin(least,
                             costmodel_boundary_send_s(r->cm, &own, &to,
                                                       curve, link, gather));
    }
    return least;
}

const asym_pure *asym_stages_pure(asym_stages *r, int batch, int k, int type,
                                  pt_error *err)
{
    if (r->pure[batch] == NULL) {
        const asym_batch *mb = &r->batches[batch];
        r->pure[batch] = calloc((size_t)mb->count * r->type_count + 1,
                                sizeof(asym_pure));
        if (r->pure[batch] == NULL) {
            pt_fail(err, "search: out of memory for the floors");
            return NULL;
        }
        for (int shape = 0; shape < mb->count; shape++)
            if (fill_shape(r, batch, shape, err) != 0)
                return NULL;
    }
    return &r->pure[batch][k * r->type_count + type];
}

/* ------------------------------------------------------------ set-up */

int asym_stages_open(asym_stages **out, costmodel *cm,
                     const search_options *options, const asym_batch *batches,
                     int batch_count, double cutoff, pt_error *err)
{
    asym_stages *r = calloc(1, sizeof *r);
    *out = r;
    if (r == NULL)
        return pt_fail(err, "search: out of memory for the stages");
    r->cm = cm;
    r->options = options;
    r->batches = batches;
    r->batch_count = batch_count;
    r->cutoff = cutoff;
    r->type_count = cm->cluster->type_count;
    r->layers = cm->model.layers;
    r->segments.huge = true;
    region_open(&r->room, STAGES_REGION_BYTES);
    r->pure = calloc((size_t)batch_count + 1, sizeof *r->pure);
    r->caps = calloc((size_t)batch_count + 1, sizeof *r->caps);
    r->key = malloc(sizeof(int) * (size_t)(cm->cluster->node_count + 8));
    r->scratch = malloc(sizeof(double) * (size_t)(r->layers + 1));
    if (r->pure == NULL || r->caps == NULL || r->key == NULL ||
        r->scratch == NULL)
        return pt_fail(err, "search: out of memory for the stages");
    return 0;
}

void asym_stages_close(asym_stages *r)
{
    if (r == NULL)
        return;
    for (int b = 0; r->pure != NULL && b < r->batch_count; b++) {
        asym_pure *pure = r->pure[b];
        for (int i = 0; pure != NULL && i < r->batches[b].count * r->type_count;
             i++)
            for (int role = 0; role < ASYM_ROLES; role++)
                region_release(&r->room, pure[i].work[role]);
        free(pure);
        region_release(&r->room, r->caps != NULL ? r->caps[b] : NULL);
    }
    free(r->pure);
    free(r->caps);
    memo_free(&r->segments);
    region_close(&r->room);
    free(r->key);
    free(r->scratch);
    free(r);
}
