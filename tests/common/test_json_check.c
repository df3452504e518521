/* JSON loading and the validating getters. */
#include "test_support.h"

#include <float.h>
#include <limits.h>

static json_t *parse(const char *text)
{
    json_error_t parse_error;
    json_t *value = json_loads(text, JSON_ALLOW_NUL, &parse_error);
    if (value == NULL)
        fail_msg("test JSON does not parse: %s", parse_error.text);
    return value;
}

static void test_load_reports_line_and_column(void **state)
{
    char path[512];
    scratch_write(state, "broken.json", "{\n  \"a\": 1,\n  \"b\": ]\n}\n",
                  path, sizeof path);
    pt_error err;
    assert_null(pt_json_load_file(path, &err));
    char expected[600];
    snprintf(expected, sizeof expected, "%s:3:", path);
    EXPECT_MESSAGE(&err, expected, "malformed JSON");
}

static void test_load_rejects_duplicate_keys(void **state)
{
    char path[512];
    scratch_write(state, "dup.json", "{\"a\": 1, \"a\": 2}", path, sizeof path);
    pt_error err;
    assert_null(pt_json_load_file(path, &err));
    EXPECT_MESSAGE(&err, "dup.json:1:", "duplicate");
}

static void test_load_missing_file(void **state)
{
    (void)state;
    pt_error err;
    assert_null(pt_json_load_file("/nonexistent/x.json", &err));
    EXPECT_MESSAGE(&err, "/nonexistent/x.json: cannot open",
                   "No such file");
}

/* issue 18, item 13: a directory is not "malformed JSON" */
static void test_load_directory(void **state)
{
    char path[512];
    scratch_write(state, "models/x.json", "{}", path, sizeof path);
    *strrchr(path, '/') = '\0';
    pt_error err;
    assert_null(pt_json_load_file(path, &err));
    EXPECT_MESSAGE(&err, "models: is a directory, not a JSON file");
    assert_null(strstr(err.message, "malformed"));
}

/* issue 18, items 13 and 14: numbers as the file wrote them; control
 * characters of a file refused in names and escaped in messages */
static void test_messages_quote_safely(void **state)
{
    (void)state;
    json_t *obj = parse("{\"gpus\": 48.0, \"big\": 1e308, "
                        "\"name\": \"a\\u001b[2Jb\", "
                        "\"c1\": \"x\\u009by\", \"tab\": \"a\\tb\"}");
    json_place place = json_place_root("f.json");
    pt_error err;
    long long count;
    assert_int_equal(json_get_int(obj, &place, "gpus", true, 1, 8, &count,
                                  &err), -1);
    EXPECT_MESSAGE(&err, "got 48.0");
    double number;
    assert_int_equal(json_get_number(obj, &place, "big", true, 0, 1e6,
                                     &number, &err), -1);
    EXPECT_MESSAGE(&err, "must be a number in [0, 1e+06], got 1e+308");
    char text[64];
    assert_int_equal(json_get_string(obj, &place, "name", true, text,
                                     sizeof text, &err), -1);
    EXPECT_MESSAGE(&err, "name: must not contain control characters "
                         "(byte 2 is 0x1b)");
    assert_int_equal(json_get_string(obj, &place, "c1", true, text,
                                     sizeof text, &err), -1);
    EXPECT_MESSAGE(&err, "(byte 2 is 0x9b)");
    assert_int_equal(json_get_string(obj, &place, "tab", true, text,
                                     sizeof text, &err), -1);
    assert_int_equal(json_get_number(obj, &place, "name", true, 0, 1,
                                     &number, &err), -1);
    EXPECT_MESSAGE(&err, "got the string \"a\\x1b[2Jb\"");
    assert_null(strchr(err.message, 0x1b));
    json_decref(obj);

    char shown[32];
    pt_escape_controls("a\x1b[31m\n\t\x7f\xc2\x9b\xc3\xa9", shown,
                       sizeof shown);
    assert_string_equal(shown, "a\\x1b[31m\\n\\t\\x7f\\u009b\xc3\xa9");
    char small[6];
    pt_escape_controls("ab\x1b", small, sizeof small);
    assert_string_equal(small, "ab");
}

static void test_places(void **state)
{
    (void)state;
    json_place root = json_place_root("clusters/bad.json");
    assert_string_equal(root.path, "");
    json_place nodes = json_place_key(&root, "nodes");
    json_place node = json_place_index(&nodes, 1);
    json_place gpus = json_place_key(&node, "gpus");
    assert_string_equal(gpus.path, "nodes[1].gpus");
    assert_string_equal(gpus.file, "clusters/bad.json");
    assert_string_equal(json_place_root(NULL).file, "<inline>");

    pt_error err;
    assert_int_equal(json_place_fail(&gpus, &err, "got %d", 0), -1);
    assert_string_equal(err.message, "clusters/bad.json: nodes[1].gpus: got 0");
    json_place_fail(&root, &err, "whole file");
    assert_string_equal(err.message, "clusters/bad.json: whole file");

    /* Very deep paths truncate instead of overflowing. */
    json_place deep = root;
    for (int i = 0; i < 100; i++)
        deep = json_place_key(&deep, "abcdefgh");
    assert_true(strlen(deep.path) < sizeof deep.path);
}

static void test_get_int(void **state)
{
    (void)state;
    json_t *obj = parse("{\"gpus\": 0, \"count\": 4, \"real\": 4.5, "
                        "\"text\": \"4\", \"big\": 9000000000}");
    json_place place = json_place_key(&(json_place){"c.json", ""}, "nodes");
    place = json_place_index(&place, 1);
    pt_error err;
    long long value = 7;
    assert_int_equal(json_get_int(obj, &place, "count", true, 1, INT_MAX,
                                  &value, &err), 0);
    assert_int_equal(value, 4);
    assert_int_equal(json_get_int(obj, &place, "gpus", true, 1, INT_MAX,
                                  &value, &err), -1);
    assert_string_equal(err.message, "c.json: nodes[1].gpus: must be a "
                                     "positive integer, got 0");
    assert_int_equal(json_get_int(obj, &place, "real", true, 0, INT_MAX,
                                  &value, &err), -1);
    EXPECT_MESSAGE(&err, "nodes[1].real: must be a non-negative integer, "
                         "got 4.5");
    assert_int_equal(json_get_int(obj, &place, "text", true, 2, 8, &value,
                                  &err), -1);
    EXPECT_MESSAGE(&err, "must be an integer in [2, 8], got the string "
                         "\"4\"");
    assert_int_equal(json_get_int(obj, &place, "big", true, 1, INT_MAX,
                                  &value, &err), -1);
    EXPECT_MESSAGE(&err, "big: must be at most 2147483647, got 9000000000");
    value = 7;
    assert_int_equal(json_get_int(obj, &place, "absent", false, 1, 10,
                                  &value, &err), 0);
    assert_int_equal(value, 7);
    assert_int_equal(json_get_int(obj, &place, "absent", true, 1, 10, &value,
                                  &err), -1);
    EXPECT_MESSAGE(&err, "c.json: nodes[1].absent: missing (required)");
    json_decref(obj);
}

static void test_get_number_bool_string(void **state)
{
    (void)state;
    json_t *obj = parse("{\"bw\": 0, \"lat\": 5, \"neg\": -1.5, \"flag\": 1, "
                        "\"yes\": true, \"name\": \"a100\", "
                        "\"nul\": \"a\\u0000b\", \"obj\": {}, \"arr\": []}");
    json_place place = json_place_root("f.json");
    pt_error err;
    double number = -1;
    assert_int_equal(json_get_number(obj, &place, "lat", true, 0, DBL_MAX,
                                     &number, &err), 0);
    assert_true(number == 5.0);
    assert_int_equal(json_get_number(obj, &place, "neg", true, 0, DBL_MAX,
                                     &number, &err), -1);
    EXPECT_MESSAGE(&err, "f.json: neg: must be a non-negative number, got "
                         "-1.5");
    assert_int_equal(json_get_number(obj, &place, "lat", true, 0, 1,
                                     &number, &err), -1);
    EXPECT_MESSAGE(&err, "lat: must be a number in [0, 1], got 5");
    assert_int_equal(json_get_number(obj, &place, "name", true, 0, 1,
                                     &number, &err), -1);
    EXPECT_MESSAGE(&err, "name: must be a number, got the string \"a100\"");
    assert_int_equal(json_get_positive_number(obj, &place, "bw", true,
                                              &number, &err), -1);
    EXPECT_MESSAGE(&err, "bw: must be a positive number, got 0");

    bool flag = false;
    assert_int_equal(json_get_bool(obj, &place, "yes", true, &flag, &err), 0);
    assert_true(flag);
    assert_int_equal(json_get_bool(obj, &place, "flag", true, &flag, &err),
                     -1);
    EXPECT_MESSAGE(&err, "flag: must be true or false, got 1");

    char text[5];
    assert_int_equal(json_get_string(obj, &place, "name", true, text,
                                     sizeof text, &err), 0);
    assert_string_equal(text, "a100");
    char tiny[4];
    assert_int_equal(json_get_string(obj, &place, "name", true, tiny,
                                     sizeof tiny, &err), -1);
    EXPECT_MESSAGE(&err, "name: too long: 4 characters, at most 3");
    assert_int_equal(json_get_string(obj, &place, "nul", true, text,
                                     sizeof text, &err), -1);
    EXPECT_MESSAGE(&err, "NUL");
    assert_int_equal(json_get_string(obj, &place, "obj", true, text,
                                     sizeof text, &err), -1);
    EXPECT_MESSAGE(&err, "obj: must be a string, got an object");
    assert_int_equal(json_get_string(obj, &place, "arr", true, text,
                                     sizeof text, &err), -1);
    EXPECT_MESSAGE(&err, "got an array");
    json_decref(obj);
}

static void test_get_choice(void **state)
{
    (void)state;
    json_t *obj = parse("{\"schedule\": \"gpipe\", \"bad\": \"zigzag\", "
                        "\"num\": 3}");
    json_place place = json_place_root("p.json");
    static const char *const names[] = {"1f1b", "gpipe", NULL};
    pt_error err;
    int choice = -1;
    assert_int_equal(json_get_choice(obj, &place, "schedule", true, names,
                                     &choice, &err), 0);
    assert_int_equal(choice, 1);
    assert_int_equal(json_get_choice(obj, &place, "bad", true, names,
                                     &choice, &err), -1);
    EXPECT_MESSAGE(&err, "p.json: bad: must be one of \"1f1b\", \"gpipe\", "
                         "got \"zigzag\"");
    assert_int_equal(json_get_choice(obj, &place, "num", true, names,
                                     &choice, &err), -1);
    EXPECT_MESSAGE(&err, "got 3");
    choice = 9;
    assert_int_equal(json_get_choice(obj, &place, "absent", false, names,
                                     &choice, &err), 0);
    assert_int_equal(choice, 9);
    json_decref(obj);
}

static void test_check_keys(void **state)
{
    (void)state;
    json_t *obj = parse("{\"name\": \"x\", \"notes\": {\"any\": 1}, "
                        "\"gpu_count\": 4}");
    json_place place = json_place_root("c.json");
    place = json_place_key(&place, "nodes");
    place = json_place_index(&place, 0);
    static const char *const allowed[] = {"name", "gpus", NULL};
    pt_error err;
    assert_int_equal(json_check_keys(obj, &place, allowed, &err), -1);
    EXPECT_MESSAGE(&err, "c.json: nodes[0].gpu_count: unknown key",
                   "allowed: name, gpus, notes");
    json_object_del(obj, "gpu_count");
    assert_int_equal(json_check_keys(obj, &place, allowed, &err), 0);

    json_t *array = parse("[1]");
    assert_int_equal(json_check_keys(array, &place, allowed, &err), -1);
    EXPECT_MESSAGE(&err, "nodes[0]: must be an object, got an array");
    assert_int_equal(json_expect_object(obj, &place, &err), 0);
    json_decref(array);
    json_decref(obj);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_reports_line_and_column),
        cmocka_unit_test(test_load_rejects_duplicate_keys),
        cmocka_unit_test(test_load_missing_file),
        cmocka_unit_test(test_load_directory),
        cmocka_unit_test(test_messages_quote_safely),
        cmocka_unit_test(test_places),
        cmocka_unit_test(test_get_int),
        cmocka_unit_test(test_get_number_bool_string),
        cmocka_unit_test(test_get_choice),
        cmocka_unit_test(test_check_keys),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
