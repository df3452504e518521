/* Clusters (clusters/): the bundled ones, node naming, links, errors. */
#include "test_support.h"

#include <math.h>

static void load_bundled(const char *relative, cluster *c)
{
    char path[PT_PATH_MAX];
    source_path(relative, path, sizeof path);
    pt_error err = {""};
    if (cluster_load_file(path, c, &err) != 0)
        fail_msg("%s", err.message);
}

static void test_hetero(void **state)
{
    (void)state;
    const char *files[] = {"clusters/hetero.json",
                           "clusters/fasop-gpt2xl.json"};
    for (size_t f = 0; f < 2; f++) {
        cluster c;
        load_bundled(files[f], &c);
        assert_int_equal(c.type_count, 2);
        assert_int_equal(c.node_count, 8);
        assert_int_equal(cluster_gpu_count(&c), 32);
        const node_type *a100 = &c.types[0], *a10 = &c.types[1];
        assert_string_equal(a100->name, "a100");
        assert_string_equal(a100->gpu, "A100-FASOP");
        assert_int_equal(a100->count, 1);
        assert_int_equal(a100->gpus, 4);
        assert_true(fabs(a100->intra_node.bandwidth_bytes_per_s - 230e9) < 1);
        assert_true(fabs(a100->intra_node.latency_s - 5e-6) < 1e-12);
        assert_true(fabs(a100->inter_node.bandwidth_bytes_per_s - 5e9) < 1);
        assert_true(fabs(a100->inter_node.latency_s - 20e-6) < 1e-12);
        assert_true(a100->price_per_hour == 32.7726);
        assert_string_equal(a10->gpu, "A10-FASOP");
        assert_int_equal(a10->count, 7);
        assert_true(fabs(a10->intra_node.bandwidth_bytes_per_s - 16e9) < 1);
        assert_true(a10->price_per_hour == 8.144);
        assert_int_equal(a10->device_count, 0);
        assert_true(strstr(c.source_dir, "clusters") != NULL);
        cluster_free(&c);
    }
}

static void test_other_bundled(void **state)
{
    (void)state;
    cluster c;
    load_bundled("clusters/fasop-bert.json", &c);
    assert_int_equal(c.node_count, 4);
    assert_int_equal(cluster_gpu_count(&c), 16);
    cluster_free(&c);

    load_bundled("clusters/fasop-pareto-pool.json", &c);
    assert_int_equal(c.node_count, 16);
    assert_int_equal(cluster_gpu_count(&c), 128);
    assert_true(fabs(c.types[0].inter_node.bandwidth_bytes_per_s - 50e9) < 1);
    assert_true(fabs(c.types[1].inter_node.bandwidth_bytes_per_s - 12.5e9) <
                1);
    assert_true(fabs(c.types[1].intra_node.bandwidth_bytes_per_s - 31.5e9) <
                1);
    assert_true(c.types[1].price_per_hour == 9.773);
    /* A100 to A10 runs at the slower A10 network. */
    link_spec mixed = cluster_link(&c, 0, 8);
    assert_true(fabs(mixed.bandwidth_bytes_per_s - 12.5e9) < 1);
    cluster_free(&c);
}

static void test_node_names(void **state)
{
    (void)state;
    cluster c;
    load_bundled("clusters/hetero.json", &c);
    char name[64];
    cluster_node_name(&c, 0, name, sizeof name);
    assert_string_equal(name, "a100[0]");
    cluster_node_name(&c, 4, name, sizeof name);
    assert_string_equal(name, "a10[3]");
    assert_int_equal(cluster_node_type(&c, 4), 1);
    assert_int_equal(cluster_node_ordinal(&c, 4), 3);
    assert_int_equal(cluster_node_type(&c, 8), -1);
    assert_int_equal(cluster_node_type(&c, -1), -1);
    assert_int_equal(cluster_node_gpus(&c, 7), 4);
    assert_int_equal(cluster_node_gpus(&c, 8), 0);
    for (int node = 0; node < c.node_count; node++) {
        cluster_node_name(&c, node, name, sizeof name);
        assert_int_equal(cluster_find_node(&c, name), node);
    }
    const char *unknown[] = {"a100", "a10[7]", "a10[-1]", "a10[01]",
                             "a10[ 1]", "a10[1]x", "a9[0]", "[0]", "",
                             "a10[99999999999999999999]"};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++)
        assert_int_equal(cluster_find_node(&c, unknown[i]), -1);

    link_spec same = cluster_link(&c, 2, 2);
    assert_true(fabs(same.bandwidth_bytes_per_s - 16e9) < 1);
    link_spec across = cluster_link(&c, 0, 3);
    assert_true(fabs(across.bandwidth_bytes_per_s - 5e9) < 1);
    cluster_free(&c);
}

/* A node whose GPUs share its NICs gives each GPU its share; a link named
 * for a pair of node types replaces the slower of their figures; both
 * are written back as they were read. */
static void test_nics_and_type_links(void **state)
{
    const char *json =
        "{\"name\": \"c\", \"nodes\": ["
        "{\"name\": \"big\", \"count\": 2, \"gpu\": \"A100\", \"gpus\": 8, "
        "\"intra_node\": {\"bandwidth_GBps\": 230, \"latency_us\": 5}, "
        "\"inter_node\": {\"bandwidth_Gbps\": 400, \"latency_us\": 10, "
        "\"nics\": 2}}, "
        "{\"name\": \"small\", \"count\": 2, \"gpu\": \"A10\", \"gpus\": 4, "
        "\"intra_node\": {\"bandwidth_GBps\": 16, \"latency_us\": 10}, "
        "\"inter_node\": {\"bandwidth_Gbps\": 100, \"latency_us\": 20}}], "
        "\"links\": [{\"between\": [\"small\", \"big\"], "
        "\"bandwidth_Gbps\": 25, \"latency_us\": 50}]}";
    char path[512];
    scratch_write(state, "clusters/nics.json", json, path, sizeof path);
    cluster c;
    pt_error err = {""};
    if (cluster_load_file(path, &c, &err) != 0)
        fail_msg("%s", err.message);
    /* 2 NICs of 400 Gbit/s shared by 8 GPUs: 100 Gbit/s a GPU */
    assert_true(fabs(c.types[0].inter_node.bandwidth_bytes_per_s - 12.5e9) <
                1);
    assert_int_equal(c.types[0].nics, 2);
    link_spec big_big = cluster_link(&c, 0, 1);
    assert_true(fabs(big_big.bandwidth_bytes_per_s - 12.5e9) < 1);
    link_spec across = cluster_link(&c, 1, 2);
    assert_true(fabs(across.bandwidth_bytes_per_s - 25e9 / 8) < 1);
    assert_true(fabs(across.latency_s - 50e-6) < 1e-12);
    link_spec small_small = cluster_link(&c, 2, 3);
    assert_true(fabs(small_small.bandwidth_bytes_per_s - 12.5e9) < 1);
    json_t *written = cluster_to_json(&c);
    cluster again;
    json_place place = json_place_root("written");
    assert_int_equal(cluster_from_json(written, &place, &again, &err), 0);
    assert_int_equal(again.link_count, 1);
    assert_int_equal(again.types[0].nics, 2);
    assert_true(fabs(again.types[0].inter_node.bandwidth_bytes_per_s -
                     12.5e9) < 1);
    json_decref(written);
    cluster_free(&again);
    cluster_free(&c);
}

static void test_copy_and_devices(void **state)
{
    char path[512];
    scratch_write(state, "devices.json",
                  "{\"name\": \"one-host\", \"nodes\": [{\"name\": \"h200\", "
                  "\"gpu\": \"H200\", \"gpus\": 2, "
                  "\"intra_node\": {\"bandwidth_GBps\": 450, "
                  "\"latency_us\": 3}, \"devices\": [{\"index\": 0}, "
                  "{\"index\": 1, \"sm_limit\": 40, "
                  "\"memory_limit_gib\": 40}], "
                  "\"gpu_at_rest\": \"H200-40SM-idle\"}]}",
                  path, sizeof path);
    cluster c, copy;
    pt_error err = {""};
    if (cluster_load_file(path, &c, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(c.node_count, 1);
    assert_int_equal(c.types[0].count, 1);
    assert_int_equal(c.types[0].device_count, 2);
    assert_int_equal(c.types[0].devices[1].sm_limit, 40);
    assert_true(c.types[0].devices[1].memory_limit_gib == 40.0);
    assert_true(c.types[0].price_per_hour == 0.0);
    assert_string_equal(c.source_dir, scratch_dir(state));
    assert_int_equal(cluster_copy(&copy, &c, &err), 0);
    assert_ptr_not_equal(copy.types, c.types);
    cluster_free(&c);
    assert_string_equal(copy.types[0].name, "h200");
    assert_int_equal(copy.types[0].devices[1].index, 1);
    assert_string_equal(copy.types[0].gpu_at_rest, "H200-40SM-idle");
    /* written back as it was read */
    json_t *written = cluster_to_json(&copy);
    assert_non_null(written);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(written, "nodes"),
                                           0),
                            "gpu_at_rest")),
                        "H200-40SM-idle");
    json_decref(written);
    cluster_free(&copy);
    cluster_free(&copy);
}

#define LINK "\"intra_node\": {\"bandwidth_GBps\": 16, \"latency_us\": 10}, " \
             "\"inter_node\": {\"bandwidth_Gbps\": 40, \"latency_us\": 20}"
#define NODE(name, count, gpus)                                          \
    "{\"name\": \"" name "\", \"count\": " count ", \"gpu\": \"A10\", " \
    "\"gpus\": " gpus ", " LINK "}"

typedef struct bad_cluster {
    const char *json;
    const char *message;
} bad_cluster;

static void test_bad_clusters(void **state)
{
    static const bad_cluster cases[] = {
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "1", "4") ", "
         NODE("b", "1", "0") "]}",
         "clusters/bad.json: nodes[1].gpus: must be a positive integer, "
         "got 0"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "0", "4") "]}",
         "clusters/bad.json: nodes[0].count: must be a positive integer, "
         "got 0"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "1", "4") ", "
         NODE("a", "2", "4") "]}",
         "nodes[1].name: \"a\" is already the name of nodes[0]"},
        {"{\"name\": \"c\", \"nodes\": []}",
         "clusters/bad.json: nodes: must be a non-empty array"},
        {"{\"name\": \"c\"}", "clusters/bad.json: nodes: missing (required)"},
        {"{\"name\": \"\", \"nodes\": [" NODE("a", "1", "4") "]}",
         "clusters/bad.json: name: must not be empty"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "1", "4") "], "
         "\"node\": 1}",
         "clusters/bad.json: node: unknown key"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a[1]", "1", "4") "]}",
         "nodes[0].name: node name \"a[1]\" may hold only"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"../x\", "
         "\"gpus\": 1, " LINK "}]}",
         "nodes[0].gpu: GPU name \"../x\" may hold only"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": \"4\", " LINK "}]}",
         "nodes[0].gpus: must be a positive integer, got the string \"4\""},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": 16, "
         "\"bandwidth_Gbps\": 128, \"latency_us\": 1}}]}",
         "nodes[0].intra_node: give the bandwidth exactly once"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": 0, "
         "\"latency_us\": 1}}]}",
         "nodes[0].intra_node.bandwidth_GBps: must be a number in [0.001, "
         "100000], got 0"},
        /* issue 18, item 9: values beyond physical sense, with the range */
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": 1e308, "
         "\"latency_us\": 1}}]}",
         "nodes[0].intra_node.bandwidth_GBps: must be a number in [0.001, "
         "100000], got 1e+308"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 1, " LINK ", \"price_per_hour\": 1e308}]}",
         "nodes[0].price_per_hour: must be a number in [0, 1e+06], got "
         "1e+308"},
        /* item 13: a number is shown as the file wrote it */
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 48.0, " LINK "}]}",
         "nodes[0].gpus: must be a positive integer, got 48.0"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": 10}}]}",
         "nodes[0].intra_node.latency_us: missing (required)"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 4}]}",
         "nodes[0].intra_node: missing (required)"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"count\": 2, "
         "\"gpu\": \"A\", \"gpus\": 4, \"intra_node\": "
         "{\"bandwidth_GBps\": 10, \"latency_us\": 1}}]}",
         "nodes[0].inter_node: missing (required when the cluster has more "
         "than one node; it has 2)"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 2, " LINK ", \"devices\": [{\"index\": 0}]}]}",
         "nodes[0].devices: lists 1 devices, but the node has 2 GPUs"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 1, " LINK ", \"devices\": [{\"index\": 0, "
         "\"sm\": 3}]}]}",
         "nodes[0].devices[0].sm: unknown key"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 1, " LINK ", \"gpu_at_rest\": \"A-idle\"}]}",
         "nodes[0].gpu_at_rest: only for slices of a GPU: the node lists no "
         "device with an sm_limit"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 1, " LINK ", \"devices\": [{\"index\": 0, "
         "\"sm_limit\": 16}], \"gpu_at_rest\": 3}]}",
         "nodes[0].gpu_at_rest"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": \"A\", "
         "\"gpus\": 1, " LINK ", \"price_per_hour\": -1}]}",
         "nodes[0].price_per_hour: must be a non-negative number, got -1"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "1", "4") "]",
         "clusters/bad.json:1:"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "2", "4") "], "
         "\"links\": [{\"between\": [\"a\", \"z\"], "
         "\"bandwidth_Gbps\": 10, \"latency_us\": 5}]}",
         "clusters/bad.json: links[0].between: \"z\" is not the name of a "
         "node type"},
        {"{\"name\": \"c\", \"nodes\": [" NODE("a", "2", "4") "], "
         "\"links\": [{\"between\": [\"a\", \"a\"], "
         "\"bandwidth_Gbps\": 100, \"latency_us\": 5}]}",
         "clusters/bad.json: links[0]: 100 Gbit/s is faster than a's "
         "inter_node (40 Gbit/s a GPU)"},
        {"{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"count\": 2, "
         "\"gpu\": \"A\", \"gpus\": 4, \"intra_node\": {\"bandwidth_GBps\": "
         "16, \"latency_us\": 10}, \"inter_node\": {\"bandwidth_Gbps\": 40, "
         "\"latency_us\": 20, \"nics\": 0}}]}",
         "clusters/bad.json: nodes[0].inter_node.nics: must be"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[512];
        scratch_write(state, "clusters/bad.json", cases[i].json, path,
                      sizeof path);
        cluster c;
        pt_error err = {""};
        if (cluster_load_file(path, &c, &err) == 0)
            fail_msg("case %zu loaded; expected \"%s\"", i, cases[i].message);
        EXPECT_MESSAGE(&err, cases[i].message);
        assert_null(c.types);
        cluster_free(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hetero),
        cmocka_unit_test(test_other_bundled),
        cmocka_unit_test(test_node_names),
        cmocka_unit_test(test_copy_and_devices),
        cmocka_unit_test(test_nics_and_type_links),
        cmocka_unit_test(test_bad_clusters),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
