/* The exports of interop/: the partition in Megatron-LM's terms, the
 * launch script and the ds_config of every bundled plan, and the notes
 * on what the trainers cannot be told. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop/interop.h"

/* ------------------------------------------------------------- helpers */

static void load_example(const char *name, plan *p)
{
    const char *root = getenv("PARTITA_SOURCE");
    assert_non_null(root);
    char path[PT_PATH_MAX];
    snprintf(path, sizeof path, "%s/docs/examples/%s", root, name);
    pt_error err = {{0}};
    if (plan_load_file(path, p, &err) != 0)
        fail_msg("%s", err.message);
}

/* A plan from inline JSON; model and cluster inline too. */
static void load_inline(const char *text, plan *p)
{
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    if (root == NULL)
        fail_msg("bad test JSON: %s", json_err.text);
    pt_error err = {{0}};
    int status = plan_from_json(root, NULL, p, &err);
    json_decref(root);
    if (status != 0)
        fail_msg("%s", err.message);
}

static void expect_in(const char *text, const char *needle)
{
    if (strstr(text, needle) == NULL)
        fail_msg("'%s' not in:\n%s", needle, text);
}

static void expect_not_in(const char *text, const char *needle)
{
    if (strstr(text, needle) != NULL)
        fail_msg("'%s' unexpectedly in:\n%s", needle, text);
}

/* A plan holding only what the partition functions read. */
static plan partition_plan(int pp, const int *layers)
{
    plan p;
    memset(&p, 0, sizeof p);
    p.config.pp = pp;
    for (int s = 0; s < pp; s++) {
        p.partition[s] = layers[s];
        p.model.layers += layers[s];
    }
    return p;
}

/* ----------------------------------------------------------- partition */

static void expect_split(int pp, const int *layers, megatron_split split,
                         int first, int last)
{
    plan p = partition_plan(pp, layers);
    megatron_partition got = interop_megatron_partition(&p);
    assert_int_equal(got.split, split);
    assert_int_equal(got.first_layers, first);
    assert_int_equal(got.last_layers, last);
}

static void test_megatron_partition_forms(void **state)
{
    (void)state;
    expect_split(8, (int[]){12, 12, 12, 12, 12, 12, 12, 12},
                 MEGATRON_SPLIT_EVEN, 0, 0);
    expect_split(1, (int[]){48}, MEGATRON_SPLIT_EVEN, 0, 0);
    /* the fewest flags: first only, last only, then both */
    expect_split(4, (int[]){13, 12, 12, 12}, MEGATRON_SPLIT_FIRST_LAST, 13,
                 0);
    expect_split(4, (int[]){12, 12, 12, 11}, MEGATRON_SPLIT_FIRST_LAST, 0,
                 11);
    expect_split(4, (int[]){13, 12, 12, 11}, MEGATRON_SPLIT_FIRST_LAST, 13,
                 11);
    expect_split(2, (int[]){10, 2}, MEGATRON_SPLIT_FIRST_LAST, 10, 0);
    /* Megatron refuses empty first/last stages and empty middle ones */
    expect_split(8, (int[]){0, 11, 8, 8, 8, 8, 5, 0}, MEGATRON_SPLIT_LAYOUT,
                 0, 0);
    expect_split(2, (int[]){0, 12}, MEGATRON_SPLIT_LAYOUT, 0, 0);
    expect_split(3, (int[]){5, 0, 5}, MEGATRON_SPLIT_LAYOUT, 0, 0);
    expect_split(4, (int[]){10, 12, 14, 12}, MEGATRON_SPLIT_LAYOUT, 0, 0);
}

static void test_megatron_layout(void **state)
{
    (void)state;
    char layout[128];
    pt_error err = {{0}};
    plan p = partition_plan(8, (int[]){0, 11, 8, 8, 8, 8, 5, 0});
    assert_int_equal(interop_megatron_layout(&p, layout, sizeof layout, &err),
                     0);
    assert_string_equal(layout, "E|t*11|t*8|t*8|t*8|t*8|t*5|L");
    p = partition_plan(2, (int[]){1, 1});
    assert_int_equal(interop_megatron_layout(&p, layout, sizeof layout, &err),
                     0);
    assert_string_equal(layout, "Et|tL");
    p = partition_plan(1, (int[]){4});
    assert_int_equal(interop_megatron_layout(&p, layout, sizeof layout, &err),
                     0);
    assert_string_equal(layout, "Et*4L");
    p = partition_plan(3, (int[]){5, 0, 5});
    assert_int_equal(interop_megatron_layout(&p, layout, 8, &err), -1);
    expect_in(err.message, "too long");
    char balance[64];
    p = partition_plan(8, (int[]){0, 11, 8, 8, 8, 8, 5, 0});
    interop_balance_list(&p, balance, sizeof balance);
    assert_string_equal(balance, "0,11,8,8,8,8,5,0");
}

/* -------------------------------------------------------------- hosts */

static void test_hosts_follow_node_order(void **state)
{
    (void)state;
    plan p;
    load_example("plan-gpt2xl-hetero.json", &p);
    pt_error err = {{0}};
    interop_host *hosts = interop_hosts(&p, &err);
    assert_non_null(hosts);
    assert_string_equal(hosts[0].host, "a10-0");
    assert_string_equal(hosts[0].node, "a10[0]");
    assert_string_equal(hosts[7].host, "a100-0");
    assert_string_equal(hosts[7].gpu, "A100-FASOP");
    assert_int_equal(hosts[7].first_rank, 28);
    int first, last;
    char nodes[192];
    interop_stage_hosts(&p, hosts, 7, &first, &last, nodes, sizeof nodes);
    assert_int_equal(first, 7);
    assert_int_equal(last, 7);
    assert_string_equal(nodes, "a100[0], A100-FASOP");
    free(hosts);
    plan_free(&p);

    load_example("plan-megatron-175b-a100.json", &p);
    hosts = interop_hosts(&p, &err);
    assert_non_null(hosts);
    interop_stage_hosts(&p, hosts, 1, &first, &last, nodes, sizeof nodes);
    assert_int_equal(first, 12);
    assert_int_equal(last, 23);
    assert_string_equal(nodes, "a100[12]..a100[23], A100-80GB");
    free(hosts);
    plan_free(&p);
}

/* ------------------------------------------------------------ megatron */

static char *megatron_of(const char *example, plan *p)
{
    load_example(example, p);
    pt_error err = {{0}};
    char *script = interop_megatron_script(p, example, &err);
    if (script == NULL)
        fail_msg("%s", err.message);
    return script;
}

static void test_megatron_175b(void **state)
{
    (void)state;
    plan p;
    char *script = megatron_of("plan-megatron-175b-a100.json", &p);
    expect_in(script, "#!/usr/bin/env bash\n");
    expect_in(script, "    --tensor-model-parallel-size 8\n");
    expect_in(script, "    --pipeline-model-parallel-size 8\n");
    expect_in(script, "    --num-layers 96\n");
    expect_in(script, "    --hidden-size 12288\n");
    expect_in(script, "    --num-attention-heads 96\n");
    expect_in(script, "    --ffn-hidden-size 49152\n");
    expect_in(script, "    --seq-length 2048\n");
    expect_in(script, "    --max-position-embeddings 2048\n");
    expect_in(script, "    --micro-batch-size 1\n");
    expect_in(script, "    --global-batch-size 1536\n");
    expect_in(script, "    --bf16\n");
    expect_in(script, "    --recompute-granularity full --recompute-method "
                      "uniform --recompute-num-layers 1\n");
    expect_in(script, "    --use-distributed-optimizer\n");
    /* an even partition takes no flag */
    expect_not_in(script, "    --pipeline-model-parallel-layout");
    expect_not_in(script, "    --decoder-first-pipeline-num-layers");
    expect_in(script, "--nnodes 96");
    expect_in(script, "--ntasks 384");
    expect_in(script, "HOSTS=(a100-0 a100-1 ");
    expect_in(script, "a100-95)\n");
    expect_in(script, "#     7      12  336-383      84-95    "
                      "a100[84]..a100[95], A100-80GB\n");
    expect_in(script, "tensor-parallel groups of 8 span nodes");
    expect_in(script, "50257\n#       becomes 51200");
    expect_not_in(script, "mixes GPU types");
    free(script);
    plan_free(&p);
}

static void test_megatron_hetero(void **state)
{
    (void)state;
    plan p;
    char *script = megatron_of("plan-gpt2xl-hetero.json", &p);
    expect_in(script, "    --pipeline-model-parallel-layout "
                      "'E|t*11|t*8|t*8|t*8|t*8|t*5|L'\n");
    expect_in(script, "HOSTS=(a10-0 a10-1 a10-2 a10-3 a10-4 a10-5 a10-6 "
                      "a100-0)\n");
    expect_in(script, "GPUS=(4 4 4 4 4 4 4 4)\n");
    expect_in(script, "# partition (layers per stage, FASOP's --balance): "
                      "0,11,8,8,8,8,5,0\n");
    expect_in(script, "# note: the plan mixes GPU types (A10-FASOP, "
                      "A100-FASOP)");
    interop_notes notes;
    interop_notes_of(&p, INTEROP_MEGATRON, &notes);
    assert_int_equal(notes.count, 3);
    expect_in(notes.text[2], "apply 0,11,8,8,8,8,5,0 by hand");
    expect_in(script, "# note: the partition needs "
                      "--pipeline-model-parallel-layout (Megatron-core\n");
    expect_not_in(script, "--recompute-granularity");
    expect_not_in(script, "--use-distributed-optimizer");
    expect_not_in(script, "span nodes");
    free(script);
    plan_free(&p);
}

static void test_megatron_small_plans(void **state)
{
    (void)state;
    plan p;
    char *script = megatron_of("plan-pp2-one-h200.json", &p);
    expect_in(script, "    --decoder-first-pipeline-num-layers 10\n");
    expect_not_in(script, "--decoder-last-pipeline-num-layers");
    expect_in(script, "slices its GPUs");
    free(script);
    plan_free(&p);
    const char *one_gpu[] = {"plan-gpt2-124m-1gpu.json",
                             "plan-gpt-13b-1gpu.json", "plan-tiny-cpu.json"};
    for (size_t i = 0; i < sizeof one_gpu / sizeof one_gpu[0]; i++) {
        script = megatron_of(one_gpu[i], &p);
        expect_in(script, "    --pipeline-model-parallel-size 1\n");
        expect_in(script, "--nnodes 1");
        expect_not_in(script, "# note: the plan mixes");
        free(script);
        plan_free(&p);
    }
}

static const char *plan_with(const char *model, const char *extra,
                             char *out, size_t size)
{
    snprintf(out, size,
             "{ \"model\": %s,"
             "  \"cluster\": { \"name\": \"pair\", \"nodes\": ["
             "    { \"name\": \"big\", \"gpu\": \"H100\", \"gpus\": 2,"
             "      \"intra_node\": { \"bandwidth_GBps\": 200,"
             "                        \"latency_us\": 5 },"
             "      \"inter_node\": { \"bandwidth_Gbps\": 100,"
             "                        \"latency_us\": 20 } },"
             "    { \"name\": \"small\", \"gpu\": \"A10\", \"gpus\": 2,"
             "      \"intra_node\": { \"bandwidth_GBps\": 16,"
             "                        \"latency_us\": 5 },"
             "      \"inter_node\": { \"bandwidth_Gbps\": 100,"
             "                        \"latency_us\": 20 } } ] },"
             "  \"gbs\": 8, \"mbs\": 1 %s }",
             model, extra);
    return out;
}

static void test_megatron_refuses_indivisible_heads(void **state)
{
    (void)state;
    char text[2048];
    plan p;
    load_inline(plan_with("{ \"name\": \"odd\", \"layers\": 4, \"hidden\": "
                          "48, \"heads\": 3, \"seq\": 16, \"vocab\": 256 }",
                          ", \"tp\": 2, \"dp\": 1, \"pp\": 2", text,
                          sizeof text),
                &p);
    pt_error err = {{0}};
    assert_null(interop_megatron_script(&p, "odd.json", &err));
    expect_in(err.message, "plan.tp");
    expect_in(err.message, "3 attention heads");
    /* DeepSpeed's config is still written */
    json_t *config = interop_deepspeed_config(&p, "odd.json", &err);
    assert_non_null(config);
    json_decref(config);
    plan_free(&p);
}

/* A Llama-shaped model: Megatron-LM's architecture flags, the
 * tokenizer's note, Megatron-DeepSpeed's flags in the ds_config's
 * partita block; a GPT model's script has none of them. */
#define LLAMA_TOY                                                          \
    "{ \"name\": \"llama-toy\", \"layers\": 4, \"hidden\": 256, "            \
    "\"heads\": 8, \"kv_heads\": 2, \"ffn_hidden\": 688, \"seq\": 128, "     \
    "\"vocab\": 32000, \"tied_embeddings\": false, \"norm\": \"rmsnorm\", "  \
    "\"mlp\": \"swiglu\", \"positions\": \"rope\", \"rope_base\": 500000, "  \
    "\"bias\": false }"

static void test_megatron_llama(void **state)
{
    (void)state;
    char text[2048];
    plan p;
    load_inline(plan_with(LLAMA_TOY, ", \"tp\": 2, \"dp\": 1, \"pp\": 2",
                          text, sizeof text),
                &p);
    pt_error err = {{0}};
    char *script = interop_megatron_script(&p, "llama.json", &err);
    if (script == NULL)
        fail_msg("%s", err.message);
    expect_in(script, "    --normalization RMSNorm --norm-epsilon 1e-05\n");
    expect_in(script, "    --swiglu\n");
    expect_in(script, "    --position-embedding-type rope --rotary-base "
                      "500000\n");
    expect_in(script, "    --group-query-attention --num-query-groups 2\n");
    expect_in(script, "    --untie-embeddings-and-output-weights\n");
    expect_in(script, "    --disable-bias-linear\n");
    expect_in(script, "    --ffn-hidden-size 688\n");
    expect_in(script, "--tokenizer-type HuggingFaceTokenizer");
    expect_not_in(script, "--add-qkv-bias");
    free(script);

    json_t *config = interop_deepspeed_config(&p, "llama.json", &err);
    assert_non_null(config);
    json_t *block = json_object_get(config, "partita");
    json_t *args = json_object_get(block, "megatron_deepspeed_args");
    char *dumped = json_dumps(args, 0);
    expect_in(dumped, "--normalization rmsnorm");
    expect_in(dumped, "--num-key-value-heads 2");
    expect_in(dumped, "--rope-theta 500000");
    free(dumped);
    assert_int_equal(
        json_integer_value(json_object_get(block, "parameters")),
        (json_int_t)model_parameter_count(&p.model));
    json_decref(config);
    plan_free(&p);

    /* 2 key/value heads do not split over tp 4: Megatron-LM refuses */
    load_inline(plan_with(LLAMA_TOY, ", \"tp\": 4, \"dp\": 1, \"pp\": 1",
                          text, sizeof text),
                &p);
    assert_null(interop_megatron_script(&p, "llama.json", &err));
    expect_in(err.message, "2 key/value heads (--num-query-groups)");
    plan_free(&p);

    /* a GPT plan's script names none of the architecture flags */
    script = megatron_of("plan-gpt2-124m-1gpu.json", &p);
    expect_not_in(script, "--normalization");
    expect_not_in(script, "--swiglu");
    expect_not_in(script, "--position-embedding-type");
    expect_not_in(script, "--disable-bias-linear");
    free(script);
    plan_free(&p);
}

static void test_notes_of_mixed_stages_and_gpipe(void **state)
{
    (void)state;
    char text[2048];
    plan p;
    /* dp 4 over both nodes: the one stage holds H100s and A10s */
    load_inline(plan_with("{ \"name\": \"m\", \"layers\": 4, \"hidden\": 64,"
                          " \"heads\": 4, \"seq\": 16, \"vocab\": 256 }",
                          ", \"tp\": 1, \"dp\": 4, \"pp\": 1", text,
                          sizeof text),
                &p);
    interop_notes notes;
    interop_notes_of(&p, INTEROP_MEGATRON, &notes);
    assert_int_equal(notes.count, 2);
    expect_in(notes.text[0], "mixes GPU types (H100, A10)");
    expect_in(notes.text[1], "stage(s) 0 hold GPUs of more than one type");
    plan_free(&p);
    /* pp 2 under GPipe, a stage per node, tp 2 inside each node */
    load_inline(plan_with("{ \"name\": \"m\", \"layers\": 4, \"hidden\": 64,"
                          " \"heads\": 4, \"seq\": 16, \"vocab\": 256 }",
                          ", \"tp\": 2, \"dp\": 1, \"pp\": 2, "
                          "\"schedule\": \"gpipe\"",
                          text, sizeof text),
                &p);
    interop_notes_of(&p, INTEROP_DEEPSPEED, &notes);
    bool gpipe = false, mixed_stage = false, tp = false;
    for (int i = 0; i < notes.count; i++) {
        gpipe = gpipe || strstr(notes.text[i], "gpipe cannot") != NULL;
        mixed_stage = mixed_stage || strstr(notes.text[i], "stage(s)") != NULL;
        tp = tp || strstr(notes.text[i], "tp 2 is not a ds_config") != NULL;
    }
    assert_true(gpipe);
    assert_false(mixed_stage);
    assert_true(tp);
    plan_free(&p);
}

/* ------------------------------------------------------------ deepspeed */

static json_t *deepspeed_of(const char *example, plan *p)
{
    load_example(example, p);
    pt_error err = {{0}};
    json_t *config = interop_deepspeed_config(p, example, &err);
    if (config == NULL)
        fail_msg("%s", err.message);
    return config;
}

static long long integer_at(const json_t *root, const char *a, const char *b)
{
    const json_t *value = json_object_get(root, a);
    if (b != NULL)
        value = json_object_get(value, b);
    if (!json_is_integer(value))
        fail_msg("%s%s%s is not an integer", a, b ? "." : "", b ? b : "");
    return json_integer_value(value);
}

static void test_deepspeed_every_example(void **state)
{
    (void)state;
    const char *examples[] = {
        "plan-gpt2xl-hetero.json", "plan-megatron-175b-a100.json",
        "plan-pp2-one-h200.json", "plan-gpt2-124m-1gpu.json",
        "plan-gpt-13b-1gpu.json", "plan-tiny-cpu.json"};
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        plan p;
        json_t *config = deepspeed_of(examples[i], &p);
        const parallel_config *c = &p.config;
        assert_int_equal(integer_at(config, "train_batch_size", NULL),
                         c->gbs);
        assert_int_equal(
            integer_at(config, "train_micro_batch_size_per_gpu", NULL),
            c->mbs);
        /* DeepSpeed's own check: batch = micro x accumulation x dp */
        assert_int_equal(
            integer_at(config, "gradient_accumulation_steps", NULL) * c->mbs *
                c->dp,
            c->gbs);
        assert_int_equal(integer_at(config, "zero_optimization", "stage"),
                         c->distributed_optimizer ? 1 : 0);
        const json_t *partita = json_object_get(config, "partita");
        const json_t *parts =
            json_object_get(json_object_get(partita, "pipeline"), "parts");
        assert_int_equal(json_array_size(parts), (size_t)c->pp + 1);
        assert_int_equal(json_integer_value(json_array_get(parts, 0)), 0);
        assert_int_equal(
            json_integer_value(json_array_get(parts, (size_t)c->pp)),
            p.model.layers + 3);
        assert_int_equal(json_array_size(json_object_get(partita, "hostfile")),
                         (size_t)p.node_order_count);
        assert_int_equal(json_object_get(config, "pipeline") != NULL,
                         c->pp > 1);
        json_decref(config);
        plan_free(&p);
    }
}

static void test_deepspeed_hetero_and_175b(void **state)
{
    (void)state;
    plan p;
    json_t *config = deepspeed_of("plan-gpt2xl-hetero.json", &p);
    char *text = json_format_text(config);
    assert_non_null(text);
    expect_in(text, "\"parts\": [0, 1, 12, 20, 28, 36, 44, 49, 51]");
    expect_in(text, "\"layers_per_stage\": [0, 11, 8, 8, 8, 8, 5, 0]");
    expect_in(text, "\"a10-0 slots=4\"");
    expect_in(text, "\"a100-0 slots=4\"");
    expect_in(text, "\"bf16\": {\n    \"enabled\": true\n  }");
    expect_in(text, "\"activation_checkpoint_interval\": 0");
    expect_in(text, "mixes GPU types");
    expect_in(text, "DeepSpeed takes no layer list");
    free(text);
    json_decref(config);
    plan_free(&p);

    config = deepspeed_of("plan-megatron-175b-a100.json", &p);
    text = json_format_text(config);
    assert_non_null(text);
    expect_in(text, "\"stage\": 1");
    expect_in(text, "\"gradient_accumulation_steps\": 256");
    expect_in(text, "\"activation_checkpoint_interval\": 1");
    expect_in(text, "tp 8 is not a ds_config setting");
    expect_in(text, "num_pp=8, num_mp=8, num_dp=6");
    expect_in(text, "tensor-parallel groups of 8 span nodes");
    free(text);
    json_decref(config);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_megatron_partition_forms),
        cmocka_unit_test(test_megatron_layout),
        cmocka_unit_test(test_hosts_follow_node_order),
        cmocka_unit_test(test_megatron_175b),
        cmocka_unit_test(test_megatron_hetero),
        cmocka_unit_test(test_megatron_small_plans),
        cmocka_unit_test(test_megatron_refuses_indivisible_heads),
        cmocka_unit_test(test_megatron_llama),
        cmocka_unit_test(test_notes_of_mixed_stages_and_gpipe),
        cmocka_unit_test(test_deepspeed_every_example),
        cmocka_unit_test(test_deepspeed_hetero_and_175b),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
