/*
 * The collectives as NCCL runs them (docs/cost-model.md, section 2): an
 * alpha-beta model per algorithm (alpha: one step's latency, beta: the
 * bytes each rank pushes through the slowest link), ring and tree
 * all-reduce chosen by the smaller time as NCCL's tuner does, and the
 * hierarchical all-reduce of a group spread over nodes (reduce-scatter
 * inside each node, all-reduce between the nodes, all-gather inside).
 */
#include <math.h>

#include "costmodel/internal.h"

/* Seconds to push `bytes` through a link's bandwidth; a link without
 * bandwidth never delivers (the plan then loses every comparison). */
static double bandwidth_time(double bytes, link_spec link)
{
    if (bytes <= 0.0)
        return 0.0;
    if (link.bandwidth_bytes_per_s <= 0.0)
        return HUGE_VAL;
    return bytes / link.bandwidth_bytes_per_s;
}

double allreduce_time(double bytes, int members, link_spec link)
{
    if (members <= 1 || bytes <= 0.0)
        return 0.0;
    double n = members;
    return 2.0 * (n - 1.0) / n * bandwidth_time(bytes, link) +
           2.0 * (n - 1.0) * link.latency_s;
}

int tree_allreduce_steps(int members)
{
    int depth = 0;
    while ((1 << depth) < members)
        depth++;
    return 2 * depth;
}

/* NCCL's double binary tree: every rank is an inner node of one tree
 * and a leaf of the other, each tree carries half of the buffer, so a
 * rank sends (and receives) the whole buffer twice, once up (reduce) and
 * once down (broadcast); the pipeline is as deep as the trees, 2 ceil(log2
 * n) steps. */
double tree_allreduce_time(double bytes, int members, link_spec link)
{
    if (members <= 1 || bytes <= 0.0)
        return 0.0;
    return 2.0 * bandwidth_time(bytes, link) +
           tree_allreduce_steps(members) * link.latency_s;
}

double reduce_scatter_time(double bytes, int members, link_spec link)
{
    if (members <= 1 || bytes <= 0.0)
        return 0.0;
    double n = members;
    return (n - 1.0) / n * bandwidth_time(bytes, link) +
           (n - 1.0) * link.latency_s;
}

double p2p_time(double bytes, link_spec link)
{
    if (bytes <= 0.0)
        return 0.0;
    return link.latency_s + bandwidth_time(bytes, link);
}

link_spec slower_link(link_spec a, link_spec b)
{
    if (a.bandwidth_bytes_per_s != b.bandwidth_bytes_per_s)
        return a.bandwidth_bytes_per_s < b.bandwidth_bytes_per_s ? a : b;
    return a.latency_s >= b.latency_s ? a : b;
}

const char *allreduce_algorithm_name(allreduce_algorithm algorithm)
{
    switch (algorithm) {
    case ALLREDUCE_RING: return "ring";
    case ALLREDUCE_TREE: return "tree";
    case ALLREDUCE_HIERARCHICAL_RING: return "hierarchical (ring between nodes)";
    case ALLREDUCE_HIERARCHICAL_TREE: return "hierarchical (tree between nodes)";
    }
    return "unknown";
}

/* Members per node of a group spread evenly over nodes; 0 when it is not
 * (then it is priced flat over its slowest link). */
static int members_per_node(const comm_group *group)
{
    if (group->nodes <= 1 || group->members % group->nodes != 0)
        return 0;
    return group->members / group->nodes;
}

/* The link a ring (or tree) through every rank of a group spread over
 * nodes runs at: NCCL spreads its channels over the node's rails, so
 * with g members a node (each with its own NIC) the network carries g
 * times one NIC's bandwidth, up to the intra-node link; its latency is
 * the network's. One member a node (or spread unevenly): the slowest
 * link. */
static link_spec ring_link(const comm_group *group, int per_node)
{
    if (per_node < 2)
        return per_node == 1 ? group->inter
                             : slower_link(group->intra, group->inter);
    link_spec link = group->inter;
    link.bandwidth_bytes_per_s =
        fmin(group->intra.bandwidth_bytes_per_s,
             per_node * group->inter.bandwidth_bytes_per_s);
    return link;
}

comm_price nccl_allreduce(double bytes, const comm_group *group)
{
    comm_price best = {0.0, ALLREDUCE_RING};
    int n = group->members;
    if (n <= 1 || bytes <= 0.0)
        return best;
    if (group->nodes <= 1) {
        /* inside one node NCCL rings (its tree is a chain there) */
        best.seconds = allreduce_time(bytes, n, group->intra);
        return best;
    }
    /* over nodes: a ring or a tree through every rank, or, spread evenly,
       the hierarchy of reduce-scatter, all-reduce between the nodes and
       all-gather, one after the other */
    int per_node = members_per_node(group);
    link_spec through = ring_link(group, per_node);
    best.seconds = allreduce_time(bytes, n, through);
    double tree = tree_allreduce_time(bytes, n, through);
    if (tree < best.seconds)
        best = (comm_price){tree, ALLREDUCE_TREE};
    if (per_node >= 1) {
        int nodes = group->nodes;
        double inside = 2.0 * reduce_scatter_time(bytes, per_node,
                                                  group->intra);
        double shard = bytes / per_node;
        double ring = inside + allreduce_time(shard, nodes, group->inter);
        double over_tree = inside + tree_allreduce_time(shard, nodes,
                                                        group->inter);
        if (ring < best.seconds)
            best = (comm_price){ring, ALLREDUCE_HIERARCHICAL_RING};
        if (over_tree < best.seconds)
            best = (comm_price){over_tree, ALLREDUCE_HIERARCHICAL_TREE};
    }
    return best;
}

double nccl_reduce_scatter(double bytes, const comm_group *group)
{
    int n = group->members;
    if (n <= 1 || bytes <= 0.0)
        return 0.0;
    if (group->nodes <= 1)
        return reduce_scatter_time(bytes, n, group->intra);
    int per_node = members_per_node(group);
    double flat = reduce_scatter_time(bytes, n, ring_link(group, per_node));
    if (per_node < 1)
        return flat;
    /* inside each node first, then the node's shard between the nodes */
    double hierarchical =
        reduce_scatter_time(bytes, per_node, group->intra) +
        reduce_scatter_time(bytes / per_node, group->nodes, group->inter);
    return hierarchical < flat ? hierarchical : flat;
}

double allreduce_bus_bandwidth(double bytes, int members, double seconds)
{
    if (members <= 1 || seconds <= 0.0)
        return 0.0;
    double n = members;
    return bytes / seconds * 2.0 * (n - 1.0) / n;
}

double allreduce_floor_time(double bytes, int members, int most_per_node,
                            double intra_bandwidth, double inter_bandwidth)
{
    if (members <= 1 || bytes <= 0.0)
        return 0.0;
    double n = members;
    double fastest = fmax(intra_bandwidth, inter_bandwidth);
    if (most_per_node >= members)
        return 2.0 * (n - 1.0) / n * bytes / fastest;
    /* ring or tree through every rank: at least 2 (n-1)/n x bytes through
       its link, which carries at most most_per_node NICs' worth, up to
       the intra-node link; the hierarchy, with g <= most_per_node members
       a node: 2 (g-1)/g bytes inside, 2 (1/g - 1/n) bytes between, least
       at the largest g */
    double g = most_per_node < 1 ? 1.0 : most_per_node;
    double through = fmax(inter_bandwidth,
                          fmin(intra_bandwidth, g * inter_bandwidth));
    double flat = 2.0 * (n - 1.0) / n * bytes / through;
    double hierarchical = 2.0 * (g - 1.0) / g * bytes / intra_bandwidth +
                          2.0 * (1.0 / g - 1.0 / n) * bytes / inter_bandwidth;
    return fmin(flat, hierarchical);
}
