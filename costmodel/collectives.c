/*
 * Closed forms of the collectives on one link (docs/cost-model.md,
 * "Communication"). A ring of n members moves 2(n-1)/n of the buffer
 * through the slowest link for an all-reduce and pays 2(n-1) latencies;
 * a reduce-scatter or an all-gather is half of that.
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
