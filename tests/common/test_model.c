/* Models (models/): the bundled ones and the reader's errors. */
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
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[512];
        scratch_write(state, "bad.json", cases[i].json, path, sizeof path);
        model_shape model;
        pt_error err = {""};
        assert_int_equal(model_load_file(path, &model, &err), -1);
        EXPECT_MESSAGE(&err, cases[i].message);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bundled_models),
        cmocka_unit_test(test_parameter_counts),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_models),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
