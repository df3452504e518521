/*
 * Inputs of the planner tests: the bundled model and cluster files (found
 * through $PARTITA_SOURCE, which the test environment sets), the cost
 * model opened on them, and a small three-type cluster written inline.
 */
#ifndef PARTITA_TEST_PLANNER_FIXTURES_H
#define PARTITA_TEST_PLANNER_FIXTURES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"

static inline const char *source_root(void)
{
    const char *root = getenv("PARTITA_SOURCE");
    return root && *root ? root : ".";
}

static inline const char *profile_root(char *out, size_t size)
{
    pt_resolve_path(source_root(), "profiles", out, size);
    return out;
}

/* Loads models/<name>.json and clusters/<name>.json; fails the test on
 * error. */
static inline void load_inputs(const char *model_name,
                               const char *cluster_name, model_shape *model,
                               cluster *c)
{
    char relative[256], path[PT_PATH_MAX];
    pt_error err = {{0}};
    snprintf(relative, sizeof relative, "models/%s.json", model_name);
    pt_resolve_path(source_root(), relative, path, sizeof path);
    if (model_load_file(path, model, &err) != 0)
        fail_msg("%s", err.message);
    snprintf(relative, sizeof relative, "clusters/%s.json", cluster_name);
    pt_resolve_path(source_root(), relative, path, sizeof path);
    if (cluster_load_file(path, c, &err) != 0)
        fail_msg("%s", err.message);
}

/* A model, a cluster and the cost model opened on them: the state of a
 * test of the search (search_fixture_open as its setup, _close as its
 * teardown). */
typedef struct search_fixture {
    model_shape model;
    cluster cluster;
    costmodel cm;
    char profiles[PT_PATH_MAX];
} search_fixture;

static inline int search_fixture_open(void **state, const char *model_name,
                                      const char *cluster_name)
{
    search_fixture *f = calloc(1, sizeof *f);
    load_inputs(model_name, cluster_name, &f->model, &f->cluster);
    profile_root(f->profiles, sizeof f->profiles);
    pt_error err = {{0}};
    if (costmodel_open(&f->cm, &f->model, &f->cluster, f->profiles, &err) !=
        0)
        fail_msg("%s", err.message);
    *state = f;
    return 0;
}

static inline int search_fixture_close(void **state)
{
    search_fixture *f = *state;
    costmodel_close(&f->cm);
    cluster_free(&f->cluster);
    free(f);
    return 0;
}

/* Parses a cluster written inline; fails the test on error. */
static inline void cluster_from_text(const char *text, const char *name,
                                     cluster *c)
{
    json_error_t parse_error;
    json_t *root = json_loads(text, 0, &parse_error);
    assert_non_null(root);
    json_place place = {name, ""};
    pt_error err = {{0}};
    if (cluster_from_json(root, &place, c, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
}

/* One A100 node of 4 GPUs, two A10 nodes of 4 and two half-size A10
 * nodes of 2 behind a slower network: GPU counts and links differ between
 * types, which is what node-order deduplication has to get right. */
static inline void load_mixed_cluster(cluster *c)
{
    static const char *text =
        "{\"name\": \"mixed\", \"nodes\": ["
        "{\"name\": \"big\", \"count\": 1, \"gpu\": \"A100-FASOP\", "
        "\"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": 230, "
        "\"latency_us\": 5}, \"inter_node\": {\"bandwidth_Gbps\": 400, "
        "\"latency_us\": 20}, \"price_per_hour\": 30},"
        "{\"name\": \"mid\", \"count\": 2, \"gpu\": \"A10-FASOP\", "
        "\"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": 16, "
        "\"latency_us\": 10}, \"inter_node\": {\"bandwidth_Gbps\": 100, "
        "\"latency_us\": 20}, \"price_per_hour\": 8},"
        "{\"name\": \"small\", \"count\": 2, \"gpu\": \"A10-FASOP\", "
        "\"gpus\": 2, \"intra_node\": {\"bandwidth_GBps\": 16, "
        "\"latency_us\": 10}, \"inter_node\": {\"bandwidth_Gbps\": 25, "
        "\"latency_us\": 30}, \"price_per_hour\": 4}]}";
    cluster_from_text(text, "<mixed>", c);
}

/* ------------------------------------------- random clusters (xorshift) */

typedef struct random_source {
    uint64_t state;
} random_source;

static inline uint64_t next_random(random_source *r)
{
    r->state ^= r->state << 13;
    r->state ^= r->state >> 7;
    r->state ^= r->state << 17;
    return r->state;
}

static inline int pick(random_source *r, int count)
{
    return (int)(next_random(r) % (uint64_t)count);
}

static inline double between(random_source *r, double low, double high)
{
    return low + (high - low) * (double)(next_random(r) % 10000) / 10000.0;
}

/* A random cluster as JSON text, named "<prefix>-<index>": `types` node
 * types sharing `nodes` nodes (each type at least one), the GPUs of a
 * node drawn from sizes[size_count], each type a random GPU among the
 * derived A10, RTX 3090, A100 and V100 profiles, random links and
 * prices. */
static inline void random_cluster_json(random_source *r, const char *prefix,
                                       int index, int types, int nodes,
                                       const int *sizes, int size_count,
                                       char *out, size_t size)
{
    static const char *const gpus[] = {"A10", "RTX3090", "A100-40GB",
                                       "V100-32GB"};
    int nodes_left = nodes;
    size_t used = (size_t)snprintf(out, size,
                                   "{\"name\": \"%s-%d\", \"nodes\": [",
                                   prefix, index);
    for (int t = 0; t < types; t++) {
        /* every type keeps at least one node for those after it */
        int count = t == types - 1
                        ? nodes_left
                        : 1 + pick(r, nodes_left - (types - 1 - t));
        nodes_left -= count;
        used += (size_t)snprintf(
            out + used, size - used,
            "%s{\"name\": \"t%d\", \"count\": %d, \"gpu\": \"%s\", "
            "\"gpus\": %d, \"intra_node\": {\"bandwidth_GBps\": %.1f, "
            "\"latency_us\": %.1f}, \"inter_node\": {\"bandwidth_Gbps\": "
            "%.1f, \"latency_us\": %.1f}, \"price_per_hour\": %.2f}",
            t > 0 ? ", " : "", t, count, gpus[pick(r, 4)],
            sizes[pick(r, size_count)], between(r, 10.0, 300.0),
            between(r, 2.0, 20.0), between(r, 10.0, 400.0),
            between(r, 5.0, 40.0), between(r, 1.0, 30.0));
    }
    snprintf(out + used, size - used, "]}");
}

/* The cluster of `text` in *c and a cost model of m over it in *cm,
 * profiles from profile_dir; fails the test on error. */
static inline void open_random_case(const char *text, const model_shape *m,
                                    const char *profile_dir, cluster *c,
                                    costmodel *cm)
{
    cluster_from_text(text, "<random>", c);
    pt_error err = {{0}};
    if (costmodel_open(cm, m, c, profile_dir, &err) != 0)
        fail_msg("%s", err.message);
}

#endif
