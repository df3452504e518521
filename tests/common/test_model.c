/* Models (models/): the bundled ones and the reader's errors. */
#include <math.h>
#include <string.h>

#include "test_support.h"

typedef struct bundled_model {
    const char *file;
    int layers, hidden, heads, ffn_hidden, seq, vocab;
    double parameters; /* exact count, tied head */
} bundled_model;

static const bundled_model bundled[] = {
    {"models/gpt2-124m.json", 12, 768, 12, 3072, 1024, 50257, 124439808.0},
    {"models/gpt2-350m.json", 24, 1024, 16, 4096, 1024, 50257, 354823168.0},
    {"models/gpt2-774m.json", 36, 1280, 20, 5120, 1024, 50257, 774030080.0},
    {"models/gpt2-xl.json", 48, 1600, 25, 6400, 1024, 50257, 1557611200.0},
    {"models/bert-large.json", 24, 1024, 16, 4096, 512, 30522, 0},
    {"models/gpt-13b.json", 40, 5120, 32, 20480, 2048, 50257, 0},
    {"models/gpt-175b.json", 96, 12288, 96, 49152, 2048, 50257, 0},
};

static void test_bundled_models(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bundled / sizeof *bundled; i++) {
        const bundled_model *expected = &bundled[i];
        char path[PT_PATH_MAX];
        source_path(expected->file, path, sizeof path);
        model_shape model;
        pt_error err = {""};
        if (model_load_file(path, &model, &err) != 0)
            fail_msg("%s", err.message);
        assert_int_equal(model.layers, expected->layers);
        assert_int_equal(model.hidden, expected->hidden);
        assert_int_equal(model.heads, expected->heads);
        assert_int_equal(model.ffn_hidden, expected->ffn_hidden);
        assert_int_equal(model.seq, expected->seq);
        assert_int_equal(model.vocab, expected->vocab);
        assert_true(model.tied_embeddings);
        if (expected->parameters > 0)
            assert_true(model_parameter_count(&model) ==
                        expected->parameters);
    }
}

static void test_parameter_counts(void **state)
{
    (void)state;
    model_shape model = {.name = "tiny", .layers = 2, .hidden = 4,
                         .heads = 2, .ffn_hidden = 16, .seq = 8,
                         .vocab = 10, .tied_embeddings = true};
    /* qkv 3*16+12, proj 16+4, fc 64+16, fc_proj 64+4, norms 16 */
    assert_true(model_layer_parameter_count(&model) == 60 + 20 + 80 + 68 + 16);
    double tied = 10 * 4 + 8 * 4 + 2 * 244.0 + 8;
    assert_true(model_parameter_count(&model) == tied);
    model.tied_embeddings = false;
    assert_true(model_parameter_count(&model) == tied + 40);

    /* GPT-3 175B: the well-known figure is about 175 billion. */
    char path[PT_PATH_MAX];
    source_path("models/gpt-175b.json", path, sizeof path);
    assert_int_equal(model_load_file(path, &model, NULL), 0);
    double parameters = model_parameter_count(&model);
    assert_true(parameters > 174.5e9 && parameters < 175.5e9);
}

static void test_defaults(void **state)
{
    char path[512];
    scratch_write(state, "small.json",
                  "{\"name\": \"small\", \"layers\": 2, \"hidden\": 64, "
                  "\"heads\": 4, \"seq\": 32, \"vocab\": 100, "
                  "\"notes\": [\"anything\", {\"goes\": 1}]}",
                  path, sizeof path);
    model_shape model;
    pt_error err = {""};
    if (model_load_file(path, &model, &err) != 0)
        fail_msg("%s", err.message);
    assert_string_equal(model.name, "small");
    assert_int_equal(model.ffn_hidden, 256);
    assert_true(model.tied_embeddings);
}

typedef struct bad_model {
    const char *json;
    const char *message;
} bad_model;

/* Each case's file is refused with its message. */
static void expect_refused(void **state, const bad_model *cases,
                           size_t count)
{
    for (size_t i = 0; i < count; i++) {
        char path[512];
        scratch_write(state, "bad.json", cases[i].json, path, sizeof path);
        model_shape model;
        pt_error err = {""};
        assert_int_equal(model_load_file(path, &model, &err), -1);
        EXPECT_MESSAGE(&err, cases[i].message);
    }
}

static void test_bad_models(void **state)
{
    static const bad_model cases[] = {
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"layer\": 3}",
         "bad.json: layer: unknown key"},
        {"{\"name\": \"m\", \"layers\": 0, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100}",
         "bad.json: layers: must be a positive integer, got 0"},
        {"{\"name\": \"m\", \"layers\": \"2\", \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100}",
         "bad.json: layers: must be a positive integer, got the string"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 5, "
         "\"seq\": 32, \"vocab\": 100}",
         "bad.json: heads: hidden 64 is not divisible by 5 heads"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"vocab\": 100}",
         "bad.json: seq: missing (required)"},
        {"{\"name\": \"\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100}",
         "bad.json: name: must not be empty"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"tied_embeddings\": \"yes\"}",
         "bad.json: tied_embeddings: must be true or false"},
        {"[1, 2]", "bad.json: must be an object, got an array"},
        {"{\"name\": \"m\", \"layers\": 2,,}", "bad.json:1:"},
    };
    expect_refused(state, cases, sizeof cases / sizeof *cases);
}

/* The bundled Llama-family models against the parameter counts their
 * makers publish: the exact totals of their released weights (Hugging
 * Face's safetensors metadata) to 0.1 %, and the rounded figures of
 * their model cards to the digits those give. */
typedef struct published_model {
    const char *file;
    double exact;        /* released weights' total */
    double rounded;      /* the model card's figure */
    double rounding;     /* half its last digit */
} published_model;

static const published_model published[] = {
    {"models/llama3-8b.json", 8030261248.0, 8.03e9, 0.005e9},
    {"models/llama3-70b.json", 70553706496.0, 70.6e9, 0.05e9},
    {"models/llama2-7b.json", 6738415616.0, 6.74e9, 0.005e9},
    {"models/llama3.2-1b.json", 1235814400.0, 1.24e9, 0.005e9},
    {"models/llama2-13b.json", 13015864320.0, 13.0e9, 0.05e9},
    {"models/llama2-70b.json", 68976648192.0, 69.0e9, 0.5e9},
    {"models/llama3.1-405b.json", 405853388800.0, 406e9, 0.5e9},
    {"models/mistral-7b.json", 7241732096.0, 7.24e9, 0.005e9},
    {"models/qwen2.5-7b.json", 7615616512.0, 7.62e9, 0.005e9},
};

static void test_llama_family(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof published / sizeof *published; i++) {
        char path[PT_PATH_MAX];
        source_path(published[i].file, path, sizeof path);
        model_shape model;
        pt_error err = {""};
        if (model_load_file(path, &model, &err) != 0)
            fail_msg("%s", err.message);
        double count = model_parameter_count(&model);
        double off = fabs(count - published[i].exact) / published[i].exact;
        if (off > 0.001 ||
            fabs(count - published[i].rounded) > published[i].rounding)
            fail_msg("%s: %.0f parameters, published %.0f (%.3g)",
                     published[i].file, count, published[i].exact,
                     published[i].rounded);
        assert_false(model_is_gpt(&model));
        assert_int_equal(model.norm, MODEL_NORM_RMSNORM);
        assert_int_equal(model.mlp, MODEL_MLP_SWIGLU);
        assert_int_equal(model.positions, MODEL_POSITIONS_ROPE);
        /* the official configurations' rms_norm_eps */
        double eps = strstr(published[i].file, "qwen") != NULL ? 1e-6 : 1e-5;
        assert_true(model_norm_eps(&model) == eps);
    }
}

/* A Llama layer's parameters by hand: h 8, 4 heads of 2, 2 key/value
 * heads, f 12; q 8x8, k and v 8x4 each, o 8x8, SwiGLU 3 x 8x12, two
 * RMSNorm weights of 8. */
static void test_llama_layer_by_hand(void **state)
{
    (void)state;
    model_shape model = {.name = "toy", .layers = 3, .hidden = 8,
                         .heads = 4, .kv_heads = 2, .ffn_hidden = 12,
                         .seq = 16, .vocab = 10, .tied_embeddings = false,
                         .norm = MODEL_NORM_RMSNORM, .mlp = MODEL_MLP_SWIGLU,
                         .positions = MODEL_POSITIONS_ROPE,
                         .rope_base = 10000.0, .bias = MODEL_BIAS_NONE};
    double layer = 64 + 2 * 32 + 64 + 3 * 96 + 16;
    assert_true(model_layer_parameter_count(&model) == layer);
    /* no position embedding; untied head; final RMSNorm 8 */
    assert_true(model_parameter_count(&model) == 80 + 3 * layer + 8 + 80);
    model.bias = MODEL_BIAS_QKV; /* q 8, k 4, v 4 */
    assert_true(model_layer_parameter_count(&model) == layer + 16);
    /* tp 4 > 2 key/value heads: each rank holds one whole k and v head
       (2 x (8 x 2 + 2) = 36 parameters) where its share is half of one */
    assert_true(model_layer_parameters_per_rank(&model, 4) ==
                (layer + 16) / 4 + 36 * 0.5);
    assert_true(model_layer_parameters_per_rank(&model, 2) ==
                (layer + 16) / 2);
    assert_int_equal(model_check_tp(&model, 4, NULL), 0);
    assert_int_equal(model_check_tp(&model, 8, NULL), -1);
    assert_string_equal(model_non_gpt_field(&model), "kv_heads");
}

/* What a Llama model writes reads back the same; a GPT model's JSON has
 * none of the new keys. */
static void test_architecture_round_trip(void **state)
{
    (void)state;
    char path[PT_PATH_MAX];
    source_path("models/qwen2.5-7b.json", path, sizeof path);
    model_shape model, again;
    assert_int_equal(model_load_file(path, &model, NULL), 0);
    json_t *json = model_to_json(&model);
    json_place place = json_place_root("again");
    assert_int_equal(model_from_json(json, &place, &again, NULL), 0);
    json_decref(json);
    assert_memory_equal(&model, &again, sizeof model);
    assert_int_equal(again.bias, MODEL_BIAS_QKV);
    assert_true(again.rope_base == 1e6);
    assert_true(again.norm_eps == 1e-6);

    source_path("models/gpt2-124m.json", path, sizeof path);
    assert_int_equal(model_load_file(path, &model, NULL), 0);
    assert_true(model_is_gpt(&model));
    json = model_to_json(&model);
    assert_int_equal(json_object_size(json), 8);
    json_decref(json);
    /* LayerNorm's epsilon is fixed; RMSNorm's defaults to 1e-5 */
    assert_true(model_norm_eps(&model) == 1e-5);
    model.norm = MODEL_NORM_RMSNORM;
    model.norm_eps = 0.0;
    assert_true(model_norm_eps(&model) == 1e-5);
}

static void test_bad_architectures(void **state)
{
    static const bad_model cases[] = {
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"kv_heads\": 3}",
         "bad.json: kv_heads: 4 heads are not divisible by 3 key/value "
         "heads"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"kv_heads\": 8}",
         "bad.json: kv_heads: must be"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"norm\": \"batchnorm\"}",
         "bad.json: norm: must be \"layernorm\" or \"rmsnorm\", got "
         "\"batchnorm\""},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"mlp\": \"relu\"}",
         "bad.json: mlp: must be \"gelu\" or \"swiglu\""},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"rope_base\": 10000}",
         "bad.json: rope_base: needs \"positions\": \"rope\""},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"positions\": \"rope\", "
         "\"rope_base\": 0.5}",
         "bad.json: rope_base: must be"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"qkv_bias\": false}",
         "bad.json: qkv_bias: false needs \"bias\": false"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"norm_eps\": 1e-6}",
         "bad.json: norm_eps: needs \"norm\": \"rmsnorm\""},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"norm\": \"rmsnorm\", "
         "\"norm_eps\": 0}",
         "bad.json: norm_eps: must be"},
        {"{\"name\": \"m\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
         "\"seq\": 32, \"vocab\": 100, \"norm\": \"rmsnorm\", "
         "\"norm_eps\": 2}",
         "bad.json: norm_eps: must be at most 1, got 2"},
    };
    expect_refused(state, cases, sizeof cases / sizeof *cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bundled_models),
        cmocka_unit_test(test_parameter_counts),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_models),
        cmocka_unit_test(test_llama_family),
        cmocka_unit_test(test_llama_layer_by_hand),
        cmocka_unit_test(test_architecture_round_trip),
        cmocka_unit_test(test_bad_architectures),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
