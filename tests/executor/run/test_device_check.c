/*
 * The plan against this machine's GPUs, before any allocation
 * (device_check_plan): made-up device lists stand in for the CUDA
 * runtime, so every disagreement is checked without a GPU, each with a
 * message that names the rank, the cluster's GPU type, the device and the
 * numbers.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "executor/executor.h"

#define H200_BYTES (139.8 * PT_GIB)
#define H200_SMS 132

/* A plan of a tiny model: gbs 8, mbs 1, the degrees given, on the
 * cluster's nodes in file order. nodes_json is the "nodes" array. */
static void load_plan(plan *out, const char *nodes_json, int tp, int dp,
                      int pp)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{ \"model\": { \"name\": \"tiny\", \"layers\": 4, "
             "\"hidden\": 16, \"heads\": 2, \"seq\": 16, \"vocab\": 257 },"
             "  \"cluster\": { \"name\": \"test\", \"nodes\": %s },"
             "  \"gbs\": 8, \"mbs\": 1, \"tp\": %d, \"dp\": %d, \"pp\": %d }",
             nodes_json, tp, dp, pp);
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    if (root == NULL)
        fail_msg("test plan is not JSON: %s", json_err.text);
    pt_error err = {{0}};
    if (plan_from_json(root, "plan.json", out, &err) != 0)
        fail_msg("test plan refused: %s", err.message);
    json_decref(root);
}

#define LINK "\"intra_node\": { \"bandwidth_GBps\": 900, \"latency_us\": 2 }," \
             "\"inter_node\": { \"bandwidth_GBps\": 900, \"latency_us\": 2 }"

/* The 2 x H200 machine posing as a heterogeneous cluster: one full H200
 * and one throttled to 40 SMs and 40 GiB, joined by NVLink. */
static const char *emulated_nodes =
    "[ { \"name\": \"h200\", \"gpu\": \"H200\", \"gpus\": 1, " LINK ","
    "    \"devices\": [ { \"index\": 0 } ] },"
    "  { \"name\": \"h200x2\", \"gpu\": \"H200-40SM\", \"gpus\": 1, " LINK ","
    "    \"devices\": [ { \"index\": 1, \"sm_limit\": 40,"
    "                     \"memory_limit_gib\": 40 } ] } ]";

static local_device h200(int index, double free_gib)
{
    local_device d = {.index = index,
                      .total_memory_bytes = H200_BYTES,
                      .free_memory_bytes = free_gib * PT_GIB,
                      .multiprocessors = H200_SMS};
    snprintf(d.name, sizeof d.name, "NVIDIA H200");
    return d;
}

static void expect_refusal(const plan *p, const local_device *devices,
                           int device_count, const double *needed,
                           const char *message)
{
    pt_error err = {{0}};
    assert_int_equal(device_check_plan(p, devices, device_count, needed,
                                       &err), -1);
    if (strstr(err.message, message) == NULL)
        fail_msg("expected \"%s\" in \"%s\"", message, err.message);
}

static void gpu_names_match_by_type(void **state)
{
    (void)state;
    assert_true(gpu_name_matches("H200", "NVIDIA H200"));
    assert_true(gpu_name_matches("h200-40SM", "NVIDIA H200"));
    assert_true(gpu_name_matches("H100", "NVIDIA H100 80GB HBM3"));
    assert_true(gpu_name_matches("A100-40GB", "NVIDIA A100-SXM4-40GB"));
    assert_true(gpu_name_matches("A100-FASOP", "NVIDIA A100-PCIE-40GB"));
    assert_true(gpu_name_matches("A10", "NVIDIA A10"));
    assert_true(gpu_name_matches("V100", "Tesla V100-SXM2-16GB"));
    assert_true(gpu_name_matches("RTX3090", "NVIDIA GeForce RTX 3090"));
    assert_true(gpu_name_matches("rtx_3090", "NVIDIA GeForce RTX 3090"));
    assert_true(gpu_name_matches("RTX-3090-24SM", "NVIDIA GeForce RTX 3090"));
    /* a word, not a substring: an A10 is not an A100 */
    assert_false(gpu_name_matches("A10", "NVIDIA A100-SXM4-40GB"));
    assert_false(gpu_name_matches("A10-FASOP", "NVIDIA A100 80GB PCIe"));
    assert_false(gpu_name_matches("H100", "NVIDIA H200"));
    assert_false(gpu_name_matches("RTX-4090", "NVIDIA GeForce RTX 3090"));
    assert_false(gpu_name_matches("H200", "NVIDIA H200X"));
    assert_false(gpu_name_matches("-40SM", "NVIDIA H200"));
    assert_false(gpu_name_matches("H200", ""));
}

static void ranks_map_to_listed_devices(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, emulated_nodes, 1, 1, 2);
    device_spec spec;
    assert_int_equal(plan_rank_device(&p, 0, &spec), 0);
    assert_int_equal(spec.index, 0);
    assert_int_equal(spec.sm_limit, 0);
    assert_int_equal(plan_rank_device(&p, 1, &spec), 0);
    assert_int_equal(spec.index, 1);
    assert_int_equal(spec.sm_limit, 40);
    assert_true(spec.memory_limit_gib == 40.0);
    assert_int_equal(plan_rank_device(&p, 2, &spec), -1);
    assert_int_equal(plan_rank_device(&p, -1, &spec), -1);
    plan_free(&p);

    /* no device list: rank r on device r */
    load_plan(&p, "[ { \"name\": \"box\", \"gpu\": \"H200\", \"gpus\": 4, "
                  LINK " } ]", 1, 2, 2);
    for (int rank = 0; rank < 4; rank++) {
        assert_int_equal(plan_rank_device(&p, rank, &spec), 0);
        assert_int_equal(spec.index, rank);
        assert_int_equal(spec.sm_limit, 0);
    }
    plan_free(&p);
}

static void a_plan_that_fits_passes(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, emulated_nodes, 1, 1, 2);
    local_device devices[] = {h200(0, 139.0), h200(1, 139.0)};
    double needed[] = {60.0 * PT_GIB, 39.5 * PT_GIB};
    pt_error err = {{0}};
    if (device_check_plan(&p, devices, 2, needed, &err) != 0)
        fail_msg("%s", err.message);
    /* without the memory figures only the rest is checked */
    assert_int_equal(device_check_plan(&p, devices, 2, NULL, &err), 0);
    plan_free(&p);
}

static void too_few_devices_are_refused(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, "[ { \"name\": \"box\", \"gpu\": \"H200\", \"gpus\": 4, "
                  LINK " } ]", 2, 1, 2);
    local_device devices[] = {h200(0, 139.0), h200(1, 139.0)};
    expect_refusal(&p, devices, 2, NULL,
                   "the plan needs 4 GPUs (pp 2 x dp 1 x tp 2), this machine "
                   "has 2");
    expect_refusal(&p, devices, 0, NULL, "this machine has 0");
    /* a node order that provides fewer GPUs than the degrees ask for */
    p.config.dp = 2;
    expect_refusal(&p, devices, 2, NULL,
                   "the plan needs 8 GPUs (pp 2 x dp 2 x tp 2), its node "
                   "order provides 4");
    plan_free(&p);

    /* a device list naming a device this machine lacks */
    load_plan(&p, emulated_nodes, 1, 1, 2);
    expect_refusal(&p, devices, 1, NULL,
                   "rank 1 (stage 1, H200-40SM on node h200x2[0] device 1): "
                   "this machine has no device 1 (it has 1 device)");
    plan_free(&p);
}

static void a_rank_short_of_memory_is_named(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, emulated_nodes, 1, 1, 2);
    double needed[] = {30.0 * PT_GIB, 61.2 * PT_GIB};
    /* device 1 has room for it, but the rank's own cap does not */
    local_device roomy[] = {h200(0, 139.0), h200(1, 139.0)};
    expect_refusal(&p, roomy, 2, needed,
                   "rank 1 (stage 1, H200-40SM on node h200x2[0] device 1) "
                   "needs 61.2 GiB, its memory_limit_gib allows 40.0 GiB");
    /* without the cap, the device's free memory decides */
    p.cluster.types[1].devices[0].memory_limit_gib = 0;
    local_device busy[] = {h200(0, 139.0), h200(1, 58.0)};
    expect_refusal(&p, busy, 2, needed,
                   "rank 1 (stage 1, H200-40SM on node h200x2[0] device 1) "
                   "needs 61.2 GiB, device 1 NVIDIA H200 has 58.0 GiB free");
    plan_free(&p);
}

static void a_device_of_another_type_is_refused(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, "[ { \"name\": \"a100\", \"gpu\": \"A100-40GB\", "
                  "\"gpus\": 2, " LINK " } ]", 1, 2, 1);
    local_device devices[] = {h200(0, 139.0), h200(1, 139.0)};
    expect_refusal(&p, devices, 2, NULL,
                   "rank 0 (stage 0, A100-40GB on node a100[0] device 0): "
                   "the cluster file says A100-40GB, but device 0 is NVIDIA "
                   "H200");
    snprintf(devices[0].name, sizeof devices[0].name,
             "NVIDIA A100-SXM4-40GB");
    expect_refusal(&p, devices, 2, NULL, "rank 1 (stage 0, A100-40GB on "
                                         "node a100[0] device 1)");
    snprintf(devices[1].name, sizeof devices[1].name,
             "NVIDIA A100-SXM4-40GB");
    pt_error err = {{0}};
    assert_int_equal(device_check_plan(&p, devices, 2, NULL, &err), 0);
    plan_free(&p);
}

static void limits_beyond_the_device_are_refused(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, emulated_nodes, 1, 1, 2);
    local_device devices[] = {h200(0, 139.0), h200(1, 139.0)};
    p.cluster.types[1].devices[0].sm_limit = 200;
    expect_refusal(&p, devices, 2, NULL,
                   "rank 1 (stage 1, H200-40SM on node h200x2[0] device 1): "
                   "sm_limit 200 SMs, but device 1 NVIDIA H200 has 132 SMs");
    p.cluster.types[1].devices[0].sm_limit = 40;
    p.cluster.types[1].devices[0].memory_limit_gib = 150;
    expect_refusal(&p, devices, 2, NULL,
                   "rank 1 (stage 1, H200-40SM on node h200x2[0] device 1): "
                   "memory_limit_gib 150 GiB, but device 1 NVIDIA H200 has "
                   "140 GiB");
    plan_free(&p);
}

/* Two emulated GPUs on one device: what they ask for together. */
static void ranks_sharing_a_device_are_checked_together(void **state)
{
    (void)state;
    plan p;
    load_plan(&p, "[ { \"name\": \"half\", \"gpu\": \"H200-60SM\", "
                  "\"gpus\": 2, " LINK ", \"devices\": ["
                  "  { \"index\": 0, \"sm_limit\": 60, "
                  "    \"memory_limit_gib\": 60 },"
                  "  { \"index\": 0, \"sm_limit\": 60, "
                  "    \"memory_limit_gib\": 60 } ] } ]", 1, 1, 2);
    local_device devices[] = {h200(0, 100.0)};
    double needed[] = {45.0 * PT_GIB, 50.0 * PT_GIB};
    pt_error err = {{0}};
    if (device_check_plan(&p, devices, 1, needed, &err) != 0)
        fail_msg("%s", err.message);
    needed[1] = 59.0 * PT_GIB;
    expect_refusal(&p, devices, 1, needed,
                   "ranks 0, 1 share device 0 NVIDIA H200 and need 104 GiB "
                   "together, it has 100 GiB free");
    p.cluster.types[0].devices[1].sm_limit = 80;
    expect_refusal(&p, devices, 1, NULL,
                   "ranks 0, 1 share device 0 NVIDIA H200 with sm_limit 140 "
                   "SMs together, it has 132 SMs");
    p.cluster.types[0].devices[1].sm_limit = 60;
    p.cluster.types[0].devices[1].memory_limit_gib = 90;
    expect_refusal(&p, devices, 1, NULL,
                   "ranks 0, 1 share device 0 NVIDIA H200 with "
                   "memory_limit_gib 150 GiB together, it has 140 GiB");
    /* ranks without SM limits time-share the whole device */
    p.cluster.types[0].devices[0].sm_limit = 0;
    p.cluster.types[0].devices[1].sm_limit = 0;
    p.cluster.types[0].devices[1].memory_limit_gib = 60;
    assert_int_equal(device_check_plan(&p, devices, 1, NULL, &err), 0);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpu_names_match_by_type),
        cmocka_unit_test(ranks_map_to_listed_devices),
        cmocka_unit_test(a_plan_that_fits_passes),
        cmocka_unit_test(too_few_devices_are_refused),
        cmocka_unit_test(a_rank_short_of_memory_is_named),
        cmocka_unit_test(a_device_of_another_type_is_refused),
        cmocka_unit_test(limits_beyond_the_device_are_refused),
        cmocka_unit_test(ranks_sharing_a_device_are_checked_together),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
