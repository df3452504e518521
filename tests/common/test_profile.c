/* Profiles (profiles/): the bundled FASOP ones, the reader's checks and
 * profile_find's search order. */
#include "test_support.h"

#include <math.h>

static void test_bundled_a100(void **state)
{
    (void)state;
    profile p;
    load_bundled_profile("profiles/A100-FASOP.json", &p);
    assert_string_equal(p.gpu, "A100-FASOP");
    assert_true(p.memory_gib == 39.59);
    assert_int_equal(p.source, PROFILE_PUBLISHED);
    assert_true(json_is_object(p.provenance));
    assert_non_null(json_object_get(p.provenance, "citation"));
    assert_true(p.backward_over_forward == 2.0);
    assert_int_equal(p.mbs_scaling, MBS_SCALING_LINEAR);
    assert_true(p.layer_times_include_tp_comm);
    assert_true(p.workspace_gib == 0.5);
    assert_true(fabs(p.optimizer_s_per_param - 32.0 / 1555e9) < 1e-14);
    assert_true(p.peak_tflops == 312.0);
    assert_true(p.flops_efficiency == 0.0);
    assert_true(p.memory_bandwidth_GBps == 1555.0);
    assert_int_equal(p.shape_count, 2);
    assert_int_equal(p.allreduce.sample_count, 0);

    model_shape gpt2_xl;
    char path[PT_PATH_MAX];
    source_path("models/gpt2-xl.json", path, sizeof path);
    assert_int_equal(model_load_file(path, &gpt2_xl, NULL), 0);
    int shape_index = profile_find_shape(&p, &gpt2_xl);
    assert_int_equal(shape_index, 0);
    const profile_shape *shape = &p.shapes[shape_index];
    assert_int_equal(shape->heads, 16);
    assert_int_equal(shape->point_count, 3);
    int point = profile_find_point(shape, 1, 1);
    assert_true(point >= 0);
    /* The README's sanity figure: 1.64 ms per layer forward at tp 1. */
    assert_true(shape->points[point].layer.forward_s == 0.001638458);
    assert_true(shape->points[point].layer.backward_s == 2 * 0.001638458);
    assert_true(shape->points[point].embedding.forward_s == 0.000159);
    assert_true(shape->points[point].head.forward_s == 0.00073);
    point = profile_find_point(shape, 4, 1);
    assert_true(shape->points[point].layer.forward_s == 0.001452471);
    assert_int_equal(profile_find_point(shape, 8, 1), -1);
    assert_int_equal(profile_find_point(shape, 1, 2), -1);

    model_shape bert;
    source_path("models/bert-large.json", path, sizeof path);
    assert_int_equal(model_load_file(path, &bert, NULL), 0);
    assert_int_equal(profile_find_shape(&p, &bert), 1);
    model_shape gpt13b;
    source_path("models/gpt-13b.json", path, sizeof path);
    assert_int_equal(model_load_file(path, &gpt13b, NULL), 0);
    assert_int_equal(profile_find_shape(&p, &gpt13b), -1);
    profile_free(&p);
    profile_free(&p);
}

static void test_bundled_a10(void **state)
{
    (void)state;
    profile p;
    load_bundled_profile("profiles/A10-FASOP.json", &p);
    assert_string_equal(p.gpu, "A10-FASOP");
    assert_true(p.memory_gib == 22.20);
    assert_true(p.peak_tflops == 125.0);
    assert_true(p.memory_bandwidth_GBps == 600.0);
    assert_true(fabs(p.optimizer_s_per_param - 32.0 / 600e9) < 1e-14);
    const profile_shape *gpt = &p.shapes[0];
    int point = profile_find_point(gpt, 1, 1);
    assert_true(gpt->points[point].layer.forward_s == 0.002342229);
    const profile_shape *bert = &p.shapes[1];
    assert_int_equal(bert->hidden, 1024);
    assert_int_equal(bert->seq, 512);
    point = profile_find_point(bert, 2, 1);
    assert_true(bert->points[point].layer.forward_s == 0.001829433);
    profile_free(&p);
}

static const char *const base_profile =
    "{\"format\": \"partita-profile/1\", \"gpu\": \"T\", \"memory_gib\": 20,"
    " \"source\": \"measured\","
    " \"provenance\": {\"device\": \"test\", \"date\": \"2026-01-01\"},"
    " \"assumptions\": {\"backward_over_forward\": 0,"
    "   \"microbatch_scaling\": \"measured\","
    "   \"layer_times_include_tp_comm\": false},"
    " \"workspace_gib\": 1, \"optimizer_s_per_param\": 1e-11,"
    " \"shapes\": [{\"hidden\": 64, \"heads\": 4, \"seq\": 32, \"vocab\": 100,"
    "   \"costs\": ["
    "     {\"tp\": 2, \"mbs\": 1,"
    "      \"embedding\": {\"forward_s\": 1e-5, \"backward_s\": 2e-5},"
    "      \"layer\": {\"forward_s\": 2e-4, \"backward_s\": 4e-4},"
    "      \"head\": {\"forward_s\": 3e-5, \"backward_s\": 6e-5}},"
    "     {\"tp\": 1, \"mbs\": 2,"
    "      \"embedding\": {\"forward_s\": 1e-5, \"backward_s\": 2e-5},"
    "      \"layer\": {\"forward_s\": 3e-4, \"backward_s\": 5e-4},"
    "      \"head\": {\"forward_s\": 3e-5, \"backward_s\": 6e-5}},"
    "     {\"tp\": 1, \"mbs\": 1,"
    "      \"embedding\": {\"forward_s\": 1e-5, \"backward_s\": 2e-5},"
    "      \"layer\": {\"forward_s\": 1e-4, \"backward_s\": 2e-4},"
    "      \"head\": {\"forward_s\": 3e-5, \"backward_s\": 6e-5}}]}],"
    " \"communication\": {"
    "   \"allreduce\": [{\"gpus\": 4, \"bytes\": 1024, \"time_s\": 3e-5},"
    "                 {\"gpus\": 2, \"bytes\": 4096, \"time_s\": 2e-5},"
    "                 {\"gpus\": 2, \"bytes\": 1024, \"time_s\": 1e-5}],"
    "   \"sendrecv\": [{\"gpus\": 2, \"bytes\": 1024, \"time_s\": 1e-5}],"
    "   \"reducescatter\": [{\"gpus\": 2, \"bytes\": 1024, \"time_s\": 6e-6}],"
    "   \"allgather\": [{\"gpus\": 2, \"bytes\": 2048, \"time_s\": 7e-6,"
    "                  \"compute_lost\": 0.4},"
    "                 {\"gpus\": 2, \"bytes\": 1024, \"time_s\": 5e-6}]}}";

/* A complete efficiency block with a roofline (docs/formats.md). */
#define ROOFLINE_EFFICIENCY                                                  \
    "{\"peak_tflops\": 125, \"memory_bandwidth_GBps\": 600, \"sms\": 72," \
    " \"roofline\": {\"gemm_efficiency\": 0.7,"                             \
    " \"gemm_half_work_gflop_per_sm\": 0.01, \"attention_efficiency\": 0.8," \
    " \"bandwidth_efficiency\": 0.8, \"kernel_overhead_us\": 5,"            \
    " \"bandwidth_saturation_sm_fraction\": 0.5}}"

static json_t *base_json(void)
{
    json_error_t parse_error;
    json_t *root = json_loads(base_profile, 0, &parse_error);
    if (root == NULL)
        fail_msg("base profile: %s", parse_error.text);
    return root;
}

/* root (taken) read as profiles/T.json, which must load. */
static void load_json(json_t *root, profile *p)
{
    json_place place = json_place_root("profiles/T.json");
    pt_error err = {""};
    if (profile_from_json(root, &place, p, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
}

static void test_valid_inline(void **state)
{
    (void)state;
    profile p;
    load_json(base_json(), &p);
    /* Points come sorted by tp, then mbs. */
    const profile_shape *shape = &p.shapes[0];
    assert_int_equal(shape->ffn_hidden, 256);
    assert_int_equal(shape->points[0].tp, 1);
    assert_int_equal(shape->points[0].mbs, 1);
    assert_int_equal(shape->points[1].mbs, 2);
    assert_int_equal(shape->points[2].tp, 2);
    assert_true(shape->points[1].layer.backward_s == 5e-4);
    /* Samples come sorted by GPUs, then bytes. */
    assert_int_equal(p.allreduce.sample_count, 3);
    assert_int_equal(p.allreduce.samples[0].gpus, 2);
    assert_true(p.allreduce.samples[0].bytes == 1024);
    assert_true(p.allreduce.samples[1].bytes == 4096);
    assert_int_equal(p.allreduce.samples[2].gpus, 4);
    assert_int_equal(p.sendrecv.sample_count, 1);
    assert_int_equal(p.reduce_scatter.sample_count, 1);
    assert_true(p.reduce_scatter.samples[0].time_s == 6e-6);
    assert_int_equal(p.all_gather.sample_count, 2);
    assert_true(p.all_gather.samples[0].bytes == 1024);
    /* measured beside products at one size: 0 (not measured) elsewhere */
    assert_true(p.all_gather.samples[0].compute_lost == 0.0);
    assert_true(p.all_gather.samples[1].compute_lost == 0.4);
    assert_int_equal(p.mbs_scaling, MBS_SCALING_MEASURED);
    assert_false(p.layer_times_include_tp_comm);
    assert_true(p.peak_tflops == 0.0);
    profile_free(&p);
}

static void test_derived_without_shapes(void **state)
{
    (void)state;
    json_t *root = base_json();
    json_object_del(root, "shapes");
    json_object_set_new(root, "source", json_string("derived"));
    json_object_set_new(root, "efficiency",
                        json_pack("{s:f, s:f, s:f}", "peak_tflops", 989.0,
                                  "flops_efficiency", 0.45,
                                  "memory_bandwidth_GBps", 4800.0));
    json_place place = json_place_root("profiles/T.json");
    profile p;
    pt_error err = {""};
    if (profile_from_json(root, &place, &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(p.source, PROFILE_DERIVED);
    assert_int_equal(p.shape_count, 0);
    assert_true(p.flops_efficiency == 0.45);
    profile_free(&p);
    json_decref(root);
}

/* Applies an edit to the base profile (a JSON pointer-like path of object
 * keys and array indexes, then the new value, NULL to delete). */
typedef struct profile_edit {
    const char *where[8];
    const char *new_value; /* JSON text, or NULL: delete the key */
} profile_edit;

typedef struct bad_profile {
    profile_edit edits[3];
    const char *message;
} bad_profile;

static json_t *walk(json_t *root, const char *const *where, const char **last)
{
    json_t *node = root;
    size_t depth = 0;
    while (where[depth + 1] != NULL) {
        const char *step = where[depth];
        node = json_is_array(node) ? json_array_get(node, (size_t)atoi(step))
                                   : json_object_get(node, step);
        assert_non_null(node);
        depth++;
    }
    *last = where[depth];
    return node;
}

static void apply_edit(json_t *root, const profile_edit *edit)
{
    const char *last;
    json_t *parent = walk(root, edit->where, &last);
    if (edit->new_value == NULL) {
        assert_int_equal(json_object_del(parent, last), 0);
        return;
    }
    json_error_t parse_error;
    json_t *value = json_loads(edit->new_value, JSON_DECODE_ANY,
                               &parse_error);
    assert_non_null(value);
    if (json_is_array(parent))
        assert_int_equal(json_array_set_new(parent, (size_t)atoi(last),
                                            value), 0);
    else
        assert_int_equal(json_object_set_new(parent, last, value), 0);
}

/* head.fused: absent (every profile before it) means unfused; the
 * writer writes it where it is true only, so older files write back as
 * they were. */
static void test_head_timed_fused(void **state)
{
    (void)state;
    profile p;
    load_json(base_json(), &p);
    for (int i = 0; i < p.shapes[0].point_count; i++)
        assert_false(p.shapes[0].points[i].head_fused);
    pt_error err = {""};
    json_t *written = profile_to_json(&p, "T", &err);
    assert_non_null(written);
    const char *no_fused = json_dumps(written, JSON_COMPACT);
    assert_null(strstr(no_fused, "fused"));
    free((void *)no_fused);
    json_decref(written);
    profile_free(&p);

    json_t *root = base_json();
    profile_edit fused = {{"shapes", "0", "costs", "2", "head", "fused"},
                          "true"};
    apply_edit(root, &fused);
    profile_edit unfused = {{"shapes", "0", "costs", "1", "head", "fused"},
                            "false"};
    apply_edit(root, &unfused);
    load_json(root, &p);
    /* sorted: tp 1 mbs 1 (costs[2]), tp 1 mbs 2, tp 2 mbs 1 */
    assert_true(p.shapes[0].points[0].head_fused);
    assert_false(p.shapes[0].points[1].head_fused);
    assert_false(p.shapes[0].points[2].head_fused);
    written = profile_to_json(&p, "T", &err);
    assert_non_null(written);
    json_t *costs = json_object_get(
        json_array_get(json_object_get(written, "shapes"), 0), "costs");
    json_t *head0 = json_object_get(json_array_get(costs, 0), "head");
    assert_true(json_is_true(json_object_get(head0, "fused")));
    for (size_t i = 1; i < 3; i++)
        assert_null(json_object_get(
            json_object_get(json_array_get(costs, i), "head"), "fused"));
    profile copy;
    assert_int_equal(profile_copy(&copy, &p, &err), 0);
    assert_true(copy.shapes[0].points[0].head_fused);
    profile_free(&copy);
    json_decref(written);
    profile_free(&p);
}

static void test_bad_profiles(void **state)
{
    (void)state;
    static const bad_profile cases[] = {
        {{{{"shapes", "0", "costs", "1", "layer", "forward_s"}, "0"}},
         "profiles/T.json: shapes[0].costs[1].layer.forward_s: must be a "
         "positive number, got 0"},
        {{{{"shapes", "0", "costs", "0", "head", "backward_s"}, "-1e-5"}},
         "shapes[0].costs[0].head.backward_s: must be a positive number, "
         "got -1e-05"},
        {{{{"shapes", "0", "costs", "1", "mbs"}, "1"},
          {{"shapes", "0", "costs", "1", "tp"}, "2"}},
         "shapes[0].costs[1]: tp 2, mbs 1 is already given in costs[0]"},
        {{{{"shapes", "0", "costs", "0", "tp"}, "3"}},
         "shapes[0].costs[0].tp: must be a power of two, got 3"},
        {{{{"shapes", "0", "costs", "0", "tp"}, "8"}},
         "shapes[0].costs[0].tp: 8 does not divide hidden 64, ffn_hidden "
         "256 and heads 4"},
        {{{{"shapes", "0", "costs", "0", "layer", "backward_s"}, NULL}},
         "shapes[0].costs[0].layer.backward_s: missing (required unless "
         "assumptions.backward_over_forward > 0)"},
        {{{{"shapes", "0", "costs", "0", "layer", "forward_s"}, "120"}},
         "shapes[0].costs[0].layer: 120 s forward"},
        {{{{"shapes"}, "[]"}},
         "profiles/T.json: has no shapes and no efficiency model"},
        {{{{"shapes"}, NULL},
          {{"efficiency"}, "{\"peak_tflops\": 100, "
                           "\"memory_bandwidth_GBps\": 900}"}},
         "profiles/T.json: efficiency: flops_efficiency 0 means"},
        {{{{"source"}, "\"derived\""}},
         "profiles/T.json: efficiency: missing (required when source is "
         "\"derived\")"},
        {{{{"workspace_gib"}, "20"}},
         "profiles/T.json: workspace_gib: 20 GiB leaves nothing of "
         "memory_gib 20 GiB"},
        {{{{"memory_gib"}, "0"}},
         "profiles/T.json: memory_gib: must be a number in [0.001, 100000], "
         "got 0"},
        /* issue 18, item 9: values beyond physical sense, with the range */
        {{{{"memory_gib"}, "1e308"}},
         "profiles/T.json: memory_gib: must be a number in [0.001, 100000], "
         "got 1e+308"},
        {{{{"workspace_gib"}, "1e300"}},
         "profiles/T.json: workspace_gib: must be a number in [0, 100000], "
         "got 1e+300"},
        {{{{"provenance"}, NULL}},
         "profiles/T.json: provenance: missing (required"},
        {{{{"provenance"}, "\"me\""}},
         "profiles/T.json: provenance: must be an object, got the string"},
        {{{{"provenance"}, "{}"}},
         "profiles/T.json: provenance: must not be empty"},
        {{{{"source"}, "\"guessed\""}},
         "profiles/T.json: source: must be one of \"measured\", "
         "\"published\", \"derived\", got \"guessed\""},
        {{{{"format"}, "\"partita-profile/2\""}},
         "profiles/T.json: format: must be \"partita-profile/1\""},
        {{{{"assumptions", "microbatch_scaling"}, "\"cubic\""}},
         "assumptions.microbatch_scaling: must be one of"},
        {{{{"assumptions"}, NULL}},
         "profiles/T.json: assumptions: missing (required)"},
        {{{{"assumptions", "tp_comm"}, "true"}},
         "profiles/T.json: assumptions.tp_comm: unknown key"},
        {{{{"optimizer_s_per_param"}, NULL}},
         "optimizer_s_per_param: missing (required)"},
        {{{{"shapes", "0", "costs"}, "[]"}},
         "shapes[0].costs: must be a non-empty array"},
        {{{{"shapes", "0", "hidden"}, "0"}},
         "shapes[0].hidden: must be a positive integer, got 0"},
        {{{{"shapes", "0", "costs", "0", "layers"}, "{}"}},
         "shapes[0].costs[0].layers: unknown key"},
        {{{{"shapes", "0"}, "{}"}},
         "shapes[0].hidden: missing (required)"},
        {{{{"communication", "allreduce", "0", "gpus"}, "1"}},
         "communication.allreduce[0].gpus: must be an integer >= 2, got 1"},
        {{{{"communication", "allreduce", "1", "bytes"}, "1024"}},
         "communication.allreduce[2]: 2 GPUs, 1024 bytes is already given "
         "in allreduce[1]"},
        {{{{"communication", "sendrecv", "0", "time_s"}, "0"}},
         "communication.sendrecv[0].time_s: must be a positive number"},
        {{{{"communication", "broadcast"}, "[]"}},
         "communication.broadcast: unknown key"},
        {{{{"communication", "allgather", "0", "compute_lost"}, "0"}},
         "communication.allgather[0].compute_lost: must be"},
        {{{{"gpu"}, "\"a/b\""}}, "profiles/T.json: gpu: must be a "
                                 "non-empty name without '/'"},
        /* inconsistent profiles */
        {{{{"shapes", "0", "heads"}, "5"}},
         "profiles/T.json: shapes[0].heads: 5 does not divide hidden 64"},
        {{{{"shapes", "0", "costs", "2", "layer", "forward_s"}, "0.002"}},
         "profiles/T.json: shapes[0].costs: inconsistent: at tp 1 the layer "
         "forward takes 0.002 s at mbs 1 but only 0.0003 s at mbs 2"},
        {{{{"optimizer_s_per_param"}, "0.001"}},
         "profiles/T.json: optimizer_s_per_param: 0.001 s per parameter is "
         "more than 1e-06: a unit mistake?"},
        {{{{"host_copy_s_per_param"}, "0.002"}},
         "profiles/T.json: host_copy_s_per_param: 0.002 s per parameter is "
         "more than 1e-06: a unit mistake?"},
        {{{{"host_copy_s_per_param"}, "-1"}},
         "profiles/T.json: host_copy_s_per_param: must be"},
        {{{{"communication", "allreduce", "0", "time_s"}, "100"}},
         "profiles/T.json: communication.allreduce[0]: 100 s for one "
         "collective is more than 60 s"},
        /* the efficiency model's device and roofline */
        {{{{"efficiency"}, "{\"peak_tflops\": 100, "
                           "\"memory_bandwidth_GBps\": 900, \"sms\": 10, "
                           "\"sm_limit\": 20}"}},
         "profiles/T.json: efficiency.sm_limit: 20 is more than the GPU's 10 "
         "SMs"},
        {{{{"efficiency"}, "{\"peak_tflops\": 100, "
                           "\"memory_bandwidth_GBps\": 900, "
                           "\"sm_limit\": 20}"}},
         "profiles/T.json: efficiency.sms: missing (required with sm_limit"},
        {{{{"efficiency"}, "{\"peak_tflops\": 100, "
                           "\"memory_bandwidth_GBps\": 900, \"sms\": 2.5}"}},
         "profiles/T.json: efficiency.sms: must be a positive integer, got "
         "2.5"},
        {{{{"efficiency"}, "{\"peak_tflops\": 100, "
                           "\"memory_bandwidth_GBps\": 900, "
                           "\"roofline\": {\"gemm_efficiency\": 0.7, "
                           "\"gemm_half_work_gflop_per_sm\": 0.01, "
                           "\"attention_efficiency\": 0.8, "
                           "\"bandwidth_efficiency\": 0.8, "
                           "\"kernel_overhead_us\": 5, "
                           "\"bandwidth_saturation_sm_fraction\": 0.5}}"}},
         "profiles/T.json: efficiency.sms: missing (required with a "
         "roofline"},
        {{{{"efficiency"}, ROOFLINE_EFFICIENCY},
          {{"efficiency", "roofline", "gemm_efficiency"}, "1.5"}},
         "profiles/T.json: efficiency.roofline.gemm_efficiency: must be a "
         "number in [1e-06, 1], got 1.5"},
        {{{{"efficiency"}, ROOFLINE_EFFICIENCY},
          {{"efficiency", "roofline", "kernel_overhead_us"}, NULL}},
         "profiles/T.json: efficiency.roofline.kernel_overhead_us: missing "
         "(required)"},
        {{{{"efficiency"}, ROOFLINE_EFFICIENCY},
          {{"efficiency", "roofline", "gemm_eff"}, "0.5"}},
         "profiles/T.json: efficiency.roofline.gemm_eff: unknown key"},
        {{{{"efficiency"}, ROOFLINE_EFFICIENCY},
          {{"efficiency", "roofline", "attention_efficiency"}, "-1"}},
         "efficiency.roofline.attention_efficiency: must be a number in "
         "[1e-06, 2], got -1"},
        /* a shape's layer architecture, spelt as in model files */
        {{{{"shapes", "0", "norm"}, "\"batchnorm\""}},
         "profiles/T.json: shapes[0].norm: must be \"layernorm\" or "
         "\"rmsnorm\", got \"batchnorm\""},
        {{{{"shapes", "0", "kv_heads"}, "3"}},
         "profiles/T.json: shapes[0].kv_heads: 4 heads are not divisible by "
         "3 key/value heads"},
        {{{{"shapes", "0", "rope_base"}, "10000"}},
         "profiles/T.json: shapes[0].rope_base: unknown key"},
        {{{{"shapes", "0", "hidden"}, "96"},
          {{"shapes", "0", "heads"}, "6"},
          {{"shapes", "0", "kv_heads"}, "3"}},
         "profiles/T.json: shapes[0].costs[0].tp: 2 neither divides the 3 "
         "key/value heads nor is a multiple of them"},
        /* only the head says how it was timed */
        {{{{"shapes", "0", "costs", "1", "layer", "fused"}, "true"}},
         "profiles/T.json: shapes[0].costs[1].layer.fused: unknown key"},
        {{{{"shapes", "0", "costs", "1", "head", "fused"}, "1"}},
         "profiles/T.json: shapes[0].costs[1].head.fused: must be true or "
         "false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *root = base_json();
        for (size_t e = 0; e < 3 && cases[i].edits[e].where[0] != NULL; e++)
            apply_edit(root, &cases[i].edits[e]);
        json_place place = json_place_root("profiles/T.json");
        profile p;
        pt_error err = {""};
        if (profile_from_json(root, &place, &p, &err) == 0)
            fail_msg("case %zu loaded; expected \"%s\"", i, cases[i].message);
        EXPECT_MESSAGE(&err, cases[i].message);
        assert_null(p.shapes);
        assert_null(p.provenance);
        json_decref(root);
    }
}

static void test_derived_with_roofline(void **state)
{
    (void)state;
    json_t *root = base_json();
    json_object_del(root, "shapes");
    json_object_set_new(root, "source", json_string("derived"));
    json_error_t parse_error;
    json_object_set_new(root, "efficiency",
                        json_loads(ROOFLINE_EFFICIENCY, 0, &parse_error));
    json_place place = json_place_root("profiles/T.json");
    profile p;
    pt_error err = {""};
    if (profile_from_json(root, &place, &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_true(p.roofline.present);
    assert_int_equal(p.sms, 72);
    assert_int_equal(p.sm_limit, 0);
    assert_true(p.roofline.gemm_efficiency == 0.7);
    /* units converted: GFLOP per SM and microseconds */
    assert_true(fabs(p.roofline.gemm_half_work_flop - 1e7) < 1e-3);
    assert_true(fabs(p.roofline.kernel_overhead_s - 5e-6) < 1e-18);
    assert_true(p.roofline.bandwidth_saturation_sm_fraction == 0.5);
    profile_free(&p);

    /* an SM-limited measurement records its share of the GPU */
    json_object_set_new(json_object_get(root, "efficiency"), "sm_limit",
                        json_integer(40));
    if (profile_from_json(root, &place, &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(p.sm_limit, 40);
    profile_free(&p);
    json_decref(root);
}

static void test_bundled_derived(void **state)
{
    (void)state;
    static const char *const files[] = {
        "profiles/A10.json", "profiles/RTX3090.json",
        "profiles/A100-40GB.json", "profiles/A100-80GB.json",
        "profiles/V100-16GB.json", "profiles/V100-32GB.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        profile p;
        load_bundled_profile(files[i], &p);
        assert_int_equal(p.source, PROFILE_DERIVED);
        assert_true(p.roofline.present);
        assert_true(p.sms > 0 && p.peak_tflops > 0.0);
        assert_int_equal(p.shape_count, 0);
        assert_non_null(json_object_get(p.provenance, "spec"));
        assert_non_null(json_object_get(p.provenance, "fitted_on"));
        assert_non_null(json_object_get(p.provenance, "command"));
        profile_free(&p);
    }
}

static void test_backward_filled_by_ratio(void **state)
{
    (void)state;
    json_t *root = base_json();
    profile_edit edits[] = {
        {{"assumptions", "backward_over_forward"}, "2.5"},
        {{"shapes", "0", "costs", "2", "layer", "backward_s"}, NULL},
    };
    for (size_t e = 0; e < 2; e++)
        apply_edit(root, &edits[e]);
    json_place place = json_place_root("profiles/T.json");
    profile p;
    pt_error err = {""};
    if (profile_from_json(root, &place, &p, &err) != 0)
        fail_msg("%s", err.message);
    int point = profile_find_point(&p.shapes[0], 1, 1);
    assert_true(fabs(p.shapes[0].points[point].layer.backward_s - 2.5e-4) <
                1e-15);
    /* A given backward time wins over the ratio. */
    assert_true(p.shapes[0].points[point].head.backward_s == 6e-5);
    profile_free(&p);
    json_decref(root);
}

static void test_profile_find(void **state)
{
    char path[512];
    scratch_write(state, "extra/X.json", "{}", path, sizeof path);
    scratch_write(state, "env/X.json", "{}", path, sizeof path);
    scratch_write(state, "env/Y.json", "{}", path, sizeof path);
    scratch_write(state, "profiles/X.json", "{}", path, sizeof path);
    scratch_write(state, "profiles/Y.json", "{}", path, sizeof path);
    scratch_write(state, "profiles/Z.json", "{}", path, sizeof path);
    scratch_write(state, "clusters/c.json", "{}", path, sizeof path);
    char extra[512], env[512], cluster_dir[512], found[PT_PATH_MAX];
    snprintf(extra, sizeof extra, "%s/extra", scratch_dir(state));
    snprintf(env, sizeof env, "%s/env", scratch_dir(state));
    snprintf(cluster_dir, sizeof cluster_dir, "%s/clusters",
             scratch_dir(state));
    char *saved = getenv("PARTITA_PROFILES");
    char saved_copy[PT_PATH_MAX] = "";
    if (saved != NULL)
        pt_copy_string(saved_copy, sizeof saved_copy, saved);
    setenv("PARTITA_PROFILES", env, 1);

    pt_error err = {""};
    assert_int_equal(profile_find("X", extra, cluster_dir, found,
                                  sizeof found, &err), 0);
    assert_non_null(strstr(found, "/extra/X.json"));
    assert_int_equal(profile_find("Y", extra, cluster_dir, found,
                                  sizeof found, &err), 0);
    assert_non_null(strstr(found, "/env/Y.json"));
    assert_int_equal(profile_find("Z", extra, cluster_dir, found,
                                  sizeof found, &err), 0);
    assert_non_null(strstr(found, "/clusters/../profiles/Z.json"));
    /* The source tree's profiles come after the cluster's neighbours. */
    assert_int_equal(profile_find("A100-FASOP", NULL, NULL, found,
                                  sizeof found, &err), 0);
    assert_non_null(strstr(found, "profiles/A100-FASOP.json"));

    assert_int_equal(profile_find("Missing", extra, cluster_dir, found,
                                  sizeof found, &err), -1);
    EXPECT_MESSAGE(&err, "no profile for GPU \"Missing\"", "Missing.json",
                   "/extra (--profiles)", "/env ($PARTITA_PROFILES)",
                   "/clusters/../profiles (beside the folder of the file "
                   "holding the cluster)",
                   "(installed)");
    assert_int_equal(profile_find("../etc/passwd", NULL, NULL, found,
                                  sizeof found, &err), -1);
    EXPECT_MESSAGE(&err, "cannot name a profile file");
    assert_int_equal(profile_find("", NULL, NULL, found, sizeof found, &err),
                     -1);

    /* issue 18, item 7: a folder the user names must be there, never a
       silent fall back to the bundled profiles */
    assert_int_equal(profile_find("A100-FASOP", "/nonexistent-profiles",
                                  NULL, found, sizeof found, &err), -1);
    EXPECT_MESSAGE(&err, "--profiles /nonexistent-profiles: cannot read the "
                         "folder");
    setenv("PARTITA_PROFILES", "/nonexistent-env", 1);
    assert_int_equal(profile_find("A100-FASOP", NULL, NULL, found,
                                  sizeof found, &err), -1);
    EXPECT_MESSAGE(&err, "$PARTITA_PROFILES /nonexistent-env");

    if (saved_copy[0] != '\0')
        setenv("PARTITA_PROFILES", saved_copy, 1);
    else
        unsetenv("PARTITA_PROFILES");
}

/* issue 18, item 8: a profile found by its file name must hold that
 * GPU, or it prices another GPU's nodes without a word */
static void test_profile_named_for_another_gpu(void **state)
{
    char bundled[PT_PATH_MAX], text_path[512];
    source_path("profiles/A10-FASOP.json", bundled, sizeof bundled);
    size_t length;
    char *text = read_whole_file(bundled, &length);
    scratch_write(state, "profiles/A100-FASOP.json", text, text_path,
                  sizeof text_path);
    free(text);
    profile p;
    pt_error err = {""};
    assert_int_equal(profile_load_for_gpu(text_path, "A100-FASOP", &p, &err),
                     -1);
    EXPECT_MESSAGE(&err, "A100-FASOP.json: gpu: is \"A10-FASOP\"",
                   "profile of GPU \"A100-FASOP\"");
    assert_int_equal(profile_load_for_gpu(bundled, "A10-FASOP", &p, &err), 0);
    profile_free(&p);
}

/* The base profile's shape again as a Llama layer (RMSNorm, SwiGLU,
 * rotary positions, 2 key/value heads of 4, no biases), with layer times
 * ten times the GPT-2 shape's. */
static json_t *with_llama_shape(void)
{
    json_t *root = base_json();
    json_t *shapes = json_object_get(root, "shapes");
    json_t *llama = json_deep_copy(json_array_get(shapes, 0));
    json_object_set_new(llama, "kv_heads", json_integer(2));
    json_object_set_new(llama, "norm", json_string("rmsnorm"));
    json_object_set_new(llama, "mlp", json_string("swiglu"));
    json_object_set_new(llama, "positions", json_string("rope"));
    json_object_set_new(llama, "bias", json_false());
    json_t *costs = json_object_get(llama, "costs");
    for (size_t i = 0; i < json_array_size(costs); i++) {
        json_t *layer = json_object_get(json_array_get(costs, i), "layer");
        const char *keys[] = {"forward_s", "backward_s"};
        for (int k = 0; k < 2; k++)
            json_object_set_new(
                layer, keys[k],
                json_real(10.0 *
                          json_number_value(json_object_get(layer, keys[k]))));
    }
    json_array_append_new(shapes, llama);
    return root;
}

/* issue 35, item 4: a Llama layer and a GPT-2 layer of the same widths are
 * two shapes of one profile, each found by its own model only; the file
 * without architecture keys (every profile before) is GPT-2's, and the
 * keys are written back only where they are not GPT-2's. */
static void test_llama_shape_keyed_apart(void **state)
{
    (void)state;
    profile p;
    load_json(with_llama_shape(), &p);
    json_place place = json_place_root("profiles/T.json");
    pt_error err = {""};
    assert_int_equal(p.shape_count, 2);
    assert_int_equal(p.shapes[0].norm, MODEL_NORM_LAYERNORM);
    assert_int_equal(p.shapes[0].kv_heads, 0);
    assert_int_equal(p.shapes[1].norm, MODEL_NORM_RMSNORM);
    assert_int_equal(p.shapes[1].mlp, MODEL_MLP_SWIGLU);
    assert_int_equal(p.shapes[1].positions, MODEL_POSITIONS_ROPE);
    assert_int_equal(p.shapes[1].bias, MODEL_BIAS_NONE);
    assert_int_equal(p.shapes[1].kv_heads, 2);

    model_shape gpt = profile_shape_model(&p.shapes[0]);
    model_shape llama = profile_shape_model(&p.shapes[1]);
    assert_true(model_is_gpt(&gpt));
    assert_false(model_is_gpt(&llama));
    assert_int_equal(profile_find_shape(&p, &gpt), 0);
    assert_int_equal(profile_find_shape(&p, &llama), 1);
    /* one field away from the Llama layer is neither shape */
    const char *fields[] = {"kv_heads", "norm", "mlp", "positions", "bias"};
    for (int f = 0; f < 5; f++) {
        model_shape other = llama;
        if (f == 0)
            other.kv_heads = 1;
        else if (f == 1)
            other.norm = MODEL_NORM_LAYERNORM;
        else if (f == 2)
            other.mlp = MODEL_MLP_GELU;
        else if (f == 3)
            other.positions = MODEL_POSITIONS_LEARNED;
        else
            other.bias = MODEL_BIAS_QKV;
        if (profile_find_shape(&p, &other) != -1)
            fail_msg("a Llama layer but its %s found a shape", fields[f]);
    }
    /* the key/value heads count as a share of the heads: 4 of 8 is 2 of 4 */
    model_shape wider_heads = llama;
    wider_heads.heads = 8;
    wider_heads.kv_heads = 4;
    assert_int_equal(profile_find_shape(&p, &wider_heads), 1);
    /* what the owner writes: the GPT-2 shape as before, the Llama shape
       with its architecture (no constants: rope_base, norm_eps) */
    json_t *written = profile_to_json(&p, "T", &err);
    assert_non_null(written);
    json_t *shapes = json_object_get(written, "shapes");
    json_t *first = json_array_get(shapes, 0), *second = json_array_get(shapes, 1);
    assert_null(json_object_get(first, "norm"));
    assert_null(json_object_get(first, "kv_heads"));
    assert_string_equal(json_string_value(json_object_get(second, "norm")),
                        "rmsnorm");
    assert_int_equal(json_integer_value(json_object_get(second, "kv_heads")),
                     2);
    assert_true(json_is_false(json_object_get(second, "bias")));
    assert_null(json_object_get(second, "rope_base"));
    assert_null(json_object_get(second, "norm_eps"));
    json_decref(written);

    /* the same architecture and widths twice is one key */
    json_t *root = with_llama_shape();
    json_array_append(json_object_get(root, "shapes"),
                      json_array_get(json_object_get(root, "shapes"), 1));
    profile twice;
    assert_int_equal(profile_from_json(root, &place, &twice, &err), -1);
    EXPECT_MESSAGE(&err, "shapes[2]: same hidden, ffn_hidden, seq, vocab and "
                         "layer architecture as shapes[1]");
    json_decref(root);

    /* --missing-only's merge adds the Llama shape to a GPT-2 profile */
    profile gpt_only;
    load_json(base_json(), &gpt_only);
    int added = 0;
    assert_int_equal(profile_add_points(&gpt_only, &p, &added, &err), 0);
    assert_int_equal(added, p.shapes[1].point_count);
    assert_int_equal(gpt_only.shape_count, 2);
    assert_int_equal(profile_find_shape(&gpt_only, &llama), 1);
    assert_true(gpt_only.shapes[1].points[0].layer.forward_s ==
                p.shapes[1].points[0].layer.forward_s);
    profile_free(&gpt_only);
    profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bundled_a100),
        cmocka_unit_test(test_bundled_a10),
        cmocka_unit_test(test_valid_inline),
        cmocka_unit_test(test_head_timed_fused),
        cmocka_unit_test(test_derived_without_shapes),
        cmocka_unit_test(test_derived_with_roofline),
        cmocka_unit_test(test_bundled_derived),
        cmocka_unit_test(test_bad_profiles),
        cmocka_unit_test(test_backward_filled_by_ratio),
        cmocka_unit_test(test_profile_find),
        cmocka_unit_test(test_profile_named_for_another_gpu),
        cmocka_unit_test(test_llama_shape_keyed_apart),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
