/*
 * A ranked plan of the search as a plan (common/'s struct), ready for
 * plan_write_file; the plan format itself belongs to common/plan.c.
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

int plan_from_ranked(const ranked_plan *ranked, const model_shape *model,
                     const cluster *source_cluster, const char *model_origin,
                     const char *cluster_origin, plan *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (ranked->config.pp > PT_MAX_STAGES)
        return pt_fail(err, "plan has %d stages, at most %d are supported",
                       ranked->config.pp, PT_MAX_STAGES);
    out->model = *model;
    if (cluster_copy(&out->cluster, source_cluster, err) != 0)
        return -1;
    pt_copy_string(out->model_origin, sizeof out->model_origin,
                   model_origin ? model_origin : "");
    pt_copy_string(out->cluster_origin, sizeof out->cluster_origin,
                   cluster_origin ? cluster_origin : "");
    out->config = ranked->config;
    memcpy(out->partition, ranked->partition,
           sizeof(int) * (size_t)ranked->config.pp);
    memcpy(out->stages, ranked->stages,
           sizeof(stage_degrees) * (size_t)ranked->config.pp);
    out->node_order = malloc(sizeof(int) * (size_t)ranked->node_count);
    if (out->node_order == NULL) {
        cluster_free(&out->cluster);
        return pt_fail(err, "out of memory copying the node order");
    }
    memcpy(out->node_order, ranked->node_order,
           sizeof(int) * (size_t)ranked->node_count);
    out->node_order_count = ranked->node_count;
    return 0;
}
