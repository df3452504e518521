/* JSON out: the layout every written file shares (and that it parses
 * back to the same document), and the one atomic writer: whole files or
 * none, never a temporary left behind. */
#include "test_support.h"

#include <sys/stat.h>

/* Entries of dir whose name starts with '.', other than . and .. */
static int hidden_entries(const char *dir)
{
    int count = count_scratch_entries(dir, 1);
    assert_true(count >= 0);
    return count;
}

static void test_layout(void **state)
{
    (void)state;
    json_t *numbers = json_array();
    for (int i = 0; i < 200; i++)
        json_array_append_new(numbers, json_real(i * 0.123456789012));
    json_t *root = json_pack(
        "{s:s, s:[i, i, i], s:{s:b, s:n}, s:[{s:i}, {s:i}], s:o, s:[], s:{}}",
        "name", "a \"quoted\" name", "short", 1, 2, 3, "nested", "flag", 1,
        "nothing", "objects", "a", 1, "a", 2, "numbers", numbers, "empty",
        "none");
    assert_non_null(root);
    char *text = json_format_text(root);
    assert_non_null(text);
    /* small arrays stay on their line, objects indent by 2 */
    assert_non_null(strstr(text, "\n  \"short\": [1, 2, 3],\n"));
    assert_non_null(strstr(text, "\n  \"nested\": {\n    \"flag\": true,\n"));
    assert_non_null(strstr(text, "\n  \"empty\": [],\n  \"none\": {}\n}\n"));
    assert_non_null(strstr(text, "\"a \\\"quoted\\\" name\""));
    /* 9 significant digits */
    assert_non_null(strstr(text, "0.123456789,"));
    /* long arrays fill lines of at most 78 columns */
    int lines = 0;
    for (const char *line = text; *line != '\0'; lines++) {
        const char *end = strchr(line, '\n');
        assert_non_null(end);
        assert_true(end - line <= 78);
        line = end + 1;
    }
    assert_true(lines < 80);
    json_error_t parse_error;
    json_t *again = json_loads(text, 0, &parse_error);
    assert_non_null(again);
    /* reals keep 9 digits: compare the parts that are exact */
    json_object_del(again, "numbers");
    json_object_del(root, "numbers");
    assert_true(json_equal(again, root));
    json_decref(again);
    free(text);
    json_decref(root);
}

static void test_atomic_write(void **state)
{
    const char *dir = scratch_dir(state);
    char path[512];
    snprintf(path, sizeof path, "%s/out.json", dir);
    pt_error err = {""};
    const char *first = "first\n", *second = "second, longer\n";
    assert_int_equal(pt_write_file_atomic(path, first, strlen(first), &err),
                     0);
    assert_int_equal(pt_write_file_atomic(path, second, strlen(second),
                                          &err),
                     0);
    size_t length;
    char *text = read_whole_file(path, &length);
    assert_string_equal(text, second);
    free(text);
    struct stat info;
    assert_int_equal(stat(path, &info), 0);
    assert_int_equal(info.st_mode & 0777, 0644);
    assert_int_equal(hidden_entries(dir), 0);

    /* a folder that does not exist: the message names the file */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such-dir/out.json", dir);
    assert_int_equal(pt_write_file_atomic(missing, first, strlen(first),
                                          &err),
                     -1);
    EXPECT_MESSAGE(&err, missing, "cannot create");

    /* a folder where the file should go: refused, the folder and what
       it holds stay as they were, no temporary is left */
    char blocked[600];
    snprintf(blocked, sizeof blocked, "%s/blocked", dir);
    assert_int_equal(mkdir(blocked, 0700), 0);
    char inside[700];
    snprintf(inside, sizeof inside, "%s/file", blocked);
    assert_int_equal(pt_write_file_atomic(inside, first, strlen(first),
                                          &err),
                     0);
    json_t *root = json_pack("{s:i}", "gbs", 64);
    assert_int_equal(json_write_file_atomic(root, blocked, &err), -1);
    EXPECT_MESSAGE(&err, blocked, "is a directory");
    assert_int_equal(hidden_entries(dir), 0);
    text = read_whole_file(inside, &length);
    assert_string_equal(text, first);
    free(text);

    assert_int_equal(json_write_file_atomic(root, path, &err), 0);
    text = read_whole_file(path, &length);
    assert_string_equal(text, "{\n  \"gbs\": 64\n}\n");
    free(text);
    json_decref(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test_setup_teardown(test_atomic_write, scratch_open,
                                        scratch_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
