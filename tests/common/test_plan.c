/* plan.json: the example plan, defaults, path resolution and every
 * consistency check of the reader. */
#include "test_support.h"

static void test_example_plan(void **state)
{
    (void)state;
    char path[PT_PATH_MAX];
    source_path("docs/examples/plan-gpt2xl-hetero.json", path, sizeof path);
    plan p;
    pt_error err = {""};
    if (plan_load_file(path, &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_string_equal(p.model.name, "gpt2-xl");
    assert_int_equal(p.model.layers, 48);
    assert_string_equal(p.model_ref, "../../models/gpt2-xl.json");
    assert_string_equal(p.cluster_ref, "../../clusters/hetero.json");
    assert_int_equal(p.cluster.node_count, 8);
    assert_non_null(strstr(p.cluster.source_dir, "clusters"));
    assert_non_null(strstr(p.source_dir, "docs/examples"));
    assert_int_equal(p.config.gbs, 64);
    assert_int_equal(p.config.mbs, 1);
    assert_int_equal(p.config.tp, 1);
    assert_int_equal(p.config.dp, 4);
    assert_int_equal(p.config.pp, 8);
    assert_int_equal(parallel_microbatches(&p.config), 16);
    assert_int_equal(p.config.schedule, SCHEDULE_1F1B);
    assert_int_equal(p.config.precision, PRECISION_BF16);
    assert_false(p.config.recompute);
    assert_false(p.config.distributed_optimizer);
    /* a plan from before interleaving and sequence parallelism */
    assert_int_equal(parallel_virtual_stages(&p.config), 1);
    assert_false(p.config.sequence_parallel);
    int expected[] = {0, 11, 8, 8, 8, 8, 5, 0};
    assert_memory_equal(p.partition, expected, sizeof expected);
    assert_int_equal(p.node_order_count, 8);
    /* a10[0]..a10[6] are instances 1..7, a100[0] is instance 0. */
    for (int i = 0; i < 7; i++)
        assert_int_equal(p.node_order[i], i + 1);
    assert_int_equal(p.node_order[7], 0);
    assert_int_equal(plan_gpu_count(&p), 32);
    assert_int_equal(plan_rank_node(&p, 0), 1);
    assert_int_equal(plan_rank_node(&p, 5), 2);
    assert_int_equal(plan_rank_node(&p, 31), 0);
    assert_int_equal(plan_rank_node(&p, 32), -1);
    assert_int_equal(plan_rank_node(&p, -1), -1);
    plan_free(&p);
    plan_free(&p);
}

/* Writes a plan naming the bundled gpt2-xl model and hetero cluster by
 * absolute path, with `fields` appended, and loads it. */
/* The field `key` of the plan as plan_to_json writes it (a reference of
 * its own, for json_decref), or NULL when the plan does not write it. */
static json_t *written_field(const plan *p, const char *key)
{
    pt_error err = {{0}};
    json_t *root = plan_to_json(p, NULL, &err);
    if (root == NULL)
        fail_msg("%s", err.message);
    json_t *field = json_incref(json_object_get(root, key));
    json_decref(root);
    return field;
}

static int load_hetero_plan(void **state, const char *fields, plan *p,
                            pt_error *err)
{
    char model[PT_PATH_MAX], cluster_path[PT_PATH_MAX];
    source_path("models/gpt2-xl.json", model, sizeof model);
    source_path("clusters/hetero.json", cluster_path, sizeof cluster_path);
    char text[4096];
    snprintf(text, sizeof text, "{\"model\": \"%s\", \"cluster\": \"%s\"%s%s}",
             model, cluster_path, fields[0] != '\0' ? ", " : "", fields);
    char path[512];
    scratch_write(state, "plans/bad.json", text, path, sizeof path);
    return plan_load_file(path, p, err);
}

static void test_defaults(void **state)
{
    plan p;
    pt_error err = {""};
    if (load_hetero_plan(state,
                         "\"gbs\": 64, \"mbs\": 2, \"tp\": 2, \"dp\": 2, "
                         "\"pp\": 8, \"estimate\": {\"step_time_s\": 1}, "
                         "\"alternatives\": [1, 2], "
                         "\"format\": \"partita-plan/1\"",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    for (int stage = 0; stage < 8; stage++)
        assert_int_equal(p.partition[stage], 6);
    assert_int_equal(p.node_order_count, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(p.node_order[i], i);
    assert_int_equal(p.config.schedule, SCHEDULE_1F1B);
    assert_int_equal(p.config.precision, PRECISION_BF16);
    /* Megatron-LM's recipe by default: fp32 main gradients, and the
     * residual stream in bf16 (the cuda backend's, issue 34) */
    assert_int_equal(p.config.grad_precision, GRAD_PRECISION_FP32);
    assert_int_equal(parallel_gradient_bytes(&p.config), 4);
    assert_int_equal(parallel_residual_bytes(&p.config), 2);
    /* Partita's executor overlaps the dp sums with the last backward but
     * under the interleaved 1F1B (each chunk summed after it);
     * Megatron-LM where the plan says --overlap-grad-reduce */
    assert_true(parallel_overlaps_grad_reduce(&p.config));
    parallel_config interleaved = p.config;
    interleaved.virtual_stages = 2;
    assert_false(parallel_overlaps_grad_reduce(&interleaved));
    interleaved.runtime = RUNTIME_MEGATRON;
    assert_false(parallel_overlaps_grad_reduce(&interleaved));
    interleaved.overlap_grad_reduce = true;
    assert_true(parallel_overlaps_grad_reduce(&interleaved));
    /* GPT-2 XL's 25 heads: priced at tp 2, but exec cannot split them */
    pt_error split = {""};
    assert_int_equal(plan_check_tp_split(&p, &split), -1);
    assert_non_null(strstr(split.message, "model gpt2-xl"));
    assert_non_null(strstr(split.message, "tp 2 must divide the 25 heads "
                                          "and ffn_hidden 6400"));
    p.config.tp = 1;
    assert_int_equal(plan_check_tp_split(&p, &split), 0);
    p.config.tp = 2;
    /* not deterministic unless asked (Megatron-LM's default), and then
     * not written */
    assert_false(p.config.deterministic);
    assert_null(written_field(&p, "deterministic"));
    plan_free(&p);

    /* "deterministic": Megatron-LM's --deterministic-mode, read and
     * written back */
    if (load_hetero_plan(state,
                         "\"gbs\": 64, \"mbs\": 2, \"tp\": 2, \"dp\": 2, "
                         "\"pp\": 8, \"deterministic\": true",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_true(p.config.deterministic);
    json_t *kept = written_field(&p, "deterministic");
    assert_true(json_is_true(kept));
    json_decref(kept);
    plan_free(&p);

    /* llm.c's recipe: bf16 gradients, whatever the runtime */
    if (load_hetero_plan(state,
                         "\"gbs\": 64, \"mbs\": 2, \"tp\": 2, \"dp\": 2, "
                         "\"pp\": 8, \"grad_precision\": \"bf16\"",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(p.config.grad_precision, GRAD_PRECISION_BF16);
    assert_int_equal(parallel_gradient_bytes(&p.config), 2);
    p.config.runtime = RUNTIME_MEGATRON;
    assert_int_equal(parallel_gradient_bytes(&p.config), 2);
    json_t *written = written_field(&p, "grad_precision");
    assert_string_equal(json_string_value(written), "bf16");
    json_decref(written);
    plan_free(&p);

    if (load_hetero_plan(state,
                         "\"gbs\": 60, \"mbs\": 1, \"tp\": 4, \"dp\": 1, "
                         "\"pp\": 8, \"partition\": [7, 7, 6, 6, 6, 6, 5, "
                         "5], \"schedule\": \"gpipe\", \"precision\": "
                         "\"fp32\", \"recompute\": \"full\", "
                         "\"distributed_optimizer\": true",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(p.partition[0], 7);
    assert_int_equal(p.partition[7], 5);
    assert_int_equal(p.config.schedule, SCHEDULE_GPIPE);
    assert_int_equal(p.config.precision, PRECISION_FP32);
    assert_true(p.config.recompute);
    assert_false(p.config.selective_recompute);
    assert_true(p.config.distributed_optimizer);
    assert_int_equal(parallel_zero_stage(&p.config), 1);
    assert_false(p.config.offload_optimizer);
    plan_free(&p);

    /* "zero" generalises distributed_optimizer; offload beside it */
    if (load_hetero_plan(state,
                         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 4, "
                         "\"pp\": 8, \"zero\": 3, \"offload_optimizer\": "
                         "true",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(parallel_zero_stage(&p.config), 3);
    assert_true(p.config.distributed_optimizer);
    assert_true(p.config.offload_optimizer);
    plan_free(&p);

    if (load_hetero_plan(state,
                         "\"gbs\": 64, \"mbs\": 1, \"tp\": 4, \"dp\": 1, "
                         "\"pp\": 8, \"virtual_stages\": 3, "
                         "\"sequence_parallel\": true",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(p.config.virtual_stages, 3);
    assert_true(p.config.sequence_parallel);
    plan_free(&p);

    /* One node of four GPUs holds tp x dp x pp = 4: 48 layers in 12s. */
    if (load_hetero_plan(state,
                         "\"gbs\": 8, \"mbs\": 1, \"tp\": 1, \"dp\": 1, "
                         "\"pp\": 4, \"node_order\": [\"a10[2]\"]",
                         &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(p.node_order_count, 1);
    assert_int_equal(p.node_order[0], 3);
    assert_int_equal(p.partition[0], 12);
    plan_free(&p);
}

static void test_relative_and_inline(void **state)
{
    char path[512];
    scratch_write(state, "m/model.json",
                  "{\"name\": \"toy\", \"layers\": 5, \"hidden\": 64, "
                  "\"heads\": 4, \"seq\": 32, \"vocab\": 100}",
                  path, sizeof path);
    scratch_write(state, "c/cluster.json",
                  "{\"name\": \"duo\", \"nodes\": [{\"name\": \"g\", "
                  "\"count\": 2, \"gpu\": \"G\", \"gpus\": 2, "
                  "\"intra_node\": {\"bandwidth_GBps\": 100, "
                  "\"latency_us\": 2}, \"inter_node\": {\"bandwidth_Gbps\": "
                  "100, \"latency_us\": 10}}]}",
                  path, sizeof path);
    scratch_write(state, "p/plan.json",
                  "{\"model\": \"../m/model.json\", \"cluster\": "
                  "\"../c/cluster.json\", \"gbs\": 4, \"mbs\": 1, \"tp\": 1, "
                  "\"dp\": 2, \"pp\": 2, \"node_order\": [\"g[1]\", "
                  "\"g[0]\"]}",
                  path, sizeof path);
    plan p;
    pt_error err = {""};
    if (plan_load_file(path, &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_string_equal(p.model.name, "toy");
    assert_int_equal(p.partition[0], 3);
    assert_int_equal(p.partition[1], 2);
    assert_int_equal(p.node_order[0], 1);
    char expected_dir[600];
    snprintf(expected_dir, sizeof expected_dir, "%s/p/../c",
             scratch_dir(state));
    assert_string_equal(p.cluster.source_dir, expected_dir);
    plan_free(&p);

    /* Both inline; source_dir of an inline cluster is the plan's. */
    json_error_t parse_error;
    json_t *root = json_loads(
        "{\"model\": {\"name\": \"toy\", \"layers\": 4, \"hidden\": 64, "
        "\"heads\": 4, \"seq\": 32, \"vocab\": 100, \"tied_embeddings\": "
        "false}, \"cluster\": {\"name\": \"solo\", \"nodes\": [{\"name\": "
        "\"h\", \"gpu\": \"H200\", \"gpus\": 2, \"intra_node\": "
        "{\"bandwidth_GBps\": 450, \"latency_us\": 3}}]}, \"gbs\": 8, "
        "\"mbs\": 2, \"tp\": 2, \"dp\": 1, \"pp\": 1, \"partition\": \"4\"}",
        0, &parse_error);
    assert_non_null(root);
    if (plan_from_json(root, "plans/inline.json", &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_string_equal(p.model_ref, "");
    assert_string_equal(p.cluster_ref, "");
    assert_false(p.model.tied_embeddings);
    assert_string_equal(p.cluster.source_dir, "plans");
    plan_free(&p);
    assert_int_equal(plan_from_json(root, NULL, &p, &err), 0);
    assert_string_equal(p.source_dir, ".");
    plan_free(&p);
    json_object_set_new(root, "gbs", json_integer(7));
    assert_int_equal(plan_from_json(root, NULL, &p, &err), -1);
    EXPECT_MESSAGE(&err, "<inline>: gbs: 7 is not divisible by dp x mbs");
    json_decref(root);
}

typedef struct bad_plan {
    const char *fields;
    const char *message;
} bad_plan;

#define DEGREES "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 4, \"pp\": 8"

static void test_bad_plans(void **state)
{
    static const bad_plan cases[] = {
        {DEGREES ", \"partition\": \"0-11-8-8-8-8-5-1\"",
         "plans/bad.json: partition: stages hold 49 layers in all, but "
         "model gpt2-xl has 48"},
        {DEGREES ", \"partition\": \"12-12-12-12\"",
         "plans/bad.json: partition: has 4 stages, but pp is 8"},
        {DEGREES ", \"partition\": [6, 6, 6, 6, 6, 6, 6, -6]",
         "plans/bad.json: partition[7]: must be a non-negative integer"},
        {DEGREES ", \"partition\": \"6-6-6-6-6-6-6-x\"",
         "plans/bad.json: partition: partition \"6-6-6-6-6-6-6-x\": "
         "expected a layer count at character 15"},
        {DEGREES ", \"partition\": []", "plans/bad.json: partition: must not "
                                        "be empty"},
        {DEGREES ", \"partition\": 48", "plans/bad.json: partition: must be "
                                        "a string"},
        {DEGREES ", \"precision\": \"fp32\", \"grad_precision\": \"bf16\"",
         "plans/bad.json: grad_precision: bf16 gradients only with "
         "precision bf16 (the plan's precision is fp32)"},
        {DEGREES ", \"grad_precision\": \"fp16\"",
         "plans/bad.json: grad_precision"},
        {DEGREES ", \"deterministic\": 1",
         "plans/bad.json: deterministic"},
        {"\"gbs\": 64, \"mbs\": 3, \"tp\": 1, \"dp\": 4, \"pp\": 8",
         "plans/bad.json: gbs: 64 is not divisible by dp x mbs = 4 x 3 = 12"},
        {DEGREES ", \"node_order\": [\"a10[0]\", \"a10[1]\", \"a10[2]\", "
                 "\"a10[1]\", \"a10[4]\", \"a10[5]\", \"a10[6]\", "
                 "\"a100[0]\"]",
         "plans/bad.json: node_order[3]: node \"a10[1]\" is listed twice "
         "(also at node_order[1])"},
        {DEGREES ", \"node_order\": [\"a10[0]\", \"a10[1]\", \"a10[2]\", "
                 "\"a10[3]\", \"a10[4]\", \"a10[5]\", \"a10[7]\", "
                 "\"a100[0]\"]",
         "plans/bad.json: node_order[6]: unknown node \"a10[7]\" (cluster "
         "hetero has a100[0], a10[0]..a10[6])"},
        {DEGREES ", \"node_order\": [\"a100\"]",
         "node_order[0]: unknown node \"a100\""},
        {DEGREES ", \"node_order\": [3]",
         "node_order[0]: must be a node name"},
        {DEGREES ", \"node_order\": []",
         "node_order: must be a non-empty array"},
        {DEGREES ", \"node_order\": [\"a100[0]\", \"a10[0]\"]",
         "plans/bad.json: tp x dp x pp = 1 x 4 x 8 = 32 GPUs, but the 2 "
         "nodes of node_order hold 8 GPUs"},
        {"\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 4, \"pp\": 513",
         "plans/bad.json: pp: must be at most 512, got 513"},
        {DEGREES ", \"stage\": 8", "plans/bad.json: stage: unknown key"},
        {"\"gbs\": \"64\", \"mbs\": 1, \"tp\": 1, \"dp\": 4, \"pp\": 8",
         "plans/bad.json: gbs: must be a positive integer, got the string "
         "\"64\""},
        {"\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 4",
         "plans/bad.json: pp: missing (required)"},
        {"\"gbs\": 64, \"mbs\": 1, \"tp\": 0, \"dp\": 4, \"pp\": 8",
         "plans/bad.json: tp: must be a positive integer, got 0"},
        {DEGREES ", \"schedule\": \"zb\"",
         "plans/bad.json: schedule: must be one of \"1f1b\", \"gpipe\", got "
         "\"zb\""},
        {DEGREES ", \"precision\": \"fp8\"",
         "plans/bad.json: precision: must be one of"},
        {DEGREES ", \"recompute\": true",
         "plans/bad.json: recompute: must be one of \"none\", \"full\", "
         "\"selective\", got true"},
        {DEGREES ", \"distributed_optimizer\": \"no\"",
         "plans/bad.json: distributed_optimizer: must be true or false"},
        {DEGREES ", \"zero\": 4",
         "plans/bad.json: zero: must be at most 3, got 4"},
        {DEGREES ", \"zero\": 2, \"distributed_optimizer\": false",
         "plans/bad.json: zero: 2 shards the optimizer state over dp, but "
         "distributed_optimizer is false"},
        {DEGREES ", \"offload_optimizer\": 1",
         "plans/bad.json: offload_optimizer: must be true or false"},
        {DEGREES ", \"virtual_stages\": 0",
         "plans/bad.json: virtual_stages: must be"},
        {DEGREES ", \"virtual_stages\": 65",
         "plans/bad.json: virtual_stages: must be"},
        {DEGREES ", \"virtual_stages\": 2, \"schedule\": \"gpipe\"",
         "plans/bad.json: virtual_stages: 2 needs schedule \"1f1b\""},
        {"\"gbs\": 40, \"mbs\": 1, \"tp\": 1, \"dp\": 4, \"pp\": 8, "
         "\"virtual_stages\": 2",
         "plans/bad.json: virtual_stages: 2 needs the micro-batches per "
         "iteration (gbs / (dp x mbs) = 10) to be a multiple of pp (8)"},
        {DEGREES ", \"virtual_stages\": 4",
         "plans/bad.json: partition: stage 0 holds 6 layers, not a "
         "multiple of virtual_stages 4"},
        {DEGREES ", \"sequence_parallel\": true",
         "plans/bad.json: sequence_parallel: needs tp >= 2"},
        {DEGREES ", \"sequence_parallel\": 1",
         "plans/bad.json: sequence_parallel: must be true or false"},
        {DEGREES ", \"format\": \"partita-plan/2\"",
         "plans/bad.json: format: must be \"partita-plan/1\", got "
         "\"partita-plan/2\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        plan p;
        pt_error err = {""};
        if (load_hetero_plan(state, cases[i].fields, &p, &err) == 0)
            fail_msg("case %zu loaded; expected \"%s\"", i, cases[i].message);
        EXPECT_MESSAGE(&err, cases[i].message);
        assert_null(p.node_order);
        assert_null(p.cluster.types);
    }
}

static void test_bad_references(void **state)
{
    char path[512];
    plan p;
    pt_error err = {""};
    scratch_write(state, "plans/malformed.json",
                  "{\"model\": \"x.json\",\n \"gbs\": 64,,\n}", path,
                  sizeof path);
    assert_int_equal(plan_load_file(path, &p, &err), -1);
    EXPECT_MESSAGE(&err, "plans/malformed.json:2:", "malformed JSON");

    scratch_write(state, "plans/nomodel.json",
                  "{\"model\": \"../models/none.json\", \"cluster\": "
                  "\"c.json\", " DEGREES "}",
                  path, sizeof path);
    assert_int_equal(plan_load_file(path, &p, &err), -1);
    EXPECT_MESSAGE(&err, "plans/nomodel.json: model: ",
                   "plans/../models/none.json: cannot open");

    char model[PT_PATH_MAX];
    source_path("models/gpt2-xl.json", model, sizeof model);
    scratch_write(state, "plans/c.json",
                  "{\"name\": \"c\", \"nodes\": [{\"name\": \"a\", \"gpu\": "
                  "\"A\", \"gpus\": 0}]}",
                  path, sizeof path);
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model\": \"%s\", \"cluster\": \"c.json\", " DEGREES "}",
             model);
    scratch_write(state, "plans/badcluster.json", text, path, sizeof path);
    assert_int_equal(plan_load_file(path, &p, &err), -1);
    EXPECT_MESSAGE(&err, "plans/badcluster.json: cluster: ",
                   "plans/c.json: nodes[0].gpus: must be a positive "
                   "integer, got 0");

    snprintf(text, sizeof text,
             "{\"model\": {\"name\": \"m\", \"layers\": 0}, \"cluster\": "
             "\"c.json\", " DEGREES "}");
    scratch_write(state, "plans/inlinebad.json", text, path, sizeof path);
    assert_int_equal(plan_load_file(path, &p, &err), -1);
    EXPECT_MESSAGE(&err, "plans/inlinebad.json: model.layers: must be a "
                         "positive integer, got 0");

    scratch_write(state, "plans/nocluster.json",
                  "{\"model\": 5, \"cluster\": \"c.json\", " DEGREES "}",
                  path, sizeof path);
    assert_int_equal(plan_load_file(path, &p, &err), -1);
    EXPECT_MESSAGE(&err, "plans/nocluster.json: model: must be a path or an "
                         "inline model object");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_plan),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_relative_and_inline),
        cmocka_unit_test(test_bad_plans),
        cmocka_unit_test(test_bad_references),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
