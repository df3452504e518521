/* Robustness: every prefix of a valid file, and every byte of it replaced
 * by characters that matter to JSON, must load or fail cleanly (ASan and
 * UBSan watch for the rest). */
#include "test_support.h"

typedef int (*load_function)(const char *path, void *out, pt_error *err);
typedef void (*free_function)(void *out);

static int load_model(const char *path, void *out, pt_error *err)
{
    return model_load_file(path, out, err);
}
static int load_cluster(const char *path, void *out, pt_error *err)
{
    return cluster_load_file(path, out, err);
}
static int load_profile(const char *path, void *out, pt_error *err)
{
    return profile_load_file(path, out, err);
}
static int load_plan(const char *path, void *out, pt_error *err)
{
    return plan_load_file(path, out, err);
}
static void free_nothing(void *out)
{
    (void)out;
}
static void free_cluster(void *out)
{
    cluster_free(out);
}
static void free_profile(void *out)
{
    profile_free(out);
}
static void free_plan(void *out)
{
    plan_free(out);
}

/* Whatever the reader returns, a failure must come with a message and a
 * success must have read the whole object. */
static void load_once(void **state, const char *text, size_t length,
                      load_function load, free_function release,
                      size_t *successes)
{
    char path[512];
    char *copy = malloc(length + 1);
    assert_non_null(copy);
    memcpy(copy, text, length);
    copy[length] = '\0';
    scratch_write(state, "cut.json", copy, path, sizeof path);
    free(copy);
    union {
        model_shape model;
        cluster cluster;
        profile profile;
        plan plan;
    } out;
    pt_error err = {""};
    if (load(path, &out, &err) == 0) {
        (*successes)++;
        release(&out);
    } else {
        assert_true(err.message[0] != '\0');
        release(&out); /* a failed reader leaves *out empty */
    }
}

static void check_every_prefix(void **state, const char *text,
                               load_function load, free_function release)
{
    size_t length = strlen(text);
    size_t successes = 0;
    for (size_t cut = 0; cut < length; cut++)
        load_once(state, text, cut, load, release, &successes);
    /* Only the file without its trailing newline is still whole JSON. */
    assert_true(successes <= 1);
    load_once(state, text, length, load, release, &successes);
    assert_true(successes >= 1);
}

typedef int (*from_json_function)(const json_t *root, const char *file,
                                  void *out, pt_error *err);

static int model_from_root(const json_t *root, const char *file, void *out,
                           pt_error *err)
{
    json_place place = json_place_root(file);
    return model_from_json(root, &place, out, err);
}
static int cluster_from_root(const json_t *root, const char *file, void *out,
                             pt_error *err)
{
    json_place place = json_place_root(file);
    return cluster_from_json(root, &place, out, err);
}
static int plan_from_root(const json_t *root, const char *file, void *out,
                          pt_error *err)
{
    return plan_from_json(root, file, out, err);
}

/* In memory, to keep the test fast: the file path is the same code as
 * the prefix test exercises. */
static void check_every_byte_changed(const char *text,
                                     from_json_function from_json,
                                     free_function release)
{
    static const char replacements[] = {'0', '"', '}', '-'};
    size_t length = strlen(text);
    char *changed = malloc(length + 1);
    assert_non_null(changed);
    for (size_t at = 0; at < length; at++) {
        for (size_t r = 0; r < sizeof replacements; r++) {
            if (text[at] == replacements[r])
                continue;
            memcpy(changed, text, length + 1);
            changed[at] = replacements[r];
            json_error_t parse_error;
            json_t *root = json_loadb(changed, length,
                                      JSON_REJECT_DUPLICATES, &parse_error);
            if (root == NULL)
                continue;
            union {
                model_shape model;
                cluster cluster;
                plan plan;
            } out;
            pt_error err = {""};
            if (from_json(root, "changed.json", &out, &err) != 0)
                assert_true(err.message[0] != '\0');
            release(&out);
            json_decref(root);
        }
    }
    free(changed);
}

static char *bundled_text(const char *relative)
{
    char path[PT_PATH_MAX];
    source_path(relative, path, sizeof path);
    size_t length;
    return read_whole_file(path, &length);
}

static void test_model_prefixes(void **state)
{
    char *text = bundled_text("models/gpt2-xl.json");
    check_every_prefix(state, text, load_model, free_nothing);
    check_every_byte_changed(text, model_from_root, free_nothing);
    free(text);
}

static void test_cluster_prefixes(void **state)
{
    char *text = bundled_text("clusters/hetero.json");
    check_every_prefix(state, text, load_cluster, free_cluster);
    check_every_byte_changed(text, cluster_from_root, free_cluster);
    free(text);
}

static void test_profile_prefixes(void **state)
{
    char *text = bundled_text("profiles/A100-FASOP.json");
    check_every_prefix(state, text, load_profile, free_profile);
    free(text);
}

/* The example plan with its references made absolute, so that it still
 * loads from the scratch directory. */
static char *absolute_example_plan(void)
{
    char model[PT_PATH_MAX], cluster_path[PT_PATH_MAX];
    source_path("models/gpt2-xl.json", model, sizeof model);
    source_path("clusters/hetero.json", cluster_path, sizeof cluster_path);
    char *text = malloc(8192);
    assert_non_null(text);
    snprintf(text, 8192,
             "{\n  \"format\": \"partita-plan/1\",\n  \"model\": \"%s\",\n"
             "  \"cluster\": \"%s\",\n  \"gbs\": 64, \"mbs\": 1, \"tp\": 1, "
             "\"dp\": 4, \"pp\": 8,\n  \"partition\": \"0-11-8-8-8-8-5-0\",\n"
             "  \"node_order\": [\"a10[0]\", \"a10[1]\", \"a10[2]\", "
             "\"a10[3]\", \"a10[4]\", \"a10[5]\", \"a10[6]\", \"a100[0]\"],\n"
             "  \"schedule\": \"1f1b\", \"precision\": \"bf16\",\n"
             "  \"recompute\": \"none\", \"distributed_optimizer\": false\n}\n",
             model, cluster_path);
    return text;
}

static void test_plan_prefixes(void **state)
{
    char *text = absolute_example_plan();
    check_every_prefix(state, text, load_plan, free_plan);
    check_every_byte_changed(text, plan_from_root, free_plan);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_prefixes),
        cmocka_unit_test(test_cluster_prefixes),
        cmocka_unit_test(test_profile_prefixes),
        cmocka_unit_test(test_plan_prefixes),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
