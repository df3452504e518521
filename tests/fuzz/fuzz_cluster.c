/* Fuzzes the cluster reader, then walks the loaded cluster with every
 * accessor the planner uses. */
#include "fuzz.h"

#include <stdlib.h>

#include "common/common.h"

/* Node instances visited at most, so a cluster of many nodes stays fast. */
enum { FUZZ_NODE_LIMIT = 64 };

static void walk_cluster(const cluster *c)
{
    int nodes = c->node_count < FUZZ_NODE_LIMIT ? c->node_count
                                                : FUZZ_NODE_LIMIT;
    char name[PT_NAME_MAX * 2];
    for (int node = 0; node < nodes; node++) {
        cluster_node_name(c, node, name, sizeof name);
        if (cluster_find_node(c, name) != node)
            abort(); /* names must be unique and round-trip */
        (void)cluster_node_type(c, node);
        (void)cluster_node_ordinal(c, node);
        (void)cluster_node_gpus(c, node);
        link_spec link = cluster_link(c, node, nodes - 1 - node);
        (void)link;
    }
    (void)cluster_gpu_count(c);
    (void)cluster_node_gpus(c, -1);
    (void)cluster_node_gpus(c, c->node_count);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t json_error;
    json_t *root = json_loadb((const char *)data, size, 0, &json_error);
    if (root == NULL)
        return 0;
    json_place place = json_place_root("fuzz-cluster.json");
    cluster c;
    pt_error err;
    if (cluster_from_json(root, &place, &c, &err) == 0) {
        walk_cluster(&c);
        cluster copy;
        if (cluster_copy(&copy, &c, &err) == 0)
            cluster_free(&copy);
        cluster_free(&c);
    }
    json_decref(root);
    return 0;
}
