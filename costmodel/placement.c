/*
 * Placement: which node holds each GPU of a plan, and what that means for
 * every pipeline stage (its pace, its memory cap, its links).
 *
 * rank = t + tp x (d + dp x s) and ranks fill the node order's GPUs in
 * order, so GPU x belongs to stage x / S (S = dp x tp), replica
 * (x / tp) % dp and tp rank x % tp. Every link a stage uses joins a GPU to
 * one a fixed distance further: tp rings (neighbours inside a group), dp
 * rings (tp further), sends to the next stage (S further), the tied
 * embedding (S x (pp - 1) further). So a stage is placed from the nodes
 * over it and its next stage alone (a node_lane), which lets the planner
 * price a stage before it knows the whole order, and the estimate and the
 * search read the very same facts.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "costmodel/internal.h"

int costmodel_check_degrees(const parallel_config *config, pt_error *err)
{
    if (config->tp <= 0 || config->dp <= 0 || config->pp <= 0 ||
        config->mbs <= 0)
        return pt_fail(err, "plan: tp, dp, pp and mbs must be positive, got "
                       "tp %d, dp %d, pp %d, mbs %d", config->tp, config->dp,
                       config->pp, config->mbs);
    if (config->pp > PT_MAX_STAGES)
        return pt_fail(err, "plan: pp %d is more than the %d stages "
                       "supported", config->pp, PT_MAX_STAGES);
    if ((long long)config->tp * config->dp * config->pp > 1000000000LL)
        return pt_fail(err, "plan: tp x dp x pp is absurdly large");
    return 0;
}

/* ------------------------------------------------------------ the lane */

/* Walks a lane's slots in increasing GPU order: slot_of answers "which
 * slot holds GPU x" for non-decreasing x in amortised constant time. */
typedef struct lane_cursor {
    const node_lane *lane;
    int slot;
} lane_cursor;

static int slot_of(lane_cursor *cursor, long long gpu)
{
    const node_lane *lane = cursor->lane;
    if (gpu < lane->starts[cursor->slot])
        cursor->slot = 0;
    while (cursor->slot + 1 < lane->count &&
           lane->starts[cursor->slot + 1] <= gpu)
        cursor->slot++;
    return cursor->slot;
}

/* The link between the nodes of two slots: the intra-node link for one
 * slot, else the cluster's link between their types (cluster_type_link:
 * a link the cluster names for the pair, or the slower of their
 * inter-node figures). */
static link_spec slot_link(const cluster *c, const node_lane *lane, int a,
                           int b)
{
    if (a == b)
        return c->types[lane->types[a]].intra_node;
    return cluster_type_link(c, lane->types[a], lane->types[b]);
}

/* The slowest link between GPU x and GPU x + distance for every x in
 * [first, first + count), and the type whose curves apply when every pair
 * shares a node of one type (else -1). */
static link_spec pair_links(const cluster *c, const node_lane *lane,
                            long long first, long long count,
                            long long distance, int *curve_type)
{
    lane_cursor from = {lane, 0}, to = {lane, 0};
    link_spec slowest = {0.0, 0.0};
    int same_type = -2; /* -2: nothing seen yet */
    /* the slot pair only changes at node boundaries: step from one to the
       next instead of GPU by GPU */
    long long x = first, end = first + count;
    while (x < end) {
        int a = slot_of(&from, x), b = slot_of(&to, x + distance);
        long long run_a = lane->starts[a + 1] - x;
        long long run_b = lane->starts[b + 1] - (x + distance);
        long long run = run_a < run_b ? run_a : run_b;
        if (run > end - x)
            run = end - x;
        link_spec link = slot_link(c, lane, a, b);
        slowest = x == first ? link : slower_link(slowest, link);
        int type = a == b ? lane->types[a] : -1;
        same_type = same_type == -2 || same_type == type ? type : -1;
        x += run;
    }
    *curve_type = same_type < 0 ? -1 : same_type;
    return slowest;
}

/* ------------------------------------------------------- a tp group's pace */

/* What a stage's slowest tp group is made of. */
typedef struct group_pace {
    double seconds;        /* forward + backward of one layer */
    int slow_type;
    bool spans_nodes;
    link_spec link;        /* the slowest link between its nodes */
    int nodes;             /* the nodes it spans */
    link_spec intra_link;  /* the slowest inside a node holding two */
} group_pace;

/* The tp group of GPUs [first, first + tp): its slowest type, and when it
 * crosses nodes, the group as NCCL sees it: its nodes, the slowest
 * inter-node link between them and the slowest intra-node link of a node
 * holding two of its GPUs. */
/* The types a stage's placement has priced at its config: a stage's
 * groups and nodes are mostly of a few types, and pricing one (a profile
 * lookup) is dear, so each is priced once per stage; a type past the
 * first PRICED_TYPES is priced every time it is asked. */
#define PRICED_TYPES 8

typedef struct priced_types {
    int count;
    int type[PRICED_TYPES];
    type_costs costs[PRICED_TYPES];
} priced_types;

static int price_once(const costmodel *cm, const parallel_config *config,
                      priced_types *priced, int type, type_costs *out,
                      pt_error *err)
{
    for (int i = 0; i < priced->count; i++)
        if (priced->type[i] == type) {
            *out = priced->costs[i];
            return 0;
        }
    if (costmodel_price_type(cm, type, config, NULL, out, err) != 0)
        return -1;
    if (priced->count < PRICED_TYPES) {
        priced->type[priced->count] = type;
        priced->costs[priced->count++] = *out;
    }
    return 0;
}

static int price_group(const costmodel *cm, const parallel_config *config,
                       const node_lane *lane, lane_cursor *cursor,
                       priced_types *priced, long long first,
                       group_pace *out, pt_error *err)
{
    const cluster *c = cm->cluster;
    int first_slot = slot_of(cursor, first);
    int last_slot = first_slot;
    while (last_slot + 1 < lane->count &&
           lane->starts[last_slot + 1] < first + config->tp)
        last_slot++;
    out->spans_nodes = last_slot != first_slot;
    out->nodes = last_slot - first_slot + 1;
    out->slow_type = lane->types[first_slot];
    out->link = c->types[lane->types[first_slot]].intra_node;
    out->intra_link = out->link;
    bool any_inter = false, any_intra = false;
    double slowest = -1.0;
    for (int slot = first_slot; slot <= last_slot; slot++) {
        type_costs costs;
        int type = lane->types[slot];
        if (price_once(cm, config, priced, type, &costs, err) != 0)
            return -1;
        double pace = costs.layer_forward_s + costs.layer_backward_s;
        if (pace > slowest || (pace == slowest && type < out->slow_type)) {
            slowest = pace;
            out->slow_type = type;
        }
        if (!out->spans_nodes)
            break;
        long long lo = lane->starts[slot] > first ? lane->starts[slot] : first;
        long long hi = lane->starts[slot + 1] < first + config->tp
                           ? lane->starts[slot + 1]
                           : first + config->tp;
        if (hi - lo >= 2) {
            link_spec link = slot_link(c, lane, slot, slot);
            out->intra_link = any_intra ? slower_link(out->intra_link, link)
                                        : link;
            any_intra = true;
        }
        if (slot < last_slot) {
            link_spec link = slot_link(c, lane, slot, slot + 1);
            out->link = any_inter ? slower_link(out->link, link) : link;
            any_inter = true;
        }
    }
    type_costs slow;
    if (price_once(cm, config, priced, out->slow_type, &slow, err) != 0)
        return -1;
    comm_group span = {.members = config->tp, .nodes = out->nodes,
                       .intra = out->intra_link, .inter = out->link};
    out->seconds = costmodel_layer_pace_s(cm, config, &slow,
                                          out->spans_nodes ? &span : NULL);
    return 0;
}

/* The pace of a stage (its slowest tp group) and the type with the least
 * usable memory among the nodes over it. */
static int stage_types(const costmodel *cm, const parallel_config *config,
                       const node_lane *lane, long long first,
                       stage_placement *out, pt_error *err)
{
    lane_cursor cursor = {lane, 0};
    priced_types priced = {0};
    double slowest = -1.0;
    /* a group inside one node is priced by that node's type alone: of
       the groups inside nodes of one type the first says all (the
       others would change nothing below); types 0 to 63 are kept */
    uint64_t inside_seen = 0;
    for (int d = 0; d < config->dp; d++) {
        group_pace group;
        long long at = first + (long long)d * config->tp;
        int slot = slot_of(&cursor, at);
        int type = lane->types[slot];
        bool inside = lane->starts[slot + 1] >= at + config->tp;
        if (inside && type < 64) {
            if (inside_seen >> type & 1)
                continue;
            inside_seen |= (uint64_t)1 << type;
        }
        if (price_group(cm, config, lane, &cursor, &priced, at, &group,
                        err) != 0)
            return -1;
        /* ties go to the lower type index, so that the arrangement of a
           stage's nodes does not change which type it names */
        if (group.seconds > slowest ||
            (group.seconds == slowest && group.slow_type < out->slow_type)) {
            slowest = group.seconds;
            out->slow_type = group.slow_type;
            out->tp_spans_nodes = group.spans_nodes;
            out->tp_link = group.link;
            out->tp_nodes = group.nodes;
            out->tp_intra_link = group.intra_link;
        }
    }
    long long stage_gpus = (long long)config->dp * config->tp;
    lane_cursor walk = {lane, 0};
    double smallest = INFINITY;
    for (int slot = slot_of(&walk, first);
         slot < lane->count && lane->starts[slot] < first + stage_gpus;
         slot++) {
        type_costs costs;
        int type = lane->types[slot];
        if (price_once(cm, config, &priced, type, &costs, err) != 0)
            return -1;
        if (costs.memory_cap_bytes < smallest ||
            (costs.memory_cap_bytes == smallest && type < out->small_type)) {
            smallest = costs.memory_cap_bytes;
            out->small_type = type;
        }
    }
    return 0;
}

/* Checks that the lane holds GPUs [first, end). */
static int check_lane_covers(const node_lane *lane, long long first,
                             long long end, int stage, pt_error *err)
{
    if (lane->count <= 0 || lane->starts[0] > first ||
        lane->starts[lane->count] < end)
        return pt_fail(err, "costmodel: the nodes given do not cover stage "
                       "%d's GPUs %lld..%lld", stage, first, end - 1);
    return 0;
}

/* The dp group's nodes as NCCL's hierarchy sees them: when the stage
 * fills whole nodes of one GPU count that tp divides, each node holds
 * gpus / tp members of every dp ring (dp_nodes = the nodes); one node:
 * 1; anything else: 0 (priced flat over dp_link). dp_intra_link is the
 * slowest intra-node link of those nodes. */
static void dp_hierarchy(const cluster *c, const node_lane *lane,
                         long long first, long long stage_gpus,
                         const parallel_config *config, int first_slot,
                         int last_slot, stage_placement *out)
{
    out->dp_intra_link = slot_link(c, lane, first_slot, first_slot);
    out->dp_nodes = first_slot == last_slot ? 1 : 0;
    if (first_slot == last_slot || config->dp <= 1)
        return;
    int gpus = lane->starts[first_slot + 1] - lane->starts[first_slot];
    bool whole = lane->starts[first_slot] == first &&
                 lane->starts[last_slot + 1] == first + stage_gpus &&
                 gpus % config->tp == 0;
    for (int slot = first_slot; whole && slot <= last_slot; slot++) {
        whole = lane->starts[slot + 1] - lane->starts[slot] == gpus;
        out->dp_intra_link = slower_link(out->dp_intra_link,
                                         slot_link(c, lane, slot, slot));
    }
    if (whole)
        out->dp_nodes = last_slot - first_slot + 1;
}

/* Whether the GPUs first .. first + count - 1 of the lane are all slices
 * of one device: each listed in its node type's `devices`, all with the
 * same index (the executor then runs their ranks on that GPU). */
static bool slices_of_one_gpu(const cluster *c, const node_lane *lane,
                              long long first, long long count)
{
    if (count < 2)
        return false;
    lane_cursor cursor = {lane, 0};
    int index = -1;
    for (long long gpu = first; gpu < first + count; gpu++) {
        int slot = slot_of(&cursor, gpu);
        const node_type *type = &c->types[lane->types[slot]];
        long long local = gpu - lane->starts[slot];
        if (local >= type->device_count ||
            (index >= 0 && type->devices[local].index != index))
            return false;
        index = type->devices[local].index;
    }
    return true;
}

const device_spec *costmodel_lane_device(const costmodel *cm,
                                         const node_lane *lane, long long gpu)
{
    lane_cursor cursor = {lane, 0};
    if (lane->count < 1 || gpu < lane->starts[0] ||
        gpu >= lane->starts[lane->count])
        return NULL;
    int slot = slot_of(&cursor, gpu);
    const node_type *type = &cm->cluster->types[lane->types[slot]];
    long long local = gpu - lane->starts[slot];
    return local < type->device_count ? &type->devices[local] : NULL;
}

/* Whether node type `type`'s profile holds a measured all-reduce curve
 * for `gpus` GPUs (-1: no type). */
static bool measured_curve_for(const costmodel *cm, int type, int gpus)
{
    double seconds;
    return type >= 0 && costmodel_curve_time(&cm->profiles[type].allreduce,
                                             gpus, 1.0, &seconds);
}

/* What a stage's placement holds but its link towards the next stage:
 * the stage's GPUs are [first, first + its tp x dp). */
static int place_own(const costmodel *cm, const parallel_config *config,
                     const node_lane *lane, long long first,
                     stage_placement *out, pt_error *err)
{
    const cluster *c = cm->cluster;
    long long stage_gpus = (long long)config->dp * config->tp;
    if (stage_types(cm, config, lane, first, out, err) != 0)
        return -1;
    int curve_type;
    lane_cursor cursor = {lane, 0};
    int first_slot = slot_of(&cursor, first);
    /* dp rings: the GPU of tp rank t in replica d talks to tp rank t of
       replica d + 1, tp GPUs further */
    if (config->dp == 1)
        out->dp_link = slot_link(c, lane, first_slot, first_slot);
    else
        out->dp_link = pair_links(c, lane, first, stage_gpus - config->tp,
                                  config->tp, &curve_type);
    int last_slot = slot_of(&cursor, first + stage_gpus - 1);
    out->dp_curve_type = first_slot == last_slot ? lane->types[first_slot]
                                                 : -1;
    dp_hierarchy(c, lane, first, stage_gpus, config, first_slot, last_slot,
                 out);
    out->slices_of_one_gpu = slices_of_one_gpu(c, lane, first, stage_gpus);
    out->dp_collectives_contend =
        !out->slices_of_one_gpu && config->dp > 1 && out->dp_nodes == 1 &&
        measured_curve_for(cm, out->dp_curve_type, config->dp);
    /* the last stage's: its first node's own link */
    out->next_link = slot_link(c, lane, first_slot, first_slot);
    out->next_curve_type = -1;
    return 0;
}

int costmodel_place_stage(const costmodel *cm, const parallel_config *config,
                          const node_lane *lane, int stage, bool next_known,
                          stage_placement *out, pt_error *err)
{
    if (costmodel_check_degrees(config, err) != 0)
        return -1;
    long long stage_gpus = (long long)config->dp * config->tp;
    long long first = stage * stage_gpus;
    bool last = stage == config->pp - 1;
    long long end = first + (last || !next_known ? 1 : 2) * stage_gpus;
    if (check_lane_covers(lane, first, end, stage, err) != 0 ||
        place_own(cm, config, lane, first, out, err) != 0)
        return -1;
    if (last)
        return 0;
    if (!next_known) {
        out->next_link = (link_spec){INFINITY, 0.0};
        out->next_curve_type = -1;
    } else {
        out->next_link = pair_links(cm->cluster, lane, first, stage_gpus,
                                    stage_gpus, &out->next_curve_type);
    }
    return 0;
}

/* The slowest link between any GPU of [a, a + a_count) and any of
 * [b, b + b_count): what a re-sharding boundary's transfers cross (every
 * receiving GPU may take a piece from any sending one). The type whose
 * curves apply when both ranges sit in one node, else -1. */
static link_spec range_links(const cluster *c, const node_lane *lane,
                             long long a, long long a_count, long long b,
                             long long b_count, int *curve_type)
{
    lane_cursor cursor = {lane, 0};
    int a_first = slot_of(&cursor, a);
    int a_last = slot_of(&cursor, a + a_count - 1);
    cursor.slot = 0;
    int b_first = slot_of(&cursor, b);
    int b_last = slot_of(&cursor, b + b_count - 1);
    link_spec slowest = slot_link(c, lane, a_first, b_first);
    for (int x = a_first; x <= a_last; x++)
        for (int y = b_first; y <= b_last; y++)
            slowest = slower_link(slowest, slot_link(c, lane, x, y));
    bool one_node = a_first == a_last && b_first == b_last &&
                    a_first == b_first;
    *curve_type = one_node ? lane->types[a_first] : -1;
    return slowest;
}

/* Whether two stage configs split their stages alike. */
static bool same_degrees(const parallel_config *a, const parallel_config *b)
{
    return a->tp == b->tp && a->dp == b->dp;
}

int costmodel_place_stage_at(const costmodel *cm,
                             const parallel_config *own,
                             const parallel_config *next,
                             const node_lane *lane, int stage,
                             long long first, stage_placement *out,
                             pt_error *err)
{
    if (costmodel_check_degrees(own, err) != 0 ||
        (next != NULL && costmodel_check_degrees(next, err) != 0))
        return -1;
    long long own_gpus = (long long)own->dp * own->tp;
    long long next_gpus = next != NULL ? (long long)next->dp * next->tp : 0;
    if (check_lane_covers(lane, first, first + own_gpus + next_gpus, stage,
                          err) != 0 ||
        place_own(cm, own, lane, first, out, err) != 0)
        return -1;
    if (next == NULL)
        return 0;
    if (same_degrees(own, next))
        out->next_link = pair_links(cm->cluster, lane, first, own_gpus,
                                    own_gpus, &out->next_curve_type);
    else
        out->next_link = range_links(cm->cluster, lane, first, own_gpus,
                                     first + own_gpus, next_gpus,
                                     &out->next_curve_type);
    return 0;
}

void costmodel_embedding_link_at(const costmodel *cm,
                                 const parallel_config *first_stage,
                                 const parallel_config *last_stage,
                                 long long last_first,
                                 const node_lane *lane, link_spec *link,
                                 int *curve_type)
{
    long long first_gpus = (long long)first_stage->dp * first_stage->tp;
    if (same_degrees(first_stage, last_stage))
        *link = pair_links(cm->cluster, lane, 0, first_gpus, last_first,
                           curve_type);
    else
        *link = range_links(cm->cluster, lane, 0, first_gpus, last_first,
                            (long long)last_stage->dp * last_stage->tp,
                            curve_type);
}

void costmodel_embedding_link(const costmodel *cm,
                              const parallel_config *config,
                              const node_lane *lane, link_spec *link,
                              int *curve_type)
{
    long long stage_gpus = (long long)config->dp * config->tp;
    *link = pair_links(cm->cluster, lane, 0, stage_gpus,
                       stage_gpus * (config->pp - 1), curve_type);
}

/* ------------------------------------------------------ whole node orders */

/* Node indices in range, each node at most once, exactly the GPUs the
 * plan needs. A mark per node makes it linear in the order's length. */
static int check_node_order(const cluster *c, const int *node_order,
                            int node_count, long long *gpus_out,
                            pt_error *err)
{
    if (!node_order || node_count <= 0)
        return pt_fail(err, "plan: node_order is empty");
    int *seen_at = malloc((size_t)c->node_count * sizeof *seen_at);
    if (!seen_at)
        return pt_fail(err, "costmodel: out of memory");
    for (int i = 0; i < c->node_count; i++)
        seen_at[i] = -1;
    long long gpus = 0;
    int rc = 0;
    for (int i = 0; i < node_count && rc == 0; i++) {
        int node = node_order[i];
        if (node < 0 || node >= c->node_count) {
            rc = pt_fail(err, "plan: node_order[%d]: node %d does not exist "
                         "(cluster %s has %d nodes)", i, node, c->name,
                         c->node_count);
        } else if (seen_at[node] >= 0) {
            char name[PT_NAME_MAX + 16];
            cluster_node_name(c, node, name, sizeof name);
            rc = pt_fail(err, "plan: node_order[%d]: node %s is already at "
                         "node_order[%d]", i, name, seen_at[node]);
        } else {
            seen_at[node] = i;
            gpus += cluster_node_gpus(c, node);
        }
    }
    free(seen_at);
    *gpus_out = gpus;
    return rc;
}

/* A symmetric plan's node order: as check_node_order, holding exactly
 * tp x dp x pp GPUs. */
static int check_symmetric_order(const cluster *c,
                                 const parallel_config *config,
                                 const int *node_order, int node_count,
                                 pt_error *err)
{
    long long gpus = 0;
    if (check_node_order(c, node_order, node_count, &gpus, err) != 0)
        return -1;
    long long needed = (long long)config->tp * config->dp * config->pp;
    if (gpus != needed)
        return pt_fail(err, "plan: node_order gives %lld GPUs but tp x dp x "
                       "pp = %d x %d x %d needs %lld", gpus, config->tp,
                       config->dp, config->pp, needed);
    return 0;
}

int costmodel_lane_open(const cluster *c, const int *node_order,
                        int node_count, node_lane *lane, int **storage,
                        pt_error *err)
{
    int *block = malloc(((size_t)2 * node_count + 1) * sizeof *block);
    if (!block)
        return pt_fail(err, "costmodel: out of memory");
    int *types = block, *starts = block + node_count;
    starts[0] = 0;
    for (int i = 0; i < node_count; i++) {
        types[i] = cluster_node_type(c, node_order[i]);
        starts[i + 1] = starts[i] + cluster_node_gpus(c, node_order[i]);
    }
    *lane = (node_lane){node_count, types, starts};
    *storage = block;
    return 0;
}

int costmodel_place_order(const costmodel *cm, const parallel_config *config,
                          const int *node_order, int node_count,
                          stage_placement *placement, node_lane *lane,
                          int **storage, pt_error *err)
{
    *storage = NULL;
    if (costmodel_check_degrees(config, err) != 0 ||
        check_symmetric_order(cm->cluster, config, node_order, node_count,
                              err) != 0 ||
        costmodel_lane_open(cm->cluster, node_order, node_count, lane, storage,
                            err) != 0)
        return -1;
    for (int s = 0; s < config->pp; s++) {
        if (costmodel_place_stage(cm, config, lane, s, true, &placement[s],
                                  err) != 0) {
            free(*storage);
            *storage = NULL;
            return -1;
        }
    }
    return 0;
}

int costmodel_place_order_stages(const costmodel *cm,
                                 const stage_layout *stages,
                                 const int *node_order, int node_count,
                                 stage_placement *placement, node_lane *lane,
                                 int **storage, pt_error *err)
{
    int pp = stages->pp;
    const parallel_config *configs = stages->configs;
    const long long *firsts = stages->firsts;
    *storage = NULL;
    long long gpus = 0;
    if (check_node_order(cm->cluster, node_order, node_count, &gpus, err) !=
        0)
        return -1;
    if (gpus != firsts[pp])
        return pt_fail(err, "plan: node_order gives %lld GPUs but the "
                       "stages' tp x dp sum to %lld", gpus, firsts[pp]);
    if (costmodel_lane_open(cm->cluster, node_order, node_count, lane,
                            storage, err) != 0)
        return -1;
    for (int s = 0; s < pp; s++) {
        if (costmodel_place_stage_at(cm, &configs[s],
                                     s + 1 < pp ? &configs[s + 1] : NULL,
                                     lane, s, firsts[s], &placement[s],
                                     err) != 0) {
            free(*storage);
            *storage = NULL;
            return -1;
        }
    }
    return 0;
}

int costmodel_place(const costmodel *cm, const parallel_config *config,
                    const int *node_order, int node_count,
                    stage_placement *placement, pt_error *err)
{
    node_lane lane;
    int *storage = NULL;
    int rc = costmodel_place_order(cm, config, node_order, node_count,
                                   placement, &lane, &storage, err);
    free(storage);
    return rc;
}
