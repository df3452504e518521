/* The input reader every text and JSON reader goes through (issue 33,
 * item 1): a read that fails in the middle of a file is an error, never
 * the end of the file; a line past the bound is refused without reading
 * on; lines come back whole, NUL bytes and a last line without newline
 * included. Reads are failed by tests/fault_injection.c. */
#include "test_support.h"
#include "tests/fault_injection.h"

#include <errno.h>

/* Reads every line of path (at most 8), joined with '|'; returns what
 * pt_line_reader_next returned last. */
static int read_lines(const char *path, size_t max_line, char *joined,
                      size_t size, pt_error *err)
{
    pt_line_reader reader;
    joined[0] = '\0';
    if (pt_line_reader_open(&reader, path, max_line, err) != 0)
        return -1;
    char *line;
    size_t length;
    int status;
    while ((status = pt_line_reader_next(&reader, &line, &length, err)) > 0) {
        assert_int_equal(length, strlen(line));
        size_t used = strlen(joined);
        snprintf(joined + used, size - used, "%s%s", used ? "|" : "", line);
    }
    pt_line_reader_close(&reader);
    return status;
}

static void test_lines_come_back_whole(void **state)
{
    char path[512], joined[256];
    pt_error err = {""};
    scratch_write(state, "in.txt", "one\n\ntwo\r\nlast", path, sizeof path);
    assert_int_equal(read_lines(path, 16, joined, sizeof joined, &err), 0);
    assert_string_equal(joined, "one||two\r|last");

    /* a NUL byte stays inside its line */
    FILE *file = fopen(path, "wb");
    assert_int_equal(fwrite("a\0b\nc\n", 1, 6, file), 6);
    fclose(file);
    pt_line_reader reader;
    assert_int_equal(pt_line_reader_open(&reader, path, 16, &err), 0);
    char *line;
    size_t length;
    assert_int_equal(pt_line_reader_next(&reader, &line, &length, &err), 1);
    assert_int_equal(length, 3);
    assert_memory_equal(line, "a\0b", 3);
    assert_true(reader.ended_by_newline);
    assert_int_equal(pt_line_reader_next(&reader, &line, &length, &err), 1);
    assert_int_equal(pt_line_reader_next(&reader, &line, &length, &err), 0);
    assert_int_equal(reader.bytes_read, 6);
    pt_line_reader_close(&reader);
}

static void test_long_line_refused(void **state)
{
    char path[512], joined[256];
    pt_error err = {""};
    scratch_write(state, "in.txt", "short\n0123456789abcdefX\nafter\n", path,
                  sizeof path);
    assert_int_equal(read_lines(path, 16, joined, sizeof joined, &err), -1);
    EXPECT_MESSAGE(&err, "in.txt:2: the line is longer than 16 bytes");
    /* exactly the bound is a line */
    scratch_write(state, "in.txt", "0123456789abcdef", path, sizeof path);
    assert_int_equal(read_lines(path, 16, joined, sizeof joined, &err), 0);

    /* an endless input stops at the bound, not at the end of memory */
    assert_int_equal(read_lines("/dev/zero", 1 << 20, joined, sizeof joined,
                                &err),
                     -1);
    EXPECT_MESSAGE(&err, "/dev/zero:1: the line is longer than 1048576");
}

/* The bug of issue 33, item 1: getline's -1 for ENOMEM read as the end,
 * so prep wrote half the documents and said nothing. */
static void test_read_error_is_not_the_end(void **state)
{
    char path[512], joined[256];
    pt_error err = {""};
    scratch_write(state, "in.txt", "one\ntwo\n", path, sizeof path);
    const int errors[] = {EIO, ENOMEM};
    for (int e = 0; e < 2; e++) {
        fault_fail_read_after(e, errors[e]);  /* first or second read */
        int status = read_lines(path, 16, joined, sizeof joined, &err);
        fault_clear();
        assert_int_equal(status, -1);
        EXPECT_MESSAGE(&err, "in.txt: read error after line ",
                       strerror(errors[e]));
    }
    /* a directory is named as one */
    assert_int_equal(read_lines(scratch_dir(state), 16, joined,
                                sizeof joined, &err),
                     -1);
    EXPECT_MESSAGE(&err, "is a directory");
}

static void test_whole_files(void **state)
{
    char path[512];
    pt_error err = {""};
    scratch_write(state, "in.json", "{\"a\": 1}", path, sizeof path);
    char *data;
    size_t size;
    assert_int_equal(pt_read_file(path, 64, &data, &size, &err), 0);
    assert_int_equal(size, 8);
    assert_string_equal(data, "{\"a\": 1}");
    free(data);
    assert_int_equal(pt_read_file(path, 7, &data, &size, &err), -1);
    EXPECT_MESSAGE(&err, "in.json: larger than 7 bytes");
    assert_null(data);
    fault_fail_read_after(0, EIO);
    assert_int_equal(pt_read_file(path, 64, &data, &size, &err), -1);
    fault_clear();
    EXPECT_MESSAGE(&err, "in.json: read error after 0 bytes",
                   strerror(EIO));
    /* the JSON reader says so too, rather than "malformed JSON" */
    fault_fail_read_after(0, EIO);
    assert_null(pt_json_load_file(path, &err));
    fault_clear();
    EXPECT_MESSAGE(&err, "in.json: read error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lines_come_back_whole,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_long_line_refused,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_read_error_is_not_the_end,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_whole_files, scratch_open,
                                        scratch_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
