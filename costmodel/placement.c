/*
 * Placement: which node holds each rank of a plan, and what that means
 * for every pipeline stage (its pace, its memory cap, its links).
 * rank = t + tp x (d + dp x s); ranks fill the node order's GPUs in order.
 */
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

static int node_gpus(const cluster *c, int node)
{
    return c->types[cluster_node_type(c, node)].gpus;
}

/* Node indices in range, each node at most once, exactly the GPUs the
 * plan needs. */
static int check_node_order(const cluster *c, const parallel_config *config,
                            const int *node_order, int node_count,
                            pt_error *err)
{
    if (!node_order || node_count <= 0)
        return pt_fail(err, "plan: node_order is empty");
    long long gpus = 0;
    for (int i = 0; i < node_count; i++) {
        int node = node_order[i];
        if (node < 0 || node >= c->node_count)
            return pt_fail(err, "plan: node_order[%d]: node %d does not "
                           "exist (cluster %s has %d nodes)", i, node,
                           c->name, c->node_count);
        for (int j = 0; j < i; j++) {
            if (node_order[j] == node) {
                char name[PT_NAME_MAX + 16];
                cluster_node_name(c, node, name, sizeof name);
                return pt_fail(err, "plan: node_order[%d]: node %s is "
                               "already at node_order[%d]", i, name, j);
            }
        }
        gpus += node_gpus(c, node);
    }
    long long needed = (long long)config->tp * config->dp * config->pp;
    if (gpus != needed)
        return pt_fail(err, "plan: node_order gives %lld GPUs but tp x dp x "
                       "pp = %d x %d x %d needs %lld", gpus, config->tp,
                       config->dp, config->pp, needed);
    return 0;
}

/* Fills group_node: tensor-parallel groups take tp consecutive GPUs of
 * the current node and never straddle two. */
static int assign_groups(const cluster *c, const parallel_config *config,
                         const int *node_order, int *group_node,
                         pt_error *err)
{
    int position = 0, used = 0;
    int groups = config->dp * config->pp;
    for (int g = 0; g < groups; g++) {
        int node = node_order[position];
        int gpus = node_gpus(c, node);
        if (gpus - used < config->tp) {
            char name[PT_NAME_MAX + 16];
            cluster_node_name(c, node, name, sizeof name);
            return pt_fail(err, "plan: the tp group of ranks %d..%d would "
                           "straddle nodes (node %s has %d GPUs, %d of them "
                           "free); tp must divide each node's GPUs",
                           g * config->tp, g * config->tp + config->tp - 1,
                           name, gpus, gpus - used);
        }
        group_node[g] = node;
        used += config->tp;
        if (used == gpus) {
            position++;
            used = 0;
        }
    }
    return 0;
}

/* The type a stage runs at (largest layer fwd+bwd) and the type that caps
 * its memory (least usable memory). */
static int stage_types(const costmodel *cm, const parallel_config *config,
                       const int *stage_groups, stage_placement *out,
                       pt_error *err)
{
    const cluster *c = cm->cluster;
    double slowest = -1.0, smallest = 0.0;
    int previous_type = -1;
    for (int d = 0; d < config->dp; d++) {
        int type = cluster_node_type(c, stage_groups[d]);
        if (type == previous_type)
            continue;
        previous_type = type;
        type_costs costs;
        if (costmodel_price_type(cm, type, config, NULL, &costs, err) != 0)
            return -1;
        double layer_s = costs.layer_forward_s + costs.layer_backward_s;
        if (layer_s > slowest) {
            slowest = layer_s;
            out->slow_type = type;
        }
        if (d == 0 || costs.memory_cap_bytes < smallest) {
            smallest = costs.memory_cap_bytes;
            out->small_type = type;
        }
    }
    return 0;
}

/* Slowest link a ring over the dp group crosses: the intra-node link of
 * a node holding two members, the inter-node link between neighbours. */
static link_spec dp_group_link(const cluster *c, const int *stage_groups,
                               int dp)
{
    link_spec slowest = cluster_link(c, stage_groups[0], stage_groups[0]);
    bool any = dp == 1;
    for (int d = 1; d < dp; d++) {
        link_spec link = cluster_link(c, stage_groups[d - 1], stage_groups[d]);
        slowest = any ? slower_link(slowest, link) : link;
        any = true;
    }
    return slowest;
}

int costmodel_place_groups(const costmodel *cm, const parallel_config *config,
                           const int *node_order, int node_count,
                           int *group_node, stage_placement *placement,
                           pt_error *err)
{
    const cluster *c = cm->cluster;
    if (costmodel_check_degrees(config, err) != 0 ||
        check_node_order(c, config, node_order, node_count, err) != 0 ||
        assign_groups(c, config, node_order, group_node, err) != 0)
        return -1;
    int dp = config->dp, pp = config->pp;
    for (int s = 0; s < pp; s++) {
        const int *groups = &group_node[dp * s];
        stage_placement *place = &placement[s];
        place->first_node = groups[0];
        place->last_node = groups[dp - 1];
        place->dp_spans_nodes = groups[0] != groups[dp - 1];
        place->dp_link = dp_group_link(c, groups, dp);
        place->dp_curve_type = place->dp_spans_nodes
                                   ? -1
                                   : cluster_node_type(c, groups[0]);
        place->next_curve_type = -1;
        if (stage_types(cm, config, groups, place, err) != 0)
            return -1;
        if (s == pp - 1) {
            place->next_link = cluster_link(c, groups[0], groups[0]);
            continue;
        }
        /* replica d of stage s sends to replica d of stage s + 1 */
        const int *next = &group_node[dp * (s + 1)];
        place->next_link = cluster_link(c, groups[0], next[0]);
        for (int d = 1; d < dp; d++)
            place->next_link = slower_link(place->next_link,
                                           cluster_link(c, groups[d], next[d]));
        place->next_curve_type = costmodel_pairs_curve_type(c, groups, next,
                                                            dp);
    }
    return 0;
}

int costmodel_pairs_curve_type(const cluster *c, const int *from_nodes,
                               const int *to_nodes, int pairs)
{
    int type = cluster_node_type(c, from_nodes[0]);
    for (int d = 0; d < pairs; d++)
        if (from_nodes[d] != to_nodes[d] ||
            cluster_node_type(c, from_nodes[d]) != type)
            return -1;
    return type;
}

int costmodel_place(const costmodel *cm, const parallel_config *config,
                    const int *node_order, int node_count,
                    stage_placement *placement, pt_error *err)
{
    if (costmodel_check_degrees(config, err) != 0)
        return -1;
    int *group_node = malloc((size_t)config->dp * config->pp *
                             sizeof *group_node);
    if (!group_node)
        return pt_fail(err, "costmodel: out of memory");
    int rc = costmodel_place_groups(cm, config, node_order, node_count,
                                    group_node, placement, err);
    free(group_node);
    return rc;
}
